//! Point reads of pg_fencing's own tables through their unique indexes (the marks and
//! tombstones on every write), without SPI: open the table, scan the index with the latest
//! committed snapshot, read one bigint column.

use crate::backend_event::BackendEvent;
use pgrx::pg_sys;
use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::ffi::CStr;

/// A table of schema `_pg_fencing`, the unique index its reads go through, and the bigint column
/// they read.
pub struct UniqueIndex {
    pub table: &'static CStr,
    pub index: &'static CStr,
    pub value: &'static CStr,
}

/// Where a table of schema `_pg_fencing` lives: (table, unique index, attribute number of the
/// bigint value column).
#[derive(Clone, Copy)]
struct Located {
    heap: pg_sys::Oid,
    index: pg_sys::Oid,
    value_attnum: i32,
}

thread_local! {
    /// Per (table, index, value column) name, by the names' addresses (static strings: the same
    /// name at two addresses is only looked up twice); dropped on relcache invalidation
    /// (`forget_located`).
    static LOCATED: RefCell<FxHashMap<(usize, usize, usize), Located>> =
        RefCell::new(FxHashMap::default());
}

/// Relcache invalidation: the extension (and its tables) may have been dropped and re-created.
fn forget_located() {
    LOCATED.with(|m| m.borrow_mut().clear());
    ATTNUMS.with(|m| m.borrow_mut().clear());
}

fn locate(which: &UniqueIndex) -> Option<Located> {
    let key = (
        which.table.as_ptr() as usize,
        which.index.as_ptr() as usize,
        which.value.as_ptr() as usize,
    );
    if let Some(t) = LOCATED.with(|m| m.borrow().get(&key).copied()) {
        return Some(t);
    }
    // SAFETY: catalog lookups on the backend's main thread inside a transaction (every caller runs
    // in one: a trigger or a SQL function). The names are `&'static CStr`s (NUL-terminated, alive
    // for the call); get_namespace_oid with missing_ok = true and get_relname_relid return
    // InvalidOid rather than raising when a name is missing, and get_attnum returns
    // InvalidAttrNumber; any other ERROR becomes a Rust panic through pgrx's FFI guard.
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
        let value_attnum = pg_sys::get_attnum(heap, which.value.as_ptr()) as i32;
        if value_attnum <= 0 {
            return None;
        }
        Located {
            heap,
            index,
            value_attnum,
        }
    };
    LOCATED.with(|m| m.borrow_mut().insert(key, t));
    Some(t)
}

/// Equality scan keys for `keys` ((table attribute number, equality function, value) per
/// column) on a table with descriptor `tupdesc`, with each column's collation. `ordered`: for
/// systable_beginscan_ordered, whose keys name index columns (the leading ones, in order);
/// otherwise they name table columns, as systable_beginscan maps them.
///
/// # Safety
/// `tupdesc` must be the table's descriptor, valid for the call, and every attribute number one
/// of its columns; the values must outlive the scan.
unsafe fn equality_keys(
    tupdesc: pg_sys::TupleDesc,
    keys: &[(i16, u32, pg_sys::Datum)],
    ordered: bool,
) -> Vec<pg_sys::ScanKeyData> {
    keys.iter()
        .enumerate()
        .map(|(i, (attno, proc_, value))| {
            // SAFETY: per the contract; an all-zero ScanKeyData (plain C data) is a valid blank
            // for ScanKeyEntryInitialize, which fills it.
            unsafe {
                let collation =
                    crate::pg::compat::tuple_desc_attr(tupdesc, (*attno - 1) as usize).attcollation;
                let mut key = std::mem::zeroed::<pg_sys::ScanKeyData>();
                pg_sys::ScanKeyEntryInitialize(
                    &mut key,
                    0,
                    if ordered {
                        (i + 1) as pg_sys::AttrNumber
                    } else {
                        *attno
                    },
                    pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
                    pg_sys::Oid::INVALID,
                    collation,
                    pg_sys::Oid::from(*proc_),
                    *value,
                );
                key
            }
        })
        .collect()
}

/// Scan the index of `which` for the rows whose key columns equal `keys` ((attribute number,
/// equality function, value) per column) with the latest committed snapshot, calling `each`
/// with every tuple, the table's descriptor and the value column's attribute number until it
/// returns false. `None` if the table cannot be found this way.
fn scan(
    which: &UniqueIndex,
    keys: &[(i16, u32, pg_sys::Datum)],
    each: impl FnMut(pg_sys::HeapTuple, pg_sys::TupleDesc, i32) -> bool,
) -> Option<()> {
    scan_from(which, keys, None, each)
}

