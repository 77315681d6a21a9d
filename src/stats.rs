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

use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgAtomic};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU32, AtomicU64, Ordering};

const SLOTS: usize = 1024;
const NAME_LEN: usize = 64;

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
    last_rejection_at: AtomicI64,
    last_rejected_token: AtomicI64,
    last_rejection_high_water: AtomicI64,
    last_rejection_pid: AtomicI32,
}

#[repr(C)]
pub struct Table {
    slots: [Slot; SLOTS],
    dropped: AtomicU64,
}

unsafe impl PGRXSharedMemory for Table {}
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
                last_rejection_at: AtomicI64::new(0),
                last_rejected_token: AtomicI64::new(0),
                last_rejection_high_water: AtomicI64::new(0),
                last_rejection_pid: AtomicI32::new(0),
            }),
            dropped: AtomicU64::new(0),
        }
    }
}

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
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        pg_shmem_init!(STATS);
        ENABLED.store(true, Ordering::Relaxed);
    }
}

fn hash(kind: Kind, name: &str) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325 ^ (kind as u64);
    for b in unsafe { pg_sys::MyDatabaseId }.to_u32().to_le_bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    for b in name.as_bytes() {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    if h == 0 {
        1
    } else {
        h
    }
}

fn slot(kind: Kind, name: &str) -> Option<&'static Slot> {
    if !ENABLED.load(Ordering::Relaxed) {
        return None;
    }
    let table = STATS.get();
    let key = hash(kind, name);
    let start = (key % SLOTS as u64) as usize;
    for i in 0..SLOTS {
        let s = &table.slots[(start + i) % SLOTS];
        let current = s.key.load(Ordering::Acquire);
        if current == key {
            return Some(s);
        }
        if current == 0
            && s.key
                .compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            s.database
                .store(unsafe { pg_sys::MyDatabaseId }.to_u32(), Ordering::Relaxed);
            unsafe {
                *s.kind.get() = kind as u8;
                let buf = &mut *s.name.get();
                let mut n = name.len().min(NAME_LEN - 1);
                while !name.is_char_boundary(n) {
                    n -= 1;
                }
                buf[..n].copy_from_slice(&name.as_bytes()[..n]);
            }
            s.ready.store(1, Ordering::Release);
            return Some(s);
        }
        if s.key.load(Ordering::Acquire) == key {
            return Some(s);
        }
    }
    table.dropped.fetch_add(1, Ordering::Relaxed);
    None
}

/// Count an admitted write (or advance).
pub fn accepted(kind: Kind, name: &str) {
    if let Some(s) = slot(kind, name) {
        s.accepted.fetch_add(1, Ordering::Relaxed);
    }
}

/// Count a write refused as stale (FT001), and remember it as the last rejection.
pub fn rejected(kind: Kind, name: &str, token: i64, high_water: i64) {
    if let Some(s) = slot(kind, name) {
        s.rejected.fetch_add(1, Ordering::Relaxed);
        s.last_rejection_at
            .store(unsafe { pg_sys::GetCurrentTimestamp() }, Ordering::Relaxed);
        s.last_rejected_token.store(token, Ordering::Relaxed);
        s.last_rejection_high_water
            .store(high_water, Ordering::Relaxed);
        s.last_rejection_pid
            .store(unsafe { pg_sys::MyProcPid }, Ordering::Relaxed);
    }
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
        for s in table.slots.iter() {
            if s.ready.load(Ordering::Acquire) == 0
                || s.database.load(Ordering::Relaxed) != unsafe { pg_sys::MyDatabaseId }.to_u32()
            {
                continue;
            }
            let (kind, name) = unsafe {
                let buf = &*s.name.get();
                let len = buf.iter().position(|b| *b == 0).unwrap_or(NAME_LEN);
                (
                    *s.kind.get(),
                    String::from_utf8_lossy(&buf[..len]).into_owned(),
                )
            };
            let kind = if kind == Kind::Resource as u8 {
                "resource"
            } else {
                "table"
            };
            let rejected = s.rejected.load(Ordering::Relaxed) as i64;
            let at = s.last_rejection_at.load(Ordering::Relaxed);
            let last = rejected > 0;
            rows.push((
                kind.to_string(),
                name,
                s.accepted.load(Ordering::Relaxed) as i64,
                rejected,
                if last {
                    pgrx::datum::TimestampWithTimeZone::try_from(at).ok()
                } else {
                    None
                },
                last.then(|| s.last_rejected_token.load(Ordering::Relaxed)),
                last.then(|| s.last_rejection_high_water.load(Ordering::Relaxed)),
                last.then(|| s.last_rejection_pid.load(Ordering::Relaxed)),
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
