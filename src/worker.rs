//! The optional background worker: etcd locks and leases taken from inside PostgreSQL.
//!
//! Processes and threads:
//! * a **backend** calling `fencing_acquire` writes a request into a slot of shared memory, sets
//!   the worker's latch and waits on its own latch (checking for interrupts, its timeout and the
//!   slot's state every millisecond);
//! * the **worker's main thread** (the only one that calls PostgreSQL) waits on its latch, handles
//!   SIGHUP/SIGTERM/postmaster death, and forwards requests to the etcd thread over a channel;
//! * the **etcd thread** runs tokio and `etcd-client`, never calls PostgreSQL, blocks all
//!   signals, and reports results by writing the slot's atomics (the waiting backend sees them).
//!
//! Lock protocol (SPEC.md, worker section): each acquisition gets its own lease (TTL
//! `pg_fencing.lease_ttl`) kept alive every TTL/3, and takes the lock with etcd's lock service,
//! which uses the concurrency-mutex layout (`<prefix><name>/<lease id in hex>`) exactly as
//! `etcdctl lock` and Go's `concurrency.Mutex` do, so all three exclude each other. The token is
//! the response-header revision of the grant (what `etcdctl lock` exports as `ETCD_LOCK_REV` and
//! `Mutex.Header().Revision` returns). Before a token is returned, the lease is checked to be
//! alive (etcd 3.4 can grant the lock to a waiter whose lease just expired).
//!
//! Lease loss: every slot carries `valid_until` (CLOCK_MONOTONIC ms): the send time of the last
//! keepalive that etcd answered plus the TTL it granted. A write carrying the token of a slot
//! that is past `valid_until` (or marked lost) fails with FT003 in the backend itself, even if
//! the worker is frozen, so it fails before etcd can have given the lock to anyone else.

use crate::error::FenceError;
use crate::gucs;
use crate::shmem_text::ShmemText;
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, SignalWakeFlags};
use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgAtomic};
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
use std::time::Duration;

pub const SLOTS: usize = 64;
const NAME_LEN: usize = 256;
const KEY_LEN: usize = 320;
const MSG_LEN: usize = 256;

// Slot states.
const FREE: u32 = 0;
const RESERVED: u32 = 1; // a backend is filling in a request
const REQUESTED: u32 = 2; // waiting for the worker
const ACQUIRING: u32 = 3; // the etcd thread works on it
const HELD: u32 = 4;
const FAILED: u32 = 5; // see `error`; the requesting backend frees the slot
const CANCELLED: u32 = 6; // the backend gave up; the etcd thread cleans up and frees it
const RELEASE_REQUESTED: u32 = 7;
const RELEASING: u32 = 8;
const LOST: u32 = 9;

// Failure codes.
const ERR_UNREACHABLE: u32 = 1; // FT005
const ERR_TIMEOUT: u32 = 2; // 55P03
const ERR_LEASE: u32 = 3; // FT003
const ERR_OTHER: u32 = 4; // FT005 with the message

#[repr(C)]
pub struct Slot {
    state: AtomicU32,
    generation: AtomicU64,
    owner_pid: AtomicI32,
    token: AtomicI64,
    lease: AtomicI64,
    ttl: AtomicI64,
    valid_until_ms: AtomicI64,
    deadline_ms: AtomicI64,
    error: AtomicU32,
    name: ShmemText<NAME_LEN>,
    key: ShmemText<KEY_LEN>,
    /// Why the slot is in its state (set together with the state change, see `ShmemText`).
    message: ShmemText<MSG_LEN>,
}

#[repr(C)]
pub struct Shared {
    worker_latch: AtomicUsize,
    worker_pid: AtomicI32,
    /// 0 unknown, 1 connected, 2 unreachable.
    etcd: AtomicU32,
    /// What etcd has told us about itself (see "Revision regression" below): its cluster id
    /// (0 = not known yet), the highest revision it answered a write with, and whether it has
    /// since answered from another cluster or with a lower revision (1), with why.
    etcd_cluster_id: AtomicU64,
    etcd_highest_revision: AtomicI64,
    etcd_regressed: AtomicU32,
    etcd_regression: ShmemText<MSG_LEN>,
    /// Set whenever the three above change; cleared by whoever saves them to the state file.
    etcd_state_dirty: AtomicU32,
    slots: [Slot; SLOTS],
}

unsafe impl PGRXSharedMemory for Shared {}
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
            slots: std::array::from_fn(|_| Slot {
                state: AtomicU32::new(FREE),
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
            }),
        }
    }
}

static SHARED: PgAtomic<Shared> = unsafe { PgAtomic::new(c"pg_fencing worker") };
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Milliseconds on CLOCK_MONOTONIC: one clock for all processes of the machine, and unlike the
/// wall clock it never jumps back (which would make an expired lease look valid).
pub(crate) fn now_ms() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as i64 * 1000 + ts.tv_nsec as i64 / 1_000_000
}

