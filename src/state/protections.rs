//! Whether a protection can hold right now, as `fencing_protected_tables.active` says it:
//! `_pg_fencing.inactive_reason` (`sql/pg_fencing.sql`) is the one list of reasons, read here for
//! the rule layer, which refuses every write of an inactive protection with `FT004`
//! (docs/guarantees.md, "When a protection is not active").
#![forbid(unsafe_code)]

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

/// Before a DROP: raise the tombstone floor of each per-row protected table whose partitions it
/// drops (`_pg_fencing.before_drop`, `sql/pg_fencing.sql`).
pub fn before_drop(kind: Dropping, objects: &[pg_sys::Oid]) {
    if objects.is_empty() {
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
    exec_internal(
        "SELECT ''::pg_catalog.text FROM (SELECT _pg_fencing.before_drop($1, pg_catalog.string_to_array($2, ',')::pg_catalog.oid[])) d",
        false,
        &[pg_sys::TEXTOID, pg_sys::TEXTOID],
        &mut [crate::pg::spi::text_datum(kind), crate::pg::spi::text_datum(&list)],
        false,
        text_of,
    );
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
