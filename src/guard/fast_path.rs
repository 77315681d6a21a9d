//! The INSERT, UPDATE and DELETE fast paths (docs/design.md, "The UPDATE fast path", "The
//! DELETE fast path", "The INSERT fast path"). An INSERT into a plain table gets
//! `_pg_fencing.stamp_insert(…)` as its token column's value (`plan_insert`); per-row mode checks
//! each key in a hidden RETURNING list (`insert_row`) and, for keys identified by text, when the
//! statement finished (`finish_write`); an INSERT of one row whose key expressions may be
//! evaluated twice notes its key in the stamp itself (`stamp_insert_key`) for that check.
//! Resource mode stores the mark when the statement finished. A DELETE
//! without RETURNING gets `_pg_fencing.drop_row(…)` as a junk column of the plan under it
//! (per-row mode: each row version handed to the DELETE checked, its key's tombstone left once
//! the statement's row count or the version shows it was deleted: `tombstones::note_unconfirmed`) or, in resource
//! mode, nothing per row: the mark is checked when the executor starts and stored when it
//! finished if a row was deleted (`finish_write`). The rest of this header is the UPDATE's.
//!
//! The UPDATE fast path: a plain `UPDATE` of a
//! protected table is fenced by an expression in its own SET list instead of the guard's row and
//! statement triggers, which cost more than the rest of the statement's fencing together (the
//! trigger manager locks and re-reads every row before a BEFORE ROW trigger, and copies every
//! trigger for every statement).
//!
//! When the planner plans an UPDATE of a protected table that qualifies (below), pg_fencing adds
//! `token_column = _pg_fencing.stamp_row(token_column, table, protection, column, key…)` (per-row
//! mode) or `_pg_fencing.stamp_resource(token_column, table, protection, resource, column)`
//! (resource mode) to its SET list and marks the plan. The stamping function is the guard's
//! BEFORE UPDATE row trigger, as an expression: it runs for each row the UPDATE writes, on the
//! row version the UPDATE writes (under READ COMMITTED, PostgreSQL's EvalPlanQual re-evaluates
//! the SET list on the latest version of a row that changed concurrently, after locking it, just
//! as the trigger saw the locked latest version), applies the same rule (`rule::admit_row`,
//! `rule::admit_resource`), and returns the token it stamps. When the executor starts a marked
//! plan, the guard's UPDATE events are taken out of the executor's private copy of each result
//! relation's triggers, and in resource mode the statement trigger's work (the resource lock
//! before any row lock) is done there.
//!
//! An UPDATE qualifies only when nothing but the guard could change a row or its key: the
//! guard trigger fires in ordinary sessions; no other BEFORE UPDATE row trigger; no stored
//! generated column; the SET list names neither the token column nor (per-row mode) a key column;
//! the per-row rekey trigger is the column-list form over the current key. Everything else (and
//! every plan made before the library was loaded, which carries no mark) keeps the triggers. A
//! result relation (a partition) with a BEFORE UPDATE row trigger of its own keeps its triggers
//! too; it is then checked twice, by the expression and by the trigger.
//!
//! The mark is a plan-cache dependency entry of a kind PostgreSQL never records for a statement
//! (`pg/plan.rs`), so only the planner hook can produce a marked plan. Changes to the table's
//! triggers, columns or key invalidate the plan, which is then planned again by these rules. A
//! result relation whose guard trigger has other arguments than the root's (another protection)
//! keeps its triggers; plain tables with inheritance children are not rewritten at all.

#![forbid(unsafe_code)]

use crate::backend_event::BackendEvent;
use crate::error::{FenceError, Text, Token};
use crate::guard::trigger::{self, Args};
use crate::pg::plan::{
    self, AnalyzedInsert, DeleteQuery, InsertQuery, ModifyExecution, StampArg, StampCall,
    UpdateQuery,
};
use crate::pg::trigger_event::{relation_name, Relation};
use crate::rule;
use crate::state::tombstones::NotedDelete;
use pgrx::pg_sys;
use std::cell::Cell;
use std::ffi::{CStr, CString};

use super::GUARD;
/// The guard's triggers whose UPDATE events the fast path replaces.
const REPLACED: [&CStr; 4] = [
    GUARD,
    c"zz_pg_fencing_replica",
    c"zz_pg_fencing_rekey",
    c"zz_pg_fencing_stmt",
];
/// The guard's AFTER INSERT row trigger.
const AFTER: &CStr = c"zz_pg_fencing_after";
/// A resource-mode INSERT, and a per-row one whose keys `insert_row` checks, also replaces the
/// AFTER INSERT trigger.
const REPLACED_INSERT_RESOURCE: [&CStr; 4] = [
    GUARD,
    c"zz_pg_fencing_replica",
    AFTER,
    c"zz_pg_fencing_stmt",
];

#[derive(Clone, Copy)]
struct Functions {
    stamp_row: pg_sys::Oid,
    stamp_resource: pg_sys::Oid,
    /// Missing until `ALTER EXTENSION pg_fencing UPDATE` brings it (then DELETEs keep their
    /// triggers).
    drop_row: Option<pg_sys::Oid>,
    /// The same for INSERTs.
    stamp_insert: Option<pg_sys::Oid>,
    /// The same for per-row INSERTs' key check (then they keep the AFTER INSERT trigger).
    insert_row: Option<pg_sys::Oid>,
    /// The same for a one-row per-row INSERT's stamp that notes its key (then it takes
    /// `insert_row`'s way).
    stamp_insert_key: Option<pg_sys::Oid>,
    /// The set-based shape's column default (not evaluated by a stamped INSERT).
    stamp_default: Option<pg_sys::Oid>,
}

thread_local! {
    /// The stamping functions, looked up once per backend (dropped on relcache
    /// invalidation, which dropping or re-creating the extension causes).
    static FUNCTIONS: Cell<Option<Functions>> = const { Cell::new(None) };
    /// A function found to be `fencing_guard()`'s C symbol.
    static GUARD_FUNCTION: Cell<pg_sys::Oid> = const { Cell::new(pg_sys::Oid::INVALID) };
}

/// Relcache invalidation: the extension's functions may have been dropped or re-created.
fn forget_functions() {
    FUNCTIONS.with(|f| f.set(None));
}

