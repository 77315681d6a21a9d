//! The planner's and executor's side of the UPDATE fast path (docs/design.md, "The UPDATE fast
//! path"): reading an UPDATE's target and SET list, adding the stamping expression to it,
//! marking the plan, and taking the guard's UPDATE events out of the executor's private copy of
//! a result relation's triggers; and the arguments of a stamping call. What to do is decided by
//! `guard/fast_path.rs`; this layer only reads and writes PostgreSQL's structures.

use crate::pg::trigger_event::{trigger_named_in, Relation};
use pgrx::pg_sys;
use pgrx::PgList;
use std::ffi::{c_char, c_int, CStr, CString};

// Declared here, not taken from pgrx's bindings, because those catch PostgreSQL errors and
// re-raise them through pgrx, which keeps only SQLSTATEs that PostgreSQL itself defines: an error
// raised while planning or starting a statement (a user function's own SQLSTATE, our FTxxx codes)
// must reach the client unchanged.
// SAFETY: the signatures are those of optimizer/planner.h and executor/executor.h, so calls
// through them follow the C ABI.
unsafe extern "C-unwind" {
    #[link_name = "standard_planner"]
    fn standard_planner_unguarded(
        parse: *mut pg_sys::Query,
        query_string: *const c_char,
        cursor_options: c_int,
        bound_params: pg_sys::ParamListInfo,
    ) -> *mut pg_sys::PlannedStmt;
    #[link_name = "standard_ExecutorStart"]
    fn standard_executor_start_unguarded(query_desc: *mut pg_sys::QueryDesc, eflags: c_int);
    #[link_name = "standard_ExecutorFinish"]
    fn standard_executor_finish_unguarded(query_desc: *mut pg_sys::QueryDesc);
    #[cfg(feature = "pg15")]
    #[link_name = "standard_ExecutorRun"]
    fn standard_executor_run_unguarded(
        query_desc: *mut pg_sys::QueryDesc,
        direction: pg_sys::ScanDirection::Type,
        count: u64,
        execute_once: bool,
    );
    #[cfg(feature = "pg18")]
    #[link_name = "standard_ExecutorRun"]
    fn standard_executor_run_unguarded(
        query_desc: *mut pg_sys::QueryDesc,
        direction: pg_sys::ScanDirection::Type,
        count: u64,
    );
    #[link_name = "standard_ExecutorEnd"]
    fn standard_executor_end_unguarded(query_desc: *mut pg_sys::QueryDesc);
}

/// End the executor with the previous hook, or PostgreSQL's.
///
/// # Safety
/// As [`plan_next`], for the ExecutorEnd hook.
pub unsafe fn executor_end_next(
    prev: pg_sys::ExecutorEnd_hook_type,
    query_desc: *mut pg_sys::QueryDesc,
) {
    // SAFETY: the executor's own argument, passed on unchanged.
    unsafe {
        match prev {
            Some(f) => f(query_desc),
            None => standard_executor_end_unguarded(query_desc),
        }
    }
}

/// Run the executor with the previous hook, or PostgreSQL's (PostgreSQL 15: `execute_once`
/// too; 18 has no such argument).
///
/// # Safety
/// As [`plan_next`], for the ExecutorRun hook.
#[cfg(feature = "pg15")]
pub unsafe fn executor_run_next(
    prev: pg_sys::ExecutorRun_hook_type,
    query_desc: *mut pg_sys::QueryDesc,
    direction: pg_sys::ScanDirection::Type,
    count: u64,
    execute_once: bool,
) {
    // SAFETY: the executor's own arguments, passed on (the count as `run_count` says).
    unsafe {
        match prev {
            Some(f) => f(query_desc, direction, count, execute_once),
            None => standard_executor_run_unguarded(query_desc, direction, count, execute_once),
        }
    }
}

/// As above, for PostgreSQL 18.
///
/// # Safety
/// As [`plan_next`], for the ExecutorRun hook.
#[cfg(feature = "pg18")]
pub unsafe fn executor_run_next(
    prev: pg_sys::ExecutorRun_hook_type,
    query_desc: *mut pg_sys::QueryDesc,
    direction: pg_sys::ScanDirection::Type,
    count: u64,
) {
    // SAFETY: the executor's own arguments, passed on (the count as `run_count` says).
    unsafe {
        match prev {
            Some(f) => f(query_desc, direction, count),
            None => standard_executor_run_unguarded(query_desc, direction, count),
        }
    }
}

/// The row count to run `query_desc` with, given the caller's `count`: 0 (no limit) for a
/// statement whose RETURNING list is hidden (`hide_returning`). Its ModifyTable returns a row
/// for each row it writes, which the executor counts against the caller's limit although it
/// sends none; a caller's limit (`SPI_execute(…, count)`, PL/Python's `plpy.execute(q, n)`)
/// would stop the INSERT or DELETE part-way, where without RETURNING it writes every row.
///
/// # Safety
/// `query_desc` must be the ExecutorRun hook's (its executor started).
pub unsafe fn run_count(query_desc: *mut pg_sys::QueryDesc, count: u64) -> u64 {
    if count == 0 {
        return 0;
    }
    // SAFETY: per the contract; `ModifyExecution::of` checks the plan's shape.
    match unsafe { ModifyExecution::of(query_desc) } {
        Some(exec) if exec.has_hidden_check() => 0,
        _ => count,
    }
}

/// The rows a finished statement processed (`es_processed`: for an INSERT, UPDATE or DELETE
/// that sets the command's tag, the rows it wrote) and its memory context.
///
/// # Safety
/// `query_desc` must be the ExecutorFinish hook's, after the executor finished.
pub unsafe fn processed(query_desc: *mut pg_sys::QueryDesc) -> (usize, u64) {
    // SAFETY: per the contract the QueryDesc and its EState (NULL checked) are valid.
    unsafe {
        let estate = (*query_desc).estate;
        if estate.is_null() {
            (0, 0)
        } else {
            ((*estate).es_query_cxt as usize, (*estate).es_processed)
        }
    }
}

/// Finish the executor with the previous hook, or PostgreSQL's.
///
/// # Safety
/// As [`plan_next`], for the ExecutorFinish hook.
pub unsafe fn executor_finish_next(
    prev: pg_sys::ExecutorFinish_hook_type,
    query_desc: *mut pg_sys::QueryDesc,
) {
    // SAFETY: the executor's own argument, passed on unchanged.
    unsafe {
        match prev {
            Some(f) => f(query_desc),
            None => standard_executor_finish_unguarded(query_desc),
        }
    }
}

/// The memory context of the statement of `query_desc` (0 if it has no executor state).
///
/// # Safety
/// `query_desc` must be the ExecutorEnd hook's, before the executor is ended.
pub unsafe fn statement_context(query_desc: *mut pg_sys::QueryDesc) -> usize {
    // SAFETY: per the contract the QueryDesc and its EState (NULL checked) are valid.
    unsafe {
        let estate = (*query_desc).estate;
        if estate.is_null() {
            0
        } else {
            (*estate).es_query_cxt as usize
        }
    }
}

/// Plan with the previous planner hook, or PostgreSQL's planner.
///
/// # Safety
/// The planner hook's own arguments; call from the hook's frame with nothing that needs dropping
/// alive in it (an ERROR leaves by longjmp).
pub unsafe fn plan_next(
    prev: pg_sys::planner_hook_type,
    parse: *mut pg_sys::Query,
    query_string: *const c_char,
    cursor_options: c_int,
    bound_params: pg_sys::ParamListInfo,
) -> *mut pg_sys::PlannedStmt {
    // SAFETY: the arguments are the planner's (this function's contract), passed on unchanged.
    unsafe {
        match prev {
            Some(f) => f(parse, query_string, cursor_options, bound_params),
            None => standard_planner_unguarded(parse, query_string, cursor_options, bound_params),
        }
    }
}

/// Start the executor with the previous hook, or PostgreSQL's.
///
/// # Safety
/// As [`plan_next`], for the ExecutorStart hook.
pub unsafe fn executor_start_next(
    prev: pg_sys::ExecutorStart_hook_type,
    query_desc: *mut pg_sys::QueryDesc,
    eflags: c_int,
) {
    // SAFETY: the arguments are the executor's (this function's contract), passed on unchanged.
    unsafe {
        match prev {
            Some(f) => f(query_desc, eflags),
            None => standard_executor_start_unguarded(query_desc, eflags),
        }
    }
}

