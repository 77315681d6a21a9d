//! What an event trigger function learns from PostgreSQL: the parse tree of the command it fires
//! for (`EventTriggerData`), read for the questions `_pg_fencing.on_ddl_start` asks of it. Names
//! are resolved here (to oids, as the command itself will), so comments, quoting, search_path and
//! dynamic SQL (`EXECUTE`) make no difference.

use pgrx::pg_sys;
use std::ffi::CStr;

/// A command that `ddl_command_start` looks at before it runs.
pub enum DdlStart {
    /// `DROP EXTENSION`: the extensions' names.
    DropExtensions(Vec<String>),
    /// `DROP SCHEMA`: the schemas that exist.
    DropSchemas(Vec<pg_sys::Oid>),
    /// `DROP TABLE`: the tables that exist.
    DropTables(Vec<pg_sys::Oid>),
    /// `DROP OWNED BY`: the roles that exist.
    DropOwned(Vec<pg_sys::Oid>),
    /// `ALTER TABLE ... ALTER COLUMN ... TYPE`: the table (if it exists) and the columns retyped.
    AlterColumnTypes(pg_sys::Oid, Vec<String>),
}

/// The cells of a parse-tree `List` (empty for NIL).
///
/// # Safety
/// `list` is NULL or a valid pointer `List` of the current command's parse tree.
unsafe fn cells(list: *mut pg_sys::List) -> Vec<*mut pg_sys::Node> {
    if list.is_null() {
        return Vec::new();
    }
    // SAFETY: a non-NULL List has `length` cells in `elements` (the caller's duty: a pointer
    // list, whose cells hold `ptr_value`).
    unsafe {
        (0..(*list).length as usize)
            .map(|i| (*(*list).elements.add(i)).ptr_value as *mut pg_sys::Node)
            .collect()
    }
}

/// The text of a `String` node (`None` for another node).
///
/// # Safety
/// `node` is NULL or a node of the current command's parse tree.
unsafe fn string_node(node: *mut pg_sys::Node) -> Option<String> {
    // SAFETY: checked by tag before it is read as a String node, whose `sval` is NUL-terminated
    // and owned by the parse tree.
    unsafe {
        if node.is_null() || (*node).type_ != pg_sys::NodeTag::T_String {
            return None;
        }
        let sval = (*(node as *mut pg_sys::String)).sval;
        (!sval.is_null()).then(|| CStr::from_ptr(sval).to_string_lossy().into_owned())
    }
}

/// The relation a `RangeVar` names, as the command will resolve it (`None`: there is none).
///
/// # Safety
/// `rv` is NULL or a `RangeVar` of the current command's parse tree; main thread.
unsafe fn relation_of(rv: *mut pg_sys::RangeVar) -> Option<pg_sys::Oid> {
    if rv.is_null() {
        return None;
    }
    // SAFETY: a valid RangeVar; no lock is taken (the command takes its own), and a missing
    // relation or schema gives InvalidOid (RVR_MISSING_OK) rather than an error.
    let oid = unsafe {
        pg_sys::RangeVarGetRelidExtended(
            rv,
            pg_sys::NoLock as pg_sys::LOCKMODE,
            pg_sys::RVROption::RVR_MISSING_OK,
            None,
            std::ptr::null_mut(),
        )
    };
    (oid != pg_sys::InvalidOid).then_some(oid)
}

/// The command this event trigger fires for, if it is one of `DdlStart`'s. `None` when not
/// called as an event trigger, or for another command.
///
/// # Safety
/// `fcinfo` must be the function manager's own for the current call (on the main thread).
pub unsafe fn ddl_start(fcinfo: pg_sys::FunctionCallInfo) -> Option<DdlStart> {
    // SAFETY: `fcinfo` is the current call's (the caller's duty). `context` is NULL or a node;
    // when its tag is T_EventTriggerData, it is the EventTriggerData that the event trigger
    // machinery passes, alive for the call, whose `parsetree` is the command's parse tree. Each
    // node is read as the struct its tag says; lists are read by `cells`, names resolved by
    // PostgreSQL's own lookups with missing_ok.
    unsafe {
        let context = (*fcinfo).context;
        if context.is_null() || (*context).type_ != pg_sys::NodeTag::T_EventTriggerData {
            return None;
        }
        let tree = (*(context as *mut pg_sys::EventTriggerData)).parsetree;
        if tree.is_null() {
            return None;
        }
        match (*tree).type_ {
            pg_sys::NodeTag::T_DropStmt => {
                let drop = tree as *mut pg_sys::DropStmt;
                let objects = cells((*drop).objects);
                match (*drop).removeType {
                    pg_sys::ObjectType::OBJECT_EXTENSION => Some(DdlStart::DropExtensions(
                        objects.into_iter().filter_map(|n| string_node(n)).collect(),
                    )),
                    pg_sys::ObjectType::OBJECT_SCHEMA => Some(DdlStart::DropSchemas(
                        objects
                            .into_iter()
                            .filter(|&n| !n.is_null() && (*n).type_ == pg_sys::NodeTag::T_String)
                            .map(|n| {
                                pg_sys::get_namespace_oid((*(n as *mut pg_sys::String)).sval, true)
                            })
                            .filter(|&o| o != pg_sys::InvalidOid)
                            .collect(),
                    )),
                    pg_sys::ObjectType::OBJECT_TABLE => Some(DdlStart::DropTables(
                        objects
                            .into_iter()
                            .filter(|&n| !n.is_null() && (*n).type_ == pg_sys::NodeTag::T_List)
                            .filter_map(|n| {
                                relation_of(pg_sys::makeRangeVarFromNameList(
                                    n as *mut pg_sys::List,
                                ))
                            })
                            .collect(),
                    )),
                    _ => None,
                }
            }
            pg_sys::NodeTag::T_DropOwnedStmt => {
                let drop = tree as *mut pg_sys::DropOwnedStmt;
                Some(DdlStart::DropOwned(
                    cells((*drop).roles)
                        .into_iter()
                        .filter(|&n| !n.is_null() && (*n).type_ == pg_sys::NodeTag::T_RoleSpec)
                        .map(|n| pg_sys::get_rolespec_oid(n as *mut pg_sys::RoleSpec, true))
                        .filter(|&o| o != pg_sys::InvalidOid)
                        .collect(),
                ))
            }
            pg_sys::NodeTag::T_AlterTableStmt => {
                let alter = tree as *mut pg_sys::AlterTableStmt;
                let columns: Vec<String> = cells((*alter).cmds)
                    .into_iter()
                    .filter(|&n| !n.is_null() && (*n).type_ == pg_sys::NodeTag::T_AlterTableCmd)
                    .map(|n| n as *mut pg_sys::AlterTableCmd)
                    .filter(|&c| {
                        (*c).subtype == pg_sys::AlterTableType::AT_AlterColumnType
                            && !(*c).name.is_null()
                    })
                    .map(|c| CStr::from_ptr((*c).name).to_string_lossy().into_owned())
                    .collect();
                if columns.is_empty() {
                    return None;
                }
                relation_of((*alter).relation).map(|rel| DdlStart::AlterColumnTypes(rel, columns))
            }
            _ => None,
        }
    }
}
