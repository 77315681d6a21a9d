//! Which token the current write carries (`pg_fencing.token_scope`): the value of
//! `pg_fencing.token` counts in the transaction that set it, from the connection's startup
//! packet, and (set by `fencing_acquire`) while this session holds its lock; with
//! `token_scope = session` a plain `SET` lasts for the session. A token from postgresql.conf or
//! `ALTER ROLE/DATABASE ... SET` never counts: a fixed token in the configuration would defeat
//! fencing.
#![forbid(unsafe_code)]

use crate::error::Token;
use crate::gucs;
use crate::pg::guc::{token_origin, TokenOrigin};
use pgrx::pg_sys;

/// The token the current write carries: this session's `pg_fencing.token`, `None` when unset,
/// empty, or (with `pg_fencing.token_scope = transaction`) set by `SET` in an earlier transaction.
#[inline]
pub fn current_token() -> Option<Token> {
    match gucs::token_value() {
        0 => None,
        t if in_scope(t) => Some(t),
        _ => None,
    }
}

/// True when `pg_fencing.token` holds a token that does not count here because it was set with
/// `SET` in an earlier transaction (for the message of FT002).
pub fn token_out_of_scope() -> bool {
    match gucs::token_value() {
        0 => false,
        t => !in_scope(t),
    }
}

/// Does the current value of `pg_fencing.token` count in this transaction?
fn in_scope(token: Token) -> bool {
    if gucs::token_scope_is_session() {
        return true;
    }
    let Some(TokenOrigin {
        set_in_transaction,
        source,
    }) = token_origin()
    else {
        return true;
    };
    // Set (SET LOCAL, SET, a function's SET clause, fenced_*) in the current transaction.
    if set_in_transaction {
        return true;
    }
    // From this connection's startup packet (PGOPTIONS): not something one client of a pooled
    // connection leaves for the next. A token from postgresql.conf or ALTER ROLE/DATABASE ... SET
    // does not count: a fixed token in the configuration would defeat fencing.
    if source == pg_sys::GucSource::PGC_S_CLIENT {
        return true;
    }
    if source < pg_sys::GucSource::PGC_S_SESSION {
        return false;
    }
    // A plain SET in an earlier transaction counts only for the token of a lock this session
    // holds through fencing_acquire (the lock itself is session-scoped).
    crate::lock_service::locks::held_by_this_session(token)
}
