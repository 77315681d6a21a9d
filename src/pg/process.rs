//! The current PostgreSQL process: its pid, database, role, latch, data directory, and where it
//! is in its life (preloading, recovery, subtransaction). Safe reads of PostgreSQL's per-process
//! globals and the waits the lock service needs (on the latch, honouring interrupts and
//! postmaster death). Everything here runs on a PostgreSQL process's main thread, never on the
//! worker's etcd thread (`lock_service/etcd/` does not use this module).

use pgrx::pg_sys;

/// This process's pid (`MyProcPid`).
pub fn my_pid() -> i32 {
    // SAFETY: MyProcPid is set once when the process starts and only read afterwards.
    unsafe { pg_sys::MyProcPid }
}

/// The OID of the database this backend is connected to (`MyDatabaseId`; 0 in the worker).
pub fn my_database() -> u32 {
    // SAFETY: MyDatabaseId is set once at connection and only read afterwards.
    unsafe { pg_sys::MyDatabaseId }.to_u32()
}

/// Is the current user a superuser?
pub fn is_superuser() -> bool {
    // SAFETY: superuser() reads the current user's pg_authid row through the syscache; it is
    // called on the main thread of a backend inside a transaction (every SQL function is).
    unsafe { pg_sys::superuser() }
}

/// The current subtransaction's id.
pub fn current_subxact() -> pg_sys::SubTransactionId {
    // Declared here, not taken from pgrx's bindings, to skip their error guard:
    // GetCurrentSubTransactionId only reads a variable of this process and never raises an
    // ERROR (it is called for every fast-path statement and every noted key or tombstone).
    // SAFETY: the signature is GetCurrentSubTransactionId's in access/xact.h,
    // SubTransactionId GetCurrentSubTransactionId(void).
    unsafe extern "C-unwind" {
        #[link_name = "GetCurrentSubTransactionId"]
        fn get_current_subtransaction_id() -> pg_sys::SubTransactionId;
    }
    // SAFETY: a read of the transaction state on the backend's main thread.
    unsafe { get_current_subtransaction_id() }
}

/// Is the server in recovery (a standby, or replaying WAL)?
pub fn in_recovery() -> bool {
    // SAFETY: RecoveryInProgress reads shared state under its own spinlock; callable from any
    // backend.
    unsafe { pg_sys::RecoveryInProgress() }
}

