//! Who may move a resource's mark: the privilege checks of `fencing_advance`, `fencing_watch`
//! and `fencing_protect` (joining a resource), run as internal statements.

use crate::pg::spi::{exec_internal, text_datum};
use pgrx::pg_sys;

/// May the current user write (INSERT, UPDATE or DELETE) at least one table protected with
/// `resource`? (The privilege `fencing_advance` requires; see `api/functions.rs`.)
pub fn may_write_resource(resource: &str) -> bool {
    let user = crate::pg::process::current_user();
    // Any table of the partition tree, and column-level INSERT/UPDATE grants count too.
    exec_internal(
        "SELECT true FROM _pg_fencing.protected_table p, \
              LATERAL (SELECT p.relid UNION ALL \
                       SELECT pt.relid FROM pg_catalog.pg_partition_tree(p.relid) pt) AS t(relid) \
         WHERE p.resource OPERATOR(pg_catalog.=) $1 AND p.protected \
           AND (pg_catalog.has_table_privilege($2, t.relid::pg_catalog.oid, 'INSERT, UPDATE, DELETE') \
                OR pg_catalog.has_any_column_privilege($2, t.relid::pg_catalog.oid, 'INSERT, UPDATE')) \
         LIMIT 1",
        true,
        &[pg_sys::TEXTOID, pg_sys::OIDOID],
        &mut [text_datum(resource), pg_sys::Datum::from(user)],
        true,
        |d| d.value() != 0,
    )
    .unwrap_or(false)
}

/// Who may put a table under `resource` (`fencing_protect`): a resource guards every table
/// protected with it, so joining one is as powerful as writing to it. Allowed to superusers, for
/// a new resource (no protected table, no mark), and to roles that may write a table already
/// protected with it (`may_write_resource`). `relid` itself does not count.
pub fn may_join_resource(resource: &str, relid: pg_sys::Oid) -> bool {
    if crate::pg::process::is_superuser() {
        return true;
    }
    let in_use = exec_internal(
        "SELECT true WHERE EXISTS (SELECT 1 FROM _pg_fencing.protected_table p \
                                   WHERE p.resource OPERATOR(pg_catalog.=) $1 AND p.protected \
                                     AND p.relid OPERATOR(pg_catalog.<>) $2) \
                     OR EXISTS (SELECT 1 FROM _pg_fencing.resource_high_water h \
                                WHERE h.resource OPERATOR(pg_catalog.=) $1)",
        true,
        &[pg_sys::TEXTOID, pg_sys::REGCLASSOID],
        &mut [text_datum(resource), pg_sys::Datum::from(relid)],
        true,
        |d| d.value() != 0,
    )
    .unwrap_or(false);
    !in_use || may_write_resource(resource)
}