fn functions() -> Option<Functions> {
    if let Some(f) = FUNCTIONS.with(|f| f.get()) {
        return Some(f);
    }
    let f = Functions {
        stamp_row: plan::internal_function(c"stamp_row")?,
        stamp_resource: plan::internal_function(c"stamp_resource")?,
        drop_row: plan::internal_function(c"drop_row"),
        stamp_insert: plan::internal_function(c"stamp_insert"),
        insert_row: plan::internal_function(c"insert_row"),
        stamp_insert_key: plan::internal_function(c"stamp_insert_key"),
        stamp_default: plan::internal_function(c"stamp_default"),
    };
    FUNCTIONS.with(|c| c.set(Some(f)));
    Some(f)
}

/// Is `function` the guard trigger function? `guard_address` is `fencing_guard`'s C symbol.
pub(crate) fn is_guard(function: pg_sys::Oid, guard_address: usize) -> bool {
    if function == GUARD_FUNCTION.with(|g| g.get()) {
        return true;
    }
    let ok = plan::c_function_address(function) == Some(guard_address);
    if ok {
        GUARD_FUNCTION.with(|g| g.set(function));
    }
    ok
}

/// Planner hook: add the stamping expression to `q` if it qualifies. Returns whether it did
/// (then the plan is to be marked).
pub fn plan_update(q: &mut UpdateQuery, guard_address: usize) -> bool {
    plan_update_inner(q, guard_address).is_some()
}

fn plan_update_inner(q: &mut UpdateQuery, guard_address: usize) -> Option<()> {
    let relid = q.target()?;
    plan::with_relation(relid, |rel| {
        let guard = rel.trigger_named(GUARD)?;
        if !guard.fires_on_origin() || !is_guard(guard.function, guard_address) {
            return None;
        }
        let funcs = functions()?;
        let args = trigger::args_of(guard.oid, &guard.args).ok()?;
        trigger::verify_protection(relid, &args, &|| rel.name()).ok()?;
        // Stored generated columns depend on what the UPDATE sets; a plain table's inheritance
        // children may be protected on their own (partitions cannot).
        if rel.has_stored_generated() || rel.has_inheritance_children() {
            return None;
        }
        let token_attnum = rel.bigint_column(&args.token_column).ok()?;
        let set = q.set_columns();
        if set.contains(&token_attnum) {
            return None;
        }
        let triggers = rel.update_triggers(guard.function, c"zz_pg_fencing_rekey");
        if triggers.others_before {
            return None;
        }
        let column = args.token_column.to_string_lossy().into_owned();
        match &args.resource {
            None => {
                let (pk, immediate) = rel.primary_key();
                if pk.is_empty() || !immediate || set.iter().any(|c| pk.contains(c)) {
                    return None;
                }
                let mut listed = triggers.rekey_columns.clone();
                let mut key = pk.clone();
                listed.sort_unstable();
                key.sort_unstable();
                if !triggers.rekey_by_column || listed != key {
                    return None;
                }
                let mut call = vec![
                    StampArg::Column(token_attnum),
                    StampArg::Oid(relid),
                    StampArg::Int8(args.protection),
                    StampArg::Text(&column),
                ];
                call.extend(pk.iter().map(|a| StampArg::Column(*a)));
                q.add_stamp(rel, token_attnum, funcs.stamp_row, &call);
            }
            Some(resource) => {
                q.add_stamp(
                    rel,
                    token_attnum,
                    funcs.stamp_resource,
                    &[
                        StampArg::Column(token_attnum),
                        StampArg::Oid(relid),
                        StampArg::Int8(args.protection),
                        StampArg::Text(resource),
                        StampArg::Text(&column),
                    ],
                );
            }
        }
        Some(())
    })
}

/// Planner hook, for an INSERT `q`: make its token column's value
/// `_pg_fencing.stamp_insert(value, table, protection, resource, column)` if it qualifies.
/// Returns whether it did (then the plan is to be marked).
///
/// It qualifies on a plain table (a partition's triggers are set up while the INSERT routes
/// rows, after the executor started) with no other BEFORE INSERT row trigger (it runs after
/// the expression and could change the token column, where the guard ran last); per-row mode
/// needs an immediate primary key, and a resource-mode INSERT must set the command's row count
/// (its mark is stored when it finished, if a row was written).
///
/// A per-row INSERT without RETURNING or ON CONFLICT also gets
/// `_pg_fencing.insert_row(token_column, table, protection, column, key…)` as its RETURNING list
/// (hidden: the statement returns no rows), evaluated for each row once it is in the unique
/// index; its keys are checked against their tombstones when the statement finished
/// (`finish_write`), in one look at the protection's highest tombstone when every row's token is
/// at least that (and the floor). Such an INSERT no longer fires the AFTER INSERT trigger.
/// An INSERT of one row whose key expressions may be evaluated twice gets
/// `_pg_fencing.stamp_insert_key(…)` instead, which notes the key itself (no RETURNING list).
/// Returns `None` if it keeps the guard's triggers, else how it was planned.
pub fn plan_insert(q: &mut InsertQuery, guard_address: usize) -> Option<InsertPlan> {
    plan_insert_inner(q, guard_address)
}

/// How the planner hook planned an INSERT on the fast path (the plan is marked in each case).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum InsertPlan {
    /// Stamped only: resource mode, or per-row mode with the AFTER INSERT trigger kept.
    Stamped,
    /// Per-row keys checked by the hidden RETURNING list (`insert_row`): hide it.
    Checked,
    /// Per-row, one row whose stamp notes its key (`stamp_insert_key`): mark it as such.
    KeysNoted,
}

/// What `plan_insert` reads of a protected table, the same for every INSERT into it until its
/// relcache entry changes: the guard trigger is the protection's (fires in ordinary sessions, is
/// `fencing_guard()`, matches a protection made by `fencing_protect`), the table is plain with no
/// other BEFORE INSERT row trigger, and these are its token column, key and shape. Kept per
/// backend in `INSERT_TABLES` (dropped on every relcache invalidation, as the other caches here:
/// a changed trigger, column, index or key re-reads it; an aborted transaction's own changes are
/// invalidated locally at its abort).
struct InsertTable {
    args: std::rc::Rc<Args>,
    /// The token column's number and name.
    token_attnum: i16,
    column: String,
    column_c: CString,
    /// Per-row mode: the primary key's columns, if it has one that is checked immediately.
    pk: Option<Vec<i16>>,
    /// The key is identified by text (not by hash) and no key column is the token column or
    /// generated: a one-row INSERT's stamp may note it (`stamp_insert_key`).
    key_noted_by_stamp: bool,
    set_based: bool,
    /// The token column's default is a call of this function without arguments.
    default_call: Option<pg_sys::Oid>,
}