/// Set by `note_preloading` in the postmaster when it preloads the library; inherited by every
/// backend it forks.
static PRELOADED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// From `_PG_init`: remember whether the library is being preloaded.
pub fn note_preloading() {
    if preloading() {
        PRELOADED.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Was the library preloaded into this backend (`shared_preload_libraries`), so that its hooks
/// saw every statement of the backend's life? (Not when it was loaded on first use.)
pub fn preloaded() -> bool {
    PRELOADED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Are we in `_PG_init` while the postmaster loads `shared_preload_libraries`?
pub fn preloading() -> bool {
    // SAFETY: a global flag the postmaster sets around loading the preloaded libraries.
    unsafe { pg_sys::process_shared_preload_libraries_in_progress }
}

/// The data directory (`DataDir`), "." if it is not set.
pub fn data_dir() -> String {
    // SAFETY: DataDir is NULL or a NUL-terminated string set at start and never freed.
    unsafe {
        if pg_sys::DataDir.is_null() {
            ".".into()
        } else {
            std::ffi::CStr::from_ptr(pg_sys::DataDir)
                .to_string_lossy()
                .into_owned()
        }
    }
}

/// Milliseconds on CLOCK_MONOTONIC: one clock for all processes of the machine, and unlike the
/// wall clock it never jumps back (which would make an expired lease look valid).
pub fn monotonic_ms() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass; CLOCK_MONOTONIC always exists on
    // Linux. It is async-signal-safe and thread-safe (the etcd thread's copy is in
    // `lock_service/etcd_locks.rs`'s callers through this same function).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1000 + ts.tv_nsec / 1_000_000
}

/// Sleep on this process's latch for up to `ms` milliseconds, then check for interrupts (query
/// cancel, statement_timeout, termination); exits if the postmaster dies.
pub fn nap(ms: i64) {
    // SAFETY: MyLatch is this process's own latch, valid for its life; WaitLatch/ResetLatch are
    // called on the main thread.
    unsafe {
        pg_sys::WaitLatch(
            pg_sys::MyLatch,
            (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
            ms,
            pg_sys::PG_WAIT_EXTENSION,
        );
        pg_sys::ResetLatch(pg_sys::MyLatch);
    }
    pgrx::check_for_interrupts!();
}

/// Sleep `us` microseconds (short polls), then check for interrupts.
pub fn pause_us(us: i64) {
    // SAFETY: pg_usleep only sleeps.
    unsafe { pg_sys::pg_usleep(us as _) };
    pgrx::check_for_interrupts!();
}

/// Take SIGTERM as PostgreSQL's backends and own background workers do (`die`: the next
/// interrupt check, also inside a lock wait, ends the process), for a background worker that
/// runs transactions (the tombstone pruner).
pub fn sigterm_as_die() {
    // Declared here, not taken from pgrx's bindings, which wrap `die` in a Rust function; the
    // handler must be PostgreSQL's own C function.
    // SAFETY: the signature is die's in tcop/tcopprot.h, void die(SIGNAL_ARGS), i.e. one int.
    unsafe extern "C-unwind" {
        #[link_name = "die"]
        fn die_handler(signal: std::ffi::c_int);
    }
    // SAFETY: installs PostgreSQL's own SIGTERM handler on the worker's main thread before it
    // does any work; pqsignal only records the handler.
    unsafe {
        crate::pg::compat::set_signal_handler(libc::SIGTERM, die_handler);
    }
}

/// This process's latch, as an address another process can set (`set_latch`).
pub fn my_latch() -> usize {
    // SAFETY: MyLatch points to this process's latch in shared memory (PGPROC), valid for its life.
    unsafe { pg_sys::MyLatch as usize }
}

/// Set the latch at `latch` (an address from `my_latch` in another process; 0 does nothing).
pub fn set_latch(latch: usize) {
    if latch != 0 {
        // SAFETY: `latch` is a process latch in shared memory (PGPROC's procLatch), which stays
        // mapped at the same address in every process; setting the latch of a process that has
        // exited sets a latch nobody waits on.
        unsafe { pg_sys::SetLatch(latch as *mut pg_sys::Latch) };
    }
}

/// Re-read the configuration files (the worker, after SIGHUP).
pub fn reload_config() {
    // SAFETY: called on the worker's main thread from its loop, as PostgreSQL's own background
    // workers do after SIGHUP.
    unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
}

/// End this process with `code` (the worker's exit).
pub fn exit(code: i32) -> ! {
    // SAFETY: proc_exit runs the exit callbacks and never returns; called on the main thread
    // with no Rust value left that needs dropping for correctness.
    unsafe { crate::pg::compat::proc_exit(code) }
}

/// Run `callback` when this backend exits (before its shared-memory detach), once per process.
pub fn on_exit(callback: unsafe extern "C-unwind" fn(i32, pg_sys::Datum)) {
    // SAFETY: before_shmem_exit stores the function pointer, which lives as long as the library
    // (never unloaded); called on the main thread.
    unsafe { pg_sys::before_shmem_exit(Some(callback), pg_sys::Datum::from(0usize)) };
}

/// Is the current transaction SERIALIZABLE (its reads take predicate locks)?
pub fn serializable() -> bool {
    // SAFETY: XactIsoLevel is a plain global of the backend's main thread, set for the
    // transaction before any statement runs.
    unsafe { pg_sys::XactIsoLevel == pg_sys::XACT_SERIALIZABLE as std::ffi::c_int }
}

/// `session_replication_role = replica` (logical replication's apply workers, or a session
/// that set it): ordinary triggers do not fire, REPLICA ones do.
pub fn replica_mode() -> bool {
    // SAFETY: a read of a GUC variable of this process.
    unsafe { pg_sys::SessionReplicationRole == pg_sys::SESSION_REPLICATION_ROLE_REPLICA as i32 }
}

/// `wal_level = logical`: changes are decoded for logical replication and its slots.
pub fn logical_wal() -> bool {
    // SAFETY: a read of a server setting of this process (fixed at start).
    unsafe { pg_sys::wal_level >= pg_sys::WalLevel::WAL_LEVEL_LOGICAL as std::ffi::c_int }
}

/// `check_function_bodies = off`, as pg_dump's scripts set it: a restore is (probably) running.
/// Only for messages: it is no proof of anything, since any session may set it.
pub fn restoring() -> bool {
    // SAFETY: a read of a GUC variable of this process.
    unsafe { !pg_sys::check_function_bodies }
}

/// The current user (`GetUserId()`).
pub fn current_user() -> pg_sys::Oid {
    // Declared here, not taken from pgrx's bindings, to skip their error guard: GetUserId only
    // reads a variable of this process and never raises an ERROR (it is called once per written
    // row on the UPDATE fast path).
    // SAFETY: the signature is GetUserId's in miscadmin.h, Oid GetUserId(void).
    unsafe extern "C-unwind" {
        #[link_name = "GetUserId"]
        fn get_user_id() -> pg_sys::Oid;
    }
    // SAFETY: a read of this backend's current user id, on the main thread.
    unsafe { get_user_id() }
}

/// Does schema `_pg_fencing` exist (in this transaction's view: `DROP EXTENSION` earlier in
/// the same transaction removes it)?
pub fn extension_schema_exists() -> bool {
    // SAFETY: a catalog lookup of a NUL-terminated constant name inside a transaction;
    // missing_ok = true returns InvalidOid instead of raising.
    unsafe { pg_sys::get_namespace_oid(c"_pg_fencing".as_ptr(), true) != pg_sys::Oid::INVALID }
}

/// While this value lives, the transaction may write even if `transaction_read_only` was
/// switched on after a write it must complete (the tombstones of deletes already allowed); the
/// setting comes back when it is dropped. Never in recovery, where writes stay impossible. (An
/// ERROR in between skips the drop: a transaction abort resets the flag at the next start, but a
/// savepoint rolled back to would leave it off.)
pub struct ReadOnlyLifted(bool);

impl ReadOnlyLifted {
    pub fn new() -> Self {
        // SAFETY: a plain read of the backend-local `XactReadOnly` on the main thread.
        let read_only = unsafe { pg_sys::XactReadOnly };
        if read_only && !in_recovery() {
            // SAFETY: a plain write of a backend-local bool on the main thread, restored on drop.
            unsafe { pg_sys::XactReadOnly = false };
        }
        ReadOnlyLifted(read_only)
    }
}

impl Drop for ReadOnlyLifted {
    fn drop(&mut self) {
        // SAFETY: restores the value read in `new`; a plain write of a backend-local bool.
        unsafe { pg_sys::XactReadOnly = self.0 };
    }
}

/// The database clock: microseconds since 2000-01-01 00:00 UTC (`clock_timestamp()`, a
/// `timestamptz` in PostgreSQL's own representation).
pub fn now_us() -> i64 {
    // SAFETY: GetCurrentTimestamp only reads the system clock.
    unsafe { pg_sys::GetCurrentTimestamp() }
}

/// Which history of the database this server writes: the system identifier (new after initdb,
/// so after a dump restored into a new cluster and after pg_upgrade), the WAL timeline (new
/// after a promotion or a point-in-time recovery) and the server's start time (new after every
/// restart, also of a copy of the data directory). `None` during recovery (nothing is written).
pub fn history() -> Option<(u64, u32, i64)> {
    if in_recovery() {
        return None;
    }
    // SAFETY: plain reads of values in pg_control's shared copy (set at startup), of the WAL
    // insertion timeline (final once recovery has ended, checked above) and of the postmaster's
    // start time (a process global set at startup).
    unsafe {
        Some((
            pg_sys::GetSystemIdentifier(),
            pg_sys::GetWALInsertionTimeLine(),
            pg_sys::PgStartTime,
        ))
    }
}

/// Make this transaction's commit durable whatever `synchronous_commit` says. A mark that
/// `fencing_advance` reports (and a lease grant) has no data of its own that a caller would see
/// lost with it, so it must be durable before the caller can rely on it, whatever `synchronous_commit`
/// says (docs/guarantees.md, "Guarantees": asynchronous commit). The call's transaction gets a
/// transaction id, so that it writes a commit record, and that commit is flushed like a
/// synchronous one. The commit record lies after the commit of every write whose mark this call
/// read (that commit was inserted before it became visible), so the flush also makes an earlier
/// asynchronously committed mark durable. Costs one transaction id and one WAL flush per advance
/// (one per hand-over). Not `XLogFlush(GetXLogInsertRecPtr())`: at a WAL page boundary that
/// position lies past the end of the generated WAL and the flush fails (`tests/lifecycle`).
pub fn make_commit_durable() {
    // SAFETY: plain calls into the transaction machinery on the backend's main thread inside a
    // transaction: GetCurrentTransactionId assigns an id if there is none (it may raise ERROR,
    // e.g. on xid wraparound, which the surrounding `run` guard turns into a PostgreSQL error);
    // ForceSyncCommit only sets a flag that RecordTransactionCommit reads. During recovery no id
    // can be assigned, and a standby never gets here with a raised mark (the store fails
    // read-only first), so it is skipped.
    unsafe {
        if !pg_sys::RecoveryInProgress() {
            pg_sys::GetCurrentTransactionId();
            pg_sys::ForceSyncCommit();
        }
    }
}

/// While this value lives, this backend's lock waits end after at most `ms` milliseconds with
/// PostgreSQL's own `lock_timeout` error (`55P03`), or sooner if `lock_timeout` is set lower;
/// dropped (also when an ERROR unwinds through its owner) it puts the setting back. For a wait
/// that must not outlast a caller's bound (`fencing_lease_acquire`'s `wait`).
pub struct LockWaitBound(std::ffi::c_int);

impl LockWaitBound {
    pub fn new(ms: i64) -> Self {
        // SAFETY: a plain read and write of this backend's `lock_timeout` variable on the main
        // thread; the lock manager reads it when a wait begins. Restored by `drop`.
        unsafe {
            let saved = pg_sys::LockTimeout;
            let bound = ms.clamp(1, i64::from(std::ffi::c_int::MAX)) as std::ffi::c_int;
            pg_sys::LockTimeout = if saved > 0 { saved.min(bound) } else { bound };
            LockWaitBound(saved)
        }
    }
}

impl Drop for LockWaitBound {
    fn drop(&mut self) {
        // SAFETY: restores the value `new` read; a plain write of a backend-local int.
        unsafe { pg_sys::LockTimeout = self.0 };
    }
}

/// The latest snapshot, for reading the extension's state as committed by now (marks,
/// tombstones, leases). The one place pg_fencing takes it: during a parallel operation (a write
/// from a function wrongly declared `PARALLEL SAFE`, run under a parallel plan) PostgreSQL has
/// no such snapshot (`GetLatestSnapshot` raises `XX000`), so the write is refused with
/// PostgreSQL's own answer for writes during a parallel operation, `25000`, as on an unprotected
/// table. Called inside pgrx's guard; the error's LOCATION is the caller's.
#[track_caller]
pub fn latest_snapshot() -> pg_sys::Snapshot {
    // SAFETY: backend main thread (this module's callers); IsInParallelMode reads a global
    // flag, GetLatestSnapshot is called only outside parallel mode, where it returns a valid
    // snapshot owned by the snapshot manager until the transaction's next snapshot.
    unsafe {
        if pg_sys::IsInParallelMode() {
            crate::pg::report::raise_in_guard(crate::error::FenceError::ParallelMode(
                crate::error::Text {
                    message: "pg_fencing cannot check or record fencing state during a parallel \
                              operation"
                        .into(),
                    detail: Some(
                        "A write to a protected table, or a call of a pg_fencing function, ran \
                         inside a parallel plan (e.g. from a function wrongly declared PARALLEL \
                         SAFE); reading marks, tombstones and leases as committed needs the \
                         latest snapshot, which a parallel operation does not have."
                            .into(),
                    ),
                    hint: Some(
                        "Declare the function PARALLEL UNSAFE (PostgreSQL refuses writes during \
                         a parallel operation on any table)."
                            .into(),
                    ),
                },
            ));
        }
        let pinned = PINNED_SNAPSHOT.with(|p| p.get());
        if !pinned.is_null() {
            return pinned;
        }
        pg_sys::GetLatestSnapshot()
    }
}

thread_local! {
    /// The snapshot `with_one_snapshot` took, which `latest_snapshot` returns while it runs.
    static PINNED_SNAPSHOT: std::cell::Cell<pg_sys::Snapshot> =
        const { std::cell::Cell::new(std::ptr::null_mut()) };
}

/// Per-backend state's life (`backend.rs`): no snapshot stays pinned past a transaction's end
/// (`with_one_snapshot` forgets it itself; this is for an end it did not see).
pub fn on_event(ev: crate::backend_event::BackendEvent) {
    if ev.ends_any_transaction() {
        PINNED_SNAPSHOT.with(|p| p.set(std::ptr::null_mut()));
    }
}

/// Run `f` with every read of pg_fencing's own tables through `latest_snapshot` (index reads
/// and internal statements) seeing one snapshot, taken now: a reader of several tables (a
/// key's tombstone runs and rows) then sees a transaction that moved tombstones between them
/// (a merge, a run turned into rows) wholly or not at all. Nested calls use the outer snapshot.
#[track_caller]
pub fn with_one_snapshot<T>(f: impl FnOnce() -> T) -> T {
    if !PINNED_SNAPSHOT.with(|p| p.get()).is_null() {
        return f();
    }
    // Forgets the snapshot however `f` ends: an ERROR unwinds through here, and the
    // (sub)transaction's abort releases the registered snapshot with its resource owner.
    struct Unpin;
    impl Drop for Unpin {
        fn drop(&mut self) {
            PINNED_SNAPSHOT.with(|p| p.set(std::ptr::null_mut()));
        }
    }
    // SAFETY: backend main thread inside a transaction; RegisterSnapshot copies the snapshot
    // latest_snapshot returned (GetLatestSnapshot's static one) and keeps the copy until
    // UnregisterSnapshot below or the resource owner's release at abort.
    let snapshot = unsafe { pg_sys::RegisterSnapshot(latest_snapshot()) };
    PINNED_SNAPSHOT.with(|p| p.set(snapshot));
    let guard = Unpin;
    let out = f();
    drop(guard);
    // SAFETY: the snapshot registered above, on the same resource owner (`f` returned).
    unsafe { pg_sys::UnregisterSnapshot(snapshot) };
    out
}
