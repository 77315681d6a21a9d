//! Accepted/rejected counters and the last rejection, per fencing domain, in shared memory.
//!
//! Counters must survive the abort of the transaction whose write was refused, so they cannot
//! live in tables; PostgreSQL 15 has no dynamic shared memory registry either, so they need
//! `shared_preload_libraries = 'pg_fencing'`. Without it the counters are simply absent (the
//! views show NULL); fencing itself does not depend on them. Like `pg_stat_*` counters they
//! start from zero when the server starts.
//!
//! A domain is a resource (kind `resource`, named by the resource) or a per-row protected table
//! (kind `table`, named by its protection id). The table has a fixed number of slots; domains
//! beyond that are not counted (`fencing_stats()` reports how many were dropped).

use crate::error::FenceError;
use crate::pg::session::origin;
use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgAtomic};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

const SLOTS: usize = 1024;
const NAME_LEN: usize = 64;
/// Room for an `application_name` (NAMEDATALEN) and for a client address with its port.
const ORIGIN_LEN: usize = 64;

#[repr(C)]
pub struct Slot {
    /// FNV-1a hash of database, kind and name; 0 = free.
    key: AtomicU64,
    /// Database the domain belongs to (marks are per database).
    database: AtomicU32,
    /// Set (release) once `kind` and `name` are written.
    ready: AtomicU32,
    kind: UnsafeCell<u8>,
    name: UnsafeCell<[u8; NAME_LEN]>,
    accepted: AtomicU64,
    rejected: AtomicU64,
    /// Spin lock (0 free, 1 taken) over `last`, held only to copy it in or out, so a reader
    /// never sees fields of two different rejections.
    last_lock: AtomicU32,
    last: UnsafeCell<LastRejection>,
}

/// The last rejection of a fencing domain and where it came from.
#[derive(Clone, Copy)]
#[repr(C)]
struct LastRejection {
    /// `GetCurrentTimestamp()` of the rejection.
    at: i64,
    token: i64,
    high_water: i64,
    pid: i32,
    /// The rejected session's user (`GetSessionUserId()`, as `pg_stat_activity.usesysid`; not
    /// changed by `SET ROLE` or SECURITY DEFINER functions), for who may see `client`.
    role: u32,
    application_name: [u8; ORIGIN_LEN],
    client: [u8; ORIGIN_LEN],
}

impl LastRejection {
    const EMPTY: LastRejection = LastRejection {
        at: 0,
        token: 0,
        high_water: 0,
        pid: 0,
        role: 0,
        application_name: [0; ORIGIN_LEN],
        client: [0; ORIGIN_LEN],
    };
}

impl Slot {
    fn with_last<R>(&self, f: impl FnOnce(&mut LastRejection) -> R) -> R {
        while self
            .last_lock
            .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        // SAFETY: the spin lock gives this process the only access to `last`; `f` only copies.
        let r = f(unsafe { &mut *self.last.get() });
        self.last_lock.store(0, Ordering::Release);
        r
    }
}

#[repr(C)]
pub struct Table {
    slots: [Slot; SLOTS],
    dropped: AtomicU64,
}

// SAFETY: `Table` is `repr(C)`, of fixed size, and holds only atomics and plain bytes inline (no
// pointers, nothing process-local), so the same bytes mean the same thing in every process that
// maps the segment; PgAtomic initialises it once, from `Default`, under AddinShmemInitLock.
unsafe impl PGRXSharedMemory for Table {}
// SAFETY: the non-atomic fields are `UnsafeCell`s accessed only by this module's protocol:
// `kind`/`name` are written once, by the process whose compare-exchange claimed the slot, before
// `ready` is stored with Release, and read only after `ready` is seen with Acquire (`same_name`,
// `slot_name` via `own_slots`); `last` is accessed only under the `last_lock` spin lock
// (`with_last`). So no data race is possible, between threads or processes.
unsafe impl Sync for Table {}

