//! Locks taken from SQL (`fencing_acquire` / `fencing_release`): the shared-memory slots, the
//! backend side of a request, and what etcd has told the worker about itself (revision
//! regression). The worker's main thread is `worker.rs`, the etcd side `etcd/mutex.rs`.
//!
//! Lock protocol (docs/design.md, "Worker"): the locks of one session share one lease (TTL
//! `pg_fencing.lease_ttl`, like Go's `concurrency.Session`) kept alive every TTL/3; each lock
//! takes the concurrency-mutex layout (`<prefix><name>/<lease id in hex>`, the oldest key owns the
//! lock) exactly as `etcdctl lock` and Go's `concurrency.Mutex` do, so all three exclude each
//! other: first with the mutex's own transaction (create our key, read the owner), which takes a
//! free lock in one request; if the lock is held, by queueing with etcd's lock service. The token
//! is the response-header revision of the grant (what `etcdctl lock` exports as `ETCD_LOCK_REV`
//! and `Mutex.Header().Revision` returns). After a wait in the queue, our key is read back before
//! a token is returned (etcd 3.4 can grant the lock to a waiter whose key was deleted while it
//! waited). Each lock's key is watched, and checked at each keepalive round, so each lock is
//! lost on its own.
//!
//! Lease loss: every slot carries `valid_until` (CLOCK_MONOTONIC ms): the send time of the last
//! read of the lease's remaining TTL plus that TTL. A write carrying the token of a slot
//! that is past `valid_until` (or marked lost) fails with FT003 in the backend itself, even if
//! the worker is frozen, so it fails before etcd can have given the lock to anyone else.

use super::shmem_text::ShmemText;
use crate::backend_event::BackendEvent;
use crate::error::FenceError;
use crate::gucs;
use pgrx::bgworkers::BackgroundWorkerBuilder;
use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgAtomic};
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
use std::time::Duration;

pub(super) use super::shmem_text::{KEY_LEN, MSG_LEN, NAME_LEN};
/// A slot's states and their transitions (the protocol's table is in `pg_fencing_core::slot_states`).
pub(super) use pg_fencing_core::slot_states::{AcquireFailure, LockSlotState, LockSlotState as S};

#[repr(C)]
pub struct Slot {
    /// A `LockSlotState`, read and changed only through `state`, `transition` and `set_state`.
    state: AtomicU32,
    pub(super) generation: AtomicU64,
    pub(super) owner_pid: AtomicI32,
    pub(super) token: AtomicI64,
    pub(super) lease: AtomicI64,
    pub(super) ttl: AtomicI64,
    pub(super) valid_until_ms: AtomicI64,
    pub(super) deadline_ms: AtomicI64,
    pub(super) error: AtomicU32,
    pub(super) name: ShmemText<NAME_LEN>,
    pub(super) key: ShmemText<KEY_LEN>,
    /// Why the slot is in its state (set together with the state change, see `ShmemText`).
    pub(super) message: ShmemText<MSG_LEN>,
}

#[repr(C)]
pub struct Shared {
    pub(super) worker_latch: AtomicUsize,
    pub(super) worker_pid: AtomicI32,
    /// 0 unknown, 1 connected, 2 unreachable.
    pub(super) etcd: AtomicU32,
    /// What etcd has told us about itself (see "Revision regression" below): its cluster id
    /// (0 = not known yet), the highest revision it answered a write with, and whether it has
    /// since answered from another cluster or with a lower revision (1), with why.
    pub(super) etcd_cluster_id: AtomicU64,
    pub(super) etcd_highest_revision: AtomicI64,
    pub(super) etcd_regressed: AtomicU32,
    pub(super) etcd_regression: ShmemText<MSG_LEN>,
    /// What of the three above changed since the state file was last saved: `CLEAN`,
    /// `DIRTY_REVISION` or `DIRTY_IDENTITY` (only ever raised; cleared by whoever saves the file).
    pub(super) etcd_state_dirty: AtomicU32,
    /// One past the highest slot index ever taken: scans stop there (`Shared::slots`).
    pub(super) slots_used: AtomicUsize,
    /// What is wrong with the worker's connection to etcd (empty: nothing), logged by the
    /// worker's main thread once per change and shown by `fencing_locks`.
    pub(super) etcd_problem: ShmemText<MSG_LEN>,
}

// SAFETY: every field is an atomic or a `ShmemText` (its own spinlock), with no pointers into
// process-local memory, so the struct may live in shared memory and be used from every process
// and thread at once.
unsafe impl PGRXSharedMemory for Shared {}
// SAFETY: as above: all access goes through atomics or `ShmemText`'s lock.
unsafe impl Sync for Shared {}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            worker_latch: AtomicUsize::new(0),
            worker_pid: AtomicI32::new(0),
            etcd: AtomicU32::new(0),
            etcd_cluster_id: AtomicU64::new(0),
            etcd_highest_revision: AtomicI64::new(0),
            etcd_regressed: AtomicU32::new(0),
            etcd_regression: ShmemText::default(),
            etcd_state_dirty: AtomicU32::new(0),
            slots_used: AtomicUsize::new(0),
            etcd_problem: ShmemText::default(),
        }
    }
}

