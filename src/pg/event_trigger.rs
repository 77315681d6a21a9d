//! What an event trigger function learns from PostgreSQL: the parse tree of the command it fires
//! for (`EventTriggerData`), read for the one question pg_fencing asks of it.

use pgrx::pg_sys;
use std::ffi::CStr;

/// Called as an event trigger for `DROP EXTENSION`, does the command drop extension `name`?
/// `None` when not called as an event trigger, or for another command. Read from the parse
/// tree, so comments, quoting and dynamic SQL (`EXECUTE`) make no difference.
///
/// # Safety
/// `fcinfo` must be the function manager's own for the current call (on the main thread).
pub unsafe fn drops_extension(fcinfo: pg_sys::FunctionCallInfo, name: &str) -> Option<bool> {
    // SAFETY: `fcinfo` is the current call's (the caller's duty). `context` is NULL or a node;
    // when its tag is T_EventTriggerData, it is the EventTriggerData that the event trigger
    // machinery passes, alive for the call, whose `parsetree` is the command's parse tree (a
    // node, checked by tag before it is read as a DropStmt). `objects` is a List (possibly NIL)
    // whose cells each hold a node pointer; for OBJECT_EXTENSION each is a String node (checked
    // by tag) with a NUL-terminated `sval` owned by the parse tree.
    unsafe {
        let context = (*fcinfo).context;
        if context.is_null() || (*context).type_ != pg_sys::NodeTag::T_EventTriggerData {
            return None;
        }
        let data = context as *mut pg_sys::EventTriggerData;
        let tree = (*data).parsetree;
        if tree.is_null() || (*tree).type_ != pg_sys::NodeTag::T_DropStmt {
            return None;
        }
        let drop = tree as *mut pg_sys::DropStmt;
        if (*drop).removeType != pg_sys::ObjectType::OBJECT_EXTENSION {
            return None;
        }
        let list = (*drop).objects;
        if list.is_null() {
            return Some(false);
        }
        let n = (*list).length as usize;
        for i in 0..n {
            let cell = (*list).elements.add(i);
            let node = (*cell).ptr_value as *mut pg_sys::Node;
            if node.is_null() || (*node).type_ != pg_sys::NodeTag::T_String {
                continue;
            }
            let sval = (*(node as *mut pg_sys::String)).sval;
            if !sval.is_null() && CStr::from_ptr(sval).to_bytes() == name.as_bytes() {
                return Some(true);
            }
        }
        Some(false)
    }
}