impl Default for Table {
    fn default() -> Self {
        Table {
            slots: std::array::from_fn(|_| Slot {
                key: AtomicU64::new(0),
                database: AtomicU32::new(0),
                ready: AtomicU32::new(0),
                kind: UnsafeCell::new(0),
                name: UnsafeCell::new([0; NAME_LEN]),
                accepted: AtomicU64::new(0),
                rejected: AtomicU64::new(0),
                last_lock: AtomicU32::new(0),
                last: UnsafeCell::new(LastRejection::EMPTY),
            }),
            dropped: AtomicU64::new(0),
        }
    }
}

// SAFETY: PgAtomic::new requires a shared memory name no one else uses: "pg_fencing stats" is
// ours (ShmemInitStruct names are global; lock_service uses "pg_fencing worker" and
// "pg_fencing watches").
static STATS: PgAtomic<Table> = unsafe { PgAtomic::new(c"pg_fencing stats") };
/// Set in the postmaster when preloaded; inherited by every backend it forks.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Kind of a fencing domain.
#[derive(Clone, Copy)]
pub enum Kind {
    Resource = 1,
    Table = 2,
}

/// Reserve the shared memory. Only possible while `shared_preload_libraries` is processed.
pub fn init_if_preloading() {
    // SAFETY: a plain read of a bool that the postmaster sets around loading
    // shared_preload_libraries; main thread (called from _PG_init).
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        // The macro's own unsafe code installs the shmem request/startup hooks; its requirement,
        // being called while shared_preload_libraries is processed, is what the test above checks.
        pg_shmem_init!(STATS);
        ENABLED.store(true, Ordering::Relaxed);
    }
}

fn hash(kind: Kind, name: &str) -> u64 {
    let db = crate::pg::process::my_database();
    match pg_fencing_core::hash::fnv1a(&[&[kind as u8], &db.to_le_bytes(), name.as_bytes()]) {
        0 => 1,
        h => h,
    }
}

/// The slot of a domain. `claim`: take a free slot for a domain not seen yet (counting);
/// otherwise only look (slots are never freed, so the probe stops at the first free one).
fn probe(kind: Kind, name: &str, claim: bool) -> Option<&'static Slot> {
    if !ENABLED.load(Ordering::Relaxed) {
        return None;
    }
    let table = STATS.get();
    let key = hash(kind, name);
    let start = (key % SLOTS as u64) as usize;
    for i in 0..SLOTS {
        let s = &table.slots[(start + i) % SLOTS];
        let current = s.key.load(Ordering::Acquire);
        if current == 0 {
            if !claim {
                return None;
            }
            if s.key
                .compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                // SAFETY: MyDatabaseId is set once when the backend connects, then only read.
                let db = unsafe { pg_sys::MyDatabaseId }.to_u32();
                s.database.store(db, Ordering::Relaxed);
                // SAFETY: this process just claimed the slot with the compare-exchange from 0
                // (slots are never freed), and nobody reads `kind` or `name` before `ready` is
                // set (Release) below, so this is the only access to them.
                unsafe {
                    *s.kind.get() = kind as u8;
                    crate::text::copy_in(&mut *s.name.get(), name);
                }
                s.ready.store(1, Ordering::Release);
                return Some(s);
            }
        }
        // Claimed meanwhile by another process, perhaps for this very domain.
        if s.key.load(Ordering::Acquire) == key && same_name(s, name) {
            return Some(s);
        }
    }
    if claim {
        table.dropped.fetch_add(1, Ordering::Relaxed);
    }
    None
}

fn slot(kind: Kind, name: &str) -> Option<&'static Slot> {
    probe(kind, name, true)
}

fn find_slot(kind: Kind, name: &str) -> Option<&'static Slot> {
    probe(kind, name, false)
}

/// Does the slot hold `name` (as far as it is kept: its first 63 bytes)? A slot is found by a
/// 64-bit hash of the full name; this also makes two names whose hashes collide (which would take
/// a crafted name) use different slots unless they share those bytes too. A slot still being
/// claimed (`ready` not yet set) counts as a match.
fn same_name(s: &Slot, name: &str) -> bool {
    if s.ready.load(Ordering::Acquire) == 0 {
        return true;
    }
    // SAFETY: written once before `ready` was set (release), seen above (acquire).
    let kept = unsafe { &*s.name.get() };
    let mut n = name.len().min(NAME_LEN - 1);
    while !name.is_char_boundary(n) {
        n -= 1;
    }
    kept[..n] == name.as_bytes()[..n] && kept[n] == 0
}

