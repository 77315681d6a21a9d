//! The events of a backend's life that per-backend state depends on, as `src/backend.rs` hands
//! them to every module that keeps such state (a `thread_local!`): each of those modules has one
//! `on_event(BackendEvent)` that says what each event clears, and `backend.rs` lists the modules
//! once, in the order they run (`scripts/check_layers.py` fails when a module keeps per-backend
//! state without being listed there).

use pgrx::pg_sys;

/// One event, after PostgreSQL's transaction, subtransaction or invalidation callback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendEvent {
    /// The transaction committed (`XACT_EVENT_COMMIT`).
    Commit,
    /// The transaction was prepared (`PREPARE TRANSACTION`, `XACT_EVENT_PREPARE`): its work
    /// belongs to the prepared transaction now, and this backend's part of it ends as at commit.
    Prepare,
    /// The transaction aborted (`XACT_EVENT_ABORT`), also a commit that failed after its
    /// pre-commit step.
    Abort,
    /// Any other end of a transaction in this process: a parallel worker's commit, abort or
    /// pre-commit.
    ParallelWorkerEnd,
    /// A subtransaction (savepoint, PL/pgSQL EXCEPTION block) was rolled back.
    SubAbort(pg_sys::SubTransactionId),
    /// A relation's relcache entry was invalidated (`None`: every relation's).
    Relcache(Option<pg_sys::Oid>),
    /// A row of `pg_subscription_rel` changed (a subscription starts or stops writing a table).
    Subscriptions,
}

impl BackendEvent {
    /// The end of the backend's part of a top-level transaction: commit, prepare or abort.
    pub fn ends_transaction(self) -> bool {
        matches!(self, Self::Commit | Self::Prepare | Self::Abort)
    }
    /// Any end of a transaction in this process, a parallel worker's included.
    pub fn ends_any_transaction(self) -> bool {
        self.ends_transaction() || self == Self::ParallelWorkerEnd
    }
}
