//! Citus as pg_fencing sees it (docs/citus.md, "How a distributed table is fenced";
//! `guard/citus.rs` decides): the marker constraint that names a protected distributed or
//! reference table's protection on its shell table and, with Citus's shard suffix, on each of
//! its shards; the writes of a statement, a COPY or a TRUNCATE to such relations; the node this
//! backend runs on; and whether the backend is one of Citus's own connections from the
//! coordinator.
//!
//! Invariant: a protected Citus table, its shell on every worker and each of its shards carry
//! the marker `zz_pg_fencing_citus_<protection>` (Citus copies constraints to shells and shards,
//! with or without its shard-id suffix, also when it moves or splits shards); whether a relation
//! is the table (or its shell) or a shard is Citus's metadata's to say (`is_citus_table`).

use crate::pg::spi::exec_internal;
use crate::pg::trigger_event::Relation;
use pgrx::{pg_sys, PgList};
use std::ffi::{c_char, CStr};

/// The prefix of the marker constraint's name.
pub const MARKER_PREFIX: &str = "zz_pg_fencing_citus_";

/// What a relation's marker constraint says: the protection
/// (`_pg_fencing.protected_table.id`) of the distributed table it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Marker {
    pub protection: i64,
}

/// Read a marker from a constraint's name (`None`: not a marker). A shard's copy may carry
/// Citus's shard suffix (`_<shard id>`) or not (a shard made by a move keeps the table's name).
pub fn parse_marker(name: &str) -> Option<Marker> {
    let rest = name.strip_prefix(MARKER_PREFIX)?;
    let mut parts = rest.split('_');
    let protection = parts.next()?.parse::<i64>().ok()?;
    match parts.next() {
        None => {}
        Some(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {}
        Some(_) => return None,
    }
    if parts.next().is_some() {
        return None;
    }
    Some(Marker { protection })
}

/// Is relation `relid` a table Citus manages (in `pg_dist_partition`: the table itself on the
/// coordinator, its shell on a worker), rather than a shard? Only for a relation with a marker
/// (Citus is installed).
pub fn is_citus_table(relid: pg_sys::Oid) -> bool {
    exec_internal(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition d \
         WHERE d.logicalrelid OPERATOR(pg_catalog.=) $1::pg_catalog.regclass)",
        true,
        &[pg_sys::OIDOID],
        &mut [pg_sys::Datum::from(relid)],
        true,
        |d| d.value() != 0,
    )
    .unwrap_or(false)
}

/// The marker of open relation `rel` (`None`: it has none).
pub fn marker(rel: &Relation) -> Option<Marker> {
    rel.check_constraint_names(MARKER_PREFIX)
        .iter()
        .find_map(|n| parse_marker(n))
}

/// The marker of relation `relid` (`None`: none, or no such relation).
pub fn marker_of(relid: pg_sys::Oid) -> Option<Marker> {
    crate::pg::plan::with_relation(relid, |rel| marker(&rel))
}

/// A top-level INSERT, UPDATE, DELETE or MERGE the planner is about to plan.
pub struct WriteQuery {
    q: *mut pg_sys::Query,
}

/// Which statement a [`WriteQuery`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteCommand {
    Insert,
    Update,
    Delete,
    Merge,
}

impl WriteQuery {
    /// The write of `parse`, or `None` for any other statement.
    ///
    /// # Safety
    /// `parse` must be the planner hook's Query, not used by anyone else while this lives.
    pub unsafe fn of(parse: *mut pg_sys::Query) -> Option<WriteQuery> {
        // SAFETY: the planner's Query is valid for the hook's call (this function's contract).
        let q = unsafe { &*parse };
        let write = matches!(
            q.commandType,
            pg_sys::CmdType::CMD_INSERT
                | pg_sys::CmdType::CMD_UPDATE
                | pg_sys::CmdType::CMD_DELETE
                | pg_sys::CmdType::CMD_MERGE
        );
        (write && q.resultRelation > 0).then_some(WriteQuery { q: parse })
    }

    /// The statement's kind.
    pub fn command(&self) -> WriteCommand {
        // SAFETY: the planner's Query, valid for the hook's call.
        match unsafe { (*self.q).commandType } {
            pg_sys::CmdType::CMD_INSERT => WriteCommand::Insert,
            pg_sys::CmdType::CMD_UPDATE => WriteCommand::Update,
            pg_sys::CmdType::CMD_DELETE => WriteCommand::Delete,
            _ => WriteCommand::Merge,
        }
    }

    /// The target relation's OID.
    pub fn target(&self) -> Option<pg_sys::Oid> {
        // SAFETY: the planner's Query; `resultRelation` (> 0, checked in `of`) indexes its range
        // table, a List of RangeTblEntry nodes.
        unsafe {
            let q = &*self.q;
            let rte =
                pg_sys::list_nth(q.rtable, q.resultRelation - 1).cast::<pg_sys::RangeTblEntry>();
            (!rte.is_null() && (*rte).rtekind == pg_sys::RTEKind::RTE_RELATION)
                .then(|| (*rte).relid)
        }
    }