/// Count an admitted write (or advance).
pub fn accepted(kind: Kind, name: &str) {
    if let Some(s) = slot(kind, name) {
        s.accepted.fetch_add(1, Ordering::Relaxed);
    }
}

/// Run `f` with the counted name of protection `protection`'s table (its id in decimal),
/// printed on the stack: counting an admitted row need not allocate.
pub fn with_table_name<T>(protection: i64, f: impl FnOnce(&str) -> T) -> T {
    let mut buf = [0u8; 20];
    let mut at = buf.len();
    let negative = protection < 0;
    let mut v = protection.unsigned_abs();
    loop {
        at -= 1;
        buf[at] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    if negative {
        at -= 1;
        buf[at] = b'-';
    }
    // Only ASCII digits and '-' were written.
    f(std::str::from_utf8(&buf[at..]).unwrap_or_default())
}

/// Count `n` more admitted writes (the other rows of a statement admitted once).
pub fn accepted_more(kind: Kind, name: &str, n: u64) {
    if n == 0 {
        return;
    }
    if let Some(s) = slot(kind, name) {
        s.accepted.fetch_add(n, Ordering::Relaxed);
    }
}

/// Count a write refused as stale (FT001), and remember it as the last rejection, with where it
/// came from (`origin()`).
pub fn rejected(kind: Kind, name: &str, token: i64, high_water: i64) {
    if let Some(s) = slot(kind, name) {
        let origin = origin();
        // SAFETY: GetCurrentTimestamp reads the clock; no arguments, main thread.
        let at = unsafe { pg_sys::GetCurrentTimestamp() };
        // SAFETY: GetSessionUserId reads the session user id, set at connection start (main
        // thread, inside the rejected write's transaction).
        let role = unsafe { pg_sys::GetSessionUserId() }.to_u32();
        let mut last = LastRejection {
            at,
            token,
            high_water,
            pid: origin.pid,
            role,
            ..LastRejection::EMPTY
        };
        crate::text::copy_in(&mut last.application_name, &origin.application_name);
        crate::text::copy_in(&mut last.client, &origin.client);
        s.with_last(|l| *l = last);
        s.rejected.fetch_add(1, Ordering::Relaxed);
    }
}

/// Kind and name of a slot that is `ready`.
fn slot_name(s: &Slot) -> (&'static str, String) {
    // SAFETY: written once before `ready` was set (release); the caller saw `ready` (acquire).
    let (kind, name) = unsafe { (*s.kind.get(), crate::text::read_out(&*s.name.get())) };
    let kind = if kind == Kind::Resource as u8 {
        "resource"
    } else {
        "table"
    };
    (kind, name)
}

/// The counted slots of the current database.
fn own_slots() -> impl Iterator<Item = &'static Slot> {
    let enabled = ENABLED.load(Ordering::Relaxed);
    // SAFETY: MyDatabaseId is set once when the backend connects and only read afterwards.
    let db = unsafe { pg_sys::MyDatabaseId }.to_u32();
    let slots: &'static [Slot] = if enabled { &STATS.get().slots } else { &[] };
    slots.iter().filter(move |s| {
        s.ready.load(Ordering::Acquire) != 0 && s.database.load(Ordering::Relaxed) == db
    })
}

/// `fencing_domain_stats(kind text, name text)`: the counters of one fencing domain of the
/// current database since server start, looked up by its full name (the views use it; names
/// longer than 63 bytes are told apart). `kind` is `resource` (`name` = the resource) or `table`
/// (`name` = the protection id of a per-row table, `_pg_fencing.protected_table.id`). One row:
/// `accepted`, `rejected` (row writes and advances admitted / refused with FT001), and the last
/// rejection read as one consistent copy: time, token, high-water mark, backend pid,
/// `application_name`, and client address (`host:port`, `[local]` for a Unix socket, empty for a
/// background process). As in `pg_stat_activity`, the client address is shown only to
/// superusers, members of `pg_read_all_stats` and of the rejected session's user; others
/// see NULL. No row if the domain has not been counted, or without
/// `shared_preload_libraries = 'pg_fencing'`. Error: 22023 for another `kind`.
#[pg_extern(volatile, parallel_safe)]
fn fencing_domain_stats(
    kind: &str,
    name: &str,
) -> TableIterator<
    'static,
    (
        name!(accepted, i64),
        name!(rejected, i64),
        name!(
            last_rejection_at,
            Option<pgrx::datum::TimestampWithTimeZone>
        ),
        name!(last_rejected_token, Option<i64>),
        name!(last_rejection_high_water, Option<i64>),
        name!(last_rejection_pid, Option<i32>),
        name!(last_rejection_application_name, Option<String>),
        name!(last_rejection_client_addr, Option<String>),
    ),
