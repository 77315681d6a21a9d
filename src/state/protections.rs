//! Whether a protection can hold right now, as `fencing_protected_tables.active` says it:
//! `_pg_fencing.inactive_reason` (`sql/pg_fencing.sql`) is the one list of reasons, read here for
//! the rule layer, which refuses every write of an inactive protection with `FT004`
//! (docs/guarantees.md, "When a protection is not active"); and what schema changes must do first
//! so that no DDL lowers a mark or forgets a tombstone: the commands `ddl_command_start` reads
//! (`pg/event_trigger.rs`), and every relation dropped by any command (`before_relation_drop`).
#![forbid(unsafe_code)]

use crate::backend_event::BackendEvent;
use crate::error::FenceError;
use crate::pg::spi::{exec_internal, text_of};
use pgrx::pg_sys;

/// Why protection `protection` is not active (`None`: active, or no such protection, which the
/// caller's own check of the trigger's arguments refuses).
pub fn inactive_reason(protection: i64) -> Option<String> {
    exec_internal(
        "SELECT COALESCE(_pg_fencing.inactive_reason(p.relid, p.resource), ''::pg_catalog.text) \
         FROM _pg_fencing.protected_table p WHERE p.id OPERATOR(pg_catalog.=) $1",
        true,
        &[pg_sys::INT8OID],
        &mut [pg_sys::Datum::from(protection)],
        true,
        text_of,
    )
    .filter(|r| !r.is_empty())
}

/// The `fencing_protect` call that gives `table` (a table's name as `regclass` prints it) its
/// current protection again, its resource and token column with it (`None`: not protected). A
/// call without the resource would switch a resource-mode table to per-row mode.
pub fn protect_call(table: &str) -> Option<String> {
    exec_internal(
        "SELECT pg_catalog.format('fencing_protect(%L%s)', p.relid::pg_catalog.regclass::pg_catalog.text, \
                CASE WHEN p.token_column OPERATOR(pg_catalog.=) 'fence_token' \
                     THEN COALESCE(', ' OPERATOR(pg_catalog.||) pg_catalog.quote_literal(p.resource), '') \
                     ELSE pg_catalog.format(', %s, %L', COALESCE(pg_catalog.quote_literal(p.resource), 'NULL'), p.token_column) END) \
         FROM _pg_fencing.protected_table p \
         WHERE p.relid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($1) AND p.protected",
        false,
        &[pg_sys::TEXTOID],
        &mut [crate::pg::spi::text_datum(table)],
        true,
        text_of,
    )
}

/// Table, resource and token column of protection `protection` (`None`: no such protection, or
/// removed), read with a new snapshot (a change of the calling statement's own transaction counts).
pub fn protection_of(protection: i64) -> Option<(pg_sys::Oid, Option<String>, String)> {
    crate::pg::spi::exec_internal_row(
        "SELECT p.relid::pg_catalog.oid, p.resource, p.token_column::pg_catalog.text \
         FROM _pg_fencing.protected_table p WHERE p.id OPERATOR(pg_catalog.=) $1 AND p.protected",
        true,
        &[pg_sys::INT8OID],
        &mut [pg_sys::Datum::from(protection)],
        false,
        |row| {
            let relid = pg_sys::Oid::from(row.first().copied().flatten()?.value() as u32);
            let resource = row.get(1).copied().flatten().map(text_of);
            let column = text_of(row.get(2).copied().flatten()?);
            Some((relid, resource, column))
        },
    )
    .flatten()
}

/// The protection of table `relid` (`None`: it is not protected), read like `protection_of`.
pub fn protection_of_table(relid: pg_sys::Oid) -> Option<i64> {
    crate::pg::spi::exec_internal(
        "SELECT p.id FROM _pg_fencing.protected_table p \
         WHERE p.relid OPERATOR(pg_catalog.=) $1::pg_catalog.oid::pg_catalog.regclass",
        true,
        &[pg_sys::OIDOID],
        &mut [pg_sys::Datum::from(relid)],
        false,
        |d| d.value() as i64,
    )
}

/// The protected tables that still exist, as a list for a message (`None`: none).
pub fn protected_tables() -> Option<String> {
    exec_internal(
        "SELECT pg_catalog.string_agg(p.relid::pg_catalog.text, ', ' ORDER BY p.relid::pg_catalog.text) \
         FROM _pg_fencing.protected_table p WHERE p.protected \
         AND EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) p.relid::pg_catalog.oid)",
        false,
        &[],
        &mut [],
        true,
        text_of,
    )
}