    /// Make `function(protection)` the value the statement gives column `attnum` (an INSERT's
    /// target entry, an UPDATE's SET entry), replacing what the statement gave it. The
    /// expression has no column reference, so Citus evaluates it on the coordinator; in an
    /// `INSERT … SELECT` it is a column the SELECT gets (`stamp_in_source`), a scalar subquery
    /// that Citus runs on the coordinator as a subplan of its own, sending the workers its
    /// value (a function call would be evaluated where Citus computes the rows: on the workers
    /// when it repartitions them or routes the SELECT to one shard).
    pub fn set_column(&mut self, attnum: i16, name: &CStr, function: pg_sys::Oid, protection: i64) {
        // SAFETY: main thread, inside the planner's call; the target list is a List of
        // TargetEntry nodes (an INSERT's in column order, an UPDATE's SET entries before its junk
        // entries), which stays so: the entry of `attnum` gets the new expression, or a new entry
        // goes before the first entry of a higher column (INSERT) or the first junk entry.
        unsafe {
            let q = &mut *self.q;
            let mut expr = call_expr(function, protection);
            if q.commandType == pg_sys::CmdType::CMD_INSERT {
                if let Some(var) = stamp_in_source(q, protection) {
                    expr = var;
                }
            }
            let tlist = PgList::<pg_sys::TargetEntry>::from_pg(q.targetList);
            if let Some(t) = tlist
                .iter_ptr()
                .find(|t| !(**t).resjunk && (**t).resno == attnum)
            {
                (*t).expr = expr;
                return;
            }
            let insert = q.commandType == pg_sys::CmdType::CMD_INSERT;
            let pos = tlist
                .iter_ptr()
                .take_while(|t| !(**t).resjunk && (!insert || (**t).resno < attnum))
                .count();
            let tle = pg_sys::makeTargetEntry(expr, attnum, pg_sys::pstrdup(name.as_ptr()), false);
            q.targetList = pg_sys::list_insert_nth(q.targetList, pos as i32, tle.cast());
        }
    }

    /// Make the SET list of an INSERT's `ON CONFLICT … DO UPDATE` (none: nothing) give column
    /// `attnum` the value the INSERT gave it (`EXCLUDED.column`, the stamp `set_column` made;
    /// Citus takes no stable function there).
    pub fn set_conflict_column(&mut self, attnum: i16, name: &CStr) {
        // SAFETY: main thread, inside the planner's call; `onConflict` is NULL or an
        // OnConflictExpr whose `onConflictSet` is a List of TargetEntry nodes in column order
        // (the rewriter's), which stays so: the entry of `attnum` gets the new expression, or a
        // new entry goes before the first entry of a higher column; `exclRelIndex` is the
        // range table index of EXCLUDED.
        unsafe {
            let oc = (*self.q).onConflict;
            if oc.is_null() || (*oc).action != pg_sys::OnConflictAction::ONCONFLICT_UPDATE {
                return;
            }
            let var = pg_sys::makeVar(
                (*oc).exclRelIndex as _,
                attnum,
                pg_sys::INT8OID,
                -1,
                pg_sys::Oid::INVALID,
                0,
            )
            .cast::<pg_sys::Expr>();
            let tlist = PgList::<pg_sys::TargetEntry>::from_pg((*oc).onConflictSet);
            if let Some(t) = tlist.iter_ptr().find(|t| (**t).resno == attnum) {
                (*t).expr = var;
                return;
            }
            let pos = tlist
                .iter_ptr()
                .take_while(|t| !(**t).resjunk && (**t).resno < attnum)
                .count();
            let tle = pg_sys::makeTargetEntry(var, attnum, pg_sys::pstrdup(name.as_ptr()), false);
            (*oc).onConflictSet =
                pg_sys::list_insert_nth((*oc).onConflictSet, pos as i32, tle.cast());
        }
    }

    /// AND `function(protection) IS NOT NULL` to the statement's WHERE clause.
    pub fn add_condition(&mut self, function: pg_sys::Oid, protection: i64) {
        // SAFETY: main thread, inside the planner's call; the jointree is a FromExpr (made when
        // missing), its quals NULL or an expression; the NullTest node is allocated zeroed with
        // its tag set, in the planner's memory context.
        unsafe {
            let q = &mut *self.q;
            let test =
                pg_sys::palloc0(std::mem::size_of::<pg_sys::NullTest>()).cast::<pg_sys::NullTest>();
            (*test).xpr.type_ = pg_sys::NodeTag::T_NullTest;
            (*test).arg = call_expr(function, protection);
            (*test).nulltesttype = pg_sys::NullTestType::IS_NOT_NULL;
            (*test).argisrow = false;
            (*test).location = -1;
            if q.jointree.is_null() {
                q.jointree = pg_sys::makeFromExpr(std::ptr::null_mut(), std::ptr::null_mut());
            }
            let jt = &mut *q.jointree;
            jt.quals = pg_sys::make_and_qual(jt.quals, test.cast());
        }
    }
}

/// The data-modifying `WITH` queries of the planner hook's Query `parse`, nested ones included
/// (each an INSERT, UPDATE, DELETE or MERGE that `WriteQuery::of` takes).
///
/// # Safety
/// `parse` must be the planner hook's Query, valid for the call; the returned Queries are parts
/// of it, to be used only while it is planned.
pub unsafe fn modifying_ctes(parse: *mut pg_sys::Query) -> Vec<*mut pg_sys::Query> {
    let mut out = Vec::new();
    /// # Safety
    /// `q` is NULL or a Query of the planner hook's tree, valid for the call.
    unsafe fn walk(q: *mut pg_sys::Query, depth: u32, out: &mut Vec<*mut pg_sys::Query>) {
        // SAFETY: per the contract; `cteList` is NIL or a List of CommonTableExpr nodes whose
        // `ctequery` is an analysed Query (the node tag is checked), each walked at most 32 deep.
        unsafe {
            if q.is_null() || depth > 32 || !(*q).hasModifyingCTE {
                return;
            }
            for cte in PgList::<pg_sys::CommonTableExpr>::from_pg((*q).cteList).iter_ptr() {
                let inner = (*cte).ctequery;
                if inner.is_null() || (*inner).type_ != pg_sys::NodeTag::T_Query {
                    continue;
                }
                let inner = inner.cast::<pg_sys::Query>();
                if (*inner).commandType != pg_sys::CmdType::CMD_SELECT {
                    out.push(inner);
                }
                walk(inner, depth + 1, out);
            }
        }
    }
    // SAFETY: as above.
    unsafe { walk(parse, 0, &mut out) };
    out
}