/// The OID of the result relation of the planner's Query `q`, if it is a relation.
fn target_of(q: *mut pg_sys::Query) -> Option<pg_sys::Oid> {
    // SAFETY: `q` is the planner hook's Query (every caller holds it for the hook's call);
    // `resultRelation` (> 0, checked by the callers' `of`) indexes its range table (1-based),
    // whose entries are RangeTblEntry nodes, valid for the call.
    unsafe {
        let q = &*q;
        let rte = pointers::<pg_sys::RangeTblEntry>(q.rtable).nth(q.resultRelation as usize - 1)?;
        ((*rte).rtekind == pg_sys::RTEKind::RTE_RELATION).then_some((*rte).relid)
    }
}

/// The elements of pointer List `list` (NULL: none), read in place (no copy, no call).
///
/// # Safety
/// `list` must be NULL or a valid List of pointers to `T`, not changed while the iterator lives.
unsafe fn pointers<T>(list: *mut pg_sys::List) -> impl Iterator<Item = *mut T> {
    let n = if list.is_null() {
        0
    } else {
        // SAFETY: per the contract, a non-NULL List has `length` cells in `elements`.
        unsafe { (*list).length.max(0) as usize }
    };
    (0..n).map(move |i| {
        // SAFETY: `i` < `length`; each cell holds a pointer (the contract).
        unsafe { (*(*list).elements.add(i)).ptr_value.cast::<T>() }
    })
}

/// A top-level UPDATE the planner is about to plan (after rewriting, so an UPDATE through a
/// view names the view's base table here).
pub struct UpdateQuery {
    q: *mut pg_sys::Query,
}

/// One argument of the stamping call added to an UPDATE.
pub enum StampArg<'s> {
    /// The old row's value of a column of the target table.
    Column(i16),
    /// What an INSERT gives a column of the target table: its target entry's expression, copied
    /// (only where [`InsertQuery::gives_once`] holds; NULL if the statement gives it nothing).
    Given(i16),
    Oid(pg_sys::Oid),
    Int8(i64),
    Text(&'s str),
    /// The row version's table (`tableoid`: a partition's own for a row of a partition).
    RowTable,
    /// The row version's physical position (`ctid`).
    RowId,
}

impl UpdateQuery {
    /// The UPDATE of `parse`, or `None` for any other statement.
    ///
    /// # Safety
    /// `parse` must be the planner hook's Query, not used by anyone else while this lives.
    pub unsafe fn of(parse: *mut pg_sys::Query) -> Option<UpdateQuery> {
        // SAFETY: the planner's Query is valid for the hook's call (this function's contract).
        let q = unsafe { &*parse };
        (q.commandType == pg_sys::CmdType::CMD_UPDATE && q.resultRelation > 0)
            .then_some(UpdateQuery { q: parse })
    }

    /// The target table's OID, if the target is a relation.
    pub fn target(&self) -> Option<pg_sys::Oid> {
        target_of(self.q)
    }

    /// The columns the SET list assigns (attribute numbers of its non-junk entries).
    pub fn set_columns(&self) -> Vec<i16> {
        // SAFETY: the Query's target list is a List of TargetEntry nodes, valid for the call.
        unsafe {
            PgList::<pg_sys::TargetEntry>::from_pg((*self.q).targetList)
                .iter_ptr()
                .filter(|t| !(**t).resjunk)
                .map(|t| (*t).resno)
                .collect()
        }
    }

    /// Add `column = function(args…)` to the SET list (`rel` is the target table, open).
    pub fn add_stamp(
        &mut self,
        rel: Relation,
        attnum: i16,
        function: pg_sys::Oid,
        args: &[StampArg],
    ) {
        // SAFETY: main thread, inside the planner's call; the expression is made by
        // `stamp_expr` in the current memory context (the planner's, where the Query lives); the
        // new TargetEntry goes after the non-junk entries, before the junk entries (the planner
        // numbers the SET columns in list order).
        unsafe {
            let q = &mut *self.q;
            let expr = stamp_expr(q.resultRelation, rel, function, args, std::ptr::null_mut());
            let name = CString::new(rel.column_name(attnum)).unwrap_or_default();
            let tle =
                pg_sys::makeTargetEntry(expr.cast(), attnum, pg_sys::pstrdup(name.as_ptr()), false);
            let tlist = PgList::<pg_sys::TargetEntry>::from_pg(q.targetList);
            // After the other SET entries: evaluated after them, as the trigger ran after the
            // new row was computed (a SET expression that sets pg_fencing.token counts).
            let pos = tlist.iter_ptr().take_while(|t| !(**t).resjunk).count();
            q.targetList = pg_sys::list_insert_nth(q.targetList, pos as c_int, tle.cast());
        }
    }
}

/// `function(args…)` returning bigint, its column arguments Vars of range table entry
/// `varno` (the table `rel`, open).
///
/// # Safety
/// Main thread, inside the planner's call; the nodes are made in the current memory context.
unsafe fn stamp_expr(
    varno: c_int,
    rel: Relation,
    function: pg_sys::Oid,
    args: &[StampArg],
    given: *mut pg_sys::List,
) -> *mut pg_sys::FuncExpr {
    // SAFETY: every node is made by PostgreSQL's constructors in the current memory context
    // (this function's contract). Vars name the result relation's range table index and the
    // column's own type, typmod and collation; text constants are palloc'd text values.
    unsafe {
        let mut list = PgList::<pg_sys::Node>::new();
        for a in args {
            let node: *mut pg_sys::Node = match a {
                StampArg::Column(n) => {
                    let (typid, typmod, coll) = rel.column_type(*n);
                    pg_sys::makeVar(varno, *n, typid, typmod, coll, 0).cast()
                }
                StampArg::Given(n) => {
                    let entry = pointers::<pg_sys::TargetEntry>(given)
                        .find(|t| !(**t).resjunk && (**t).resno == *n);
                    match entry {
                        Some(t) => pg_sys::copyObjectImpl((*t).expr.cast()).cast(),
                        None => {
                            let (typid, typmod, coll) = rel.column_type(*n);
                            pg_sys::makeNullConst(typid, typmod, coll).cast()
                        }
                    }
                }
                StampArg::RowTable => pg_sys::makeVar(
                    varno,
                    pg_sys::TableOidAttributeNumber as i16,
                    pg_sys::OIDOID,
                    -1,
                    pg_sys::Oid::INVALID,
                    0,
                )
                .cast(),
                StampArg::RowId => pg_sys::makeVar(
                    varno,
                    pg_sys::SelfItemPointerAttributeNumber as i16,
                    pg_sys::TIDOID,
                    -1,
                    pg_sys::Oid::INVALID,
                    0,
                )
                .cast(),
                StampArg::Oid(o) => pg_sys::makeConst(
                    pg_sys::OIDOID,
                    -1,
                    pg_sys::Oid::INVALID,
                    4,
                    pg_sys::Datum::from(*o),
                    false,
                    true,
                )
                .cast(),
                StampArg::Int8(v) => pg_sys::makeConst(
                    pg_sys::INT8OID,
                    -1,
                    pg_sys::Oid::INVALID,
                    8,
                    pg_sys::Datum::from(*v),
                    false,
                    true,
                )
                .cast(),
                StampArg::Text(s) => pg_sys::makeConst(
                    pg_sys::TEXTOID,
                    -1,
                    pg_sys::DEFAULT_COLLATION_OID,
                    -1,
                    // Text of the catalog (a resource, a column name): no NUL byte inside.
                    pg_sys::Datum::from(pg_sys::cstring_to_text_with_len(
                        s.as_ptr().cast(),
                        s.len() as c_int,
                    )),
                    false,
                    false,
                )
                .cast(),
            };
            list.push(node);
        }
        let call = pg_sys::makeFuncExpr(
            function,
            pg_sys::INT8OID,
            list.into_pg(),
            pg_sys::Oid::INVALID,
            pg_sys::Oid::INVALID,
            pg_sys::CoercionForm::COERCE_EXPLICIT_CALL,
        );
        (*call).location = PLANNED_CALL_LOCATION;
        call
    }
}

/// The `location` of the stamping and checking calls the planner hook adds: no parsed call has
/// it (the parser gives a call its offset in the statement's text, or -1), and the planner keeps
/// a call's location through its copies and simplifications, so a call that has it at run time
/// (`StampCall::planned`) is one the planner hook made, not one written into the statement.
const PLANNED_CALL_LOCATION: c_int = -0x7066;

/// A top-level DELETE the planner is about to plan (after rewriting).
pub struct DeleteQuery {
    q: *mut pg_sys::Query,
}

impl DeleteQuery {
    /// The DELETE of `parse` that has no RETURNING list, or `None` for any other statement.
    ///
    /// # Safety
    /// `parse` must be the planner hook's Query, not used by anyone else while this lives.
    pub unsafe fn of(parse: *mut pg_sys::Query) -> Option<DeleteQuery> {
        // SAFETY: the planner's Query is valid for the hook's call (this function's contract).
        let q = unsafe { &*parse };
        (q.commandType == pg_sys::CmdType::CMD_DELETE
            && q.resultRelation > 0
            && q.returningList.is_null())
        .then_some(DeleteQuery { q: parse })
    }

