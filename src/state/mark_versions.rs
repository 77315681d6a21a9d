//! Versions of the stored resource marks, in shared memory, so that a transaction can use the
//! mark its backend read before instead of reading it through the index again (the statement
//! trigger of a resource-mode table reads it once per transaction otherwise).
//!
//! # The guarantee
//! A backend that holds a resource's lock may use a mark it read earlier, under that resource's
//! lock, when the resource's version has not changed since: every change of a stored mark takes
//! the resource's exclusive lock and bumps its version first, and keeps the lock until its
//! transaction ends.
//!
//! Versions are 4096 counters; a resource's is chosen by a hash of its database and name, so two
//! resources may share one (which only costs a re-read). Only the trigger
//! `pg_fencing_mark_changed` on `_pg_fencing.resource_high_water` bumps them: a `BEFORE INSERT OR
//! UPDATE OR DELETE FOR EACH ROW` trigger that fires `ALWAYS` (so also for logical replication's
//! apply and for a superuser's writes by hand), which takes the exclusive lock of each resource
//! the row names and then bumps its counter. A reader reads the version after it has the lock and
//! before it reads the mark, and keeps the two together (`rule`).
//!
//! Why that is enough: while a writer W holds the exclusive lock nobody else holds the resource's
//! lock, so a reader's (version, mark) pair was read either entirely before W's bump or entirely
//! after W's transaction ended (lock release and acquisition order the memory accesses). In the
//! first case W's bump changed the version, so the pair is not used again; in the second the
//! mark read is W's (or its predecessor's, if W aborted). A pair is only used while the trigger
//! exists and fires `ALWAYS` (`marks::versions_trusted`, checked through the relcache, which any
//! `ALTER TABLE ... DISABLE TRIGGER`, `DROP`, `TRUNCATE` of the table invalidates in every
//! backend before its next transaction); without preloading there are no versions and every
//! transaction reads the mark.

use crate::backend_event::BackendEvent;
use crate::error::FenceError;
use crate::pg::lock_manager::{lock_resource, LockMode};
use crate::pg::trigger_event::{TriggerEvent, TriggerOp};
use pgrx::pg_sys;
use pgrx::{pg_guard, pg_shmem_init, PGRXSharedMemory, PgAtomic};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

const COUNTERS: usize = 4096;

#[repr(C)]
pub struct Versions {
    counters: [AtomicU64; COUNTERS],
}

impl Default for Versions {
    fn default() -> Self {
        Versions {
            counters: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

// SAFETY: `Versions` is `repr(C)`, of fixed size, and holds only atomics (no pointers, nothing
// process-local), so the same bytes mean the same thing in every process that maps the segment;
// PgAtomic initialises it once, from `Default`, under AddinShmemInitLock.
unsafe impl PGRXSharedMemory for Versions {}

// SAFETY: PgAtomic::new requires a shared memory name no one else uses: "pg_fencing mark
// versions" is ours (state/stats.rs uses "pg_fencing stats", lock_service "pg_fencing worker"
// and "pg_fencing watches").
static VERSIONS: PgAtomic<Versions> = unsafe { PgAtomic::new(c"pg_fencing mark versions") };
/// Set in the postmaster when preloaded; inherited by every backend it forks.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Reserve the shared memory. Only possible while `shared_preload_libraries` is processed.
pub fn init_if_preloading() {
    if crate::pg::process::preloading() {
        pg_shmem_init!(VERSIONS);
        ENABLED.store(true, Ordering::Relaxed);
    }
}

thread_local! {
    /// The counters this backend's current transaction bumped: a mark it reads then may be its
    /// own uncommitted change (`GetLatestSnapshot` shows it), which a rollback takes back without
    /// another bump, so such a read is never kept with a version (see `changed_here`).
    static CHANGED: std::cell::RefCell<rustc_hash::FxHashSet<usize>> =
        std::cell::RefCell::new(rustc_hash::FxHashSet::default());
}

fn index(resource: &str) -> usize {
    let db = crate::pg::process::my_database();
    let h = pg_fencing_core::hash::fnv1a(&[&db.to_le_bytes(), resource.as_bytes()]);
    (h as usize) % COUNTERS
}

fn counter(resource: &str) -> &'static AtomicU64 {
    &VERSIONS.get().counters[index(resource)]
}

/// Did this transaction change `resource`'s stored mark (or one sharing its counter)? A mark read
/// after that may be uncommitted, so it must not be kept with a version.
pub fn changed_here(resource: &str) -> bool {
    ENABLED.load(Ordering::Relaxed) && CHANGED.with(|c| c.borrow().contains(&index(resource)))
}

/// The end of the top-level transaction (commit or abort; called by `backend.rs`).
fn forget_changes() {
    CHANGED.with(|c| c.borrow_mut().clear());
}

/// The version of `resource`'s stored mark (`None`: no versions, not preloaded). Read it while
/// holding the resource's lock, before reading the mark.
pub fn version(resource: &str) -> Option<u64> {
    ENABLED
        .load(Ordering::Relaxed)
        .then(|| counter(resource).load(Ordering::Acquire))
}

/// The body of `_pg_fencing.mark_changed()`, the row trigger of `_pg_fencing.resource_high_water`
/// (see the module comment): the exclusive lock of every resource the old and new row name, then
/// a bump of its version, remembered as this transaction's own change. The row is written
/// unchanged.
pub fn on_mark_row(event: TriggerEvent) -> Result<pg_sys::Datum, FenceError> {
    if !event.row_level() || !event.before() {
        return Err(FenceError::TriggerProtocol(
            "_pg_fencing.mark_changed() must be a BEFORE ... FOR EACH ROW trigger".into(),
        ));
    }
    let rel = event.relation();
    let attnum = rel.column_number(c"resource").ok_or_else(|| {
        FenceError::TriggerProtocol(
            "_pg_fencing.mark_changed() fires on a table without a resource column".into(),
        )
    })?;
    let (old, new) = match event.op() {
        TriggerOp::Insert => (None, event.row()),
        TriggerOp::Update => (event.row(), event.new_row()),
        _ => (event.row(), None),
    };
    for row in [old, new].into_iter().flatten() {
        if let Some(resource) = row.text(attnum) {
            lock_resource(&resource, LockMode::Exclusive);
            if ENABLED.load(Ordering::Relaxed) {
                CHANGED.with(|c| c.borrow_mut().insert(index(&resource)));
                counter(&resource).fetch_add(1, Ordering::AcqRel);
            }
        }
    }
    Ok(new
        .or(old)
        .map(|r| r.datum())
        .unwrap_or(pg_sys::Datum::from(0usize)))
}

/// Per-backend state's life (`backend.rs`): the marks the transaction changed (never kept across
/// transactions) are forgotten when it ends.
pub fn on_event(ev: BackendEvent) {
    if ev.ends_transaction() {
        forget_changes();
    }
}
