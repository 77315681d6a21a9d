//! `fenced_update`, `fenced_insert` and `fenced_delete`: jsonb in, one plain DML statement out,
//! fenced by the guard trigger with the token passed as the last argument.
//!
//! The statement for a (table, operation, set of columns) is prepared once per backend and kept
//! (`SPI_keepplan`); values reach it as jsonb parameters and are converted by
//! `jsonb_populate_record`, so each column's own type input rules apply. The per-table facts
//! (protection, primary key, columns, whether the protection is active) are cached per backend
//! and dropped on any relcache invalidation, like the trigger's cache.
//!
//! The call runs in three steps (see `api/functions.rs`): `prepare` (guarded: checks the arguments, makes
//! the token argument the token of the statement's writes (`rule/session_token.rs`), connects
//! to SPI), the statement itself
//! (`execute`, with nothing but plain data on the Rust stack, so an error raised inside it, such
//! as the trigger's `FT001` or a user trigger's own SQLSTATE, reaches the caller unchanged), and
//! `finish` (guarded: collects the returned row, ends the token's scope, checks that every row
//! written went through the guard).

use crate::backend_event::BackendEvent;
use crate::error::{FenceError, Text};
use crate::guard::trigger;
use crate::pg::spi::KeptPlans;
use pg_fencing_core::json::{self, Members, ShapeError};
use pgrx::pg_sys;
use pgrx::prelude::*;
use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_long, CStr};
use std::rc::Rc;

/// Which fenced function is running.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Op {
    Update,
    Insert,
    Delete,
}

impl Op {
    /// Position of the token argument.
    fn token_arg(self) -> usize {
        match self {
            Op::Update => 3,
            Op::Insert | Op::Delete => 2,
        }
    }
}

/// What one call needs once its arguments are checked: plain data only (see the module doc).
#[derive(Clone, Copy)]
pub struct Prepared {
    plan: pg_sys::SPIPlanPtr,
    args: [pg_sys::Datum; 2],
    /// The guard's firing counts before the statement ran.
    before: trigger::Firings,
}

/// Facts about a table that fenced calls need, cached per backend.
struct Target {
    /// Schema-qualified, quoted name, for the statements.
    qualified: String,
    /// The protection's token column.
    token_column: String,
    /// Primary key columns in key order (empty: none).
    pk: Vec<String>,
    /// All live user columns.
    columns: HashSet<String>,
    /// Why the protection is not active (None: active), as of `replica_role`.
    inactive: Option<String>,
    /// `session_replication_role = replica` when `inactive` was computed.
    replica_role: bool,
}

thread_local! {
    /// Per relation: `None` if it is not protected.
    static TARGETS: RefCell<FxHashMap<u32, Option<Rc<Target>>>> = RefCell::new(FxHashMap::default());
    /// Kept plans per (relation, operation, sorted column names).
    /// Kept plans per (relation, operation, sorted column names).
    static PLANS: RefCell<KeptPlans<(u32, Op, Vec<String>)>> = RefCell::new(KeptPlans::new(1000));
}

/// Relcache invalidation (any relation: a partition's trigger, an attached partition or a
/// renamed column can change what a cached fact or statement means).
fn invalidate() {
    TARGETS.with(|t| t.borrow_mut().clear());
    PLANS.with(|p| p.borrow_mut().invalidate());
}

/// End of the top-level transaction: free the plans invalidated during it.
fn free_stale_plans() {
    PLANS.with(|p| p.borrow_mut().free_stale());
}

fn call_error(
    variant: fn(Text) -> FenceError,
    message: String,
    detail: Option<String>,
    hint: Option<String>,
) -> FenceError {
    variant(Text {
        message,
        detail,
        hint,
    })
}

/// The relation as `regclass` prints it (for messages, as the caller's search_path shows it).
fn regclass_text(relid: pg_sys::Oid) -> String {
    // SAFETY: main thread inside a transaction (the fenced call's). regclassout takes an OID
    // datum (any value is valid: an unknown OID prints as a number) and returns a palloc'd
    // NUL-terminated cstring, which pgrx reads as `&CStr` and we copy at once.
    unsafe {
        let s = pgrx::direct_function_call::<&CStr>(pg_sys::regclassout, &[Some(relid.into())]);
        s.map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_else(|| relid.to_u32().to_string())
    }
}