    /// Does the statement set the command's result (its row count is `es_processed`)? A rule's
    /// added actions do not.
    pub fn sets_tag(&self) -> bool {
        // SAFETY: the planner's Query, valid for the hook's call.
        unsafe { (*self.q).canSetTag }
    }

    /// The target table's OID, if the target is a relation.
    pub fn target(&self) -> Option<pg_sys::Oid> {
        target_of(self.q)
    }

    /// Add `function(args…)` to the DELETE's target list as a junk column (`rel` is the target
    /// table, open): the plan under the DELETE evaluates it for each row it hands the DELETE to
    /// delete, on that row version (for a row changed concurrently under READ COMMITTED,
    /// EvalPlanQual evaluates it again on the latest version, which is the one deleted), before
    /// the DELETE deletes it; nothing reads its value. A row it is evaluated for may still be
    /// left alone (changed or deleted concurrently, skipped by a BEFORE DELETE trigger): the
    /// statement's row count tells (`DeleteCount`).
    pub fn add_check(&mut self, rel: Relation, function: pg_sys::Oid, args: &[StampArg]) {
        // SAFETY: main thread, inside the planner's call; the expression is made by `stamp_expr`
        // in the current memory context (the planner's, where the Query lives). A DELETE's
        // target list before planning holds only junk entries (numbered from 1); the planner
        // adds its row identity columns after them.
        unsafe {
            let q = &mut *self.q;
            let expr = stamp_expr(q.resultRelation, rel, function, args, std::ptr::null_mut());
            let resno = PgList::<pg_sys::TargetEntry>::from_pg(q.targetList).len() + 1;
            let tle = pg_sys::makeTargetEntry(
                expr.cast(),
                resno as i16,
                pg_sys::pstrdup(c"pg_fencing_check".as_ptr()),
                true,
            );
            q.targetList = pg_sys::lappend(q.targetList, tle.cast());
        }
    }
}

/// Make `function(args…)` the RETURNING list of `q`, which has none.
///
/// # Safety
/// Main thread, inside the planner's call; `q` is the planner's Query, whose RETURNING list is
/// empty. The nodes are made in the current memory context (the planner's).
unsafe fn returning_check(
    q: *mut pg_sys::Query,
    rel: Relation,
    function: pg_sys::Oid,
    args: &[StampArg],
) {
    // SAFETY: per the contract.
    unsafe {
        let q = &mut *q;
        let expr = stamp_expr(q.resultRelation, rel, function, args, std::ptr::null_mut());
        let tle = pg_sys::makeTargetEntry(
            expr.cast(),
            1,
            pg_sys::pstrdup(c"pg_fencing_check".as_ptr()),
            false,
        );
        q.returningList = pg_sys::lappend(std::ptr::null_mut(), tle.cast());
    }
}

/// A top-level INSERT just analysed, before the rewriter fills in its defaults (the parse
/// analysis hook's Query).
pub struct AnalyzedInsert {
    q: *mut pg_sys::Query,
}

impl AnalyzedInsert {
    /// The INSERT of `query`, or `None` for any other statement.
    ///
    /// # Safety
    /// `query` must be the parse analysis hook's Query, not used by anyone else while this lives.
    pub unsafe fn of(query: *mut pg_sys::Query) -> Option<AnalyzedInsert> {
        // SAFETY: the analysed Query is valid for the hook's call (this function's contract).
        let q = unsafe { &*query };
        (q.commandType == pg_sys::CmdType::CMD_INSERT && q.resultRelation > 0)
            .then_some(AnalyzedInsert { q: query })
    }

    /// The target relation's OID, if the target is a relation (a table or a view).
    pub fn target(&self) -> Option<pg_sys::Oid> {
        target_of(self.q)
    }

    /// Give column `attnum` (named `name`) of the target the value `function()` (a call without
    /// arguments returning bigint) if the statement gives it none: what the rewriter would fill
    /// in when that call is the column's default (the caller checked it is), without parsing
    /// the default's stored form again. The rewriter puts the entries in column order.
    pub fn give_default(&mut self, attnum: i16, name: &CStr, function: pg_sys::Oid) {
        // SAFETY: main thread, inside the analysis hook's call; the target list is a List of
        // TargetEntry nodes. The new entry, its call and its name are made in the current memory
        // context (the statement's), as the analyser's own, by PostgreSQL's constructors, called
        // unguarded from a frame of plain values inside one `pg_guard_ffi_boundary` (they raise
        // only out of memory, which jumps to the boundary and becomes a Rust panic there).
        unsafe {
            let q = &mut *self.q;
            let given = pointers::<pg_sys::TargetEntry>(q.targetList)
                .any(|t| !(*t).resjunk && (*t).resno == attnum);
            if given {
                return;
            }
            let list = q.targetList;
            let name = name.as_ptr();
            q.targetList = pg_sys::ffi::pg_guard_ffi_boundary(|| {
                let call = make_func_expr_raw(
                    function,
                    pg_sys::INT8OID,
                    std::ptr::null_mut(),
                    pg_sys::Oid::INVALID,
                    pg_sys::Oid::INVALID,
                    pg_sys::CoercionForm::COERCE_EXPLICIT_CALL,
                );
                let tle = make_target_entry_raw(call.cast(), attnum, pstrdup_raw(name), false);
                lappend_raw(list, tle.cast())
            });
        }
    }
}

// Declared here, not taken from pgrx's bindings, so that `give_default`'s constructors share
// one `pg_guard_ffi_boundary` instead of setting up one each (it runs for every INSERT into a
// set-based table). The signatures are those of nodes/makefuncs.h, utils/palloc.h and
// nodes/pg_list.h.
// SAFETY: as stated, calls through them follow the C ABI.
unsafe extern "C-unwind" {
    #[link_name = "makeFuncExpr"]
    fn make_func_expr_raw(
        funcid: pg_sys::Oid,
        rettype: pg_sys::Oid,
        args: *mut pg_sys::List,
        funccollid: pg_sys::Oid,
        inputcollid: pg_sys::Oid,
        fformat: pg_sys::CoercionForm::Type,
    ) -> *mut pg_sys::FuncExpr;
    #[link_name = "makeTargetEntry"]
    fn make_target_entry_raw(
        expr: *mut pg_sys::Expr,
        resno: pg_sys::AttrNumber,
        resname: *mut c_char,
        resjunk: bool,
    ) -> *mut pg_sys::TargetEntry;
    #[link_name = "pstrdup"]
    fn pstrdup_raw(s: *const c_char) -> *mut c_char;
    #[link_name = "lappend"]
    fn lappend_raw(list: *mut pg_sys::List, datum: *mut std::ffi::c_void) -> *mut pg_sys::List;
}

/// A top-level INSERT the planner is about to plan (after rewriting: its target list has an
/// entry per column it sets, in column order, defaults filled in).
pub struct InsertQuery {
    q: *mut pg_sys::Query,
}

impl InsertQuery {
    /// Has the INSERT a RETURNING list or an `ON CONFLICT` clause?
    pub fn returns_or_conflicts(&self) -> bool {
        // SAFETY: the planner's Query, valid for the hook's call.
        unsafe { !(*self.q).returningList.is_null() || !(*self.q).onConflict.is_null() }
    }

    /// Make `function(args…)` the INSERT's RETURNING list (`rel` is the target table, open): it
    /// is evaluated for each row the INSERT inserts, once the row is in the table's indexes
    /// (ExecInsert inserts the index entries, then projects RETURNING). The statement still
    /// returns no rows: [`hide_returning`] is called on its plan. Only for an INSERT for which
    /// [`returns_or_conflicts`](Self::returns_or_conflicts) is false.
    pub fn add_check(&mut self, rel: Relation, function: pg_sys::Oid, args: &[StampArg]) {
        // SAFETY: the planner's Query (`of`); the caller checked it has no RETURNING list.
        unsafe { returning_check(self.q, rel, function, args) }
    }

