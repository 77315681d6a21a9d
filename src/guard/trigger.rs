//! The guard trigger `fencing_guard()` that `fencing_protect` installs on protected tables.
//!
//! Trigger arguments (set by `fencing_protect`, see `sql/pg_fencing.sql`):
//! 0. the protection id (`_pg_fencing.protected_table.id`, keys the per-row tombstones),
//! 1. the resource name (resource mode) or `''` (per-row mode),
//! 2. the name of the token column (bigint).
//!
//! Row events: `BEFORE INSERT OR UPDATE OR DELETE FOR EACH ROW` checks the token and stamps the
//! token column; `AFTER INSERT FOR EACH ROW` stores a raised resource mark only once the row really
//! was inserted (resource mode) or checks the key's tombstone once the row is in the unique index
//! (per-row mode); in per-row mode `AFTER UPDATE FOR EACH ROW WHEN (the key changed)` does the
//! same for the new key. Statement events: `BEFORE TRUNCATE`, and in resource mode `BEFORE INSERT
//! OR UPDATE OR DELETE FOR EACH STATEMENT`, which takes the resource lock before any row lock.
//! The decision itself is in `rule`.

use crate::error::{FenceError, Token};
use crate::rule;
use crate::rule::session_token::current_token;
use pgrx::prelude::*;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::{CStr, CString};

thread_local! {
    /// (relation, protection id, resource, token column) combinations whose trigger arguments
    /// were found to match `_pg_fencing.protected_table`. Kept for the life of the backend: a
    /// protection's arguments only change through fencing_protect/fencing_unprotect, which
    /// re-create or drop the triggers (and only the table's owner can attach triggers to it).
    static VERIFIED: RefCell<HashMap<(u32, u64), ()>> = RefCell::new(HashMap::new());
    /// Per relation (and token column): the token column's attribute number and the primary
    /// key. Dropped on relcache invalidation of the relation (see `forget_relation`).
    static RELINFO: RefCell<HashMap<(u32, u64), RelInfo>> = RefCell::new(HashMap::new());
}

thread_local! {
    static FIRINGS: Cell<Firings> = const {
        Cell::new(Firings { guarded_rows: 0, after_expected: 0, after_fired: 0 })
    };
}

/// Counts of the guard's firings in this backend, for `fenced_*` to check that the guard saw
/// every row its statement wrote (compare two readings).
#[derive(Clone, Copy, Debug)]
pub struct Firings {
    /// Rows the guard admitted (BEFORE ROW firings).
    pub guarded_rows: u64,
    /// AFTER ROW firings that BEFORE ROW firings announced (an INSERT, an UPDATE that changes a
    /// per-row key; the AFTER trigger finishes the check once the row is in the unique index).
    pub after_expected: u64,
    /// AFTER ROW firings that happened.
    pub after_fired: u64,
}

/// The counts now (see [`Firings`]).
pub fn firings() -> Firings {
    FIRINGS.with(|f| f.get())
}

fn count(bump: impl FnOnce(&mut Firings)) {
    FIRINGS.with(|f| {
        let mut v = f.get();
        bump(&mut v);
        f.set(v);
    });
}

#[derive(Clone)]
struct RelInfo {
    token_attnum: i32,
    pk: Vec<i16>,
    pk_immediate: bool,
}

/// Relcache invalidation of `relid` (`None`: of every relation): its cached trigger arguments
/// and table information are stale (called by `backend.rs`).
pub fn forget_relation(relid: Option<pg_sys::Oid>) {
    ARGS.with(|a| a.borrow_mut().clear());
    RELINFO.with(|r| {
        let mut r = r.borrow_mut();
        match relid {
            None => r.clear(),
            Some(relid) => r.retain(|(id, _), _| *id != relid.to_u32()),
        }
    });
}

fn args_hash(args: &Args) -> u64 {
    pg_fencing_core::hash::fnv1a(&[
        &args.protection.to_le_bytes(),
        args.resource.as_deref().unwrap_or("").as_bytes(),
        args.token_column.as_bytes(),
    ])
}