/// The schema and the owner of extension pg_fencing (`None`: not created in this database).
pub fn extension_home() -> Option<(pg_sys::Oid, pg_sys::Oid)> {
    let home = exec_internal(
        "SELECT e.extnamespace::pg_catalog.text OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) e.extowner::pg_catalog.text \
         FROM pg_catalog.pg_extension e WHERE e.extname OPERATOR(pg_catalog.=) 'pg_fencing'",
        false,
        &[],
        &mut [],
        true,
        text_of,
    )?;
    let mut parts = home.split(' ').map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(nsp), Some(owner)) => Some((pg_sys::Oid::from(nsp), pg_sys::Oid::from(owner))),
        _ => None,
    }
}

/// What a DROP drops (`kind`: `table`, `schema` or `owner`, and their oids).
#[derive(Clone, Copy)]
pub enum Dropping {
    Tables,
    Schemas,
    OwnedBy,
}

thread_local! {
    /// The partitions of per-row protected tables that `before_drop` accounted for in this
    /// transaction (their rows' tokens are in the floor, or their protection goes with them):
    /// the only ones `before_relation_drop` lets go. Cleared at transaction end and when a
    /// subtransaction aborts, which takes back the floors raised for them (`backend.rs`).
    static DROPPING: std::cell::RefCell<rustc_hash::FxHashSet<u32>> =
        std::cell::RefCell::new(rustc_hash::FxHashSet::default());
}

/// Transaction end, or a subtransaction's abort: nothing is accounted for any more (a later DROP
/// accounts again).
fn forget_dropping() {
    DROPPING.with(|d| d.borrow_mut().clear());
}

/// Before a DROP: raise the tombstone floor of each per-row protected table whose partitions it
/// drops (`_pg_fencing.before_drop`, `sql/pg_fencing.sql`), and remember those partitions.
pub fn before_drop(kind: Dropping, objects: &[pg_sys::Oid]) {
    // (a DROP TABLE of tables none of which is partitioned or a partition cannot drop one: the
    // common case, temporary tables included, needs no statement)
    if objects.is_empty()
        || matches!(kind, Dropping::Tables)
            && !objects
                .iter()
                .any(|&o| crate::pg::catalog::in_partition_tree(o))
    {
        return;
    }
    let kind = match kind {
        Dropping::Tables => "table",
        Dropping::Schemas => "schema",
        Dropping::OwnedBy => "owner",
    };
    let list = objects
        .iter()
        .map(|o| o.to_u32().to_string())
        .collect::<Vec<_>>()
        .join(",");
    let accounted = exec_internal(
        "SELECT _pg_fencing.before_drop($1, pg_catalog.string_to_array($2, ',')::pg_catalog.oid[])",
        false,
        &[pg_sys::TEXTOID, pg_sys::TEXTOID],
        &mut [
            crate::pg::spi::text_datum(kind),
            crate::pg::spi::text_datum(&list),
        ],
        false,
        text_of,
    )
    .unwrap_or_default();
    DROPPING.with(|d| {
        d.borrow_mut()
            .extend(accounted.split(',').filter_map(|o| o.parse::<u32>().ok()))
    });
}

