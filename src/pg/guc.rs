//! GUC internals that pgrx has no safe interface for: where the current value of
//! `pg_fencing.token` came from, and setting it at session level (`fencing_acquire`). The GUC
//! definitions themselves are in `gucs.rs`. (PostgreSQL 16 changed `get_guc_variables`; the
//! version differences of this walk belong here.)

use crate::error::Token;
use pgrx::pg_sys;
use std::ffi::{CStr, CString};
use std::sync::atomic::Ordering;

/// Where the current value of `pg_fencing.token` came from: `set_in_transaction` (SET LOCAL, SET,
/// a function's SET clause or `fenced_*` in the current transaction: the GUC machinery keeps an
/// undo entry until the transaction ends) and its source (`PGC_S_CLIENT` for the startup
/// packet, `PGC_S_SESSION` for SET, lower for the configuration). `None` if the definition
/// cannot be found (the caller then counts the token).
pub struct TokenOrigin {
    pub set_in_transaction: bool,
    pub source: pg_sys::GucSource::Type,
}

/// See [`TokenOrigin`].
pub fn token_origin() -> Option<TokenOrigin> {
    let record = token_record()?;
    // SAFETY: the record is our own GUC definition (found after `gucs::init` defined it, so not a
    // placeholder that define_custom_variable would free), alive for the life of the backend;
    // read on the main thread only, where nothing modifies it concurrently.
    let (stack, source) = unsafe { ((*record).stack, (*record).source) };
    Some(TokenOrigin {
        set_in_transaction: !stack.is_null(),
        source,
    })
}

/// The GUC definition of `pg_fencing.token` (found once per backend).
fn token_record() -> Option<*mut pg_sys::config_generic> {
    use std::sync::atomic::AtomicPtr;
    static RECORD: AtomicPtr<pg_sys::config_generic> = AtomicPtr::new(std::ptr::null_mut());
    let cached = RECORD.load(Ordering::Relaxed);
    if !cached.is_null() {
        return Some(cached);
    }
    // SAFETY: main thread. guc_variables() returns guc.c's array of GUC record pointers and its
    // length (checked for NULL); each entry is NULL-checked, and its
    // `name` is a NUL-terminated string owned by guc.c. The array may be reallocated by a later
    // GUC definition, but we keep only the record pointer, which is never moved or freed once
    // defined.
    unsafe {
        let (vars, n) = crate::pg::compat::guc_variables();
        if vars.is_null() {
            return None;
        }
        for i in 0..n {
            let v = *vars.add(i);
            if !v.is_null()
                && !(*v).name.is_null()
                && CStr::from_ptr((*v).name).to_bytes() == b"pg_fencing.token"
            {
                RECORD.store(v, Ordering::Relaxed);
                return Some(v);
            }
        }
    }
    None
}

/// Set (or clear) this session's `pg_fencing.token` at session level, as `SET` would.
pub fn set_session_token(token: Option<Token>) {
    let value = CString::new(token.map(|t| t.to_string()).unwrap_or_default()).unwrap_or_default();
    // SAFETY: main thread, inside a transaction (called from the `fencing_acquire` SQL
    // function). Name and value are NUL-terminated and alive during the call, and
    // set_config_option copies the value. elevel 0 makes a refused value an ERROR (a panic
    // through the FFI guard), which the token is not: it is what the check hook accepts.
    unsafe {
        pg_sys::set_config_option(
            c"pg_fencing.token".as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_SET,
            true,
            0,
            false,
        );
    }
}
