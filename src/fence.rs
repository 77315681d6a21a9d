//! The fencing rule, and the locking that makes it hold under concurrency.
//!
//! # The rule (SPEC.md, "The rule")
//! A write carrying token `t` is accepted iff `t >= high-water` of everything it touches; equal
//! tokens are accepted. On commit the high-water becomes `max(high-water, t)`. Otherwise the
//! statement fails with `FT001`. This file is the only implementation of that rule: the trigger
//! (plain DML, COPY, TRUNCATE, and the `fenced_*` functions, which run plain DML) and
//! `fencing_advance` all come through [`admit_resource`], [`admit_row`], [`admit_row_insert`] and
//! [`record_row_delete`].
//!
//! # Why it holds under concurrency
//! Invariant: for each resource and each row, the tokens of committed writes, in commit order,
//! never decrease. Each resource has a transaction-scoped lock in PostgreSQL's lock manager (an
//! advisory-type lock tag of our own, so it never collides with `pg_advisory_lock` keys):
//! * a write whose token equals the high-water mark holds it in **share** mode until commit;
//! * a write (or `fencing_advance`) that raises the mark holds it in **exclusive** mode until commit.
//!
//! So a raise waits for every in-flight writer with the old token to commit or abort, and every
//! later writer waits for the raise to commit before it reads the mark. The mark is read with the
//! latest committed snapshot (not the transaction's), so the check is right in READ COMMITTED,
//! REPEATABLE READ and SERIALIZABLE alike.
//!
//! Rows in per-row mode are guarded by PostgreSQL's own locks, so per-row mode takes no lock of
//! its own (and a bulk write cannot exhaust the lock table): UPDATE and DELETE hold the row lock
//! and see the latest row version; an INSERT of a key whose delete is still in flight waits in
//! the primary key's unique check until that delete commits, and only then (in the `AFTER
//! INSERT` trigger) is the key's tombstone read, with the latest snapshot.

use crate::error::{Domain, FenceError, Token};
use crate::stats;
use pgrx::prelude::*;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString};

/// A `text` datum (palloc'd in the current memory context) holding `s`.
pub fn text_datum(s: &str) -> pg_sys::Datum {
    unsafe {
        pg_sys::Datum::from(pg_sys::cstring_to_text_with_len(
            s.as_ptr().cast(),
            s.len() as i32,
        ))
    }
}

/// Outcome of comparing a token with a high-water mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// `t >= high-water`; `raises` when `t > high-water` (or no mark yet).
    Accept { raises: bool },
    /// `t < high-water`.
    Reject,
}