impl Slot {
    fn name(&self) -> String {
        self.name.get()
    }
    fn key(&self) -> String {
        self.key.get()
    }
    fn message(&self) -> String {
        self.message.get()
    }
    fn set_key(&self, k: &[u8]) {
        self.key.set(&String::from_utf8_lossy(k))
    }
    fn transition(&self, from: u32, to: u32) -> bool {
        self.state
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
    /// `transition` with the reason for the new state: whoever sees the new state and then reads
    /// the message gets this one (see `ShmemText::set_with`).
    fn transition_saying(&self, from: u32, to: u32, why: &str) -> bool {
        self.message.set_with(why, || self.transition(from, to))
    }
    /// FAILED from one of `from`, with `code` and the reason: state, error code and message
    /// change together under the message's lock (readers read the message, then the code).
    fn fail_from(&self, from: &[u32], code: u32, why: &str) -> bool {
        self.message.set_with(why, || {
            let failed = from.iter().any(|&f| self.transition(f, FAILED));
            if failed {
                self.error.store(code, Ordering::Relaxed);
            }
            failed
        })
    }
    fn fail(&self, code: u32, msg: &str) {
        // Only a slot still being acquired fails; a cancelled one is freed by its cleanup.
        let _ = self.fail_from(&[ACQUIRING], code, msg);
    }
}

/// Register the shared memory and the worker. Only possible while preloading.
pub fn init_if_preloading() {
    if !unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        return;
    }
    pg_shmem_init!(SHARED);
    ENABLED.store(true, Ordering::Relaxed);
    BackgroundWorkerBuilder::new("pg_fencing etcd worker")
        .set_type("pg_fencing etcd worker")
        .set_function("pg_fencing_worker_main")
        .set_library("pg_fencing")
        .enable_shmem_access(None)
        .set_restart_time(Some(Duration::from_secs(1)))
        .load();
}

fn shared() -> Result<&'static Shared, FenceError> {
    if !ENABLED.load(Ordering::Relaxed) {
        return Err(FenceError::WorkerUnavailable(
            "the pg_fencing background worker is not running: pg_fencing is not in shared_preload_libraries".into(),
        ));
    }
    Ok(SHARED.get())
}

fn wake_worker(sh: &Shared) {
    let latch = sh.worker_latch.load(Ordering::Acquire);
    if latch != 0 {
        unsafe { pg_sys::SetLatch(latch as *mut pg_sys::Latch) };
    }
}

/// Wait for the worker to move a slot on: the first 50 ms since `since_ms` in steps of 100 µs (an
/// etcd round trip on a local network is well under a millisecond), then on the latch for 1 ms.
/// Checks for interrupts either way.
fn poll_pause(since_ms: i64) {
    if now_ms() - since_ms < 50 {
        unsafe { pg_sys::pg_usleep(100) };
        pgrx::check_for_interrupts!();
    } else {
        nap(1);
    }
}