    /// Does the INSERT write one row, with values for `columns` that may be evaluated twice
    /// with the same result: a VALUES list of one row (no FROM item, no WITH, no set-returning
    /// function, no subquery) whose expressions for these columns call only PostgreSQL's own
    /// immutable functions (constants, parameters, casts: not a stable function, whose answer a
    /// volatile one evaluated between the two, such as `set_config`, may change; not a user's
    /// function, whose declared volatility nothing checks), and a target entry for each column
    /// (a default is filled in by the rewriter)?
    /// Then [`StampArg::Given`] of these columns gives the values the row gets.
    pub fn gives_once(&self, columns: &[i16]) -> bool {
        // SAFETY: the planner's Query, valid for the hook's call; its jointree is a FromExpr and
        // its target list a List of TargetEntry nodes (the rewriter's).
        unsafe {
            let q = &*self.q;
            let from_empty = q.jointree.is_null() || (*q.jointree).fromlist.is_null();
            if !from_empty || !q.cteList.is_null() || q.hasTargetSRFs || q.hasSubLinks {
                return false;
            }
            columns.iter().all(|a| {
                pointers::<pg_sys::TargetEntry>(q.targetList)
                    .find(|t| !(**t).resjunk && (**t).resno == *a)
                    .is_some_and(|t| {
                        let e = (*t).expr.cast::<pg_sys::Node>();
                        !e.is_null()
                            && !pg_sys::contain_mutable_functions(e)
                            && !pg_sys::contain_subplans(e)
                            && built_in_only(e, 0)
                    })
            })
        }
    }

    /// Has the INSERT an `ON CONFLICT … DO UPDATE` clause?
    pub fn updates_on_conflict(&self) -> bool {
        // SAFETY: the planner's Query, valid for the hook's call; `onConflict` is NULL or an
        // OnConflictExpr node.
        unsafe {
            let oc = (*self.q).onConflict;
            !oc.is_null() && (*oc).action == pg_sys::OnConflictAction::ONCONFLICT_UPDATE
        }
    }

    /// The INSERT of `parse`, or `None` for any other statement.
    ///
    /// # Safety
    /// `parse` must be the planner hook's Query, not used by anyone else while this lives.
    pub unsafe fn of(parse: *mut pg_sys::Query) -> Option<InsertQuery> {
        // SAFETY: the planner's Query is valid for the hook's call (this function's contract).
        let q = unsafe { &*parse };
        (q.commandType == pg_sys::CmdType::CMD_INSERT && q.resultRelation > 0)
            .then_some(InsertQuery { q: parse })
    }

    /// Does the statement set the command's result (its row count is `es_processed`)?
    pub fn sets_tag(&self) -> bool {
        // SAFETY: the planner's Query, valid for the hook's call.
        unsafe { (*self.q).canSetTag }
    }

    /// The target table's OID, if the target is a relation.
    pub fn target(&self) -> Option<pg_sys::Oid> {
        target_of(self.q)
    }

    /// Make column `attnum`'s value `function(value, args…)`, `value` being what the statement
    /// gave the column (its expression or default, NULL if none), and the other arguments
    /// `args` (`rel` is the target table, open).
    /// (`default_call`: a function whose call as the column's value, the set-based shape's
    /// column default, is not passed on but NULL: the stamp replaces it, and it would stamp
    /// again.)
    pub fn stamp_column(
        &mut self,
        rel: Relation,
        attnum: i16,
        function: pg_sys::Oid,
        args: &[StampArg],
        default_call: Option<pg_sys::Oid>,
    ) {
        // SAFETY: main thread, inside the planner's call; the target list is a List of
        // TargetEntry nodes in column order (the rewriter's), which stays in column order: the
        // entry of `attnum` gets a new expression, or a new entry goes before the first entry
        // of a higher column (or a junk entry). Nodes are made in the current memory context.
        unsafe {
            let q = &mut *self.q;
            let existing = pointers::<pg_sys::TargetEntry>(q.targetList)
                .find(|t| !(**t).resjunk && (**t).resno == attnum);
            let is_default_call = |e: *mut pg_sys::Expr| {
                !e.is_null()
                    && (*e).type_ == pg_sys::NodeTag::T_FuncExpr
                    && Some((*e.cast::<pg_sys::FuncExpr>()).funcid) == default_call
            };
            let value: *mut pg_sys::Node = match existing {
                Some(t) if !is_default_call((*t).expr) => (*t).expr.cast(),
                _ => pg_sys::makeNullConst(pg_sys::INT8OID, -1, pg_sys::Oid::INVALID).cast(),
            };
            let expr = stamp_expr(q.resultRelation, rel, function, args, q.targetList);
            (*expr).args = pg_sys::lcons(value.cast(), (*expr).args);
            match existing {
                Some(t) => (*t).expr = expr.cast(),
                None => {
                    let name = CString::new(rel.column_name(attnum)).unwrap_or_default();
                    let tle = pg_sys::makeTargetEntry(
                        expr.cast(),
                        attnum,
                        pg_sys::pstrdup(name.as_ptr()),
                        false,
                    );
                    let pos = pointers::<pg_sys::TargetEntry>(q.targetList)
                        .take_while(|t| !(**t).resjunk && (**t).resno < attnum)
                        .count();
                    q.targetList = pg_sys::list_insert_nth(q.targetList, pos as c_int, tle.cast());
                }
            }
        }
    }
}

/// Is `node` made only of constants, parameters, relabellings, domain coercions and calls of
/// PostgreSQL's own functions and operators (OIDs below `FirstNormalObjectId`), whose declared
/// volatility can be trusted? A user's function declared IMMUTABLE may still read a setting that
/// changes between two evaluations ([`InsertQuery::gives_once`]). Any other node: false.
///
/// # Safety
/// `node` must be NULL or a valid expression tree of the planner's Query.
unsafe fn built_in_only(node: *mut pg_sys::Node, depth: u32) -> bool {
    const FIRST_NORMAL_OBJECT_ID: u32 = pg_sys::FirstNormalObjectId;
    if node.is_null() {
        return true;
    }
    if depth > 32 {
        return false;
    }
    let built_in =
        |oid: pg_sys::Oid| oid != pg_sys::Oid::INVALID && oid.to_u32() < FIRST_NORMAL_OBJECT_ID;
    // SAFETY: per the contract; each node's tag is read before it is treated as that node type,
    // and argument lists are Lists of expression nodes.
    unsafe {
        let args_ok = |args: *mut pg_sys::List| {
            PgList::<pg_sys::Node>::from_pg(args)
                .iter_ptr()
                .all(|a| built_in_only(a, depth + 1))
        };
        match (*node).type_ {
            pg_sys::NodeTag::T_Const | pg_sys::NodeTag::T_Param => true,
            pg_sys::NodeTag::T_RelabelType => {
                built_in_only((*node.cast::<pg_sys::RelabelType>()).arg.cast(), depth + 1)
            }
            pg_sys::NodeTag::T_CoerceToDomain => built_in_only(
                (*node.cast::<pg_sys::CoerceToDomain>()).arg.cast(),
                depth + 1,
            ),
            pg_sys::NodeTag::T_FuncExpr => {
                let f = node.cast::<pg_sys::FuncExpr>();
                built_in((*f).funcid) && args_ok((*f).args)
            }
            pg_sys::NodeTag::T_OpExpr => {
                let o = node.cast::<pg_sys::OpExpr>();
                built_in((*o).opno) && args_ok((*o).args)
            }
            _ => false,
        }
    }
}

/// The plan of a DELETE or INSERT whose RETURNING list `add_check` made: it sends no rows
/// (the executor evaluates the list for each deleted or inserted row and, without `hasReturning`, passes
/// the results to no one: ExecutePlan sends tuples only for SELECT or `hasReturning`, SPI and
/// portals choose their behaviour by it).
///
/// # Safety
/// `stmt` must be the PlannedStmt the planner just returned for that DELETE.
pub unsafe fn hide_returning(stmt: *mut pg_sys::PlannedStmt) {
    // SAFETY: per the contract.
    unsafe {
        (*stmt).hasReturning = false;
    }
}

/// Run `f` with relation `relid` open (it is already locked by the statement being planned).
pub fn with_relation<T>(relid: pg_sys::Oid, f: impl FnOnce(Relation) -> Option<T>) -> Option<T> {
    // SAFETY: main thread inside a transaction. RelationIdGetRelation returns NULL (checked) or
    // an open relcache entry with its reference count raised, closed by RelationClose after `f`
    // (an ERROR inside `f` releases it with the resource owner). The planner holds the
    // statement's lock on the target, so the entry cannot change meanwhile.
    unsafe {
        let rel = pg_sys::RelationIdGetRelation(relid);
        if rel.is_null() {
            return None;
        }
        let out = f(Relation::from_open(rel));
        pg_sys::RelationClose(rel);
        out
    }
}

/// The address of the C function through which function `fnoid` runs (for a C function its own
/// symbol, for others their language's handler).
pub fn c_function_address(fnoid: pg_sys::Oid) -> Option<usize> {
    // SAFETY: main thread inside a transaction; fmgr_info fills a stack FmgrInfo for a C function (loading its
    // library if needed), raising ERROR rather than returning garbage.
    unsafe {
        let mut finfo = pg_sys::FmgrInfo::default();
        pg_sys::fmgr_info(fnoid, &mut finfo);
        finfo.fn_addr.map(|f| f as usize)
    }
}