fn quote(name: &str) -> String {
    spi::quote_identifier(name)
}

/// Step 1 (guarded): check the arguments, find or prepare the statement, set the token, connect
/// to SPI. Errors are returned for the caller to raise (see `api/functions.rs`).
///
/// # Safety
/// `fcinfo` must be the call's own argument block.
pub unsafe fn prepare(fcinfo: pg_sys::FunctionCallInfo, op: Op) -> Result<Prepared, FenceError> {
    // SAFETY: `fcinfo` is this call's own (this function's contract), for a `fenced_*`
    // signature: argument 0 is a regclass (an OID); `op.token_arg()` is the bigint token.
    let relid: Option<pg_sys::Oid> = unsafe { pgrx::fcinfo::pg_getarg(fcinfo, 0) };
    // SAFETY: as above.
    let token: Option<i64> = unsafe { pgrx::fcinfo::pg_getarg(fcinfo, op.token_arg()) };
    let token = match token {
        None => {
            return Err(call_error(
                FenceError::NoTokenArgument,
                format!(
                    "no fencing token for a write to {}",
                    relid
                        .map(regclass_text)
                        .unwrap_or_else(|| "a NULL relation".into())
                ),
                None,
                Some("Pass the lock holder's fencing token as the last argument.".into()),
            ))
        }
        Some(t) if t <= 0 => return Err(FenceError::TokenNotPositive(t.to_string())),
        Some(t) => t,
    };
    let relid = relid.ok_or_else(|| {
        call_error(
            FenceError::NullArgument,
            "relation must not be NULL".into(),
            None,
            None,
        )
    })?;

    // Lock the table as the statement will (for a caller allowed to write it; others get the
    // statement's own permission error), so that invalidations from DDL that committed before
    // the lock was granted reach the cache below before it is consulted.
    // SAFETY: main thread inside the call's transaction; pg_class_aclcheck and LockRelationOid
    // take plain values (an OID that does not exist raises ERROR, a panic through the FFI guard,
    // inside `prepare`'s guard). The lock is released by the transaction's end.
    unsafe {
        let mode = match op {
            Op::Update => pg_sys::ACL_UPDATE,
            Op::Insert => pg_sys::ACL_INSERT,
            Op::Delete => pg_sys::ACL_DELETE,
        };
        if pg_sys::pg_class_aclcheck(relid, pg_sys::GetUserId(), mode as pg_sys::AclMode)
            == pg_sys::AclResult::ACLCHECK_OK
        {
            pg_sys::LockRelationOid(relid, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE);
        }
    }
    // Also read invalidations that arrived without a lock wait (the table may be locked by this
    // transaction already, while a trigger of a partition was disabled meanwhile).
    // SAFETY: no arguments; processes pending invalidations on the main thread inside a
    // transaction, which is where PostgreSQL itself calls it. No Rust reference into a cache
    // that an invalidation could change is held across it (the callbacks only clear our maps,
    // none of which is borrowed here).
    unsafe { pg_sys::AcceptInvalidationMessages() };
    let target = target(relid)?;

    // jsonb arguments: key (update, delete) and changes (update) or new_row (insert).
    let json_args: Vec<(&'static str, usize)> = match op {
        Op::Update => vec![("key", 1), ("changes", 2)],
        Op::Insert => vec![("new_row", 1)],
        Op::Delete => vec![("key", 1)],
    };
    let mut datums = [pg_sys::Datum::from(0usize); 2];
    let mut value_columns: Vec<String> = Vec::new();
    for (i, (what, argno)) in json_args.iter().enumerate() {
        // SAFETY: `fcinfo` is this call's own; `argno` is a jsonb argument of the `op`'s
        // signature (1, or 2 for `changes`), as `json_object` requires.
        let (datum, object) = unsafe { json_object(fcinfo, *argno, what)? };
        let cols = columns_of(relid, &target, &object, what)?;
        if *what == "key" {
            key_match(relid, &target, &object)?;
        } else {
            if op == Op::Update && cols.is_empty() {
                return Err(call_error(
                    FenceError::ArgumentShape,
                    "changes must name at least one column".into(),
                    None,
                    None,
                ));
            }
            value_columns = cols;
        }
        datums[i] = datum;
    }

    let plan_key = (relid.to_u32(), op, value_columns.clone());
    // The statement's writes carry `token` (rule/session_token.rs), until `finish` or the
    // abort of the (sub)transaction.
    crate::rule::session_token::push_fenced(token);
    // SAFETY: main thread inside the call's transaction. `finish` closes SPI; if an ERROR comes
    // first, (sub)transaction abort does. `plan_for` runs inside the SPI connection just opened,
    // as SPI_prepare requires.
    unsafe {
        if pg_sys::SPI_connect() != pg_sys::SPI_OK_CONNECT as i32 {
            crate::pg::report::raise_in_guard(crate::error::FenceError::Internal(
                "SPI_connect failed".to_string(),
            ));
        }
        let plan = plan_for(plan_key, &target, &value_columns);
        Ok(Prepared {
            plan,
            args: datums,
            before: trigger::firings(),
        })
    }
}