/// THE rule. `None` high-water: never seen, so any token is accepted and raises the mark.
#[inline]
pub fn rule(token: Token, high_water: Option<Token>) -> Verdict {
    match high_water {
        None => Verdict::Accept { raises: true },
        Some(h) if token > h => Verdict::Accept { raises: true },
        Some(h) if token == h => Verdict::Accept { raises: false },
        Some(_) => Verdict::Reject,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Mode {
    Share,
    Exclusive,
}

/// What this transaction knows about a resource whose lock it holds. While we hold the lock in
/// any mode nobody else can raise the mark, so `high_water` stays exact until our transaction
/// (or the subtransaction that took it) ends. Cleared by the transaction callbacks in `lib.rs`.
#[derive(Debug, Clone, Copy)]
struct Held {
    high_water: Option<Token>,
    mode: Mode,
}

thread_local! {
    static HELD: RefCell<HashMap<String, Held>> = RefCell::new(HashMap::new());
    static PLANS: RefCell<HashMap<String, usize>> = RefCell::new(HashMap::new());
    /// The mark this backend last read for each resource, kept across transactions. Only a hint
    /// for choosing the lock mode; every decision uses the mark read under the lock.
    static LAST_SEEN: RefCell<HashMap<String, Option<Token>>> = RefCell::new(HashMap::new());
}

/// Forget all cached lock and mark state (end of transaction, subtransaction abort, reset).
pub fn forget_all() {
    HELD.with(|h| h.borrow_mut().clear());
}

/// Forget one resource (after `fencing_reset` changed its mark in this transaction).
pub fn forget(resource: &str) {
    HELD.with(|h| {
        h.borrow_mut().remove(resource);
    });
}

/// Admit a write (or an advance) carrying `token` on `resource`.
///
/// `store`: write the raised mark now. The `BEFORE INSERT` trigger passes `false` (an
/// `INSERT … ON CONFLICT DO NOTHING` may not write at all, and a write that does not happen must
/// not move a mark) and the `AFTER INSERT` trigger then stores it; everything else passes `true`.
/// Returns the high-water mark after admission.
pub fn admit_resource(resource: &str, token: Token, store: bool) -> Result<Token, FenceError> {
    let stale = |h: Token| {
        stats::rejected(stats::Kind::Resource, resource, token, h);
        FenceError::StaleToken {
            domain: Domain::Resource(resource.to_string()),
            token,
            high_water: h,
        }
    };
    // A watched resource: the lock's last hand-over revision fences like a mark (and `verify`
    // may refuse the token outright, FT006; see watch.rs).
    let handover = crate::watch::check(resource, token)?;
    if token < handover {
        return Err(stale(handover));
    }
    let held = HELD.with(|h| h.borrow().get(resource).copied());
    let mut held = match held {
        Some(h) => h,
        None => {
            // Choose the lock mode from the mark this backend saw last (or an unlocked read):
            // exclusive if the token looks like it raises the mark, share otherwise. Marks only
            // go up, except by fencing_reset, which takes the exclusive lock; either way the
            // decision below uses the mark read under the lock.
            let peek = match LAST_SEEN.with(|l| l.borrow().get(resource).copied()) {
                Some(seen) => seen,
                None => read_resource_mark(resource),
            };
            let mode = match rule(token, peek) {
                Verdict::Accept { raises: true } => Mode::Exclusive,
                _ => Mode::Share,
            };
            lock(resource_tag(resource), mode);
            let high_water = read_resource_mark(resource);
            LAST_SEEN.with(|l| {
                crate::cache_insert(
                    &mut l.borrow_mut(),
                    resource.to_string(),
                    high_water,
                    10_000,
                )
            });
            Held { high_water, mode }
        }
    };
    let result = match rule(token, held.high_water) {
        Verdict::Reject => Err(stale(held.high_water.unwrap_or_default())),
        Verdict::Accept { raises: false } => Ok(token),
        Verdict::Accept { raises: true } => {
            if held.mode < Mode::Exclusive {
                // We held share mode all along, so the mark cannot have moved meanwhile.
                lock(resource_tag(resource), Mode::Exclusive);
                held.mode = Mode::Exclusive;
            }
            if store {
                store_resource_mark(resource, token);
                held.high_water = Some(token);
                LAST_SEEN.with(|l| l.borrow_mut().insert(resource.to_string(), Some(token)));
            }
            Ok(token)
        }
    };
    HELD.with(|h| h.borrow_mut().insert(resource.to_string(), held));
    if store && result.is_ok() {
        stats::accepted(stats::Kind::Resource, resource);
    }
    result
}

/// Take the exclusive lock of `resource` and return its current mark (for `fencing_reset`).
pub fn lock_resource_exclusive(resource: &str) -> Option<Token> {
    lock(resource_tag(resource), Mode::Exclusive);
    forget(resource);
    read_resource_mark(resource)
}

/// Per-row mode, UPDATE/DELETE of an existing row: its own token column is its high-water mark.
/// The executor holds the row lock and hands us the latest row version, so no lock is needed.
/// `count`: count an accepted write in the statistics (false for early checks that are repeated).
/// `key` prints the row's key; it is only called for the error message.
pub fn admit_row(
    protection: i64,
    table: &dyn Fn() -> String,
    key: &dyn Fn() -> String,
    token: Token,
    row_token: Option<Token>,
    count: bool,
) -> Result<(), FenceError> {
    match rule(token, row_token) {
        Verdict::Reject => {
            let high_water = row_token.unwrap_or_default();
            stats::rejected(
                stats::Kind::Table,
                &protection.to_string(),
                token,
                high_water,
            );
            Err(FenceError::StaleToken {
                domain: Domain::Row {
                    table: table(),
                    key: key(),
                },
                token,
                high_water,
            })
        }
        Verdict::Accept { .. } => {
            if count {
                stats::accepted(stats::Kind::Table, &protection.to_string());
            }
            Ok(())
        }
    }
}

/// Per-row mode, INSERT of `key` (or an UPDATE that gives a row this key): checked against the
/// key's tombstone, left by a delete. Authoritative when called after the row is in the unique
/// index (the `AFTER` triggers, see the module comment); an early refusal before that.
pub fn admit_row_insert(
    protection: i64,
    table: &dyn Fn() -> String,
    key: &str,
    token: Token,
    count: bool,
) -> Result<(), FenceError> {
    let tomb = read_tombstone(protection, key);
    admit_row(protection, table, &|| key.to_string(), token, tomb, count)
}

/// Raise the stored mark of `resource` to at least `token`, under its exclusive lock (a watch's
/// hand-over revision, kept when the watch ends).
pub fn raise_mark(resource: &str, token: Token) {
    let current = lock_resource_exclusive(resource);
    if current.is_none_or(|m| m < token) {
        store_resource_mark(resource, token);
        forget(resource);
    }
}

/// May the current user write (INSERT, UPDATE or DELETE) at least one table protected with
/// `resource`? (The privilege `fencing_advance` requires; see `entry.rs`.)
pub fn may_write_resource(resource: &str) -> bool {
    let user = unsafe { pg_sys::GetUserId() };
    // Any table of the partition tree, and column-level INSERT/UPDATE grants count too.
    exec_internal(
        "SELECT true FROM _pg_fencing.protected_table p, \
              LATERAL (SELECT p.relid UNION ALL \
                       SELECT pt.relid FROM pg_catalog.pg_partition_tree(p.relid) pt) AS t(relid) \
         WHERE p.resource OPERATOR(pg_catalog.=) $1 AND p.protected \
           AND (pg_catalog.has_table_privilege($2, t.relid::pg_catalog.oid, 'INSERT, UPDATE, DELETE') \
                OR pg_catalog.has_any_column_privilege($2, t.relid::pg_catalog.oid, 'INSERT, UPDATE')) \
         LIMIT 1",
        true,
        &[pg_sys::TEXTOID, pg_sys::OIDOID],
        &mut [text_datum(resource), pg_sys::Datum::from(user)],
        true,
        |d| d.value() != 0,
    )
    .unwrap_or(false)
}

/// Who may put a table under `resource` (`fencing_protect`): a resource guards every table
/// protected with it, so joining one is as powerful as writing to it. Allowed to superusers, for
/// a new resource (no protected table, no mark), and to roles that may write a table already
/// protected with it (`may_write_resource`). `relid` itself does not count.
pub fn may_join_resource(resource: &str, relid: pg_sys::Oid) -> bool {
    if unsafe { pg_sys::superuser() } {
        return true;
    }
    let in_use = exec_internal(
        "SELECT true WHERE EXISTS (SELECT 1 FROM _pg_fencing.protected_table p \
                                   WHERE p.resource OPERATOR(pg_catalog.=) $1 AND p.protected \
                                     AND p.relid OPERATOR(pg_catalog.<>) $2) \
                     OR EXISTS (SELECT 1 FROM _pg_fencing.resource_high_water h \
                                WHERE h.resource OPERATOR(pg_catalog.=) $1)",
        true,
        &[pg_sys::TEXTOID, pg_sys::REGCLASSOID],
        &mut [text_datum(resource), pg_sys::Datum::from(relid)],
        true,
        |d| d.value() != 0,
    )
    .unwrap_or(false);
    !in_use || may_write_resource(resource)
}

/// Per-row mode, DELETE of `key` (already admitted by [`admit_row`], under the row lock): leave a
/// tombstone so that a stale writer cannot re-create the key.
///
/// Tombstones are written in batches, not one statement per row: they are kept in this backend
/// and written by [`flush_tombstones`] before any tombstone is read, before TRUNCATE writes its
/// own, when 10,000 are pending, and before the transaction commits or prepares (the xact
/// callback in `lib.rs`). Only the deleting transaction could see them earlier, and its reads
/// flush first; other transactions see them at its commit, as before: a concurrent insert of the
/// same key waits in the unique index for this transaction's end, then reads the tombstone.
pub fn record_row_delete(protection: i64, key: &str, token: Token) {
    let subxact = unsafe { pg_sys::GetCurrentSubTransactionId() };
    let full = PENDING_TOMBSTONES.with(|p| {
        let mut p = p.borrow_mut();
        p.push(PendingTombstone {
            protection,
            key: key.to_string(),
            token,
            subxact,
        });
        p.len() >= 10_000
    });
    if full {
        flush_tombstones();
    }
}

#[derive(Clone)]
struct PendingTombstone {
    protection: i64,
    key: String,
    token: Token,
    /// The subtransaction that deleted the row: its abort takes the tombstone back.
    subxact: pg_sys::SubTransactionId,
}

thread_local! {
    static PENDING_TOMBSTONES: RefCell<Vec<PendingTombstone>> = const { RefCell::new(Vec::new()) };
    /// Tombstones written by a flush in a subtransaction younger than the one that deleted the
    /// row (e.g. a read inside an EXCEPTION block), with the subtransaction that wrote them: if
    /// that one aborts, the write is undone but the delete is not, so they are pending again.
    static FLUSHED_LATER: RefCell<Vec<(PendingTombstone, pg_sys::SubTransactionId)>> =
        const { RefCell::new(Vec::new()) };
}

/// Write the pending tombstones (one statement; the highest token per key).
pub fn flush_tombstones() {
    let pending = PENDING_TOMBSTONES.with(|p| std::mem::take(&mut *p.borrow_mut()));
    if pending.is_empty() {
        return;
    }
    // DROP EXTENSION in the same transaction: its tables, and what they would keep, are gone.
    if unsafe { pg_sys::get_namespace_oid(c"_pg_fencing".as_ptr(), true) } == pg_sys::Oid::INVALID {
        return;
    }
    let writer = unsafe { pg_sys::GetCurrentSubTransactionId() };
    let mut highest: HashMap<(i64, &str), Token> = HashMap::with_capacity(pending.len());
    for t in &pending {
        let e = highest
            .entry((t.protection, t.key.as_str()))
            .or_insert(t.token);
        if *e < t.token {
            *e = t.token;
        }
    }
    let mut protections = Vec::with_capacity(highest.len());
    let mut keys = Vec::with_capacity(highest.len());
    let mut tokens = Vec::with_capacity(highest.len());
    for ((p, k), t) in highest {
        protections.push(p);
        keys.push(k.to_string());
        tokens.push(t);
    }
    let (Some(p), Some(k), Some(t)) = (
        protections.into_datum(),
        keys.into_datum(),
        tokens.into_datum(),
    ) else {
        pgrx::error!("pg_fencing: could not build the tombstone batch");
    };
    // The deletes were allowed, so their tombstones must be written even if the transaction was
    // switched to read-only since (SET transaction_read_only = on after the DELETE).
    let read_only = unsafe { pg_sys::XactReadOnly };
    if read_only && !unsafe { pg_sys::RecoveryInProgress() } {
        unsafe { pg_sys::XactReadOnly = false };
    }
    // With logical WAL, the same batch also goes to subscribers by table name (`SQL_FEED_TOMBS`).
    let feed: &[&str] = if logical_wal() {
        &[SQL_FEED_TOMBS]
    } else {
        &[]
    };
    for sql in std::iter::once(&SQL_STORE_TOMBS).chain(feed) {
        exec_internal(
            sql,
            true,
            &[
                pg_sys::INT8ARRAYOID,
                pg_sys::TEXTARRAYOID,
                pg_sys::INT8ARRAYOID,
            ],
            &mut [p, k, t],
            false,
            as_token,
        );
    }
    if !feed.is_empty() {
        exec_internal(SQL_FEED_CLEAR, true, &[], &mut [], false, as_token);
    }
    unsafe { pg_sys::XactReadOnly = read_only };
    // Written in the deleting subtransaction itself (the usual case): they stand or fall with
    // it. Written in a younger one: remember them until the transaction ends.
    let later: Vec<(PendingTombstone, pg_sys::SubTransactionId)> = pending
        .into_iter()
        .filter(|t| t.subxact < writer)
        .map(|t| (t, writer))
        .collect();
    if !later.is_empty() {
        FLUSHED_LATER.with(|f| f.borrow_mut().extend(later));
    }
}

/// Subtransaction abort: its rows were not deleted after all, and tombstones it wrote for older
/// subtransactions' deletes are gone, so those are pending again. (Subtransaction ids grow, and
/// every subtransaction younger than `subxact` that exists when it aborts is inside it.)
pub fn forget_tombstones_of(subxact: pg_sys::SubTransactionId) {
    let requeue: Vec<PendingTombstone> = FLUSHED_LATER.with(|f| {
        let mut f = f.borrow_mut();
        let mut back = Vec::new();
        f.retain(|(t, writer)| {
            if *writer < subxact {
                return true;
            }
            if t.subxact < subxact {
                back.push(t.clone());
            }
            false
        });
        back
    });
    PENDING_TOMBSTONES.with(|p| {
        let mut p = p.borrow_mut();
        p.retain(|t| t.subxact < subxact);
        p.extend(requeue);
    });
}

/// Transaction end (commit after the pre-commit flush, or abort).
pub fn forget_tombstones() {
    PENDING_TOMBSTONES.with(|p| p.borrow_mut().clear());
    FLUSHED_LATER.with(|f| f.borrow_mut().clear());
}

// ---------------------------------------------------------------------------------------------
// Locks

/// `locktag_field4` of our resource locks. `pg_advisory_lock` uses 1 and 2, so ours never
/// collide with an application's advisory locks; they show in `pg_locks` as advisory locks
/// with `objsubid` 65025 (0xFE01).
const TAG_RESOURCE: u16 = 0xFE01;

/// FNV-1a, 64 bit: stable across builds and processes, so every backend (even one still running
/// an older build during an upgrade) maps a name to the same lock. Collisions only make two
/// resources share a lock (more waiting), never a wrong decision.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for p in parts {
        for b in *p {
            h ^= *b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

fn tag(hash: u64, kind: u16) -> pg_sys::LOCKTAG {
    pg_sys::LOCKTAG {
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field2: (hash >> 32) as u32,
        locktag_field3: hash as u32,
        locktag_field4: kind,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    }
}

fn resource_tag(resource: &str) -> pg_sys::LOCKTAG {
    tag(fnv1a(&[resource.as_bytes()]), TAG_RESOURCE)
}

/// Transaction-scoped lock; waits like any heavyweight lock: interruptible by query cancel,
/// `statement_timeout` and `lock_timeout`, with deadlock detection.
fn lock(t: pg_sys::LOCKTAG, mode: Mode) {
    let lockmode = match mode {
        Mode::Share => pg_sys::ShareLock,
        Mode::Exclusive => pg_sys::ExclusiveLock,
    } as pg_sys::LOCKMODE;
    unsafe {
        pg_sys::LockAcquire(&t, lockmode, false, false);
    }
}

// ---------------------------------------------------------------------------------------------
// Storage of marks: ordinary tables in schema _pg_fencing (WAL-logged, replicated, crash-safe),
// read with the latest committed snapshot and written as the extension's owner.
//
// The cached statements run as the extension owner with the caller's search_path (the plan cache
// re-analyzes a plan under the current search_path), so every name in them is schema-qualified,
// operators included: a role's own operators can never be picked up.

const SQL_READ_RESOURCE: &str =
    "SELECT high_water FROM _pg_fencing.resource_high_water WHERE resource OPERATOR(pg_catalog.=) $1";
const SQL_STORE_RESOURCE: &str =
    "INSERT INTO _pg_fencing.resource_high_water AS h (resource, high_water, updated_at) \
     VALUES ($1, $2, pg_catalog.clock_timestamp()) ON CONFLICT (resource) DO UPDATE \
     SET high_water = excluded.high_water, updated_at = excluded.updated_at \
     WHERE h.high_water OPERATOR(pg_catalog.<) excluded.high_water";
const SQL_STORE_TOMBS: &str = "INSERT INTO _pg_fencing.row_tombstone AS h (protection_id, key, high_water) \
     SELECT u.p, u.k, u.t FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3)) AS u(p, k, t) \
     WHERE EXISTS (SELECT 1 FROM _pg_fencing.protected_table pt WHERE pt.id OPERATOR(pg_catalog.=) u.p) \
     ON CONFLICT (protection_id, key) DO UPDATE \
     SET high_water = excluded.high_water WHERE h.high_water OPERATOR(pg_catalog.<) excluded.high_water";
/// Logical replication (`wal_level = logical`): every tombstone written is also inserted into
/// `_pg_fencing.tombstone_feed` under its table's qualified name and deleted again in the same
/// transaction, so the table stays empty while its inserts reach subscribers that subscribe to
/// it (there a REPLICA trigger turns each into a tombstone of the subscriber's own protection of
/// that table; protection ids differ between servers, names do not).
const SQL_FEED_TOMBS: &str = "INSERT INTO _pg_fencing.tombstone_feed (relation, key, high_water) \
     SELECT pg_catalog.quote_ident(n.nspname) OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(c.relname), u.k, u.t \
     FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3)) AS u(p, k, t) \
     JOIN _pg_fencing.protected_table pt ON pt.id OPERATOR(pg_catalog.=) u.p \
     JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) pt.relid::pg_catalog.oid \
     JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace";
const SQL_FEED_CLEAR: &str = "DELETE FROM _pg_fencing.tombstone_feed";

/// Is WAL written for logical decoding (publishers need `wal_level = logical`)?
fn logical_wal() -> bool {
    unsafe { pg_sys::wal_level >= pg_sys::WalLevel::WAL_LEVEL_LOGICAL as i32 }
}

const SQL_READ_TOMB: &str = "SELECT high_water FROM _pg_fencing.row_tombstone \
     WHERE protection_id OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2";

fn as_token(d: pg_sys::Datum) -> Token {
    d.value() as i64
}

fn read_resource_mark(resource: &str) -> Option<Token> {
    let r = text_datum(resource);
    if let Some(found) = read_by_index(&MARK_INDEX, &[(1, pg_sys::F_TEXTEQ, r)]) {
        return found;
    }
    exec_internal(
        SQL_READ_RESOURCE,
        true,
        &[pg_sys::TEXTOID],
        &mut [r],
        true,
        as_token,
    )
}

/// A mark table and the unique index its reads go through.
struct MarkIndex {
    table: &'static CStr,
    index: &'static CStr,
}

const MARK_INDEX: MarkIndex = MarkIndex {
    table: c"resource_high_water",
    index: c"resource_high_water_pkey",
};
const TOMB_INDEX: MarkIndex = MarkIndex {
    table: c"row_tombstone",
    index: c"row_tombstone_pkey",
};

/// Where a mark table lives: (table, index, attribute number of `high_water`).
#[derive(Clone, Copy)]
struct MarkTable {
    heap: pg_sys::Oid,
    index: pg_sys::Oid,
    value_attnum: i32,
}

thread_local! {
    /// Per mark table name; dropped on relcache invalidation (`forget_mark_tables`).
    static MARK_TABLES: RefCell<HashMap<&'static CStr, MarkTable>> = RefCell::new(HashMap::new());
}

/// Relcache invalidation: the extension (and its tables) may have been dropped and re-created.
pub fn forget_mark_tables() {
    MARK_TABLES.with(|m| m.borrow_mut().clear());
}

fn mark_table(which: &MarkIndex) -> Option<MarkTable> {
    if let Some(t) = MARK_TABLES.with(|m| m.borrow().get(which.table).copied()) {
        return Some(t);
    }
    let t = unsafe {
        let nsp = pg_sys::get_namespace_oid(c"_pg_fencing".as_ptr(), true);
        if nsp == pg_sys::Oid::INVALID {
            return None;
        }
        let heap = pg_sys::get_relname_relid(which.table.as_ptr(), nsp);
        let index = pg_sys::get_relname_relid(which.index.as_ptr(), nsp);
        if heap == pg_sys::Oid::INVALID || index == pg_sys::Oid::INVALID {
            return None;
        }
        let value_attnum = pg_sys::get_attnum(heap, c"high_water".as_ptr()) as i32;
        if value_attnum <= 0 {
            return None;
        }
        MarkTable {
            heap,
            index,
            value_attnum,
        }
    };
    MARK_TABLES.with(|m| m.borrow_mut().insert(which.table, t));
    Some(t)
}

/// Read `high_water` of the row whose key columns equal `keys` ((attribute number, equality
/// function, value) per column), straight through the table's unique index with the latest
/// committed snapshot: the same answer as the cached `SELECT`, without an SPI round trip.
/// `None` if the table cannot be found this way (the caller then runs the `SELECT`);
/// `Some(None)` if there is no such row.
fn read_by_index(which: &MarkIndex, keys: &[(i16, u32, pg_sys::Datum)]) -> Option<Option<Token>> {
    let t = mark_table(which)?;
    unsafe {
        let heap = pg_sys::table_open(t.heap, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let tupdesc = (*heap).rd_att;
        let natts = (*tupdesc).natts as usize;
        let mut scankeys: Vec<pg_sys::ScanKeyData> = Vec::with_capacity(keys.len());
        for (attno, proc_, value) in keys {
            let collation = (*tupdesc).attrs.as_slice(natts)[(*attno - 1) as usize].attcollation;
            let mut key = std::mem::zeroed::<pg_sys::ScanKeyData>();
            pg_sys::ScanKeyEntryInitialize(
                &mut key,
                0,
                *attno,
                pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
                pg_sys::Oid::INVALID,
                collation,
                pg_sys::Oid::from(*proc_),
                *value,
            );
            scankeys.push(key);
        }
        let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetLatestSnapshot());
        let scan = pg_sys::systable_beginscan(
            heap,
            t.index,
            true,
            snapshot,
            scankeys.len() as i32,
            scankeys.as_mut_ptr(),
        );
        let tuple = pg_sys::systable_getnext(scan);
        let mut found = None;
        if !tuple.is_null() {
            let mut isnull = false;
            let d = pg_sys::heap_getattr(tuple, t.value_attnum, tupdesc, &mut isnull);
            if !isnull {
                found = Some(as_token(d));
            }
        }
        pg_sys::systable_endscan(scan);
        pg_sys::UnregisterSnapshot(snapshot);
        pg_sys::table_close(heap, pg_sys::NoLock as pg_sys::LOCKMODE);
        Some(found)
    }
}

fn store_resource_mark(resource: &str, token: Token) {
    let r = text_datum(resource);
    exec_internal(
        SQL_STORE_RESOURCE,
        true,
        &[pg_sys::TEXTOID, pg_sys::INT8OID],
        &mut [r, pg_sys::Datum::from(token)],
        false,
        as_token,
    );
}

fn read_tombstone(protection: i64, key: &str) -> Option<Token> {
    flush_tombstones();
    let k = text_datum(key);
    if let Some(found) = read_by_index(
        &TOMB_INDEX,
        &[
            (1, pg_sys::F_INT8EQ, pg_sys::Datum::from(protection)),
            (2, pg_sys::F_TEXTEQ, k),
        ],
    ) {
        return found;
    }
    exec_internal(
        SQL_READ_TOMB,
        true,
        &[pg_sys::INT8OID, pg_sys::TEXTOID],
        &mut [pg_sys::Datum::from(protection), k],
        true,
        as_token,
    )
}

/// Settings pinned while pg_fencing runs its internal statements as the extension owner and
/// while it prints primary keys into tombstone keys:
/// * `search_path`: an ordinary role must not be able to put its own operators or functions in
///   front of `pg_catalog` and have them run with the owner's privileges;
/// * the output settings: a key's text must not depend on the session (a `timestamptz` key
///   printed in another `TimeZone` would name another tombstone).
const PINNED_SETTINGS: [(&std::ffi::CStr, &std::ffi::CStr); 6] = [
    (c"search_path", c"pg_catalog, pg_temp"),
    (c"TimeZone", c"UTC"),
    (c"DateStyle", c"ISO, YMD"),
    (c"IntervalStyle", c"postgres"),
    (c"extra_float_digits", c"1"),
    (c"bytea_output", c"hex"),
];

/// Run `f` with [`PINNED_SETTINGS`] in force; they are restored afterwards (and by the
/// transaction machinery if `f` raises an error).
pub fn with_pinned_settings<T>(f: impl FnOnce() -> T) -> T {
    unsafe {
        let level = pg_sys::NewGUCNestLevel();
        for (name, value) in PINNED_SETTINGS {
            pg_sys::set_config_option(
                name.as_ptr(),
                value.as_ptr(),
                pg_sys::GucContext::PGC_USERSET,
                pg_sys::GucSource::PGC_S_SESSION,
                pg_sys::GucAction::GUC_ACTION_SAVE,
                true,
                0,
                false,
            );
        }
        let out = f();
        pg_sys::AtEOXact_GUC(true, level);
        out
    }
}

thread_local! {
    static OWNER: std::cell::Cell<(u32, u32)> = const { std::cell::Cell::new((0, 0)) };
}

/// Owner of schema `_pg_fencing` (the role that created the extension), remembered per schema OID.
fn internal_owner() -> pg_sys::Oid {
    unsafe {
        let nsp = pg_sys::get_namespace_oid(c"_pg_fencing".as_ptr(), false);
        let (cached_nsp, cached_owner) = OWNER.with(|o| o.get());
        if cached_nsp == nsp.to_u32() && cached_owner != 0 {
            return pg_sys::Oid::from(cached_owner);
        }
        let tup = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::NAMESPACEOID as _,
            pg_sys::Datum::from(nsp),
        );
        if tup.is_null() {
            pgrx::error!("pg_fencing: schema _pg_fencing vanished");
        }
        let form = pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_namespace>(tup);
        let owner = (*form).nspowner;
        pg_sys::ReleaseSysCache(tup);
        OWNER.with(|o| o.set((nsp.to_u32(), owner.to_u32())));
        owner
    }
}

/// Run a statement as the extension owner, with the latest committed snapshot, and decode the
/// first column of the first row (if any, and not NULL) with `decode`. `cached`: keep the plan
/// for the life of the backend (only for the fixed statements above).
pub fn exec_internal<T>(
    sql: &str,
    cached: bool,
    types: &[pg_sys::Oid],
    args: &mut [pg_sys::Datum],
    read_only: bool,
    decode: impl FnOnce(pg_sys::Datum) -> T,
) -> Option<T> {
    // The cached statements qualify every name, operators included (see above), and return
    // bigints, so neither search_path nor output settings matter to them once prepared. A plan
    // not yet prepared, and one-off statements (which print keys), run with pinned settings.
    let prepared = cached && PLANS.with(|p| p.borrow().contains_key(sql));
    if prepared {
        exec_internal_pinned(sql, cached, types, args, read_only, decode)
    } else {
        with_pinned_settings(|| exec_internal_pinned(sql, cached, types, args, read_only, decode))
    }
}

thread_local! {
    /// Depth of pg_fencing's own internal statements now running (see `internal_write`).
    static INTERNAL: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Is one of pg_fencing's own internal statements running? The REPLICA triggers on its tables
/// (`_pg_fencing.on_replicated_change`) let these through: in a replica-mode session (logical
/// replication's apply worker) they are the subscriber's own bookkeeping, not replicated rows.
pub fn internal_write() -> bool {
    INTERNAL.with(|d| d.get() > 0)
}

/// Transaction end: no internal statement is running any more (also after an error in one).
pub fn forget_internal_write() {
    INTERNAL.with(|d| d.set(0));
}

struct InternalWrite;
impl InternalWrite {
    fn begin() -> Self {
        INTERNAL.with(|d| d.set(d.get() + 1));
        InternalWrite
    }
}
impl Drop for InternalWrite {
    fn drop(&mut self) {
        INTERNAL.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

fn exec_internal_pinned<T>(
    sql: &str,
    cached: bool,
    types: &[pg_sys::Oid],
    args: &mut [pg_sys::Datum],
    read_only: bool,
    decode: impl FnOnce(pg_sys::Datum) -> T,
) -> Option<T> {
    unsafe {
        let mut save_user = pg_sys::Oid::INVALID;
        let mut save_sec: std::ffi::c_int = 0;
        pg_sys::GetUserIdAndSecContext(&mut save_user, &mut save_sec);
        let owner = internal_owner();
        pg_sys::SetUserIdAndSecContext(
            owner,
            save_sec
                | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32
                | pg_sys::SECURITY_RESTRICTED_OPERATION as i32,
        );
        if pg_sys::SPI_connect() != pg_sys::SPI_OK_CONNECT as i32 {
            pgrx::error!("pg_fencing: SPI_connect failed");
        }
        let plan = if cached {
            plan_for(sql, types)
        } else {
            prepare(sql, types)
        };
        let nulls = vec![b' ' as std::ffi::c_char; args.len()];
        let _internal = InternalWrite::begin();
        let rc = pg_sys::SPI_execute_snapshot(
            plan,
            args.as_mut_ptr(),
            nulls.as_ptr(),
            pg_sys::GetLatestSnapshot(),
            std::ptr::null_mut(),
            read_only,
            false,
            if read_only { 1 } else { 0 },
        );
        if rc < 0 {
            pgrx::error!("pg_fencing: internal statement failed: SPI code {rc}");
        }
        let mut out = None;
        if pg_sys::SPI_processed > 0 && !pg_sys::SPI_tuptable.is_null() {
            let tt = &*pg_sys::SPI_tuptable;
            let mut isnull = false;
            let d = pg_sys::SPI_getbinval(*tt.vals, tt.tupdesc, 1, &mut isnull);
            if !isnull {
                out = Some(decode(d));
            }
        }
        pg_sys::SPI_finish();
        pg_sys::SetUserIdAndSecContext(save_user, save_sec);
        out
    }
}

/// Prepared plans, kept for the life of the backend (the plan cache re-plans them if the
/// extension's tables are dropped and re-created).
fn plan_for(sql: &str, types: &[pg_sys::Oid]) -> pg_sys::SPIPlanPtr {
    if let Some(p) = PLANS.with(|p| p.borrow().get(sql).copied()) {
        return p as pg_sys::SPIPlanPtr;
    }
    let plan = prepare(sql, types);
    unsafe {
        pg_sys::SPI_keepplan(plan);
    }
    PLANS.with(|p| p.borrow_mut().insert(sql.to_string(), plan as usize));
    plan
}

/// A plan in the current SPI procedure's memory (freed by SPI_finish).
fn prepare(sql: &str, types: &[pg_sys::Oid]) -> pg_sys::SPIPlanPtr {
    // Our statements contain no NUL (identifiers cannot); strip one rather than panic.
    let csql = CString::new(sql.replace('\0', "")).unwrap_or_default();
    let mut types = types.to_vec();
    unsafe {
        let plan = pg_sys::SPI_prepare(csql.as_ptr(), types.len() as i32, types.as_mut_ptr());
        if plan.is_null() {
            pgrx::error!("pg_fencing: could not prepare internal statement: {sql}");
        }
        plan
    }
}

/// Per-row mode TRUNCATE of relation `relid`: refuse if any row carries a higher token than
/// `token`, else leave a tombstone for every row. `pk_names` and `token_col` are quoted.
pub fn truncate_rows(
    protection: i64,
    relid: pg_sys::Oid,
    table: &str,
    pk_names: &[String],
    token_col: &str,
    token: Token,
) -> Result<(), FenceError> {
    flush_tombstones();
    let row_key = format!("ROW({})::text", pk_names.join(", "));
    let from = format!("ONLY {table}");
    let _ = relid;
    let check = format!(
        "SELECT {row_key} || ' ' || {token_col} FROM {from} WHERE {token_col} > $1 ORDER BY {token_col} DESC LIMIT 1"
    );
    let newest = exec_internal(
        &check,
        false,
        &[pg_sys::INT8OID],
        &mut [pg_sys::Datum::from(token)],
        true,
        |d| unsafe { String::from_datum(d, false).unwrap_or_default() },
    );
    if let Some(found) = newest {
        let (key, hw) = found.rsplit_once(' ').unwrap_or((&found, "0"));
        let high_water = hw.parse().unwrap_or_default();
        stats::rejected(
            stats::Kind::Table,
            &protection.to_string(),
            token,
            high_water,
        );
        return Err(FenceError::StaleToken {
            domain: Domain::Row {
                table: table.to_string(),
                key: key.to_string(),
            },
            token,
            high_water,
        });
    }
    let store = format!(
        "INSERT INTO _pg_fencing.row_tombstone AS h (protection_id, key, high_water) \
         SELECT $1, {row_key}, $2 FROM {from} ON CONFLICT (protection_id, key) DO UPDATE \
         SET high_water = excluded.high_water WHERE h.high_water < excluded.high_water"
    );
    exec_internal(
        &store,
        false,
        &[pg_sys::INT8OID, pg_sys::INT8OID],
        &mut [pg_sys::Datum::from(protection), pg_sys::Datum::from(token)],
        false,
        as_token,
    );
    if logical_wal() {
        // For subscribers, as in `flush_tombstones` (see `SQL_FEED_TOMBS`).
        // Under the protected (root) table's name, as the subscriber's protection knows it.
        let feed = format!(
            "INSERT INTO _pg_fencing.tombstone_feed (relation, key, high_water) \
             SELECT (SELECT pg_catalog.quote_ident(n.nspname) OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(c.relname) \
                     FROM _pg_fencing.protected_table pt \
                     JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) pt.relid::pg_catalog.oid \
                     JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace \
                     WHERE pt.id OPERATOR(pg_catalog.=) $1), \
                    {row_key}, $2 FROM {from}"
        );
        exec_internal(
            &feed,
            false,
            &[pg_sys::INT8OID, pg_sys::INT8OID],
            &mut [pg_sys::Datum::from(protection), pg_sys::Datum::from(token)],
            false,
            as_token,
        );
        exec_internal(SQL_FEED_CLEAR, true, &[], &mut [], false, as_token);
    }
    Ok(())
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn the_rule() {
        assert_eq!(rule(5, None), Verdict::Accept { raises: true });
        assert_eq!(rule(5, Some(4)), Verdict::Accept { raises: true });
        assert_eq!(rule(5, Some(5)), Verdict::Accept { raises: false });
        assert_eq!(rule(5, Some(6)), Verdict::Reject);
        assert_eq!(
            rule(i64::MAX, Some(i64::MAX)),
            Verdict::Accept { raises: false }
        );
    }

    #[test]
    fn lock_hash_is_stable() {
        // Pinned value: changing the hash would let old and new backends lock different keys.
        assert_eq!(fnv1a(&[b"settlement"]), 0x6ff1_9ec9_efcf_9b4f);
        assert_ne!(fnv1a(&[b"a", b"b"]), fnv1a(&[b"ab"]));
    }
}
