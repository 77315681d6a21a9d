//! The planner and executor hooks of the INSERT, UPDATE and DELETE fast paths (`guard/fast_path.rs` decides;
//! `pg/plan.rs` reads and writes the planner's and executor's structures), the parse analysis
//! hook that gives a set-based table's token column its default before the rewriter would parse
//! it (`fast_path::give_token_default`), the utility hook of COPY FROM (`guard/copy_from.rs`), and the object access
//! hook that sees every relation dropped (`state/protections.rs`, `before_relation_drop`,
//! decides). Installed whenever the library is loaded (also by the `ddl_command_start` event
//! trigger, which every DDL command fires); they pass everything on to the previous hook (or
//! PostgreSQL's own planner and executor) unchanged unless it concerns a protected table.

use crate::guard::copy_from;
use crate::guard::fast_path::{self, InsertPlan};
use crate::pg::citus;
use crate::pg::copy_stmt::{self, CopyFrom};
use crate::pg::plan::{self, DeleteQuery, InsertQuery, ModifyExecution, UpdateQuery};
use crate::pg::report::{raise, Raiser};
use pgrx::pg_sys;
use std::ffi::{c_char, c_int};
use std::sync::OnceLock;

static PREV_PLANNER: OnceLock<pg_sys::planner_hook_type> = OnceLock::new();
static PREV_EXECUTOR_START: OnceLock<pg_sys::ExecutorStart_hook_type> = OnceLock::new();
static PREV_EXECUTOR_RUN: OnceLock<pg_sys::ExecutorRun_hook_type> = OnceLock::new();
static PREV_EXECUTOR_FINISH: OnceLock<pg_sys::ExecutorFinish_hook_type> = OnceLock::new();
static PREV_EXECUTOR_END: OnceLock<pg_sys::ExecutorEnd_hook_type> = OnceLock::new();
static PREV_OBJECT_ACCESS: OnceLock<pg_sys::object_access_hook_type> = OnceLock::new();
static PREV_PROCESS_UTILITY: OnceLock<pg_sys::ProcessUtility_hook_type> = OnceLock::new();
static PREV_POST_PARSE_ANALYZE: OnceLock<pg_sys::post_parse_analyze_hook_type> = OnceLock::new();

/// `fencing_guard`'s own C symbol, which identifies the guard trigger's function.
fn guard_address() -> usize {
    crate::api::functions::fencing_guard as *const () as usize
}

/// Install the hooks (from `_PG_init`, once per backend).
pub fn init() {
    // SAFETY: called once from _PG_init on the backend's main thread, before any statement
    // of this library runs; the previous hooks are kept and called by ours, as PostgreSQL's hook
    // convention requires. The hooks live as long as the library (never unloaded).
    unsafe {
        if PREV_PLANNER.set(pg_sys::planner_hook).is_ok() {
            pg_sys::planner_hook = Some(planner);
        }
        if PREV_EXECUTOR_START.set(pg_sys::ExecutorStart_hook).is_ok() {
            pg_sys::ExecutorStart_hook = Some(executor_start);
        }
        if PREV_EXECUTOR_RUN.set(pg_sys::ExecutorRun_hook).is_ok() {
            pg_sys::ExecutorRun_hook = Some(executor_run);
        }
        if PREV_EXECUTOR_FINISH
            .set(pg_sys::ExecutorFinish_hook)
            .is_ok()
        {
            pg_sys::ExecutorFinish_hook = Some(executor_finish);
        }
        if PREV_EXECUTOR_END.set(pg_sys::ExecutorEnd_hook).is_ok() {
            pg_sys::ExecutorEnd_hook = Some(executor_end);
        }
        if PREV_OBJECT_ACCESS.set(pg_sys::object_access_hook).is_ok() {
            pg_sys::object_access_hook = Some(object_access);
        }
        if PREV_PROCESS_UTILITY
            .set(pg_sys::ProcessUtility_hook)
            .is_ok()
        {
            pg_sys::ProcessUtility_hook = Some(process_utility);
        }
        if PREV_POST_PARSE_ANALYZE
            .set(pg_sys::post_parse_analyze_hook)
            .is_ok()
        {
            pg_sys::post_parse_analyze_hook = Some(post_parse_analyze);
        }
    }
}

