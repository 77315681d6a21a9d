//! Resource locks: transaction-scoped heavyweight locks in PostgreSQL's lock manager under a
//! lock tag of our own (see `rule` for the protocol that uses them). Being heavyweight locks,
//! their waits are interruptible by query cancel, `statement_timeout` and `lock_timeout`, and
//! PostgreSQL's deadlock detector sees them.

use pg_fencing_core::hash::fnv1a;
use pgrx::pg_sys;

/// The two modes the fencing rule uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LockMode {
    Share,
    Exclusive,
}

/// `locktag_field4` of our resource locks. `pg_advisory_lock` uses 1 and 2, so ours never
/// collide with an application's advisory locks; they show in `pg_locks` as advisory locks
/// with `objsubid` 65025 (0xFE01).
const TAG_RESOURCE: u16 = 0xFE01;

/// `locktag_field4` of the locks that waiters for a PostgreSQL lease hold while they wait
/// (`lock_service/leases.rs`): `objsubid` 65026 (0xFE02) in `pg_locks`.
const TAG_LEASE_WAITER: u16 = 0xFE02;

/// `locktag_field4` of the short session lock under which a new server history moves the lease
/// token sequence (`lock_service/leases.rs`): `objsubid` 65027 (0xFE03).
const TAG_LEASE_HISTORY: u16 = 0xFE03;

/// `locktag_field4` of the lock under which a transaction merges a protection's tombstone runs
/// or turns them into rows (`state/tombstone_runs.rs`): `objsubid` 65028 (0xFE04).
const TAG_TOMBSTONE_RUNS: u16 = 0xFE04;