> {
    let kind = match kind {
        "resource" => Kind::Resource,
        "table" => Kind::Table,
        other => {
            crate::pg::report::raise_in_guard(FenceError::UnknownDomainKind(other.to_string()))
        }
    };
    let Some(s) = find_slot(kind, name) else {
        return TableIterator::new(Vec::new());
    };
    let rejected = s.rejected.load(Ordering::Relaxed) as i64;
    let accepted = s.accepted.load(Ordering::Relaxed) as i64;
    let row = if rejected == 0 {
        (accepted, rejected, None, None, None, None, None, None)
    } else {
        let last = s.with_last(|l| *l);
        // SAFETY: reads the current user id (main thread, inside the query's transaction).
        let user = unsafe { pg_sys::GetUserId() };
        // SAFETY: role membership checks by OID value (an OID that is no role is simply not a
        // member), main thread inside the query's transaction.
        let may_see_client = unsafe {
            pg_sys::has_privs_of_role(user, pg_sys::Oid::from(pg_sys::ROLE_PG_READ_ALL_STATS))
                || pg_sys::has_privs_of_role(user, pg_sys::Oid::from(last.role))
        };
        (
            accepted,
            rejected,
            pgrx::datum::TimestampWithTimeZone::try_from(last.at).ok(),
            Some(last.token),
            Some(last.high_water),
            Some(last.pid),
            Some(crate::text::read_out(&last.application_name)),
            may_see_client.then(|| crate::text::read_out(&last.client)),
        )
    };
    TableIterator::new(vec![row])
}

/// `fencing_stats()`: one row per counted fencing domain of the current database since server
/// start: `kind`
/// (`resource` or `table`), `name` (the resource, or the protection id of a per-row table),
/// `accepted` and `rejected` (row writes and advances admitted / refused with FT001), and the
/// last rejection (time, token, high-water mark, backend pid). Empty unless pg_fencing is in
/// `shared_preload_libraries`. A last row of kind `dropped` counts counter updates that found no
/// free slot (1024 slots for all databases together).
#[pg_extern(volatile, parallel_safe)]
fn fencing_stats() -> TableIterator<
    'static,
    (
        name!(kind, String),
        name!(name, String),
        name!(accepted, i64),
        name!(rejected, i64),
        name!(
            last_rejection_at,
            Option<pgrx::datum::TimestampWithTimeZone>
        ),
        name!(last_rejected_token, Option<i64>),
        name!(last_rejection_high_water, Option<i64>),
        name!(last_rejection_pid, Option<i32>),
    ),
> {
    let mut rows = Vec::new();
    if ENABLED.load(Ordering::Relaxed) {
        let table = STATS.get();
        for s in own_slots() {
            let (kind, name) = slot_name(s);
            let rejected = s.rejected.load(Ordering::Relaxed) as i64;
            let last = (rejected > 0).then(|| s.with_last(|l| *l));
            rows.push((
                kind.to_string(),
                name,
                s.accepted.load(Ordering::Relaxed) as i64,
                rejected,
                last.and_then(|l| pgrx::datum::TimestampWithTimeZone::try_from(l.at).ok()),
                last.map(|l| l.token),
                last.map(|l| l.high_water),
                last.map(|l| l.pid),
            ));
        }
        let dropped = table.dropped.load(Ordering::Relaxed) as i64;
        if dropped > 0 {
            rows.push((
                "dropped".into(),
                String::new(),
                0,
                dropped,
                None,
                None,
                None,
                None,
            ));
        }
    }
    TableIterator::new(rows)
}