thread_local! {
    /// `InsertTable` per table (OID); `None`: no INSERT into it takes the fast path.
    static INSERT_TABLES: std::cell::RefCell<rustc_hash::FxHashMap<u32, Option<std::rc::Rc<InsertTable>>>> =
        std::cell::RefCell::new(rustc_hash::FxHashMap::default());
}

/// Relcache invalidation: any table's triggers, columns or key may have changed.
fn forget_insert_tables() {
    INSERT_TABLES.with(|m| m.borrow_mut().clear());
}

/// The `InsertTable` of `rel` (read once per relcache generation), or `None` if an INSERT into
/// it keeps the guard's triggers whatever the statement.
fn insert_table(rel: &Relation, guard_address: usize) -> Option<std::rc::Rc<InsertTable>> {
    let relid = rel.id();
    if let Some(t) = INSERT_TABLES.with(|m| m.borrow().get(&relid.to_u32()).cloned()) {
        return t;
    }
    let table = read_insert_table(rel, guard_address).map(std::rc::Rc::new);
    INSERT_TABLES.with(|m| {
        crate::cache::cache_insert(&mut m.borrow_mut(), relid.to_u32(), table.clone(), 10_000)
    });
    table
}

fn read_insert_table(rel: &Relation, guard_address: usize) -> Option<InsertTable> {
    let relid = rel.id();
    let guard = rel.trigger_named(GUARD)?;
    if !guard.fires_on_origin() || !is_guard(guard.function, guard_address) {
        return None;
    }
    let args = trigger::args_of(guard.oid, &guard.args).ok()?;
    trigger::verify_protection(relid, &args, &|| rel.name()).ok()?;
    if !rel.is_plain_table() || rel.other_before_insert_triggers(guard.function) {
        return None;
    }
    let token_attnum = rel.bigint_column(&args.token_column).ok()?;
    let (pk, key_noted_by_stamp) = match &args.resource {
        Some(_) => (None, false),
        None => {
            let (pk, immediate) = rel.primary_key();
            let pk = Some(pk).filter(|pk| !pk.is_empty() && immediate);
            let noted = pk.as_ref().is_some_and(|pk| {
                !pk.contains(&token_attnum)
                    && !rel.any_generated(pk)
                    && crate::state::tombstones::keys_identified_by_text(args.protection)
            });
            (pk, noted)
        }
    };
    Some(InsertTable {
        column: args.token_column.to_string_lossy().into_owned(),
        column_c: args.token_column.clone(),
        args,
        token_attnum,
        pk,
        key_noted_by_stamp,
        set_based: super::set_based(&guard),
        default_call: rel.default_call(token_attnum),
    })
}

/// Parse analysis hook, for a top-level INSERT `q` into a table of the set-based shape that
/// gives its token column no value: the column gets `_pg_fencing.stamp_default()`, its
/// default, now, so that the rewriter need not parse the default's stored form for every
/// statement (the planner then replaces it as any default, `plan_insert`). Nothing else
/// changes: the rewriter fills in exactly this for the column, and an INSERT analysed again
/// (a prepared statement after its table changed) comes here again.
pub fn give_token_default(q: &mut AnalyzedInsert, guard_address: usize) {
    let Some(relid) = q.target() else {
        return;
    };
    let cached = INSERT_TABLES.with(|m| m.borrow().get(&relid.to_u32()).cloned());
    let table = match cached {
        Some(t) => t,
        None => plan::with_relation(relid, |rel| Some(insert_table(&rel, guard_address))).flatten(),
    };
    let Some(table) = table else {
        return;
    };
    let Some(stamp_default) = functions().and_then(|f| f.stamp_default) else {
        return;
    };
    if table.set_based && table.default_call == Some(stamp_default) {
        q.give_default(table.token_attnum, &table.column_c, stamp_default);
    }
}

fn plan_insert_inner(q: &mut InsertQuery, guard_address: usize) -> Option<InsertPlan> {
    let relid = q.target()?;
    plan::with_relation(relid, |rel| {
        let table = insert_table(&rel, guard_address)?;
        let funcs = functions()?;
        let stamp = funcs.stamp_insert?;
        let args = &table.args;
        let token_attnum = table.token_attnum;
        let column = table.column.as_str();
        let mut key_check = None;
        match &args.resource {
            None => {
                // Per-row mode needs a primary key checked immediately.
                let pk = table.pk.as_ref()?;
                // With a RETURNING list of its own, or ON CONFLICT (whose DO UPDATE returns the
                // rows it updated), the AFTER INSERT trigger checks the keys.
                // An INSERT a rule adds (it sets no row count) keeps it too.
                if !q.returns_or_conflicts() && q.sets_tag() {
                    // One row whose key the statement gives as expressions that may be
                    // evaluated twice, identified by text, not stamped nor generated: the stamp
                    // notes the key (checked when the statement finished, once the row is in
                    // the unique index), without a RETURNING list (`stamp_insert_key`).
                    let noted = funcs
                        .stamp_insert_key
                        .filter(|_| table.key_noted_by_stamp && q.gives_once(pk));
                    if let Some(f) = noted {
                        let mut call = vec![
                            StampArg::Oid(relid),
                            StampArg::Int8(args.protection),
                            StampArg::Text(column),
                        ];
                        call.extend(pk.iter().map(|a| StampArg::Given(*a)));
                        q.stamp_column(rel, token_attnum, f, &call, funcs.stamp_default);
                        return Some(InsertPlan::KeysNoted);
                    }
                    key_check = funcs.insert_row.map(|f| (f, pk));
                }
            }
            // Rows an ON CONFLICT DO UPDATE updates are counted in the statement's row count
            // and are the UPDATE triggers' to admit: that one keeps the triggers, unless the
            // table has the set-based shape, which has no BEFORE INSERT row trigger to keep
            // (then the mark stored when it finished is the token its UPDATE triggers admitted
            // for the rows it updated, or its stamps' for the rows it inserted).
            Some(_) if !q.sets_tag() => return None,
            Some(_) if q.updates_on_conflict() && !table.set_based => return None,
            Some(_) => {}
        }
        q.stamp_column(
            rel,
            token_attnum,
            stamp,
            &[
                StampArg::Oid(relid),
                StampArg::Int8(args.protection),
                StampArg::Text(args.resource.as_deref().unwrap_or("")),
                StampArg::Text(column),
            ],
            funcs.stamp_default,
        );
        let Some((insert_row, pk)) = key_check else {
            return Some(InsertPlan::Stamped);
        };
        let mut call = vec![
            StampArg::Column(token_attnum),
            StampArg::Oid(relid),
            StampArg::Int8(args.protection),
            StampArg::Text(column),
        ];
        call.extend(pk.iter().map(|a| StampArg::Column(*a)));
        q.add_check(rel, insert_row, &call);
        Some(InsertPlan::Checked)
    })
}