/// # Safety
/// Only for PostgreSQL's planner to call (installed by `init`), on the main thread.
unsafe extern "C-unwind" fn planner(
    parse: *mut pg_sys::Query,
    query_string: *const c_char,
    cursor_options: c_int,
    bound_params: pg_sys::ParamListInfo,
) -> *mut pg_sys::PlannedStmt {
    // SAFETY: `parse` is the planner's Query for this call, as `UpdateQuery::of` requires; the
    // decision runs inside pgrx's guard (an ERROR in a catalog lookup is re-raised from there),
    // and only plain values stay in this frame while the statement is planned by `plan_next`
    // with the planner's own arguments, and marked with `add_marker` right after, in the same
    // memory context.
    unsafe {
        let marked = match UpdateQuery::of(parse) {
            Some(mut q) => pg_sys::submodules::panic::pgrx_extern_c_guard(move || {
                fast_path::plan_update(&mut q, guard_address())
            }),
            None => false,
        };
        let inserted = match InsertQuery::of(parse) {
            Some(mut q) => pg_sys::submodules::panic::pgrx_extern_c_guard(move || {
                fast_path::plan_insert(&mut q, guard_address())
            }),
            None => None,
        };
        let delete = match DeleteQuery::of(parse) {
            Some(mut q) => pg_sys::submodules::panic::pgrx_extern_c_guard(move || {
                fast_path::plan_delete(&mut q, guard_address())
            }),
            None => None,
        };
        // Writes to protected Citus tables, the statement's and its data-modifying WITH
        // queries', and to a table a Citus function has taken (guard/citus.rs).
        let writes: Vec<_> = std::iter::once(parse)
            .chain(citus::modifying_ctes(parse))
            .filter_map(|q| citus::WriteQuery::of(q))
            .collect();
        if !writes.is_empty() {
            let outcome = pg_sys::submodules::panic::pgrx_extern_c_guard(move || {
                writes.into_iter().try_for_each(|mut q| {
                    // A table whose protection a Citus function has off (Citus sends a
                    // distributed table's writes to its shards without the executor's result
                    // relations on this node).
                    if let Some(target) = q.target() {
                        crate::guard::citus::write_while_taken(&[target])?;
                    }
                    crate::guard::citus::plan_write(&mut q)
                })
            });
            if let Err(e) = outcome {
                raise(e, Raiser::Hook("pg_fencing planner hook"));
            }
        }
        let checked = inserted == Some(InsertPlan::Checked);
        let prev = PREV_PLANNER.get().copied().flatten();
        let stmt = plan::plan_next(prev, parse, query_string, cursor_options, bound_params);
        if marked || inserted.is_some() || delete.is_some() {
            plan::add_marker(stmt);
        }
        if checked {
            plan::hide_returning(stmt);
        }
        if inserted == Some(InsertPlan::KeysNoted) {
            plan::add_keys_marker(stmt);
        }
        stmt
    }
}

/// # Safety
/// Only for PostgreSQL's parse analysis to call (installed by `init`), on the main thread.
unsafe extern "C-unwind" fn post_parse_analyze(
    pstate: *mut pg_sys::ParseState,
    query: *mut pg_sys::Query,
    jstate: *mut pg_sys::JumbleState,
) {
    // SAFETY: PostgreSQL's own arguments are passed on to the previous hook unchanged; `query`
    // is the analysed Query of this call, as `AnalyzedInsert::of` requires. Only an INSERT
    // enters pgrx's guard (an ERROR of a catalog lookup is re-raised from there); no other
    // statement leaves this frame's plain values.
    unsafe {
        if let Some(prev) = PREV_POST_PARSE_ANALYZE.get().copied().flatten() {
            prev(pstate, query, jstate);
        }
        if let Some(mut q) = plan::AnalyzedInsert::of(query) {
            pg_sys::submodules::panic::pgrx_extern_c_guard(move || {
                fast_path::give_token_default(&mut q, guard_address())
            });
        }
    }
}