/// `function(protection::bigint)` returning bigint.
///
/// # Safety
/// Main thread, in the memory context the expression must live in.
unsafe fn call_expr(function: pg_sys::Oid, protection: i64) -> *mut pg_sys::Expr {
    // SAFETY: per the contract; makeConst copies the by-value datum, makeFuncExpr a List.
    unsafe {
        let arg = pg_sys::makeConst(
            pg_sys::INT8OID,
            -1,
            pg_sys::Oid::INVALID,
            8,
            pg_sys::Datum::from(protection),
            false,
            true,
        );
        let mut args = PgList::<pg_sys::Node>::new();
        args.push(arg.cast());
        pg_sys::makeFuncExpr(
            function,
            pg_sys::INT8OID,
            args.into_pg(),
            pg_sys::Oid::INVALID,
            pg_sys::Oid::INVALID,
            pg_sys::CoercionForm::COERCE_EXPLICIT_CALL,
        )
        .cast()
    }
}

/// The open relations of started statement `query_desc`'s result relations (those the executor
/// opened when it started).
///
/// # Safety
/// `query_desc` must be the executor hook's QueryDesc, after the executor started it; the
/// relations are valid while the statement runs.
unsafe fn opened_result_relations(query_desc: *mut pg_sys::QueryDesc) -> Vec<pg_sys::Relation> {
    // SAFETY: per the contract; `estate` is the started executor's state, whose
    // `es_opened_result_relations` is NIL or a List of ResultRelInfo nodes with open relations.
    unsafe {
        let estate = (*query_desc).estate;
        if estate.is_null() {
            return Vec::new();
        }
        PgList::<pg_sys::ResultRelInfo>::from_pg((*estate).es_opened_result_relations)
            .iter_ptr()
            .map(|ri| (*ri).ri_RelationDesc)
            .filter(|rel| !rel.is_null())
            .collect()
    }
}

/// The result relations of started statement `query_desc`.
///
/// # Safety
/// As `opened_result_relations`.
pub unsafe fn result_relations(query_desc: *mut pg_sys::QueryDesc) -> Vec<pg_sys::Oid> {
    // SAFETY: per the contract; each relation is open (`opened_result_relations`).
    unsafe {
        opened_result_relations(query_desc)
            .into_iter()
            .map(|rel| (*rel).rd_id)
            .collect()
    }
}

/// The relation a schema-qualified, quoted name (`format('%I.%I', …)`) names now (`None`: none),
/// resolved without a lock.
pub fn relid_of_name(name: &str) -> Option<pg_sys::Oid> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: main thread inside a transaction; stringToQualifiedNameList parses the name (an
    // ERROR for a malformed one, which callers' names are not), makeRangeVarFromNameList
    // builds a RangeVar, and `relation_of` resolves it with RVR_MISSING_OK.
    unsafe {
        #[cfg(feature = "pg15")]
        let names = pg_sys::stringToQualifiedNameList(name.as_ptr());
        #[cfg(not(feature = "pg15"))]
        let names = pg_sys::stringToQualifiedNameList(name.as_ptr(), std::ptr::null_mut());
        relation_of(pg_sys::makeRangeVarFromNameList(names))
    }
}