/// The OID of function `_pg_fencing.<name>` (the name is unique in the schema).
pub fn internal_function(name: &CStr) -> Option<pg_sys::Oid> {
    // SAFETY: main thread inside a transaction. The qualified name is a List of two String
    // nodes made from NUL-terminated strings; LookupFuncName with nargs -1 and missing_ok
    // returns InvalidOid for a missing function (ERROR only for an ambiguous name, which our
    // schema never has).
    unsafe {
        if pg_sys::get_namespace_oid(c"_pg_fencing".as_ptr(), true) == pg_sys::Oid::INVALID {
            return None;
        }
        let mut names = PgList::<pg_sys::Node>::new();
        names.push(pg_sys::makeString(pg_sys::pstrdup(c"_pg_fencing".as_ptr())).cast());
        names.push(pg_sys::makeString(pg_sys::pstrdup(name.as_ptr())).cast());
        let oid = pg_sys::LookupFuncName(names.into_pg(), -1, std::ptr::null(), true);
        (oid != pg_sys::Oid::INVALID).then_some(oid)
    }
}

/// The mark of a fast-path plan: a plan-cache dependency of a kind PostgreSQL never records
/// (it records functions and domain types, `PROCOID` and `TYPEOID`; nothing a statement can
/// name produces an `AUTHOID` entry), with a value of our own.
const MARK_CACHE: c_int = pg_sys::SysCacheIdentifier::AUTHOID as c_int;
const MARK_HASH: u32 = 0x7066_6670;

/// Mark `stmt` as a plan of the UPDATE fast path (see [`MARK_CACHE`]).
///
/// # Safety
/// `stmt` must be the PlannedStmt the planner just returned, in the current memory context.
pub unsafe fn add_marker(stmt: *mut pg_sys::PlannedStmt) {
    // SAFETY: per the contract.
    unsafe { append_mark(stmt, MARK_HASH) }
}

/// Append the mark with value `hash` to `stmt`'s dependencies.
///
/// # Safety
/// As [`add_marker`].
unsafe fn append_mark(stmt: *mut pg_sys::PlannedStmt, hash: u32) {
    // SAFETY: per the contract; the item is a PlanInvalItem node allocated zeroed in the current
    // memory context with its node tag set, appended to the plan's list of dependencies (the plan
    // cache only compares its cache id and hash with invalidations, of which there are none for
    // this value).
    unsafe {
        let item = pg_sys::palloc0(std::mem::size_of::<pg_sys::PlanInvalItem>())
            .cast::<pg_sys::PlanInvalItem>();
        (*item).type_ = pg_sys::NodeTag::T_PlanInvalItem;
        (*item).cacheId = MARK_CACHE;
        (*item).hashValue = hash;
        (*stmt).invalItems = pg_sys::lappend((*stmt).invalItems, item.cast());
    }
}

/// The second mark, of a one-row INSERT whose token column's stamp notes its key
/// (`fast_path::stamp_insert_key`): its executor takes the AFTER INSERT trigger out and sets up
/// the note. Like [`MARK_HASH`], only the planner hook can put it on a plan (a call of the
/// function written into a statement marks nothing).
const KEYS_NOTED_HASH: u32 = 0x7066_6b6e;

/// Mark `stmt` (marked by [`add_marker`]) as an INSERT whose stamp notes its key.
///
/// # Safety
/// As [`add_marker`].
pub unsafe fn add_keys_marker(stmt: *mut pg_sys::PlannedStmt) {
    // SAFETY: per the contract.
    unsafe { append_mark(stmt, KEYS_NOTED_HASH) }
}

/// An UPDATE or DELETE whose executor has just been started (its ModifyTable state built).
pub struct ModifyExecution {
    qd: *mut pg_sys::QueryDesc,
    mt: *mut pg_sys::ModifyTableState,
    /// `TRIGGER_TYPE_UPDATE` or `TRIGGER_TYPE_DELETE`: the event the statement fires.
    event: u32,
}

impl ModifyExecution {
    /// The UPDATE or DELETE of `query_desc` whose plan is that statement at the top, or `None`.
    ///
    /// # Safety
    /// `query_desc` must be the ExecutorStart hook's, after the executor was started, and used
    /// only during the hook's call.
    pub unsafe fn of(query_desc: *mut pg_sys::QueryDesc) -> Option<ModifyExecution> {
        // SAFETY: per the contract the QueryDesc, its PlannedStmt and its PlanState tree are
        // valid; the node tag is read before the PlanState is treated as a ModifyTableState.
        unsafe {
            let qd = &*query_desc;
            if qd.plannedstmt.is_null() || qd.planstate.is_null() {
                return None;
            }
            let event = match (*qd.plannedstmt).commandType {
                pg_sys::CmdType::CMD_INSERT => pg_sys::TRIGGER_TYPE_INSERT,
                pg_sys::CmdType::CMD_UPDATE => pg_sys::TRIGGER_TYPE_UPDATE,
                pg_sys::CmdType::CMD_DELETE => pg_sys::TRIGGER_TYPE_DELETE,
                _ => return None,
            };
            if (*qd.planstate).type_ != pg_sys::NodeTag::T_ModifyTableState {
                return None;
            }
            let mt = qd.planstate.cast::<pg_sys::ModifyTableState>();
            ((*mt).operation == (*qd.plannedstmt).commandType).then_some(ModifyExecution {
                qd: query_desc,
                mt,
                event,
            })
        }
    }

    /// Does the plan carry the fast path's mark (see [`add_marker`])?
    pub fn has_marker(&self) -> bool {
        self.has_mark(MARK_HASH)
    }

    /// Does the plan carry the mark with value `hash`?
    fn has_mark(&self, hash: u32) -> bool {
        // SAFETY: the plan's invalItems is a List of PlanInvalItem nodes, valid for the call.
        unsafe {
            pointers::<pg_sys::PlanInvalItem>((*(*self.qd).plannedstmt).invalItems)
                .any(|i| (*i).cacheId == MARK_CACHE && (*i).hashValue == hash)
        }
    }

    fn result_relations(&self) -> Vec<*mut pg_sys::ResultRelInfo> {
        // SAFETY: the ModifyTable state's `resultRelInfo` array has `mt_nrels` entries and
        // `rootResultRelInfo` is the root target (itself one of them for a plain table).
        unsafe {
            let mt = &*self.mt;
            let mut out: Vec<_> = (0..mt.mt_nrels.max(0) as usize)
                .map(|i| mt.resultRelInfo.add(i))
                .collect();
            if !mt.rootResultRelInfo.is_null() && !out.contains(&mt.rootResultRelInfo) {
                out.push(mt.rootResultRelInfo);
            }
            out
        }
    }

    /// The root target table's OID and the OID and function of its trigger named `name`.
    pub fn root_trigger(&self, name: &CStr) -> Option<(pg_sys::Oid, u32, pg_sys::Oid)> {
        // SAFETY: the root result relation is open for the statement; its trigger descriptor
        // copy is NULL or valid, with `numtriggers` entries whose names are NUL-terminated.
        unsafe {
            let root = (*self.mt).rootResultRelInfo;
            if root.is_null() {
                return None;
            }
            let td = (*root).ri_TrigDesc;
            if td.is_null() || (*td).triggers.is_null() {
                return None;
            }
            let relid = (*(*root).ri_RelationDesc).rd_id;
            std::slice::from_raw_parts((*td).triggers, (*td).numtriggers.max(0) as usize)
                .iter()
                .find(|t| CStr::from_ptr(t.tgname) == name)
                .map(|t| (relid, t.tgoid.to_u32(), t.tgfoid))
        }
    }

    /// The arguments of the root target's trigger named `name` (empty if it has none).
    pub fn root_trigger_args(&self, name: &CStr) -> Vec<CString> {
        // SAFETY: as in `root_trigger`.
        unsafe {
            let root = (*self.mt).rootResultRelInfo;
            if root.is_null() {
                return Vec::new();
            }
            trigger_named_in((*root).ri_TrigDesc, name)
                .map(|t| t.args)
                .unwrap_or_default()
        }
    }

    /// The statement's row count, to be read by its own expressions' calls.
    pub fn delete_count(&self) -> DeleteCount {
        // SAFETY: the started executor's EState, valid for the call; only its address and its
        // memory context's are kept.
        unsafe {
            let estate = (*self.qd).estate;
            DeleteCount {
                estate,
                context: (*estate).es_query_cxt as usize,
            }
        }
    }

