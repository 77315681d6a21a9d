//! Raising a `FenceError` as a PostgreSQL ERROR with its own SQLSTATE (`FTxxx` included), and
//! the one log line of a refused write (`pg_fencing.log_rejections`).

use crate::error::{make_sqlstate, Domain, FenceError};
use std::ffi::{c_char, c_int, CString};

// Declared here rather than taken from pgrx's bindings: pgrx keeps them out of `pg_sys` on purpose.
// SAFETY: these match the declarations in PostgreSQL's utils/elog.h (15: errstart returns bool,
// errfinish returns void; errmsg/errdetail/errhint are printf-style and variadic), so calls
// through them follow the C ABI.
unsafe extern "C-unwind" {
    fn errstart(elevel: c_int, domain: *const c_char) -> bool;
    fn errcode(sqlerrcode: c_int) -> c_int;
    fn errmsg(fmt: *const c_char, ...) -> c_int;
    fn errdetail(fmt: *const c_char, ...) -> c_int;
    fn errhint(fmt: *const c_char, ...) -> c_int;
    fn errfinish(filename: *const c_char, lineno: c_int, funcname: *const c_char);
    fn errhidestmt(hide_stmt: bool) -> c_int;
    fn errhidecontext(hide_ctx: bool) -> c_int;
}

/// `text` with `\`, `"` and control characters (newlines above all) escaped by a backslash, as
/// `\\`, `\"`, `\n`, `\r`, `\t` or `\xNN`: what a client chose (a resource, lock or
/// application name, a row key) cannot pose as other fields of the log line or as a line of its
/// own.
fn escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// `text` escaped (see `escaped`) in double quotes.
fn quoted(text: &str) -> String {
    format!("\"{}\"", escaped(text))
}

/// The one log line of a refused write (FT001, FT003, FT006), or `None` for other errors and
/// with `pg_fencing.log_rejections = off`. It names the resource or row, the token and the mark
/// (or why the token was refused), and where the write came from, so an operator can find the
/// zombie: `application_name`, client address and backend pid. Every text field is quoted and
/// escaped.
fn rejection_log_line(err: &FenceError) -> Option<(c_int, String)> {
    let what = match err {
        FenceError::StaleToken {
            domain,
            token,
            high_water,
        } => {
            let domain = match domain {
                Domain::Resource(r) => format!("resource {}", quoted(r)),
                Domain::Row { table, key } => {
                    format!("row {} of table {}", quoted(key), quoted(table))
                }
                Domain::RowFloor { table, key } => format!(
                    "row {} of table {} (a key without a tombstone, below the table's tombstone floor)",
                    quoted(key),
                    quoted(table)
                ),
            };
            format!(
                "stale fencing token {token} for {domain}, whose high-water mark is {high_water}"
            )
        }
        FenceError::LockLost { lock, token, why } if why.is_empty() => {
            format!(
                "fencing token {token} of lock {}, which was lost",
                quoted(lock)
            )
        }
        FenceError::LockLost { lock, token, why } => format!(
            "fencing token {token} of lock {}, which was lost: {}",
            quoted(lock),
            escaped(why)
        ),
        FenceError::LeaseEnded {
            token,
            why,
            write: true,
        } => format!(
            "fencing token {token}, which no live PostgreSQL lease holds: {}",
            escaped(why)
        ),
        FenceError::NotVerified {
            resource,
            token,
            why,
        } => format!(
            "unverified fencing token {token} for resource {}: {}",
            quoted(resource),
            escaped(why)
        ),
        _ => return None,
    };
    let level = crate::gucs::log_rejections_level()?;
    let origin = crate::pg::session::origin();
    let client = if origin.client.is_empty() {
        "none"
    } else {
        &origin.client
    };
    Some((
        level,
        format!(
            "pg_fencing refused a write ({}): {what}; application_name {}, client {client}, backend pid {}",
            err.sqlstate(),
            quoted(&origin.application_name),
            origin.pid
        ),
    ))
}

fn to_pg_cstr(s: &str) -> *mut c_char {
    let c = CString::new(s.replace('\0', "")).unwrap_or_default();
    // SAFETY: `c` is NUL-terminated and alive during the call; pstrdup copies it into the current
    // memory context (main thread; an out-of-memory ERROR becomes a panic through pgrx's FFI
    // guard, and every caller runs inside a pgrx guard). The error machinery copies it again.
    unsafe { pgrx::pg_sys::pstrdup(c.as_ptr()) }
}