/// In an `INSERT … SELECT` (`q`) whose SELECT is a plain one, add `stamp_subquery(protection)`
/// as the SELECT's last column and return a reference to it, for the INSERT's target list.
/// `None` for another INSERT, and for a SELECT that aggregates, groups, is DISTINCT, LIMITed, a
/// set operation or returns sets (Citus cannot plan a subquery in such a target list; the
/// function call stays, which Citus evaluates on the coordinator when it computes such a
/// SELECT's result there, and which refuses with `FT004` where it does not).
///
/// # Safety
/// `q` must be the planner's Query, valid for the call.
unsafe fn stamp_in_source(q: &mut pg_sys::Query, protection: i64) -> Option<*mut pg_sys::Expr> {
    // SAFETY: per the contract; the jointree's fromlist is a List of nodes, a RangeTblRef's
    // `rtindex` indexes the range table (a List of RangeTblEntry); a subquery RTE's `subquery`
    // is its Query and `eref` its Alias, whose `colnames` (a List of String nodes) gets the new
    // column's name as the SELECT's target list gets its entry.
    unsafe {
        if q.jointree.is_null() {
            return None;
        }
        let from = PgList::<pg_sys::Node>::from_pg((*q.jointree).fromlist);
        if from.len() != 1 {
            return None;
        }
        let r = from.get_ptr(0)?;
        if (*r).type_ != pg_sys::NodeTag::T_RangeTblRef {
            return None;
        }
        let rtindex = (*r.cast::<pg_sys::RangeTblRef>()).rtindex;
        let rte = pg_sys::list_nth(q.rtable, rtindex - 1).cast::<pg_sys::RangeTblEntry>();
        if rte.is_null() || (*rte).rtekind != pg_sys::RTEKind::RTE_SUBQUERY {
            return None;
        }
        let sub = (*rte).subquery;
        if sub.is_null() {
            return None;
        }
        let s = &*sub;
        if !s.setOperations.is_null()
            || s.hasAggs
            || s.hasWindowFuncs
            || s.hasTargetSRFs
            || !s.groupClause.is_null()
            || !s.groupingSets.is_null()
            || !s.havingQual.is_null()
            || !s.distinctClause.is_null()
            || !s.limitCount.is_null()
            || !s.limitOffset.is_null()
        {
            return None;
        }
        let resno = PgList::<pg_sys::TargetEntry>::from_pg((*sub).targetList).len() as i16 + 1;
        let name = c"pg_fencing_citus_stamp";
        let stamp = stamp_subquery(protection)?;
        let tle = pg_sys::makeTargetEntry(stamp, resno, pg_sys::pstrdup(name.as_ptr()), false);
        (*sub).targetList = pg_sys::lappend((*sub).targetList, tle.cast());
        (*sub).hasSubLinks = true;
        if !(*rte).eref.is_null() {
            (*(*rte).eref).colnames = pg_sys::lappend(
                (*(*rte).eref).colnames,
                pg_sys::makeString(pg_sys::pstrdup(name.as_ptr())).cast(),
            );
        }
        Some(pg_sys::makeVar(rtindex, resno, pg_sys::INT8OID, -1, pg_sys::Oid::INVALID, 0).cast())
    }
}

/// `(SELECT _pg_fencing.citus_stamp(protection) FROM pg_catalog.pg_dist_local_group)`: a scalar
/// subquery that reads a table of the coordinator's own (Citus's one-row metadata table), which
/// Citus cannot send to a worker: it runs it on the coordinator as a subplan and sends the
/// workers its value, for a router SELECT as for one it repartitions.
///
/// # Safety
/// Main thread, in a memory context that lives as long as the planner's Query.
unsafe fn stamp_subquery(protection: i64) -> Option<*mut pg_sys::Expr> {
    // (A statement of digits has no NUL: `None` cannot happen, and would keep the function call.)
    let sql = std::ffi::CString::new(format!(
        "SELECT _pg_fencing.citus_stamp({protection}::pg_catalog.int8) FROM pg_catalog.pg_dist_local_group"
    ))
    .ok()?;
    // SAFETY: per the contract; raw_parser returns a List of RawStmt (one for this text),
    // parse_analyze_fixedparams the analysed Query (it raises an ERROR rather than returning
    // NULL); palloc0 gives a zeroed SubLink (NIL lists, NULL pointers), tagged before use.
    unsafe {
        let raw = pg_sys::raw_parser(sql.as_ptr(), pg_sys::RawParseMode::RAW_PARSE_DEFAULT);
        let stmt = pg_sys::list_nth(raw, 0).cast::<pg_sys::RawStmt>();
        let sub = pg_sys::parse_analyze_fixedparams(
            stmt,
            pg_sys::pstrdup(sql.as_ptr()),
            std::ptr::null(),
            0,
            std::ptr::null_mut(),
        );
        let link =
            pg_sys::palloc0(std::mem::size_of::<pg_sys::SubLink>()).cast::<pg_sys::SubLink>();
        (*link).xpr.type_ = pg_sys::NodeTag::T_SubLink;
        (*link).subLinkType = pg_sys::SubLinkType::EXPR_SUBLINK;
        (*link).subselect = sub.cast();
        (*link).location = -1;
        Some(link.cast())
    }
}

/// The result relations of started statement `query_desc` that carry a marker (read from their
/// open relcache entries, no lookup).
///
/// # Safety
/// As `opened_result_relations`.
pub unsafe fn marked_result_relations(query_desc: *mut pg_sys::QueryDesc) -> Vec<pg_sys::Oid> {
    // SAFETY: per the contract; each relation is open (`Relation::from_open` borrows it only
    // for this call).
    unsafe {
        opened_result_relations(query_desc)
            .into_iter()
            .filter(|rel| (*(**rel).rd_rel).relchecks > 0)
            .filter_map(|rel| marker(&Relation::from_open(rel)).map(|_| (*rel).rd_id))
            .collect()
    }
}

/// The relation `rv` names, resolved without a lock (`None`: `rv` is NULL, or no such
/// relation: the statement itself then raises its error).
///
/// # Safety
/// `rv` must be NULL or a RangeVar of the statement being run.
unsafe fn relation_of(rv: *mut pg_sys::RangeVar) -> Option<pg_sys::Oid> {
    // SAFETY: per the contract; RangeVarGetRelidExtended with RVR_MISSING_OK returns InvalidOid
    // for a missing relation instead of raising.
    unsafe {
        if rv.is_null() {
            return None;
        }
        let relid = pg_sys::RangeVarGetRelidExtended(
            rv,
            pg_sys::NoLock as pg_sys::LOCKMODE,
            pg_sys::RVROption::RVR_MISSING_OK,
            None,
            std::ptr::null_mut(),
        );
        (relid != pg_sys::InvalidOid).then_some(relid)
    }
}