/// Token column and primary key of `rel`, from the per-backend cache.
///
/// # Safety
/// `rel` must be a valid, open relation (the trigger's `tg_relation`).
unsafe fn relinfo(
    rel: pg_sys::Relation,
    args: &Args,
    table: &dyn Fn() -> String,
) -> Result<RelInfo, FenceError> {
    // SAFETY: `rel` is a valid open relation (this function's contract).
    let key = (unsafe { (*rel).rd_id }.to_u32(), args.hash);
    if let Some(info) = RELINFO.with(|r| r.borrow().get(&key).cloned()) {
        return Ok(info);
    }
    // SAFETY: `rel` is a valid open relation (this function's contract), as both require.
    let token_attnum = unsafe { token_attnum(rel, args, &table())? };
    // SAFETY: as above.
    let (pk, pk_immediate) = unsafe { primary_key(rel) };
    let info = RelInfo {
        token_attnum,
        pk,
        pk_immediate,
    };
    RELINFO.with(|r| crate::cache::cache_insert(&mut r.borrow_mut(), key, info.clone(), 10_000));
    Ok(info)
}

/// Forget the verified relations (subtransaction abort: a check may have read rows that are
/// now rolled back).
pub fn forget_verified() {
    VERIFIED.with(|v| v.borrow_mut().clear());
}

/// `fencing_guard()` is an ordinary trigger function, so anyone may attach it to a table of
/// their own with made-up arguments. Its arguments are trusted only if they are exactly what
/// `fencing_protect` recorded for this table (or the root of its partition tree); otherwise a
/// role could write tombstones or marks into another table's protection.
///
/// # Safety
/// `rel` must be a valid, open relation (the trigger's `tg_relation`).
unsafe fn verify_protection(
    rel: pg_sys::Relation,
    args: &Args,
    table: &dyn Fn() -> String,
) -> Result<(), FenceError> {
    // SAFETY: `rel` is a valid open relation (this function's contract).
    let relid = unsafe { (*rel).rd_id };
    let cache_key = (relid.to_u32(), args.hash);
    if VERIFIED.with(|v| v.borrow().contains_key(&cache_key)) {
        return Ok(());
    }
    let resource = args.resource.clone().unwrap_or_default();
    let column = args.token_column.to_string_lossy().into_owned();
    let ok = crate::pg::spi::exec_internal(
        "SELECT true FROM _pg_fencing.protected_table p WHERE p.id OPERATOR(pg_catalog.=) $1 AND p.protected \
         AND p.relid OPERATOR(pg_catalog.=) coalesce(pg_catalog.pg_partition_root($2), $2) \
         AND (p.resource OPERATOR(pg_catalog.=) $3 OR (p.resource IS NULL AND $3 OPERATOR(pg_catalog.=) '')) \
         AND p.token_column OPERATOR(pg_catalog.=) $4::pg_catalog.name",
        true,
        &[pg_sys::INT8OID, pg_sys::REGCLASSOID, pg_sys::TEXTOID, pg_sys::TEXTOID],
        &mut [
            pg_sys::Datum::from(args.protection),
            pg_sys::Datum::from(relid),
            crate::pg::spi::text_datum(&resource),
            crate::pg::spi::text_datum(&column),
        ],
        true,
        |d| d.value() != 0,
    )
    .unwrap_or(false);
    if !ok {
        return Err(FenceError::NotAllowed(crate::error::Text::new(format!(
            "fencing_guard() on {} does not match a protection made by fencing_protect()",
            table()
        ))));
    }
    VERIFIED.with(|v| crate::cache::cache_insert(&mut v.borrow_mut(), cache_key, (), 10_000));
    Ok(())
}

struct Args {
    protection: i64,
    resource: Option<String>,
    token_column: CString,
    /// `args_hash` of the above, for the per-backend caches.
    hash: u64,
}

thread_local! {
    /// Parsed arguments per trigger OID (a trigger's arguments never change; dropped with the
    /// other caches on relcache invalidation, so a reused OID is parsed again).
    static ARGS: RefCell<HashMap<u32, std::rc::Rc<Args>>> = RefCell::new(HashMap::new());
}

/// The guard's arguments, parsed once per trigger and backend.
///
/// # Safety
/// `trigger` must be the firing trigger's `Trigger` (its `tgargs` valid as PostgreSQL set it).
unsafe fn trigger_args(trigger: &pg_sys::Trigger) -> Result<std::rc::Rc<Args>, FenceError> {
    let oid = trigger.tgoid.to_u32();
    if let Some(a) = ARGS.with(|m| m.borrow().get(&oid).cloned()) {
        return Ok(a);
    }
    // SAFETY: `trigger` is the firing trigger's (this function's contract).
    let args = std::rc::Rc::new(unsafe { parse_trigger_args(trigger)? });
    ARGS.with(|m| crate::cache::cache_insert(&mut m.borrow_mut(), oid, args.clone(), 10_000));
    Ok(args)
}