/// # Safety
/// Only for PostgreSQL's executor to call (installed by `init`), on the main thread.
unsafe extern "C-unwind" fn executor_start(query_desc: *mut pg_sys::QueryDesc, eflags: c_int) {
    // SAFETY: the executor's own arguments, passed on unchanged; after the executor started,
    // `query_desc` holds the plan state `ModifyExecution::of` reads, used only in this call.
    // The decision runs inside pgrx's guard; its error is raised here, in the hook's frame,
    // which holds only plain values (as `raise` requires).
    unsafe {
        // A statement run inside an admitted COPY (by a trigger or function of its rows): its
        // own inserted rows are not the COPY's (`copy_from::insert_check_due`).
        copy_from::executor_started(query_desc as usize);
        crate::guard::citus::executor_started();
        let prev = PREV_EXECUTOR_START.get().copied().flatten();
        let explain_only = eflags & pg_sys::EXEC_FLAG_EXPLAIN_ONLY as c_int != 0;
        if explain_only {
            crate::guard::citus::explain_only(true);
        }
        plan::executor_start_next(prev, query_desc, eflags);
        if explain_only {
            crate::guard::citus::explain_only(false);
            return;
        }
        // A write to a table whose protection a Citus function has off (guard/citus.rs).
        if crate::guard::citus::taking() {
            let written = citus::result_relations(query_desc);
            let outcome = pg_sys::submodules::panic::pgrx_extern_c_guard(move || {
                crate::guard::citus::write_while_taken(&written)
            });
            if let Err(e) = outcome {
                raise(e, Raiser::Hook("pg_fencing ExecutorStart hook"));
            }
        }
        // A write to a protected Citus table's shard (guard/citus.rs), before any row.
        let marked = citus::marked_result_relations(query_desc);
        if !marked.is_empty() {
            let sent = citus::sent_by_client(query_desc);
            let outcome = pg_sys::submodules::panic::pgrx_extern_c_guard(move || {
                marked
                    .iter()
                    .try_for_each(|r| crate::guard::citus::check_write(*r, sent))
            });
            if let Err(e) = outcome {
                raise(e, Raiser::Hook("pg_fencing ExecutorStart hook"));
            }
        }
        let Some(exec) = ModifyExecution::of(query_desc) else {
            return;
        };
        let outcome = pg_sys::submodules::panic::pgrx_extern_c_guard(move || {
            fast_path::start_modify(exec, guard_address())
        });
        if let Err(e) = outcome {
            raise(e, Raiser::Hook("pg_fencing ExecutorStart hook"));
        }
    }
}

/// # Safety
/// Only for PostgreSQL's executor to call (installed by `init`), on the main thread.
#[cfg(feature = "pg15")]
unsafe extern "C-unwind" fn executor_run(
    query_desc: *mut pg_sys::QueryDesc,
    direction: pg_sys::ScanDirection::Type,
    count: u64,
    execute_once: bool,
) {
    // SAFETY: the executor's own arguments, passed on; only the row count of a plan whose
    // RETURNING list is hidden changes (`run_count`, which reads plain plan fields); the calls
    // of Citus's table functions are handled around the run (`citus_calls_begin`).
    unsafe {
        let count = plan::run_count(query_desc, count);
        let prev = PREV_EXECUTOR_RUN.get().copied().flatten();
        let calls = citus_calls_begin(query_desc);
        plan::executor_run_next(prev, query_desc, direction, count, execute_once);
        citus_calls_end(query_desc, calls);
    }
}

/// # Safety
/// Only for PostgreSQL's executor to call (installed by `init`), on the main thread.
#[cfg(feature = "pg18")]
unsafe extern "C-unwind" fn executor_run(
    query_desc: *mut pg_sys::QueryDesc,
    direction: pg_sys::ScanDirection::Type,
    count: u64,
) {
    // SAFETY: as for PostgreSQL 15 above.
    unsafe {
        let count = plan::run_count(query_desc, count);
        let prev = PREV_EXECUTOR_RUN.get().copied().flatten();
        let calls = citus_calls_begin(query_desc);
        plan::executor_run_next(prev, query_desc, direction, count);
        citus_calls_end(query_desc, calls);
    }
}

/// Around a run of a statement that calls one of Citus's functions that distribute or re-create
/// a table (guard/citus.rs, `table_calls_begin`): the protected tables it takes lose their
/// protection only while the run evaluates the calls. `true`: there are such calls.
///
/// # Safety
/// `query_desc` must be the ExecutorRun hook's, on the main thread; the decision runs inside
/// pgrx's guard and its error is raised here, in a frame that holds only plain values.
unsafe fn citus_calls_begin(query_desc: *mut pg_sys::QueryDesc) -> bool {
    // SAFETY: per the contract.
    unsafe {
        let (calls, alone) = citus::table_function_calls(query_desc);
        if calls.is_empty() {
            return false;
        }
        let statement = query_desc as usize;
        let outcome = pg_sys::submodules::panic::pgrx_extern_c_guard(move || {
            crate::guard::citus::table_calls_begin(statement, &calls, alone)
        });
        if let Err(e) = outcome {
            raise(e, Raiser::Hook("pg_fencing ExecutorRun hook"));
        }
        true
    }
}

