//! What differs between the PostgreSQL majors pg_fencing builds for (the pgrx features `pg15`
//! and `pg18`), in one place: the rest of the crate calls these and never tests a feature.
//!
//! * 18 stores a tuple descriptor's attributes after its compact attributes, so `attrs` is no
//!   longer a field; `TupleDescAttr` (a pgrx shim for the C inline function) finds them.
//! * 16 made `get_guc_variables` return its length and dropped `GetNumConfigOptions`.
//! * 17 gave `RelationGetPrimaryKeyIndex` a `deferrable_ok` flag (false: a DEFERRABLE key is
//!   none, as on 15).
//! * 16 replaced `pg_class_ownercheck` by `object_ownercheck`.
//! * 18 renamed the backend's `pqsignal` to `pqsignal_be`, and pgrx's binding of `proc_exit`
//!   lost its `noreturn`.
//! * 18 gave `index_beginscan` an instrumentation argument (NULL: none).
//! * 17 replaced backend ids by proc numbers: a virtual transaction id names its process by
//!   `procNumber` (`ProcNumberGetProc`) where 15 has `backendId` (`BackendIdGetProc`).

use pgrx::pg_sys;

#[cfg(any(feature = "pg13", feature = "pg14", feature = "pg16", feature = "pg17"))]
compile_error!(
    "pg_fencing builds for PostgreSQL 15 and 18 only: features pg15 (the default) and pg18"
);

/// Attribute `index` (0-based) of `tupdesc`; panics (never reads out of bounds) if `index` is
/// not below `natts`.
///
/// # Safety
/// `tupdesc` must be a valid tuple descriptor that outlives the returned reference.
pub unsafe fn tuple_desc_attr<'a>(
    tupdesc: pg_sys::TupleDesc,
    index: usize,
) -> &'a pg_sys::FormData_pg_attribute {
    // SAFETY: per the contract `tupdesc` is valid for 'a; `index` is checked against `natts`
    // first. On 15 the attributes are the flexible array `attrs` of `natts` entries; on 18
    // `TupleDescAttr` returns the address of entry `index` of the array that follows the
    // compact attributes, inside the descriptor's allocation.
    unsafe {
        let natts = (*tupdesc).natts.max(0) as usize;
        assert!(
            index < natts,
            "attribute {index} of a descriptor of {natts}"
        );
        #[cfg(feature = "pg15")]
        {
            &(*tupdesc).attrs.as_slice(natts)[index]
        }
        #[cfg(feature = "pg18")]
        {
            &*pg_sys::TupleDescAttr(tupdesc, index as std::ffi::c_int)
        }
    }
}

/// The OID of `rel`'s primary key index (`InvalidOid`: none, or a DEFERRABLE one).
///
/// # Safety
/// `rel` must be an open relation.
pub unsafe fn primary_key_index(rel: pg_sys::Relation) -> pg_sys::Oid {
    // SAFETY: per the contract; reads the relation's relcache entry (its index list).
    unsafe {
        #[cfg(feature = "pg15")]
        {
            pg_sys::RelationGetPrimaryKeyIndex(rel)
        }
        #[cfg(feature = "pg18")]
        {
            pg_sys::RelationGetPrimaryKeyIndex(rel, false)
        }
    }
}

/// guc.c's array of GUC records and its length (NULL and 0 before GUCs exist).
///
/// # Safety
/// Main thread. The array may be reallocated by a later GUC definition: use it at once.
pub unsafe fn guc_variables() -> (*mut *mut pg_sys::config_generic, usize) {
    // SAFETY: per the contract; both calls only read guc.c's state (on 18 the length through the
    // out-parameter, a local).
    unsafe {
        #[cfg(feature = "pg15")]
        {
            (
                pg_sys::get_guc_variables(),
                pg_sys::GetNumConfigOptions().max(0) as usize,
            )
        }
        #[cfg(feature = "pg18")]
        {
            let mut n: std::ffi::c_int = 0;
            let vars = pg_sys::get_guc_variables(&mut n);
            (vars, n.max(0) as usize)
        }
    }
}

/// Install `handler` for signal `signo` in this backend (PostgreSQL's own `pqsignal`).
///
/// # Safety
/// Main thread, before the signal can arrive; `handler` must be safe to run as a signal handler.
pub unsafe fn set_signal_handler(
    signo: i32,
    handler: unsafe extern "C-unwind" fn(std::ffi::c_int),
) {
    // SAFETY: per the contract; pqsignal only records the handler.
    unsafe {
        #[cfg(feature = "pg15")]
        {
            pg_sys::pqsignal(signo, Some(handler));
        }
        #[cfg(feature = "pg18")]
        {
            pg_sys::pqsignal_be(signo, Some(handler));
        }
    }
}

