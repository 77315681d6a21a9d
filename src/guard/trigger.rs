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
//! The decision itself is in `rule`; PostgreSQL's trigger structures are read through the safe
//! values of `pg/trigger_event.rs` (no `unsafe` here).

#![forbid(unsafe_code)]

use crate::backend_event::BackendEvent;
use crate::error::{FenceError, Token};
use crate::pg::key_identity::{KeyColumn, KeyIdentity};
use crate::pg::spi;
use crate::pg::trigger_event::{ColumnProblem, Relation, Row, TriggerEvent, TriggerOp};
use crate::rule;
use pgrx::pg_sys;
use rustc_hash::FxHashMap;
use std::cell::{Cell, RefCell};
use std::ffi::{CStr, CString};

thread_local! {
    /// (relation, protection id, resource, token column) combinations whose trigger arguments
    /// were found to match `_pg_fencing.protected_table`. Kept for the life of the backend: a
    /// protection's arguments only change through fencing_protect/fencing_unprotect, which
    /// re-create or drop the triggers (and only the table's owner can attach triggers to it).
    static VERIFIED: RefCell<FxHashMap<(u32, u64), ()>> = RefCell::new(FxHashMap::default());
    /// Per relation (and token column): the token column's attribute number and the primary
    /// key. Dropped on relcache invalidation of the relation (see `forget_relation`).
    static RELINFO: RefCell<FxHashMap<(u32, u64), RelInfo>> = RefCell::new(FxHashMap::default());
}

thread_local! {
    /// The tokens pg_fencing stamped into rows of tables of the set-based shape in this
    /// transaction (by a column default, a stamping expression, an admitted COPY): the AFTER
    /// INSERT trigger of such a table accepts no other value in a row's token column but the
    /// writer's own. With the last one noted (almost always the only one), looked at first.
    static STAMPED: RefCell<(Option<Token>, rustc_hash::FxHashSet<Token>)> =
        RefCell::new((None, rustc_hash::FxHashSet::default()));
}

/// `token` was stamped into a row by pg_fencing (see `STAMPED`).
pub fn note_stamped_token(token: Token) {
    STAMPED.with(|s| {
        let mut s = s.borrow_mut();
        if s.0 != Some(token) {
            s.0 = Some(token);
            s.1.insert(token);
        }
    });
}

fn stamped_in_transaction(token: Token) -> bool {
    STAMPED.with(|s| s.borrow().1.contains(&token))
}

/// 22023: a row inserted into a table of the set-based shape carries `given` in its token
/// column, which pg_fencing did not stamp.
pub(crate) fn unstamped_token(table: &str, given: Option<Token>) -> FenceError {
    FenceError::ArgumentShape(crate::error::Text {
        message: format!(
            "a row inserted into protected table {table} gives its token column {}, not a fencing \
             token the writer carries",
            given.map_or("NULL".to_string(), |v| v.to_string())
        ),
        detail: Some(
            "The table has the set-based shape: pg_fencing stamps the token column through its \
             default or the planner, and cannot overwrite a value that the statement gives."
                .into(),
        ),
        hint: Some(
            "Leave the token column out of the INSERT, or give it the writer's token.".into(),
        ),
    })
}