impl Default for Slot {
    fn default() -> Self {
        Slot {
            state: AtomicU32::new(S::Free as u32),
            generation: AtomicU64::new(0),
            owner_pid: AtomicI32::new(0),
            token: AtomicI64::new(0),
            lease: AtomicI64::new(0),
            ttl: AtomicI64::new(0),
            valid_until_ms: AtomicI64::new(0),
            deadline_ms: AtomicI64::new(0),
            error: AtomicU32::new(0),
            name: ShmemText::default(),
            key: ShmemText::default(),
            message: ShmemText::default(),
        }
    }
}

// SAFETY: as for `Shared`: atomics and `ShmemText`s only, no pointers into process memory.
unsafe impl PGRXSharedMemory for Slot {}
// SAFETY: as above.
unsafe impl Sync for Slot {}

/// The lock slots: `pg_fencing.max_locks` of them, sized at server start.
static SLOTS: crate::pg::shmem::ShmemArray<Slot> =
    crate::pg::shmem::ShmemArray::new(c"pg_fencing lock slots", gucs::max_locks);

impl Shared {
    /// Every slot that has ever been taken (the rest are Free and never were).
    pub(super) fn slots(&self) -> &'static [Slot] {
        let all = SLOTS.get();
        &all[..self.slots_used.load(Ordering::Acquire).min(all.len())]
    }

    /// Take a Free slot (Free to Reserved), the lowest one, so that `slots()` stays short.
    pub(super) fn reserve_slot(&self) -> Result<(usize, &'static Slot), FenceError> {
        let all = SLOTS.get();
        let (i, s) = all
            .iter()
            .enumerate()
            .find(|(_, s)| s.transition(S::Free, S::Reserved))
            .ok_or(FenceError::TooManyLocks(all.len()))?;
        self.slots_used.fetch_max(i + 1, Ordering::AcqRel);
        Ok((i, s))
    }

    /// How many slots there are (`pg_fencing.max_locks`).
    pub(super) fn slot_count(&self) -> usize {
        SLOTS.get().len()
    }
}

// SAFETY: initialised by pg_shmem_init! in _PG_init while preloading, before any use (`shared()`
// checks ENABLED, which is set only after that).
pub(super) static SHARED: PgAtomic<Shared> = unsafe { PgAtomic::new(c"pg_fencing worker") };
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Milliseconds on CLOCK_MONOTONIC: one clock for all processes of the machine, and unlike the
/// wall clock it never jumps back (which would make an expired lease look valid).
pub(crate) fn now_ms() -> i64 {
    crate::pg::process::monotonic_ms()
}

impl Slot {
    pub(super) fn name(&self) -> String {
        self.name.get()
    }
    pub(super) fn key(&self) -> String {
        self.key.get()
    }
    pub(super) fn message(&self) -> String {
        self.message.get()
    }
    pub(super) fn set_key(&self, k: &[u8]) {
        self.key.set(&String::from_utf8_lossy(k))
    }
    /// The slot's state now (callers then act on it, or `transition` from it).
    pub(super) fn state(&self) -> LockSlotState {
        LockSlotState::from_u32(self.state.load(Ordering::Acquire))
    }
    /// `from` to `to` if the slot is in `from` (compare-and-swap); only a transition of the
    /// protocol (`LockSlotState::may_become`) is made, anything else is refused (false) and a
    /// debug build panics.
    pub(super) fn transition(&self, from: LockSlotState, to: LockSlotState) -> bool {
        debug_assert!(
            from.may_become(to),
            "lock slot: {from:?} -> {to:?} is no transition"
        );
        from.may_become(to)
            && self
                .state
                .compare_exchange(from as u32, to as u32, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }
    /// `from` to `to` by a store, for the one side that owns the slot in `from` (no other side
    /// changes a slot in that state).
    pub(super) fn set_state(&self, from: LockSlotState, to: LockSlotState) {
        debug_assert!(
            from.may_become(to),
            "lock slot: {from:?} -> {to:?} is no transition"
        );
        debug_assert_eq!(self.state(), from);
        if from.may_become(to) {
            self.state.store(to as u32, Ordering::Release);
        }
    }
    /// `transition` with the reason for the new state: whoever sees the new state and then reads
    /// the message gets this one (see `ShmemText::set_with`).
    pub(super) fn transition_saying(
        &self,
        from: LockSlotState,
        to: LockSlotState,
        why: &str,
    ) -> bool {
        self.message.set_with(why, || self.transition(from, to))
    }
    /// Failed from one of `from`, with `code` and the reason: state, error code and message
    /// change together under the message's lock (readers read the message, then the code).
    pub(super) fn fail_from(
        &self,
        from: &[LockSlotState],
        code: AcquireFailure,
        why: &str,
    ) -> bool {
        self.message.set_with(why, || {
            let failed = from.iter().any(|&f| self.transition(f, S::Failed));
            if failed {
                self.error.store(code as u32, Ordering::Relaxed);
            }
            failed
        })
    }
    pub(super) fn fail(&self, code: AcquireFailure, msg: &str) {
        // Only a slot still being acquired fails; a cancelled one is freed by its cleanup.
        let _ = self.fail_from(&[S::Acquiring], code, msg);
    }
}

/// Register the shared memory and the worker. Only possible while preloading.
pub fn init_if_preloading() {
    if !crate::pg::process::preloading() {
        return;
    }
    pg_shmem_init!(SHARED);
    SLOTS.init();
    ENABLED.store(true, Ordering::Relaxed);
    BackgroundWorkerBuilder::new("pg_fencing etcd worker")
        .set_type("pg_fencing etcd worker")
        .set_function("pg_fencing_worker_main")
        .set_library("pg_fencing")
        .enable_shmem_access(None)
        .set_restart_time(Some(Duration::from_secs(1)))
        .load();
}

pub(super) fn shared() -> Result<&'static Shared, FenceError> {
    if !ENABLED.load(Ordering::Relaxed) {
        return Err(FenceError::WorkerUnavailable(
            "the pg_fencing background worker is not running: pg_fencing is not in shared_preload_libraries".into(),
        ));
    }
    Ok(SHARED.get())
}