/// The relations a `TRUNCATE` (utility statement `pstmt`) names, resolved without a lock
/// (`None`: not a TRUNCATE).
///
/// # Safety
/// `pstmt` must be the ProcessUtility hook's statement, valid for the call.
pub unsafe fn truncated_relations(
    pstmt: *mut pg_sys::PlannedStmt,
) -> Option<(Vec<pg_sys::Oid>, bool)> {
    // SAFETY: per the contract; the node tag is checked before the cast; `relations` is a List
    // of RangeVar nodes; RangeVarGetRelidExtended with RVR_MISSING_OK returns InvalidOid for a
    // missing table (TRUNCATE itself then raises its error).
    unsafe {
        if pstmt.is_null() {
            return None;
        }
        let node = (*pstmt).utilityStmt;
        if node.is_null() || (*node).type_ != pg_sys::NodeTag::T_TruncateStmt {
            return None;
        }
        let stmt = node.cast::<pg_sys::TruncateStmt>();
        let cascade = (*stmt).behavior == pg_sys::DropBehavior::DROP_CASCADE;
        Some((
            PgList::<pg_sys::RangeVar>::from_pg((*stmt).relations)
                .iter_ptr()
                .filter_map(|rv| relation_of(rv))
                .collect(),
            cascade,
        ))
    }
}

/// The tables a `TRUNCATE … CASCADE` of `relids` empties besides them: those whose foreign keys
/// reference them, and so on (as PostgreSQL's TRUNCATE follows them).
pub fn referencing_closure(relids: &[pg_sys::Oid]) -> Vec<pg_sys::Oid> {
    let list = relids
        .iter()
        .map(|r| r.to_u32().to_string())
        .collect::<Vec<_>>()
        .join(",");
    let text = crate::pg::spi::text_datum(&format!("{{{list}}}"));
    exec_internal(
        "WITH RECURSIVE r(relid) AS (SELECT pg_catalog.unnest($1::pg_catalog.text::pg_catalog.oid[]) \
         UNION SELECT c.conrelid FROM pg_catalog.pg_constraint c JOIN r ON c.confrelid OPERATOR(pg_catalog.=) r.relid \
         WHERE c.contype OPERATOR(pg_catalog.=) 'f') \
         SELECT pg_catalog.string_agg(r.relid::pg_catalog.text, ',') FROM r",
        false,
        &[pg_sys::TEXTOID],
        &mut [text],
        true,
        crate::pg::spi::text_of,
    )
    .unwrap_or_default()
    .split(',')
    .filter_map(|n| n.parse::<u32>().ok())
    .map(pg_sys::Oid::from)
    .collect()
}

/// The relation an `ALTER TABLE` (utility statement `pstmt`) makes a partition or an
/// inheritance child of another (`ATTACH PARTITION`, `INHERIT`), resolved without a lock.
///
/// # Safety
/// `pstmt` must be the ProcessUtility hook's statement, valid for the call.
pub unsafe fn becoming_child(pstmt: *mut pg_sys::PlannedStmt) -> Option<pg_sys::Oid> {
    // SAFETY: per the contract; node tags are checked before each cast; an AlterTableStmt's
    // `cmds` is a List of AlterTableCmd nodes; ATTACH PARTITION's `def` is a PartitionCmd whose
    // `name` is a RangeVar.
    unsafe {
        if pstmt.is_null() || (*pstmt).utilityStmt.is_null() {
            return None;
        }
        let node = (*pstmt).utilityStmt;
        if (*node).type_ != pg_sys::NodeTag::T_AlterTableStmt {
            return None;
        }
        let stmt = node.cast::<pg_sys::AlterTableStmt>();
        for cmd in PgList::<pg_sys::AlterTableCmd>::from_pg((*stmt).cmds).iter_ptr() {
            match (*cmd).subtype {
                pg_sys::AlterTableType::AT_AttachPartition => {
                    let def = (*cmd).def;
                    if !def.is_null() && (*def).type_ == pg_sys::NodeTag::T_PartitionCmd {
                        return relation_of((*def.cast::<pg_sys::PartitionCmd>()).name);
                    }
                }
                pg_sys::AlterTableType::AT_AddInherit => return relation_of((*stmt).relation),
                _ => {}
            }
        }
        None
    }
}

/// Is statement `query_desc` the one the client sent (its text is the query being run at the
/// top level), not one run inside it by a function, a trigger or a foreign key's action?
///
/// # Safety
/// `query_desc` must be the executor hook's QueryDesc.
pub unsafe fn sent_by_client(query_desc: *mut pg_sys::QueryDesc) -> bool {
    // SAFETY: per the contract; both are NULL or NUL-terminated strings, compared by content.
    // PostgreSQL runs a client's statement (simple query, or the extended protocol's Execute of
    // a copy of the same text) with `debug_query_string` set to that text; SPI, triggers and
    // foreign key actions run statements of their own text inside it. (A statement run inside
    // that has the very text of the client's is the client's statement again.)
    unsafe {
        let text = (*query_desc).sourceText;
        let top = pg_sys::debug_query_string;
        !text.is_null() && !top.is_null() && CStr::from_ptr(text) == CStr::from_ptr(top)
    }
}