    /// The command id the statement writes with (`es_output_cid`: a row version it deleted has
    /// it as its `cmax`).
    pub fn output_command(&self) -> pg_sys::CommandId {
        // SAFETY: the started executor's EState, valid for the call.
        unsafe { (*(*self.qd).estate).es_output_cid }
    }

    /// Does this statement set the command's row count (`es_processed` counts its rows)? A
    /// rule's added actions do not.
    pub fn sets_tag(&self) -> bool {
        // SAFETY: the ModifyTable state, valid for the call.
        unsafe { (*self.mt).canSetTag }
    }

    /// The statement's memory context (its identity while it runs).
    pub fn query_context(&self) -> usize {
        // SAFETY: the started executor's EState, valid for the call.
        unsafe { (*(*self.qd).estate).es_query_cxt as usize }
    }

    /// The OIDs of the result relations (the root target included).
    pub fn result_relation_ids(&self) -> Vec<pg_sys::Oid> {
        // SAFETY: each ResultRelInfo's relation is open for the statement.
        self.result_relations()
            .into_iter()
            .map(|r| unsafe { (*(*r).ri_RelationDesc).rd_id })
            .collect()
    }

    /// The statement's trigger event (`TRIGGER_TYPE_INSERT`, `_UPDATE` or `_DELETE`).
    pub fn event(&self) -> u32 {
        self.event
    }

    /// Is this a DELETE?
    pub fn is_delete(&self) -> bool {
        self.event == pg_sys::TRIGGER_TYPE_DELETE
    }

    /// Does the plan evaluate a RETURNING list it does not return (`add_check`'s, hidden by
    /// [`hide_returning`])?
    pub fn has_hidden_check(&self) -> bool {
        // SAFETY: the started executor's PlannedStmt and ModifyTable state, valid for the call;
        // the state's plan is its ModifyTable node.
        unsafe {
            let mt_plan = (*self.mt).ps.plan.cast::<pg_sys::ModifyTable>();
            !(*(*self.qd).plannedstmt).hasReturning
                && !mt_plan.is_null()
                && !(*mt_plan).returningLists.is_null()
        }
    }

    /// Is the plan a one-row INSERT whose stamp notes its key ([`add_keys_marker`])?
    pub fn notes_keys(&self) -> bool {
        self.has_mark(KEYS_NOTED_HASH)
    }

    /// Is this an INSERT?
    pub fn is_insert(&self) -> bool {
        self.event == pg_sys::TRIGGER_TYPE_INSERT
    }

    /// Take the WHEN clause off the trigger named `name` of function `function` in the
    /// executor's private copy of each result relation's triggers: it then fires for every row
    /// of this statement, without compiling the clause (the set-based shape's AFTER INSERT
    /// trigger, whose clause only matters for an admitted COPY, which runs no executor).
    pub fn drop_when(&mut self, function: pg_sys::Oid, name: &CStr) {
        for rri in self.result_relations() {
            // SAFETY: each ResultRelInfo is the executor's, for this statement; `ri_TrigDesc` is
            // NULL or the executor's private copy of the relation's triggers (CopyTriggerDesc in
            // InitResultRelInfo), which only this statement reads, with `numtriggers` entries;
            // `tgqual` is a string of that copy, which the executor reads (TriggerEnabled) only
            // when a row event comes, never before ExecutorStart ended.
            unsafe {
                let td = (*rri).ri_TrigDesc;
                if td.is_null() || (*td).triggers.is_null() {
                    continue;
                }
                let triggers = std::slice::from_raw_parts_mut(
                    (*td).triggers,
                    (*td).numtriggers.max(0) as usize,
                );
                for t in triggers.iter_mut() {
                    if t.tgfoid == function && CStr::from_ptr(t.tgname) == name {
                        t.tgqual = std::ptr::null_mut();
                    }
                }
            }
        }
    }

