//! GUCs (configuration parameters) of pg_fencing.
//!
//! `pg_fencing.token` (string, user-settable): the fencing token that plain
//! `INSERT`/`UPDATE`/`DELETE`/`MERGE`/`COPY`/`TRUNCATE` on protected tables carry. It is a string
//! because GUCs hold at most 32-bit integers and tokens are 64-bit. Its check hook refuses anything
//! that is not a token at `SET` time (`22P02`, `22003`, `22023`, see `token.rs`); the empty string
//! means "no token". `SET LOCAL` is the recommended form: the value then ends with the transaction,
//! so it cannot leak to the next client of a transaction-mode pooler.

use crate::error::{make_sqlstate, Token};
use crate::token::parse_token;
use pgrx::prelude::*;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::atomic::{AtomicI64, Ordering};

static TOKEN_SETTING: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c""));

/// The parsed value of `pg_fencing.token`; 0 means "no token". Written by the assign hook only.
static CURRENT_TOKEN: AtomicI64 = AtomicI64::new(0);

/// The token of this session's current `pg_fencing.token` setting, `None` when unset or empty.
#[inline]
pub fn current_token() -> Option<Token> {
    match CURRENT_TOKEN.load(Ordering::Relaxed) {
        0 => None,
        t => Some(t),
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn token_check_hook(
    newval: *mut *mut c_char,
    _extra: *mut *mut c_void,
    _source: pg_sys::GucSource::Type,
) -> bool {
    unsafe {
        if newval.is_null() || (*newval).is_null() {
            return true;
        }
        let text = CStr::from_ptr(*newval).to_string_lossy();
        match parse_token(&text) {
            Ok(_) => true,
            Err(e) => {
                pg_sys::GUC_check_errcode(make_sqlstate(e.sqlstate()));
                let msg = CString::new(e.to_string().replace('\0', "")).unwrap_or_default();
                pg_sys::GUC_check_errmsg_string = pg_sys::pstrdup(msg.as_ptr());
                if let Some(h) = e.hint() {
                    let hint = CString::new(h.replace('\0', "")).unwrap_or_default();
                    pg_sys::GUC_check_errhint_string = pg_sys::pstrdup(hint.as_ptr());
                }
                false
            }
        }
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn token_assign_hook(newval: *const c_char, _extra: *mut c_void) {
    let parsed = if newval.is_null() {
        None
    } else {
        // Already accepted by the check hook; a value that somehow fails parses as "no token",
        // which makes writes fail with FT002 rather than pass with a wrong token.
        let text = unsafe { CStr::from_ptr(newval) }.to_string_lossy();
        parse_token(&text).ok().flatten()
    };
    CURRENT_TOKEN.store(parsed.unwrap_or(0), Ordering::Relaxed);
}

/// Register the GUCs. Called from `_PG_init`, with or without `shared_preload_libraries`.
pub fn init() {
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"pg_fencing.token",
            c"Fencing token carried by plain writes to protected tables.",
            c"A positive 64-bit integer (1 .. 9223372036854775807) issued by the lock service, e.g. \
              etcd's ETCD_LOCK_REV. Empty means no token. Prefer SET LOCAL.",
            &TOKEN_SETTING,
            GucContext::Userset,
            GucFlags::from_bits_truncate(pg_sys::GUC_NOT_IN_SAMPLE as i32),
            Some(token_check_hook),
            Some(token_assign_hook),
            None,
        );
    }
}