thread_local! {
    static FIRINGS: Cell<Firings> = const {
        Cell::new(Firings { guarded_rows: 0, after_expected: 0, after_fired: 0, unguarded_statements: 0 })
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
    /// UPDATEs on the fast path (`guard/fast_path.rs`) with a result relation whose guard
    /// trigger is missing or disabled.
    pub unguarded_statements: u64,
}

/// The counts now (see [`Firings`]).
pub fn firings() -> Firings {
    FIRINGS.with(|f| f.get())
}

/// A row admitted by the fast path's stamping function (counts as a guard firing).
pub fn count_guarded() {
    count(|f| f.guarded_rows = f.guarded_rows.wrapping_add(1));
}

/// A row of a fast-path INSERT whose AFTER INSERT trigger is to check its key.
pub fn count_after_expected() {
    count(|f| f.after_expected = f.after_expected.wrapping_add(1));
}

/// A row of a fast-path INSERT whose key check the INSERT's own RETURNING list took over from
/// the AFTER INSERT trigger (`fast_path::insert_row`).
pub fn count_after_fired() {
    count(|f| f.after_fired = f.after_fired.wrapping_add(1));
}

/// A fast-path UPDATE with a result relation whose guard trigger is missing or disabled.
pub fn count_unguarded_statement() {
    count(|f| f.unguarded_statements = f.unguarded_statements.wrapping_add(1));
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
    token_attnum: i16,
    pk: Vec<i16>,
    pk_immediate: bool,
    /// Per-row mode: another `BEFORE UPDATE` row trigger may change a row's key where the guard
    /// cannot see it, or the primary key is no longer the columns listed, but
    /// `zz_pg_fencing_rekey` is the column-list form, which fires only for UPDATEs that set a
    /// listed column. `fencing_protect` and the DDL event trigger install the
    /// general form (`WHEN` the key changed) in that case; if they did not run, writes are refused
    /// (FT004) rather than let a new key escape its tombstone.
    rekey_misses: bool,
    /// Per-row mode: how the key meets its tombstones (`pg/key_identity.rs`).
    identity: std::rc::Rc<KeyIdentity>,
    /// The table has the set-based shape (`super::set_based`): no BEFORE INSERT row trigger.
    set_based: bool,
}

/// A row's key as tombstones know it (see `state::tombstones::TombKey`).
struct KeyOf {
    text: String,
    values: Vec<pg_sys::Datum>,
    hash: Option<i64>,
}

fn key_of(row: &Row, pk: &[i16], identity: &KeyIdentity) -> KeyOf {
    let text = row.key_text(pk);
    if !identity.is_hashed() {
        return KeyOf {
            text,
            values: Vec::new(),
            hash: None,
        };
    }
    let values = row.values(pk);
    let hash = identity.hash(&values);
    KeyOf { text, values, hash }
}

/// The same key, by text or by the key's equality.
fn same_key(a: &KeyOf, b: &KeyOf, identity: &KeyIdentity) -> bool {
    a.text == b.text
        || (identity.is_hashed() && a.hash == b.hash && identity.equal(&a.values, &b.values))
}

/// Admit `key` as a new key of the table (`rule::admit_row_insert`).
fn admit_new_key(
    protection: i64,
    table: &dyn Fn() -> String,
    key: &KeyOf,
    identity: &KeyIdentity,
    token: Token,
    count: bool,
) -> Result<(), FenceError> {
    let same = |text: &str| identity.equals_text(&key.values, text);
    let tomb = rule::TombKey {
        text: &key.text,
        hash: key.hash,
        same: &same,
    };
    rule::admit_row_insert(protection, table, &tomb, token, count)
}

fn record_delete(protection: i64, key: &KeyOf, token: Token) {
    crate::state::tombstones::record_row_delete(protection, &key.text, key.hash, token);
}

/// Relcache invalidation of `relid` (`None`: of every relation): its cached trigger arguments
/// and table information are stale (called by `backend.rs`).
fn forget_relation(relid: Option<pg_sys::Oid>) {
    ARGS.with(|a| a.borrow_mut().clear());
    RELINFO.with(|r| {
        let mut r = r.borrow_mut();
        match relid {
            None => r.clear(),
            Some(relid) => r.retain(|(id, _), _| *id != relid.to_u32()),
        }
    });
}

impl Args {
    /// Arguments as `fencing_protect` writes them (for the fast path's stamping calls, which
    /// carry them as constants).
    pub(crate) fn new(protection: i64, resource: Option<String>, token_column: CString) -> Args {
        let mut args = Args {
            protection,
            resource,
            token_column,
            hash: 0,
        };
        args.hash = args_hash(&args);
        args
    }
}

fn args_hash(args: &Args) -> u64 {
    pg_fencing_core::hash::fnv1a(&[
        &args.protection.to_le_bytes(),
        args.resource.as_deref().unwrap_or("").as_bytes(),
        args.token_column.as_bytes(),
    ])
}

/// Token column and primary key of `rel`, from the per-backend cache.
fn relinfo(
    event: &TriggerEvent,
    args: &Args,
    table: &dyn Fn() -> String,
) -> Result<RelInfo, FenceError> {
    let rel = event.relation();
    let key = (rel.id().to_u32(), args.hash);
    if let Some(info) = RELINFO.with(|r| r.borrow().get(&key).cloned()) {
        return Ok(info);
    }
    let token_attnum = rel.bigint_column(&args.token_column).map_err(|e| {
        let column = args.token_column.to_string_lossy();
        FenceError::TriggerProtocol(match e {
            ColumnProblem::Missing => {
                format!(
                    "protected table {} has no token column \"{column}\"",
                    table()
                )
            }
            ColumnProblem::NotBigint => {
                format!("token column \"{column}\" of {} must be bigint", table())
            }
        })
    })?;
    let (pk, pk_immediate) = rel.primary_key();
    let triggers = rel.update_triggers(event.function_oid(), c"zz_pg_fencing_rekey");
    // A primary key changed after fencing_protect leaves the column list stale.
    let stale_columns = {
        let mut listed = triggers.rekey_columns.clone();
        let mut key = pk.clone();
        listed.sort_unstable();
        key.sort_unstable();
        listed != key
    };
    let identity = if args.resource.is_none() {
        let cols: Vec<KeyColumn> = pk
            .iter()
            .map(|a| {
                let (typid, typmod, collation) = rel.column_type(*a);
                KeyColumn {
                    typid,
                    typmod,
                    collation,
                }
            })
            .collect();
        KeyIdentity::new(&cols)
    } else {
        KeyIdentity::new(&[])
    };
    let set_based = rel
        .trigger_named(super::GUARD)
        .is_some_and(|g| super::set_based(&g));
    let info = RelInfo {
        set_based,
        identity: std::rc::Rc::new(identity),
        token_attnum,
        pk,
        pk_immediate,
        rekey_misses: args.resource.is_none()
            && triggers.rekey_by_column
            && (triggers.others_before || stale_columns),
    };
    RELINFO.with(|r| crate::cache::cache_insert(&mut r.borrow_mut(), key, info.clone(), 10_000));
    Ok(info)
}

/// Forget the verified relations (subtransaction abort: a check may have read rows that are
/// now rolled back).
fn forget_verified() {
    VERIFIED.with(|v| v.borrow_mut().clear());
}

/// `fencing_guard()` is an ordinary trigger function, so anyone may attach it to a table of
/// their own with made-up arguments. Its arguments are trusted only if they are exactly what
/// `fencing_protect` recorded for this table (or the root of its partition tree); otherwise a
/// role could write tombstones or marks into another table's protection.
pub(crate) fn verify_protection(
    relid: pg_sys::Oid,
    args: &Args,
    table: &dyn Fn() -> String,
) -> Result<(), FenceError> {
    let cache_key = (relid.to_u32(), args.hash);
    if VERIFIED.with(|v| v.borrow().contains_key(&cache_key)) {
        return Ok(());
    }
    let resource = args.resource.clone().unwrap_or_default();
    let column = args.token_column.to_string_lossy().into_owned();
    let ok = spi::exec_internal(
        "SELECT true FROM _pg_fencing.protected_table p WHERE p.id OPERATOR(pg_catalog.=) $1 AND p.protected \
         AND p.relid OPERATOR(pg_catalog.=) coalesce(pg_catalog.pg_partition_root($2), $2) \
         AND (p.resource OPERATOR(pg_catalog.=) $3 OR (p.resource IS NULL AND $3 OPERATOR(pg_catalog.=) '')) \
         AND p.token_column OPERATOR(pg_catalog.=) $4::pg_catalog.name",
        true,
        &[pg_sys::INT8OID, pg_sys::REGCLASSOID, pg_sys::TEXTOID, pg_sys::TEXTOID],
        &mut [
            pg_sys::Datum::from(args.protection),
            pg_sys::Datum::from(relid),
            spi::text_datum(&resource),
            spi::text_datum(&column),
        ],
        true,
        |d| d.value() != 0,
    )
    .unwrap_or(false);
    if !ok {
        // A protection that exists but cannot hold (its table attached as a partition of
        // another, say) refuses with its reason (FT004), as every write to it does.
        rule::require_active(args.protection, table)?;
        return Err(FenceError::NotAllowed(crate::error::Text::new(format!(
            "fencing_guard() on {} does not match a protection made by fencing_protect()",
            table()
        ))));
    }
    VERIFIED.with(|v| crate::cache::cache_insert(&mut v.borrow_mut(), cache_key, (), 10_000));
    Ok(())
}

pub(crate) struct Args {
    pub protection: i64,
    pub resource: Option<String>,
    pub token_column: CString,
    /// `args_hash` of the above, for the per-backend caches.
    hash: u64,
}

thread_local! {
    /// Parsed arguments per trigger OID (a trigger's arguments never change; dropped with the
    /// other caches on relcache invalidation, so a reused OID is parsed again).
    static ARGS: RefCell<FxHashMap<u32, std::rc::Rc<Args>>> = RefCell::new(FxHashMap::default());
}

/// The guard's arguments, parsed once per trigger and backend.
fn trigger_args(event: &TriggerEvent) -> Result<std::rc::Rc<Args>, FenceError> {
    args_of(event.trigger_oid(), &event.args())
}

/// The guard's arguments of trigger `oid` (its `tgargs`), parsed once per trigger and backend.
pub(crate) fn args_of<S: AsRef<CStr>>(
    oid: u32,
    arg: &[S],
) -> Result<std::rc::Rc<Args>, FenceError> {
    args_of_lazy(oid, || arg.iter().map(|a| a.as_ref().to_owned()).collect())
}

/// As [`args_of`], reading the arguments only if they are not cached yet.
pub(crate) fn args_of_lazy(
    oid: u32,
    arg: impl FnOnce() -> Vec<CString>,
) -> Result<std::rc::Rc<Args>, FenceError> {
    if let Some(a) = ARGS.with(|m| m.borrow().get(&oid).cloned()) {
        return Ok(a);
    }
    let args = std::rc::Rc::new(parse_trigger_args(&arg())?);
    ARGS.with(|m| crate::cache::cache_insert(&mut m.borrow_mut(), oid, args.clone(), 10_000));
    Ok(args)
}

fn parse_trigger_args<S: AsRef<CStr>>(arg: &[S]) -> Result<Args, FenceError> {
    let bad = || {
        FenceError::TriggerProtocol(
            "fencing_guard() must be installed by fencing_protect() (expected 3 arguments)".into(),
        )
    };
    let arg: Vec<&CStr> = arg.iter().map(|a| a.as_ref()).collect();
    if arg.len() != 3 {
        return Err(bad());
    }
    let protection = arg[0]
        .to_str()
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(bad)?;
    let resource = arg[1].to_string_lossy().into_owned();
    let mut args = Args {
        protection,
        resource: if resource.is_empty() {
            None
        } else {
            Some(resource)
        },
        token_column: arg[2].to_owned(),
        hash: 0,
    };
    args.hash = args_hash(&args);
    Ok(args)
}

/// Primary key columns of a per-row protected table. Per-row mode relies on the primary key's
/// unique check waiting for an in-flight delete of the same key (see `rule`); a DEFERRABLE
/// key does not wait there, so it is refused (42P16).
fn primary_key_attnums(rel: Relation) -> Result<Vec<i16>, FenceError> {
    let (cols, immediate) = rel.primary_key();
    check_primary_key(rel, cols, immediate)
}

/// `cols`, unless the key is missing or DEFERRABLE (42P16).
fn check_primary_key(
    rel: Relation,
    cols: Vec<i16>,
    immediate: bool,
) -> Result<Vec<i16>, FenceError> {
    if cols.is_empty() || !immediate {
        let table = rel.name();
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

/// The body of `fencing_guard()`: the trigger's result datum, or the error to raise. What every
/// event shares is here (the arguments verified, replica mode recorded, an inactive protection
/// refused); each kind of event has its own function below, so that each write path's checks
/// are in one place: `fire_statement` (BEFORE INSERT/UPDATE/DELETE FOR EACH STATEMENT),
/// `fire_truncate`, `fire_before_row` (per mode and event), `fire_after_row`.
pub fn fire(event: TriggerEvent) -> Result<pg_sys::Datum, FenceError> {
    let args = trigger_args(&event)?;
    let rel = event.relation();

    // The table's name is only needed for error messages: printed lazily.
    let table_fn = || rel.name();
    let table: &dyn Fn() -> String = &table_fn;
    verify_protection(rel.id(), &args, table)?;
    if crate::pg::process::replica_mode() {
        // Logical replication's apply worker (or a session in replica mode): only the
        // REPLICA trigger zz_pg_fencing_replica fires; it records, never refuses.
        return record_replicated(&event, &args, table);
    }
    // A protection that cannot hold refuses every write (FT004), whatever the token.
    rule::require_active(args.protection, table)?;
    match (event.row_level(), event.op()) {
        (false, TriggerOp::Truncate) => fire_truncate(&event, &args, table),
        (false, _) => fire_statement(&event, &args, table),
        (true, _) if event.before() => fire_before_row(&event, &args, table),
        (true, _) => fire_after_row(&event, &args, table),
    }
}

const NO_ROW: pg_sys::Datum = pg_sys::Datum::null();

/// BEFORE INSERT/UPDATE/DELETE FOR EACH STATEMENT. Resource mode: take the resource's lock before
/// the executor locks any row, so that every transaction takes resource lock, then row locks, in
/// that order (a row trigger runs after its row is locked; taking the resource lock there first
/// could deadlock against a holder of the resource lock that waits for that row). Without a
/// token the row triggers raise FT002. Per-row mode in the set-based shape has it for INSERT
/// only, to refuse (in `fire`, `rule::require_active`) a write where the library was not
/// preloaded before any row is written.
fn fire_statement(
    _event: &TriggerEvent,
    args: &Args,
    _table: &dyn Fn() -> String,
) -> Result<pg_sys::Datum, FenceError> {
    if let Some(resource) = &args.resource {
        if let Some(token) = rule::write_token_if_any()? {
            rule::admit_resource(resource, token, false)?;
        }
    }
    Ok(NO_ROW)
}

/// BEFORE TRUNCATE (statement level).
fn fire_truncate(
    event: &TriggerEvent,
    args: &Args,
    table: &dyn Fn() -> String,
) -> Result<pg_sys::Datum, FenceError> {
    let token = rule::write_token(&|| format!("a write to protected table {}", table()))?;
    if event.before() {
        truncate(event.relation(), args, &table(), token)?;
    }
    Ok(NO_ROW)
}

/// AFTER INSERT (both modes) and, in per-row mode, AFTER UPDATE of a row whose key changed (the
/// trigger's WHEN clause): the row is in the table and in its unique index now. The token is the
/// one the BEFORE trigger (or the stamping expression) stamped into the row, even if the
/// session's setting changed later in the statement.
fn fire_after_row(
    event: &TriggerEvent,
    args: &Args,
    table: &dyn Fn() -> String,
) -> Result<pg_sys::Datum, FenceError> {
    let token = rule::write_token(&|| format!("a write to protected table {}", table()))?;
    let rel = event.relation();
    let op = event.op();
    let Some(row) = event.row() else {
        return Ok(NO_ROW);
    };
    let info = relinfo(event, args, table)?;
    let written = if op == TriggerOp::Update {
        new_row_of(event)?
    } else {
        row
    };
    let stamped = if info.set_based && op == TriggerOp::Insert {
        // No BEFORE INSERT trigger stamped this row: its token column has what the statement
        // gave it, by the column's default (`_pg_fencing.stamp_default`), a stamping expression
        // or a value of its own. Only the writer's token, or one pg_fencing stamped in this
        // transaction, counts: another value (a stale writer's higher number, NULL) is refused.
        let given = written.bigint(info.token_attnum);
        match given {
            // (and its lock or lease must still hold, as when it was stamped)
            Some(t) if t == token => t,
            Some(t) if stamped_in_transaction(t) => rule::admit_token(t)?,
            // The default stamps NULL without a token: FT002 (`write_token` above raised it
            // already unless the session has one now).
            _ => return Err(unstamped_token(&table(), given)),
        }
    } else {
        written.bigint(info.token_attnum).unwrap_or(token)
    };
    count(|f| f.after_fired = f.after_fired.wrapping_add(1));
    match &args.resource {
        Some(resource) if op == TriggerOp::Insert => {
            rule::admit_resource(resource, stamped, true)?;
        }
        None if op == TriggerOp::Insert || op == TriggerOp::Update => {
            let pk = check_primary_key(rel, info.pk.clone(), info.pk_immediate)?;
            let identity = &*info.identity;
            let key = key_of(&written, &pk, identity);
            let old_key = (op == TriggerOp::Update).then(|| key_of(&row, &pk, identity));
            if old_key
                .as_ref()
                .is_some_and(|old| same_key(old, &key, identity))
            {
                // An UPDATE that set a key column to the value it had, or to an equal one
                // (the column-list form of zz_pg_fencing_rekey fires for those too): no new
                // key.
                return Ok(NO_ROW);
            }
            admit_new_key(args.protection, table, &key, identity, stamped, true)?;
            if let Some(old_key) = old_key {
                // The key changed, possibly by another BEFORE trigger than the guard: the
                // old key is gone, so it keeps a tombstone.
                record_delete(args.protection, &old_key, stamped);
            }
        }
        _ => {}
    }
    Ok(NO_ROW)
}

/// The new row version of an UPDATE event (39P01 if PostgreSQL gave none).
fn new_row_of<'a>(event: &TriggerEvent<'a>) -> Result<Row<'a>, FenceError> {
    event.new_row().ok_or_else(|| {
        FenceError::TriggerProtocol("an UPDATE trigger call without its new row".into())
    })
}

/// BEFORE INSERT/UPDATE/DELETE FOR EACH ROW: the row's check by mode and event, and its stamp.
fn fire_before_row(
    event: &TriggerEvent,
    args: &Args,
    table: &dyn Fn() -> String,
) -> Result<pg_sys::Datum, FenceError> {
    let token = rule::write_token(&|| format!("a write to protected table {}", table()))?;
    let rel = event.relation();
    let Some(row) = event.row() else {
        return Ok(NO_ROW);
    };
    let info = relinfo(event, args, table)?;
    let attnum = info.token_attnum;
    let pk_of = || check_primary_key(rel, info.pk.clone(), info.pk_immediate);
    let new_row = || new_row_of(event);
    // Counted for fenced_* calls, which check that every row they wrote came through here.
    count(|f| f.guarded_rows = f.guarded_rows.wrapping_add(1));
    match (&args.resource, event.op()) {
        (Some(resource), TriggerOp::Insert) => {
            rule::admit_resource(resource, token, false)?;
            count(|f| f.after_expected = f.after_expected.wrapping_add(1));
            Ok(row.with_bigint(attnum, token))
        }
        (Some(resource), TriggerOp::Update) => {
            rule::admit_resource(resource, token, true)?;
            Ok(new_row()?.with_bigint(attnum, token))
        }
        (Some(resource), _delete) => {
            rule::admit_resource(resource, token, true)?;
            Ok(row.datum())
        }
        (None, TriggerOp::Insert) => {
            // The key's tombstone is checked by the AFTER INSERT trigger, once the row is in
            // the unique index (see `rule`); here the row only gets its token.
            if !info.pk_immediate || info.pk.is_empty() {
                pk_of()?;
            }
            count(|f| f.after_expected = f.after_expected.wrapping_add(1));
            Ok(row.with_bigint(attnum, token))
        }
        (None, TriggerOp::Update) => {
            if info.rekey_misses {
                return Err(FenceError::NotProtected(crate::error::Text {
                    message: format!("protection of table {} is not active", table()),
                    detail: Some(
                        "Another BEFORE UPDATE row trigger may change a row's primary key, or \
                         the primary key changed, but trigger zz_pg_fencing_rekey only fires for \
                         UPDATEs that set one of the columns it lists."
                            .into(),
                    ),
                    hint: Some(format!(
                        "Run SELECT fencing_protect('{}') again; it installs the form of \
                         zz_pg_fencing_rekey that checks every key change.",
                        table().replace('\'', "''")
                    )),
                }));
            }
            let pk = pk_of()?;
            let old = row;
            let new = new_row()?;
            rule::admit_row(
                args.protection,
                table,
                &|| old.key_text(&pk),
                token,
                old.bigint(attnum),
                true,
            )?;
            // Only an UPDATE that sets a key column can change the key (a key changed by a
            // later BEFORE trigger is caught by the AFTER UPDATE trigger).
            if pk.iter().any(|a| event.updates_column(*a)) {
                let identity = &*info.identity;
                let old_key = key_of(&old, &pk, identity);
                let new_key = key_of(&new, &pk, identity);
                if !same_key(&old_key, &new_key, identity) {
                    // The key changes: the old key is deleted, the new one is inserted.
                    admit_new_key(args.protection, table, &new_key, identity, token, false)?;
                    record_delete(args.protection, &old_key, token);
                    count(|f| f.after_expected = f.after_expected.wrapping_add(1));
                }
            }
            Ok(new.with_bigint(attnum, token))
        }
        (None, _delete) => {
            let pk = pk_of()?;
            let key = key_of(&row, &pk, &info.identity);
            rule::admit_row(
                args.protection,
                table,
                &|| key.text.clone(),
                token,
                row.bigint(attnum),
                true,
            )?;
            record_delete(args.protection, &key, token);
            Ok(row.datum())
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
fn record_replicated(
    event: &TriggerEvent,
    args: &Args,
    table: &dyn Fn() -> String,
) -> Result<pg_sys::Datum, FenceError> {
    // (row level: BEFORE in the row-trigger shape, AFTER in the set-based one)
    if !event.row_level() {
        return Ok(pg_sys::Datum::from(0usize));
    }
    let rel = event.relation();
    let info = relinfo(event, args, table)?;
    let attnum = info.token_attnum;
    let (old, new): (Option<Row>, Option<Row>) = match event.op() {
        TriggerOp::Insert => (None, event.row()),
        TriggerOp::Update => (event.row(), event.new_row()),
        _ => (event.row(), None),
    };
    let positive = |t: Option<Token>| t.filter(|t| *t > 0);
    match &args.resource {
        Some(resource) => {
            let highest = [old, new]
                .into_iter()
                .flatten()
                .filter_map(|r| positive(r.bigint(attnum)))
                .max();
            if let Some(t) = highest {
                rule::raise_mark(resource, t);
            }
        }
        None => {
            if let Some(old) = old {
                let pk = check_primary_key(rel, info.pk.clone(), info.pk_immediate)?;
                let identity = &*info.identity;
                let old_key = key_of(&old, &pk, identity);
                let gone = match new {
                    None => true,
                    Some(new) => !same_key(&key_of(&new, &pk, identity), &old_key, identity),
                };
                if let (true, Some(t)) = (gone, positive(old.bigint(attnum))) {
                    record_delete(args.protection, &old_key, t);
                }
            }
        }
    }
    Ok(new
        .or(old)
        .map(|r| r.datum())
        .unwrap_or(pg_sys::Datum::from(0usize)))
}

/// TRUNCATE removes every row at once. Resource mode: an ordinary admitted write. Per-row mode:
/// the token must be at least every row's token, and every row leaves its tombstone. The table is
/// held in ACCESS EXCLUSIVE mode by TRUNCATE, so no row can change meanwhile.
fn truncate(rel: Relation, args: &Args, table: &str, token: Token) -> Result<(), FenceError> {
    if let Some(resource) = &args.resource {
        rule::admit_resource(resource, token, true)?;
        return Ok(());
    }
    let pk_names: Vec<String> = primary_key_attnums(rel)?
        .iter()
        .map(|a| pgrx::spi::quote_identifier(rel.column_name(*a)))
        .collect();
    let token_col = pgrx::spi::quote_identifier(args.token_column.to_string_lossy());
    crate::state::tombstones::truncate_rows(
        args.protection,
        rel.id(),
        table,
        &pk_names,
        &token_col,
        token,
    )
}

/// Per-backend state's life (`backend.rs`): the protections verified in the transaction are
/// verified again after an abort or a rolled-back savepoint; a changed relation's cached trigger
/// arguments are dropped.
pub fn on_event(ev: BackendEvent) {
    if ev.ends_transaction() {
        STAMPED.with(|s| {
            let mut s = s.borrow_mut();
            if s.0.is_some() {
                s.0 = None;
                s.1.clear();
            }
        });
    }
    match ev {
        BackendEvent::Abort | BackendEvent::SubAbort(_) => forget_verified(),
        BackendEvent::Relcache(relid) => forget_relation(relid),
        _ => {}
    }
}
