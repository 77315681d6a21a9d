//! `COPY … FROM` as the ProcessUtility hook sees it (`api/hooks.rs`): the target table and the
//! columns a statement names, and conditions added to its `WHERE` clause (`_pg_fencing.copy_key`,
//! `_pg_fencing.copy_token`: see `guard/copy_from.rs`, which decides). This layer only reads and
//! writes PostgreSQL's parse tree; an added condition is a call of a STABLE function, so COPY
//! keeps its multi-row inserts (`copyfrom.c` gives them up only for volatile ones).

use pgrx::pg_sys;
use std::ffi::{c_char, c_int, CStr, CString};

/// A `COPY table [(columns)] FROM …` statement (not `COPY (query)`, not `COPY … TO`).
pub struct CopyFrom {
    stmt: *mut pg_sys::CopyStmt,
}

impl CopyFrom {
    /// The COPY FROM of utility statement `pstmt`, if it is one.
    ///
    /// # Safety
    /// `pstmt` must be the ProcessUtility hook's statement, valid for the call.
    pub unsafe fn of(pstmt: *mut pg_sys::PlannedStmt) -> Option<CopyFrom> {
        // SAFETY: per the contract; the node tag is checked before the cast.
        unsafe {
            if pstmt.is_null() {
                return None;
            }
            let node = (*pstmt).utilityStmt;
            if node.is_null() || (*node).type_ != pg_sys::NodeTag::T_CopyStmt {
                return None;
            }
            let stmt = node.cast::<pg_sys::CopyStmt>();
            if !(*stmt).is_from || (*stmt).relation.is_null() || !(*stmt).query.is_null() {
                return None;
            }
            Some(CopyFrom { stmt })
        }
    }

    /// The table the statement names, resolved by name now without a lock (`None`: no such
    /// table). COPY resolves it again when it opens it; a table that changed in between is not
    /// the one admitted, and its statement trigger refuses the write (`guard/copy_from.rs`).
    pub fn relid(&self) -> Option<pg_sys::Oid> {
        // SAFETY: the statement's RangeVar (checked non-NULL in `of`); RangeVarGetRelidExtended
        // with RVR_MISSING_OK returns InvalidOid for a missing table and raises ERROR only for
        // a bad name, as COPY itself would.
        let oid = unsafe {
            pg_sys::RangeVarGetRelidExtended(
                (*self.stmt).relation,
                pg_sys::NoLock as pg_sys::LOCKMODE,
                pg_sys::RVROption::RVR_MISSING_OK,
                None,
                std::ptr::null_mut(),
            )
        };
        (oid != pg_sys::InvalidOid).then_some(oid)
    }

    /// Does the statement give column `name` a value (it lists it, or lists no columns)?
    pub fn names_column(&self, name: &CStr) -> bool {
        // SAFETY: `attlist` is NULL or a List of String nodes (gram.y's columnList).
        unsafe {
            let list = (*self.stmt).attlist;
            if list.is_null() {
                return true;
            }
            pgrx::PgList::<pg_sys::Node>::from_pg(list)
                .iter_ptr()
                .any(|n| !n.is_null() && string_value(n) == Some(name))
        }
    }

    /// Add `schema.function(args…)` to the statement's `WHERE` clause (ANDed after the user's
    /// own condition, so that rows it filters out are never passed to the call). The statement
    /// is copied first: the hook's tree may be read-only (a cached plan's).
    ///
    /// # Safety
    /// `pstmt` must be the statement this value was made from, and the caller must pass the
    /// returned statement on instead of it.
    pub unsafe fn with_condition(
        &mut self,
        pstmt: *mut pg_sys::PlannedStmt,
        schema: &CStr,
        function: &CStr,
        columns: &[CString],
    ) -> *mut pg_sys::PlannedStmt {
        // SAFETY: copyObjectImpl deep-copies the statement into the current memory context
        // (the hook's caller's, which outlives the statement's execution); the new nodes are
        // allocated with palloc in the same context, as the parser would make them.
        unsafe {
            let copy = pg_sys::copyObjectImpl(pstmt.cast()).cast::<pg_sys::PlannedStmt>();
            let stmt = (*copy).utilityStmt.cast::<pg_sys::CopyStmt>();
            self.stmt = stmt;
            let mut name = pgrx::PgList::<pg_sys::Node>::new();
            name.push(pg_sys::makeString(pg_sys::pstrdup(schema.as_ptr())).cast());
            name.push(pg_sys::makeString(pg_sys::pstrdup(function.as_ptr())).cast());
            let mut args = pgrx::PgList::<pg_sys::Node>::new();
            for c in columns {
                args.push(column_ref(c));
            }
            let call = pg_sys::makeFuncCall(
                name.into_pg(),
                args.into_pg(),
                pg_sys::CoercionForm::COERCE_EXPLICIT_CALL,
                -1,
            );
            let condition = if (*stmt).whereClause.is_null() {
                call.cast::<pg_sys::Node>()
            } else {
                let mut both = pgrx::PgList::<pg_sys::Node>::new();
                both.push((*stmt).whereClause);
                both.push(call.cast());
                pg_sys::makeBoolExpr(pg_sys::BoolExprType::AND_EXPR, both.into_pg(), -1)
                    .cast::<pg_sys::Node>()
            };
            (*stmt).whereClause = condition;
            copy
        }
    }
}