/// Planner hook, for a DELETE `q` without RETURNING: `None` if it keeps the guard's triggers;
/// else the plan is to be marked (per-row mode: `drop_row` was added as a junk column).
pub fn plan_delete(q: &mut DeleteQuery, guard_address: usize) -> Option<()> {
    let relid = q.target()?;
    plan::with_relation(relid, |rel| {
        let guard = rel.trigger_named(GUARD)?;
        if !guard.fires_on_origin() || !is_guard(guard.function, guard_address) {
            return None;
        }
        let funcs = functions()?;
        let args = trigger::args_of(guard.oid, &guard.args).ok()?;
        trigger::verify_protection(relid, &args, &|| rel.name()).ok()?;
        // A plain table's inheritance children may be protected on their own.
        if rel.has_inheritance_children() {
            return None;
        }
        let token_attnum = rel.bigint_column(&args.token_column).ok()?;
        let column = args.token_column.to_string_lossy().into_owned();
        match &args.resource {
            None => {
                let (pk, immediate) = rel.primary_key();
                if pk.is_empty() || !immediate {
                    return None;
                }
                let mut call = vec![
                    StampArg::Column(token_attnum),
                    StampArg::Oid(relid),
                    StampArg::Int8(args.protection),
                    StampArg::Text(&column),
                    // (a plain table's rows are its own; a partitioned table's, its partitions')
                    if rel.is_plain_table() {
                        StampArg::Oid(relid)
                    } else {
                        StampArg::RowTable
                    },
                    StampArg::RowId,
                ];
                call.extend(pk.iter().map(|a| StampArg::Column(*a)));
                q.add_check(rel, funcs.drop_row?, &call);
            }
            Some(_) => {
                // Resource mode: nothing to do per row. The mark is checked when the executor
                // starts and stored when it finished if a row was deleted (`finish_delete`),
                // which needs the statement's row count.
                let _ = token_attnum;
                if !q.sets_tag() {
                    return None;
                }
            }
        }
        Some(())
    })
}

/// ExecutorStart hook, for an UPDATE or DELETE whose executor was just started: if its plan
/// carries the mark, take the guard's UPDATE (DELETE) events out of its result relations'
/// triggers and do the resource-mode statement trigger's work.
pub fn start_modify(mut exec: ModifyExecution, guard_address: usize) -> Result<(), FenceError> {
    if !exec.has_marker() || crate::pg::process::replica_mode() {
        // Replica mode: the REPLICA trigger records what is written; the stamping expression
        // keeps the row's token as it is.
        return Ok(());
    }
    let Some((relid, guard_oid, function)) = exec.root_trigger(GUARD) else {
        return Ok(());
    };
    if !is_guard(function, guard_address) {
        return Ok(());
    }
    // The arguments first: which triggers an INSERT replaces depends on the mode.
    let args = trigger::args_of_lazy(guard_oid, || exec.root_trigger_args(GUARD))?;
    // A per-row INSERT whose plan checks its keys in its hidden RETURNING list (`insert_row`),
    // or notes its one row's key when it stamps it (`stamp_insert_key`).
    let new_keys = exec.is_insert()
        && args.resource.is_none()
        && (exec.has_hidden_check() || exec.notes_keys());
    let names: &[&CStr] = match (exec.is_insert(), &args.resource) {
        // Resource-mode INSERT: the AFTER INSERT trigger's work (storing a raised mark once a
        // row was written) is done when the executor finished (`finish_write`); per-row mode's
        // (checking the key's tombstone once the row is in the unique index) by `insert_row`
        // and `finish_write`. A per-row INSERT planned without that keeps the trigger.
        (true, Some(_)) => &REPLACED_INSERT_RESOURCE,
        (true, None) if new_keys => &REPLACED_INSERT_RESOURCE,
        _ => &REPLACED,
    };
    if exec.drop_events(function, names, GUARD) > 0 {
        trigger::count_unguarded_statement();
    }
    if exec.is_insert() && !names.contains(&AFTER) {
        // An INSERT that keeps the AFTER INSERT trigger (RETURNING, ON CONFLICT): in the
        // set-based shape its WHEN clause (`copy_from::insert_check_due`) is true for every row
        // of a planned INSERT; taken off, it is not compiled for each execution.
        exec.drop_when(function, AFTER);
    }
    // The executor has checked this statement's privileges on its result relations (through a
    // view, as the view's owner): the stamping and checking calls of this statement (and only of
    // it: keyed by its memory context, dropped when it ends) need not check them again (see
    // `check_site`).
    let user = crate::pg::process::current_user().to_u32();
    let statement = exec.query_context();
    let event = exec.event();
    let subxact = crate::pg::process::current_subxact();
    AUTHORIZED.with(|a| {
        let mut a = a.borrow_mut();
        for id in exec.result_relation_ids() {
            a.insert((id.to_u32(), user, statement), (event, subxact));
        }
    });
    // Resource mode: the statement trigger's work (see guard/trigger.rs): the resource lock
    // before the executor locks any row. Without a token the stamping expression (UPDATE,
    // INSERT) or `finish_write` (DELETE) raises FT002.
    if let Some(resource) = &args.resource {
        trigger::verify_protection(relid, &args, &|| relation_name(relid))?;
        // As the statement trigger: a protection that cannot hold refuses (FT004) before the
        // token is looked at.
        rule::require_active(args.protection, &|| relation_name(relid))?;
        let token = rule::write_token_if_any()?;
        if let Some(token) = token {
            rule::admit_resource(resource, token, false)?;
        }
        if exec.is_delete() || exec.is_insert() {
            // The row triggers' work: the mark is stored once a row was written.
            let work = Work::Mark {
                resource: resource.clone(),
                highest: if exec.is_delete() { token } else { None },
                delete: exec.is_delete(),
            };
            begin_write(statement, relid, args.protection, work);
        }
    } else if exec.is_delete() {
        // Per-row DELETE: `drop_row` notes each row version it checked; the statement's row
        // count tells which of them it deleted (`tombstones::note_unconfirmed`).
        crate::state::tombstones::begin_unconfirmed(
            statement,
            args.protection,
            exec.output_command(),
            exec.sets_tag().then(|| exec.delete_count()),
        );
    } else if new_keys {
        begin_write(
            statement,
            relid,
            args.protection,
            Work::NewKeys {
                lowest: None,
                keys: Vec::new(),
            },
        );
    }
    Ok(())
}

