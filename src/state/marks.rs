//! Stored high-water marks of resources: ordinary tables in schema `_pg_fencing` (WAL-logged,
//! replicated, crash-safe), read with the latest committed snapshot and written as the
//! extension's owner. Tombstones (per-row mode) are in `tombstones.rs`.
#![forbid(unsafe_code)]

use crate::error::Token;
use crate::pg::index::{read_by_index, UniqueIndex};
use crate::pg::spi::{exec_internal, text_datum};
use pgrx::pg_sys;

// read with the latest committed snapshot and written as the extension's owner.
//
// The cached statements run as the extension owner with the caller's search_path (the plan cache
// re-analyzes a plan under the current search_path), so every name in them is schema-qualified,
// operators included: a role's own operators can never be picked up.

const SQL_READ_RESOURCE: &str =
    "SELECT high_water FROM _pg_fencing.resource_high_water WHERE resource OPERATOR(pg_catalog.=) $1";
const SQL_STORE_RESOURCE: &str =
    "INSERT INTO _pg_fencing.resource_high_water AS h (resource, high_water, updated_at) \
     VALUES ($1, $2, pg_catalog.clock_timestamp()) ON CONFLICT (resource) DO UPDATE \
     SET high_water = excluded.high_water, updated_at = excluded.updated_at \
     WHERE h.high_water OPERATOR(pg_catalog.<) excluded.high_water";

const MARK_INDEX: UniqueIndex = UniqueIndex {
    table: c"resource_high_water",
    index: c"resource_high_water_pkey",
    value: c"high_water",
};

pub(crate) fn as_token(d: pg_sys::Datum) -> Token {
    d.value() as i64
}

/// The stored mark of `resource` (`None`: never written).
pub fn read_resource_mark(resource: &str) -> Option<Token> {
    let r = text_datum(resource);
    if let Some(found) = read_by_index(&MARK_INDEX, &[(1, pg_sys::F_TEXTEQ, r)]) {
        return found;
    }
    exec_internal(
        SQL_READ_RESOURCE,
        true,
        &[pg_sys::TEXTOID],
        &mut [r],
        true,
        as_token,
    )
}

/// Store `token` as the mark of `resource` if it is higher than the stored one (the caller
/// holds the resource's exclusive lock).
pub fn store_resource_mark(resource: &str, token: Token) {
    let r = text_datum(resource);
    exec_internal(
        SQL_STORE_RESOURCE,
        true,
        &[pg_sys::TEXTOID, pg_sys::INT8OID],
        &mut [r, pg_sys::Datum::from(token)],
        false,
        as_token,
    );
}