pub(super) fn wake_worker(sh: &Shared) {
    crate::pg::process::set_latch(sh.worker_latch.load(Ordering::Acquire));
}

/// Wait for the worker to move a slot on: the first 50 ms since `since_ms` in steps of 100 µs (an
/// etcd round trip on a local network is well under a millisecond), then on the latch for 1 ms.
/// Checks for interrupts either way.
pub(super) fn poll_pause(since_ms: i64) {
    if now_ms() - since_ms < 50 {
        crate::pg::process::pause_us(100);
    } else {
        nap(1);
    }
}

/// Sleep on this backend's latch for up to `ms` milliseconds, then check for interrupts (query
/// cancel, statement_timeout, termination); exits if the postmaster dies.
pub(crate) fn nap(ms: i64) {
    crate::pg::process::nap(ms)
}

pub(super) fn lock_key_name(name: &str) -> String {
    format!("{}{}", gucs::lock_prefix(), name)
}

// ---------------------------------------------------------------------------------------------
// Revision regression
//
// A fencing token is an etcd revision, so tokens only stay comparable while revisions only grow.
// An etcd cluster restored from an older snapshot (without `--bump-revision`), or another cluster
// behind the same endpoints, answers with lower revisions: the worker would hand out tokens below
// ones it handed out before. So the worker remembers etcd's cluster id and the highest revision
// etcd answered a write (lease grant, lock) with, in shared memory and in the file
// `$PGDATA/pg_fencing_etcd.state`, so it survives restarts. A
// write sent after another write was answered is applied after it, so its answer carries at
// least that revision, from whichever member it comes; a lower one (or another cluster id) can
// only mean a regression. (Answers to writes in flight together may arrive in any order, so each
// answer is compared with the highest revision known when its request was sent.) From then on `fencing_acquire` fails with FT005 and held locks are lost, until a
// superuser runs `fencing_reset` (which forgets what the worker knew about etcd).
//
// When the file is saved: by the etcd thread, off the requests' path, a new cluster id or a
// regression within 100 ms, a higher revision within `STATE_SAVE_INTERVAL`; by the backend running `fencing_reset`, the reset; by
// the worker's main thread when the worker stops. Every acquisition raises the revision twice,
// and a save is two fsyncs on the disk etcd fsyncs its own log to: saving each one doubled the
// disk flushes of an acquisition (BENCHMARKS.md, "Lock services side by side"). The file only
// notices a restored etcd; it admits no write (stored marks refuse lower tokens whatever it
// says). So after a crash that skips the worker's last save (of the machine, of PostgreSQL, a
// `kill -9` of the worker) it may be up to that interval behind, and an etcd restored into
// revisions of that last interval goes unnoticed by it, as by a worker that never saw them.

pub(super) const STATE_FILE: &str = "pg_fencing_etcd.state";
/// How long a higher revision may wait to be saved (see above).
pub(super) const STATE_SAVE_INTERVAL: Duration = Duration::from_secs(1);
// `etcd_state_dirty` levels.
pub(super) const CLEAN: u32 = 0;
/// Only the highest revision rose: saved within `STATE_SAVE_INTERVAL`.
pub(super) const DIRTY_REVISION: u32 = 1;
/// The cluster id was learnt or forgotten, or a regression found: saved within 100 ms.
pub(super) const DIRTY_IDENTITY: u32 = 2;

impl Shared {
    pub(super) fn regression(&self) -> Option<String> {
        if self.etcd_regressed.load(Ordering::Acquire) == 0 {
            return None;
        }
        Some(self.etcd_regression.get())
    }

