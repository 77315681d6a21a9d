//! Watched resources (docs/design.md, "Watched resources"): the background worker watches an etcd lock and,
//! whenever it changes hands, raises the resource's effective high-water mark to the hand-over
//! revision, so an older holder is fenced off the moment the lock changes hands, before the new
//! holder writes. With `verify`, a write must also carry a token that etcd can have issued to the
//! current holder: not above the latest revision the watch has seen (Chubby's CheckSequencer).
//!
//! The hand-over revision of a new holder is the later of its key's create revision and the
//! revision at which its predecessor's key was deleted: exactly the revision at which etcd's lock
//! service granted it the lock (its token), never above it.
//!
//! Where things live:
//! * registrations (per database, like the marks they raise) are rows of `_pg_fencing.watch`,
//!   WAL-logged, so standbys, promotion, PITR, pg_upgrade and pg_dump carry them (docs/design.md,
//!   "Lifecycle guarantees"). A row trigger queues each change and the change reaches shared
//!   memory at commit (`apply_pending`); rows that arrive without it (WAL replay, pg_upgrade) are
//!   registered by the first backend of the database that looks (`reconcile`);
//! * the running watches and what they know are in shared memory (`WatchShared`), read by every
//!   backend's fencing check (`check`), and saved in `$PGDATA/pg_fencing_watches.state` (by the
//!   backend that changes them, and by the etcd thread whenever a hand-over raised a mark), a
//!   head start for restarts, never the only copy of a fact: a watch that (re)started admits no
//!   write to its resource until it has read etcd (`wait_until_synced`);
//! * the watch itself runs on the worker's etcd thread (`etcd_side`), never calling PostgreSQL;
//!   after any error (disconnect, etcd restart, compaction) it starts over from a fresh read of
//!   the lock's keys, so a hand-over is never missed silently.
//!
//! The effective mark of a watched resource is `max(stored mark, hand-over revision)`; a write
//! that passes stores its own token as usual, which is at least the hand-over revision.

use super::shmem_text::ShmemText;
use crate::backend_event::BackendEvent;
use crate::error::{FenceError, Token};
use crate::pg::lock_manager::{lock_resource, LockMode};
use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgAtomic};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};

pub const WATCH_SLOTS: usize = 64;
pub(super) use super::shmem_text::{KEY_LEN, MSG_LEN, NAME_LEN};
pub(super) const STATE_FILE: &str = "pg_fencing_watches.state";

/// A watch slot's states and their transitions (the protocol's table is in
/// `pg_fencing_core::slot_states`; `Stopping` is a slot unwatched by a transaction that is
/// committing: still enforced, no longer raised).
pub(super) use pg_fencing_core::slot_states::{WatchSlotState, WatchSlotState as W};

#[repr(C)]
pub struct WatchSlot {
    /// A `WatchSlotState`, read and changed only through `state`, `transition` and `set_state`.
    state: AtomicU32,
    /// The database whose resource this is (marks are per database, and so are watches).
    pub(super) dboid: AtomicU32,
    /// Bumped on every (re-)registration: the etcd thread restarts the slot's watch.
    pub(crate) generation: AtomicU64,
    pub(super) verify: AtomicBool,
    /// Highest hand-over revision seen (0: none yet).
    pub(crate) handover: AtomicI64,
    /// The create revision of the lock key whose grant `handover` is (0: a bound, not a known
    /// grant); see `pg_fencing_core::handover::compacted_bound`.
    pub(super) handover_key: AtomicI64,
    /// Latest revision the watch has confirmed, and when (CLOCK_MONOTONIC ms; 0 never).
    pub(crate) latest: AtomicI64,
    pub(crate) confirmed_ms: AtomicI64,
    pub(super) resource: ShmemText<NAME_LEN>,
    pub(super) prefix: ShmemText<KEY_LEN>,
    pub(super) message: ShmemText<MSG_LEN>,
}

#[repr(C)]
pub struct WatchShared {
    /// Number of enforced (Active or Stopping) slots (a fast "nothing is watched" for every write).
    pub(super) active: AtomicU32,
    /// The state file has been loaded into the slots (once per server start).
    pub(super) loaded: AtomicU32,
    /// Set when a hand-over raised a mark; the etcd thread saves the state file and clears it.
    pub(crate) dirty: AtomicU32,
    pub(crate) slots: [WatchSlot; WATCH_SLOTS],
}

// SAFETY: every field is an atomic or a `ShmemText` (its own spinlock), with no pointers into
// process-local memory, so the struct may live in shared memory and be used from every process
// and thread at once.
unsafe impl PGRXSharedMemory for WatchShared {}
// SAFETY: as above: all access goes through atomics or `ShmemText`'s lock.
unsafe impl Sync for WatchShared {}

impl Default for WatchShared {
    fn default() -> Self {
        WatchShared {
            active: AtomicU32::new(0),
            loaded: AtomicU32::new(0),
            dirty: AtomicU32::new(0),
            slots: std::array::from_fn(|_| WatchSlot {
                state: AtomicU32::new(W::Free as u32),
                dboid: AtomicU32::new(0),
                generation: AtomicU64::new(0),
                verify: AtomicBool::new(false),
                handover: AtomicI64::new(0),
                handover_key: AtomicI64::new(0),
                latest: AtomicI64::new(0),
                confirmed_ms: AtomicI64::new(0),
                resource: ShmemText::default(),
                prefix: ShmemText::default(),
                message: ShmemText::default(),
            }),
        }
    }
}