fn tag(hash: u64, kind: u16) -> pg_sys::LOCKTAG {
    pg_sys::LOCKTAG {
        // SAFETY: MyDatabaseId is set once at backend start and only read afterwards.
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
fn lock(t: pg_sys::LOCKTAG, mode: LockMode) {
    let lockmode = match mode {
        LockMode::Share => pg_sys::ShareLock,
        LockMode::Exclusive => pg_sys::ExclusiveLock,
    } as pg_sys::LOCKMODE;
    // SAFETY: `t` is a fully initialised LOCKTAG of our own lock method (USER_LOCKMETHOD) and
    // `lockmode` a valid mode for it; LockAcquire is called on a backend's main thread inside a
    // transaction (every caller runs in one), which releases the lock at its end.
    unsafe {
        pg_sys::LockAcquire(&t, lockmode, false, false);
    }
}

/// Take the tombstone-runs lock of protection `protection` until the transaction ends, waiting
/// for it as for any heavyweight lock (`_pg_fencing.expand_tombstone_runs`).
pub fn lock_runs(protection: i64) {
    lock(
        tag(protection as u64, TAG_TOMBSTONE_RUNS),
        LockMode::Exclusive,
    );
}

/// Take the tombstone-runs lock of protection `protection` until the transaction ends if no
/// other transaction holds it; false (not taken) otherwise, without waiting (a merge of runs).
pub fn try_lock_runs(protection: i64) -> bool {
    let t = tag(protection as u64, TAG_TOMBSTONE_RUNS);
    // SAFETY: as in `lock`; with dontWait = true LockAcquire returns LOCKACQUIRE_NOT_AVAIL
    // instead of waiting when another transaction holds the lock.
    let got =
        unsafe { pg_sys::LockAcquire(&t, pg_sys::ExclusiveLock as pg_sys::LOCKMODE, false, true) };
    got != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
}

/// Take `resource`'s lock in `mode` until the transaction ends (see `rule` for what each mode
/// means).
pub fn lock_resource(resource: &str, mode: LockMode) {
    lock(resource_tag(resource), mode);
}

/// Announce that this transaction waits for lease `name` (a SHARE lock under a tag of our own,
/// held until the transaction ends; waiters never conflict with each other). Taken before the
/// waiter first looks at the lease, so a release that commits after that look finds it
/// (`wake_lease_waiters`).
pub fn register_lease_waiter(name: &str) {
    lock(
        tag(fnv1a(&[name.as_bytes()]), TAG_LEASE_WAITER),
        LockMode::Share,
    );
}

/// Set the latch of every process whose transaction waits for lease `name`
/// (`register_lease_waiter`), so that it looks at the lease again. Called after the commit that
/// released the lease became visible. Never raises an error it could avoid: on a failure it
/// wakes nobody (the waiters then wake at the lease's expiry or their own timeout).
pub fn wake_lease_waiters(name: &str) {
    let t = tag(fnv1a(&[name.as_bytes()]), TAG_LEASE_WAITER);
    let mut n: std::ffi::c_int = 0;
    // SAFETY: main thread of a backend (the commit callback, after the commit); `t` is a fully
    // initialised tag of USER_LOCKMETHOD. GetLockConflicts returns a palloc'd array of `n`
    // virtual transaction ids (it skips this process), read within those bounds; each names a
    // process whose latch lies in shared memory (`compat::latch_of`).
    unsafe {
        let vxids = pg_sys::GetLockConflicts(&t, pg_sys::ExclusiveLock as pg_sys::LOCKMODE, &mut n);
        if vxids.is_null() {
            return;
        }
        for i in 0..n.max(0) as usize {
            crate::pg::process::set_latch(crate::pg::compat::latch_of(&*vxids.add(i)));
        }
        pg_sys::pfree(vxids.cast());
    }
}

/// While this value lives, this backend holds the session lock under which the lease token
/// sequence moves to a new server history (`lock_service/leases.rs`); dropped, also when an
/// ERROR unwinds through its owner, it releases the lock. Waits like any lock wait.
pub struct LeaseHistoryLock(pg_sys::LOCKTAG);

impl LeaseHistoryLock {
    pub fn take() -> Self {
        let t = tag(0, TAG_LEASE_HISTORY);
        // SAFETY: a session lock of our own tag (USER_LOCKMETHOD), on the main thread inside a
        // transaction; released by `drop` (a session lock outlives the transaction otherwise).
        unsafe {
            pg_sys::LockAcquire(&t, pg_sys::ExclusiveLock as pg_sys::LOCKMODE, true, false);
        }
        LeaseHistoryLock(t)
    }
}

impl Drop for LeaseHistoryLock {
    fn drop(&mut self) {
        // SAFETY: releases the session lock `take` acquired with the same tag and mode; returns
        // false (with a WARNING) rather than failing if it is not held.
        unsafe {
            pg_sys::LockRelease(&self.0, pg_sys::ExclusiveLock as pg_sys::LOCKMODE, true);
        }
    }
}

// Not in pgrx's bindings (catalog/pg_inherits.h); called through pgrx's FFI guard below, like
// pgrx's own bindings, so an ERROR it raises becomes a Rust panic at the call.
// SAFETY: the signature is find_all_inheritors' in catalog/pg_inherits.h (PostgreSQL 10 and
// later): List *find_all_inheritors(Oid parentrelId, LOCKMODE lockmode, List **numparents).
unsafe extern "C-unwind" {
    fn find_all_inheritors(
        parent: pg_sys::Oid,
        lockmode: pg_sys::LOCKMODE,
        numparents: *mut *mut pg_sys::List,
    ) -> *mut pg_sys::List;
}

/// Lock table `relid` and every partition (or inheritance child) under it in SHARE mode until
/// the transaction ends, so that every transaction writing any of them now has ended and any
/// that writes them later waits for this one to end; and queue a relcache invalidation of each,
/// sent at commit, which such a later writer reads when its lock is granted (PostgreSQL
/// processes invalidations on every newly granted relation lock). `fencing_prune_tombstones`
/// uses it so that no writer checks a key against a tombstone floor cached before the prune.
///
/// `wait`: wait for the locks like any lock wait (query cancel, `statement_timeout`,
/// `lock_timeout`, deadlock detection); else take them only if they are free at once and return
/// false otherwise (the tombstone pruner: a queued SHARE request would stall every writer).
/// Also false if the table was dropped while this waited for it.
pub fn lock_tree_share_and_invalidate(relid: pg_sys::Oid, wait: bool) -> bool {
    let mode = pg_sys::ShareLock as pg_sys::LOCKMODE;
    // SAFETY: main thread inside a transaction (a SQL function's or the pruner's).
    // LockRelationOid, ConditionalLockRelationOid and find_all_inheritors take plain values and
    // raise ERROR (a panic through pgrx's FFI guard) on failure; find_all_inheritors returns a
    // palloc'd List of OIDs (never NULL: it contains at least `relid`) whose `length` cells of
    // `elements` hold OIDs (an OID list), read within those bounds. The relation's existence is
    // checked after its lock is granted (a concurrent DROP commits before that), so
    // CacheInvalidateRelcacheByRelid only queues messages for relations that exist and that
    // this transaction holds locked.
    unsafe {
        if wait {
            pg_sys::LockRelationOid(relid, mode);
        } else if !pg_sys::ConditionalLockRelationOid(relid, mode) {
            return false;
        }
        if !relation_exists(relid) {
            return false;
        }
        let tree = pg_sys::submodules::ffi::pg_guard_ffi_boundary(|| {
            find_all_inheritors(
                relid,
                pg_sys::NoLock as pg_sys::LOCKMODE,
                std::ptr::null_mut(),
            )
        });
        let n = if tree.is_null() {
            0
        } else {
            (*tree).length.max(0) as usize
        };
        let members: Vec<pg_sys::Oid> = (0..n)
            .map(|i| (*(*tree).elements.add(i)).oid_value)
            .collect();
        for &member in &members {
            if member == relid {
                continue;
            }
            if wait {
                pg_sys::LockRelationOid(member, mode);
            } else if !pg_sys::ConditionalLockRelationOid(member, mode) {
                return false;
            }
        }
        for &member in &members {
            // A partition dropped while we waited for its lock has nothing left to invalidate.
            if relation_exists(member) {
                pg_sys::CacheInvalidateRelcacheByRelid(member);
            }
        }
    }
    true
}

/// Lock relation `relid` in SHARE UPDATE EXCLUSIVE mode until the transaction ends (waits like
/// any lock wait), as settings changes of a table do: it waits for a DROP in flight.
pub fn lock_relation_share_update(relid: pg_sys::Oid) {
    // SAFETY: main thread inside a transaction; LockRelationOid takes plain values (an OID that
    // does not exist is simply locked, and checked by the caller).
    unsafe {
        pg_sys::LockRelationOid(relid, pg_sys::ShareUpdateExclusiveLock as pg_sys::LOCKMODE);
    }
}

/// Does relation `relid` exist (in this transaction's view of the catalogs)?
pub fn relation_exists(relid: pg_sys::Oid) -> bool {
    // SAFETY: a syscache probe by value on the main thread inside a transaction; it only
    // reports whether the entry exists.
    unsafe {
        pg_sys::SearchSysCacheExists(
            pg_sys::SysCacheIdentifier::RELOID as i32,
            pg_sys::Datum::from(relid),
            pg_sys::Datum::from(0usize),
            pg_sys::Datum::from(0usize),
            pg_sys::Datum::from(0usize),
        )
    }
}