    /// In each result relation's own copy of its triggers, take the statement's event (UPDATE
    /// or DELETE) out of the triggers of function `function` named in `names`, unless the
    /// relation also has a BEFORE UPDATE row trigger of another function (an UPDATE only: such a
    /// trigger may change the key), or its trigger named `guard` has other arguments than the
    /// root target's (another protection: an inheritance child protected on its own); then its
    /// triggers stay as they are. Returns how many result relations have no trigger named
    /// `guard` that fires in an ordinary session.
    pub fn drop_events(&mut self, function: pg_sys::Oid, names: &[&CStr], guard: &CStr) -> usize {
        // The root's guard arguments, compared in place (nothing copied).
        // SAFETY: the root result relation and its trigger descriptor copy are the executor's,
        // valid for the statement; argument strings are NUL-terminated.
        let root_args: Vec<&CStr> = unsafe {
            let root = (*self.mt).rootResultRelInfo;
            let td = if root.is_null() {
                std::ptr::null_mut()
            } else {
                (*root).ri_TrigDesc
            };
            if td.is_null() || (*td).triggers.is_null() {
                return self.result_relations().len();
            }
            std::slice::from_raw_parts((*td).triggers, (*td).numtriggers.max(0) as usize)
                .iter()
                .find(|t| t.tgfoid == function && CStr::from_ptr(t.tgname) == guard)
                .map(|t| {
                    (0..t.tgnargs.max(0) as usize)
                        .filter(|_| !t.tgargs.is_null())
                        .map(|i| CStr::from_ptr(*t.tgargs.add(i)))
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut unguarded = 0;
        for rri in self.result_relations() {
            // SAFETY: each ResultRelInfo is the executor's, for this statement; `ri_TrigDesc` is
            // NULL or the executor's private copy of the relation's triggers (CopyTriggerDesc in
            // InitResultRelInfo), which only this statement reads, with `numtriggers` entries.
            // Changing a copied trigger's `tgtype` and the descriptor's summary flags is what
            // the executor consults before firing; nothing else holds them.
            unsafe {
                let td = (*rri).ri_TrigDesc;
                if td.is_null() || (*td).triggers.is_null() {
                    unguarded += 1;
                    continue;
                }
                let triggers = std::slice::from_raw_parts_mut(
                    (*td).triggers,
                    (*td).numtriggers.max(0) as usize,
                );
                let guarded = triggers.iter().any(|t| {
                    t.tgfoid == function
                        && CStr::from_ptr(t.tgname) == guard
                        && (t.tgenabled as u8 == b'O' || t.tgenabled as u8 == b'A')
                });
                if !guarded {
                    unguarded += 1;
                }
                let before_row = |t: &pg_sys::Trigger| {
                    let ty = t.tgtype as u32;
                    ty & pg_sys::TRIGGER_TYPE_ROW != 0
                        && ty & (pg_sys::TRIGGER_TYPE_BEFORE | pg_sys::TRIGGER_TYPE_INSTEAD)
                            == pg_sys::TRIGGER_TYPE_BEFORE
                        && ty & self.event != 0
                };
                if self.event != pg_sys::TRIGGER_TYPE_DELETE
                    && triggers
                        .iter()
                        .any(|t| before_row(t) && t.tgfoid != function)
                {
                    continue;
                }
                let same_protection = |t: &pg_sys::Trigger| {
                    let n = t.tgnargs.max(0) as usize;
                    n == root_args.len()
                        && !t.tgargs.is_null()
                        && (0..n).all(|i| CStr::from_ptr(*t.tgargs.add(i)) == root_args[i])
                };
                if triggers.iter().any(|t| {
                    t.tgfoid == function && CStr::from_ptr(t.tgname) == guard && !same_protection(t)
                }) {
                    continue;
                }
                for t in triggers.iter_mut() {
                    if t.tgfoid == function && names.contains(&CStr::from_ptr(t.tgname)) {
                        t.tgtype &= !(self.event as i16);
                    }
                }
                recompute_flags(&mut *td, self.event);
            }
        }
        unguarded
    }
}

/// The summary flags of a trigger descriptor for `event` (`TRIGGER_TYPE_UPDATE` or
/// `TRIGGER_TYPE_DELETE`), from its triggers' types (as trigger.c's SetTriggerFlags sets them).
fn recompute_flags(td: &mut pg_sys::TriggerDesc, event: u32) {
    let (mut br, mut ar, mut ir, mut bs, mut as_) = (false, false, false, false, false);
    // SAFETY: `triggers` has `numtriggers` entries (the caller's descriptor).
    let triggers =
        unsafe { std::slice::from_raw_parts(td.triggers, td.numtriggers.max(0) as usize) };
    for t in triggers {
        let ty = t.tgtype as u32;
        if ty & event == 0 {
            continue;
        }
        let row = ty & pg_sys::TRIGGER_TYPE_ROW != 0;
        let timing = ty & (pg_sys::TRIGGER_TYPE_BEFORE | pg_sys::TRIGGER_TYPE_INSTEAD);
        match (row, timing) {
            (true, pg_sys::TRIGGER_TYPE_BEFORE) => br = true,
            (true, pg_sys::TRIGGER_TYPE_INSTEAD) => ir = true,
            (true, _) => ar = true,
            (false, pg_sys::TRIGGER_TYPE_BEFORE) => bs = true,
            (false, _) => as_ = true,
        }
    }
    if event == pg_sys::TRIGGER_TYPE_INSERT {
        td.trig_insert_before_row = br;
        td.trig_insert_after_row = ar;
        td.trig_insert_instead_row = ir;
        td.trig_insert_before_statement = bs;
        td.trig_insert_after_statement = as_;
    } else if event == pg_sys::TRIGGER_TYPE_DELETE {
        td.trig_delete_before_row = br;
        td.trig_delete_after_row = ar;
        td.trig_delete_instead_row = ir;
        td.trig_delete_before_statement = bs;
        td.trig_delete_after_statement = as_;
    } else {
        td.trig_update_before_row = br;
        td.trig_update_after_row = ar;
        td.trig_update_instead_row = ir;
        td.trig_update_before_statement = bs;
        td.trig_update_after_statement = as_;
    }
}

/// The arguments of one call of a stamping function (`_pg_fencing.stamp_row`,
/// `_pg_fencing.stamp_resource`; also `_pg_fencing.tombstone_key_hash_of`, whose variadic key
/// arguments are read the same way).
pub struct StampCall {
    fcinfo: pg_sys::FunctionCallInfo,
}

impl StampCall {
    /// # Safety
    /// `fcinfo` must be the function manager's, for a call of a stamping function (see
    /// `sql/pg_fencing.sql`), and the value must not outlive the call.
    pub unsafe fn new(fcinfo: pg_sys::FunctionCallInfo) -> StampCall {
        StampCall { fcinfo }
    }

    /// Was this call added by the planner hook (see [`PLANNED_CALL_LOCATION`]), not written by
    /// hand into a statement?
    pub fn planned(&self) -> bool {
        // SAFETY: `flinfo` is the call site's; `fn_expr` is NULL or the call's expression node
        // (a FuncExpr for a function call), read only.
        unsafe {
            let e = (*(*self.fcinfo).flinfo).fn_expr;
            !e.is_null()
                && (*e).type_ == pg_sys::NodeTag::T_FuncExpr
                && (*e.cast::<pg_sys::FuncExpr>()).location == PLANNED_CALL_LOCATION
        }
    }

    fn arg(&self, i: usize) -> Option<pg_sys::Datum> {
        // SAFETY: `fcinfo` is valid for the call; `args` has `nargs` entries (bounds-checked).
        unsafe {
            let f = &*self.fcinfo;
            let args = f.args.as_slice(f.nargs as usize);
            args.get(i).filter(|a| !a.isnull).map(|a| a.value)
        }
    }

    /// Argument `i` as a bigint (NULL: None).
    pub fn bigint(&self, i: usize) -> Option<i64> {
        self.arg(i).map(|d| d.value() as i64)
    }

    /// Argument `i` as an OID.
    pub fn oid(&self, i: usize) -> pg_sys::Oid {
        self.arg(i)
            .map(|d| pg_sys::Oid::from(d.value() as u32))
            .unwrap_or(pg_sys::Oid::INVALID)
    }

    /// Argument `i` as text, borrowed from the call's argument (NULL: empty; text that is not
    /// valid UTF-8: empty).
    pub fn text(&self, i: usize) -> &str {
        let Some(d) = self.arg(i) else {
            return "";
        };
        // SAFETY: argument `i` of a stamping function at this position is declared text, so `d`
        // is a text varlena; pg_detoast_datum_packed returns it unchanged unless it is toasted
        // (then a copy in the current memory context, which outlives the call). The bytes are
        // read in place and checked to be UTF-8; the borrow ends with the call (`&self`).
        unsafe {
            let v = pg_sys::pg_detoast_datum_packed(d.cast_mut_ptr());
            std::str::from_utf8(pgrx::varlena::varlena_to_byte_slice(v)).unwrap_or("")
        }
    }

    /// The user this call site (one expression of one statement) was checked for, if any: kept
    /// in `fn_extra`, which lives as long as the statement's expression.
    pub fn checked_for(&self) -> pg_sys::Oid {
        // SAFETY: `flinfo` is the call site's; `fn_extra` is NULL or the Oid `set_checked_for`
        // allocated there (no one else uses the field for a C function of ours).
        unsafe {
            let extra = (*(*self.fcinfo).flinfo).fn_extra;
            if extra.is_null() {
                pg_sys::Oid::INVALID
            } else {
                *extra.cast::<pg_sys::Oid>()
            }
        }
    }

    /// Remember that this call site was checked for `user`.
    pub fn set_checked_for(&self, user: pg_sys::Oid) {
        // SAFETY: as in `checked_for`; the Oid is allocated in `fn_mcxt`, which lives as long as
        // the call site.
        unsafe {
            let fl = &mut *(*self.fcinfo).flinfo;
            if fl.fn_extra.is_null() {
                fl.fn_extra =
                    pg_sys::MemoryContextAllocZero(fl.fn_mcxt, std::mem::size_of::<pg_sys::Oid>());
            }
            *fl.fn_extra.cast::<pg_sys::Oid>() = user;
        }
    }

    /// The memory context the call's expression was built in and its ancestors (a statement's
    /// own context, or, for an expression of an EvalPlanQual re-check, one made inside it).
    pub fn contexts(&self) -> impl Iterator<Item = usize> + '_ {
        // SAFETY: `flinfo` is the call site's; `fn_mcxt` and each `parent` are NULL or live
        // memory contexts (a context outlives its children), read only.
        let mut cxt = unsafe { (*(*self.fcinfo).flinfo).fn_mcxt };
        std::iter::from_fn(move || {
            if cxt.is_null() {
                return None;
            }
            let here = cxt as usize;
            // SAFETY: as above.
            cxt = unsafe { (*cxt).parent };
            Some(here)
        })
        .take(8)
    }

    /// Arguments `table` (an oid) and `id` (a tid) as a row version (NULL: None).
    pub fn row_version(&self, table: usize, id: usize) -> Option<RowVersion> {
        let table = pg_sys::Oid::from(self.arg(table)?.value() as u32);
        let id = self.arg(id)?;
        // SAFETY: argument `id` of `drop_row` is declared tid, passed by reference: a pointer to
        // an ItemPointerData valid for the call, copied out here.
        let ip = unsafe { *id.cast_mut_ptr::<pg_sys::ItemPointerData>() };
        Some(RowVersion {
            table,
            block: (u32::from(ip.ip_blkid.bi_hi) << 16) | u32::from(ip.ip_blkid.bi_lo),
            offset: ip.ip_posid,
        })
    }

    /// The row count of the running statement `count` belongs to, if this call is one of that
    /// statement's (its memory context is the statement's or inside it; then the statement's
    /// EState, allocated in that context, is alive).
    pub fn statement_rows(&self, count: &DeleteCount) -> Option<u64> {
        if !self.contexts().any(|c| c == count.context) {
            return None;
        }
        // SAFETY: the EState lives in the statement's memory context, an ancestor of this
        // call's (checked above), so it has not been freed; the counter is read only.
        Some(unsafe { (*count.estate).es_processed })
    }

    /// The arguments from `from` on, printed as a key (see `trigger_event::key_text_of`).
    pub fn key_text(&self, from: usize) -> String {
        crate::pg::trigger_event::key_text_of(&self.typed(from))
    }

    /// `f` of the arguments from `from` on, with their types (as [`typed`](Self::typed)), kept
    /// on the stack when there are at most 8 of them (a key of 8 columns or fewer).
    pub fn with_typed<T>(
        &self,
        from: usize,
        f: impl FnOnce(&[(Option<pg_sys::Datum>, pg_sys::Oid)]) -> T,
    ) -> T {
        // SAFETY: `fcinfo` and its `flinfo` are valid for the call; get_fn_expr_argtype reads
        // the call's expression for each argument's type.
        let n = unsafe { (*self.fcinfo).nargs as usize };
        let count = n.saturating_sub(from);
        if count > 8 {
            return f(&self.typed(from));
        }
        let mut out = [(None, pg_sys::Oid::INVALID); 8];
        for (slot, i) in out.iter_mut().zip(from..n) {
            // SAFETY: as above.
            *slot = (self.arg(i), unsafe {
                pg_sys::get_fn_expr_argtype((*self.fcinfo).flinfo, i as c_int)
            });
        }
        f(&out[..count])
    }

    /// The arguments from `from` on, with their types (NULL: None).
    pub fn typed(&self, from: usize) -> Vec<(Option<pg_sys::Datum>, pg_sys::Oid)> {
        // SAFETY: `fcinfo` and its `flinfo` are valid for the call; get_fn_expr_argtype reads
        // the call's expression for each argument's type.
        unsafe {
            let n = (*self.fcinfo).nargs as usize;
            (from..n)
                .map(|i| {
                    (
                        self.arg(i),
                        pg_sys::get_fn_expr_argtype((*self.fcinfo).flinfo, i as c_int),
                    )
                })
                .collect()
        }
    }
}

/// A running DELETE's row count (`es_processed`: the rows it deleted so far), read through a
/// call of its own expressions ([`StampCall::statement_rows`]).
pub struct DeleteCount {
    estate: *mut pg_sys::EState,
    context: usize,
}

/// One row version of a table: its table (a partition's own) and its position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowVersion {
    pub table: pg_sys::Oid,
    block: u32,
    offset: u16,
}

impl RowVersion {
    /// Did command `command` of this transaction delete this row version (its `xmax` is this
    /// transaction's, or one of its subtransactions', not only a row lock, its `cmax` is
    /// `command`, and it points to itself: a deletion, not an update)? A version that cannot be
    /// read (a table that is not a heap, a position past its end) counts as deleted: the caller
    /// then keeps a tombstone it may not need, never drops one it needs. A pruned one (its line
    /// pointer no longer a tuple's) does not: only a version whose deleter committed is pruned.
    pub fn deleted_by(&self, command: pg_sys::CommandId) -> bool {
        // SAFETY: main thread inside a transaction. The table is opened with AccessShareLock
        // (the DELETE holds RowExclusiveLock on it already) and closed before returning; only a
        // heap (relam checked) is read, by heap_fetch with SnapshotAny, which returns a pinned
        // buffer (released here) when it found a normal line pointer in range (else false);
        // the tuple header is read under the buffer's share lock; HeapTupleGetUpdateXid and
        // HeapTupleHeaderGetCmax are PostgreSQL's own readings of a multixact xmax and of a
        // (combo) command id, the latter asked only of a version this transaction deleted.
        unsafe {
            let rel = pg_sys::try_relation_open(self.table, pg_sys::AccessShareLock as _);
            if rel.is_null() {
                return true;
            }
            let heap = (*(*rel).rd_rel).relam == pg_sys::HEAP_TABLE_AM_OID
                && self.block
                    < pg_sys::RelationGetNumberOfBlocksInFork(
                        rel,
                        pg_sys::ForkNumber::MAIN_FORKNUM,
                    );
            if !heap {
                pg_sys::relation_close(rel, pg_sys::AccessShareLock as _);
                return true;
            }
            let mut tuple = pg_sys::HeapTupleData::default();
            tuple.t_self.ip_blkid.bi_hi = (self.block >> 16) as u16;
            tuple.t_self.ip_blkid.bi_lo = (self.block & 0xFFFF) as u16;
            tuple.t_self.ip_posid = self.offset;
            let mut buffer: pg_sys::Buffer = 0;
            let found = pg_sys::heap_fetch(
                rel,
                &raw mut pg_sys::SnapshotAnyData,
                &mut tuple,
                &mut buffer,
                true,
            );
            // Not found with SnapshotAny: the line pointer is no longer a tuple's (pruned), which
            // only a version whose deleter committed can be; not this transaction's deletion.
            let deleted = if !found && buffer == pg_sys::InvalidBuffer as pg_sys::Buffer {
                false
            } else {
                pg_sys::LockBuffer(buffer, pg_sys::BUFFER_LOCK_SHARE as _);
                let h = &*tuple.t_data;
                let mask = u32::from(h.t_infomask);
                let locked_only = mask & pg_sys::HEAP_XMAX_LOCK_ONLY != 0
                    || mask & (pg_sys::HEAP_XMAX_IS_MULTI | pg_sys::HEAP_LOCK_MASK)
                        == pg_sys::HEAP_XMAX_EXCL_LOCK;
                let out = if mask & pg_sys::HEAP_XMAX_INVALID != 0 || locked_only {
                    false
                } else {
                    let xmax = if mask & pg_sys::HEAP_XMAX_IS_MULTI != 0 {
                        pg_sys::HeapTupleGetUpdateXid(tuple.t_data)
                    } else {
                        h.t_choice.t_heap.t_xmax
                    };
                    pg_sys::TransactionIdIsCurrentTransactionId(xmax)
                        && h.t_ctid.ip_blkid.bi_hi == tuple.t_self.ip_blkid.bi_hi
                        && h.t_ctid.ip_blkid.bi_lo == tuple.t_self.ip_blkid.bi_lo
                        && h.t_ctid.ip_posid == tuple.t_self.ip_posid
                        && pg_sys::HeapTupleHeaderGetCmax(tuple.t_data) == command
                };
                pg_sys::LockBuffer(buffer, pg_sys::BUFFER_LOCK_UNLOCK as _);
                pg_sys::ReleaseBuffer(buffer);
                out
            };
            pg_sys::relation_close(rel, pg_sys::AccessShareLock as _);
            deleted
        }
    }
}

/// The trigger event of an UPDATE, an INSERT and a DELETE (which statement a stamping call
/// belongs to).
pub const EVENT_UPDATE: u32 = pg_sys::TRIGGER_TYPE_UPDATE;
pub const EVENT_INSERT: u32 = pg_sys::TRIGGER_TYPE_INSERT;
pub const EVENT_DELETE: u32 = pg_sys::TRIGGER_TYPE_DELETE;

/// May the current user UPDATE table `relid` (the table, or any of its columns)?
pub fn may_update(relid: pg_sys::Oid) -> bool {
    may(relid, pg_sys::ACL_UPDATE as pg_sys::AclMode)
}

/// May the current user INSERT into table `relid` (the table, or any of its columns)?
pub fn may_insert(relid: pg_sys::Oid) -> bool {
    may(relid, pg_sys::ACL_INSERT as pg_sys::AclMode)
}

/// May the current user SELECT every one of columns `attnums` of table `relid` (the table, or
/// each column)?
pub fn may_select_columns(relid: pg_sys::Oid, attnums: &[i16]) -> bool {
    // SAFETY: catalog privilege checks by value on the main thread inside a transaction.
    unsafe {
        let user = pg_sys::GetUserId();
        let mode = pg_sys::ACL_SELECT as pg_sys::AclMode;
        pg_sys::pg_class_aclcheck(relid, user, mode) == pg_sys::AclResult::ACLCHECK_OK
            || attnums.iter().all(|a| {
                pg_sys::pg_attribute_aclcheck(relid, *a, user, mode)
                    == pg_sys::AclResult::ACLCHECK_OK
            })
    }
}

/// May the current user DELETE from table `relid`?
pub fn may_delete(relid: pg_sys::Oid) -> bool {
    may(relid, pg_sys::ACL_DELETE as pg_sys::AclMode)
}

/// Does row-level security apply to the current user on table `relid` (its policies filter the
/// user's statements)?
pub fn row_security_applies(relid: pg_sys::Oid) -> bool {
    // SAFETY: a catalog lookup by value on the main thread inside a transaction; with noError =
    // true check_enable_rls returns a code instead of raising.
    unsafe {
        pg_sys::check_enable_rls(relid, pg_sys::InvalidOid, true)
            == pg_sys::CheckEnableRlsResult::RLS_ENABLED as std::ffi::c_int
    }
}

/// A hand-made call of a stamping or checking function (`_pg_fencing.stamp_row`, `drop_row`, …:
/// not part of a running fast-path statement, whose executor checked the statement) does no more
/// than the caller's own statement could (docs/security.md): it needs the privilege, and it is
/// refused where row-level security applies to the caller on the table, since the call names a
/// row by its key without the policies' filter (a role whose policy hides a row could otherwise
/// plant a tombstone on its key).
fn may(relid: pg_sys::Oid, mode: pg_sys::AclMode) -> bool {
    // SAFETY: catalog privilege checks by value on the main thread inside a transaction.
    unsafe {
        let user = pg_sys::GetUserId();
        if row_security_applies(relid) {
            return false;
        }
        if mode == pg_sys::ACL_DELETE as pg_sys::AclMode {
            return pg_sys::pg_class_aclcheck(relid, user, mode) == pg_sys::AclResult::ACLCHECK_OK;
        }
        pg_sys::pg_class_aclcheck(relid, user, mode) == pg_sys::AclResult::ACLCHECK_OK
            || pg_sys::pg_attribute_aclcheck_all(relid, user, mode, pg_sys::AclMaskHow::ACLMASK_ANY)
                == pg_sys::AclResult::ACLCHECK_OK
    }
}
