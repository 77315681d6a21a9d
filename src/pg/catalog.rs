//! Catalog lookups through PostgreSQL's syscache.

use pgrx::pg_sys;

/// Does the database with this OID exist (committed, as the catalog snapshot sees it)?
pub fn database_exists(oid: u32) -> bool {
    // SAFETY: SearchSysCacheExists only reads the syscache (keys by value, no pointers kept); it
    // is called on a backend's main thread inside a transaction (reconcile runs in one).
    unsafe {
        pg_sys::SearchSysCacheExists(
            pg_sys::SysCacheIdentifier::DATABASEOID as i32,
            pg_sys::Datum::from(pg_sys::Oid::from(oid)),
            pg_sys::Datum::from(0),
            pg_sys::Datum::from(0),
            pg_sys::Datum::from(0),
        )
    }
}