/// As [`scan`], and with `from` ((table attribute number, `>=` function, value)) only the rows
/// whose column is at least that value, in the index's order (a B-tree whose column after the
/// equality keys' is that one).
fn scan_from(
    which: &UniqueIndex,
    keys: &[(i16, u32, pg_sys::Datum)],
    from: Option<(i16, u32, pg_sys::Datum)>,
    mut each: impl FnMut(pg_sys::HeapTuple, pg_sys::TupleDesc, i32) -> bool,
) -> Option<()> {
    let t = locate(which)?;
    // SAFETY: backend main thread, inside a transaction (as for `locate`). `t.heap` and `t.index`
    // were looked up together by name in schema `_pg_fencing` and are dropped from the cache on any
    // relcache invalidation, so the index belongs to the table (a vanished OID makes table_open or
    // systable_beginscan raise ERROR, which pgrx's FFI guard turns into a panic, not UB). The
    // relation, its tuple descriptor and every tuple returned stay valid until systable_endscan and
    // table_close below (the lock is kept to the end of the transaction, NoLock on close); `each`
    // gets them only for the call. `tuple_desc_attr` is bounds-checked; systable_beginscan maps our
    // heap attribute numbers to index columns and raises ERROR for a column not in the index. The
    // scan keys and their datums (e.g. a text palloc'd in the current memory context by
    // `text_datum`) outlive the scan. The snapshot is registered before use and unregistered
    // after; if an ERROR escapes, the resource owner releases snapshot, scan and lock at abort. An
    // all-zero ScanKeyData (plain C data) is a valid blank for ScanKeyEntryInitialize.
    unsafe {
        let heap = pg_sys::table_open(t.heap, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let tupdesc = (*heap).rd_att;
        let mut scankeys = equality_keys(tupdesc, keys, false);
        if let Some((attno, proc_, value)) = from {
            let mut key = equality_keys(tupdesc, &[(attno, proc_, value)], false)
                .pop()
                .unwrap_or_else(|| std::mem::zeroed());
            key.sk_strategy = pg_sys::BTGreaterEqualStrategyNumber as pg_sys::StrategyNumber;
            scankeys.push(key);
        }
        let snapshot = pg_sys::RegisterSnapshot(crate::pg::process::latest_snapshot());
        let scan = pg_sys::systable_beginscan(
            heap,
            t.index,
            true,
            snapshot,
            scankeys.len() as i32,
            scankeys.as_mut_ptr(),
        );
        loop {
            let tuple = pg_sys::systable_getnext(scan);
            if tuple.is_null() || !each(tuple, tupdesc, t.value_attnum) {
                break;
            }
        }
        pg_sys::systable_endscan(scan);
        pg_sys::UnregisterSnapshot(snapshot);
        pg_sys::table_close(heap, pg_sys::NoLock as pg_sys::LOCKMODE);
        Some(())
    }
}

/// Read the value column of the row whose key columns equal `keys` ((attribute number, equality
/// function, value) per column), straight through the table's unique index with the latest
/// committed snapshot: the same answer as a `SELECT` through SPI, without the round trip.
/// `None` if the table cannot be found this way (the caller then runs its `SELECT`);
/// `Some(None)` if there is no such row.
pub fn read_by_index(
    which: &UniqueIndex,
    keys: &[(i16, u32, pg_sys::Datum)],
) -> Option<Option<i64>> {
    let mut found = None;
    scan(which, keys, |tuple, tupdesc, value_attnum| {
        let mut isnull = false;
        // SAFETY: `tuple` is a tuple of `tupdesc` and `value_attnum` one of its attributes
        // (`scan`); a bigint is read by value.
        let d = unsafe { pg_sys::heap_getattr(tuple, value_attnum, tupdesc, &mut isnull) };
        if !isnull {
            found = Some(d.value() as i64);
        }
        false
    })?;
    Some(found)
}

/// An upper bound of the value column over the rows whose leading index columns equal `keys`
/// (as for [`read_by_index`], an index of `which` whose next column is the value column), read from the index alone: the last entry in the index's order,
/// whatever the visibility of its row. An entry of a row not yet committed, of an aborted or of a
/// dead one counts; the index holds an entry of every row, so the answer is never below the
/// highest committed value (it may be above it). No heap access, no snapshot: the table and the
/// index are locked (AccessShareLock), nothing of the table is read. `None` if
/// the index cannot be read this way (missing, not valid, not a B-tree of the table, partial, or
/// its next column is not the value column, ascending in the integer operator family);
/// `Some(None)` if there is no entry.
pub fn upper_bound_by_index(
    which: &UniqueIndex,
    keys: &[(i16, u32, pg_sys::Datum)],
) -> Option<Option<i64>> {
    let t = locate(which)?;
    if keys.len() >= MAX_BOUND_KEYS {
        return None;
    }
    let mut attnos = [0i16; MAX_BOUND_KEYS];
    let mut procs = [pg_sys::Oid::INVALID; MAX_BOUND_KEYS];
    let mut values = [pg_sys::Datum::from(0usize); MAX_BOUND_KEYS];
    for (i, (attno, proc_, value)) in keys.iter().enumerate() {
        attnos[i] = *attno;
        procs[i] = pg_sys::Oid::from(*proc_);
        values[i] = *value;
    }
    let read = IndexRead {
        heap: t.heap,
        index: t.index,
        value_attnum: t.value_attnum,
        nkeys: keys.len(),
        attnos,
        procs,
        values,
    };
    // SAFETY: `read` holds plain values only, and `last_entry` makes its PostgreSQL calls
    // (unguarded) from a frame that holds only plain values, so an ERROR may jump over it to the
    // boundary, which turns it into a Rust panic (see `last_entry` for the calls themselves).
    match unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| last_entry(&read)) } {
        Bound::NotReadable => None,
        Bound::Empty => Some(None),
        Bound::Entry(v) => Some(Some(v)),
    }
}

/// At most this many leading key columns in [`upper_bound_by_index`] (its arrays' length).
const MAX_BOUND_KEYS: usize = 4;

/// What [`upper_bound_by_index`] reads, as plain values.
#[derive(Clone, Copy)]
struct IndexRead {
    heap: pg_sys::Oid,
    index: pg_sys::Oid,
    value_attnum: i32,
    nkeys: usize,
    attnos: [i16; MAX_BOUND_KEYS],
    procs: [pg_sys::Oid; MAX_BOUND_KEYS],
    values: [pg_sys::Datum; MAX_BOUND_KEYS],
}

#[derive(Clone, Copy)]
enum Bound {
    NotReadable,
    Empty,
    Entry(i64),
}

// Declared here, not taken from pgrx's bindings, so that [`last_entry`]'s calls share one
// `pg_guard_ffi_boundary` instead of setting up one each. The signatures are those of
// utils/rel.h, utils/relcache.h, access/genam.h, access/itup.h and access/skey.h.
// SAFETY: as stated, calls through them follow the C ABI.
unsafe extern "C-unwind" {
    #[link_name = "LockRelationOid"]
    fn lock_relation_oid_raw(relation: pg_sys::Oid, lockmode: pg_sys::LOCKMODE);
    #[link_name = "RelationGetIndexPredicate"]
    fn relation_get_index_predicate_raw(relation: pg_sys::Relation) -> *mut pg_sys::List;
    #[link_name = "index_open"]
    fn index_open_raw(relation: pg_sys::Oid, lockmode: pg_sys::LOCKMODE) -> pg_sys::Relation;
    #[link_name = "index_close"]
    fn index_close_raw(relation: pg_sys::Relation, lockmode: pg_sys::LOCKMODE);
    #[link_name = "RelationIdGetRelation"]
    fn relation_id_get_relation_raw(relation: pg_sys::Oid) -> pg_sys::Relation;
    #[link_name = "RelationClose"]
    fn relation_close_raw(relation: pg_sys::Relation);
    #[link_name = "index_rescan"]
    fn index_rescan_raw(
        scan: pg_sys::IndexScanDesc,
        keys: pg_sys::ScanKey,
        nkeys: std::ffi::c_int,
        orderbys: pg_sys::ScanKey,
        norderbys: std::ffi::c_int,
    );
    #[link_name = "index_getnext_tid"]
    fn index_getnext_tid_raw(
        scan: pg_sys::IndexScanDesc,
        direction: pg_sys::ScanDirection::Type,
    ) -> pg_sys::ItemPointer;
    #[link_name = "index_endscan"]
    fn index_endscan_raw(scan: pg_sys::IndexScanDesc);
    #[link_name = "index_deform_tuple"]
    fn index_deform_tuple_raw(
        tuple: pg_sys::IndexTuple,
        desc: pg_sys::TupleDesc,
        values: *mut pg_sys::Datum,
        isnull: *mut bool,
    );
    #[link_name = "ScanKeyEntryInitialize"]
    fn scan_key_entry_initialize_raw(
        entry: pg_sys::ScanKey,
        flags: std::ffi::c_int,
        attno: pg_sys::AttrNumber,
        strategy: pg_sys::StrategyNumber,
        subtype: pg_sys::Oid,
        collation: pg_sys::Oid,
        procedure: pg_sys::RegProcedure,
        argument: pg_sys::Datum,
    );
}