/// What raised an error, for its LOCATION (psql's `\set VERBOSITY verbose`): the SQL function
/// PostgreSQL called (its name read from the catalog, on the error path only) or a hook's name.
#[derive(Clone, Copy)]
pub enum Raiser {
    /// A V1 C function called through the function manager (also a trigger function).
    Function(pgrx::pg_sys::FunctionCallInfo),
    /// A hook or callback of ours, by name.
    Hook(&'static str),
}

impl Raiser {
    /// The raiser's name. Runs inside pgrx's guard (a catalog lookup may raise).
    fn name(self) -> String {
        match self {
            Raiser::Hook(name) => name.to_string(),
            Raiser::Function(fcinfo) => {
                // SAFETY: `fcinfo` is the function manager's for the current call (the
                // contract of `raise`), so `flinfo` points to its FmgrInfo; get_func_name
                // returns a palloc'd C string or NULL for an unknown OID, read once here.
                let name = unsafe {
                    let oid = (*(*fcinfo).flinfo).fn_oid;
                    let p = pgrx::pg_sys::get_func_name(oid);
                    if p.is_null() {
                        None
                    } else {
                        Some(std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned())
                    }
                };
                name.unwrap_or_else(|| "pg_fencing".into())
            }
        }
    }
}

/// Raise `err` as a PostgreSQL ERROR with its own SQLSTATE. Never returns. Its LOCATION names
/// `by` and the Rust file and line that called `raise` (`#[track_caller]`).
///
/// A refused write (FT001, FT003, FT006) is first logged once at `pg_fencing.log_rejections`
/// (see `rejection_log_line`): this is the only place such an error is raised, and an error
/// that passes through an outer `fenced_*` call is not raised again.
///
/// # Safety
/// Call on the backend's main thread, from the frame of a C entry point or callback that
/// PostgreSQL called (directly, or inside the body of its `#[pg_guard]`), not inside
/// `pg_guard_ffi_boundary`. Every Rust frame between this call and PostgreSQL's C caller must
/// hold no value that still needs dropping: the ERROR leaves by `siglongjmp` to PostgreSQL's
/// handler, which skips destructors (`err` itself is consumed before that).
#[track_caller]
pub unsafe fn raise(err: FenceError, by: Raiser) -> ! {
    let at = std::panic::Location::caller();
    let (file, lineno) = (at.file(), at.line() as c_int);
    // Everything that owns Rust memory or calls PostgreSQL (the log line reads the client
    // address; pstrdup may fail) is done inside the guard, which also drops `err`: an error
    // there is raised by pgrx with nothing left to drop in this frame. What comes out is plain
    // data: C strings palloc'd in the current memory context, which stay valid until the
    // error machinery copies them.
    // SAFETY: our caller's frames hold nothing to drop (this function's contract), and the
    // closure owns everything it uses, so pgrx_extern_c_guard's requirement of
    // trivially-deallocated frames above it holds; main thread per the contract.
    let (log, code, msg, detail, hint, file, func) = unsafe {
        pgrx::pg_sys::submodules::panic::pgrx_extern_c_guard(move || {
            let file = to_pg_cstr(file);
            let func = to_pg_cstr(&by.name());
            let log = rejection_log_line(&err).map(|(level, line)| (level, to_pg_cstr(&line)));
            let code = make_sqlstate(err.sqlstate());
            let msg = to_pg_cstr(&err.to_string());
            let detail = err.detail().map(|d| to_pg_cstr(&d));
            let hint = err.hint().map(|h| to_pg_cstr(&h));
            drop(err);
            (log, code, msg, detail, hint, file, func)
        })
    };
    const PERCENT_S: &std::ffi::CStr = c"%s";
    // SAFETY: errstart/errcode/errmsg/errdetail/errhint/errfinish are called in the order
    // elog.h's ereport() uses, on the main thread, with "%s" as the format and NUL-terminated
    // palloc'd strings (valid until errfinish copies them into ErrorContext) as its one
    // argument, so no client text is read as a format. A log-level report returns from
    // errfinish; the ERROR one does not: errfinish longjmps to PostgreSQL's handler (the caller
    // guarantees no pgrx boundary is in between and nothing here needs dropping: only integers
    // and raw pointers are alive). Hence `unreachable_unchecked` is never reached.
    unsafe {
        if let Some((level, line)) = log {
            if errstart(level, std::ptr::null()) {
                errcode(code);
                errmsg(PERCENT_S.as_ptr(), line);
                errhidestmt(true);
                errhidecontext(true);
                errfinish(file, lineno, func);
            }
        }
        if errstart(pgrx::PgLogLevel::ERROR as c_int, std::ptr::null()) {
            errcode(code);
            errmsg(PERCENT_S.as_ptr(), msg);
            if let Some(d) = detail {
                errdetail(PERCENT_S.as_ptr(), d);
            }
            if let Some(h) = hint {
                errhint(PERCENT_S.as_ptr(), h);
            }
            errfinish(file, lineno, func);
        }
        std::hint::unreachable_unchecked()
    }
}

/// Raise `err` from inside a pgrx-guarded function (a `#[pg_extern]`, whose Rust frames must
/// unwind): through pgrx's own error report, with the same SQLSTATE, message, detail and hint
/// as `raise`. Only for errors whose SQLSTATE PostgreSQL itself defines (pgrx turns an unknown
/// class such as `FTxxx` into `XX000`); the C entry points raise ours with `raise`. Its LOCATION
/// is the caller's file and line (`#[track_caller]`).
#[track_caller]
pub fn raise_in_guard(err: FenceError) -> ! {
    let code = pgrx::PgSqlErrorCode::from(make_sqlstate(err.sqlstate()));
    debug_assert!(
        !err.sqlstate().as_str().starts_with("FT"),
        "FTxxx needs `raise`"
    );
    let mut report = pgrx::pg_sys::panic::ErrorReport::new(code, err.to_string(), "pg_fencing");
    if let Some(d) = err.detail() {
        report = report.set_detail(d);
    }
    if let Some(h) = err.hint() {
        report = report.set_hint(h);
    }
    report.report(pgrx::PgLogLevel::ERROR);
    unreachable!("an ERROR report does not return")
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn quoted_escapes_quotes_backslashes_and_control_characters() {
        assert_eq!(quoted("zombie-1"), r#""zombie-1""#);
        assert_eq!(
            quoted(r#"x", client 10.9.8.7:4242, backend pid 1 \"#),
            r#""x\", client 10.9.8.7:4242, backend pid 1 \\""#
        );
        assert_eq!(quoted("a\nLOG:  b\r\tc\u{7}"), r#""a\nLOG:  b\r\tc\x07""#);
        assert!(!quoted("x\ny").contains('\n'));
    }
}