fn begin_write(statement: usize, relid: pg_sys::Oid, protection: i64, work: Work) {
    WRITES.with(|w| {
        w.borrow_mut().insert(
            statement,
            Running {
                relid,
                protection,
                subxact: crate::pg::process::current_subxact(),
                work,
            },
        )
    });
}

/// A fast-path statement whose work is finished when the executor finished (`finish_write`),
/// while it runs.
struct Running {
    relid: pg_sys::Oid,
    protection: i64,
    /// The subtransaction that started it.
    subxact: pg_sys::SubTransactionId,
    work: Work,
}

/// What is left to do when it finished.
enum Work {
    /// A resource-mode DELETE or INSERT: store the raised mark if a row was written.
    Mark {
        resource: String,
        /// The highest token it carried so far: an INSERT's rows' (`stamp_insert`), a DELETE's
        /// at its start. The mark stored when it finished is at least that, as the row triggers
        /// stored each row's (the session's token may change during a statement).
        highest: Option<Token>,
        /// A DELETE (else an INSERT).
        delete: bool,
    },
    /// A per-row INSERT: check the new keys `insert_row` noted (key text, the token stamped
    /// into its row) against their tombstones; `lowest` is the lowest of those tokens.
    NewKeys {
        lowest: Option<Token>,
        keys: Vec<(String, Token)>,
    },
}

/// `drop_row` checked a row version of the running DELETE whose expression `call` is: note it
/// until the DELETE is known to have deleted it (`tombstones::note_unconfirmed`). Returns it back
/// if there is no such statement (a call by hand): then its tombstone is recorded at once.
fn note_deleted(call: &StampCall, d: NotedDelete) -> Option<NotedDelete> {
    // A call written into the statement by hand (say in its WHERE clause) is not one the DELETE
    // deletes a version after: recorded at once, as anywhere else.
    if !call.planned() {
        return Some(d);
    }
    crate::state::tombstones::note_unconfirmed(
        call.contexts(),
        |count| call.statement_rows(count),
        d,
    )
}

/// At most this many keys of one statement wait for `finish_write` (about 40 bytes each);
/// `insert_row` checks the rows after them at once.
const NOTED_KEYS: usize = 262_144;

thread_local! {
    /// Resource-mode DELETEs and INSERTs on the fast path running now, by their memory context.
    /// Dropped when the statement ends, with the subtransaction that started it when that
    /// aborts (the statement failed: its context is freed and may be reused by a later
    /// statement), and at the end of the transaction.
    static WRITES: std::cell::RefCell<rustc_hash::FxHashMap<usize, Running>> =
        std::cell::RefCell::new(rustc_hash::FxHashMap::default());
}

/// Subtransaction `sub` aborted: the fast-path statements it (or a subtransaction inside it)
/// started failed with it; those of the statements around it run on.
fn forget_writes_of(sub: pg_sys::SubTransactionId) {
    WRITES.with(|w| w.borrow_mut().retain(|_, r| r.subxact < sub));
}

/// `stamp_insert` stamped `token` into a row of the running statement whose expression `call`
/// is (found by its memory contexts).
fn note_stamped(call: &StampCall, token: Token) {
    WRITES.with(|w| {
        let mut w = w.borrow_mut();
        if w.is_empty() {
            return;
        }
        for cxt in call.contexts() {
            if let Some(r) = w.get_mut(&cxt) {
                if let Work::Mark { highest, .. } = &mut r.work {
                    *highest = Some(highest.map_or(token, |h| h.max(token)));
                }
                return;
            }
        }
    });
}

/// `insert_row` checked a row of the running statement whose expression `call` is: note its
/// key `key` (identified by text) and token, to be checked when the statement finished. False
/// if there is no such statement, or it noted as many keys as it may: then the caller checks
/// the key at once.
fn note_new_key(call: &StampCall, key: &str, token: Token) -> Noted {
    WRITES.with(|w| {
        let mut w = w.borrow_mut();
        if w.is_empty() {
            return Noted::NoStatement;
        }
        for cxt in call.contexts() {
            if let Some(r) = w.get_mut(&cxt) {
                return match &mut r.work {
                    Work::NewKeys { lowest, keys } if keys.len() < NOTED_KEYS => {
                        *lowest = Some(lowest.map_or(token, |l| l.min(token)));
                        keys.push((key.to_string(), token));
                        Noted::Yes
                    }
                    Work::NewKeys { .. } => Noted::Full,
                    Work::Mark { .. } => Noted::NoStatement,
                };
            }
        }
        Noted::NoStatement
    })
}

/// What [`note_new_key`] did.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Noted {
    /// The key waits for `finish_write`.
    Yes,
    /// The statement noted as many keys as it may.
    Full,
    /// No running per-row INSERT of the call's statement notes keys (its AFTER INSERT trigger
    /// was not taken out: `start_modify` does both or neither).
    NoStatement,
}

/// ExecutorFinish, before PostgreSQL's (which runs AFTER triggers and data-modifying WITH
/// queries nobody read): a per-row DELETE on the fast path whose memory context is `statement`
/// deleted `rows` rows; the row versions it checked last leave their tombstones now, before
/// any of that can write their keys again (`tombstones::finish_unconfirmed`).
pub fn finish_delete(statement: usize, rows: u64) {
    crate::state::tombstones::finish_unconfirmed(statement, rows);
}

