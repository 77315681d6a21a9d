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
/// Room for an `application_name` (NAMEDATALEN) and for a client address with its port.
const ORIGIN_LEN: usize = 64;

/// Where a refused write came from: the session's `application_name`, its client address
/// (`host:port`, `[local]` for a Unix socket, empty for a background process) and backend pid.
pub struct Origin {
    pub application_name: String,
    pub client: String,
    pub pid: i32,
}

thread_local! {
    /// The client address never changes during a backend's life; computed on first need.
    static CLIENT: std::cell::OnceCell<String> = const { std::cell::OnceCell::new() };
}

/// The origin of the current session (see `Origin`). Must run inside a pgrx guard: it calls
/// PostgreSQL's `inet_client_addr()`/`inet_client_port()` the first time.
pub fn origin() -> Origin {
    let client = CLIENT.with(|c| c.get_or_init(client_address).clone());
    let application_name = unsafe {
        let p = pg_sys::application_name;
        if p.is_null() {
            String::new()
        } else {
            std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    Origin {
        application_name,
        client,
        pid: unsafe { pg_sys::MyProcPid },
    }
}

fn client_address() -> String {
    unsafe {
        if pg_sys::MyProcPort.is_null() {
            return String::new();
        }
        // Both are NULL for a Unix-socket connection.
        let Some(addr) = pgrx::direct_function_call_as_datum(pg_sys::inet_client_addr, &[]) else {
            return "[local]".into();
        };
        let text = pgrx::direct_function_call_as_datum(pg_sys::inet_out, &[Some(addr)])
            .map(|d| {
                std::ffi::CStr::from_ptr(d.cast_mut_ptr::<std::ffi::c_char>())
                    .to_string_lossy()
                    .into_owned()
            })
            .unwrap_or_default();
        let port = pgrx::direct_function_call::<i32>(pg_sys::inet_client_port, &[]);
        let host = if text.contains(':') {
            format!("[{text}]")
        } else {
            text
        };
        match port {
            Some(p) => format!("{host}:{p}"),
            None => host,
        }
    }
}

/// Copy `text` into a fixed buffer, cut at a character boundary, NUL-terminated.
fn copy_text(buf: &mut [u8], text: &str) {
    let mut n = text.len().min(buf.len() - 1);
    while !text.is_char_boundary(n) {
        n -= 1;
    }
    buf[..n].copy_from_slice(&text.as_bytes()[..n]);
    buf[n..].fill(0);
}

fn read_text(buf: &[u8]) -> String {
    let len = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

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
    /// Spin lock (0 free, 1 taken) over the two text fields below, held only to copy them.
    origin_lock: AtomicU32,
    last_rejection_application_name: UnsafeCell<[u8; ORIGIN_LEN]>,
    last_rejection_client: UnsafeCell<[u8; ORIGIN_LEN]>,
}

impl Slot {
    fn with_origin<R>(
        &self,
        f: impl FnOnce(&mut [u8; ORIGIN_LEN], &mut [u8; ORIGIN_LEN]) -> R,
    ) -> R {
        while self
            .origin_lock
            .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        // SAFETY: the spin lock gives this process the only access to both buffers.
        let r = unsafe {
            f(
                &mut *self.last_rejection_application_name.get(),
                &mut *self.last_rejection_client.get(),
            )
        };
        self.origin_lock.store(0, Ordering::Release);
        r
    }
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
                origin_lock: AtomicU32::new(0),
                last_rejection_application_name: UnsafeCell::new([0; ORIGIN_LEN]),
                last_rejection_client: UnsafeCell::new([0; ORIGIN_LEN]),
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
                copy_text(&mut *s.name.get(), name);
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

/// Count a write refused as stale (FT001), and remember it as the last rejection, with where it
/// came from (`origin()`).
pub fn rejected(kind: Kind, name: &str, token: i64, high_water: i64) {
    if let Some(s) = slot(kind, name) {
        let origin = origin();
        s.with_origin(|app, client| {
            copy_text(app, &origin.application_name);
            copy_text(client, &origin.client);
        });
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

/// Kind and name of a slot that is `ready`.
fn slot_name(s: &Slot) -> (&'static str, String) {
    // SAFETY: written once before `ready` was set (release); the caller saw `ready` (acquire).
    let (kind, name) = unsafe { (*s.kind.get(), read_text(&*s.name.get())) };
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
    let db = unsafe { pg_sys::MyDatabaseId }.to_u32();
    let slots: &'static [Slot] = if enabled { &STATS.get().slots } else { &[] };
    slots.iter().filter(move |s| {
        s.ready.load(Ordering::Acquire) != 0 && s.database.load(Ordering::Relaxed) == db
    })
}

/// `fencing_rejection_origins()`: for each fencing domain of the current database with a
/// rejection since server start, where the last rejected write came from: `kind` and `name` as
/// in `fencing_stats()`, the session's `application_name`, and its client address (`host:port`,
/// `[local]` for a Unix socket). Like `pg_stat_activity`, these two are shown only to superusers
/// and members of `pg_read_all_stats`; other roles see NULL. The views join it with
/// `fencing_stats()`. Empty unless pg_fencing is in `shared_preload_libraries`. (A separate function rather than more columns of
/// `fencing_stats()`, so that the SQL of version 0.1.0 keeps working with this library until
/// `ALTER EXTENSION pg_fencing UPDATE`.)
#[pg_extern(volatile, parallel_safe)]
fn fencing_rejection_origins() -> TableIterator<
    'static,
    (
        name!(kind, String),
        name!(name, String),
        name!(last_rejection_application_name, Option<String>),
        name!(last_rejection_client_addr, Option<String>),
    ),
> {
    let may_see = unsafe {
        pg_sys::has_privs_of_role(
            pg_sys::GetUserId(),
            pg_sys::Oid::from(pg_sys::ROLE_PG_READ_ALL_STATS),
        )
    };
    let rows: Vec<_> = own_slots()
        .filter(|s| s.rejected.load(Ordering::Relaxed) > 0)
        .map(|s| {
            let (kind, name) = slot_name(s);
            if !may_see {
                return (kind.to_string(), name, None, None);
            }
            let (app, client) = s.with_origin(|app, client| (read_text(app), read_text(client)));
            (kind.to_string(), name, Some(app), Some(client))
        })
        .collect();
    TableIterator::new(rows)
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
