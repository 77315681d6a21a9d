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

/// Take `resource`'s lock in `mode` until the transaction ends (see `rule` for what each mode
/// means).
pub fn lock_resource(resource: &str, mode: LockMode) {
    lock(resource_tag(resource), mode);
}