/// ExecutorFinish: the statement whose memory context is `statement` wrote `rows` rows. A
/// resource-mode DELETE or INSERT on the fast path that wrote a row is a write: a raised mark is
/// stored, as the guard's row triggers did (BEFORE DELETE, AFTER INSERT): for an INSERT the
/// highest token its rows carry, for a DELETE the highest of its token at the start and now
/// (FT002 without one, admitted again); one that wrote nothing (nothing matched, ON CONFLICT DO
/// NOTHING) moves no mark. A per-row INSERT's noted keys are checked (`finish_new_keys`).
pub fn finish_write(statement: usize, rows: u64) -> Result<(), FenceError> {
    let Some(running) = WRITES.with(|w| w.borrow_mut().remove(&statement)) else {
        return Ok(());
    };
    let relid = running.relid;
    let (resource, highest, delete) = match running.work {
        Work::Mark {
            resource,
            highest,
            delete,
        } => (resource, highest, delete),
        // Every key noted is checked, whatever the row count says (`insert_row` runs for rows
        // really inserted, and notes none in replica mode).
        Work::NewKeys { lowest, keys } => {
            let count = keys.len();
            return finish_new_keys(
                running.protection,
                relid,
                lowest,
                count,
                keys.iter().map(|(k, t)| (k.as_str(), *t)),
            );
        }
    };
    if rows == 0 || crate::pg::process::replica_mode() {
        return Ok(());
    }
    rule::require_active(running.protection, &|| relation_name(relid))?;
    let token = match (delete, highest) {
        // An INSERT whose rows were stamped: the highest of them.
        (false, Some(h)) => h,
        // A DELETE that had a token at its start: the token now, if any, must pass the rule
        // too (as the row trigger checked each row's), and the higher one is stored. A token
        // gone by now (an AFTER trigger reset it) leaves the start's.
        (true, Some(start)) => match rule::write_token_if_any()? {
            Some(now) => {
                rule::admit_resource(&resource, now, false)?;
                start.max(now)
            }
            None => start,
        },
        _ => session_token(relid)?,
    };
    rule::admit_resource(&resource, token, true)?;
    // Counted per row written, as the row triggers counted.
    crate::state::stats::accepted_more(crate::state::stats::Kind::Resource, &resource, rows - 1);
    Ok(())
}

/// A per-row fast-path INSERT (or an admitted COPY, `copy_from`) finished: every row is in the
/// unique index, so the tombstones read now are authoritative for its keys (as for the AFTER
/// INSERT trigger, see `rule`). When the lowest token of its rows is at least the protection's
/// highest tombstone and its floor, no key's mark is above its row's token; else each of the
/// `count` keys is checked.
pub(crate) fn finish_new_keys<'a>(
    protection: i64,
    relid: pg_sys::Oid,
    lowest: Option<Token>,
    count: usize,
    keys: impl Iterator<Item = (&'a str, Token)>,
) -> Result<(), FenceError> {
    let Some(lowest) = lowest else {
        return Ok(());
    };
    rule::require_active(protection, &|| relation_name(relid))?;
    if new_keys_pass(protection, lowest) {
        crate::state::stats::with_table_name(protection, |name| {
            crate::state::stats::accepted_more(crate::state::stats::Kind::Table, name, count as u64)
        });
        return Ok(());
    }
    for (key, token) in keys {
        pgrx::check_for_interrupts!();
        admit_text_key(protection, relid, key, token)?;
    }
    Ok(())
}

/// Does every new key of protection `protection` written with `token` pass its tombstone
/// without a look at it (`tombstones::new_key_threshold`)? Only once the keys are in the unique
/// index (see `rule`).
pub(crate) fn new_keys_pass(protection: i64, token: Token) -> bool {
    let threshold = crate::state::tombstones::new_key_threshold(protection);
    threshold.is_some_and(|t| t.is_none_or(|t| token >= t))
}

/// A new key identified by text (`key`) of table `relid`, looked up against its tombstone and
/// the floor now: FT001, naming the key, if either is above `token`.
fn admit_text_key(
    protection: i64,
    relid: pg_sys::Oid,
    key: &str,
    token: Token,
) -> Result<(), FenceError> {
    let not_hashed = |_: &str| false;
    let tomb = rule::TombKey {
        text: key,
        hash: None,
        same: &not_hashed,
    };
    rule::admit_row_insert(protection, &|| relation_name(relid), &tomb, token, true)
}

thread_local! {
    /// (table, user, statement's memory context) of the fast-path statements running now: their
    /// privileges were checked by the executor. Dropped when the statement ends (`end_update`),
    /// at the end of the transaction, and when the subtransaction it started in aborts (then it
    /// never ends: its memory context may be reused). Kept through relcache invalidations (the
    /// executor does not check a running statement's privileges again either).
    /// The value is the statement's trigger event and subtransaction: a call counts as
    /// authorized only for the statement it belongs to (`drop_row` in a DELETE, `stamp_insert`
    /// in an INSERT, the others in an UPDATE), else a role could call `drop_row` in its own
    /// UPDATE without the DELETE privilege; and only a call the planner hook added to it
    /// (`StampCall::planned`), not one written into the statement by hand.
    static AUTHORIZED: std::cell::RefCell<rustc_hash::FxHashMap<(u32, u32, usize), (u32, pg_sys::SubTransactionId)>> =
        std::cell::RefCell::new(rustc_hash::FxHashMap::default());
    /// Stamping constants found to name a protection made by `fencing_protect`: (table,
    /// protection) -> (resource, token column). Not a privilege: that is checked per call.
    /// Dropped on relcache invalidation (`fencing_protect`/`fencing_unprotect` re-create or drop
    /// the table's triggers) and on subtransaction abort.
    static CHECKED: std::cell::RefCell<rustc_hash::FxHashMap<(u32, i64), (String, String)>> =
        std::cell::RefCell::new(rustc_hash::FxHashMap::default());
}

/// ExecutorEnd: the statement whose memory context is `statement` is over.
pub fn end_update(statement: usize) {
    crate::state::tombstones::end_unconfirmed(statement);
    WRITES.with(|w| {
        let mut w = w.borrow_mut();
        if !w.is_empty() {
            w.remove(&statement);
        }
    });
    AUTHORIZED.with(|a| {
        let mut a = a.borrow_mut();
        if !a.is_empty() {
            a.retain(|k, _| k.2 != statement);
        }
    });
}

/// Relcache invalidation, subtransaction abort: protections may have changed.
fn forget_checked() {
    CHECKED.with(|c| c.borrow_mut().clear());
}

/// Subtransaction `sub` aborted: the statements that started in it or in its children (whose
/// ids are higher) never end.
fn forget_authorized_since(sub: pg_sys::SubTransactionId) {
    AUTHORIZED.with(|a| a.borrow_mut().retain(|_, (_, started)| *started < sub));
}

/// End of the transaction.
fn forget_authorized() {
    AUTHORIZED.with(|a| a.borrow_mut().clear());
    WRITES.with(|w| w.borrow_mut().clear());
}