// SAFETY: initialised by pg_shmem_init! in _PG_init while preloading, before any use (`shared()`
// checks ENABLED, which is set only after that).
static WATCHES: PgAtomic<WatchShared> = unsafe { PgAtomic::new(c"pg_fencing watches") };
static ENABLED: AtomicBool = AtomicBool::new(false);

impl WatchSlot {
    /// The slot's state now.
    pub(crate) fn state(&self) -> WatchSlotState {
        WatchSlotState::from_u32(self.state.load(Ordering::Acquire))
    }
    /// `from` to `to` if the slot is in `from` (compare-and-swap); only a transition of the
    /// protocol (`WatchSlotState::may_become`) is made, anything else is refused (false) and a
    /// debug build panics.
    pub(crate) fn transition(&self, from: WatchSlotState, to: WatchSlotState) -> bool {
        debug_assert!(
            from.may_become(to),
            "watch slot: {from:?} -> {to:?} is no transition"
        );
        from.may_become(to)
            && self
                .state
                .compare_exchange(from as u32, to as u32, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }
    /// `from` to `to` by a store, for the one side that owns the slot in `from`.
    pub(super) fn set_state(&self, from: WatchSlotState, to: WatchSlotState) {
        debug_assert!(
            from.may_become(to),
            "watch slot: {from:?} -> {to:?} is no transition"
        );
        debug_assert_eq!(self.state(), from);
        if from.may_become(to) {
            self.state.store(to as u32, Ordering::Release);
        }
    }
    pub(crate) fn resource(&self) -> String {
        self.resource.get()
    }
    pub(crate) fn prefix(&self) -> String {
        self.prefix.get()
    }
    pub(super) fn set_prefix(&self, s: &str) {
        self.prefix.set(s)
    }
    pub(crate) fn message(&self) -> String {
        self.message.get()
    }
    pub(crate) fn set_message(&self, s: &str) {
        self.message.set(s)
    }
    /// The watch task of `generation` reports its status; a task of an older registration
    /// changes nothing (checked under the message's lock, so it cannot overwrite the status of
    /// the registration that replaced it).
    pub(crate) fn report(&self, generation: u64, s: &str) {
        let _ = self
            .message
            .set_with(s, || self.generation.load(Ordering::Acquire) == generation);
    }
    /// Raise the hand-over revision on behalf of the watch task of `generation`, to the grant
    /// of the key created at `key` (0: a bound, not a known grant); true if it went up. A task
    /// of an older registration changes nothing.
    pub(crate) fn raise_handover(&self, rev: i64, key: i64, generation: u64) -> bool {
        loop {
            if self.generation.load(Ordering::Acquire) != generation {
                return false;
            }
            let cur = self.handover.load(Ordering::Acquire);
            if rev <= cur {
                return false;
            }
            if self
                .handover
                .compare_exchange(cur, rev, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                // Read together with `handover` only by this slot's one watch task, and saved
                // (the state file) under the state lock: a racing reader at most sees a 0 key,
                // which only makes a later compacted start fall back to the compaction revision.
                self.handover_key.store(key, Ordering::Release);
                return true;
            }
        }
    }
    pub(crate) fn confirm(&self, rev: i64, now_ms: i64, generation: u64) {
        if self.generation.load(Ordering::Acquire) != generation {
            return;
        }
        self.latest.fetch_max(rev, Ordering::AcqRel);
        self.confirmed_ms.store(now_ms, Ordering::Release);
    }
}

/// Called from `_PG_init` with `shared_preload_libraries`.
pub fn init_if_preloading() {
    if !crate::pg::process::preloading() {
        return;
    }
    pg_shmem_init!(WATCHES);
    ENABLED.store(true, Ordering::Relaxed);
}

pub(crate) fn shared() -> Option<&'static WatchShared> {
    ENABLED.load(Ordering::Relaxed).then(|| WATCHES.get())
}

/// The active slot of `resource` (compared in place: this runs for every write while anything
/// is watched).
pub(super) fn find<'a>(sh: &'a WatchShared, resource: &str) -> Option<&'a WatchSlot> {
    let db = crate::pg::process::my_database();
    sh.slots.iter().find(|s| {
        s.state().enforced() && s.dboid.load(Ordering::Acquire) == db && s.resource.equals(resource)
    })
}

// ---------------------------------------------------------------------------------------------
// State file (plain file I/O: the etcd thread may call these too)

/// One line per watch: database oid, resource, etcd key prefix, verify (0/1), hand-over revision,
/// and the create revision of the key it was granted to (0 if unknown; absent in files written
/// before 0.2.0); tab-separated (names with tabs or line breaks are refused at registration).
pub(super) fn state_text(sh: &WatchShared) -> String {
    let mut out = String::new();
    for s in sh.slots.iter() {
        if !s.state().enforced() {
            continue;
        }
        out.push_str(&format!(
            "{}\t{}\t{}\t{}\t{}\t{}\n",
            s.dboid.load(Ordering::Acquire),
            s.resource(),
            s.prefix(),
            s.verify.load(Ordering::Acquire) as u8,
            s.handover.load(Ordering::Acquire),
            s.handover_key.load(Ordering::Acquire)
        ));
    }
    out
}

