//! Stored high-water marks of resources: ordinary tables in schema `_pg_fencing` (WAL-logged,
//! replicated, crash-safe), read with the latest committed snapshot and written as the
//! extension's owner. Tombstones (per-row mode) are in `tombstones.rs`.
#![forbid(unsafe_code)]

use crate::backend_event::BackendEvent;
use crate::error::Token;
use crate::pg::index::{has_always_trigger, read_by_index, UniqueIndex};
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

thread_local! {
    /// `versions_trusted`, until the next relcache invalidation (`forget`).
    static TRUSTED: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// May a mark read earlier be used again while its version is unchanged (`mark_versions.rs`)?
/// Only while the trigger that bumps the versions is there and fires `ALWAYS`.
pub fn versions_trusted() -> bool {
    if let Some(t) = TRUSTED.with(|t| t.get()) {
        return t;
    }
    let t = has_always_trigger(&MARK_INDEX, c"pg_fencing_mark_changed");
    TRUSTED.with(|c| c.set(Some(t)));
    t
}

/// Relcache invalidation (of any relation: the marks table may have changed, been dropped or
/// re-created).
fn forget() {
    TRUSTED.with(|t| t.set(None));
}

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

/// Per-backend state's life (`backend.rs`): the cached location of the marks' table is looked
/// up again when a relation changed.
pub fn on_event(ev: BackendEvent) {
    if let BackendEvent::Relcache(_) = ev {
        forget();
    }
}