/// A relation is about to be dropped, by whatever command (PostgreSQL's object access hook,
/// `api/hooks.rs`): the last line for what `ddl_command_start` cannot see, such as a cascade
/// from another object (`DROP EXTENSION plpgsql CASCADE`, `DROP ACCESS METHOD … CASCADE`).
/// * pg_fencing's own `protected_table` (the extension is being dropped): refused (`2BP01`)
///   while tables are protected, as `DROP EXTENSION pg_fencing` is.
/// * A partition of a per-row protected table that `before_drop` did not account for: refused
///   (`55000`); `DROP TABLE` of the partition raises the floor first and may go ahead.
pub fn before_relation_drop(relid: pg_sys::Oid) -> Result<(), FenceError> {
    // (only in a database where the extension is created: a schema of that name made by a user
    // elsewhere is not pg_fencing's)
    if !crate::pg::catalog::extension_created() {
        return Ok(());
    }
    let registry = crate::pg::catalog::internal_table(c"protected_table");
    if registry == pg_sys::InvalidOid {
        return Ok(());
    }
    if relid == registry {
        return match protected_tables() {
            None => Ok(()),
            Some(tables) => Err(FenceError::DependentObjects(crate::error::Text {
                message: "cannot drop extension pg_fencing while tables are protected".into(),
                detail: Some(format!(
                    "Protected: {tables}. This command would drop the extension with other objects; that would delete their high-water marks and tombstones."
                )),
                hint: Some("Run SELECT fencing_unprotect(...) for each table first.".into()),
            })),
        };
    }
    if !crate::pg::catalog::is_leaf_partition(relid)
        || DROPPING.with(|d| d.borrow().contains(&relid.to_u32()))
    {
        return Ok(());
    }
    let root = exec_internal(
        "SELECT pt.relid::pg_catalog.text FROM _pg_fencing.protected_table pt \
         WHERE pt.protected AND pt.resource IS NULL AND pt.relid::pg_catalog.oid IN \
           (SELECT a.relid::pg_catalog.oid FROM pg_catalog.pg_partition_ancestors($1) a \
            WHERE a.relid::pg_catalog.oid OPERATOR(pg_catalog.<>) $1) LIMIT 1",
        false,
        &[pg_sys::OIDOID],
        &mut [pg_sys::Datum::from(relid)],
        true,
        text_of,
    );
    let Some(root) = root else {
        return Ok(());
    };
    // Under the schema of 0.1.0 (before `ALTER EXTENSION pg_fencing UPDATE`) no DROP accounts for
    // partitions: there is no tombstone floor to carry their marks.
    let updated = exec_internal(
        "SELECT pg_catalog.to_regprocedure('_pg_fencing.before_drop(text, oid[])')::pg_catalog.text",
        false,
        &[],
        &mut [],
        true,
        text_of,
    )
    .is_some();
    Err(FenceError::SchemaChangeRefused(crate::error::Text {
        message: format!(
            "partition {} of per-row protected table {root} cannot be dropped by this command",
            crate::pg::trigger_event::relation_name(relid)
        ),
        detail: Some("Its rows' tokens are the marks of their keys: the table's tombstone floor must take them first, which only DROP TABLE, DROP SCHEMA, DROP OWNED and DETACH PARTITION do.".into()),
        hint: Some(if updated {
            "Drop the partition with DROP TABLE (or detach it) first.".into()
        } else {
            "Run ALTER EXTENSION pg_fencing UPDATE first: the extension's objects in this database are older than the library, and have no tombstone floor to carry the partition's marks.".into()
        }),
    }))
}

/// Before `ALTER COLUMN column TYPE` of `relation`: refused (`55000`) for a protection's token
/// column (`_pg_fencing.before_retype`, `sql/pg_fencing.sql`).
pub fn before_retype(relation: pg_sys::Oid, column: &str) {
    exec_internal(
        "SELECT ''::pg_catalog.text FROM (SELECT _pg_fencing.before_retype($1, $2)) d",
        false,
        &[pg_sys::OIDOID, pg_sys::TEXTOID],
        &mut [
            pg_sys::Datum::from(relation),
            crate::pg::spi::text_datum(column),
        ],
        true,
        text_of,
    );
}

/// A per-row protection just recorded: takes the tombstones and floor a subscription brought for
/// its table, and puts its own in the feed where that is published
/// (`_pg_fencing.feed_protection`, `sql/pg_fencing.sql`). Nothing under the schema of 0.1.0 (no
/// tombstone feed), which the library serves until `ALTER EXTENSION pg_fencing UPDATE`.
pub fn feed_protection(relation: pg_sys::Oid) {
    let present = exec_internal(
        "SELECT pg_catalog.to_regprocedure('_pg_fencing.feed_protection(regclass)')::pg_catalog.text",
        false,
        &[],
        &mut [],
        true,
        text_of,
    );
    if present.is_none() {
        return;
    }
    exec_internal(
        "SELECT ''::pg_catalog.text FROM (SELECT _pg_fencing.feed_protection($1)) d",
        false,
        &[pg_sys::REGCLASSOID],
        &mut [pg_sys::Datum::from(relation)],
        false,
        text_of,
    );
}

/// Per-backend state's life (`backend.rs`): the tables being dropped in the transaction (and the
/// floors raised for them) are forgotten when it ends or the savepoint around them is rolled
/// back.
pub fn on_event(ev: BackendEvent) {
    if ev.ends_transaction() || matches!(ev, BackendEvent::SubAbort(_)) {
        forget_dropping();
    }
}