/// The marker constraints an `ALTER TABLE` (utility statement `pstmt`) drops or renames, with
/// the relation (`None`: none). Resolved without a lock.
///
/// # Safety
/// `pstmt` must be the ProcessUtility hook's statement, valid for the call.
pub unsafe fn touched_markers(pstmt: *mut pg_sys::PlannedStmt) -> Option<(pg_sys::Oid, String)> {
    // SAFETY: per the contract; node tags are checked before each cast; an AlterTableStmt's
    // `cmds` is a List of AlterTableCmd nodes, whose `name` is NULL or a NUL-terminated string;
    // a RenameStmt's `subname` likewise.
    unsafe {
        if pstmt.is_null() {
            return None;
        }
        let node = (*pstmt).utilityStmt;
        if node.is_null() {
            return None;
        }
        let relid = |rv: *mut pg_sys::RangeVar| relation_of(rv).unwrap_or(pg_sys::InvalidOid);
        let is_marker = |name: *const c_char| {
            !name.is_null()
                && CStr::from_ptr(name)
                    .to_str()
                    .is_ok_and(|n| parse_marker(n).is_some())
        };
        match (*node).type_ {
            pg_sys::NodeTag::T_AlterTableStmt => {
                let stmt = node.cast::<pg_sys::AlterTableStmt>();
                let cmd = PgList::<pg_sys::AlterTableCmd>::from_pg((*stmt).cmds)
                    .iter_ptr()
                    .find(|c| {
                        (**c).subtype == pg_sys::AlterTableType::AT_DropConstraint
                            && is_marker((**c).name)
                    })?;
                let name = CStr::from_ptr((*cmd).name).to_string_lossy().into_owned();
                Some((relid((*stmt).relation), name))
            }
            pg_sys::NodeTag::T_RenameStmt => {
                let stmt = node.cast::<pg_sys::RenameStmt>();
                ((*stmt).renameType == pg_sys::ObjectType::OBJECT_TABCONSTRAINT
                    && is_marker((*stmt).subname))
                .then(|| {
                    (
                        relid((*stmt).relation),
                        CStr::from_ptr((*stmt).subname)
                            .to_string_lossy()
                            .into_owned(),
                    )
                })
            }
            _ => None,
        }
    }
}

/// The node this backend runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    /// The coordinator (group 0): Citus plans the writes that enter here.
    Coordinator,
    /// A worker (another group): it holds shards, and Citus also runs queries entering here.
    Worker,
}

/// Is Citus installed in this database (its metadata table `pg_dist_local_group` exists)?
pub fn installed() -> bool {
    // SAFETY: main thread inside a transaction; a catalog cache lookup by name, InvalidOid if
    // there is no such relation.
    unsafe {
        pg_sys::get_relname_relid(
            c"pg_dist_local_group".as_ptr(),
            pg_sys::Oid::from(pg_sys::PG_CATALOG_NAMESPACE),
        ) != pg_sys::InvalidOid
    }
}

/// The node this backend runs on (without Citus's metadata: the coordinator of itself).
pub fn node() -> Node {
    if !installed() {
        return Node::Coordinator;
    }
    let group = exec_internal(
        "SELECT g.groupid::pg_catalog.int8 FROM pg_catalog.pg_dist_local_group g LIMIT 1",
        true,
        &[],
        &mut [],
        true,
        |d| d.value() as i64,
    )
    .unwrap_or(0);
    if group == 0 {
        Node::Coordinator
    } else {
        Node::Worker
    }
}