/// An exclusive advisory lock on `pg_fencing_watches.lock` in the data directory, held while
/// registrations change and while the state file is written (backends and the worker are
/// separate processes), released when dropped.
///
/// Lock order: a resource's heavyweight lock (`pg::lock_manager::lock_resource`) is always taken
/// before this one, never while holding it (`fencing_reset` and `fencing_unwatch` both need both;
/// PostgreSQL's deadlock detector cannot see this lock). PostgreSQL processes wait for it on
/// their latch (`take_interruptible`), so a wait honours cancel and postmaster death.
pub(crate) struct StateLock(std::fs::File);

impl StateLock {
    fn open(dir: &str) -> std::io::Result<std::fs::File> {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(std::path::Path::new(dir).join("pg_fencing_watches.lock"))
    }

    /// Try once; `Ok(false)` if another process holds it.
    fn try_take(f: &std::fs::File) -> std::io::Result<bool> {
        use std::os::unix::io::AsRawFd;
        // SAFETY: flock on a descriptor this function's caller owns; no memory is passed.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) | Some(libc::EINTR) => Ok(false),
            _ => Err(e),
        }
    }

    /// For the etcd thread (no PostgreSQL calls there): waits in `flock`.
    pub(crate) fn take(dir: &str) -> std::io::Result<StateLock> {
        use std::os::unix::io::AsRawFd;
        let f = Self::open(dir)?;
        // SAFETY: as in `try_take`.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(StateLock(f))
    }

    /// For backends and the worker's main thread: waits on the latch between tries, checking
    /// for interrupts (query cancel, statement_timeout, termination) and postmaster death.
    pub(crate) fn take_interruptible(dir: &str) -> std::io::Result<StateLock> {
        let f = Self::open(dir)?;
        while !Self::try_take(&f)? {
            crate::lock_service::etcd_locks::nap(1);
        }
        Ok(StateLock(f))
    }
}