// Declared here, not taken from pgrx's bindings, because those catch PostgreSQL errors and
// re-raise them through pgrx, which keeps only SQLSTATEs that PostgreSQL itself defines.
// SAFETY: the signature is SPI_execute_plan's in executor/spi.h (SPIPlanPtr, Datum *,
// const char *, bool, long) -> int, so calls through it follow the C ABI.
unsafe extern "C-unwind" {
    #[link_name = "SPI_execute_plan"]
    fn spi_execute_plan_unguarded(
        plan: pg_sys::SPIPlanPtr,
        values: *mut pg_sys::Datum,
        nulls: *const c_char,
        read_only: bool,
        tcount: c_long,
    ) -> c_int;
}

/// Step 2: run the statement. An error inside it propagates straight to the caller.
///
/// # Safety
/// Must be called from the C entry point's own frame, with only plain data alive there.
pub unsafe fn execute(p: &mut Prepared) -> c_int {
    let nulls = [b' ' as c_char; 2];
    // SAFETY: `p` comes from this call's `prepare`, so we are connected to SPI and `p.plan` is a
    // kept plan valid in it with at most two jsonb parameters, for which `p.args` holds this
    // call's argument datums (alive in the caller's memory context) and `nulls` two entries.
    // The call is deliberately unguarded: an ERROR inside longjmps straight to PostgreSQL's
    // handler, which is sound because the caller's frames hold only plain data (this
    // function's contract) and `nulls` is a plain array.
    unsafe { spi_execute_plan_unguarded(p.plan, p.args.as_mut_ptr(), nulls.as_ptr(), false, 0) }
}

