//! The life cycle of per-backend state, in one place: PostgreSQL's transaction, subtransaction
//! and relcache callbacks are registered here, and each calls the resets of the modules that keep
//! state (`rule`'s held locks, `state/tombstones.rs`'s pending batch, `pg/spi.rs`'s internal
//! statement depth, `lock_service/watch.rs`'s pending registrations, `guard/trigger.rs`'s and
//! `api/fenced.rs`'s caches, `pg/index.rs`'s table locations).

use crate::api::fenced;
use crate::guard::trigger;
use crate::lock_service::{etcd_locks, leases, watch};
use crate::pg::{index, report, spi};
use crate::rule;
use crate::state::{mark_versions, marks, tombstones};
use pgrx::prelude::*;

/// Register the callbacks (from `_PG_init`, once per backend).
pub fn init() {
    // SAFETY: called once from _PG_init on the backend's main thread; the callbacks are
    // `extern "C-unwind"` functions with PostgreSQL's signatures, guarded by #[pg_guard], and
    // live as long as the library (which is never unloaded).
    unsafe {
        pg_sys::RegisterXactCallback(Some(xact_callback), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(subxact_callback), std::ptr::null_mut());
        pg_sys::CacheRegisterRelcacheCallback(Some(relcache_callback), pg_sys::Datum::from(0usize));
        // A subscription that starts or stops writing a table changes whether its protection
        // is active (`_pg_fencing.inactive_reason`).
        pg_sys::CacheRegisterSyscacheCallback(
            pg_sys::SysCacheIdentifier::SUBSCRIPTIONRELMAP as std::ffi::c_int,
            Some(subscription_rel_callback),
            pg_sys::Datum::from(0usize),
        );
    }
}

/// Locks taken by the fencing rule end with the transaction; so does what we know about them.
///
/// # Safety
/// Only for PostgreSQL's transaction machinery to call (registered in `init`), on the main
/// thread.
#[pg_guard]
unsafe extern "C-unwind" fn xact_callback(
    event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    if event == pg_sys::XactEvent::XACT_EVENT_PRE_COMMIT
        || event == pg_sys::XactEvent::XACT_EVENT_PRE_PREPARE
    {
        // Tombstones of this transaction's per-row deletes, batched (see state/tombstones.rs).
        tombstones::flush_tombstones();
        // Registration changes of watched resources reach shared memory with the commit.
        let applied = if event == pg_sys::XactEvent::XACT_EVENT_PRE_COMMIT {
            // A stopped watch's hand-over revision becomes the resource's mark, in this
            // transaction (made durable with the commit by fencing_unwatch).
            watch::apply_pending().map(|marks| {
                for (resource, handover) in marks {
                    rule::raise_mark(&resource, handover);
                }
            })
        } else {
            watch::refuse_prepare()
        };
        if let Err(e) = applied {
            // SAFETY: in a PRE_COMMIT/PRE_PREPARE callback an ERROR aborts the transaction
            // (PostgreSQL's CommitTransaction/PrepareTransaction allow it there). As `raise`
            // requires, this is the body of a #[pg_guard] callback that PostgreSQL called, on
            // the main thread, and nothing in it (or in the guard's frames) needs dropping:
            // `applied` was moved into `e`, which `raise` consumes.
            unsafe { report::raise(e) };
        }
        return;
    }
    rule::forget_all();
    spi::forget_internal_write();
    if event == pg_sys::XactEvent::XACT_EVENT_COMMIT {
        // Waiters for the leases this transaction released look again, now that it is visible.
        leases::wake_released();
    }
    if event == pg_sys::XactEvent::XACT_EVENT_COMMIT
        || event == pg_sys::XactEvent::XACT_EVENT_ABORT
        || event == pg_sys::XactEvent::XACT_EVENT_PREPARE
    {
        leases::forget_transaction();
    }
    if event == pg_sys::XactEvent::XACT_EVENT_COMMIT
        || event == pg_sys::XactEvent::XACT_EVENT_ABORT
        || event == pg_sys::XactEvent::XACT_EVENT_PREPARE
    {
        fenced::free_stale_plans();
        rule::session_token::forget_fenced(None);
        crate::guard::fast_path::forget_authorized();
        tombstones::forget_tombstones();
        mark_versions::forget_changes();
        crate::state::protections::forget_dropping();
    }
    if event == pg_sys::XactEvent::XACT_EVENT_COMMIT
        || event == pg_sys::XactEvent::XACT_EVENT_PREPARE
    {
        etcd_locks::commit_acquired();
    }
    if event == pg_sys::XactEvent::XACT_EVENT_COMMIT {
        // The watches this transaction stopped are gone now that it committed.
        watch::finish_commit();
    }
    if event == pg_sys::XactEvent::XACT_EVENT_ABORT {
        // A commit that failed after PRE_COMMIT: take back its registration changes.
        watch::undo_applied();
        watch::forget_pending();
        trigger::forget_verified();
        rule::forget_activity();
        tombstones::forget_floors();
        etcd_locks::abort_pending(None);
    }
}

/// A subtransaction abort releases the locks it took and undoes the marks it wrote.
///
/// # Safety
/// Only for PostgreSQL's transaction machinery to call (registered in `init`), on the main
/// thread.
#[pg_guard]
unsafe extern "C-unwind" fn subxact_callback(
    event: pg_sys::SubXactEvent::Type,
    my: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        // fencing_acquire calls of the subtransaction (a savepoint, a PL/pgSQL EXCEPTION block).
        etcd_locks::abort_pending(Some(my));
        tombstones::forget_tombstones_of(my);
        watch::forget_pending_of(my);
        rule::forget_all();
        trigger::forget_verified();
        tombstones::forget_floors();
        crate::guard::fast_path::forget_checked();
        crate::guard::fast_path::forget_writes_of(my);
        rule::session_token::forget_fenced(Some(my));
        rule::forget_activity();
        // Leases the subtransaction granted, renewed or read are read again (its grants and
        // renewals were rolled back).
        leases::forget_seen();
        // (the floors raised for them were rolled back too)
        crate::state::protections::forget_dropping();
    }
}

/// A row of `pg_subscription_rel` changed: which protections are active may have changed.
///
/// # Safety
/// Only for PostgreSQL's invalidation machinery to call (registered in `init`), on the main
/// thread.
#[pg_guard]
unsafe extern "C-unwind" fn subscription_rel_callback(
    _arg: pg_sys::Datum,
    _cacheid: std::ffi::c_int,
    _hash: u32,
) {
    rule::forget_activity();
}

/// A relation changed (or every relation, `relid` invalid): cached trigger arguments, table
/// information, `fenced_*` targets and the locations of pg_fencing's own tables may be stale.
///
/// # Safety
/// Only for PostgreSQL's invalidation machinery to call (registered in `init`), on the main
/// thread.
#[pg_guard]
unsafe extern "C-unwind" fn relcache_callback(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    fenced::invalidate();
    index::forget_located();
    marks::forget();
    tombstones::forget_floors();
    rule::forget_seen_marks();
    rule::forget_activity();
    trigger::forget_relation((relid != pg_sys::Oid::INVALID).then_some(relid));
    crate::guard::fast_path::forget_functions();
    crate::guard::fast_path::forget_checked();
}