/// A stamping call's constants must name a protection made by `fencing_protect` for this table,
/// and the user must be allowed to write it (anyone may call the function by hand; then it is
/// no more than an UPDATE, or for `drop_row` a DELETE, of the table): either the call is part of
/// a running fast-path statement on the table, whose privileges the executor checked, or `may`
/// says the user may (update the table or one of its columns; delete from it).
fn check_site(
    call: &StampCall,
    relid: pg_sys::Oid,
    protection: i64,
    resource: Option<&str>,
    column: &str,
    event: u32,
    may: fn(pg_sys::Oid) -> bool,
) -> Result<(), FenceError> {
    let known = CHECKED.with(|c| {
        c.borrow()
            .get(&(relid.to_u32(), protection))
            .is_some_and(|(r, col)| r == resource.unwrap_or("") && col == column)
    });
    if !known {
        let args = Args::new(
            protection,
            resource.map(str::to_string),
            CString::new(column).unwrap_or_default(),
        );
        trigger::verify_protection(relid, &args, &|| relation_name(relid))?;
        CHECKED.with(|c| {
            crate::cache::cache_insert(
                &mut c.borrow_mut(),
                (relid.to_u32(), protection),
                (resource.unwrap_or("").to_string(), column.to_string()),
                10_000,
            )
        });
    }
    let user = crate::pg::process::current_user().to_u32();
    let authorized = AUTHORIZED.with(|a| {
        let a = a.borrow();
        !a.is_empty()
            && call.planned()
            && call.contexts().any(|cxt| {
                a.get(&(relid.to_u32(), user, cxt))
                    .is_some_and(|(e, _)| *e == event)
            })
    });
    if !authorized && !may(relid) {
        let detail = plan::row_security_applies(relid).then(|| {
            "Row-level security applies to this role on the table: a call of pg_fencing's \
             stamping and checking functions outside the statement they belong to would not \
             pass its policies (docs/security.md). Write with the statement itself."
                .to_string()
        });
        return Err(FenceError::NotAllowed(Text {
            message: format!("permission denied for table {}", relation_name(relid)),
            detail,
            hint: None,
        }));
    }
    Ok(())
}

/// The per-row functions' common start (`stamp_row`, `drop_row`, `insert_row`): their table
/// (argument 1) and protection (argument 2), the call site checked once per user for a
/// statement of kind `event` (`check_site`, token column in argument 3), and the protection
/// active (FT004 otherwise).
fn row_site(
    call: &StampCall,
    event: u32,
    may: fn(pg_sys::Oid) -> bool,
) -> Result<(pg_sys::Oid, i64), FenceError> {
    let relid = call.oid(1);
    let protection = call.bigint(2).unwrap_or(0);
    check_site_once(call, || {
        check_site(call, relid, protection, None, call.text(3), event, may)
    })?;
    rule::require_active(protection, &|| relation_name(relid))?;
    Ok((relid, protection))
}

/// `check`, once per call site (an expression of one statement, whose constants do not change)
/// and user: the other rows of the statement need not repeat it.
fn check_site_once(
    call: &StampCall,
    check: impl FnOnce() -> Result<(), FenceError>,
) -> Result<(), FenceError> {
    let user = crate::pg::process::current_user();
    if call.checked_for() == user {
        return Ok(());
    }
    check()?;
    call.set_checked_for(user);
    Ok(())
}

fn session_token(relid: pg_sys::Oid) -> Result<Token, FenceError> {
    rule::write_token(&|| format!("a write to protected table {}", relation_name(relid)))
}

/// `_pg_fencing.stamp_row(old_token, table, protection, token_column, key…)`: the per-row
/// guard's BEFORE UPDATE check of one row; returns the token to stamp.
pub fn stamp_row(call: &StampCall) -> Result<Option<Token>, FenceError> {
    let old = call.bigint(0);
    if crate::pg::process::replica_mode() {
        return Ok(old);
    }
    let (relid, protection) = row_site(call, plan::EVENT_UPDATE, plan::may_update)?;
    let token = session_token(relid)?;
    trigger::count_guarded();
    rule::admit_row(
        protection,
        &|| relation_name(relid),
        &|| call.key_text(4),
        token,
        old,
        true,
    )?;
    Ok(Some(token))
}

/// `_pg_fencing.stamp_resource(old_token, table, protection, resource, token_column)`: the
/// resource-mode guard's BEFORE UPDATE check of one row; returns the token to stamp.
pub fn stamp_resource(call: &StampCall) -> Result<Option<Token>, FenceError> {
    let old = call.bigint(0);
    if crate::pg::process::replica_mode() {
        return Ok(old);
    }
    let relid = call.oid(1);
    let protection = call.bigint(2).unwrap_or(0);
    let resource = call.text(3);
    if resource.is_empty() {
        return Err(FenceError::NotAllowed(Text::new(format!(
            "_pg_fencing.stamp_resource() needs the resource of a resource-mode protection of {}",
            relation_name(relid)
        ))));
    }
    check_site_once(call, || {
        check_site(
            call,
            relid,
            protection,
            Some(resource),
            call.text(4),
            plan::EVENT_UPDATE,
            plan::may_update,
        )
    })?;
    rule::require_active(protection, &|| relation_name(relid))?;
    let token = session_token(relid)?;
    trigger::count_guarded();
    rule::admit_resource(resource, token, true)?;
    Ok(Some(token))
}

/// `_pg_fencing.drop_row(old_token, table, protection, token_column, row_table, row_id, key…)`:
/// the per-row guard's BEFORE DELETE work for one row version a fast-path DELETE is about to
/// delete (a junk column of the plan under it, evaluated on the version handed to the DELETE;
/// under READ COMMITTED again on a concurrently changed row's latest version): the row's token
/// must be at most the session's, and the key leaves its tombstone once the DELETE deleted the
/// version (`note_deleted`; at once for a call by hand). Returns the session's token.
pub fn drop_row(call: &StampCall) -> Result<Option<Token>, FenceError> {
    let old = call.bigint(0);
    if crate::pg::process::replica_mode() {
        return Ok(old);
    }
    let (relid, protection) = row_site(call, plan::EVENT_DELETE, plan::may_delete)?;
    let token = session_token(relid)?;
    trigger::count_guarded();
    let (key, hash, is_key) = call.with_typed(6, |typed| {
        (
            crate::pg::trigger_event::key_text_of(typed),
            crate::state::tombstones::key_hash_of_values(protection, typed),
            // (the planner passes the key's own columns; a call by hand may pass anything)
            call.planned() || crate::state::tombstones::is_key_of(protection, typed),
        )
    });
    if !is_key {
        return Err(FenceError::InvalidArgument(format!(
            "_pg_fencing.drop_row() needs a key of {}: one non-NULL value of each key column's type",
            relation_name(relid)
        )));
    }
    rule::admit_row(
        protection,
        &|| relation_name(relid),
        &|| key.clone(),
        token,
        old,
        true,
    )?;
    let noted = NotedDelete {
        version: call.row_version(4, 5),
        key,
        hash,
        token,
    };
    if let Some(d) = note_deleted(call, noted) {
        crate::state::tombstones::record_row_delete(protection, d.key, d.hash, d.token);
    }
    Ok(Some(token))
}