/// Step 3 (guarded): collect the row the statement returned, end the call's token scope, and
/// check that every written row went through the guard trigger (`FT004` otherwise, e.g. a
/// partition whose trigger was disabled after the protection was checked).
///
/// # Safety
/// `p` must come from `prepare` of this call, `rc` from `execute`.
pub unsafe fn finish(
    fcinfo: pg_sys::FunctionCallInfo,
    op: Op,
    p: Prepared,
    rc: c_int,
) -> Result<pg_sys::Datum, FenceError> {
    // SAFETY: main thread, inside `run`'s guard, still connected to SPI by this call's `prepare`
    // (this function's contract). SPI_tuptable is read only if the statement returned rows, so
    // `vals[0]` exists; its jsonb datum is copied out of SPI memory with SPI_datumTransfer
    // (upper executor context) before SPI_finish frees that memory; pop_fenced ends the token
    // scope `prepare` began. `fcinfo` is the call's own, so argument 0 is a regclass and
    // argument 1 (read from `args`, bounds-checked against `nargs`) is the jsonb key, not NULL
    // (`prepare` refused a NULL key of an update or delete), as `jsonb_text` requires.
    unsafe {
        if rc < 0 {
            crate::pg::report::raise_in_guard(crate::error::FenceError::Internal(format!(
                "fenced statement failed: SPI code {rc}"
            )));
        }
        let processed = pg_sys::SPI_processed;
        let mut result = None;
        if processed > 0 && !pg_sys::SPI_tuptable.is_null() {
            let tt = &*pg_sys::SPI_tuptable;
            let mut isnull = false;
            let d = pg_sys::SPI_getbinval(*tt.vals, tt.tupdesc, 1, &mut isnull);
            if !isnull {
                result = Some(pg_sys::SPI_datumTransfer(d, false, -1));
            }
        }
        pg_sys::SPI_finish();
        crate::rule::session_token::pop_fenced();
        let now = trigger::firings();
        let guarded = now.guarded_rows.wrapping_sub(p.before.guarded_rows);
        let expected = now.after_expected.wrapping_sub(p.before.after_expected);
        let fired = now.after_fired.wrapping_sub(p.before.after_fired);
        let relid: Option<pg_sys::Oid> = pgrx::fcinfo::pg_getarg(fcinfo, 0);
        let relid = relid.unwrap_or(pg_sys::Oid::INVALID);
        // A trigger disabled (e.g. on a partition) after the protection was checked: the write
        // must not stand.
        let unguarded = now
            .unguarded_statements
            .wrapping_sub(p.before.unguarded_statements);
        let missed = if unguarded > 0 {
            Some("A partition written by the statement has no enabled guard trigger.".to_string())
        } else if guarded < processed {
            Some(format!(
                "{processed} row(s) were written without passing the guard trigger."
            ))
        } else if fired < expected {
            Some(format!(
                "{} row(s) were written without their AFTER ROW check (trigger zz_pg_fencing_after or zz_pg_fencing_rekey).",
                expected - fired
            ))
        } else {
            None
        };
        if let Some(detail) = missed {
            return Err(call_error(
                FenceError::NotProtected,
                format!("protection of table {} is not active", regclass_text(relid)),
                Some(detail),
                Some("Check fencing_protected_tables.inactive_reason; fencing_protect re-creates missing triggers.".into()),
            ));
        }
        match result {
            Some(d) => Ok(d),
            None if processed == 0 && op != Op::Insert => {
                let key = (*fcinfo).args.as_slice((*fcinfo).nargs as usize)[1].value;
                Err(call_error(
                    FenceError::NoSuchRow,
                    format!(
                        "no row of {} has key {}",
                        regclass_text(relid),
                        jsonb_text(key)
                    ),
                    None,
                    None,
                ))
            }
            None => Ok(pgrx::fcinfo::pg_return_null(fcinfo)),
        }
    }
}

/// The protection of `relid` (or of the root of its partition tree), checked to be active.
fn target(relid: pg_sys::Oid) -> Result<Rc<Target>, FenceError> {
    let replica = crate::pg::process::replica_mode();
    let cached = TARGETS.with(|t| t.borrow().get(&relid.to_u32()).cloned());
    let found = match cached {
        Some(Some(t)) if t.replica_role == replica => Some(t),
        Some(None) => None,
        _ => {
            let t = load_target(relid, replica)?.map(Rc::new);
            TARGETS.with(|m| {
                crate::cache::cache_insert(&mut m.borrow_mut(), relid.to_u32(), t.clone(), 1000)
            });
            t
        }
    };
    let t = found.ok_or_else(|| {
        call_error(
            FenceError::NotProtected,
            format!("table {} is not protected by pg_fencing", regclass_text(relid)),
            None,
            Some("Run SELECT fencing_protect('table') first; fenced writes refuse tables without an active protection.".into()),
        )
    })?;
    if let Some(why) = &t.inactive {
        return Err(crate::rule::inactive(&regclass_text(relid), why));
    }
    Ok(t)
}