    /// Record what a write's response header says about etcd. `floor`: the highest revision
    /// known when the request was sent (answers to requests in flight together may arrive in any
    /// order, but a write sent after another write's answer is applied after it, so its answer
    /// carries at least that revision). `Err` (with why) if etcd went backwards, now or before.
    pub(super) fn observe_etcd(
        &self,
        cluster_id: u64,
        revision: i64,
        floor: i64,
    ) -> Result<(), String> {
        if let Some(why) = self.regression() {
            return Err(why);
        }
        let known = self.same_cluster(cluster_id)?;
        if revision > 0 && revision < floor {
            return Err(self.regress(format!(
                "etcd's revision went back from {floor} to {revision}"
            )));
        }
        if known == 0
            && cluster_id != 0
            && self
                .etcd_cluster_id
                .compare_exchange(0, cluster_id, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.mark_dirty(DIRTY_IDENTITY);
        }
        self.raise_highest(revision);
        Ok(())
    }

    /// Record a revision etcd showed without answering one of our requests (a watch's events and
    /// response headers: committed revisions, but from the member serving the watch, which may
    /// lag another member that answered us): it raises the highest revision the worker has
    /// seen, so that the next linearizable answer below it is a regression (`observe_etcd`), but
    /// is not itself compared with it. `Err` (with why) for an answer from another cluster (a
    /// regression found now).
    pub(super) fn observe_seen(&self, cluster_id: u64, revision: i64) -> Result<(), String> {
        if self.regression().is_some() {
            // Already stopped; what stops the watch's marks is decided where it was before.
            return Ok(());
        }
        self.same_cluster(cluster_id)?;
        self.raise_highest(revision);
        Ok(())
    }

    /// The cluster id known so far (0: none yet); `Err` (a regression found now) if `cluster_id`
    /// is another cluster's.
    fn same_cluster(&self, cluster_id: u64) -> Result<u64, String> {
        let known = self.etcd_cluster_id.load(Ordering::Acquire);
        if known != 0 && cluster_id != 0 && cluster_id != known {
            return Err(self.regress(format!(
                "etcd answered from cluster {cluster_id:x}, not from cluster {known:x} as before"
            )));
        }
        Ok(known)
    }

    /// Raise the highest revision seen to at least `revision` (for the state file).
    fn raise_highest(&self, revision: i64) {
        if self
            .etcd_highest_revision
            .fetch_max(revision, Ordering::AcqRel)
            < revision
        {
            self.mark_dirty(DIRTY_REVISION);
        }
    }

    /// Raise what the state file misses to at least `level` (never lowers it).
    pub(super) fn mark_dirty(&self, level: u32) {
        self.etcd_state_dirty.fetch_max(level, Ordering::AcqRel);
    }

    pub(super) fn regress(&self, why: String) -> String {
        let msg = format!(
            "{why}; tokens would no longer be comparable (a cluster restored from an old snapshot, or another cluster behind pg_fencing.etcd_endpoints)"
        );
        self.etcd_regression.set(&msg);
        self.etcd_regressed.store(1, Ordering::Release);
        self.mark_dirty(DIRTY_IDENTITY);
        for s in self.slots().iter() {
            s.transition_saying(S::Held, S::Lost, "etcd's revisions went backwards");
        }
        msg
    }

    /// The state file's text: `cluster_id highest_revision regressed` and the reason.
    pub(super) fn state_text(&self) -> String {
        format!(
            "{:x} {} {}\n{}\n",
            self.etcd_cluster_id.load(Ordering::Acquire),
            self.etcd_highest_revision.load(Ordering::Acquire),
            self.etcd_regressed.load(Ordering::Acquire),
            self.regression().unwrap_or_default()
        )
    }

    pub(super) fn load_state_text(&self, text: &str) {
        let mut lines = text.lines();
        let head: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
        if head.len() != 3 {
            return;
        }
        let (Ok(cid), Ok(rev), Ok(reg)) = (
            u64::from_str_radix(head[0], 16),
            head[1].parse::<i64>(),
            head[2].parse::<u32>(),
        ) else {
            return;
        };
        // Merged, not overwritten: after a restart of the worker alone, shared memory may know
        // a higher revision than the file (saved up to STATE_SAVE_INTERVAL later).
        let _ = self
            .etcd_cluster_id
            .compare_exchange(0, cid, Ordering::AcqRel, Ordering::Acquire);
        self.etcd_highest_revision.fetch_max(rev, Ordering::AcqRel);
        if reg == 1 {
            let why = lines.next().unwrap_or("etcd's revisions went backwards");
            self.etcd_regression.set(why);
            self.etcd_regressed.store(1, Ordering::Release);
        }
    }
}