/// A raw `ColumnRef` naming column `name`.
///
/// # Safety
/// Main thread, inside a memory context that outlives the statement.
unsafe fn column_ref(name: &CStr) -> *mut pg_sys::Node {
    // SAFETY: per the contract; a zeroed ColumnRef with its tag and one String field is what
    // gram.y's columnref makes for an unqualified name.
    unsafe {
        let node =
            pg_sys::palloc0(std::mem::size_of::<pg_sys::ColumnRef>()).cast::<pg_sys::ColumnRef>();
        (*node).type_ = pg_sys::NodeTag::T_ColumnRef;
        let mut fields = pgrx::PgList::<pg_sys::Node>::new();
        fields.push(pg_sys::makeString(pg_sys::pstrdup(name.as_ptr())).cast());
        (*node).fields = fields.into_pg();
        (*node).location = -1 as c_int;
        node.cast()
    }
}

/// The value of a String node (`None` for other nodes).
///
/// # Safety
/// `n` must be a valid node.
unsafe fn string_value<'a>(n: *mut pg_sys::Node) -> Option<&'a CStr> {
    // SAFETY: per the contract; the tag is checked before the cast, and a String node's `sval`
    // is a NUL-terminated string that lives as long as the node.
    unsafe {
        if (*n).type_ != pg_sys::NodeTag::T_String {
            return None;
        }
        let s: *const c_char = (*n.cast::<pg_sys::String>()).sval;
        (!s.is_null()).then(|| CStr::from_ptr(s))
    }
}

// Declared here, not taken from pgrx's bindings, for the reason given in `pg/plan.rs`: an error
// raised while a utility statement runs (a user function's own SQLSTATE, our FTxxx codes) must
// reach the client unchanged.
// SAFETY: the signature is that of tcop/utility.h, so calls through it follow the C ABI.
unsafe extern "C-unwind" {
    #[link_name = "standard_ProcessUtility"]
    fn standard_process_utility_unguarded(
        pstmt: *mut pg_sys::PlannedStmt,
        query_string: *const c_char,
        read_only_tree: bool,
        context: pg_sys::ProcessUtilityContext::Type,
        params: pg_sys::ParamListInfo,
        query_env: *mut pg_sys::QueryEnvironment,
        dest: *mut pg_sys::DestReceiver,
        qc: *mut pg_sys::QueryCompletion,
    );
}

/// Run a utility statement with the previous hook, or PostgreSQL's.
///
/// # Safety
/// The ProcessUtility hook's own arguments (`pstmt` possibly replaced by a copy from
/// `CopyFrom::with_condition`, with `read_only_tree` still as given), on the main thread, with
/// only plain values in the caller's frame (an ERROR leaves it by longjmp).
#[allow(clippy::too_many_arguments)]
pub unsafe fn process_utility_next(
    prev: pg_sys::ProcessUtility_hook_type,
    pstmt: *mut pg_sys::PlannedStmt,
    query_string: *const c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    query_env: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
) {
    // SAFETY: per the contract, PostgreSQL's own arguments passed on.
    unsafe {
        match prev {
            Some(f) => f(
                pstmt,
                query_string,
                read_only_tree,
                context,
                params,
                query_env,
                dest,
                qc,
            ),
            None => standard_process_utility_unguarded(
                pstmt,
                query_string,
                read_only_tree,
                context,
                params,
                query_env,
                dest,
                qc,
            ),
        }
    }
}

/// The rows a finished utility statement reports (`None`: its caller asked for no completion).
///
/// # Safety
/// `qc` must be the ProcessUtility hook's, after the statement ran.
pub unsafe fn rows_processed(qc: *mut pg_sys::QueryCompletion) -> Option<u64> {
    // SAFETY: per the contract (NULL checked).
    unsafe { (!qc.is_null()).then(|| (*qc).nprocessed) }
}