fn load_target(relid: pg_sys::Oid, replica: bool) -> Result<Option<Target>, FenceError> {
    // SAFETY: a syscache probe by value (RELOID takes one key) on the main thread inside a
    // transaction; it only returns whether the row exists.
    let exists = unsafe {
        pg_sys::SearchSysCacheExists(
            pg_sys::SysCacheIdentifier::RELOID as c_int,
            relid.into(),
            0.into(),
            0.into(),
            0.into(),
        )
    };
    if !exists {
        return Ok(None);
    }
    let row = Spi::connect(|client| {
        let rows = client.select(
            "SELECT p.token_column::pg_catalog.text,
                    _pg_fencing.inactive_reason(p.relid, p.resource),
                    ARRAY(SELECT a.attname::pg_catalog.text
                          FROM pg_catalog.pg_index i
                          CROSS JOIN LATERAL pg_catalog.unnest(i.indkey::pg_catalog.int2[]) WITH ORDINALITY AS k(attnum, ord)
                          JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) i.indrelid
                                                        AND a.attnum OPERATOR(pg_catalog.=) k.attnum
                          WHERE i.indrelid OPERATOR(pg_catalog.=) $1 AND i.indisprimary
                            AND k.ord OPERATOR(pg_catalog.<=) i.indnkeyatts
                          ORDER BY k.ord),
                    ARRAY(SELECT a.attname::pg_catalog.text FROM pg_catalog.pg_attribute a
                          WHERE a.attrelid OPERATOR(pg_catalog.=) $1 AND a.attnum OPERATOR(pg_catalog.>) 0
                            AND NOT a.attisdropped),
                    pg_catalog.quote_ident(n.nspname) OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(c.relname)
             FROM _pg_fencing.protected_table p, pg_catalog.pg_class c
             JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
             WHERE c.oid OPERATOR(pg_catalog.=) $1
               AND p.relid OPERATOR(pg_catalog.=) coalesce(pg_catalog.pg_partition_root($1), $1) AND p.protected",
            Some(1),
            &[relid.into()],
        )?;
        if rows.is_empty() {
            return Ok(None);
        }
        let r = rows.first();
        Ok::<_, spi::Error>(Some((
            r.get::<String>(1)?.unwrap_or_default(),
            r.get::<String>(2)?,
            r.get::<Vec<String>>(3)?.unwrap_or_default(),
            r.get::<Vec<String>>(4)?.unwrap_or_default(),
            r.get::<String>(5)?.unwrap_or_default(),
        )))
    })
    .map_err(|e| FenceError::Internal(format!("reading the protection of a table: {e}")))?;
    Ok(
        row.map(|(token_column, inactive, pk, columns, qualified)| Target {
            qualified,
            token_column,
            pk,
            columns: columns.into_iter().collect(),
            inactive,
            replica_role: replica,
        }),
    )
}

/// The jsonb argument `argno`, checked to be an object, and its members (name -> raw JSON text).
///
/// # Safety
/// `fcinfo` must be the call's own argument block, and argument `argno` (which must exist) a
/// `jsonb`.
unsafe fn json_object(
    fcinfo: pg_sys::FunctionCallInfo,
    argno: usize,
    what: &str,
) -> Result<(pg_sys::Datum, Members), FenceError> {
    // SAFETY: `fcinfo` is valid (this function's contract); `args` has `nargs` entries and the
    // slice index is bounds-checked.
    let (datum, isnull) = unsafe {
        let arg = (*fcinfo).args.as_slice((*fcinfo).nargs as usize)[argno];
        (arg.value, arg.isnull)
    };
    let members = if isnull {
        Err(ShapeError::NotObject)
    } else {
        // SAFETY: not NULL (checked), and a jsonb argument (this function's contract).
        unsafe { jsonb_members(datum) }.ok_or(ShapeError::NotObject)
    };
    members
        .map(|m| (datum, m))
        .map_err(|e| shape_error(e, pg_sys::Oid::INVALID, what))
}