/// `_pg_fencing.stamp_insert(value, table, protection, resource, token_column)`: the guard's
/// BEFORE INSERT work for one row of a fast-path INSERT (its token column's expression): the
/// token to stamp (FT002 without one), admitted against the resource's mark in resource mode
/// (stored when the statement finished, `finish_write`); in per-row mode `insert_row` (or the
/// AFTER INSERT trigger) then checks the key's tombstone. `value`, what the statement gave the
/// column, is kept in replica mode.
pub fn stamp_insert(call: &StampCall) -> Result<Option<Token>, FenceError> {
    let value = call.bigint(0);
    if crate::pg::process::replica_mode() {
        return Ok(value);
    }
    let relid = call.oid(1);
    let protection = call.bigint(2).unwrap_or(0);
    let resource = call.text(3);
    let resource = (!resource.is_empty()).then_some(resource);
    check_site_once(call, || {
        check_site(
            call,
            relid,
            protection,
            resource,
            call.text(4),
            plan::EVENT_INSERT,
            plan::may_insert,
        )
    })?;
    rule::require_active(protection, &|| relation_name(relid))?;
    let token = session_token(relid)?;
    trigger::count_guarded();
    // (the AFTER INSERT trigger of the set-based shape, which an INSERT with RETURNING or ON
    // CONFLICT keeps, accepts only tokens stamped so)
    trigger::note_stamped_token(token);
    match resource {
        Some(resource) => {
            rule::admit_resource(resource, token, false)?;
            note_stamped(call, token);
        }
        None => trigger::count_after_expected(),
    }
    Ok(Some(token))
}

/// `_pg_fencing.stamp_insert_key(value, table, protection, token_column, key…)`: a one-row
/// per-row INSERT's token column (see `plan_insert`): `stamp_insert`'s work, and the key the
/// statement gives the row (its own expressions, evaluated again) is noted with the token, to be
/// checked when the statement finished, once the row is in the unique index (`finish_write`), as
/// `insert_row` notes it. A key the statement cannot note (no running statement notes keys: the
/// executor then kept the AFTER INSERT trigger, which checks it) is also looked up at once.
pub fn stamp_insert_key(call: &StampCall) -> Result<Option<Token>, FenceError> {
    let value = call.bigint(0);
    if crate::pg::process::replica_mode() {
        return Ok(value);
    }
    let (relid, protection) = row_site(call, plan::EVENT_INSERT, plan::may_insert)?;
    let token = session_token(relid)?;
    trigger::count_guarded();
    trigger::count_after_expected();
    let typed = call.typed(4);
    let key = crate::pg::trigger_event::key_text_of(&typed);
    if crate::state::tombstones::key_hash_of_values(protection, &typed).is_some() {
        // Planned for keys identified by text (`plan_insert`); a change of the key's types
        // re-plans the statement, so this is not reached; if it were, the key could not be
        // noted as planned: refused rather than left unchecked.
        return Err(FenceError::TriggerProtocol(format!(
            "a one-row INSERT into {} was planned for keys identified by text; run it again",
            relation_name(relid)
        )));
    }
    match note_new_key(call, &key, token) {
        Noted::Yes => {
            trigger::count_after_fired();
            Ok(Some(token))
        }
        Noted::Full => Err(FenceError::TriggerProtocol(format!(
            "a one-row INSERT into {} noted more than {NOTED_KEYS} keys",
            relation_name(relid)
        ))),
        Noted::NoStatement => {
            // The executor kept the AFTER INSERT trigger, which checks the key once the row is
            // in the unique index; it is looked up now too.
            admit_text_key(protection, relid, &key, token)?;
            Ok(Some(token))
        }
    }
}

/// `_pg_fencing.insert_row(new_token, table, protection, token_column, key…)`: the per-row
/// guard's AFTER INSERT work for one row of a fast-path INSERT (its hidden RETURNING list,
/// evaluated once the row is in the unique index): the key is checked against its tombstone with
/// the token stamped into the row. A key identified by text is noted and checked when the
/// statement finished (`finish_write`); one identified by hash, or one past the statement's
/// `NOTED_KEYS`, at once. Returns the row's token.
pub fn insert_row(call: &StampCall) -> Result<Option<Token>, FenceError> {
    let stamped = call.bigint(0);
    if crate::pg::process::replica_mode() {
        return Ok(stamped);
    }
    let (relid, protection) = row_site(call, plan::EVENT_INSERT, plan::may_insert)?;
    // As the AFTER INSERT trigger: the token the row was stamped with (stamp_insert), even if
    // the session's changed since.
    let token = match stamped {
        Some(t) => t,
        None => session_token(relid)?,
    };
    trigger::count_after_fired();
    let typed = call.typed(4);
    let key = crate::pg::trigger_event::key_text_of(&typed);
    let hash = crate::state::tombstones::key_hash_of_values(protection, &typed);
    if hash.is_none() && note_new_key(call, &key, token) == Noted::Yes {
        return Ok(Some(token));
    }
    let same = |text: &str| crate::state::tombstones::equals_text_typed(protection, &typed, text);
    let tomb = rule::TombKey {
        text: &key,
        hash,
        same: &same,
    };
    rule::admit_row_insert(protection, &|| relation_name(relid), &tomb, token, true)?;
    Ok(Some(token))
}

/// Per-backend state's life (`backend.rs`): the statements authorized in the transaction end
/// with it; a rolled-back savepoint forgets the keys it checked and the writes it noted; a
/// changed relation forgets the stamping functions' and the checked tables' information.
pub fn on_event(ev: BackendEvent) {
    match ev {
        BackendEvent::SubAbort(sub) => {
            forget_checked();
            forget_authorized_since(sub);
            forget_writes_of(sub);
        }
        BackendEvent::Relcache(_) => {
            forget_functions();
            forget_checked();
            forget_insert_tables();
        }
        ev if ev.ends_transaction() => forget_authorized(),
        _ => {}
    }
}
