//! GUC internals that pgrx has no safe interface for: where the current value of
//! `pg_fencing.token` came from, and setting it at session level (`fencing_acquire`). The GUC
//! definitions themselves are in `gucs.rs`. (PostgreSQL 16 changed `get_guc_variables`; the
//! version differences of this walk belong here.)

use crate::error::Token;
use pgrx::pg_sys;
use std::ffi::{CStr, CString};
use std::sync::atomic::Ordering;

/// Where the current value of `pg_fencing.token` came from, as guc.c records it: the value's
/// `source` (`PGC_S_CLIENT` for the startup packet, `PGC_S_SESSION` for SET, `set_config` and a
/// function's SET clause, lower for the configuration) and the state of the innermost undo entry
/// (`None`: no entry, the value was not set in the current transaction). Which of these count is
/// decided in `rule/session_token.rs`; this only reads them.
pub struct TokenOrigin {
    pub source: pg_sys::GucSource::Type,
    pub undo: Option<UndoEntry>,
}

/// The innermost undo entry of `pg_fencing.token` (guc.c's `GucStackState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UndoEntry {
    /// `GUC_SAVE`: a function's SET clause (`CREATE FUNCTION … SET pg_fencing.token …`) saved
    /// the caller's value and installed its own; a `SET LOCAL` at the same nesting level (in the
    /// same function body) leaves this state unchanged.
    FunctionSetClause,
    /// `GUC_SET`, `GUC_LOCAL`, `GUC_SET_LOCAL`: `SET`, `SET LOCAL`, `RESET`, `set_config` or
    /// `fencing_acquire` in the current transaction.
    Statement,
}

/// See [`TokenOrigin`]; `None` if the definition cannot be found (the caller then refuses the
/// token: fail closed).
pub fn token_origin() -> Option<TokenOrigin> {
    let record = token_record()?;
    // SAFETY: the record is our own GUC definition (found after `gucs::init` defined it, so not a
    // placeholder that define_custom_variable would free), alive for the life of the backend;
    // read on the main thread only, where nothing modifies it concurrently. `stack` is NULL or
    // guc.c's innermost undo entry of this variable, alive until the transaction or function
    // nesting level that pushed it ends, which cannot happen during this read.
    let (state, source) = unsafe {
        let stack = (*record).stack;
        let state = if stack.is_null() {
            None
        } else {
            Some((*stack).state)
        };
        (state, (*record).source)
    };
    Some(TokenOrigin {
        source,
        undo: state.map(|s| {
            if s == pg_sys::GucStackState::GUC_SAVE {
                UndoEntry::FunctionSetClause
            } else {
                UndoEntry::Statement
            }
        }),
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