/// # Safety
/// `trigger` must be a `Trigger` filled in by PostgreSQL: `tgargs` NULL or an array of `tgnargs`
/// NUL-terminated strings.
unsafe fn parse_trigger_args(trigger: &pg_sys::Trigger) -> Result<Args, FenceError> {
    let bad = || {
        FenceError::TriggerProtocol(
            "fencing_guard() must be installed by fencing_protect() (expected 3 arguments)".into(),
        )
    };
    if trigger.tgnargs != 3 || trigger.tgargs.is_null() {
        return Err(bad());
    }
    // SAFETY: `tgargs` is non-NULL with `tgnargs` == 3 entries (checked above) and only i < 3 is
    // used; each entry is a NUL-terminated string in the relcache's trigger data, which lives at
    // least as long as this trigger call, and is copied before we return.
    let arg = |i: usize| unsafe { CStr::from_ptr(*trigger.tgargs.add(i)) };
    let protection = arg(0)
        .to_str()
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(bad)?;
    let resource = arg(1).to_string_lossy().into_owned();
    let mut args = Args {
        protection,
        resource: if resource.is_empty() {
            None
        } else {
            Some(resource)
        },
        token_column: arg(2).to_owned(),
        hash: 0,
    };
    args.hash = args_hash(&args);
    Ok(args)
}

/// `schema.table` of `rel`, quoted as needed.
///
/// # Safety
/// `rel` must be a valid, open relation.
unsafe fn relation_name(rel: pg_sys::Relation) -> String {
    // SAFETY: `rel` is valid (this function's contract). The catalog lookups take OIDs by value
    // and return palloc'd NUL-terminated names or NULL (checked); quote_qualified_identifier
    // returns a palloc'd string (the inputs themselves when no quoting is needed), copied at
    // once. Main thread inside the trigger's transaction.
    unsafe {
        let relid = (*rel).rd_id;
        let nsp = pg_sys::get_namespace_name(pg_sys::get_rel_namespace(relid));
        let name = pg_sys::get_rel_name(relid);
        if nsp.is_null() || name.is_null() {
            return format!("oid {}", relid.to_u32());
        }
        let q = pg_sys::quote_qualified_identifier(nsp, name);
        CStr::from_ptr(q).to_string_lossy().into_owned()
    }
}

/// 1-based attribute number of the token column, checked to be a bigint.
///
/// # Safety
/// `rel` must be a valid, open relation.
unsafe fn token_attnum(rel: pg_sys::Relation, args: &Args, table: &str) -> Result<i32, FenceError> {
    // SAFETY: `rel` is valid (this function's contract), so is its tuple descriptor with `natts`
    // attributes. SPI_fnumber only reads the descriptor and the NUL-terminated column name
    // (a CString owned by `args`); its result is range-checked before it indexes `attrs` (a
    // bounds-checked slice anyway).
    unsafe {
        let tupdesc = (*rel).rd_att;
        let n = pg_sys::SPI_fnumber(tupdesc, args.token_column.as_ptr());
        let natts = (*tupdesc).natts as usize;
        if n <= 0 || n as usize > natts {
            return Err(FenceError::TriggerProtocol(format!(
                "protected table {table} has no token column \"{}\"",
                args.token_column.to_string_lossy()
            )));
        }
        let att = &(*tupdesc).attrs.as_slice(natts)[(n - 1) as usize];
        if att.atttypid != pg_sys::INT8OID {
            return Err(FenceError::TriggerProtocol(format!(
                "token column \"{}\" of {table} must be bigint",
                args.token_column.to_string_lossy()
            )));
        }
        Ok(n)
    }
}