/// Sleep on this backend's latch for up to `ms` milliseconds, then check for interrupts (query
/// cancel, statement_timeout, termination); exits if the postmaster dies.
pub(crate) fn nap(ms: i64) {
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

fn lock_key_name(name: &str) -> String {
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
// `$PGDATA/pg_fencing_etcd.state` (saved right after it changes, so it survives restarts). A
// write sent after another write was answered is applied after it, so its answer carries at
// least that revision, from whichever member it comes; a lower one (or another cluster id) can
// only mean a regression. (Answers to writes in flight together may arrive in any order, so each
// answer is compared with the highest revision known when its request was sent.) From then on `fencing_acquire` fails with FT005 and held locks are lost, until a
// superuser runs `fencing_reset` (which forgets what the worker knew about etcd).

const STATE_FILE: &str = "pg_fencing_etcd.state";

impl Shared {
    fn regression(&self) -> Option<String> {
        if self.etcd_regressed.load(Ordering::Acquire) == 0 {
            return None;
        }
        Some(self.etcd_regression.get())
    }

    /// Record what a write's response header says about etcd. `floor`: the highest revision
    /// known when the request was sent (answers to requests in flight together may arrive in any
    /// order, but a write sent after another write's answer is applied after it, so its answer
    /// carries at least that revision). `Err` (with why) if etcd went backwards, now or before.
    fn observe_etcd(&self, cluster_id: u64, revision: i64, floor: i64) -> Result<(), String> {
        if let Some(why) = self.regression() {
            return Err(why);
        }
        let known = self.etcd_cluster_id.load(Ordering::Acquire);
        if known != 0 && cluster_id != 0 && cluster_id != known {
            return Err(self.regress(format!(
                "etcd answered from cluster {cluster_id:x}, not from cluster {known:x} as before"
            )));
        }
        if revision > 0 && revision < floor {
            return Err(self.regress(format!(
                "etcd's revision went back from {floor} to {revision}"
            )));
        }
        let mut changed = false;
        if known == 0 && cluster_id != 0 {
            changed |= self
                .etcd_cluster_id
                .compare_exchange(0, cluster_id, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
        }
        changed |= self
            .etcd_highest_revision
            .fetch_max(revision, Ordering::AcqRel)
            < revision;
        if changed {
            self.etcd_state_dirty.store(1, Ordering::Release);
        }
        Ok(())
    }

    fn regress(&self, why: String) -> String {
        let msg = format!(
            "{why}; tokens would no longer be comparable (a cluster restored from an old snapshot, or another cluster behind pg_fencing.etcd_endpoints)"
        );
        self.etcd_regression.set(&msg);
        self.etcd_regressed.store(1, Ordering::Release);
        self.etcd_state_dirty.store(1, Ordering::Release);
        for s in self.slots.iter() {
            s.transition_saying(HELD, LOST, "etcd's revisions went backwards");
        }
        msg
    }

    /// The state file's text: `cluster_id highest_revision regressed` and the reason.
    fn state_text(&self) -> String {
        format!(
            "{:x} {} {}\n{}\n",
            self.etcd_cluster_id.load(Ordering::Acquire),
            self.etcd_highest_revision.load(Ordering::Acquire),
            self.etcd_regressed.load(Ordering::Acquire),
            self.regression().unwrap_or_default()
        )
    }

    fn load_state_text(&self, text: &str) {
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
        self.etcd_cluster_id.store(cid, Ordering::Release);
        self.etcd_highest_revision.store(rev, Ordering::Release);
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
fn save_state(sh: &Shared, dir: &str, tag: &str) -> std::io::Result<()> {
    use std::io::Write;
    if sh.etcd_state_dirty.swap(0, Ordering::AcqRel) == 0 {
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
        sh.etcd_state_dirty.store(1, Ordering::Release);
    }
    result
}

pub(crate) fn data_dir() -> String {
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
    sh.etcd_state_dirty.store(1, Ordering::Release);
    let tag = format!("backend{}", unsafe { pg_sys::MyProcPid });
    if let Err(e) = save_state(sh, &data_dir(), &tag) {
        pgrx::warning!("pg_fencing: could not save {STATE_FILE}: {e}");
    }
    if let Some(why) = was {
        log!("pg_fencing: fencing_reset cleared the etcd revision regression ({why}); the worker hands out tokens again");
    }
}

/// For the watches of `watch.rs` (etcd thread): the highest revision etcd answered a write
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

/// Why the lock service cannot be trusted right now (`None`: fine, or no worker).
pub fn lock_service_problem() -> Option<String> {
    if !ENABLED.load(Ordering::Relaxed) {
        return None;
    }
    SHARED.get().regression()
}

// ---------------------------------------------------------------------------------------------
// Backend side

/// `fencing_acquire(lock_name, timeout)`: see `entry.rs`.
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
    let me = unsafe { pg_sys::MyProcPid };
    for s in sh.slots.iter() {
        let st = s.state.load(Ordering::Acquire);
        if s.owner_pid.load(Ordering::Relaxed) == me
            && (st == HELD || st == LOST)
            && s.name() == name
        {
            return Err(FenceError::InvalidArgument(format!(
                "this session already holds lock \"{name}\" (token {}); release it first",
                s.token.load(Ordering::Relaxed)
            )));
        }
    }
    let slot = sh
        .slots
        .iter()
        .find(|s| s.transition(FREE, RESERVED))
        .ok_or_else(|| FenceError::TooManyLocks(SLOTS))?;
    let started = now_ms();
    let deadline = started + timeout.as_millis() as i64;
    slot.generation.fetch_add(1, Ordering::AcqRel);
    slot.owner_pid.store(me, Ordering::Relaxed);
    slot.token.store(0, Ordering::Relaxed);
    slot.lease.store(0, Ordering::Relaxed);
    slot.error.store(0, Ordering::Relaxed);
    slot.deadline_ms.store(deadline, Ordering::Relaxed);
    slot.valid_until_ms.store(0, Ordering::Relaxed);
    slot.name.set(name);
    slot.set_key(lock_key_name(name).as_bytes());
    slot.message.set("");
    slot.state.store(REQUESTED, Ordering::Release);
    register_exit_callback();
    wake_worker(sh);

    loop {
        let st = slot.state.load(Ordering::Acquire);
        if st == HELD {
            return Ok(slot.token.load(Ordering::Relaxed));
        }
        if st == FAILED {
            // The message first: reading it waits for the failing side's lock, after which its
            // error code is visible too (see `Slot::fail_from`).
            let msg = slot.message();
            let code = slot.error.load(Ordering::Relaxed);
            slot.state.store(FREE, Ordering::Release);
            return Err(match code {
                ERR_TIMEOUT => FenceError::LockTimeout(name.to_string()),
                ERR_LEASE => FenceError::NotGranted {
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
        if sh.worker_latch.load(Ordering::Acquire) == 0 && slot.transition(REQUESTED, FREE) {
            return Err(FenceError::LockServiceUnavailable(
                "the pg_fencing worker stopped".into(),
            ));
        }
        poll_pause(started);
    }
}

/// FT005 unless the worker is running (it may be restarting: wait up to two seconds).
fn wait_for_worker(sh: &Shared) -> Result<(), FenceError> {
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

fn cancel_slot(sh: &Shared, slot: &Slot) {
    loop {
        let st = slot.state.load(Ordering::Acquire);
        match st {
            REQUESTED | ACQUIRING | RESERVED => {
                if slot.transition(st, CANCELLED) {
                    break;
                }
            }
            HELD | LOST => {
                if slot.transition(st, RELEASE_REQUESTED) {
                    break;
                }
            }
            FAILED => {
                if slot.transition(FAILED, FREE) {
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
    let me = unsafe { pg_sys::MyProcPid };
    let mut found = false;
    let mut released = false;
    for s in sh.slots.iter() {
        if s.owner_pid.load(Ordering::Relaxed) != me || s.name() != name {
            continue;
        }
        // The etcd thread may turn HELD into LOST meanwhile: then try again from LOST.
        let mut st = s.state.load(Ordering::Acquire);
        let mut why = s.message();
        while (st == HELD || st == LOST) && !s.transition(st, RELEASE_REQUESTED) {
            st = s.state.load(Ordering::Acquire);
            why = s.message();
        }
        if st != HELD && st != LOST {
            continue;
        }
        found = true;
        let token = s.token.load(Ordering::Relaxed);
        forget_session_token(token);
        if st == HELD {
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
            && sh.slots.iter().any(|s| {
                s.owner_pid.load(Ordering::Relaxed) == me
                    && matches!(
                        s.state.load(Ordering::Acquire),
                        RELEASE_REQUESTED | RELEASING
                    )
                    && s.name() == name
            })
        {
            poll_pause(started);
        }
    }
    Ok(released)
}

/// If the session's `pg_fencing.token` is this token, clear it.
fn forget_session_token(token: i64) {
    if gucs::current_token() == Some(token) {
        gucs::set_session_token(None);
    }
}

/// Backend exit: release held locks and cancel pending requests.
#[pg_guard]
unsafe extern "C-unwind" fn on_backend_exit(_code: i32, _arg: pg_sys::Datum) {
    release_all_of_mine(true);
}

/// Transaction abort (e.g. `fencing_acquire` interrupted by a cancel or `statement_timeout`):
/// cancel this session's pending requests. Held locks stay held (they are session-scoped).
pub fn abort_pending() {
    release_all_of_mine(false);
}

fn release_all_of_mine(including_held: bool) {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let sh = SHARED.get();
    let me = unsafe { pg_sys::MyProcPid };
    let mut any = false;
    for s in sh.slots.iter() {
        if s.owner_pid.load(Ordering::Relaxed) != me {
            continue;
        }
        let st = s.state.load(Ordering::Acquire);
        let pending = matches!(st, REQUESTED | ACQUIRING | RESERVED | FAILED);
        if pending || (including_held && matches!(st, HELD | LOST)) {
            cancel_slot(sh, s);
            any = true;
        }
    }
    if any {
        wake_worker(sh);
    }
}

fn register_exit_callback() {
    use std::sync::Once;
    static REGISTERED: Once = Once::new();
    REGISTERED.call_once(|| unsafe {
        pg_sys::before_shmem_exit(Some(on_backend_exit), pg_sys::Datum::from(0usize));
    });
}

/// Is `token` the token of a lock this session holds (or held and lost) through
/// `fencing_acquire`? (Such a token counts in every transaction of the session; see `gucs.rs`.)
pub fn held_by_this_session(token: i64) -> bool {
    if !ENABLED.load(Ordering::Relaxed) {
        return false;
    }
    let me = unsafe { pg_sys::MyProcPid };
    SHARED.get().slots.iter().any(|s| {
        s.owner_pid.load(Ordering::Relaxed) == me
            && s.token.load(Ordering::Relaxed) == token
            && matches!(s.state.load(Ordering::Acquire), HELD | LOST)
    })
}

/// FT003 if `token` is the token of a lock taken through the worker (by any session) and that lock
/// is lost: marked lost by the worker, or past the end of its lease as last confirmed by etcd.
pub fn check_token(token: i64) -> Result<(), FenceError> {
    if !ENABLED.load(Ordering::Relaxed) {
        return Ok(());
    }
    let sh = SHARED.get();
    for s in sh.slots.iter() {
        // Any session's write carrying a lost lock's token fails, not only the holder's.
        if s.token.load(Ordering::Relaxed) != token {
            continue;
        }
        let st = s.state.load(Ordering::Acquire);
        let expired = st == HELD && now_ms() >= s.valid_until_ms.load(Ordering::Relaxed);
        if st == LOST || expired {
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
    for s in sh.slots.iter() {
        let st = s.state.load(Ordering::Acquire);
        let state = match st {
            FREE | RESERVED => continue,
            REQUESTED | ACQUIRING => "acquiring",
            HELD if now >= s.valid_until_ms.load(Ordering::Relaxed) => "lost",
            HELD => "held",
            FAILED => "failed",
            CANCELLED => "cancelling",
            RELEASE_REQUESTED | RELEASING => "releasing",
            LOST => "lost",
            _ => "unknown",
        };
        let token = s.token.load(Ordering::Relaxed);
        let lease = s.lease.load(Ordering::Relaxed);
        let valid = s.valid_until_ms.load(Ordering::Relaxed);
        out.push((
            s.name(),
            s.key(),
            (token > 0).then_some(token),
            (lease != 0).then_some(lease),
            (st == HELD).then(|| ((valid - now).max(0) as f64) / 1000.0),
            state.to_string(),
            s.owner_pid.load(Ordering::Relaxed),
        ));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Worker main thread

#[derive(Clone, Debug)]
pub(crate) struct Config {
    endpoints: Vec<String>,
    ttl: i64,
    /// The data directory, where the etcd thread saves its state files.
    pub(crate) state_dir: String,
}

/// The worker's etcd settings, as the watches of `watch.rs` see them.
pub(crate) type WorkerConfig = Config;

impl Config {
    pub(crate) fn endpoints(&self) -> &[String] {
        &self.endpoints
    }
}

/// Connect to etcd (for `watch.rs`, on the etcd thread).
pub(crate) async fn etcd_connect(cfg: &Config) -> Result<etcd_client::Client, String> {
    etcd::connect(cfg).await
}

fn read_config() -> Config {
    Config {
        endpoints: gucs::etcd_endpoints()
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        ttl: gucs::lease_ttl() as i64,
        state_dir: String::new(),
    }
}

enum Cmd {
    Config(Config),
    Acquire(usize, u64),
    Release(usize, u64),
    Cancel(usize, u64),
    Shutdown(std::sync::mpsc::Sender<()>),
}

/// Entry point of the background worker.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pg_fencing_worker_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let sh = SHARED.get();
    // A previous incarnation of the worker died: its leases are no longer kept alive.
    for s in sh.slots.iter() {
        let why = "the pg_fencing worker restarted";
        let _ = s.transition_saying(HELD, LOST, why);
        let _ = s.fail_from(&[ACQUIRING, REQUESTED], ERR_UNREACHABLE, why);
        let _ = s.transition(RELEASE_REQUESTED, FREE);
        let _ = s.transition(RELEASING, FREE);
        let _ = s.transition(CANCELLED, FREE);
    }
    let dir = data_dir();
    if let Ok(text) = std::fs::read_to_string(std::path::Path::new(&dir).join(STATE_FILE)) {
        sh.load_state_text(&text);
    }
    if let Some(wsh) = crate::watch::shared() {
        match crate::watch::StateLock::take_interruptible(&dir) {
            Ok(_lock) => {
                for line in crate::watch::load_state(wsh, &dir) {
                    pgrx::warning!("pg_fencing: ignored a line of pg_fencing_watches.state it cannot read: {line:?}");
                }
            }
            Err(e) => pgrx::warning!("pg_fencing: could not lock pg_fencing_watches.state: {e}"),
        }
    }
    let mut logged_regression = false;
    sh.worker_pid
        .store(unsafe { pg_sys::MyProcPid }, Ordering::Relaxed);
    sh.worker_latch
        .store(unsafe { pg_sys::MyLatch } as usize, Ordering::Release);
    log!(
        "pg_fencing worker started (etcd endpoints: \"{}\")",
        gucs::etcd_endpoints()
    );

    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Cmd>();
    let mut cfg = read_config();
    cfg.state_dir = dir.clone();
    // The etcd thread must never run PostgreSQL's signal handlers: they belong to this thread. A
    // thread starts with its creator's signal mask, so block everything here before spawning
    // (blocking inside the new thread would leave a window) and restore this thread's mask
    // afterwards; tokio's threads inherit the blocked mask in turn.
    let blocked = AllSignalsBlocked::new();
    let thread = std::thread::Builder::new()
        .name("pg_fencing etcd".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            match rt {
                Ok(rt) => rt.block_on(etcd::run(rx, cfg, sh)),
                Err(e) => eprintln!("pg_fencing: could not start the etcd runtime: {e}"),
            }
        });
    drop(blocked);
    if let Err(e) = thread {
        pgrx::error!("pg_fencing: could not start the etcd thread: {e}");
    }

    let mut dispatched: [u64; SLOTS] = [0; SLOTS];
    let mut acquiring: [u64; SLOTS] = [u64::MAX; SLOTS];
    while BackgroundWorker::wait_latch(Some(Duration::from_millis(1000))) {
        if BackgroundWorker::sighup_received() {
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
            let mut c = read_config();
            c.state_dir = dir.clone();
            let _ = tx.send(Cmd::Config(c));
        }
        match sh.regression() {
            Some(why) if !logged_regression => {
                pgrx::warning!("pg_fencing: the worker stopped handing out tokens: {why}. Check etcd, then run fencing_reset (see README, \"Recovery after an etcd restore\").");
                logged_regression = true;
            }
            None => logged_regression = false,
            _ => {}
        }
        if let Err(e) = save_state(sh, &dir, "worker") {
            pgrx::warning!("pg_fencing: could not save {STATE_FILE}: {e}");
        }
        for (i, s) in sh.slots.iter().enumerate() {
            let generation = s.generation.load(Ordering::Acquire);
            match s.state.load(Ordering::Acquire) {
                REQUESTED => {
                    if s.transition(REQUESTED, ACQUIRING) {
                        acquiring[i] = generation;
                        let _ = tx.send(Cmd::Acquire(i, generation));
                    }
                }
                // Cancelled before the request reached the etcd thread: nothing to clean up.
                CANCELLED if acquiring[i] != generation => {
                    let _ = s.transition(CANCELLED, FREE);
                }
                RELEASE_REQUESTED => {
                    if s.transition(RELEASE_REQUESTED, RELEASING) {
                        let _ = tx.send(Cmd::Release(i, generation));
                    }
                }
                CANCELLED if dispatched[i] != generation => {
                    dispatched[i] = generation;
                    let _ = tx.send(Cmd::Cancel(i, generation));
                }
                _ => {}
            }
        }
    }
    // SIGTERM or postmaster death. First make every held lock lost, so that writes with their
    // tokens fail at once (FT003): nobody keeps their leases alive from now on. Then revoke the
    // leases if etcd answers quickly, never waiting long.
    sh.worker_latch.store(0, Ordering::Release);
    for s in sh.slots.iter() {
        let why = "the pg_fencing worker stopped";
        let _ = s.transition_saying(HELD, LOST, why);
        let _ = s.fail_from(&[ACQUIRING, REQUESTED], ERR_UNREACHABLE, why);
    }
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    if tx.send(Cmd::Shutdown(done_tx)).is_ok() {
        let _ = done_rx.recv_timeout(Duration::from_millis(700));
    }
    log!("pg_fencing worker stopped");
    // Exit code 1: if only the worker was stopped (not the server), the postmaster restarts it.
    unsafe { pg_sys::proc_exit(1) };
}

/// Every signal blocked on the calling thread while this value lives; the thread's previous mask
/// comes back when it is dropped. Signals that arrive meanwhile stay pending and are delivered
/// then.
struct AllSignalsBlocked(libc::sigset_t);

impl AllSignalsBlocked {
    fn new() -> Self {
        // SAFETY: sigfillset initialises `all`; pthread_sigmask changes only the calling thread's
        // mask and writes the previous one into `old`, which it fully initialises.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
            AllSignalsBlocked(old)
        }
    }
}

impl Drop for AllSignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: pthread_sigmask with a mask that `new` filled in; the value is made and
        // dropped within one function on the worker's main thread, so the mask returns to the
        // thread it came from.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The etcd thread: tokio + etcd-client, no PostgreSQL calls.

mod etcd {
    use super::*;
    use etcd_client::{Client, ConnectOptions, EventType, LockOptions, WatchOptions};
    use tokio::sync::mpsc::UnboundedReceiver;

    /// The client each held lock was taken with: a release must reach the etcd cluster that
    /// holds the key, even after `pg_fencing.etcd_endpoints` changed.
    type Owners = std::sync::Arc<std::sync::Mutex<std::collections::HashMap<usize, Client>>>;

    pub(super) async fn run(mut rx: UnboundedReceiver<Cmd>, mut cfg: Config, sh: &'static Shared) {
        let owners: Owners = Default::default();
        let watch_cfg = std::sync::Arc::new(std::sync::Mutex::new(cfg.clone()));
        tokio::spawn(crate::watch::etcd_side::supervise(watch_cfg.clone()));
        let mut client: Option<Client> = None;
        let mut backoff = Duration::from_millis(100);
        let mut next_try = tokio::time::Instant::now();
        while let Some(cmd) = rx.recv().await {
            match cmd {
                Cmd::Config(c) => {
                    if c.endpoints != cfg.endpoints {
                        client = None;
                    }
                    if let Ok(mut w) = watch_cfg.lock() {
                        *w = c.clone();
                    }
                    cfg = c;
                }
                Cmd::Acquire(i, generation) => {
                    let slot = &sh.slots[i];
                    if client.is_none() {
                        if tokio::time::Instant::now() < next_try {
                            // Back off between reconnection attempts, but never fail a request
                            // only because of the backoff: wait for the next attempt.
                            tokio::time::sleep_until(next_try).await;
                        }
                        match connect(&cfg).await {
                            Ok(c) => {
                                client = Some(c);
                                backoff = Duration::from_millis(100);
                                sh.etcd.store(1, Ordering::Relaxed);
                            }
                            Err(e) => {
                                sh.etcd.store(2, Ordering::Relaxed);
                                next_try = tokio::time::Instant::now() + backoff;
                                backoff = (backoff * 2).min(Duration::from_secs(5));
                                slot.fail(
                                    ERR_UNREACHABLE,
                                    &format!(
                                        "etcd is unreachable at {}: {e}",
                                        cfg.endpoints.join(",")
                                    ),
                                );
                                continue;
                            }
                        }
                    }
                    let Some(c) = client.clone() else { continue };
                    let ttl = cfg.ttl;
                    tokio::spawn(acquire(
                        c,
                        sh,
                        i,
                        generation,
                        ttl,
                        owners.clone(),
                        cfg.state_dir.clone(),
                    ));
                }
                Cmd::Release(i, generation) => {
                    let own = owners.lock().map(|mut o| o.remove(&i)).ok().flatten();
                    if let Some(c) = own.or_else(|| client.clone()) {
                        tokio::spawn(release(c, &sh.slots[i], generation));
                    } else {
                        // Without a connection the lease cannot be revoked; it expires by itself.
                        let _ = sh.slots[i].transition(RELEASING, FREE);
                    }
                }
                Cmd::Cancel(i, generation) => {
                    // The acquire task sees CANCELLED and cleans up; if there is none (lost
                    // connection), free the slot here.
                    let slot = &sh.slots[i];
                    if client.is_none() && slot.generation.load(Ordering::Acquire) == generation {
                        let _ = slot.transition(CANCELLED, FREE);
                    }
                }
                Cmd::Shutdown(done) => {
                    let held: Vec<(Client, i64)> = {
                        let o = owners.lock().map(|o| o.clone()).unwrap_or_default();
                        sh.slots
                            .iter()
                            .enumerate()
                            .filter(|(_, s)| {
                                matches!(
                                    s.state.load(Ordering::Acquire),
                                    HELD | LOST | RELEASING | RELEASE_REQUESTED
                                )
                            })
                            .filter_map(|(i, s)| {
                                let lease = s.lease.load(Ordering::Relaxed);
                                let c = o.get(&i).cloned().or_else(|| client.clone())?;
                                (lease != 0).then_some((c, lease))
                            })
                            .collect()
                    };
                    let _ = tokio::time::timeout(Duration::from_millis(500), async {
                        for (mut c, l) in held {
                            let _ = c.lease_revoke(l).await;
                        }
                    })
                    .await;
                    let _ = done.send(());
                    return;
                }
            }
        }
    }

    pub(super) async fn connect(cfg: &Config) -> Result<Client, String> {
        if cfg.endpoints.is_empty() {
            return Err("pg_fencing.etcd_endpoints is empty".into());
        }
        // No per-request timeout: a Lock request legitimately waits as long as the caller's
        // timeout; every call below has its own deadline.
        let opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2));
        let mut c = tokio::time::timeout(
            Duration::from_secs(2),
            Client::connect(cfg.endpoints.clone(), Some(opts)),
        )
        .await
        .map_err(|_| "connection timed out".to_string())?
        .map_err(|e| e.to_string())?;
        // A connection is only established lazily; make sure somebody answers.
        tokio::time::timeout(Duration::from_secs(2), c.status())
            .await
            .map_err(|_| "status request timed out".to_string())?
            .map_err(|e| e.to_string())?;
        Ok(c)
    }

    fn current(slot: &Slot, generation: u64) -> bool {
        slot.generation.load(Ordering::Acquire) == generation
    }

    /// Check a write's response header against what we know of etcd (see "Revision
    /// regression"); save the state file in the background when it changed.
    fn observe(
        sh: &'static Shared,
        header: Option<&etcd_client::ResponseHeader>,
        floor: i64,
        state_dir: &str,
    ) -> Result<(), String> {
        let result = match header {
            Some(h) => sh.observe_etcd(h.cluster_id(), h.revision(), floor),
            None => Ok(()),
        };
        if sh.etcd_state_dirty.load(Ordering::Acquire) != 0 && !state_dir.is_empty() {
            let dir = state_dir.to_string();
            tokio::task::spawn_blocking(move || {
                if let Err(e) = save_state(sh, &dir, "etcd") {
                    eprintln!("pg_fencing: could not save {STATE_FILE}: {e}");
                }
            });
        }
        result
    }

    async fn acquire(
        mut c: Client,
        sh: &'static Shared,
        index: usize,
        generation: u64,
        ttl: i64,
        owners: Owners,
        state_dir: String,
    ) {
        let slot = &sh.slots[index];
        let name = slot.key();
        let deadline_ms = slot.deadline_ms.load(Ordering::Relaxed);
        let remaining = Duration::from_millis((deadline_ms - now_ms()).max(0) as u64);
        let sent = now_ms();
        let floor = sh.etcd_highest_revision.load(Ordering::Acquire);
        let lease =
            match tokio::time::timeout(Duration::from_secs(3), c.lease_grant(ttl, None)).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => {
                    return fail_or_free(slot, ERR_UNREACHABLE, &format!("lease grant failed: {e}"))
                }
                Err(_) => return fail_or_free(slot, ERR_UNREACHABLE, "lease grant timed out"),
            };
        let lease_id = lease.id();
        if let Err(why) = observe(sh, lease.header(), floor, &state_dir) {
            slot.fail(ERR_OTHER, &why);
            return give_up(c, slot, generation, lease_id).await;
        }
        slot.lease.store(lease_id, Ordering::Relaxed);
        slot.ttl.store(lease.ttl(), Ordering::Relaxed);
        slot.valid_until_ms
            .store(sent + lease.ttl() * 1000, Ordering::Relaxed);
        tokio::spawn(keep_alive(
            c.clone(),
            slot,
            generation,
            lease_id,
            lease.ttl(),
        ));

        let floor = sh.etcd_highest_revision.load(Ordering::Acquire);
        let lock = c.lock(
            name.as_bytes(),
            Some(LockOptions::new().with_lease(lease_id)),
        );
        let cancelled = async {
            loop {
                tokio::time::sleep(Duration::from_millis(5)).await;
                if !current(slot, generation) || slot.state.load(Ordering::Acquire) == CANCELLED {
                    return;
                }
            }
        };
        let outcome = tokio::select! {
            r = tokio::time::timeout(remaining, lock) => Some(r),
            _ = cancelled => None,
        };
        let resp = match outcome {
            None => return give_up(c, slot, generation, lease_id).await,
            Some(Err(_)) => {
                slot.fail(ERR_TIMEOUT, "timed out");
                return give_up(c, slot, generation, lease_id).await;
            }
            Some(Ok(Err(e))) => {
                slot.fail(ERR_OTHER, &format!("etcd lock failed: {e}"));
                return give_up(c, slot, generation, lease_id).await;
            }
            Some(Ok(Ok(r))) => r,
        };
        if let Err(why) = observe(sh, resp.header(), floor, &state_dir) {
            slot.fail(ERR_OTHER, &why);
            let _ = c.unlock(resp.key().to_vec()).await;
            return give_up(c, slot, generation, lease_id).await;
        }
        let token = match resp.header().map(|h| h.revision()) {
            Some(rev) if rev > 0 => rev,
            _ => {
                slot.fail(
                    ERR_OTHER,
                    "etcd granted the lock without a revision in its response header",
                );
                let _ = c.unlock(resp.key().to_vec()).await;
                return give_up(c, slot, generation, lease_id).await;
            }
        };
        let key = resp.key().to_vec();
        // etcd 3.4 can grant the lock to a waiter whose lease has just expired: check it is alive.
        let alive = match tokio::time::timeout(
            Duration::from_secs(2),
            c.lease_time_to_live(lease_id, None),
        )
        .await
        {
            Ok(Ok(r)) => r.ttl() > 0,
            _ => false,
        };
        if !alive {
            slot.fail(
                ERR_LEASE,
                "etcd reports the request's lease expired or revoked when it granted the lock",
            );
            return give_up(c, slot, generation, lease_id).await;
        }
        slot.set_key(&key);
        slot.token.store(token, Ordering::Relaxed);
        if let Ok(mut o) = owners.lock() {
            o.insert(index, c.clone());
        }
        if !slot.transition(ACQUIRING, HELD) {
            // Cancelled meanwhile: undo.
            if let Ok(mut o) = owners.lock() {
                o.remove(&index);
            }
            let _ = c.unlock(key).await;
            give_up(c, slot, generation, lease_id).await;
            return;
        }
        // Watch our key from the grant on: its deletion (lease revoked or expired, key deleted by
        // someone) means the lock is gone, and is reported at once. The watch is set up after the
        // token is handed out, but from revision token + 1, so no deletion is missed. Without a
        // watch, loss is still detected by the keepalive (within TTL/3) and by the lease's
        // validity time.
        let watch = tokio::time::timeout(
            Duration::from_secs(2),
            c.watch(
                key,
                Some(WatchOptions::new().with_start_revision(token + 1)),
            ),
        )
        .await;
        if let Ok(Ok(stream)) = watch {
            watch_key(stream, slot, generation).await;
        }
    }

    async fn watch_key(mut stream: etcd_client::WatchStream, slot: &'static Slot, generation: u64) {
        loop {
            if !current(slot, generation) || !matches!(slot.state.load(Ordering::Acquire), HELD) {
                return;
            }
            match tokio::time::timeout(Duration::from_millis(500), stream.message()).await {
                Err(_) => continue,
                Ok(Ok(Some(resp))) => {
                    if resp
                        .events()
                        .iter()
                        .any(|e| e.event_type() == EventType::Delete)
                    {
                        mark_lost(
                            slot,
                            generation,
                            "its etcd key was deleted (lease revoked or expired)",
                        );
                        return;
                    }
                    if resp.canceled() {
                        return;
                    }
                }
                Ok(_) => return,
            }
        }
    }

    fn fail_or_free(slot: &Slot, code: u32, msg: &str) {
        slot.fail(code, msg);
        let _ = slot.transition(CANCELLED, FREE);
    }

    /// Revoke the lease (deleting any key under it) and free a cancelled slot.
    async fn give_up(mut c: Client, slot: &Slot, generation: u64, lease: i64) {
        let _ = tokio::time::timeout(Duration::from_secs(2), c.lease_revoke(lease)).await;
        if current(slot, generation) {
            let _ = slot.transition(CANCELLED, FREE);
        }
    }

    async fn release(mut c: Client, slot: &'static Slot, generation: u64) {
        let key = slot.key();
        let lease = slot.lease.load(Ordering::Relaxed);
        // Revoking the lease deletes our key with it (one request); without a lease, delete the
        // key itself. Our key carries our lease id, so this never deletes another holder's key.
        let revoked = lease != 0
            && matches!(
                tokio::time::timeout(Duration::from_secs(2), c.lease_revoke(lease)).await,
                Ok(Ok(_))
            );
        if !revoked {
            let _ = tokio::time::timeout(Duration::from_secs(2), c.unlock(key.as_bytes())).await;
        }
        if current(slot, generation) {
            slot.token.store(0, Ordering::Relaxed);
            let _ = slot.transition(RELEASING, FREE);
        }
    }

    fn mark_lost(slot: &Slot, generation: u64, why: &str) {
        if current(slot, generation) {
            let _ = slot.transition_saying(HELD, LOST, why);
        }
    }

    /// Keep one lease alive every TTL/3 until its slot moves on; mark the lock lost when etcd
    /// says the lease is gone or when it could not be confirmed within its TTL.
    async fn keep_alive(mut c: Client, slot: &'static Slot, generation: u64, lease: i64, ttl: i64) {
        let period = Duration::from_millis((ttl.max(1) * 1000 / 3) as u64);
        let mut stream = None;
        loop {
            tokio::time::sleep(period).await;
            if !current(slot, generation) {
                return;
            }
            match slot.state.load(Ordering::Acquire) {
                ACQUIRING | HELD => {}
                _ => return,
            }
            if stream.is_none() {
                stream =
                    match tokio::time::timeout(Duration::from_secs(2), c.lease_keep_alive(lease))
                        .await
                    {
                        Ok(Ok(s)) => Some(s),
                        _ => None,
                    };
            }
            let sent = now_ms();
            let answer = match stream.as_mut() {
                Some((keeper, responses)) => tokio::time::timeout(period, async {
                    keeper.keep_alive().await.ok()?;
                    responses.message().await.ok().flatten()
                })
                .await
                .ok()
                .flatten(),
                None => None,
            };
            match answer {
                Some(r) if r.ttl() > 0 => {
                    slot.valid_until_ms
                        .store(sent + r.ttl() * 1000, Ordering::Relaxed);
                }
                Some(_) => {
                    mark_lost(
                        slot,
                        generation,
                        "etcd reports the lease expired or was revoked",
                    );
                    return;
                }
                None => {
                    stream = None; // reconnect the keepalive stream on the next round
                                   // Is the lease gone (revoked), or is etcd just not answering?
                    if let Ok(Ok(r)) = tokio::time::timeout(
                        Duration::from_secs(1),
                        c.lease_time_to_live(lease, None),
                    )
                    .await
                    {
                        if r.ttl() <= 0 {
                            mark_lost(
                                slot,
                                generation,
                                "etcd reports the lease expired or was revoked",
                            );
                            return;
                        }
                    }
                    if now_ms() >= slot.valid_until_ms.load(Ordering::Relaxed) {
                        mark_lost(
                            slot,
                            generation,
                            "the lease could not be kept alive within its TTL",
                        );
                        return;
                    }
                }
            }
        }
    }
}