/// The top-level members of a jsonb object (name -> whether its value is JSON null, which is all
/// the argument checks need: see `pg_fencing_core::json`), read from the jsonb itself; `None` if
/// it is not an object.
///
/// # Safety
/// `datum` must be a valid, non-NULL `jsonb` datum.
unsafe fn jsonb_members(datum: pg_sys::Datum) -> Option<Members> {
    // SAFETY: `datum` is a non-NULL jsonb (this function's contract); pg_detoast_datum returns
    // it, or a detoasted copy in the current memory context, as a Jsonb whose header says
    // whether its root container is an object. JsonbIteratorInit/Next walk that container
    // (skipNested: nested containers come back as one jbvBinary value); a key is a jbvString
    // whose `val.string` points at `len` bytes inside the jsonb, copied at once. The iterator
    // frees itself when it reaches WJB_DONE.
    unsafe {
        let jb = pg_sys::pg_detoast_datum(datum.cast_mut_ptr()).cast::<pg_sys::Jsonb>();
        if (*jb).root.header & pg_sys::JB_FOBJECT == 0 {
            return None;
        }
        let mut it = pg_sys::JsonbIteratorInit(&mut (*jb).root);
        let mut v = pg_sys::JsonbValue {
            type_: pg_sys::jbvType::jbvNull,
            val: std::mem::zeroed(),
        };
        let mut out = Members::new();
        let mut key: Option<String> = None;
        loop {
            let token = pg_sys::JsonbIteratorNext(&mut it, &mut v, true);
            match token {
                pg_sys::JsonbIteratorToken::WJB_DONE => break,
                pg_sys::JsonbIteratorToken::WJB_KEY => {
                    let s = v.val.string;
                    let bytes = std::slice::from_raw_parts(s.val.cast::<u8>(), s.len as usize);
                    key = Some(String::from_utf8_lossy(bytes).into_owned());
                }
                pg_sys::JsonbIteratorToken::WJB_VALUE => {
                    if let Some(k) = key.take() {
                        out.insert(k, v.type_ == pg_sys::jbvType::jbvNull);
                    }
                }
                _ => {}
            }
        }
        Some(out)
    }
}