/// Primary key columns of `rel`, in key order, and whether the key is checked immediately
/// (not DEFERRABLE).
///
/// # Safety
/// `rel` must be a valid, open relation.
unsafe fn primary_key(rel: pg_sys::Relation) -> (Vec<i16>, bool) {
    // SAFETY: `rel` is valid (this function's contract); RelationGetPrimaryKeyIndex reads its
    // relcache entry. The index is opened (ERROR, not UB, if it vanished), its pg_index row read
    // through `rd_index` (valid while open; `indkey` has at least `indnkeyatts` entries) and
    // copied before index_close; main thread inside the trigger's transaction.
    unsafe {
        let pk = pg_sys::RelationGetPrimaryKeyIndex(rel);
        if pk == pg_sys::Oid::INVALID {
            return (Vec::new(), true);
        }
        let idx = pg_sys::index_open(pk, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let form = &*(*idx).rd_index;
        let n = form.indnkeyatts as usize;
        let cols = form.indkey.values.as_slice(n).to_vec();
        let immediate = form.indimmediate;
        pg_sys::index_close(idx, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        (cols, immediate)
    }
}

/// Primary key columns of a per-row protected table. Per-row mode relies on the primary key's
/// unique check waiting for an in-flight delete of the same key (see `rule`); a DEFERRABLE
/// key does not wait there, so it is refused (42P16).
///
/// # Safety
/// `rel` must be a valid, open relation.
unsafe fn primary_key_attnums(rel: pg_sys::Relation) -> Result<Vec<i16>, FenceError> {
    // SAFETY: `rel` is valid (this function's contract), as both calls require.
    let (cols, immediate) = unsafe { primary_key(rel) };
    // SAFETY: as above.
    unsafe { check_primary_key(rel, cols, immediate) }
}

/// `cols`, unless the key is missing or DEFERRABLE (42P16).
///
/// # Safety
/// `rel` must be a valid, open relation (it is named in the error).
unsafe fn check_primary_key(
    rel: pg_sys::Relation,
    cols: Vec<i16>,
    immediate: bool,
) -> Result<Vec<i16>, FenceError> {
    if cols.is_empty() || !immediate {
        // SAFETY: `rel` is valid (this function's contract).
        let table = unsafe { relation_name(rel) };
        return Err(FenceError::InvalidTableDefinition(crate::error::Text::new(
            if cols.is_empty() {
                format!(
                "per-row protected table {table} has no usable primary key (none, or DEFERRABLE)"
            )
            } else {
                format!("per-row protected table {table} has a DEFERRABLE primary key")
            },
        )));
    }
    Ok(cols)
}

/// Canonical text of a row's primary key: exactly what `ROW(pk1, pk2, ...)::text` prints
/// (PostgreSQL's `record_out` quoting), so SQL (TRUNCATE) and Rust build the same tombstone key.
///
/// # Safety
/// `tuple` must be a valid tuple of `tupdesc`, and `pk` attribute numbers (1-based) of it.
unsafe fn key_text(tuple: pg_sys::HeapTuple, tupdesc: pg_sys::TupleDesc, pk: &[i16]) -> String {
    // Types whose text form depends on no setting need no pinning (the common, cheap case).
    let independent = pk.iter().all(|a| {
        // SAFETY: `tupdesc` is valid with `natts` attributes (this function's contract); the
        // slice index is bounds-checked.
        let typid = unsafe {
            let natts = (*tupdesc).natts as usize;
            (*tupdesc).attrs.as_slice(natts)[(*a - 1) as usize].atttypid
        };
        [
            pg_sys::INT2OID,
            pg_sys::INT4OID,
            pg_sys::INT8OID,
            pg_sys::TEXTOID,
            pg_sys::VARCHAROID,
            pg_sys::BPCHAROID,
            pg_sys::UUIDOID,
            pg_sys::BOOLOID,
            pg_sys::OIDOID,
            pg_sys::NUMERICOID,
            pg_sys::NAMEOID,
            pg_sys::CHAROID,
        ]
        .contains(&typid)
    });
    if independent {
        // SAFETY: this function's contract is `key_text_pinned`'s.
        unsafe { key_text_pinned(tuple, tupdesc, pk) }
    } else {
        // SAFETY: as above; changing settings does not invalidate the tuple or descriptor.
        crate::pg::spi::with_pinned_settings(|| unsafe { key_text_pinned(tuple, tupdesc, pk) })
    }
}

/// `key_text` with the output settings already pinned (or not needed).
///
/// # Safety
/// As for `key_text`.
unsafe fn key_text_pinned(
    tuple: pg_sys::HeapTuple,
    tupdesc: pg_sys::TupleDesc,
    pk: &[i16],
) -> String {
    let mut out = String::from("(");
    for (i, attnum) in pk.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let mut isnull = false;
        // SAFETY: `tuple` is a valid tuple of `tupdesc` and `attnum` one of its attributes (this
        // function's contract); the datum points into the tuple, which outlives its use below.
        let datum = unsafe { pg_sys::heap_getattr(tuple, *attnum as i32, tupdesc, &mut isnull) };
        if isnull {
            continue;
        }
        // SAFETY: as above; the slice index is bounds-checked.
        let typid = unsafe {
            let natts = (*tupdesc).natts as usize;
            (*tupdesc).attrs.as_slice(natts)[(*attnum - 1) as usize].atttypid
        };
        // SAFETY: main thread inside the trigger's transaction. `datum` is a non-NULL value of
        // type `typid` (the attribute's own type), which is what the type's output function,
        // found by getTypeOutputInfo, expects; it returns a palloc'd NUL-terminated string,
        // copied before it is pfree'd and never used after.
        let value = unsafe {
            let mut out_fn = pg_sys::Oid::INVALID;
            let mut varlena = false;
            pg_sys::getTypeOutputInfo(typid, &mut out_fn, &mut varlena);
            let s = pg_sys::OidOutputFunctionCall(out_fn, datum);
            let v = CStr::from_ptr(s).to_string_lossy().into_owned();
            pg_sys::pfree(s.cast());
            v
        };
        let needs_quotes = value.is_empty()
            || value.chars().any(|c| {
                matches!(
                    c,
                    '"' | '\\' | '(' | ')' | ',' | ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c'
                )
            });
        if needs_quotes {
            out.push('"');
            for c in value.chars() {
                if c == '"' || c == '\\' {
                    out.push(c);
                }
                out.push(c);
            }
            out.push('"');
        } else {
            out.push_str(&value);
        }
    }
    out.push(')');
    out
}

/// The token column's value in `tuple` (None if NULL).
///
/// # Safety
/// `tuple` must be a valid tuple of `tupdesc` and `attnum` its (bigint) token column.
unsafe fn tuple_token(
    tuple: pg_sys::HeapTuple,
    tupdesc: pg_sys::TupleDesc,
    attnum: i32,
) -> Option<Token> {
    let mut isnull = false;
    // SAFETY: this function's contract; a bigint is passed by value, so the datum is the value.
    let d = unsafe { pg_sys::heap_getattr(tuple, attnum, tupdesc, &mut isnull) };
    if isnull {
        None
    } else {
        Some(d.value() as i64)
    }
}

/// A copy of `tuple` with the token column set to `token`.
///
/// # Safety
/// `tuple` must be a valid tuple of `tupdesc` and `attnum` its (bigint) token column.
unsafe fn stamp(
    tuple: pg_sys::HeapTuple,
    tupdesc: pg_sys::TupleDesc,
    attnum: i32,
    token: Token,
) -> pg_sys::HeapTuple {
    let mut cols = [attnum];
    let mut vals = [pg_sys::Datum::from(token)];
    let mut nulls = [false];
    // SAFETY: this function's contract; the three arrays hold exactly the one (attnum, value,
    // null) replacement announced, and the value is a by-value bigint. The new tuple is palloc'd
    // in the current memory context (the trigger's), where the executor expects it.
    unsafe {
        pg_sys::heap_modify_tuple_by_cols(
            tuple,
            tupdesc,
            1,
            cols.as_mut_ptr(),
            vals.as_mut_ptr(),
            nulls.as_mut_ptr(),
        )
    }
}

/// Body of `fencing_guard()`. Returns the trigger's result datum, or the error to raise.
///
/// # Safety
/// `fcinfo` must be the call's own, from PostgreSQL's function manager, on the main thread.
pub unsafe fn fire(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, FenceError> {
    // SAFETY: `fcinfo` is the function manager's (this function's contract). `context` is read
    // as TriggerData only after called_as_trigger checked that it is a TriggerData node. The
    // trigger manager keeps that TriggerData, its `tg_trigger`, `tg_relation` (open and locked
    // by the executor), tuple descriptor and `tg_trigtuple`/`tg_newtuple` valid for this call:
    // `tg_trigtuple` is set for every row event, `tg_newtuple` for UPDATE row events, and each is
    // only read for the events that set it; the token column and key attributes come from
    // `relinfo` for this relation. The tuples returned to the executor are `tg_trigtuple` or a
    // copy made by `stamp` in the trigger's memory context. `tg_updatedcols` is a valid
    // (possibly NULL = empty) Bitmapset for UPDATE events. Main thread inside the statement's
    // transaction.
    unsafe {
        if !pgrx::trigger_support::called_as_trigger(fcinfo) {
            return Err(FenceError::TriggerProtocol(
                "fencing_guard() can only be called as a trigger".into(),
            ));
        }
        let td = &*((*fcinfo).context as *mut pg_sys::TriggerData);
        let args = trigger_args(&*td.tg_trigger)?;
        let rel = td.tg_relation;
        let event = td.tg_event;
        let op = event & pg_sys::TRIGGER_EVENT_OPMASK;
        let row_level = event & pg_sys::TRIGGER_EVENT_ROW != 0;
        let before = event & pg_sys::TRIGGER_EVENT_TIMINGMASK == pg_sys::TRIGGER_EVENT_BEFORE;

        // The table's name is only needed for error messages: printed lazily.
        let table_fn = || relation_name(rel);
        let table: &dyn Fn() -> String = &table_fn;
        verify_protection(rel, &args, table)?;
        if pg_sys::SessionReplicationRole == pg_sys::SESSION_REPLICATION_ROLE_REPLICA as i32 {
            // Logical replication's apply worker (or a session in replica mode): only the
            // REPLICA trigger zz_pg_fencing_replica fires; it records, never refuses.
            return record_replicated(td, &args, table);
        }
        if !row_level && op != pg_sys::TRIGGER_EVENT_TRUNCATE {
            // BEFORE INSERT/UPDATE/DELETE FOR EACH STATEMENT (resource mode): take the resource's
            // lock before the executor locks any row, so that every transaction takes resource
            // lock, then row locks, in that order (a row trigger runs after its row is locked;
            // taking the resource lock there first could deadlock against a holder of the
            // resource lock that waits for that row). Without a token the row triggers raise FT002.
            if let (Some(resource), Some(token)) = (&args.resource, current_token()) {
                crate::lock_service::locks::check_token(token)?;
                rule::admit_resource(resource, token, false)?;
            }
            return Ok(pg_sys::Datum::from(0usize));
        }
        let token = current_token().ok_or_else(|| FenceError::NoToken {
            target: format!("a write to protected table {}", table()),
            set_earlier: crate::rule::session_token::token_out_of_scope(),
        })?;
        crate::lock_service::locks::check_token(token)?;

        if !row_level {
            if before {
                truncate(rel, &args, &table(), token)?;
            }
            return Ok(pg_sys::Datum::from(0usize));
        }

        let tupdesc = (*rel).rd_att;
        let info = relinfo(rel, &args, table)?;
        let attnum = info.token_attnum;
        let pk_of = || check_primary_key(rel, info.pk.clone(), info.pk_immediate);

        if !before {
            // AFTER INSERT (both modes) and, in per-row mode, AFTER UPDATE of a row whose key
            // changed (the trigger's WHEN clause): the row is in the table and in its unique
            // index now. The token is the one the BEFORE trigger stamped into the row, even if
            // the session's setting changed later in the statement.
            let row = if op == pg_sys::TRIGGER_EVENT_UPDATE {
                td.tg_newtuple
            } else {
                td.tg_trigtuple
            };
            let stamped = tuple_token(row, tupdesc, attnum).unwrap_or(token);
            count(|f| f.after_fired = f.after_fired.wrapping_add(1));
            match &args.resource {
                Some(resource) if op == pg_sys::TRIGGER_EVENT_INSERT => {
                    rule::admit_resource(resource, stamped, true)?;
                }
                None if op == pg_sys::TRIGGER_EVENT_INSERT
                    || op == pg_sys::TRIGGER_EVENT_UPDATE =>
                {
                    let pk = pk_of()?;
                    let key = key_text(row, tupdesc, &pk);
                    rule::admit_row_insert(args.protection, table, &key, stamped, true)?;
                    if op == pg_sys::TRIGGER_EVENT_UPDATE {
                        // The key changed (the trigger's WHEN clause), possibly by a BEFORE trigger
                        // that ran after the guard: the old key is gone, so it keeps a tombstone.
                        let old_key = key_text(td.tg_trigtuple, tupdesc, &pk);
                        if old_key != key {
                            crate::state::tombstones::record_row_delete(
                                args.protection,
                                &old_key,
                                stamped,
                            );
                        }
                    }
                }
                _ => {}
            }
            return Ok(pg_sys::Datum::from(0usize));
        }

        // Counted for fenced_* calls, which check that every row they wrote came through here.
        count(|f| f.guarded_rows = f.guarded_rows.wrapping_add(1));
        match (&args.resource, op) {
            (Some(resource), pg_sys::TRIGGER_EVENT_INSERT) => {
                rule::admit_resource(resource, token, false)?;
                count(|f| f.after_expected = f.after_expected.wrapping_add(1));
                Ok(pg_sys::Datum::from(stamp(
                    td.tg_trigtuple,
                    tupdesc,
                    attnum,
                    token,
                )))
            }
            (Some(resource), pg_sys::TRIGGER_EVENT_UPDATE) => {
                rule::admit_resource(resource, token, true)?;
                Ok(pg_sys::Datum::from(stamp(
                    td.tg_newtuple,
                    tupdesc,
                    attnum,
                    token,
                )))
            }
            (Some(resource), _delete) => {
                rule::admit_resource(resource, token, true)?;
                Ok(pg_sys::Datum::from(td.tg_trigtuple))
            }
            (None, pg_sys::TRIGGER_EVENT_INSERT) => {
                // The key's tombstone is checked by the AFTER INSERT trigger, once the row is in
                // the unique index (see `rule`); here the row only gets its token.
                if !info.pk_immediate || info.pk.is_empty() {
                    pk_of()?;
                }
                count(|f| f.after_expected = f.after_expected.wrapping_add(1));
                Ok(pg_sys::Datum::from(stamp(
                    td.tg_trigtuple,
                    tupdesc,
                    attnum,
                    token,
                )))
            }
            (None, pg_sys::TRIGGER_EVENT_UPDATE) => {
                let pk = pk_of()?;
                let old = td.tg_trigtuple;
                let row_token = tuple_token(old, tupdesc, attnum);
                rule::admit_row(
                    args.protection,
                    table,
                    &|| key_text(old, tupdesc, &pk),
                    token,
                    row_token,
                    true,
                )?;
                // Only an UPDATE that sets a key column can change the key (a key changed by a
                // later BEFORE trigger is caught by the AFTER UPDATE trigger).
                let sets_key = pk.iter().any(|a| {
                    pg_sys::bms_is_member(
                        *a as i32 - pg_sys::FirstLowInvalidHeapAttributeNumber,
                        td.tg_updatedcols,
                    )
                });
                if sets_key {
                    let old_key = key_text(old, tupdesc, &pk);
                    let new_key = key_text(td.tg_newtuple, tupdesc, &pk);
                    if new_key != old_key {
                        // The key changes: the old key is deleted, the new one is inserted.
                        rule::admit_row_insert(args.protection, table, &new_key, token, false)?;
                        crate::state::tombstones::record_row_delete(
                            args.protection,
                            &old_key,
                            token,
                        );
                        count(|f| f.after_expected = f.after_expected.wrapping_add(1));
                    }
                }
                Ok(pg_sys::Datum::from(stamp(
                    td.tg_newtuple,
                    tupdesc,
                    attnum,
                    token,
                )))
            }
            (None, _delete) => {
                let pk = pk_of()?;
                let key = key_text(td.tg_trigtuple, tupdesc, &pk);
                let row_token = tuple_token(td.tg_trigtuple, tupdesc, attnum);
                rule::admit_row(
                    args.protection,
                    table,
                    &|| key.clone(),
                    token,
                    row_token,
                    true,
                )?;
                crate::state::tombstones::record_row_delete(args.protection, &key, token);
                Ok(pg_sys::Datum::from(td.tg_trigtuple))
            }
        }
    }
}

/// A change applied with `session_replication_role = replica` (logical replication's apply and
/// table-sync workers): the publisher already admitted it, and refusing it here would stop the
/// subscription, so it is recorded, never refused: in resource mode the row's token raises the
/// resource's mark; in per-row mode the row's token column travels with it, and a deleted key (or
/// the old key of an UPDATE that changed it) keeps a tombstone with the deleted row's token. The
/// publisher's own marks and tombstones, which no row carries (`fencing_advance`, the token of a
/// DELETE), arrive through `_pg_fencing.resource_high_water` and `_pg_fencing.tombstone_feed` when
/// those are published too (see `sql/pg_fencing.sql`, "Logical replication").
///
/// # Safety
/// `td` must be the firing trigger's data (as in `fire`).
unsafe fn record_replicated(
    td: &pg_sys::TriggerData,
    args: &Args,
    table: &dyn Fn() -> String,
) -> Result<pg_sys::Datum, FenceError> {
    // SAFETY: `td` is the firing trigger's data (this function's contract): only BEFORE row
    // events get past the first check, `tg_trigtuple` is set for each of them and `tg_newtuple`
    // for UPDATE, and `tg_relation` is open; the tuple returned is one of those.
    unsafe {
        let event = td.tg_event;
        let op = event & pg_sys::TRIGGER_EVENT_OPMASK;
        let row_level = event & pg_sys::TRIGGER_EVENT_ROW != 0;
        let before = event & pg_sys::TRIGGER_EVENT_TIMINGMASK == pg_sys::TRIGGER_EVENT_BEFORE;
        if !row_level || !before {
            return Ok(pg_sys::Datum::from(0usize));
        }
        let rel = td.tg_relation;
        let tupdesc = (*rel).rd_att;
        let info = relinfo(rel, args, table)?;
        let attnum = info.token_attnum;
        let (old, new) = match op {
            pg_sys::TRIGGER_EVENT_INSERT => (None, Some(td.tg_trigtuple)),
            pg_sys::TRIGGER_EVENT_UPDATE => (Some(td.tg_trigtuple), Some(td.tg_newtuple)),
            _ => (Some(td.tg_trigtuple), None),
        };
        let positive = |t: Option<Token>| t.filter(|t| *t > 0);
        match &args.resource {
            Some(resource) => {
                let highest = [old, new]
                    .into_iter()
                    .flatten()
                    .filter_map(|t| positive(tuple_token(t, tupdesc, attnum)))
                    .max();
                if let Some(t) = highest {
                    rule::raise_mark(resource, t);
                }
            }
            None => {
                if let Some(old) = old {
                    let pk = check_primary_key(rel, info.pk.clone(), info.pk_immediate)?;
                    let old_key = key_text(old, tupdesc, &pk);
                    let gone = match new {
                        None => true,
                        Some(new) => key_text(new, tupdesc, &pk) != old_key,
                    };
                    if let (true, Some(t)) = (gone, positive(tuple_token(old, tupdesc, attnum))) {
                        crate::state::tombstones::record_row_delete(args.protection, &old_key, t);
                    }
                }
            }
        }
        Ok(pg_sys::Datum::from(
            new.or(old).unwrap_or(std::ptr::null_mut()),
        ))
    }
}

/// TRUNCATE removes every row at once. Resource mode: an ordinary admitted write. Per-row mode:
/// the token must be at least every row's token, and every row leaves its tombstone. The table is
/// held in ACCESS EXCLUSIVE mode by TRUNCATE, so no row can change meanwhile.
///
/// # Safety
/// `rel` must be a valid, open relation (the trigger's `tg_relation`).
unsafe fn truncate(
    rel: pg_sys::Relation,
    args: &Args,
    table: &str,
    token: Token,
) -> Result<(), FenceError> {
    if let Some(resource) = &args.resource {
        rule::admit_resource(resource, token, true)?;
        return Ok(());
    }
    // SAFETY: `rel` is valid (this function's contract), with `natts` attributes in its
    // descriptor; the slice index is bounds-checked and `attname` is a NUL-terminated NameData.
    let (relid, pk_names) = unsafe {
        let pk = primary_key_attnums(rel)?;
        let tupdesc = (*rel).rd_att;
        let natts = (*tupdesc).natts as usize;
        let names: Vec<String> = pk
            .iter()
            .map(|a| {
                let att = &(*tupdesc).attrs.as_slice(natts)[(*a - 1) as usize];
                let name = CStr::from_ptr(att.attname.data.as_ptr())
                    .to_string_lossy()
                    .into_owned();
                spi::quote_identifier(name)
            })
            .collect();
        ((*rel).rd_id, names)
    };
    let token_col = spi::quote_identifier(args.token_column.to_string_lossy());
    crate::state::tombstones::truncate_rows(
        args.protection,
        relid,
        table,
        &pk_names,
        &token_col,
        token,
    )
}