/// Save the state file if it changed: write a temporary file, flush it to disk, rename it over
/// the old one. Plain file I/O, so the etcd thread may call it too. `tag` keeps concurrent
/// writers (worker, a backend running fencing_reset) off each other's temporary file.
pub(super) fn save_state(sh: &Shared, dir: &str, tag: &str) -> std::io::Result<()> {
    use std::io::Write;
    // One save at a time in this process: a save that read older values must not rename its
    // file over a newer one's.
    static SAVING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _saving = SAVING.lock().unwrap_or_else(|e| e.into_inner());
    let level = sh.etcd_state_dirty.swap(CLEAN, Ordering::AcqRel);
    if level == CLEAN {
        return Ok(());
    }
    let path = std::path::Path::new(dir).join(STATE_FILE);
    let tmp = std::path::Path::new(dir).join(format!("{STATE_FILE}.{tag}.tmp"));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(sh.state_text().as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        sh.mark_dirty(level);
    }
    result
}

pub(crate) fn data_dir() -> String {
    crate::pg::process::data_dir()
}

/// `_pg_fencing.reset_lock_service()` (called by `fencing_reset`): forget what the worker knew
/// about etcd (cluster id, highest revision, a regression), so that it learns them anew.
pub fn reset_lock_service() {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let sh = SHARED.get();
    let was = sh.regression();
    sh.etcd_cluster_id.store(0, Ordering::Release);
    sh.etcd_highest_revision.store(0, Ordering::Release);
    sh.etcd_regression.set("");
    sh.etcd_regressed.store(0, Ordering::Release);
    sh.mark_dirty(DIRTY_IDENTITY);
    let tag = format!("backend{}", crate::pg::process::my_pid());
    if let Err(e) = save_state(sh, &data_dir(), &tag) {
        pgrx::warning!("pg_fencing: could not save {STATE_FILE}: {e}");
    }
    if let Some(why) = was {
        log!("pg_fencing: fencing_reset cleared the etcd revision regression ({why}); the worker hands out tokens again");
    }
}

/// For the watches of `watch.rs` (their etcd side, `etcd/watch.rs`) (etcd thread): the highest revision etcd answered a write
/// with, and the check of an answer to a linearizable read sent when that was `floor` (see
/// `Shared::observe_etcd`). A regression found here stops tokens and marks alike.
pub(crate) fn etcd_highest_revision() -> i64 {
    if !ENABLED.load(Ordering::Relaxed) {
        return 0;
    }
    SHARED.get().etcd_highest_revision.load(Ordering::Acquire)
}

pub(crate) fn observe_etcd_answer(
    cluster_id: u64,
    revision: i64,
    floor: i64,
) -> Result<(), String> {
    if !ENABLED.load(Ordering::Relaxed) {
        return Ok(());
    }
    SHARED.get().observe_etcd(cluster_id, revision, floor)
}

/// For the watches (etcd thread): a revision a watch saw (see `Shared::observe_seen`).
pub(crate) fn observe_etcd_seen(cluster_id: u64, revision: i64) -> Result<(), String> {
    if !ENABLED.load(Ordering::Relaxed) {
        return Ok(());
    }
    SHARED.get().observe_seen(cluster_id, revision)
}

/// For the etcd thread: what is wrong with reaching etcd, by source (`"locks"`, a lease, a
/// watch's resource), `None` when that source works again. The worker's main thread logs the
/// combined text once per change (`worker.rs`); `fencing_acquire`'s FT005 says it too.
pub(crate) fn report_problem(source: &str, problem: Option<String>) {
    use std::collections::BTreeMap;
    static PROBLEMS: std::sync::Mutex<BTreeMap<String, String>> =
        std::sync::Mutex::new(BTreeMap::new());
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let Ok(mut all) = PROBLEMS.lock() else { return };
    // A change of state, not of wording: a source that keeps failing with varying texts (a TLS
    // alert racing the first request) is logged once, with its first reason.
    let changed = match problem {
        Some(p) => {
            if all.contains_key(source) {
                false
            } else {
                all.insert(source.to_string(), p);
                true
            }
        }
        None => all.remove(source).is_some(),
    };
    if changed {
        let mut text = String::new();
        for p in all.values() {
            if !text.contains(p.as_str()) {
                if !text.is_empty() {
                    text.push_str("; ");
                }
                text.push_str(p);
            }
        }
        SHARED.get().etcd_problem.set(&text);
    }
}

/// For the tombstone pruner (`pruner.rs`): the highest etcd revision the worker has seen, if
/// there is a worker that trusts etcd (no revision regression, some answer seen). Every lock
/// granted by that etcd after this moment gets a higher revision.
pub fn revision_seen() -> Option<i64> {
    if !ENABLED.load(Ordering::Relaxed) || lock_service_problem().is_some() {
        return None;
    }
    let rev = SHARED.get().etcd_highest_revision.load(Ordering::Acquire);
    (rev > 0).then_some(rev)
}

/// Why the lock service cannot be trusted right now (`None`: fine, or no worker).
pub fn lock_service_problem() -> Option<String> {
    if !ENABLED.load(Ordering::Relaxed) {
        return None;
    }
    SHARED.get().regression()
}