/// The text form of a jsonb datum.
///
/// # Safety
/// `datum` must be a valid, non-NULL `jsonb` datum.
unsafe fn jsonb_text(datum: pg_sys::Datum) -> String {
    // SAFETY: `datum` is a non-NULL jsonb (this function's contract); jsonb_out detoasts it and
    // returns a palloc'd cstring, copied at once.
    unsafe {
        pgrx::direct_function_call::<&CStr>(pg_sys::jsonb_out, &[Some(datum)])
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// Checks that every member of `object` names a column (42703) other than the token column
/// (22023); returns the names, sorted.
fn columns_of(
    relid: pg_sys::Oid,
    t: &Target,
    object: &Members,
    what: &str,
) -> Result<Vec<String>, FenceError> {
    json::check_columns(object, &t.columns, &t.token_column).map_err(|e| match e {
        ShapeError::SetsTokenColumn => call_error(
            FenceError::ArgumentShape,
            format!(
                "{what} must not set the token column {}",
                quote(&t.token_column)
            ),
            None,
            Some("pg_fencing stamps the token column with the write's fencing token.".into()),
        ),
        other => shape_error(other, relid, what),
    })
}

/// Checks that `key` names exactly the primary key columns, none of them null.
fn key_match(relid: pg_sys::Oid, t: &Target, key: &Members) -> Result<(), FenceError> {
    json::check_key(key, &t.pk).map_err(|e| {
        let hint = Some(format!(
            "The key must name exactly the primary key columns: {}.",
            t.pk.join(", ")
        ));
        let list = |v: &[String]| v.iter().map(|c| quote(c)).collect::<Vec<_>>().join(", ");
        match e {
            ShapeError::KeyMissing(cols) => call_error(
                FenceError::ArgumentShape,
                format!(
                    "key lacks primary key column(s) {} of {}",
                    list(&cols),
                    regclass_text(relid)
                ),
                None,
                hint,
            ),
            ShapeError::KeyExtra(cols) => call_error(
                FenceError::ArgumentShape,
                format!(
                    "key names column(s) {} that are not in the primary key of {}",
                    list(&cols),
                    regclass_text(relid)
                ),
                None,
                hint,
            ),
            ShapeError::KeyNull(cols) => call_error(
                FenceError::ArgumentShape,
                format!("key column(s) {} must not be null", list(&cols)),
                None,
                None,
            ),
            other => shape_error(other, relid, "key"),
        }
    })
}

/// The PostgreSQL error for a shape error of argument `what` of a call on `relid`.
fn shape_error(e: ShapeError, relid: pg_sys::Oid, what: &str) -> FenceError {
    match e {
        ShapeError::NotObject => call_error(
            FenceError::ArgumentShape,
            format!("{what} must be a JSON object of column names and values"),
            None,
            None,
        ),
        ShapeError::UnknownColumn(c) => call_error(
            FenceError::UndefinedColumn,
            format!(
                "column {} of relation {} does not exist",
                quote(&c),
                regclass_text(relid)
            ),
            Some(format!("It is named in {what}.")),
            None,
        ),
        ShapeError::SetsTokenColumn => call_error(
            FenceError::ArgumentShape,
            format!("{what} must not set the token column"),
            None,
            None,
        ),
        ShapeError::NoPrimaryKey => call_error(
            FenceError::InvalidTableDefinition,
            format!("table {} has no primary key", regclass_text(relid)),
            None,
            Some("fenced_update and fenced_delete find the row by its primary key.".into()),
        ),
        ShapeError::KeyMissing(c) | ShapeError::KeyExtra(c) | ShapeError::KeyNull(c) => call_error(
            FenceError::ArgumentShape,
            format!(
                "key must name exactly the primary key columns (not {})",
                c.join(", ")
            ),
            None,
            None,
        ),
    }
}

/// The kept plan of the statement for this table, operation and set of columns.
fn plan_for(key: (u32, Op, Vec<String>), t: &Target, cols: &[String]) -> pg_sys::SPIPlanPtr {
    if let Some(p) = PLANS.with(|p| p.borrow().get(&key)) {
        return p;
    }
    let q = &t.qualified;
    // Values reach the statement as jsonb and are converted by jsonb_populate_record, so each
    // column's own type input rules apply. The key is compared with a field of that record
    // (an expression, not a function scan joined to the table: the index scan evaluates it once),
    // and a single changed column is set the same way; several changed columns come from one
    // function scan of the record.
    let populated = |param: u32| format!("pg_catalog.jsonb_populate_record(NULL::{q}, ${param})");
    let key_match =
        t.pk.iter()
            // The key type's own `=` as the caller's search_path finds it (citext, ltree, ...),
            // as a plain `WHERE key = value` would (and as before).
            .map(|c| format!("t.{0} = ({1}).{0}", quote(c), populated(1)))
            .collect::<Vec<_>>()
            .join(" AND ");
    let names = cols.iter().map(|c| quote(c)).collect::<Vec<_>>();
    let sql = match key.1 {
        Op::Update if names.len() == 1 => format!(
            "UPDATE {q} AS t SET {0} = ({1}).{0} WHERE {key_match} RETURNING pg_catalog.to_jsonb(t.*)",
            names[0],
            populated(2),
        ),
        Op::Update => format!(
            "UPDATE {q} AS t SET {} FROM {} AS r WHERE {key_match} RETURNING pg_catalog.to_jsonb(t.*)",
            names.iter().map(|c| format!("{c} = r.{c}")).collect::<Vec<_>>().join(", "),
            populated(2),
        ),
        Op::Insert if cols.is_empty() => {
            format!("INSERT INTO {q} AS t DEFAULT VALUES RETURNING pg_catalog.to_jsonb(t.*)")
        }
        Op::Insert => format!(
            "INSERT INTO {q} AS t ({}) SELECT {} FROM {} AS r RETURNING pg_catalog.to_jsonb(t.*)",
            names.join(", "),
            names.iter().map(|c| format!("r.{c}")).collect::<Vec<_>>().join(", "),
            populated(1),
        ),
        Op::Delete => format!(
            "DELETE FROM {q} AS t WHERE {key_match} RETURNING pg_catalog.to_jsonb(t.*)"
        ),
    };
    let nargs: usize = match key.1 {
        Op::Update => 2,
        Op::Insert if cols.is_empty() => 0,
        _ => 1,
    };
    let types = [pg_sys::JSONBOID; 2];
    // Prepared outside the cache's borrow: preparing may process invalidations, whose callback
    // clears this cache (`invalidate`).
    let generation = PLANS.with(|p| p.borrow().generation());
    let plan = crate::pg::spi::prepare_kept(&sql, &types[..nargs]);
    PLANS.with(|p| p.borrow_mut().keep(key, plan, generation))
}

/// Per-backend state's life (`backend.rs`): cached `fenced_*` plans that went stale are freed
/// when a transaction ends, and every target is looked up again when a relation changed.
pub fn on_event(ev: BackendEvent) {
    if ev.ends_transaction() {
        free_stale_plans();
    }
    if let BackendEvent::Relcache(_) = ev {
        invalidate();
    }
}
