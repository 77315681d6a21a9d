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

thread_local! {
    /// Tokens of the `fenced_*` calls running now (innermost last), each with the subtransaction
    /// it began in. A fenced call's statement carries its own token argument; it is kept here
    /// rather than set in `pg_fencing.token` (a GUC nesting level per call costs more than the
    /// rest of the call's bookkeeping). Dropped by the call's end, and by the abort of the
    /// (sub)transaction it ran in (`backend.rs`).
    static FENCED: std::cell::RefCell<Vec<Fenced>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A running `fenced_*` call's token, with what `pg_fencing.token` was when the call began.
#[derive(Clone, Copy)]
struct Fenced {
    token: Token,
    began_in: pg_sys::SubTransactionId,
    assignments: u64,
    setting: Token,
}

impl Fenced {
    /// The call's token counts unless `pg_fencing.token` was set to another value during the
    /// call's statement (a trigger of the statement that sets it for its own writes wins, as it
    /// did when the call set the GUC itself).
    fn counts(&self) -> bool {
        gucs::token_assignments() == self.assignments || gucs::token_value() == self.setting
    }
}

/// A `fenced_*` call's statement begins: `token` is the token of its writes.
pub fn push_fenced(token: Token) {
    let entry = Fenced {
        token,
        began_in: crate::pg::process::current_subxact(),
        assignments: gucs::token_assignments(),
        setting: gucs::token_value(),
    };
    FENCED.with(|f| f.borrow_mut().push(entry));
}

/// The innermost `fenced_*` call's statement ended.
pub fn pop_fenced() {
    FENCED.with(|f| {
        f.borrow_mut().pop();
    });
}

/// Subtransaction `subxact` aborted: the calls that began in it (or in its children, which have
/// higher ids) are over. `None`: the transaction ended.
pub fn forget_fenced(subxact: Option<pg_sys::SubTransactionId>) {
    FENCED.with(|f| match subxact {
        None => f.borrow_mut().clear(),
        Some(s) => f.borrow_mut().retain(|e| e.began_in < s),
    });
}

/// The token the current write carries: the running `fenced_*` call's token argument, else this
/// session's `pg_fencing.token`, `None` when unset, empty, or (with
/// `pg_fencing.token_scope = transaction`) set by `SET` in an earlier transaction.
#[inline]
pub fn current_token() -> Option<Token> {
    if let Some(e) = FENCED.with(|f| f.borrow().last().copied()) {
        if e.counts() {
            return Some(e.token);
        }
    }
    match gucs::token_value() {
        0 => None,
        t if in_scope(t) => Some(t),
        _ => None,
    }
}

/// True when `pg_fencing.token` holds a token that does not count here because it was set with
/// `SET` in an earlier transaction (for the message of FT002).
pub fn token_out_of_scope() -> bool {
    if FENCED.with(|f| f.borrow().last().is_some_and(|e| e.counts())) {
        return false;
    }
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