// ---------------------------------------------------------------------------------------------
// Backend side

thread_local! {
    /// The requests (slot index, generation, subtransaction) of the `fencing_acquire` calls of
    /// this backend's current transaction. A lock is the session's once that transaction
    /// commits; if it (or the subtransaction of the call) aborts, the request is cancelled and a
    /// lock already granted is released (`abort_pending`): the call's caller never got a token it
    /// could use (an error in the wait, or a cancel or `statement_timeout` right after the call,
    /// in the same statement; the session's `pg_fencing.token` is rolled back with it).
    static IN_TRANSACTION: std::cell::RefCell<Vec<(usize, u64, pg_sys::SubTransactionId)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// `fencing_acquire(lock_name, timeout)`: see `api/functions.rs`.
pub fn acquire(name: &str, timeout: Duration) -> Result<i64, FenceError> {
    let sh = shared()?;
    if gucs::etcd_endpoints().trim().is_empty() {
        return Err(FenceError::WorkerUnavailable(
            "pg_fencing.etcd_endpoints is empty, so the worker takes no locks".into(),
        ));
    }
    if name.is_empty() || name.len() >= NAME_LEN - 64 {
        return Err(FenceError::InvalidArgument(format!(
            "lock_name must have 1 to {} bytes",
            NAME_LEN - 65
        )));
    }
    // The etcd key is <prefix><name>/<lease id in hex>; it must fit, never be cut.
    if lock_key_name(name).len() + 17 >= KEY_LEN {
        return Err(FenceError::InvalidArgument(format!(
            "pg_fencing.lock_prefix and lock_name together must have fewer than {} bytes",
            KEY_LEN - 17
        )));
    }
    if let Some(why) = sh.regression() {
        return Err(FenceError::LockServiceUnavailable(format!(
            "{why}; a superuser must check etcd and run fencing_reset before new tokens are handed out"
        )));
    }
    wait_for_worker(sh)?;
    let me = crate::pg::process::my_pid();
    for s in sh.slots().iter() {
        let st = s.state();
        if s.owner_pid.load(Ordering::Relaxed) == me
            && (st == S::Held || st == S::Lost)
            && s.name() == name
        {
            return Err(FenceError::InvalidArgument(format!(
                "this session already holds lock \"{name}\" (token {}); release it first",
                s.token.load(Ordering::Relaxed)
            )));
        }
    }
    let started = now_ms();
    let deadline = started + timeout.as_millis() as i64;
    // A request of this session for the same lock still being finished (a release whose key
    // deletion is still under way, a cancelled acquisition being cleaned up): wait for it. Its
    // key has the same name as ours would (the lock's name and the session's lease), so its
    // deletion could otherwise delete the key of this acquisition.
    while sh.slots().iter().any(|s| {
        s.owner_pid.load(Ordering::Relaxed) == me
            && !matches!(s.state(), S::Free | S::Held | S::Lost)
            && s.name() == name
    }) {
        if now_ms() >= deadline {
            return Err(FenceError::LockTimeout(name.to_string()));
        }
        poll_pause(started);
    }
    let (index, slot) = sh.reserve_slot()?;
    let generation = slot
        .generation
        .fetch_add(1, Ordering::AcqRel)
        .wrapping_add(1);
    let subxact = crate::pg::process::current_subxact();
    IN_TRANSACTION.with(|t| t.borrow_mut().push((index, generation, subxact)));
    slot.owner_pid.store(me, Ordering::Relaxed);
    slot.token.store(0, Ordering::Relaxed);
    slot.lease.store(0, Ordering::Relaxed);
    slot.error.store(0, Ordering::Relaxed);
    slot.deadline_ms.store(deadline, Ordering::Relaxed);
    slot.valid_until_ms.store(0, Ordering::Relaxed);
    slot.name.set(name);
    slot.set_key(lock_key_name(name).as_bytes());
    slot.message.set("");
    slot.set_state(S::Reserved, S::Requested);
    register_exit_callback();
    wake_worker(sh);

    loop {
        let st = slot.state();
        if st == S::Held {
            return Ok(slot.token.load(Ordering::Relaxed));
        }
        if st == S::Failed {
            // The message first: reading it waits for the failing side's lock, after which its
            // error code is visible too (see `Slot::fail_from`).
            let msg = slot.message();
            let code = AcquireFailure::from_u32(slot.error.load(Ordering::Relaxed));
            slot.set_state(S::Failed, S::Free);
            return Err(match code {
                AcquireFailure::Timeout => FenceError::LockTimeout(name.to_string()),
                AcquireFailure::Lease => FenceError::NotGranted {
                    lock: name.to_string(),
                    why: msg,
                },
                _ => FenceError::LockServiceUnavailable(msg),
            });
        }
        if now_ms() >= deadline {
            cancel_slot(sh, slot);
            return Err(FenceError::LockTimeout(name.to_string()));
        }
        if sh.worker_latch.load(Ordering::Acquire) == 0 && slot.transition(S::Requested, S::Free) {
            return Err(FenceError::LockServiceUnavailable(
                "the pg_fencing worker stopped".into(),
            ));
        }
        poll_pause(started);
    }
}

/// FT005 unless the worker is running (it may be restarting: wait up to two seconds).
pub(super) fn wait_for_worker(sh: &Shared) -> Result<(), FenceError> {
    let deadline = now_ms() + 2000;
    while sh.worker_latch.load(Ordering::Acquire) == 0 {
        if now_ms() >= deadline {
            return Err(FenceError::LockServiceUnavailable(
                "the pg_fencing worker is not running".into(),
            ));
        }
        nap(10);
    }
    Ok(())
}

pub(super) fn cancel_slot(sh: &Shared, slot: &Slot) {
    loop {
        let st = slot.state();
        match st {
            S::Requested | S::Acquiring | S::Reserved => {
                if slot.transition(st, S::Cancelled) {
                    break;
                }
            }
            S::Held | S::Lost => {
                if slot.transition(st, S::ReleaseRequested) {
                    break;
                }
            }
            S::Failed => {
                if slot.transition(S::Failed, S::Free) {
                    break;
                }
            }
            _ => break,
        }
    }
    wake_worker(sh);
}

/// `fencing_release(lock_name)`: true if this session held the lock until now and released it;
/// false if it holds no such lock, or had lost it (its slot is freed all the same, with a
/// WARNING that says why: the work done under it may have been fenced off).
pub fn release(name: &str) -> Result<bool, FenceError> {
    let sh = shared()?;
    let me = crate::pg::process::my_pid();
    let mut found = false;
    let mut released = false;
    for s in sh.slots().iter() {
        if s.owner_pid.load(Ordering::Relaxed) != me || s.name() != name {
            continue;
        }
        // The etcd thread may turn Held into Lost meanwhile: then try again from Lost.
        let mut st = s.state();
        let mut why = s.message();
        while (st == S::Held || st == S::Lost) && !s.transition(st, S::ReleaseRequested) {
            st = s.state();
            why = s.message();
        }
        if st != S::Held && st != S::Lost {
            continue;
        }
        found = true;
        let token = s.token.load(Ordering::Relaxed);
        forget_session_token(token);
        if st == S::Held {
            released = true;
        } else {
            pgrx::warning!(
                "pg_fencing: lock \"{name}\" (fencing token {token}) had already been lost before fencing_release{}{}",
                if why.is_empty() { "" } else { ": " },
                why
            );
        }
    }
    if found {
        wake_worker(sh);
        // Wait (briefly) until etcd has deleted our key, so that the next holder, in or outside
        // PostgreSQL, can have the lock as soon as this returns.
        let started = now_ms();
        let deadline = started + 3000;
        while now_ms() < deadline
            && sh.slots().iter().any(|s| {
                s.owner_pid.load(Ordering::Relaxed) == me
                    && matches!(s.state(), S::ReleaseRequested | S::Releasing)
                    && s.name() == name
            })
        {
            poll_pause(started);
        }
    }
    Ok(released)
}

/// If the session's `pg_fencing.token` is this token, clear it.
pub(super) fn forget_session_token(token: i64) {
    if gucs::token_value() == token {
        crate::pg::guc::set_session_token(None);
    }
}

/// Backend exit: release held locks and cancel pending requests.
///
/// # Safety
/// Called by PostgreSQL's `before_shmem_exit` machinery on the backend's main thread, with
/// shared memory still attached.
#[pg_guard]
unsafe extern "C-unwind" fn on_backend_exit(_code: i32, _arg: pg_sys::Datum) {
    release_all_of_mine(true);
}

/// Transaction or subtransaction abort (e.g. `fencing_acquire` interrupted by a cancel or
/// `statement_timeout`): cancel this session's pending requests, and the request of an
/// interrupted `fencing_acquire` even if it was granted just before the error. Locks that a
/// `fencing_acquire` returned stay held (they are session-scoped).
///
/// `subxact`: the aborting subtransaction (`None`: the whole transaction); the requests of its
/// calls, and of its children's, are cancelled.
fn abort_pending(subxact: Option<pg_sys::SubTransactionId>) {
    let undone: Vec<(usize, u64)> = IN_TRANSACTION.with(|t| {
        let mut t = t.borrow_mut();
        let (undo, keep): (Vec<_>, Vec<_>) = t
            .drain(..)
            .partition(|(_, _, s)| subxact.is_none_or(|aborting| *s >= aborting));
        *t = keep;
        undo.into_iter().map(|(i, g, _)| (i, g)).collect()
    });
    if ENABLED.load(Ordering::Relaxed) && !undone.is_empty() {
        let sh = SHARED.get();
        let me = crate::pg::process::my_pid();
        for (index, generation) in undone {
            let s = &sh.slots()[index];
            if s.generation.load(Ordering::Acquire) == generation
                && s.owner_pid.load(Ordering::Relaxed) == me
            {
                cancel_slot(sh, s);
            }
        }
    }
    release_all_of_mine(false);
}

/// The end of a transaction that committed (or was prepared): its `fencing_acquire` locks are
/// the session's now.
fn commit_acquired() {
    IN_TRANSACTION.with(|t| t.borrow_mut().clear());
}

pub(super) fn release_all_of_mine(including_held: bool) {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let sh = SHARED.get();
    let me = crate::pg::process::my_pid();
    let mut any = false;
    for s in sh.slots().iter() {
        if s.owner_pid.load(Ordering::Relaxed) != me {
            continue;
        }
        let st = s.state();
        let pending = matches!(st, S::Requested | S::Acquiring | S::Reserved | S::Failed);
        if pending || (including_held && matches!(st, S::Held | S::Lost)) {
            cancel_slot(sh, s);
            any = true;
        }
    }
    if any {
        wake_worker(sh);
    }
}

pub(super) fn register_exit_callback() {
    use std::sync::Once;
    static REGISTERED: Once = Once::new();
    REGISTERED.call_once(|| crate::pg::process::on_exit(on_backend_exit));
}

/// Is `token` the token of a lock this session holds (or held and lost) through
/// `fencing_acquire`? (Such a token counts in every transaction of the session; see `gucs.rs`.)
pub fn held_by_this_session(token: i64) -> bool {
    if !ENABLED.load(Ordering::Relaxed) {
        return false;
    }
    let me = crate::pg::process::my_pid();
    SHARED.get().slots().iter().any(|s| {
        s.owner_pid.load(Ordering::Relaxed) == me
            && s.token.load(Ordering::Relaxed) == token
            && matches!(s.state(), S::Held | S::Lost)
    })
}

/// FT003 if `token` is the token of a lock taken through the worker (by any session) and that lock
/// is lost: marked lost by the worker, or past the end of its lease as last confirmed by etcd.
pub fn check_lock_not_lost(token: i64) -> Result<(), FenceError> {
    if !ENABLED.load(Ordering::Relaxed) {
        return Ok(());
    }
    let sh = SHARED.get();
    for s in sh.slots().iter() {
        // Any session's write carrying a lost lock's token fails, not only the holder's.
        if s.token.load(Ordering::Relaxed) != token {
            continue;
        }
        let st = s.state();
        let expired = st == S::Held && now_ms() >= s.valid_until_ms.load(Ordering::Relaxed);
        if st == S::Lost || expired {
            return Err(FenceError::LockLost {
                lock: s.name(),
                token,
                why: if expired {
                    "its lease has not been confirmed by etcd within its TTL".into()
                } else {
                    s.message()
                },
            });
        }
    }
    Ok(())
}

/// Rows of the `fencing_locks` view.
pub fn lock_rows() -> Vec<(
    String,
    String,
    Option<i64>,
    Option<i64>,
    Option<f64>,
    String,
    i32,
)> {
    let mut out = Vec::new();
    if !ENABLED.load(Ordering::Relaxed) {
        return out;
    }
    let sh = SHARED.get();
    if let Some(why) = sh.regression() {
        // Not a lock: the lock service itself, which no longer hands out tokens.
        out.push((
            String::new(),
            why,
            None,
            None,
            None,
            "etcd_regressed".to_string(),
            sh.worker_pid.load(Ordering::Relaxed),
        ));
    }
    let now = now_ms();
    for s in sh.slots().iter() {
        let st = s.state();
        let state = match st {
            S::Free | S::Reserved => continue,
            S::Requested | S::Acquiring => "acquiring",
            S::Held if now >= s.valid_until_ms.load(Ordering::Relaxed) => "lost",
            S::Held => "held",
            S::Failed => "failed",
            S::Cancelled => "cancelling",
            S::ReleaseRequested | S::Releasing => "releasing",
            S::Lost => "lost",
        };
        let token = s.token.load(Ordering::Relaxed);
        let lease = s.lease.load(Ordering::Relaxed);
        let valid = s.valid_until_ms.load(Ordering::Relaxed);
        out.push((
            s.name(),
            s.key(),
            (token > 0).then_some(token),
            (lease != 0).then_some(lease),
            (st == S::Held).then(|| ((valid - now).max(0) as f64) / 1000.0),
            state.to_string(),
            s.owner_pid.load(Ordering::Relaxed),
        ));
    }
    out
}

/// Per-backend state's life (`backend.rs`): locks acquired in the transaction are kept when it
/// commits (or is prepared) and released when it, or the savepoint they were acquired in, is
/// rolled back.
pub fn on_event(ev: BackendEvent) {
    match ev {
        BackendEvent::Commit | BackendEvent::Prepare => commit_acquired(),
        BackendEvent::Abort => abort_pending(None),
        BackendEvent::SubAbort(sub) => abort_pending(Some(sub)),
        _ => {}
    }
}