/// After the run `citus_calls_begin` saw calls in (`calls`): their tables protected again.
///
/// # Safety
/// As `citus_calls_begin`.
unsafe fn citus_calls_end(query_desc: *mut pg_sys::QueryDesc, calls: bool) {
    if !calls {
        return;
    }
    let statement = query_desc as usize;
    // SAFETY: per the contract.
    unsafe {
        let outcome = pg_sys::submodules::panic::pgrx_extern_c_guard(move || {
            crate::guard::citus::table_calls_end(statement)
        });
        if let Err(e) = outcome {
            raise(e, Raiser::Hook("pg_fencing ExecutorRun hook"));
        }
    }
}

/// # Safety
/// Only for PostgreSQL's executor to call (installed by `init`), on the main thread.
unsafe extern "C-unwind" fn executor_finish(query_desc: *mut pg_sys::QueryDesc) {
    // SAFETY: the executor's own argument, passed on unchanged; after the executor finished,
    // its row count and memory context are read (plain values). The decision runs inside pgrx's
    // guard; its error is raised here, in the hook's frame, which holds only plain values (as
    // `raise` requires).
    unsafe {
        // A per-row DELETE's last row versions leave their tombstones before PostgreSQL's
        // ExecutorFinish runs AFTER triggers and unread data-modifying WITH queries, which
        // could write their keys again (its row count is final once the executor ran).
        let (statement, rows) = plan::processed(query_desc);
        pg_sys::submodules::panic::pgrx_extern_c_guard(move || {
            fast_path::finish_delete(statement, rows)
        });
        let prev = PREV_EXECUTOR_FINISH.get().copied().flatten();
        plan::executor_finish_next(prev, query_desc);
        let (statement, rows) = plan::processed(query_desc);
        let outcome = pg_sys::submodules::panic::pgrx_extern_c_guard(move || {
            fast_path::finish_write(statement, rows)
        });
        if let Err(e) = outcome {
            raise(e, Raiser::Hook("pg_fencing ExecutorFinish hook"));
        }
    }
}

/// # Safety
/// Only for PostgreSQL's executor to call (installed by `init`), on the main thread.
unsafe extern "C-unwind" fn executor_end(query_desc: *mut pg_sys::QueryDesc) {
    // SAFETY: the executor's own argument; its memory context is read before the executor is
    // ended, and only a plain value (no PostgreSQL call, nothing to drop) is kept in this frame
    // while the previous hook or PostgreSQL's ExecutorEnd runs.
    unsafe {
        let statement = plan::statement_context(query_desc);
        fast_path::end_update(statement);
        let prev = PREV_EXECUTOR_END.get().copied().flatten();
        plan::executor_end_next(prev, query_desc);
        copy_from::executor_ended(query_desc as usize);
        crate::guard::citus::executor_ended();
    }
}