/// The body of [`upper_bound_by_index`]: the last entry of `read.index` whose leading columns
/// equal the keys, whatever its row's visibility.
///
/// # Safety
/// Only inside `pg_guard_ffi_boundary`, on the backend's main thread inside a transaction: every
/// call below is unguarded and this frame holds plain values only.
unsafe fn last_entry(read: &IndexRead) -> Bound {
    // SAFETY: the table, then the index, are locked with AccessShareLock (kept to the end of
    // the transaction; table first, the order of every other reader, so that a later read of the
    // table in this transaction cannot deadlock against VACUUM FULL or TRUNCATE of it) before
    // anything of the index is read; the heap's relcache entry is pinned by
    // RelationIdGetRelation only for index_beginscan, which reads its table access method (the
    // heap's, fixed for the relation's life) and is closed after the scan; no heap tuple is
    // fetched. The index must be a valid, live B-tree of this table without a predicate, whose
    // value column is ascending in the integer operator family (then its last entry in a
    // backward scan is its highest). Column positions are checked against the index's `indkey`
    // before a key or an entry is read (`nkeys` key columns, then the value column, within
    // `indnkeyatts`; an expression column has 0 there); `rd_indoption` and `rd_opfamily` have
    // `indnkeyatts` entries; each scan key
    // names an index column (1-based) with the index's collation for it. SnapshotAny makes the
    // scan return every entry (killed ones, dead to everyone, excepted); with `xs_want_itup` set,
    // the B-tree returns each entry's index tuple in `xs_itup` described by `xs_itupdesc` (at
    // most INDEX_MAX_KEYS columns, checked: the arrays index_deform_tuple fills are that long),
    // valid until the next call; the bigint is read by value. An ERROR (a vanished OID) jumps to
    // the caller's boundary; the resource owner releases the lock, pin and scan at abort.
    unsafe {
        lock_relation_oid_raw(read.heap, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let index = index_open_raw(read.index, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let form = (*index).rd_index;
        let nkey = usize::try_from((*form).indnkeyatts).unwrap_or(0);
        let indkey = (*form).indkey.values.as_slice(nkey);
        // An index that is not valid (a failed CREATE INDEX CONCURRENTLY, one being rebuilt by
        // REINDEX CONCURRENTLY) may lack entries: not read.
        let mut fits = (*form).indisvalid
            && (*form).indislive
            && (*form).indrelid == read.heap
            && (*(*index).rd_rel).relam == pg_sys::BTREE_AM_OID
            && read.nkeys < nkey
            && indkey[read.nkeys] as i32 == read.value_attnum
            && *(*index).rd_indoption.add(read.nkeys) as u32 & pg_sys::INDOPTION_DESC == 0
            && *(*index).rd_opfamily.add(read.nkeys) == pg_sys::INTEGER_BTREE_FAM_OID
            && relation_get_index_predicate_raw(index).is_null();
        fits = fits
            && indkey
                .iter()
                .zip(&read.attnos)
                .take(read.nkeys)
                .all(|(k, a)| k == a);
        if !fits {
            index_close_raw(index, pg_sys::NoLock as pg_sys::LOCKMODE);
            return Bound::NotReadable;
        }
        // An all-zero ScanKeyData (plain C data) is a valid blank for ScanKeyEntryInitialize.
        let mut scankeys = [std::mem::zeroed::<pg_sys::ScanKeyData>(); MAX_BOUND_KEYS];
        for (i, key) in scankeys.iter_mut().enumerate().take(read.nkeys) {
            scan_key_entry_initialize_raw(
                key,
                0,
                (i + 1) as pg_sys::AttrNumber,
                pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
                pg_sys::Oid::INVALID,
                *(*index).rd_indcollation.add(i),
                read.procs[i],
                read.values[i],
            );
        }
        let heap = relation_id_get_relation_raw(read.heap);
        if heap.is_null() {
            index_close_raw(index, pg_sys::NoLock as pg_sys::LOCKMODE);
            return Bound::NotReadable;
        }
        let scan = crate::pg::compat::index_beginscan_unguarded(
            heap,
            index,
            &raw mut pg_sys::SnapshotAnyData,
            read.nkeys as i32,
        );
        (*scan).xs_want_itup = true;
        index_rescan_raw(
            scan,
            scankeys.as_mut_ptr(),
            read.nkeys as i32,
            std::ptr::null_mut(),
            0,
        );
        let tid = index_getnext_tid_raw(scan, pg_sys::ScanDirection::BackwardScanDirection);
        let itupdesc = (*scan).xs_itupdesc;
        let mut found = Bound::Empty;
        if !tid.is_null()
            && !(*scan).xs_itup.is_null()
            && !itupdesc.is_null()
            && (*itupdesc).natts as usize <= pg_sys::INDEX_MAX_KEYS as usize
        {
            let mut values = [pg_sys::Datum::from(0usize); pg_sys::INDEX_MAX_KEYS as usize];
            let mut nulls = [true; pg_sys::INDEX_MAX_KEYS as usize];
            index_deform_tuple_raw(
                (*scan).xs_itup,
                itupdesc,
                values.as_mut_ptr(),
                nulls.as_mut_ptr(),
            );
            if !nulls[read.nkeys] {
                found = Bound::Entry(values[read.nkeys].value() as i64);
            }
        }
        index_endscan_raw(scan);
        relation_close_raw(heap);
        index_close_raw(index, pg_sys::NoLock as pg_sys::LOCKMODE);
        found
    }
}

thread_local! {
    /// Attribute numbers by (table, column name) of pg_fencing's own tables; dropped with the
    /// locations (`forget_located`).
    static ATTNUMS: RefCell<FxHashMap<(pg_sys::Oid, &'static CStr), i16>> =
        RefCell::new(FxHashMap::default());
}

fn attnum_of(heap: pg_sys::Oid, name: &'static CStr) -> i16 {
    if let Some(a) = ATTNUMS.with(|m| m.borrow().get(&(heap, name)).copied()) {
        return a;
    }
    // SAFETY: a syscache lookup by OID and NUL-terminated name (InvalidAttrNumber if missing),
    // main thread inside a transaction.
    let a = unsafe { pg_sys::get_attnum(heap, name.as_ptr()) };
    ATTNUMS.with(|m| m.borrow_mut().insert((heap, name), a));
    a
}

/// Does an index predicate (an implicitly ANDed list) hold for a row whose columns are NULL
/// where `nulls` says, if every clause is `column IS [NOT] NULL`? `None` for any other
/// predicate (the caller evaluates it).
///
/// # Safety
/// `predicate` must be NULL or an index's predicate list (BuildIndexInfo's `ii_Predicate`).
unsafe fn null_tests(predicate: *mut pg_sys::List, nulls: &[bool]) -> Option<bool> {
    // SAFETY: per the contract, a List of expression nodes; each node's tag is read before it
    // is treated as a NullTest, and a NullTest's `arg` before it is treated as a Var.
    unsafe {
        let mut holds = true;
        for node in pgrx::PgList::<pg_sys::Node>::from_pg(predicate).iter_ptr() {
            if (*node).type_ != pg_sys::NodeTag::T_NullTest {
                return None;
            }
            let test = node.cast::<pg_sys::NullTest>();
            let arg = (*test).arg.cast::<pg_sys::Node>();
            if arg.is_null() || (*arg).type_ != pg_sys::NodeTag::T_Var || (*test).argisrow {
                return None;
            }
            let attno = (*arg.cast::<pg_sys::Var>()).varattno;
            let is_null = *nulls.get(usize::try_from(attno).ok()?.checked_sub(1)?)?;
            holds &= match (*test).nulltesttype {
                pg_sys::NullTestType::IS_NULL => is_null,
                pg_sys::NullTestType::IS_NOT_NULL => !is_null,
                _ => return None,
            };
        }
        Some(holds)
    }
}

/// Insert a row into the table of `which` (a table of schema `_pg_fencing`) straight into its
/// heap and each of its indexes, as `INSERT` would without its executor: `columns` gives a
/// value (`None`: NULL) by column name; every other column must be nullable without a default.
/// The unique indexes are written first, without waiting or raising: if one already holds an
/// entry for the same key that is not dead (committed, or written by a transaction still
/// running), the row is deleted again and false returned; the caller then runs its `INSERT …
/// ON CONFLICT`, which waits for such a writer and updates the existing row. The row is visible
/// to the transaction's later reads (command counter advanced).
///
/// Nothing is written (false) where this could differ from `INSERT`: the table cannot be found
/// this way, a column is unknown, missing or NOT NULL without a value; an INSERT trigger would
/// fire; the table has a CHECK constraint other than `allowed_check` (which the caller's values
/// meet); an index has expressions or a predicate other than NULL tests of columns; or
/// `probe_first` and the primary key already has a live entry for the row's key (for
/// `wal_level = logical`: logical decoding would send the insert and delete of a row that
/// met a conflict to a subscriber of the table, where `INSERT … ON CONFLICT` sends an update).
pub fn insert_direct(
    which: &UniqueIndex,
    columns: &[(&'static CStr, Option<pg_sys::Datum>)],
    allowed_check: &CStr,
    probe_first: &dyn Fn() -> bool,
) -> bool {
    let Some(t) = locate(which) else {
        return false;
    };
    // SAFETY: backend main thread inside a transaction (as for `locate`); `t.heap` is a table of
    // schema `_pg_fencing` (a vanished OID makes table_open raise ERROR). The table and each of
    // its indexes are opened and locked as INSERT would (RowExclusiveLock, kept to the end of the
    // transaction), so their descriptors (tuple, trigger, constraint, index) stay valid until
    // closed here. The value arrays have `natts` entries and each given datum is of its column's
    // type (the caller's values, alive for the call). The tuple is formed in the current memory
    // context and inserted by simple_heap_insert (WAL-logged, raising ERROR rather than failing
    // silently). Index values of plain columns are the row's own, as FormIndexDatum copies them;
    // index_insert gets arrays of INDEX_MAX_KEYS entries and the index's IndexInfo.
    unsafe {
        let heap = pg_sys::table_open(t.heap, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE);
        // Small fixed arrays (pg_fencing's tables have a few columns and indexes; a table with
        // more is left to INSERT).
        const MAX_COLUMNS: usize = 16;
        const MAX_INDEXES: usize = 8;
        let null_index: (pg_sys::Relation, *mut pg_sys::IndexInfo) =
            (std::ptr::null_mut(), std::ptr::null_mut());
        let mut opened = [null_index; MAX_INDEXES];
        let mut n_opened = 0;
        let give_up = |heap, opened: &[(pg_sys::Relation, *mut pg_sys::IndexInfo)]| {
            for &(index, _) in opened {
                pg_sys::index_close(index, pg_sys::NoLock as pg_sys::LOCKMODE);
            }
            pg_sys::table_close(heap, pg_sys::NoLock as pg_sys::LOCKMODE);
            false
        };
        // Triggers that would fire for an INSERT in this session: leave it to INSERT.
        let td = (*heap).trigdesc;
        if !td.is_null() && !(*td).triggers.is_null() {
            let replica = pg_sys::SessionReplicationRole
                == pg_sys::SESSION_REPLICATION_ROLE_REPLICA as std::ffi::c_int;
            let fires =
                std::slice::from_raw_parts((*td).triggers, (*td).numtriggers.max(0) as usize)
                    .iter()
                    .any(|tg| {
                        let enabled = tg.tgenabled as u8;
                        (tg.tgtype as u32) & pg_sys::TRIGGER_TYPE_INSERT != 0
                            && enabled != pg_sys::TRIGGER_DISABLED
                            && (enabled == pg_sys::TRIGGER_FIRES_ALWAYS
                                || (enabled == pg_sys::TRIGGER_FIRES_ON_REPLICA) == replica)
                    });
            if fires {
                return give_up(heap, &opened[..n_opened]);
            }
        }
        let tupdesc = (*heap).rd_att;
        // CHECK constraints: only the one the caller's values are known to meet.
        let constr = (*tupdesc).constr;
        if !constr.is_null() && (*constr).num_check > 0 {
            let checks = std::slice::from_raw_parts((*constr).check, (*constr).num_check as usize);
            if checks
                .iter()
                .any(|c| CStr::from_ptr(c.ccname) != allowed_check)
            {
                return give_up(heap, &opened[..n_opened]);
            }
        }
        let natts = (*tupdesc).natts.max(0) as usize;
        if natts > MAX_COLUMNS {
            return give_up(heap, &opened[..n_opened]);
        }
        let mut values = [pg_sys::Datum::from(0usize); MAX_COLUMNS];
        let mut nulls = [true; MAX_COLUMNS];
        let mut given = [false; MAX_COLUMNS];
        for (name, value) in columns {
            let a = attnum_of(t.heap, name);
            if a <= 0 || a as usize > natts {
                return give_up(heap, &opened[..n_opened]);
            }
            let i = a as usize - 1;
            values[i] = value.unwrap_or(pg_sys::Datum::from(0usize));
            nulls[i] = value.is_none();
            given[i] = true;
        }
        for (i, g) in given[..natts].iter().enumerate() {
            let att = crate::pg::compat::tuple_desc_attr(tupdesc, i);
            let unset = !g && (att.attnotnull || att.atthasdef);
            if !att.attisdropped && (unset || (nulls[i] && att.attnotnull)) {
                return give_up(heap, &opened[..n_opened]);
            }
        }
        // The indexes, and which of them take the row, decided before anything is written.
        let indexes = pg_sys::RelationGetIndexList(heap);
        for oid in pgrx::PgList::<pg_sys::Oid>::from_pg(indexes).iter_oid() {
            if n_opened == MAX_INDEXES {
                pg_sys::list_free(indexes);
                return give_up(heap, &opened[..n_opened]);
            }
            let index = pg_sys::index_open(oid, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE);
            opened[n_opened] = (index, pg_sys::BuildIndexInfo(index));
            n_opened += 1;
        }
        pg_sys::list_free(indexes);
        let mut wanted = [(std::ptr::null_mut(), std::ptr::null_mut(), false); MAX_INDEXES];
        let mut n_wanted = 0;
        for &(index, info) in &opened[..n_opened] {
            if !(*info).ii_Expressions.is_null() {
                return give_up(heap, &opened[..n_opened]);
            }
            let Some(holds) = null_tests((*info).ii_Predicate, &nulls) else {
                return give_up(heap, &opened[..n_opened]);
            };
            if (*info).ii_ReadyForInserts && holds {
                wanted[n_wanted] = (index, info, (*(*index).rd_index).indisunique);
                n_wanted += 1;
            }
        }
        if probe_first() {
            return give_up(heap, &opened[..n_opened]);
        }
        // Unique indexes first (a conflict found there leaves the others untouched).
        wanted[..n_wanted].sort_by_key(|w: &(pg_sys::Relation, *mut pg_sys::IndexInfo, bool)| !w.2);
        let tuple = pg_sys::heap_form_tuple(tupdesc, values.as_mut_ptr(), nulls.as_mut_ptr());
        pg_sys::simple_heap_insert(heap, tuple);
        let mut conflict = false;
        for &(index, info, unique) in &wanted[..n_wanted] {
            let mut ivalues = [pg_sys::Datum::from(0usize); pg_sys::INDEX_MAX_KEYS as usize];
            let mut inulls = [false; pg_sys::INDEX_MAX_KEYS as usize];
            let n = ((*info).ii_NumIndexAttrs.max(0) as usize).min(ivalues.len());
            for i in 0..n {
                let attno = (*info).ii_IndexAttrNumbers[i] as usize;
                ivalues[i] = values[attno - 1];
                inulls[i] = nulls[attno - 1];
            }
            // UNIQUE_CHECK_PARTIAL: the entry is made, and false returned instead of an error
            // (or a wait) if another entry for the key may be live.
            let check = if unique {
                pg_sys::IndexUniqueCheck::UNIQUE_CHECK_PARTIAL
            } else {
                pg_sys::IndexUniqueCheck::UNIQUE_CHECK_NO
            };
            let alone = pg_sys::index_insert(
                index,
                ivalues.as_mut_ptr(),
                inulls.as_mut_ptr(),
                &mut (*tuple).t_self,
                heap,
                check,
                false,
                info,
            );
            if unique && !alone {
                conflict = true;
                break;
            }
        }
        // The row must be visible to this transaction's later reads, and (to be deleted again)
        // to this command.
        pg_sys::CommandCounterIncrement();
        if conflict {
            // Dead at once: its index entries point to a row no snapshot sees.
            pg_sys::simple_heap_delete(heap, &mut (*tuple).t_self);
            pg_sys::CommandCounterIncrement();
        }
        pg_sys::heap_freetuple(tuple);
        give_up(heap, &opened[..n_opened]);
        !conflict
    }
}

/// The attribute number of column `name` of the table of `which`.
pub fn column_number(which: &UniqueIndex, name: &CStr) -> Option<i16> {
    let t = locate(which)?;
    // SAFETY: a syscache lookup by OID and NUL-terminated name (InvalidAttrNumber if missing),
    // main thread inside a transaction.
    let a = unsafe { pg_sys::get_attnum(t.heap, name.as_ptr()) };
    (a > 0).then_some(a)
}

/// Is the table and index of `which` there (in the schema the library serves)?
pub fn exists(which: &UniqueIndex) -> bool {
    locate(which).is_some()
}

/// Every row whose index columns equal `keys` (as for [`read_by_index`]), as (bigint columns
/// `a` and `b`, the bigint value column); rows with a NULL are skipped. `None` if the table,
/// index or a column cannot be found.
pub fn read_triples_by_index(
    which: &UniqueIndex,
    a: &CStr,
    b: &CStr,
    keys: &[(i16, u32, pg_sys::Datum)],
) -> Option<Vec<(i64, i64, i64)>> {
    let a_attnum = i32::from(column_number(which, a)?);
    let b_attnum = i32::from(column_number(which, b)?);
    let mut out = Vec::new();
    scan(which, keys, |tuple, tupdesc, value_attnum| {
        let (mut null_a, mut null_b, mut null_v) = (false, false, false);
        // SAFETY: `tuple` is a tuple of `tupdesc` with bigint attributes `a_attnum`, `b_attnum`
        // and `value_attnum` (`scan`), read by value.
        unsafe {
            let x = pg_sys::heap_getattr(tuple, a_attnum, tupdesc, &mut null_a);
            let y = pg_sys::heap_getattr(tuple, b_attnum, tupdesc, &mut null_b);
            let v = pg_sys::heap_getattr(tuple, value_attnum, tupdesc, &mut null_v);
            if !null_a && !null_b && !null_v {
                out.push((x.value() as i64, y.value() as i64, v.value() as i64));
            }
        }
        true
    })?;
    Some(out)
}

/// What [`first_row_holds`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    No,
    /// The row holds it; the value its `values` column has at that position (`None`: that
    /// column is NULL, or its element is).
    Yes(Option<i64>),
}

/// For each of `probes` (equality keys on the leading index columns of `which`): does the first
/// row (in the index's order) with those keys hold `text` at a position where its `bigint[]`
/// column `hashes` holds `hash` (a sorted array, its `text[]` column `texts` of the same length,
/// its `bigint[]` column `values` of that length or NULL)? A tombstone run's chunks
/// (`state/tombstone_runs.rs`): the table is opened and the latest committed snapshot taken once
/// for all of them, and a row's texts are read only when its hashes hold `hash`. `None` if the
/// table, index or a column cannot be found.
#[allow(clippy::too_many_arguments)]
pub fn first_rows_hold(
    which: &UniqueIndex,
    probes: &[Vec<(i16, u32, pg_sys::Datum)>],
    hashes: &CStr,
    texts: &CStr,
    values: &CStr,
    hash: i64,
    text: &str,
) -> Option<Vec<Held>> {
    let t = locate(which)?;
    let hashes_attnum = i32::from(column_number(which, hashes)?);
    let texts_attnum = i32::from(column_number(which, texts)?);
    let values_attnum = i32::from(column_number(which, values)?);
    let mut out = Vec::with_capacity(probes.len());
    // SAFETY: as in `scan_from` (the same calls, the table opened and the snapshot registered
    // once around every probe's systable scan, each scan ended before the next begins). A tuple
    // is used only inside its scan; see `chunk_holds` for how it is read.
    unsafe {
        let heap = pg_sys::table_open(t.heap, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let tupdesc = (*heap).rd_att;
        let snapshot = pg_sys::RegisterSnapshot(crate::pg::process::latest_snapshot());
        for keys in probes {
            let mut scankeys = equality_keys(tupdesc, keys, false);
            let scan = pg_sys::systable_beginscan(
                heap,
                t.index,
                true,
                snapshot,
                scankeys.len() as i32,
                scankeys.as_mut_ptr(),
            );
            let tuple = pg_sys::systable_getnext(scan);
            let held = if tuple.is_null() {
                Held::No
            } else {
                chunk_holds(
                    tuple,
                    tupdesc,
                    (hashes_attnum, texts_attnum, values_attnum),
                    hash,
                    text,
                )
            };
            pg_sys::systable_endscan(scan);
            out.push(held);
        }
        pg_sys::UnregisterSnapshot(snapshot);
        pg_sys::table_close(heap, pg_sys::NoLock as pg_sys::LOCKMODE);
    }
    Some(out)
}

/// Does chunk `tuple` hold `text` with `hash` (see [`first_rows_hold`]); `attnums`: its
/// hashes, texts and values columns.
///
/// # Safety
/// `tuple` must be a valid tuple of `tupdesc`, whose attributes `attnums` are a bigint[], a
/// text[] and a bigint[]. Each is detoasted (a copy in the current memory context when it was
/// toasted or had a short header); a one-dimensional bigint[] without NULLs is read in place
/// (its elements follow the header, the dimensions and the lower bounds, MAXALIGNed), any other
/// with deconstruct_array, which returns as many datums and NULL flags as it says; a text element
/// datum points into the detoasted array, alive until the end of this call.
unsafe fn chunk_holds(
    tuple: pg_sys::HeapTuple,
    tupdesc: pg_sys::TupleDesc,
    attnums: (i32, i32, i32),
    hash: i64,
    text: &str,
) -> Held {
    let (hashes_attnum, texts_attnum, values_attnum) = attnums;
    // SAFETY: per the contract.
    unsafe {
        let mut null_h = false;
        let h = pg_sys::heap_getattr(tuple, hashes_attnum, tupdesc, &mut null_h);
        // A chunk that cannot be read as written (NULL arrays, lengths that differ) may hold the
        // key: it counts as holding it, on the safe side (a refusal, not a tombstone lost).
        if null_h {
            return Held::Yes(None);
        }
        let hv = int8_elements(h);
        let first = hv.partition_point(|v| v.is_some_and(|v| v < hash));
        let candidates: Vec<usize> = (first..hv.len())
            .take_while(|i| hv[*i] == Some(hash))
            .collect();
        if candidates.is_empty() {
            return Held::No;
        }
        let mut null_t = false;
        let t = pg_sys::heap_getattr(tuple, texts_attnum, tupdesc, &mut null_t);
        if null_t {
            return Held::Yes(None);
        }
        let (tv, tn) = deconstruct(t, pg_sys::TEXTOID, -1, false, b'i');
        if tv.len() != hv.len() {
            return Held::Yes(None);
        }
        for i in candidates {
            if tn[i] {
                return Held::Yes(None);
            }
            let v = pg_sys::pg_detoast_datum_packed(tv[i].cast_mut_ptr());
            let bytes = std::slice::from_raw_parts(
                pgrx::varlena::vardata_any(v.cast()).cast::<u8>(),
                pgrx::varlena::varsize_any_exhdr(v.cast()),
            );
            if bytes == text.as_bytes() {
                let mut null_v = false;
                let v = pg_sys::heap_getattr(tuple, values_attnum, tupdesc, &mut null_v);
                let value = if null_v {
                    None
                } else {
                    int8_elements(v).get(i).copied().flatten()
                };
                return Held::Yes(value);
            }
        }
        Held::No
    }
}

/// The elements of bigint[] datum `d` (`None` for a NULL element).
///
/// # Safety
/// `d` must be a non-NULL bigint[] datum.
unsafe fn int8_elements(d: pg_sys::Datum) -> Vec<Option<i64>> {
    // SAFETY: per the contract. The detoasted array starts with ArrayType's header (length,
    // ndim, dataoffset, element type); with one dimension and no NULL bitmap (dataoffset 0) its
    // elements follow the header, one dimension and one lower bound, MAXALIGNed (ARR_DATA_PTR),
    // as many as the dimension says.
    unsafe {
        let arr = pg_sys::pg_detoast_datum(d.cast_mut_ptr()).cast::<pg_sys::ArrayType>();
        if (*arr).ndim == 1 && (*arr).dataoffset == 0 && (*arr).elemtype == pg_sys::INT8OID {
            let header = std::mem::size_of::<pg_sys::ArrayType>() + 2 * std::mem::size_of::<i32>();
            let dims = arr
                .cast::<u8>()
                .add(std::mem::size_of::<pg_sys::ArrayType>())
                .cast::<i32>();
            let n = (*dims).max(0) as usize;
            let data = arr
                .cast::<u8>()
                .add(header.next_multiple_of(8))
                .cast::<i64>();
            return std::slice::from_raw_parts(data, n)
                .iter()
                .map(|v| Some(*v))
                .collect();
        }
        let (vv, vn) = deconstruct(d, pg_sys::INT8OID, 8, true, b'd');
        vv.iter()
            .zip(vn.iter())
            .map(|(v, n)| (!n).then_some(v.value() as i64))
            .collect()
    }
}

/// Every entry of the rows of `which` whose index columns equal `keys`: (hash, text, value) from
/// the rows' parallel `bigint[]` column `hashes`, `text[]` column `texts` and `bigint[]` column
/// `values` (`None` where that column is NULL or its element is). A tombstone run's chunks
/// (`state/tombstone_runs.rs`, a merge). `None` if the table, index or a column cannot be found,
/// or a row's arrays cannot be read so (NULL hashes or texts, lengths that differ, a NULL text).
pub fn read_entries(
    which: &UniqueIndex,
    keys: &[(i16, u32, pg_sys::Datum)],
    hashes: &CStr,
    texts: &CStr,
    values: &CStr,
) -> Option<Vec<(i64, String, Option<i64>)>> {
    let hashes_attnum = i32::from(column_number(which, hashes)?);
    let texts_attnum = i32::from(column_number(which, texts)?);
    let values_attnum = i32::from(column_number(which, values)?);
    let mut out = Vec::new();
    let mut readable = true;
    scan(which, keys, |tuple, tupdesc, _| {
        let (mut null_h, mut null_t, mut null_v) = (false, false, false);
        // SAFETY: `tuple` is a tuple of `tupdesc` (`scan`) whose attributes are a bigint[], a
        // text[] and a bigint[] (the caller's table), read as in `chunk_holds`; each text is
        // copied into a String before the detoasted arrays go.
        unsafe {
            let h = pg_sys::heap_getattr(tuple, hashes_attnum, tupdesc, &mut null_h);
            let t = pg_sys::heap_getattr(tuple, texts_attnum, tupdesc, &mut null_t);
            let v = pg_sys::heap_getattr(tuple, values_attnum, tupdesc, &mut null_v);
            if null_h || null_t {
                readable = false;
                return false;
            }
            let hv = int8_elements(h);
            let (tv, tn) = deconstruct(t, pg_sys::TEXTOID, -1, false, b'i');
            let vv = if null_v { Vec::new() } else { int8_elements(v) };
            if tv.len() != hv.len() || (!null_v && vv.len() != hv.len()) {
                readable = false;
                return false;
            }
            for i in 0..hv.len() {
                let (Some(hash), false) = (hv[i], tn[i]) else {
                    readable = false;
                    return false;
                };
                let d = pg_sys::pg_detoast_datum_packed(tv[i].cast_mut_ptr());
                let bytes = std::slice::from_raw_parts(
                    pgrx::varlena::vardata_any(d.cast()).cast::<u8>(),
                    pgrx::varlena::varsize_any_exhdr(d.cast()),
                );
                let text = String::from_utf8_lossy(bytes).into_owned();
                out.push((hash, text, vv.get(i).copied().flatten()));
            }
        }
        true
    })?;
    readable.then_some(out)
}

/// A one-dimensional `text[]` of `texts` (no NULLs), built in one allocation in the current
/// memory context, as `construct_array` lays it out: the header, one dimension and its lower
/// bound 1, MAXALIGNed; each element a 4-byte-header varlena at an int-aligned offset.
pub fn text_array_datum(texts: &[&str]) -> pg_sys::Datum {
    let header = header_bytes();
    let mut size = header;
    for t in texts {
        size = size.next_multiple_of(4) + 4 + t.len();
    }
    // SAFETY: palloc0 returns `size` zeroed bytes (ERROR rather than NULL), enough for the
    // header and every element at its offset as computed above; each element's varlena header
    // is set for its own length and its bytes copied after it; the array's varlena header is
    // set for the whole size. Both lengths fit a varlena (palloc refuses more than 1 GB).
    unsafe {
        let base = pg_sys::palloc0(size).cast::<u8>();
        write_array_header(base, size, texts.len(), pg_sys::TEXTOID);
        let mut at = header;
        for t in texts {
            at = at.next_multiple_of(4);
            pgrx::varlena::set_varsize_4b(base.add(at).cast(), (4 + t.len()) as i32);
            std::ptr::copy_nonoverlapping(t.as_ptr(), base.add(at + 4), t.len());
            at += 4 + t.len();
        }
        pg_sys::Datum::from(base)
    }
}

/// A one-dimensional `bigint[]` of `values`, laid out as [`text_array_datum`] lays out its
/// header (the elements follow it, 8 bytes each).
pub fn int8_array_datum(values: &[i64]) -> pg_sys::Datum {
    let header = header_bytes();
    let size = header + 8 * values.len();
    // SAFETY: as in `text_array_datum`: `size` bytes hold the header and the values after it
    // (the header's length is a multiple of 8, so each value is aligned).
    unsafe {
        let base = pg_sys::palloc0(size).cast::<u8>();
        write_array_header(base, size, values.len(), pg_sys::INT8OID);
        std::ptr::copy_nonoverlapping(
            values.as_ptr().cast::<u8>(),
            base.add(header),
            8 * values.len(),
        );
        pg_sys::Datum::from(base)
    }
}

/// ARR_OVERHEAD_NONULLS(1): the header, one dimension and one lower bound, MAXALIGNed.
fn header_bytes() -> usize {
    (std::mem::size_of::<pg_sys::ArrayType>() + 2 * std::mem::size_of::<i32>()).next_multiple_of(8)
}

/// Write a one-dimensional array's header (no NULL bitmap) of `size` bytes with `n` elements of
/// type `elemtype` at `base`.
///
/// # Safety
/// `base` must point to at least `header_bytes()` writable, suitably aligned bytes (palloc's).
unsafe fn write_array_header(base: *mut u8, size: usize, n: usize, elemtype: pg_sys::Oid) {
    // SAFETY: per the contract; ArrayType is plain C data at the start of the allocation, the
    // dimension and lower bound the two ints after it.
    unsafe {
        pgrx::varlena::set_varsize_4b(base.cast(), size as i32);
        let arr = base.cast::<pg_sys::ArrayType>();
        (*arr).ndim = 1;
        (*arr).dataoffset = 0;
        (*arr).elemtype = elemtype;
        let dims = base
            .add(std::mem::size_of::<pg_sys::ArrayType>())
            .cast::<i32>();
        *dims = n as i32;
        *dims.add(1) = 1;
    }
}

/// The elements of array datum `d` (element type `typid` of length `len`, by value or not,
/// alignment `align`) and their NULL flags.
///
/// # Safety
/// `d` must be a non-NULL array datum of that element type; the datums returned point into the
/// detoasted array (for by-reference elements) and live as long as the current memory context.
unsafe fn deconstruct(
    d: pg_sys::Datum,
    typid: pg_sys::Oid,
    len: i16,
    byval: bool,
    align: u8,
) -> (Vec<pg_sys::Datum>, Vec<bool>) {
    // SAFETY: per the contract; deconstruct_array pallocs `n` datums and flags, copied here and
    // freed.
    unsafe {
        let arr = pg_sys::pg_detoast_datum(d.cast_mut_ptr()).cast::<pg_sys::ArrayType>();
        let mut elems: *mut pg_sys::Datum = std::ptr::null_mut();
        let mut nulls: *mut bool = std::ptr::null_mut();
        let mut n: std::ffi::c_int = 0;
        pg_sys::deconstruct_array(
            arr,
            typid,
            len.into(),
            byval,
            align as std::ffi::c_char,
            &mut elems,
            &mut nulls,
            &mut n,
        );
        let n = n.max(0) as usize;
        if n == 0 || elems.is_null() || nulls.is_null() {
            return (Vec::new(), Vec::new());
        }
        let out = (
            std::slice::from_raw_parts(elems, n).to_vec(),
            std::slice::from_raw_parts(nulls, n).to_vec(),
        );
        pg_sys::pfree(elems.cast());
        pg_sys::pfree(nulls.cast());
        out
    }
}

/// Every row whose index columns equal `keys` (as for [`read_by_index`], through a unique or
/// non-unique index of `which`), as (text column `text`, the bigint value column); rows with
/// either NULL are skipped. `None` if the table, index or column cannot be found.
pub fn read_all_by_index(
    which: &UniqueIndex,
    text: &CStr,
    keys: &[(i16, u32, pg_sys::Datum)],
) -> Option<Vec<(String, i64)>> {
    let text_attnum = i32::from(column_number(which, text)?);
    let mut out = Vec::new();
    scan(which, keys, |tuple, tupdesc, value_attnum| {
        let (mut null_t, mut null_v) = (false, false);
        // SAFETY: `tuple` is a tuple of `tupdesc` with attributes `text_attnum` (text) and
        // `value_attnum` (bigint) (`scan`); the text is detoasted and copied by text_to_cstring,
        // and the copy freed once it is a String.
        unsafe {
            let d = pg_sys::heap_getattr(tuple, text_attnum, tupdesc, &mut null_t);
            let v = pg_sys::heap_getattr(tuple, value_attnum, tupdesc, &mut null_v);
            if !null_t && !null_v {
                let c = pg_sys::text_to_cstring(d.cast_mut_ptr());
                out.push((
                    CStr::from_ptr(c).to_string_lossy().into_owned(),
                    v.value() as i64,
                ));
                pg_sys::pfree(c.cast());
            }
        }
        true
    })?;
    Some(out)
}

/// Does the table of `which` have a trigger named `name` that fires `ALWAYS` (`ENABLE ALWAYS
/// TRIGGER`)? False if the table cannot be found.
pub fn has_always_trigger(which: &UniqueIndex, name: &CStr) -> bool {
    let Some(t) = locate(which) else {
        return false;
    };
    // SAFETY: backend main thread, inside a transaction (as for `locate`). The table is opened
    // with AccessShareLock (kept to the end of the transaction, NoLock on close), so its relcache
    // entry and trigger descriptor (NULL when it has no triggers, else `numtriggers` entries
    // with NUL-terminated names) stay valid until table_close; only read.
    unsafe {
        let heap = pg_sys::table_open(t.heap, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let td = (*heap).trigdesc;
        let mut found = false;
        if !td.is_null() && !(*td).triggers.is_null() {
            let n = (*td).numtriggers.max(0) as usize;
            found = std::slice::from_raw_parts((*td).triggers, n)
                .iter()
                .any(|tg| {
                    CStr::from_ptr(tg.tgname) == name
                        && tg.tgenabled as u8 == pg_sys::TRIGGER_FIRES_ALWAYS
                });
        }
        pg_sys::table_close(heap, pg_sys::NoLock as pg_sys::LOCKMODE);
        found
    }
}

/// Per-backend state's life (`backend.rs`): the located tables and indexes are looked up again
/// when a relation changed.
pub fn on_event(ev: BackendEvent) {
    if let BackendEvent::Relcache(_) = ev {
        forget_located();
    }
}
