//! pg_fencing: storage-side fencing tokens for PostgreSQL.
//!
//! Module map: `fence` (the rule and its locking), `trigger` (the guard trigger on protected
//! tables), `entry` (C entry points that raise our SQLSTATEs), `gucs` (configuration),
//! `token` (token parsing), `error` (errors and SQLSTATEs). The SQL surface is in
//! `sql/pg_fencing.sql`.

use pgrx::prelude::*;

mod entry;
mod error;
mod fence;
mod gucs;
mod token;
mod trigger;

::pgrx::pg_module_magic!();

pgrx::extension_sql_file!("../sql/pg_fencing.sql", name = "pg_fencing_api", finalize);

/// Runs when the library is loaded: with `shared_preload_libraries`, or on the first call of
/// one of its functions in a backend.
#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    gucs::init();
    unsafe {
        pg_sys::RegisterXactCallback(Some(xact_callback), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(subxact_callback), std::ptr::null_mut());
    }
}

/// Locks taken by the fencing rule end with the transaction; so does what we know about them.
#[pg_guard]
unsafe extern "C-unwind" fn xact_callback(_event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    fence::forget_all();
}

/// A subtransaction abort releases the locks it took and undoes the marks it wrote.
#[pg_guard]
unsafe extern "C-unwind" fn subxact_callback(
    event: pg_sys::SubXactEvent::Type,
    _my: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        fence::forget_all();
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests;

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