/// # Safety
/// Only for PostgreSQL's utility processing to call (installed by `init`), on the main thread.
#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn process_utility(
    pstmt: *mut pg_sys::PlannedStmt,
    query_string: *const c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    query_env: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
) {
    // SAFETY: PostgreSQL's own arguments are passed on, the statement possibly replaced by a
    // copy with added conditions (`CopyFrom::with_condition`). A COPY FROM into a table of the
    // set-based shape is admitted inside pgrx's guard, and its error raised here, in the hook's
    // frame, which holds only plain values while the statement runs (as `raise` and
    // `process_utility_next` require: the conditions' names are dropped before it runs).
    unsafe {
        let mut pstmt = pstmt;
        let mut admitted = false;
        // Protected Citus tables (guard/citus.rs): a COPY into one, a TRUNCATE, a change of the
        // marker constraint.
        let truncated = citus::truncated_relations(pstmt);
        let marker = citus::touched_markers(pstmt);
        let child = citus::becoming_child(pstmt);
        let copy_target = CopyFrom::of(pstmt).and_then(|c| c.relid().map(|r| (c, r)));
        let sent = context == pg_sys::ProcessUtilityContext::PROCESS_UTILITY_TOPLEVEL;
        let outcome = pg_sys::submodules::panic::pgrx_extern_c_guard(move || {
            if let Some((relids, cascade)) = &truncated {
                crate::guard::citus::write_while_taken(relids)?;
                crate::guard::citus::truncate(relids, *cascade, sent)?;
            }
            if let Some((relid, name)) = &marker {
                crate::guard::citus::touch_marker(*relid, name)?;
            }
            if let Some(relid) = child {
                crate::guard::citus::becoming_child(relid)?;
            }
            if let Some((copy, relid)) = &copy_target {
                crate::guard::citus::write_while_taken(&[*relid])?;
                crate::guard::citus::begin_copy(*relid, sent, &|column: &str| {
                    std::ffi::CString::new(column).is_ok_and(|c| copy.names_column(&c))
                })?;
            }
            Ok(())
        });
        if let Err(e) = outcome {
            raise(e, Raiser::Hook("pg_fencing ProcessUtility hook"));
        }
        if let Some(mut copy) = CopyFrom::of(pstmt) {
            let outcome = pg_sys::submodules::panic::pgrx_extern_c_guard(|| {
                copy_from::begin(&copy, guard_address())
            });
            match outcome {
                Err(e) => raise(e, Raiser::Hook("pg_fencing ProcessUtility hook")),
                Ok(None) => {}
                Ok(Some(conditions)) => {
                    admitted = true;
                    if let Some(column) = &conditions.token_column {
                        pstmt = copy.with_condition(
                            pstmt,
                            c"_pg_fencing",
                            c"copy_token",
                            std::slice::from_ref(column),
                        );
                    }
                    if !conditions.key_columns.is_empty() {
                        pstmt = copy.with_condition(
                            pstmt,
                            c"_pg_fencing",
                            c"copy_key",
                            &conditions.key_columns,
                        );
                    }
                    drop(conditions);
                }
            }
        }
        let prev = PREV_PROCESS_UTILITY.get().copied().flatten();
        // (An ERROR ends the COPY's transaction or subtransaction, which clears its entry.)
        copy_stmt::process_utility_next(
            prev,
            pstmt,
            query_string,
            read_only_tree,
            context,
            params,
            query_env,
            dest,
            qc,
        );
        crate::guard::citus::end_copy();
        if admitted {
            let rows = copy_stmt::rows_processed(qc);
            let outcome =
                pg_sys::submodules::panic::pgrx_extern_c_guard(move || copy_from::finish(rows));
            if let Err(e) = outcome {
                raise(e, Raiser::Hook("pg_fencing ProcessUtility hook"));
            }
        }
    }
}

/// # Safety
/// Only for PostgreSQL's object access machinery to call (installed by `init`), on the main
/// thread, inside a transaction.
unsafe extern "C-unwind" fn object_access(
    access: pg_sys::ObjectAccessType::Type,
    class_id: pg_sys::Oid,
    object_id: pg_sys::Oid,
    sub_id: std::ffi::c_int,
    arg: *mut std::ffi::c_void,
) {
    // SAFETY: the previous hook gets PostgreSQL's own arguments unchanged. A relation about to
    // be dropped (OAT_DROP of a pg_class object, not a column) is judged inside pgrx's guard (an
    // ERROR of a catalog lookup or statement is re-raised from there); the refusal is raised in
    // this hook's frame, which holds only plain values (as `raise` requires). Raising an ERROR
    // from OAT_DROP aborts the command before the object is deleted.
    unsafe {
        if let Some(prev) = PREV_OBJECT_ACCESS.get().copied().flatten() {
            prev(access, class_id, object_id, sub_id, arg);
        }
        if access != pg_sys::ObjectAccessType::OAT_DROP
            || class_id != pg_sys::RelationRelationId
            || sub_id != 0
        {
            return;
        }
        let outcome = pg_sys::submodules::panic::pgrx_extern_c_guard(move || {
            crate::state::protections::before_relation_drop(object_id)
        });
        if let Err(e) = outcome {
            raise(e, Raiser::Hook("pg_fencing object access hook"));
        }
    }
}
