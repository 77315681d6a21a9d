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