impl Drop for StateLock {
    fn drop(&mut self) {
        use std::os::unix::io::AsRawFd;
        // SAFETY: unlocks the descriptor this value owns; no memory is passed.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Write the state file from shared memory (take the `StateLock` first).
pub(crate) fn save_state(sh: &WatchShared, dir: &str, tag: &str) -> std::io::Result<()> {
    use std::io::Write;
    let path = std::path::Path::new(dir).join(STATE_FILE);
    let tmp = std::path::Path::new(dir).join(format!("{STATE_FILE}.{tag}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(state_text(sh).as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Register what the state file lists, once per server start (by the worker, or by the first
/// backend that changes a watch, whichever comes first; take the `StateLock` first). Returns
/// the lines that could not be read, for the caller to report.
pub(crate) fn load_state(sh: &WatchShared, dir: &str) -> Vec<String> {
    let mut bad = Vec::new();
    if sh.loaded.swap(1, Ordering::AcqRel) == 1 {
        return bad;
    }
    let Ok(bytes) = std::fs::read(std::path::Path::new(dir).join(STATE_FILE)) else {
        return bad;
    };
    let text = String::from_utf8_lossy(&bytes);
    for line in text.lines().filter(|l| !l.is_empty()) {
        let f: Vec<&str> = line.split('\t').collect();
        let parsed = (f.len() == 5 || f.len() == 6)
            .then(|| {
                let key = f.get(5).map(|k| k.parse::<i64>()).unwrap_or(Ok(0));
                (
                    f[0].parse::<u32>(),
                    f[3].parse::<u8>(),
                    f[4].parse::<i64>(),
                    key,
                )
            })
            .and_then(|(d, v, h, k)| Some((d.ok()?, v.ok()?, h.ok()?, k.ok()?)));
        let Some((db, verify, handover, handover_key)) = parsed else {
            bad.push(line.to_string());
            continue;
        };
        let Some(slot) = sh.slots.iter().find(|s| s.transition(W::Free, W::Busy)) else {
            bad.push(line.to_string());
            continue;
        };
        slot.dboid.store(db, Ordering::Release);
        slot.resource.set(f[1]);
        slot.set_prefix(f[2]);
        slot.verify.store(verify == 1, Ordering::Release);
        slot.handover.store(handover, Ordering::Release);
        slot.handover_key.store(handover_key, Ordering::Release);
        slot.latest.store(0, Ordering::Release);
        slot.confirmed_ms.store(0, Ordering::Release);
        slot.set_message("starting");
        slot.generation.fetch_add(1, Ordering::AcqRel);
        slot.set_state(W::Busy, W::Active);
        sh.active.fetch_add(1, Ordering::AcqRel);
    }
    bad
}

/// A backend changes watches: under the `StateLock`, after loading the state file if nobody has
/// yet, then saves the file.
pub(super) fn with_state<T>(
    sh: &WatchShared,
    change: impl FnOnce() -> Result<T, FenceError>,
) -> Result<T, FenceError> {
    let dir = crate::lock_service::etcd_locks::data_dir();
    let io = |e: std::io::Error| {
        FenceError::WorkerUnavailable(format!(
            "pg_fencing: could not lock or save {STATE_FILE}: {e}"
        ))
    };
    let _lock = StateLock::take_interruptible(&dir).map_err(io)?;
    for line in load_state(sh, &dir) {
        pgrx::warning!("pg_fencing: ignored a line of {STATE_FILE} it cannot read: {line:?}");
    }
    let out = change()?;
    let tag = format!("backend{}", crate::pg::process::my_pid());
    save_state(sh, &dir, &tag).map_err(io)?;
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// SQL functions (see api/functions.rs)

/// `fencing_watch(resource, lock_name, verify)`: writes the registration into `_pg_fencing.watch`
/// (WAL-logged, so standbys, promotion, PITR, pg_upgrade and pg_dump carry it); the watch starts
/// when the transaction commits (`apply_pending`).
pub fn watch(resource: &str, lock_name: &str, verify: bool) -> Result<(), FenceError> {
    // Watches are per database, like the marks they raise.
    let sh = shared().ok_or_else(|| {
        FenceError::WorkerUnavailable(
            "watched resources need the background worker: pg_fencing is not in shared_preload_libraries".into(),
        )
    })?;
    let bad = |s: &str| s.is_empty() || s.contains(['\t', '\n', '\r']);
    if bad(resource) || bad(lock_name) || resource.len() >= NAME_LEN {
        return Err(FenceError::InvalidArgument(
            "resource and lock_name must be non-empty names without tabs or line breaks, resource shorter than 256 bytes".into(),
        ));
    }
    let prefix = format!("{}{}/", crate::gucs::lock_prefix(), lock_name);
    if prefix.len() >= KEY_LEN {
        return Err(FenceError::InvalidArgument(format!(
            "pg_fencing.lock_prefix and lock_name together must have fewer than {} bytes",
            KEY_LEN - 1
        )));
    }
    if !crate::pg::process::is_superuser()
        && !crate::state::privileges::may_write_resource(resource)
    {
        return Err(FenceError::NotAllowed(crate::error::Text {
            message: format!("permission denied to watch resource \"{resource}\""),
            detail: Some("A watch raises the resource's mark at every hand-over: it needs what fencing_advance needs (INSERT, UPDATE or DELETE privilege on a table protected with the resource).".into()),
            hint: None,
        }));
    }
    require_watch_table("fencing_watch")?;
    // One registration change per resource at a time (and the lock order of `StateLock`).
    lock_resource(resource, LockMode::Exclusive);
    // Refuse now rather than at commit when no slot is free (commit checks again).
    if find(sh, resource).is_none() && !sh.slots.iter().any(|s| s.state() == W::Free) {
        return Err(slots_full());
    }
    crate::pg::spi::exec_internal(
        "INSERT INTO _pg_fencing.watch AS w (resource, lock_key_prefix, verify) VALUES ($1, $2, $3) \
         ON CONFLICT (resource) DO UPDATE SET lock_key_prefix = EXCLUDED.lock_key_prefix, \
             verify = EXCLUDED.verify, watched_at = pg_catalog.now()",
        false,
        &[pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::BOOLOID],
        &mut [
            crate::pg::spi::text_datum(resource),
            crate::pg::spi::text_datum(&prefix),
            pg_sys::Datum::from(verify),
        ],
        false,
        |_| (),
    );
    // Queued here too, not only by the table's trigger: that trigger does not fire with
    // session_replication_role = replica.
    queue_change(resource, Some((prefix, verify)));
    Ok(())
}

pub(super) fn slots_full() -> FenceError {
    FenceError::WatchSlotsFull(crate::error::Text {
        message: format!("all {WATCH_SLOTS} watch slots of the pg_fencing worker are in use"),
        detail: None,
        hint: Some(
            "Unwatch resources that no longer need it (fencing_unwatch); see fencing_watches."
                .into(),
        ),
    })
}

/// Make `resource` of this database watched with `prefix` and `verify` in shared memory (take
/// the `StateLock` first). A registration that is already there unchanged is left alone (its
/// watch keeps running); a changed one starts its watch over, and the resource admits no write
/// until the new watch has read etcd.
pub(super) fn register(
    sh: &WatchShared,
    resource: &str,
    prefix: &str,
    verify: bool,
) -> Result<(), FenceError> {
    let slot = match find(sh, resource) {
        Some(s) => {
            if s.prefix.equals(prefix) && s.verify.load(Ordering::Acquire) == verify {
                return Ok(());
            }
            s
        }
        None => {
            let s = sh
                .slots
                .iter()
                .find(|s| s.transition(W::Free, W::Busy))
                .ok_or_else(slots_full)?;
            s.dboid
                .store(crate::pg::process::my_database(), Ordering::Release);
            s.resource.set(resource);
            s.handover.store(0, Ordering::Release);
            s.handover_key.store(0, Ordering::Release);
            s
        }
    };
    // A new generation first: the old watch task can no longer change the slot.
    slot.generation.fetch_add(1, Ordering::AcqRel);
    slot.set_prefix(prefix);
    slot.verify.store(verify, Ordering::Release);
    slot.latest.store(0, Ordering::Release);
    slot.confirmed_ms.store(0, Ordering::Release);
    slot.set_message("starting");
    slot.generation.fetch_add(1, Ordering::AcqRel);
    if slot.transition(W::Busy, W::Active) {
        sh.active.fetch_add(1, Ordering::AcqRel);
    }
    Ok(())
}

/// `fencing_unwatch(resource)`: true if it was watched. Deletes the registration; the watch stops
/// when the transaction commits, and the hand-over revision it reached is stored as the
/// resource's mark then (`apply_pending`), so fencing does not drop with the watch.
pub fn unwatch(resource: &str) -> Result<bool, FenceError> {
    if !crate::pg::process::is_superuser()
        && !crate::state::privileges::may_write_resource(resource)
    {
        return Err(FenceError::NotAllowed(crate::error::Text {
            message: format!("permission denied to unwatch resource \"{resource}\""),
            detail: None,
            hint: None,
        }));
    }
    require_watch_table("fencing_unwatch")?;
    // The resource's lock before the state file's (see `StateLock`), held to the commit.
    lock_resource(resource, LockMode::Exclusive);
    let deleted = crate::pg::spi::exec_internal(
        "DELETE FROM _pg_fencing.watch WHERE resource OPERATOR(pg_catalog.=) $1 RETURNING true",
        false,
        &[pg_sys::TEXTOID],
        &mut [crate::pg::spi::text_datum(resource)],
        false,
        |_| true,
    )
    .unwrap_or(false);
    // As this transaction sees it: its own earlier watch/unwatch of the resource, else the
    // running registrations.
    let in_memory = PENDING
        .with(|p| {
            p.borrow()
                .iter()
                .rev()
                .find(|(_, r, _)| r == resource)
                .map(|(_, _, w)| w.is_some())
        })
        .unwrap_or_else(|| shared().and_then(|sh| find(sh, resource)).is_some());
    // Also a registration that shared memory has and the table has not (one restored from the
    // state file after a point-in-time recovery to before it existed, say).
    queue_change(resource, None);
    Ok(deleted || in_memory)
}

// ---------------------------------------------------------------------------------------------
// Registrations follow the table `_pg_fencing.watch`, transactionally: its row trigger queues
// each change (`queue_change`), and the changes reach shared memory just before the transaction
// commits (`apply_pending`, from the `PRE_COMMIT` callback); an abort drops them. Rows that
// arrive without the trigger (WAL replay on a standby that is then promoted, PITR, pg_upgrade)
// are registered by the first backend of the database that needs them (`reconcile`), and a
// watched resource admits no write until its watch has read etcd (`check`).

thread_local! {
    /// Changes of this transaction: (subtransaction, resource, Some((prefix, verify)) to watch
    /// or None to stop), in order.
    static PENDING: std::cell::RefCell<Vec<(pg_sys::SubTransactionId, String, Option<(String, bool)>)>> =
        const { std::cell::RefCell::new(Vec::new()) };
    /// This backend has registered its database's rows of `_pg_fencing.watch`.
    static RECONCILED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Without the worker (not preloaded): resources the table says are watched. A watch that
    /// cannot run cannot raise marks, so their writes are refused (FT005) rather than admitted
    /// on marks that may be behind.
    static UNSERVED: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// From the row trigger of `_pg_fencing.watch` (`_pg_fencing.watch_changed`): `resource` is to be
/// watched with `prefix`/`verify`, or (`None`) not watched, once this transaction commits.
pub fn queue_change(resource: &str, watch: Option<(String, bool)>) {
    let sub = crate::pg::process::current_subxact();
    PENDING.with(|p| p.borrow_mut().push((sub, resource.to_string(), watch)));
}

/// An aborted transaction changes no registration.
fn forget_pending() {
    PENDING.with(|p| p.borrow_mut().clear());
}

/// An aborted subtransaction: drop what it (and its children, whose ids are higher) queued.
fn forget_pending_of(sub: pg_sys::SubTransactionId) {
    PENDING.with(|p| p.borrow_mut().retain(|(s, _, _)| *s < sub));
}

/// How to take back one change `apply_pending` made, if the commit fails.
pub(super) enum Undo {
    /// The registration was new: remove it.
    Unregister,
    /// The registration changed: restore these.
    Reregister { prefix: String, verify: bool },
    /// The watch was stopped (STOPPING): resume it.
    Resume,
}

thread_local! {
    /// Changes `apply_pending` made at PRE_COMMIT, by slot index, until the commit ends.
    static APPLIED: std::cell::RefCell<Vec<(usize, Undo)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// After COMMIT: the watches this transaction stopped are gone for good (DRAINING, freed once
/// the etcd thread has stopped their tasks). Cannot fail; a state file that cannot be saved now
/// keeps a stopped watch, which comes back after a restart (a watch too many, never too few).
fn finish_commit() {
    let applied = APPLIED.with(|a| std::mem::take(&mut *a.borrow_mut()));
    let Some(sh) = shared() else { return };
    let mut stopped = false;
    for (i, undo) in applied {
        let slot = &sh.slots[i];
        if matches!(undo, Undo::Resume) && slot.transition(W::Stopping, W::Draining) {
            sh.active.fetch_sub(1, Ordering::AcqRel);
            stopped = true;
        }
    }
    if stopped {
        save_after_commit(sh);
    }
}

/// After a failed commit (ABORT following PRE_COMMIT): take back what `apply_pending` did.
fn undo_applied() {
    let applied = APPLIED.with(|a| std::mem::take(&mut *a.borrow_mut()));
    let Some(sh) = shared() else { return };
    if applied.is_empty() {
        return;
    }
    for (i, undo) in applied.into_iter().rev() {
        let slot = &sh.slots[i];
        // A new generation first: the current task (if any) can no longer change the slot.
        slot.generation.fetch_add(1, Ordering::AcqRel);
        match undo {
            Undo::Unregister => {
                if slot.transition(W::Active, W::Draining) {
                    sh.active.fetch_sub(1, Ordering::AcqRel);
                }
                continue;
            }
            Undo::Reregister { prefix, verify } => {
                slot.set_prefix(&prefix);
                slot.verify.store(verify, Ordering::Release);
            }
            Undo::Resume => {
                let _ = slot.transition(W::Stopping, W::Active);
            }
        }
        // Restarted from its hand-over revision; no write is admitted until it has read etcd.
        slot.latest.store(0, Ordering::Release);
        slot.confirmed_ms.store(0, Ordering::Release);
        slot.set_message("restarting: the transaction that changed this watch did not commit");
        slot.generation.fetch_add(1, Ordering::AcqRel);
    }
    save_after_commit(sh);
}

/// Save the state file at the end of a transaction, where no error may be raised.
fn save_after_commit(sh: &WatchShared) {
    let dir = crate::lock_service::etcd_locks::data_dir();
    let saved = StateLock::take_interruptible(&dir).and_then(|_lock| {
        let tag = format!("backend{}", crate::pg::process::my_pid());
        save_state(sh, &dir, &tag)
    });
    if let Err(e) = saved {
        pgrx::warning!("pg_fencing: could not save {STATE_FILE}: {e}");
    }
}

/// Before PREPARE TRANSACTION: a registration change cannot wait for COMMIT PREPARED (another
/// session would have to apply it), so such a transaction cannot be prepared.
pub fn refuse_prepare() -> Result<(), FenceError> {
    if PENDING.with(|p| p.borrow().is_empty()) {
        return Ok(());
    }
    forget_pending();
    Err(FenceError::NotSupported(crate::error::Text {
        message: "cannot PREPARE a transaction that has watched or unwatched a resource".into(),
        detail: None,
        hint: Some("Call fencing_watch and fencing_unwatch in a transaction of their own.".into()),
    }))
}

/// At PRE_COMMIT: apply this transaction's registration changes to shared memory and the state
/// file. Returns the stopped watches' hand-over revisions, for the caller to store as the
/// resources' marks in this transaction (`backend.rs`, with `rule::raise_mark`; the resources'
/// exclusive locks are already held). An error here (no free slot) aborts the transaction.
///
/// The commit can still fail after this (a serialization failure found at commit, for one):
/// so a stopped watch stays enforced (STOPPING) until the commit is done (`finish_commit`), and
/// if it fails every change made here is undone (`undo_applied`): a new registration removed, a
/// changed one restored, a stopped one resumed. Until then writes to a resumed or restored
/// resource wait for its watch to read etcd again.
pub fn apply_pending() -> Result<Vec<(String, Token)>, FenceError> {
    let pending = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    if pending.is_empty() {
        return Ok(Vec::new());
    }
    let Some(sh) = shared() else {
        return Ok(Vec::new());
    };
    // The last change of each resource wins.
    let mut last: Vec<(String, Option<(String, bool)>)> = Vec::new();
    for (_, r, w) in pending {
        last.retain(|(x, _)| *x != r);
        last.push((r, w));
    }
    // Resource locks before the state lock (see `StateLock`).
    let mut stopping: Vec<&str> = last
        .iter()
        .filter(|(_, w)| w.is_none())
        .map(|(r, _)| r.as_str())
        .collect();
    stopping.sort_unstable();
    for r in &stopping {
        lock_resource(r, LockMode::Exclusive);
    }
    let mut marks = Vec::new();
    with_state(sh, || {
        // Everything that can fail first, before any slot changes: an error after a change
        // would abort the transaction with shared memory already changed.
        let needed = last
            .iter()
            .filter(|(r, w)| w.is_some() && find(sh, r).is_none())
            .count();
        let free = sh.slots.iter().filter(|s| s.state() == W::Free).count();
        if needed > free {
            return Err(slots_full());
        }
        let index = |slot: &WatchSlot| sh.slots.iter().position(|x| std::ptr::eq(x, slot));
        for (r, w) in &last {
            match w {
                Some((prefix, verify)) => {
                    let undo = match find(sh, r) {
                        None => Some(Undo::Unregister),
                        Some(s)
                            if s.prefix.equals(prefix)
                                && s.verify.load(Ordering::Acquire) == *verify =>
                        {
                            None
                        }
                        Some(s) => Some(Undo::Reregister {
                            prefix: s.prefix(),
                            verify: s.verify.load(Ordering::Acquire),
                        }),
                    };
                    register(sh, r, prefix, *verify)?;
                    if let (Some(undo), Some(i)) = (undo, find(sh, r).and_then(index)) {
                        APPLIED.with(|a| a.borrow_mut().push((i, undo)));
                    }
                }
                None => {
                    if let Some(slot) = find(sh, r) {
                        if slot.transition(W::Active, W::Stopping) {
                            // A new generation first: the watch task can no longer raise the
                            // hand-over revision, so the value read next is final.
                            slot.generation.fetch_add(1, Ordering::AcqRel);
                            marks.push((r.clone(), slot.handover.load(Ordering::Acquire)));
                            if let Some(i) = index(slot) {
                                APPLIED.with(|a| a.borrow_mut().push((i, Undo::Resume)));
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    })?;
    // The watch is gone (no raise after this point); what it reached stays as the mark. Made
    // durable with the commit by fencing_unwatch (`pg::process::make_commit_durable`).
    Ok(marks.into_iter().filter(|(_, h)| *h > 0).collect())
}

/// Register this database's rows of `_pg_fencing.watch` that shared memory lacks, once per
/// backend (after recovery: a standby's backend would miss rows replayed after its first look).
/// This database has `_pg_fencing.watch` (its extension's SQL objects are 0.2.0 or later).
pub(super) fn watch_table_exists() -> bool {
    crate::pg::spi::exec_internal(
        "SELECT true FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace \
         WHERE n.nspname OPERATOR(pg_catalog.=) '_pg_fencing' AND c.relname OPERATOR(pg_catalog.=) 'watch'",
        false,
        &[],
        &mut [],
        true,
        |_| true,
    )
    .unwrap_or(false)
}

/// `fencing_watch`/`fencing_unwatch` write `_pg_fencing.watch`: in a database whose extension
/// is still at 0.1.0's SQL (the new library installed, `ALTER EXTENSION ... UPDATE` not yet run)
/// they refuse with 55000 and say what to do; the watches 0.1.0 registered keep running (from
/// the state file) and the update carries them into the table.
pub(super) fn require_watch_table(function: &str) -> Result<(), FenceError> {
    if watch_table_exists() {
        return Ok(());
    }
    Err(FenceError::ExtensionNotUpdated(crate::error::Text {
        message: format!("{function} needs pg_fencing's SQL objects of version 0.2.0 or later in this database"),
        detail: Some("Watch registrations are rows of _pg_fencing.watch, which this database's extension does not have yet.".into()),
        hint: Some("Run ALTER EXTENSION pg_fencing UPDATE; the watches registered before it keep running and are carried into the table.".into()),
    }))
}

pub(super) fn reconcile() -> Result<(), FenceError> {
    if RECONCILED.with(|r| r.get()) || crate::pg::process::in_recovery() {
        return Ok(());
    }
    // Not in this database (or an extension version from before the table): nothing to do.
    let mut rows: Vec<(String, String, bool)> = Vec::new();
    if watch_table_exists() {
        rows = Spi::connect(|c| {
            c.select(
                "SELECT resource, lock_key_prefix, verify FROM _pg_fencing.watch ORDER BY resource",
                None,
                &[],
            )?
            .map(|row| {
                Ok((
                    row.get::<String>(1)?.unwrap_or_default(),
                    row.get::<String>(2)?.unwrap_or_default(),
                    row.get::<bool>(3)?.unwrap_or(false),
                ))
            })
            .collect::<Result<Vec<_>, pgrx::spi::Error>>()
        })
        .map_err(|e| {
            FenceError::WorkerUnavailable(format!("pg_fencing: reading _pg_fencing.watch: {e}"))
        })?;
    }
    match shared() {
        None => UNSERVED.with(|u| *u.borrow_mut() = rows.into_iter().map(|(r, _, _)| r).collect()),
        Some(sh) => {
            // The state file first, if the worker has not loaded it yet: its watches are
            // enforced from the first write (and `fencing_watches`, which ALTER EXTENSION ...
            // UPDATE from 0.1.0 copies into the table, lists them).
            if sh.loaded.load(Ordering::Acquire) == 0 {
                with_state(sh, || Ok(()))?;
            }
            // Watches of databases that no longer exist (DROP DATABASE): nobody can unwatch
            // them, and they would hold their slots forever.
            let gone: Vec<usize> = sh
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| {
                    s.state().enforced()
                        && !crate::pg::catalog::database_exists(s.dboid.load(Ordering::Acquire))
                })
                .map(|(i, _)| i)
                .collect();
            if !gone.is_empty() {
                with_state(sh, || {
                    for &i in &gone {
                        let s = &sh.slots[i];
                        s.generation.fetch_add(1, Ordering::AcqRel);
                        let drained = [W::Active, W::Stopping]
                            .iter()
                            .any(|&from| s.transition(from, W::Draining));
                        if drained {
                            sh.active.fetch_sub(1, Ordering::AcqRel);
                        }
                    }
                    Ok(())
                })?;
            }
            // Only what is missing: a registration that differs may be another transaction's
            // change applied at its pre-commit and not yet visible here. (A row whose deletion
            // is just committing may come back this way: a watch too many, never one too few;
            // fencing_unwatch removes it.)
            let missing: Vec<_> = rows
                .into_iter()
                .filter(|(r, _, _)| find(sh, r).is_none())
                .collect();
            if !missing.is_empty() {
                with_state(sh, || {
                    for (r, p, v) in &missing {
                        register(sh, r, p, *v)?;
                    }
                    Ok(())
                })?;
            }
        }
    }
    RECONCILED.with(|r| r.set(true));
    Ok(())
}

/// `fencing_reset(resource, token)` of a watched resource: its hand-over revision becomes `token`
/// too (a reset that the watch would undo at once would not be a reset); the next hand-over
/// raises it again.
pub fn reset(resource: &str, token: Token) -> Result<(), FenceError> {
    let Some(sh) = shared() else { return Ok(()) };
    with_state(sh, || {
        if let Some(slot) = find(sh, resource) {
            slot.handover.store(token, Ordering::Release);
            slot.handover_key.store(0, Ordering::Release);
        }
        Ok(())
    })
}

/// Rows of `fencing_watches`: resource, etcd key prefix, verify, hand-over revision, latest
/// revision, age of the view in milliseconds, status.
pub fn rows() -> Vec<(
    String,
    String,
    bool,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    String,
)> {
    if let Err(e) = reconcile() {
        pgrx::warning!("{e}");
    }
    let Some(sh) = shared() else {
        return Vec::new();
    };
    let now = crate::lock_service::etcd_locks::now_ms();
    let db = crate::pg::process::my_database();
    sh.slots
        .iter()
        .filter(|s| s.state().enforced() && s.dboid.load(Ordering::Acquire) == db)
        .map(|s| {
            let h = s.handover.load(Ordering::Acquire);
            let l = s.latest.load(Ordering::Acquire);
            let c = s.confirmed_ms.load(Ordering::Acquire);
            (
                s.resource(),
                s.prefix(),
                s.verify.load(Ordering::Acquire),
                (h > 0).then_some(h),
                (l > 0).then_some(l),
                (c > 0).then_some(now - c),
                s.message(),
            )
        })
        .collect()
}

/// The hand-over revision of a watched resource (0 if none or not watched).
pub fn handover(resource: &str) -> Token {
    if let Err(e) = reconcile() {
        pgrx::warning!("{e}");
    }
    shared()
        .filter(|sh| sh.active.load(Ordering::Acquire) > 0)
        .and_then(|sh| find(sh, resource))
        .map(|s| s.handover.load(Ordering::Acquire))
        .unwrap_or(0)
}

/// The fencing check's part for a watched resource: its hand-over revision (to be treated as a
/// mark), after the `verify` check (`FT006`) if the watch has it. 0 if not watched.
pub fn check(resource: &str, token: Token) -> Result<Token, FenceError> {
    reconcile()?;
    let Some(sh) = shared() else {
        if UNSERVED.with(|u| u.borrow().iter().any(|r| r == resource)) {
            return Err(FenceError::LockServiceUnavailable(format!(
                "resource \"{resource}\" is watched (fencing_watch), but its watch cannot run: pg_fencing is not in shared_preload_libraries"
            )));
        }
        return Ok(0);
    };
    if sh.active.load(Ordering::Acquire) == 0 {
        return Ok(0);
    }
    let Some(slot) = find(sh, resource) else {
        return Ok(0);
    };
    wait_until_synced(slot, resource)?;
    let handover = slot.handover.load(Ordering::Acquire);
    if !slot.verify.load(Ordering::Acquire) || token < handover {
        // Below the hand-over revision: a stale holder, refused by the mark (FT001).
        return Ok(handover);
    }
    let max_lag = crate::gucs::verify_max_lag_ms() as i64;
    let started = crate::lock_service::etcd_locks::now_ms();
    loop {
        let now = crate::lock_service::etcd_locks::now_ms();
        let confirmed = slot.confirmed_ms.load(Ordering::Acquire);
        let latest = slot.latest.load(Ordering::Acquire);
        let fresh = confirmed > 0 && now - confirmed <= max_lag;
        if fresh && token <= latest {
            return Ok(handover);
        }
        // A new holder may write a moment before the watch reports its grant: wait for the
        // watch to catch up, at most pg_fencing.verify_max_lag.
        if now - started >= max_lag {
            let why = if !fresh {
                if confirmed == 0 {
                    "the watch has not confirmed etcd's state yet".to_string()
                } else {
                    format!(
                        "the worker's view of etcd is {} ms old (pg_fencing.verify_max_lag = {} ms)",
                        now - confirmed,
                        max_lag
                    )
                }
            } else {
                format!("it is above revision {latest}, the latest etcd has reached, so etcd did not issue it")
            };
            return Err(FenceError::NotVerified {
                resource: resource.to_string(),
                token,
                why,
            });
        }
        // On the latch: honours query cancel, statement_timeout and termination, and exits at
        // once if the postmaster dies.
        crate::lock_service::etcd_locks::nap(1);
    }
}

/// A watch that (re)started (server start, new registration, a database copied onto this
/// server) has not yet replayed the lock's history from etcd, so its hand-over revision may be
/// behind: no write is admitted until it has (the lifecycle rule, docs/design.md "Lifecycle guarantees": a fact not in WAL is
/// derived again from the lock service before any write is admitted). Waits on the latch for at
/// most `pg_fencing.watch_sync_timeout`, then refuses with FT005.
pub(super) fn wait_until_synced(slot: &WatchSlot, resource: &str) -> Result<(), FenceError> {
    if slot.confirmed_ms.load(Ordering::Acquire) > 0 {
        return Ok(());
    }
    let limit = crate::gucs::watch_sync_timeout_ms() as i64;
    let started = crate::lock_service::etcd_locks::now_ms();
    while slot.confirmed_ms.load(Ordering::Acquire) == 0 {
        if crate::lock_service::etcd_locks::now_ms() - started >= limit {
            return Err(FenceError::LockServiceUnavailable(format!(
                "the watch of resource \"{resource}\" has not read etcd's state since it started ({}), so its hand-over revision may be behind (waited pg_fencing.watch_sync_timeout = {limit} ms)",
                slot.message()
            )));
        }
        crate::lock_service::etcd_locks::nap(1);
    }
    Ok(())
}

/// Per-backend state's life (`backend.rs`): at commit the watches the transaction stopped are
/// gone; an abort (also of a commit that failed after its pre-commit step) takes back the
/// registration changes it applied and forgets the pending ones; a rolled-back savepoint forgets
/// its own.
pub fn on_event(ev: BackendEvent) {
    match ev {
        BackendEvent::Commit => finish_commit(),
        BackendEvent::Abort => {
            undo_applied();
            forget_pending();
        }
        BackendEvent::SubAbort(sub) => forget_pending_of(sub),
        _ => {}
    }
}
