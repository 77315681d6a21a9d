//! The life cycle of per-backend state, in one place. PostgreSQL's transaction,
//! subtransaction, relcache and `pg_subscription_rel` callbacks are registered here; each turns
//! its event into a `BackendEvent` and hands it to every module that keeps per-backend state,
//! in the order of `STATEFUL`. Each of those modules says in its own `on_event` what each event
//! clears (its `thread_local!`s are private to it), so adding a cache means writing that
//! function and one line here; `scripts/check_layers.py` fails when a file has a
//! `thread_local!` and no line here.
//!
//! Before that, at pre-commit (and pre-prepare), the transaction's own work that must be done
//! inside it: its per-row tombstones are written out, then its watch registrations applied
//! (the tombstones first: applying a stopped watch raises a mark, which must not be counted
//! against a batch that is still pending).

use crate::api::fenced;
use crate::backend_event::BackendEvent;
use crate::guard::{citus, copy_from, fast_path, trigger};
use crate::lock_service::{etcd_locks, leases, watch};
use crate::pg::{index, process, report, session, spi};
use crate::rule::{self, session_token};
use crate::state::{mark_versions, marks, protections, tombstone_runs, tombstones};
use pgrx::prelude::*;

/// A module with per-backend state: its file (as `scripts/check_layers.py` finds it) and what
/// each event does to its state.
struct Stateful {
    #[expect(dead_code, reason = "read by scripts/check_layers.py, not by the code")]
    file: &'static str,
    on_event: fn(BackendEvent),
}

/// Every module that keeps per-backend state, in the order their `on_event` runs for every
/// event. The order matters only where one module's reset reads another's state; none does
/// today, so the order is that of the layers, top down (a module may still read state of the
/// layers below while it forgets its own).
const STATEFUL: &[Stateful] = &[
    Stateful {
        file: "src/api/fenced.rs",
        on_event: fenced::on_event,
    },
    Stateful {
        file: "src/guard/citus.rs",
        on_event: citus::on_event,
    },
    Stateful {
        file: "src/guard/copy_from.rs",
        on_event: copy_from::on_event,
    },
    Stateful {
        file: "src/guard/fast_path.rs",
        on_event: fast_path::on_event,
    },
    Stateful {
        file: "src/guard/trigger.rs",
        on_event: trigger::on_event,
    },
    Stateful {
        file: "src/rule/mod.rs",
        on_event: rule::on_event,
    },
    Stateful {
        file: "src/rule/session_token.rs",
        on_event: session_token::on_event,
    },
    Stateful {
        file: "src/lock_service/etcd_locks.rs",
        on_event: etcd_locks::on_event,
    },
    Stateful {
        file: "src/lock_service/leases.rs",
        on_event: leases::on_event,
    },
    Stateful {
        file: "src/lock_service/watch.rs",
        on_event: watch::on_event,
    },
    Stateful {
        file: "src/state/tombstones.rs",
        on_event: tombstones::on_event,
    },
    Stateful {
        file: "src/state/tombstone_runs.rs",
        on_event: tombstone_runs::on_event,
    },
    Stateful {
        file: "src/pg/process.rs",
        on_event: process::on_event,
    },
    Stateful {
        file: "src/state/mark_versions.rs",
        on_event: mark_versions::on_event,
    },
    Stateful {
        file: "src/state/marks.rs",
        on_event: marks::on_event,
    },
    Stateful {
        file: "src/state/protections.rs",
        on_event: protections::on_event,
    },
    Stateful {
        file: "src/pg/index.rs",
        on_event: index::on_event,
    },
    Stateful {
        file: "src/pg/spi.rs",
        on_event: spi::on_event,
    },
    Stateful {
        file: "src/pg/session.rs",
        on_event: session::on_event,
    },
];

fn dispatch(ev: BackendEvent) {
    for m in STATEFUL {
        (m.on_event)(ev);
    }
}

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
        // A table a Citus function took and no statement end protected again; Citus's nodes
        // changed by this transaction.
        if let Err(e) = crate::guard::citus::at_commit() {
            // SAFETY: as for `applied` below: a PRE_COMMIT/PRE_PREPARE callback's ERROR aborts
            // the transaction; this is the body of a #[pg_guard] callback on the main thread,
            // and `e` is consumed by `raise`.
            unsafe { report::raise(e, report::Raiser::Hook("pg_fencing pre-commit callback")) };
        }
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
            unsafe { report::raise(e, report::Raiser::Hook("pg_fencing pre-commit callback")) };
        }
        return;
    }
    dispatch(match event {
        pg_sys::XactEvent::XACT_EVENT_COMMIT => BackendEvent::Commit,
        pg_sys::XactEvent::XACT_EVENT_PREPARE => BackendEvent::Prepare,
        pg_sys::XactEvent::XACT_EVENT_ABORT => BackendEvent::Abort,
        _ => BackendEvent::ParallelWorkerEnd,
    });
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
        dispatch(BackendEvent::SubAbort(my));
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
    dispatch(BackendEvent::Subscriptions);
}

/// A relation changed (or every relation, `relid` invalid): cached trigger arguments, table
/// information, `fenced_*` targets and the locations of pg_fencing's own tables may be stale.
///
/// # Safety
/// Only for PostgreSQL's invalidation machinery to call (registered in `init`), on the main
/// thread.
#[pg_guard]
unsafe extern "C-unwind" fn relcache_callback(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    dispatch(BackendEvent::Relcache(
        (relid != pg_sys::Oid::INVALID).then_some(relid),
    ));
}
