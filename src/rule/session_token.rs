//! Which token the current write carries, and whether it counts. The value of
//! `pg_fencing.token` counts or not by its *source*, never by its value; the table is in
//! docs/security.md, "Token sources", and [`TokenSource::counts`] is its only implementation:
//!
//! | source | counts |
//! |---|---|
//! | `SET`, `SET LOCAL`, `set_config` in the current transaction | yes |
//! | the connection's startup packet (`options=-c pg_fencing.token=…`), also when `RESET`, `RESET ALL` or `DISCARD ALL` bring it back | yes |
//! | `fencing_acquire` (session level, bound to the lock) | while this session holds that lock |
//! | `SET` in an earlier transaction | only with `pg_fencing.token_scope = session` |
//! | postgresql.conf, `ALTER SYSTEM`, `ALTER DATABASE/ROLE … SET`, the command line, also when `RESET`, `SET … TO DEFAULT`, `set_config(…, NULL, …)`, `RESET ALL` or `DISCARD ALL` bring it back | never, whatever `token_scope` says |
//! | a function's `SET` clause (`CREATE FUNCTION … SET pg_fencing.token …`) | never |
//! | anything else guc.c may record, or a record that cannot be read | never (fail closed) |
//!
//! A running `fenced_*` call's token argument counts for the writes of its statement.
#![forbid(unsafe_code)]

use crate::backend_event::BackendEvent;
use crate::error::Token;
use crate::gucs;
use crate::pg::guc::{token_origin, TokenOrigin, UndoEntry};
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
fn forget_fenced(subxact: Option<pg_sys::SubTransactionId>) {
    FENCED.with(|f| match subxact {
        None => f.borrow_mut().clear(),
        Some(s) => f.borrow_mut().retain(|e| e.began_in < s),
    });
}

/// Where the session's `pg_fencing.token` came from (the module table; docs/security.md, "Token
/// sources").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenSource {
    /// `SET`, `SET LOCAL`, `set_config` (or `fencing_acquire`) in the current transaction.
    SetInThisTransaction,
    /// The connection's startup packet, also when `RESET` brings it back.
    ConnectionOption,
    /// `SET` (or `fencing_acquire`) in an earlier transaction of this session.
    SetEarlier,
    /// The server's, database's or role's configuration, also when `RESET` brings it back.
    Configuration,
    /// The `SET` clause of a function being executed.
    FunctionSetClause,
    /// A source guc.c may record that none of the above is (`PGC_S_OVERRIDE`, …), or the record
    /// could not be read.
    Unknown,
}

impl TokenSource {
    /// Does a token from this source count for a write? `token`: the value, for the one source
    /// that depends on it (a `fencing_acquire` token counts while its lock is this session's).
    fn counts(self, token: Token) -> bool {
        match self {
            TokenSource::SetInThisTransaction | TokenSource::ConnectionOption => true,
            TokenSource::SetEarlier => {
                gucs::token_scope_is_session()
                    || crate::lock_service::etcd_locks::held_by_this_session(token)
            }
            TokenSource::Configuration | TokenSource::FunctionSetClause | TokenSource::Unknown => {
                false
            }
        }
    }

    /// Why a token from this source does not count (the DETAIL of `FT002`).
    fn why_ignored(self) -> &'static str {
        match self {
            TokenSource::SetEarlier => "pg_fencing.token is set, but not in this transaction (by SET in an earlier one); with pg_fencing.token_scope = transaction (the default) a token counts only in the transaction that sets it, so that it never reaches the next client of a pooled connection.",
            TokenSource::Configuration => "pg_fencing.token holds a configured value (postgresql.conf, ALTER SYSTEM, ALTER DATABASE or ALTER ROLE ... SET), possibly brought back by RESET, SET ... TO DEFAULT or set_config with NULL; a configured token never counts: a fixed token would defeat fencing.",
            TokenSource::FunctionSetClause => "pg_fencing.token was set by the SET clause of a function being executed; a token frozen into a function's definition never counts, since it would count for every caller.",
            TokenSource::Unknown => "pg_fencing.token was set in a way pg_fencing does not recognise, so it does not count.",
            TokenSource::SetInThisTransaction | TokenSource::ConnectionOption => "",
        }
    }
}

/// The source of the current value of `pg_fencing.token` (see [`TokenSource`]).
pub fn token_source() -> TokenSource {
    use pg_sys::GucSource as S;
    let Some(TokenOrigin { source, undo }) = token_origin() else {
        return TokenSource::Unknown;
    };
    if undo == Some(UndoEntry::FunctionSetClause) {
        return TokenSource::FunctionSetClause;
    }
    if source == S::PGC_S_CLIENT {
        return TokenSource::ConnectionOption;
    }
    if source < S::PGC_S_CLIENT {
        return TokenSource::Configuration;
    }
    if source != S::PGC_S_SESSION {
        return TokenSource::Unknown;
    }
    match undo {
        Some(_) => TokenSource::SetInThisTransaction,
        None => TokenSource::SetEarlier,
    }
}

/// The token the current write carries: the running `fenced_*` call's token argument, else this
/// session's `pg_fencing.token` if it is set and its source counts ([`TokenSource::counts`]).
#[inline]
pub fn current_token() -> Option<Token> {
    if let Some(e) = FENCED.with(|f| f.borrow().last().copied()) {
        if e.counts() {
            return Some(e.token);
        }
    }
    match gucs::token_value() {
        0 => None,
        t if token_source().counts(t) => Some(t),
        _ => None,
    }
}

/// Why `pg_fencing.token` holds a token that does not count here (the DETAIL of `FT002`),
/// `None` when it holds none or it counts.
pub fn ignored_token() -> Option<&'static str> {
    if FENCED.with(|f| f.borrow().last().is_some_and(|e| e.counts())) {
        return None;
    }
    match gucs::token_value() {
        0 => None,
        t => {
            let source = token_source();
            (!source.counts(t)).then(|| source.why_ignored())
        }
    }
}

/// Per-backend state's life (`backend.rs`): a `fenced_*` call's token ends with the transaction,
/// or with the savepoint rolled back around it.
pub fn on_event(ev: BackendEvent) {
    match ev {
        BackendEvent::SubAbort(sub) => forget_fenced(Some(sub)),
        ev if ev.ends_transaction() => forget_fenced(None),
        _ => {}
    }
}