/// `proc_exit`: runs the exit callbacks and ends the process.
///
/// # Safety
/// Main thread, with nothing left that needs dropping for correctness.
pub unsafe fn proc_exit(code: i32) -> ! {
    // SAFETY: per the contract; proc_exit never returns (pgrx's 18 binding only lacks the
    // attribute that says so).
    unsafe {
        pg_sys::proc_exit(code);
        #[allow(unreachable_code)]
        {
            unreachable!("proc_exit returned")
        }
    }
}

/// Does `user` own relation `relid` (or is a member of the owning role)?
pub fn owns_relation(relid: pg_sys::Oid, user: pg_sys::Oid) -> bool {
    // SAFETY: a catalog lookup by value on the main thread inside a transaction; a relation that
    // no longer exists makes it raise ERROR (a panic through pgrx's FFI guard), not UB.
    unsafe {
        #[cfg(feature = "pg15")]
        {
            pg_sys::pg_class_ownercheck(relid, user)
        }
        #[cfg(feature = "pg18")]
        {
            pg_sys::object_ownercheck(pg_sys::RelationRelationId, relid, user)
        }
    }
}

// Not in pgrx's bindings for 15 (storage/sinvaladt.h); called through pgrx's FFI guard.
// SAFETY: the signature is BackendIdGetProc's in storage/sinvaladt.h of PostgreSQL 15:
// PGPROC *BackendIdGetProc(int backendID).
#[cfg(feature = "pg15")]
unsafe extern "C-unwind" {
    fn BackendIdGetProc(backend_id: std::ffi::c_int) -> *mut pg_sys::PGPROC;
}

/// The latch of the process running virtual transaction `vxid` (as from `GetLockConflicts`),
/// as an address for `process::set_latch`; 0 if that process is gone.
///
/// # Safety
/// Main thread of a backend attached to shared memory.
pub unsafe fn latch_of(vxid: &pg_sys::VirtualTransactionId) -> usize {
    // SAFETY: per the contract; the lookup reads the shared process arrays by index (bounds
    // checked by PostgreSQL, NULL when out of range or unused), and PGPROC entries live in
    // shared memory for the server's life, so the latch's address stays valid.
    unsafe {
        #[cfg(feature = "pg15")]
        let proc =
            pg_sys::submodules::ffi::pg_guard_ffi_boundary(|| BackendIdGetProc(vxid.backendId));
        #[cfg(feature = "pg18")]
        let proc = pg_sys::ProcNumberGetProc(vxid.procNumber);
        if proc.is_null() {
            0
        } else {
            std::ptr::addr_of_mut!((*proc).procLatch) as usize
        }
    }
}

// Declared here, not taken from pgrx's bindings, for callers that make several calls under one
// `pg_guard_ffi_boundary` (each binding of pgrx sets up its own). The signatures are those of
// access/genam.h on each major.
// SAFETY: as stated, calls through them follow the C ABI.
unsafe extern "C-unwind" {
    #[cfg(feature = "pg15")]
    #[link_name = "index_beginscan"]
    fn index_beginscan_raw(
        heap: pg_sys::Relation,
        index: pg_sys::Relation,
        snapshot: pg_sys::Snapshot,
        nkeys: std::ffi::c_int,
        norderbys: std::ffi::c_int,
    ) -> pg_sys::IndexScanDesc;
    #[cfg(feature = "pg18")]
    #[link_name = "index_beginscan"]
    fn index_beginscan_raw(
        heap: pg_sys::Relation,
        index: pg_sys::Relation,
        snapshot: pg_sys::Snapshot,
        instrument: *mut pg_sys::IndexScanInstrumentation,
        nkeys: std::ffi::c_int,
        norderbys: std::ffi::c_int,
    ) -> pg_sys::IndexScanDesc;
}

/// `index_beginscan` without instrumentation, not guarded by pgrx: an ERROR jumps to the
/// caller's `pg_guard_ffi_boundary`.
///
/// # Safety
/// As `index_beginscan` (open relations, `index` an index of `heap`, a snapshot valid for the
/// scan, `nkeys` keys to come through `index_rescan`), called inside `pg_guard_ffi_boundary`
/// from frames that hold only plain values.
pub unsafe fn index_beginscan_unguarded(
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    nkeys: i32,
) -> pg_sys::IndexScanDesc {
    // SAFETY: per the contract; the two majors differ only in 18's instrumentation pointer,
    // which may be NULL.
    unsafe {
        #[cfg(feature = "pg15")]
        {
            index_beginscan_raw(heap, index, snapshot, nkeys, 0)
        }
        #[cfg(feature = "pg18")]
        {
            index_beginscan_raw(heap, index, snapshot, std::ptr::null_mut(), nkeys, 0)
        }
    }
}