/// This backend's `application_name`.
pub fn application_name() -> String {
    // SAFETY: main thread; `application_name` is PostgreSQL's GUC variable, NULL or a
    // NUL-terminated string it owns, copied at once.
    unsafe {
        let p = pg_sys::application_name;
        if p.is_null() {
            return String::new();
        }
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// Citus's multiplier of a node id in a global process id (`citus_internal gpid=<nodeid ×
/// 10^10 + pid>`, the application name of its connections between nodes).
const GPID_NODE_MULTIPLIER: u64 = 10_000_000_000;
/// The node id Citus puts in the global process ids of a node not in its metadata.
const NODE_NOT_IN_METADATA: u64 = 99_999_999;

/// Is this backend one of Citus's own connections, opened for a command that started on the
/// coordinator (its application name `citus_internal gpid=…`, or `citus_rebalancer gpid=…` for
/// shard moves and splits, with the coordinator's node id `coordinator`)? Not `citus_run_command gpid=…`, the
/// connections of `run_command_on_*`, which run a user's own SQL.
pub fn from_coordinator(coordinator: u64) -> bool {
    let name = application_name();
    ["citus_internal gpid=", "citus_rebalancer gpid="]
        .iter()
        .find_map(|p| name.strip_prefix(p))
        .and_then(|g| g.parse::<u64>().ok())
        .is_some_and(|gpid| gpid / GPID_NODE_MULTIPLIER == coordinator)
}

/// The coordinator's node id, as Citus puts it in global process ids (`from_coordinator`).
pub fn coordinator_node_id() -> u64 {
    exec_internal(
        "SELECT COALESCE((SELECT n.nodeid::pg_catalog.int8 FROM pg_catalog.pg_dist_node n \
         WHERE n.groupid OPERATOR(pg_catalog.=) 0 AND n.isactive LIMIT 1), $1)",
        true,
        &[pg_sys::INT8OID],
        &mut [pg_sys::Datum::from(NODE_NOT_IN_METADATA as i64)],
        true,
        |d| d.value() as u64,
    )
    .unwrap_or(NODE_NOT_IN_METADATA)
}

/// Citus's functions that distribute a table or re-create it under its name, taking the table
/// as their first argument (docs/citus.md, "Distributing a protected table"); all live in
/// `pg_catalog`.
pub const TABLE_FUNCTIONS: [&str; 7] = [
    "create_distributed_table",
    "create_distributed_table_concurrently",
    "create_reference_table",
    "citus_add_local_table_to_metadata",
    "alter_distributed_table",
    "alter_table_set_access_method",
    "undistribute_table",
];

/// The calls of a [`TABLE_FUNCTIONS`] function at the top of statement `query_desc`, a SELECT
/// (its target list, or a function in its FROM list: `SELECT create_distributed_table(…)`,
/// `PERFORM …` in PL/pgSQL, `SELECT * FROM undistribute_table(…)`), each with its table when the
/// first argument is a constant or a parameter whose value the statement has (a PL/pgSQL
/// variable); and whether the statement is nothing but those calls with such arguments
/// (`alone`: a Result without FROM, condition or subplans, or a scan of those functions only,
/// each argument a constant or a parameter), so that running it runs nothing else. A call
/// nested deeper, or whose table is computed, is not seen: Citus then meets the protection as it
/// is (a table with triggers refused, a re-created table's writes refused with `FT004`).
///
/// # Safety
/// `query_desc` must be the executor hook's QueryDesc, before or after the executor started it.
pub unsafe fn table_function_calls(
    query_desc: *mut pg_sys::QueryDesc,
) -> (Vec<(&'static str, pg_sys::Oid)>, bool) {
    // SAFETY: per the contract; `plannedstmt` and its plan tree are the statement's, valid for
    // the call; node tags are checked before each cast; target lists are Lists of TargetEntry,
    // a FunctionScan's `functions` a List of RangeTblFunction; a Const's or parameter's datum
    // of type regclass is an Oid by value; `params` is NULL or the statement's parameter list,
    // whose `paramFetch` (PL/pgSQL's) returns a pointer into it or into `workspace`.
    unsafe {
        let stmt = (*query_desc).plannedstmt;
        if stmt.is_null() || (*stmt).commandType != pg_sys::CmdType::CMD_SELECT {
            return (Vec::new(), false);
        }
        let top = (*stmt).planTree;
        let mut exprs: Vec<*mut pg_sys::Node> = Vec::new();
        let mut plan = top;
        // The top node and the chain under it (a ProjectSet, Result or Limit over the call).
        for _ in 0..4 {
            if plan.is_null() {
                break;
            }
            for te in PgList::<pg_sys::TargetEntry>::from_pg((*plan).targetlist).iter_ptr() {
                exprs.push((*te).expr.cast());
            }
            if (*plan).type_ == pg_sys::NodeTag::T_FunctionScan {
                let scan = plan.cast::<pg_sys::FunctionScan>();
                for f in PgList::<pg_sys::RangeTblFunction>::from_pg((*scan).functions).iter_ptr() {
                    exprs.push((*f).funcexpr);
                }
            }
            plan = (*plan).lefttree;
        }
        let mut calls = Vec::new();
        let mut others = false;
        for e in exprs {
            if e.is_null() {
                continue;
            }
            if (*e).type_ != pg_sys::NodeTag::T_FuncExpr {
                // A FunctionScan's target list reads its functions' columns (Vars).
                others |= (*e).type_ != pg_sys::NodeTag::T_Var;
                continue;
            }
            let f = e.cast::<pg_sys::FuncExpr>();
            let Some(name) = table_function((*f).funcid) else {
                others = true;
                continue;
            };
            let args = PgList::<pg_sys::Node>::from_pg((*f).args);
            others |= !args.iter_ptr().all(|a| {
                matches!((*a).type_, pg_sys::NodeTag::T_Const)
                    || ((*a).type_ == pg_sys::NodeTag::T_Param
                        && (*a.cast::<pg_sys::Param>()).paramkind
                            == pg_sys::ParamKind::PARAM_EXTERN)
            });
            if let Some(relid) = args
                .get_ptr(0)
                .and_then(|a| regclass_value(a, (*query_desc).params))
            {
                calls.push((name, relid));
            }
        }
        let shape_alone = !top.is_null()
            && (*top).lefttree.is_null()
            && (*top).righttree.is_null()
            && (*top).qual.is_null()
            && (*top).initPlan.is_null()
            && (*stmt).subplans.is_null()
            && match (*top).type_ {
                pg_sys::NodeTag::T_Result => {
                    (*top.cast::<pg_sys::Result>()).resconstantqual.is_null()
                }
                pg_sys::NodeTag::T_FunctionScan => true,
                _ => false,
            };
        let alone = shape_alone && !others;
        (calls, alone)
    }
}

/// The [`TABLE_FUNCTIONS`] name of function `funcid` (`None`: another function).
fn table_function(funcid: pg_sys::Oid) -> Option<&'static str> {
    // SAFETY: main thread inside a transaction; syscache lookups by OID, NULL / InvalidOid for
    // an unknown function; the name is a palloc'd NUL-terminated string, copied at once.
    unsafe {
        if pg_sys::get_func_namespace(funcid) != pg_sys::Oid::from(pg_sys::PG_CATALOG_NAMESPACE) {
            return None;
        }
        let name = pg_sys::get_func_name(funcid);
        if name.is_null() {
            return None;
        }
        let called = CStr::from_ptr(name).to_bytes();
        let found = TABLE_FUNCTIONS
            .iter()
            .find(|f| f.as_bytes() == called)
            .copied();
        pg_sys::pfree(name.cast());
        found
    }
}

/// The relation a regclass-typed argument names: a constant, or an external parameter with a
/// value in `params`.
///
/// # Safety
/// `arg` must be a node of a plan being run; `params` NULL or that statement's parameters.
unsafe fn regclass_value(
    arg: *mut pg_sys::Node,
    params: pg_sys::ParamListInfo,
) -> Option<pg_sys::Oid> {
    // SAFETY: per the contract (see `table_function_calls`).
    unsafe {
        match (*arg).type_ {
            pg_sys::NodeTag::T_Const => {
                let c = arg.cast::<pg_sys::Const>();
                ((*c).consttype == pg_sys::REGCLASSOID && !(*c).constisnull)
                    .then(|| pg_sys::Oid::from((*c).constvalue.value() as u32))
            }
            pg_sys::NodeTag::T_Param => {
                let p = arg.cast::<pg_sys::Param>();
                if params.is_null()
                    || (*p).paramkind != pg_sys::ParamKind::PARAM_EXTERN
                    || (*p).paramtype != pg_sys::REGCLASSOID
                    || (*p).paramid < 1
                    || (*p).paramid > (*params).numParams
                {
                    return None;
                }
                let mut workspace: pg_sys::ParamExternData = std::mem::zeroed();
                let data = match (*params).paramFetch {
                    Some(fetch) => fetch(params, (*p).paramid, false, &mut workspace),
                    None => (*params).params.as_mut_ptr().add((*p).paramid as usize - 1),
                };
                (!data.is_null() && !(*data).isnull && (*data).ptype == pg_sys::REGCLASSOID)
                    .then(|| pg_sys::Oid::from((*data).value.value() as u32))
            }
            _ => None,
        }
    }
}

/// `_pg_fencing.citus_table_call_begins(relation, function)`, as the calling role (the owner
/// checks of `fencing_unprotect` are the caller's): `None` for a table that is not protected,
/// else what `table_call_ends` needs. The function's errors are raised as they are (`0A000`);
/// `Err` only for SPI's own failure.
pub fn table_call_begins(
    relid: pg_sys::Oid,
    function: &str,
) -> Result<Option<Vec<String>>, pgrx::spi::SpiError> {
    pgrx::Spi::get_one_with_args::<Vec<String>>(
        "SELECT _pg_fencing.citus_table_call_begins($1::pg_catalog.oid::pg_catalog.regclass, $2)",
        &[relid.into(), function.into()],
    )
}

/// Citus's node table, `pg_dist_node` (whose every change Citus's own trigger announces by
/// invalidating its relcache entry); `None` without Citus.
pub fn node_table() -> Option<pg_sys::Oid> {
    // SAFETY: main thread inside a transaction; a catalog cache lookup by name, InvalidOid if
    // there is no such relation.
    let relid = unsafe {
        pg_sys::get_relname_relid(
            c"pg_dist_node".as_ptr(),
            pg_sys::Oid::from(pg_sys::PG_CATALOG_NAMESPACE),
        )
    };
    (relid != pg_sys::InvalidOid).then_some(relid)
}

/// Process this transaction's own pending invalidations (a command counter increment) when it
/// wrote anything: a change made by the transaction's last command is seen by the relcache
/// callbacks before its commit goes on. `false`: it wrote nothing.
pub fn process_own_invalidations() -> bool {
    // SAFETY: main thread inside a transaction that is committing (its pre-commit step), where
    // PostgreSQL itself may still increment the command counter (deferred triggers);
    // GetTopTransactionIdIfAny only reads this process's state.
    unsafe {
        let wrote = pg_sys::GetTopTransactionIdIfAny() != pg_sys::InvalidTransactionId;
        if wrote {
            pg_sys::CommandCounterIncrement();
        }
        wrote
    }
}

/// Is this backend a client's (not Citus's maintenance daemon or another background worker)?
pub fn client_backend() -> bool {
    // SAFETY: a read of this process's own variable.
    unsafe { pg_sys::MyBackendType == pg_sys::BackendType::B_BACKEND }
}

/// `_pg_fencing.citus_nodes_changed()`, as the current role, with a snapshot of its own (it
/// runs at commit, where none is active): on the coordinator, while a table is protected in
/// the Citus shape, every active node must preload pg_fencing (`55000` otherwise). Errors as
/// `table_call_begins`.
pub fn nodes_changed() -> Result<(), pgrx::spi::SpiError> {
    with_active_snapshot(|| pgrx::Spi::run("SELECT _pg_fencing.citus_nodes_changed()"))
}

/// Run `f` with an active snapshot (SPI needs one): the one set, else the transaction's, pushed
/// for the call.
fn with_active_snapshot<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: main thread inside a transaction; a snapshot pushed here is popped below, or by
    // the abort's cleanup of the snapshot stack when `f` raises an ERROR.
    let pushed = unsafe {
        let push = !pg_sys::ActiveSnapshotSet();
        if push {
            pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
        }
        push
    };
    let out = f();
    if pushed {
        // SAFETY: pops the snapshot pushed above (`f` left the stack as it found it).
        unsafe { pg_sys::PopActiveSnapshot() };
    }
    out
}

/// `_pg_fencing.citus_table_call_ends(call)`, as the calling role: the table protected again.
/// Errors as `table_call_begins`.
pub fn table_call_ends(call: Vec<String>) -> Result<(), pgrx::spi::SpiError> {
    with_active_snapshot(|| {
        pgrx::Spi::run_with_args(
            "SELECT _pg_fencing.citus_table_call_ends($1)",
            &[call.into()],
        )
    })
}
