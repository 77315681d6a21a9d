//! C entry points that can raise our own SQLSTATEs (`FTxxx`).
//!
//! Each one runs its body inside pgrx's guard (so PostgreSQL errors and Rust panics inside it are
//! handled the pgrx way) and gets back a `Result`. An `Err(FenceError)` is raised here, in the
//! outermost frame, where no pgrx boundary can rewrite its SQLSTATE to `XX000` (see `pg/report.rs`).
//! The SQL declarations of these functions are in `sql/pg_fencing.sql`.

use crate::api::fenced;
use crate::error::{self, FenceError};
use crate::guard::trigger;
use crate::pg::report::{raise, Raiser};
use crate::pg::trigger_event::TriggerEvent;
use crate::rule;
use pgrx::pg_sys::{self, FunctionCallInfo};
use pgrx::prelude::*;

/// Run `body` inside pgrx's guard and raise its `Err` with our own SQLSTATE.
///
/// # Safety
/// Call only from the frame of a C entry point that PostgreSQL's function manager called, on
/// the backend's main thread, with nothing that needs dropping alive in the calling frames (an
/// ERROR leaves them by longjmp; see `pgrx_extern_c_guard` and `raise`).
#[track_caller]
unsafe fn run(
    fcinfo: FunctionCallInfo,
    body: impl FnOnce() -> Result<pg_sys::Datum, FenceError>,
) -> pg_sys::Datum {
    // SAFETY: our caller's frames are plain (this function's contract) and `body` is moved into
    // the guard, so only trivially-deallocated frames lie above it; main thread.
    let outcome = unsafe { pg_sys::submodules::panic::pgrx_extern_c_guard(body) };
    match outcome {
        Ok(d) => d,
        // SAFETY: we are outside the guard again, in the entry point's frame; `outcome` was
        // moved into `e`, which `raise` consumes, so no value with a destructor is left here or
        // in the callers (this function's contract).
        Err(e) => unsafe { raise(e, Raiser::Function(fcinfo)) },
    }
}

macro_rules! v1_finfo {
    ($finfo:ident) => {
        #[unsafe(no_mangle)]
        #[doc(hidden)]
        pub extern "C" fn $finfo() -> &'static pg_sys::Pg_finfo_record {
            const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
            &V1
        }
    };
}

v1_finfo!(pg_finfo_pg_fencing_ddl_start);
/// `_pg_fencing.on_ddl_start() RETURNS event_trigger` (`ddl_command_start`): before the commands
/// `pg/event_trigger.rs` reads (see `sql/pg_fencing.sql`), refuses to drop pg_fencing, also with
/// its schema or its owner's objects, while tables are protected (`2BP01`: it would delete every
/// high-water mark and tombstone); raises the tombstone floor of per-row protections whose
/// partitions are dropped; refuses retyping a token column (`55000`).
///
/// SQL: `_pg_fencing.on_ddl_start() RETURNS event_trigger VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_ddl_start(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    use crate::pg::event_trigger::DdlStart;
    use crate::state::protections::{self, Dropping};
    // SAFETY: `fcinfo` is the function manager's for this call, as `ddl_start` requires.
    // This frame holds nothing but `fcinfo`, as `run` requires.
    unsafe {
        run(fcinfo, || {
            let none = pg_sys::Datum::from(0usize);
            let Some(command) = crate::pg::event_trigger::ddl_start(fcinfo) else {
                return Ok(none);
            };
            let home = || protections::extension_home();
            let drops_extension = match &command {
                DdlStart::DropExtensions(names) => names.iter().any(|n| n == "pg_fencing"),
                DdlStart::DropSchemas(schemas) => {
                    home().is_some_and(|(nsp, _)| schemas.contains(&nsp))
                }
                DdlStart::DropOwned(roles) => {
                    home().is_some_and(|(_, owner)| roles.contains(&owner))
                }
                _ => false,
            };
            if drops_extension {
                let Some(tables) = protections::protected_tables() else {
                    return Ok(none);
                };
                let how = match command {
                    DdlStart::DropSchemas(_) => " (with its schema)",
                    DdlStart::DropOwned(_) => " (with the objects of its owner)",
                    _ => "",
                };
                return Err(FenceError::DependentObjects(crate::error::Text {
                    message: format!("cannot drop extension pg_fencing{how} while tables are protected"),
                    detail: Some(format!(
                        "Protected: {tables}. Dropping the extension would delete their high-water marks and tombstones."
                    )),
                    hint: Some("Run SELECT fencing_unprotect(...) for each table first.".into()),
                }));
            }
            match command {
                DdlStart::DropExtensions(_) => {}
                DdlStart::DropTables(tables) => protections::before_drop(Dropping::Tables, &tables),
                DdlStart::DropSchemas(schemas) => {
                    protections::before_drop(Dropping::Schemas, &schemas)
                }
                DdlStart::DropOwned(roles) => protections::before_drop(Dropping::OwnedBy, &roles),
                DdlStart::AlterColumnTypes(relation, columns) => {
                    for column in &columns {
                        protections::before_retype(relation, column);
                    }
                }
            }
            Ok(none)
        })
    }
}

v1_finfo!(pg_finfo_fencing_guard);
/// `fencing_guard() RETURNS trigger`: the guard trigger of protected tables (see `guard/trigger.rs`).
///
/// SQL: `@extschema@.fencing_guard() RETURNS trigger VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn fencing_guard(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is the function manager's (this function's contract), as
    // `TriggerEvent::from_call` requires; the event lives only inside this call. This frame
    // holds nothing but `fcinfo`, as `run` requires.
    unsafe {
        run(fcinfo, || match TriggerEvent::from_call(fcinfo) {
            Some(event) => trigger::fire(event),
            None => Err(FenceError::TriggerProtocol(
                "fencing_guard() can only be called as a trigger".into(),
            )),
        })
    }
}

v1_finfo!(pg_finfo_pg_fencing_stamp_row);
/// `_pg_fencing.stamp_row(old_token bigint, relation oid, protection bigint, token_column text,
/// VARIADIC key "any") RETURNS bigint`: the UPDATE fast path's per-row check (see
/// `guard/fast_path.rs`), placed in an UPDATE's SET list by the planner hook.
///
/// SQL: `_pg_fencing.stamp_row(old_token bigint, relation oid, protection bigint, token_column text, VARIADIC key "any") RETURNS bigint VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention) on the backend's main thread, with
/// the call's own `fcinfo` for the signature declared in `sql/pg_fencing.sql`.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_stamp_row(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is the function manager's for this call (this function's contract), as
    // `StampCall::new` and `stamp_result` require; this frame holds nothing but `fcinfo`.
    unsafe {
        run(fcinfo, || {
            let call = crate::pg::plan::StampCall::new(fcinfo);
            crate::guard::fast_path::stamp_row(&call).map(|t| stamp_result(fcinfo, t))
        })
    }
}

v1_finfo!(pg_finfo_pg_fencing_stamp_resource);
/// `_pg_fencing.stamp_resource(old_token bigint, relation oid, protection bigint, resource text,
/// token_column text) RETURNS bigint`: the UPDATE fast path's resource-mode row check (see
/// `guard/fast_path.rs`).
///
/// SQL: `_pg_fencing.stamp_resource(old_token bigint, relation oid, protection bigint, resource text, token_column text) RETURNS bigint VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// As `pg_fencing_stamp_row`.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_stamp_resource(
    fcinfo: FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: as in `pg_fencing_stamp_row`.
    unsafe {
        run(fcinfo, || {
            let call = crate::pg::plan::StampCall::new(fcinfo);
            crate::guard::fast_path::stamp_resource(&call).map(|t| stamp_result(fcinfo, t))
        })
    }
}

v1_finfo!(pg_finfo_pg_fencing_drop_row);
/// `_pg_fencing.drop_row(old_token bigint, relation oid, protection bigint, token_column text,
/// row_table oid, row_id tid, VARIADIC key "any") RETURNS bigint`: the DELETE fast path's per-row
/// check (see `guard/fast_path.rs`), made a junk column of the plan under a DELETE by the planner
/// hook.
///
/// SQL: `_pg_fencing.drop_row(old_token bigint, relation oid, protection bigint, token_column text, row_table oid, row_id tid, VARIADIC key "any") RETURNS bigint VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// As `pg_fencing_stamp_row`.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_drop_row(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: as in `pg_fencing_stamp_row`.
    unsafe {
        run(fcinfo, || {
            let call = crate::pg::plan::StampCall::new(fcinfo);
            crate::guard::fast_path::drop_row(&call).map(|t| stamp_result(fcinfo, t))
        })
    }
}

v1_finfo!(pg_finfo_pg_fencing_insert_row);
/// `_pg_fencing.insert_row(new_token bigint, relation oid, protection bigint, token_column text,
/// VARIADIC key "any") RETURNS bigint`: the INSERT fast path's per-row key check (see
/// `guard/fast_path.rs`), made an INSERT's RETURNING list by the planner hook.
///
/// SQL: `_pg_fencing.insert_row(new_token bigint, relation oid, protection bigint, token_column text, VARIADIC key "any") RETURNS bigint VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// As `pg_fencing_stamp_row`.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_insert_row(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: as in `pg_fencing_stamp_row`.
    unsafe {
        run(fcinfo, || {
            let call = crate::pg::plan::StampCall::new(fcinfo);
            crate::guard::fast_path::insert_row(&call).map(|t| stamp_result(fcinfo, t))
        })
    }
}

v1_finfo!(pg_finfo_pg_fencing_stamp_insert);
/// `_pg_fencing.stamp_insert(value bigint, relation oid, protection bigint, resource text,
/// token_column text) RETURNS bigint`: the INSERT fast path's row check (see
/// `guard/fast_path.rs`), made the token column's value by the planner hook.
///
/// SQL: `_pg_fencing.stamp_insert(value bigint, relation oid, protection bigint, resource text, token_column text) RETURNS bigint VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// As `pg_fencing_stamp_row`.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_stamp_insert(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: as in `pg_fencing_stamp_row`.
    unsafe {
        run(fcinfo, || {
            let call = crate::pg::plan::StampCall::new(fcinfo);
            crate::guard::fast_path::stamp_insert(&call).map(|t| stamp_result(fcinfo, t))
        })
    }
}

v1_finfo!(pg_finfo_pg_fencing_stamp_default);
/// `_pg_fencing.stamp_default() RETURNS bigint`: the token column's default on a table of the
/// set-based shape: the token of the admitted COPY running now, else the writer's token (NULL
/// without one, and in replica mode; see `guard/copy_from.rs`). STABLE, so that COPY keeps its
/// multi-row inserts.
///
/// SQL: `_pg_fencing.stamp_default() RETURNS bigint STABLE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// As `pg_fencing_stamp_row`.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_stamp_default(
    fcinfo: FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: as in `pg_fencing_stamp_row`.
    unsafe {
        run(fcinfo, || {
            crate::guard::copy_from::stamp_default().map(|t| stamp_result(fcinfo, t))
        })
    }
}

v1_finfo!(pg_finfo_pg_fencing_citus_stamp);
/// `_pg_fencing.citus_stamp(protection bigint) RETURNS bigint`: the check of the Citus shape,
/// evaluated by Citus on the coordinator (see `guard/citus.rs`); returns the token to stamp.
///
/// SQL: `_pg_fencing.citus_stamp(protection bigint) RETURNS bigint STABLE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// As `pg_fencing_stamp_row`.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_citus_stamp(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: as in `pg_fencing_stamp_row`.
    unsafe {
        run(fcinfo, || {
            let call = crate::pg::plan::StampCall::new(fcinfo);
            crate::guard::citus::stamp(&call).map(|t| stamp_result(fcinfo, t))
        })
    }
}

v1_finfo!(pg_finfo_pg_fencing_insert_check_due);
/// `_pg_fencing.insert_check_due(protection bigint) RETURNS boolean`: the WHEN clause of the
/// AFTER INSERT row trigger of a table of the set-based shape: false only for the rows of the
/// COPY admitted into it (see `guard/copy_from.rs`).
///
/// SQL: `_pg_fencing.insert_check_due(protection bigint) RETURNS boolean VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// As `pg_fencing_stamp_row`.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_insert_check_due(
    fcinfo: FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: as in `pg_fencing_stamp_row`.
    unsafe {
        run(fcinfo, || {
            let call = crate::pg::plan::StampCall::new(fcinfo);
            let protection = call.bigint(0).unwrap_or(0);
            Ok(pg_sys::Datum::from(
                crate::guard::copy_from::insert_check_due(protection),
            ))
        })
    }
}

v1_finfo!(pg_finfo_pg_fencing_copy_key);
/// `_pg_fencing.copy_key(VARIADIC key "any") RETURNS boolean`: notes a row's key for the
/// per-row COPY admitted into a table of the set-based shape (added to its WHERE clause; see
/// `guard/copy_from.rs`). Always true.
///
/// SQL: `_pg_fencing.copy_key(VARIADIC key "any") RETURNS boolean STABLE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// As `pg_fencing_stamp_row`.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_copy_key(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: as in `pg_fencing_stamp_row`.
    unsafe {
        run(fcinfo, || {
            let call = crate::pg::plan::StampCall::new(fcinfo);
            crate::guard::copy_from::note_key(&call).map(pg_sys::Datum::from)
        })
    }
}

v1_finfo!(pg_finfo_pg_fencing_copy_token);
/// `_pg_fencing.copy_token(value bigint) RETURNS boolean`: a row of the COPY admitted into a
/// table of the set-based shape gives its token column `value`: true if that is the writer's
/// token, else 22023 (added to its WHERE clause; see `guard/copy_from.rs`).
///
/// SQL: `_pg_fencing.copy_token(value bigint) RETURNS boolean STABLE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// As `pg_fencing_stamp_row`.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_copy_token(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: as in `pg_fencing_stamp_row`.
    unsafe {
        run(fcinfo, || {
            let call = crate::pg::plan::StampCall::new(fcinfo);
            crate::guard::copy_from::check_token(call.bigint(0)).map(pg_sys::Datum::from)
        })
    }
}

v1_finfo!(pg_finfo_pg_fencing_preloaded);
/// `_pg_fencing.preloaded() RETURNS boolean`: was the library preloaded into this backend
/// (`shared_preload_libraries`)? The set-based shape needs it (`fencing_protect`,
/// `_pg_fencing.inactive_reason`).
///
/// SQL: `_pg_fencing.preloaded() RETURNS boolean STABLE CALLED ON NULL INPUT PARALLEL SAFE`
///
/// # Safety
/// As `pg_fencing_stamp_row`.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_preloaded(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: as in `pg_fencing_stamp_row`.
    unsafe {
        run(fcinfo, || {
            Ok(pg_sys::Datum::from(crate::pg::process::preloaded()))
        })
    }
}

v1_finfo!(pg_finfo_pg_fencing_stamp_insert_key);
/// `_pg_fencing.stamp_insert_key(value bigint, relation oid, protection bigint, token_column text,
/// VARIADIC key "any") RETURNS bigint`: a one-row per-row INSERT's row check and key note (see
/// `guard/fast_path.rs`), made the token column's value by the planner hook.
///
/// SQL: `_pg_fencing.stamp_insert_key(value bigint, relation oid, protection bigint, token_column text, VARIADIC key "any") RETURNS bigint VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// As `pg_fencing_stamp_row`.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_stamp_insert_key(
    fcinfo: FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: as in `pg_fencing_stamp_row`.
    unsafe {
        run(fcinfo, || {
            let call = crate::pg::plan::StampCall::new(fcinfo);
            crate::guard::fast_path::stamp_insert_key(&call).map(|t| stamp_result(fcinfo, t))
        })
    }
}

/// The bigint result of a stamping call (NULL for `None`).
///
/// # Safety
/// `fcinfo` must be the running call's.
unsafe fn stamp_result(fcinfo: FunctionCallInfo, token: Option<i64>) -> pg_sys::Datum {
    match token {
        Some(t) => pg_sys::Datum::from(t),
        // SAFETY: the call's own fcinfo (this function's contract).
        None => unsafe { pgrx::fcinfo::pg_return_null(fcinfo) },
    }
}

v1_finfo!(pg_finfo_pg_fencing_mark_changed);
/// `_pg_fencing.mark_changed() RETURNS trigger`: the row trigger of
/// `_pg_fencing.resource_high_water` that bumps the versions of changed marks (see
/// `state/mark_versions.rs`).
///
/// SQL: `_pg_fencing.mark_changed() RETURNS trigger VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_mark_changed(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is the function manager's (this function's contract), as
    // `TriggerEvent::from_call` requires; the event lives only inside this call. This frame
    // holds nothing but `fcinfo`, as `run` requires.
    unsafe {
        run(fcinfo, || match TriggerEvent::from_call(fcinfo) {
            Some(event) => crate::state::mark_versions::on_mark_row(event),
            None => Err(FenceError::TriggerProtocol(
                "_pg_fencing.mark_changed() can only be called as a trigger".into(),
            )),
        })
    }
}

/// The three steps of a `fenced_*` call (see `api/fenced.rs`). The statement runs in this frame,
/// outside pgrx's guard, so that its errors keep their SQLSTATE; only plain data is alive here.
///
/// # Safety
/// As for `run`: only from a `fenced_*` C entry point, with that call's own `fcinfo`.
#[track_caller]
unsafe fn fenced_call(fcinfo: FunctionCallInfo, op: fenced::Op) -> pg_sys::Datum {
    // SAFETY: the calling entry point's frame holds only `fcinfo` (this function's contract), and
    // this one only `Copy` data (`Prepared` is plain data by design) and `c_int`s, so every
    // longjmp out of here (an error raised by `raise` or inside the unguarded statement) skips
    // no destructor. `prepare` and `finish` run inside pgrx's guard with the call's own `fcinfo`;
    // `finish` gets the `Prepared` of this call's `prepare` and the result of its `execute`,
    // which runs in this frame as `execute` requires.
    unsafe {
        let prepared =
            pg_sys::submodules::panic::pgrx_extern_c_guard(|| fenced::prepare(fcinfo, op));
        let mut prepared = match prepared {
            Ok(p) => p,
            Err(e) => raise(e, Raiser::Function(fcinfo)),
        };
        let rc = fenced::execute(&mut prepared);
        run(fcinfo, || fenced::finish(fcinfo, op, prepared, rc))
    }
}

v1_finfo!(pg_finfo_fenced_update);
/// `fenced_update(relation regclass, key jsonb, changes jsonb, token bigint) RETURNS jsonb`.
///
/// SQL: `@extschema@.fenced_update(relation regclass, key jsonb, changes jsonb, token bigint) RETURNS jsonb VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn fenced_update(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: this function's contract is what `fenced_call` requires; only `fcinfo` is alive.
    unsafe { fenced_call(fcinfo, fenced::Op::Update) }
}

v1_finfo!(pg_finfo_fenced_insert);
/// `fenced_insert(relation regclass, new_row jsonb, token bigint) RETURNS jsonb`.
///
/// SQL: `@extschema@.fenced_insert(relation regclass, new_row jsonb, token bigint) RETURNS jsonb VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn fenced_insert(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: this function's contract is what `fenced_call` requires; only `fcinfo` is alive.
    unsafe { fenced_call(fcinfo, fenced::Op::Insert) }
}

v1_finfo!(pg_finfo_fenced_delete);
/// `fenced_delete(relation regclass, key jsonb, token bigint) RETURNS jsonb`.
///
/// SQL: `@extschema@.fenced_delete(relation regclass, key jsonb, token bigint) RETURNS jsonb VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn fenced_delete(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: this function's contract is what `fenced_call` requires; only `fcinfo` is alive.
    unsafe { fenced_call(fcinfo, fenced::Op::Delete) }
}

v1_finfo!(pg_finfo_fencing_advance);
/// `fencing_advance(resource text, token bigint) RETURNS bigint`: a new lock holder announces
/// its token before it reads, so older holders are fenced off at once (not only when the new
/// holder first writes). Raises the resource's high-water mark to `token` and returns the mark.
/// The mark is durable before the call's transaction commits, whatever `synchronous_commit`
/// says (`pg::process::make_commit_durable`).
/// Errors: `FT001` if `token` is below the mark (this caller is itself a stale holder), `FT002`
/// for a NULL token, `22023` for a token <= 0 or an empty or NULL resource, `42501` unless the
/// caller is a superuser or may write (INSERT, UPDATE or DELETE) a table protected with
/// `resource`: advancing is as powerful as writing, since it fences off every older writer.
///
/// SQL: `@extschema@.fencing_advance(resource text, token bigint) RETURNS bigint VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn fencing_advance(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is the function manager's, for the declared signature (this function's
    // contract), so each `pg_getarg(fcinfo, i)` reads an argument that exists and has the SQL
    // type of its Rust type; superuser() and GetUserId-based checks run on the main thread inside the
    // call's transaction. This frame holds nothing but `fcinfo`, as `run` requires.
    unsafe {
        run(fcinfo, || {
            let resource: Option<String> = pgrx::fcinfo::pg_getarg(fcinfo, 0);
            let tok: Option<i64> = pgrx::fcinfo::pg_getarg(fcinfo, 1);
            let resource = match resource {
                Some(r) if !r.is_empty() => r,
                _ => {
                    return Err(FenceError::InvalidArgument(
                        "resource must be a non-empty name".into(),
                    ))
                }
            };
            let tok = match tok {
                Some(t) => error::token_from_bigint(t)?,
                None => {
                    return Err(FenceError::NoToken {
                        target: format!("fencing_advance of resource \"{resource}\""),
                        ignored: None,
                        restoring: false,
                    })
                }
            };
            if !pg_sys::superuser() && !crate::state::privileges::may_write_resource(&resource) {
                return Err(FenceError::NotAllowed(crate::error::Text {
                    message: format!("permission denied to advance resource \"{resource}\""),
                    detail: Some("fencing_advance needs INSERT, UPDATE or DELETE privilege on a table protected with this resource (it can fence off every writer of that resource).".into()),
                    hint: Some("Protect a table with this resource (fencing_protect) and grant write privileges on it, or call fencing_advance as a superuser.".into()),
                }));
            }
            let tok = rule::admit_token(tok)?;
            let hw = rule::admit_resource(&resource, tok, true)?;
            crate::pg::process::make_commit_durable();
            Ok(pg_sys::Datum::from(hw))
        })
    }
}

v1_finfo!(pg_finfo_pg_fencing_lock_resource);
/// `_pg_fencing.lock_resource(resource text) RETURNS bigint`: takes the resource's exclusive lock
/// until the end of the transaction and returns its current mark (NULL if none). Used by
/// `fencing_reset`; not granted to PUBLIC.
///
/// SQL: `_pg_fencing.lock_resource(resource text) RETURNS bigint VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_lock_resource(
    fcinfo: FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is the function manager's, for the declared signature (this function's
    // contract), so each `pg_getarg(fcinfo, i)` reads an argument that exists and has the SQL
    // type of its Rust type. This frame holds nothing but `fcinfo`, as `run` requires.
    unsafe {
        run(fcinfo, || {
            let resource: Option<String> = pgrx::fcinfo::pg_getarg(fcinfo, 0);
            let resource = resource
                .ok_or_else(|| FenceError::InvalidArgument("resource must not be NULL".into()))?;
            match rule::lock_resource_exclusive(&resource) {
                Some(hw) => Ok(pg_sys::Datum::from(hw)),
                None => Ok(pgrx::fcinfo::pg_return_null(fcinfo)),
            }
        })
    }
}

/// 42501 unless the current user owns `relid` (or is a member of the owning role).
fn require_owner(relid: pg_sys::Oid) -> Result<(), FenceError> {
    // SAFETY: GetUserId only reads the backend's current user id (main thread, inside the
    // calling SQL function's transaction, where it is always set).
    let user = unsafe { pg_sys::GetUserId() };
    let owner = crate::pg::compat::owns_relation(relid, user);
    if owner {
        Ok(())
    } else {
        // SAFETY: syscache lookup by value inside a transaction; returns NULL (checked below)
        // for a missing relation, else a NUL-terminated name palloc'd in the current context.
        let name = unsafe { pg_sys::get_rel_name(relid) };
        let name = if name.is_null() {
            relid.to_u32().to_string()
        } else {
            // SAFETY: `name` is non-NULL here: get_rel_name's palloc'd, NUL-terminated copy,
            // alive until the memory context is reset, long after it is copied below.
            unsafe { std::ffi::CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned()
        };
        Err(FenceError::NotAllowed(crate::error::Text::new(format!(
            "must be owner of table {name}"
        ))))
    }
}

v1_finfo!(pg_finfo_pg_fencing_register);
/// `_pg_fencing.register(relation regclass, resource text, token_column text) RETURNS bigint`:
/// records (or updates) a protection and returns its id. Owner only (`42501`); writes the
/// internal table as the extension owner.
///
/// SQL: `_pg_fencing.register(relation regclass, resource text, token_column text) RETURNS bigint VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_register(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is the function manager's, for the declared signature (this function's
    // contract), so each `pg_getarg(fcinfo, i)` reads an argument that exists and has the SQL
    // type of its Rust type. This frame holds nothing but `fcinfo`, as `run` requires.
    unsafe {
        run(fcinfo, || {
            let relid: pg_sys::Oid = pgrx::fcinfo::pg_getarg(fcinfo, 0)
                .ok_or_else(|| FenceError::InvalidArgument("relation must not be NULL".into()))?;
            require_owner(relid)?;
            let resource: Option<String> = pgrx::fcinfo::pg_getarg(fcinfo, 1);
            let column: Option<String> = pgrx::fcinfo::pg_getarg(fcinfo, 2);
            let column = column.ok_or_else(|| {
                FenceError::InvalidArgument("token_column must not be NULL".into())
            })?;
            if let Some(r) = resource.as_deref() {
                if !crate::state::privileges::may_join_resource(r, relid) {
                    return Err(FenceError::NotAllowed(crate::error::Text {
                        message: format!("permission denied to protect a table with resource \"{r}\""),
                        detail: Some("The resource is in use (it guards other tables or has a high-water mark), and a table protected with it can raise its mark for all of them.".into()),
                        hint: Some("Use a resource of your own, or get INSERT, UPDATE or DELETE privilege on a table already protected with this resource (or ask a superuser).".into()),
                    }));
                }
            }
            let mut args = [
                pg_sys::Datum::from(relid),
                crate::pg::spi::text_datum(resource.as_deref().unwrap_or("")),
                crate::pg::spi::text_datum(&column),
            ];
            let nulls_resource = resource.is_none();
            let sql = if nulls_resource {
                "INSERT INTO _pg_fencing.protected_table AS p (relid, resource, token_column) \
                 VALUES ($1, NULL, $3::name) ON CONFLICT (relid) DO UPDATE \
                 SET resource = NULL, token_column = excluded.token_column, protected = true \
                 RETURNING id"
            } else {
                "INSERT INTO _pg_fencing.protected_table AS p (relid, resource, token_column) \
                 VALUES ($1, $2, $3::name) ON CONFLICT (relid) DO UPDATE \
                 SET resource = excluded.resource, token_column = excluded.token_column, protected = true \
                 RETURNING id"
            };
            let id = crate::pg::spi::exec_internal(
                sql,
                false,
                &[pg_sys::REGCLASSOID, pg_sys::TEXTOID, pg_sys::TEXTOID],
                &mut args,
                false,
                |d| d.value() as i64,
            );
            if nulls_resource && id.is_some() {
                crate::state::protections::feed_protection(relid);
            }
            id.map(pg_sys::Datum::from).ok_or_else(|| {
                FenceError::InvalidArgument("could not record the protection".into())
            })
        })
    }
}

v1_finfo!(pg_finfo_pg_fencing_unregister);
/// `_pg_fencing.unregister(relation regclass) RETURNS boolean`: marks a protection as removed
/// (its id, and so its tombstones, are kept for a later `fencing_protect`). Owner only (`42501`).
///
/// SQL: `_pg_fencing.unregister(relation regclass) RETURNS boolean VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_unregister(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is the function manager's, for the declared signature (this function's
    // contract), so each `pg_getarg(fcinfo, i)` reads an argument that exists and has the SQL
    // type of its Rust type. This frame holds nothing but `fcinfo`, as `run` requires.
    unsafe {
        run(fcinfo, || {
            let relid: pg_sys::Oid = pgrx::fcinfo::pg_getarg(fcinfo, 0)
                .ok_or_else(|| FenceError::InvalidArgument("relation must not be NULL".into()))?;
            require_owner(relid)?;
            let found = crate::pg::spi::exec_internal(
                "UPDATE _pg_fencing.protected_table SET protected = false WHERE relid = $1 AND protected RETURNING true",
                false,
                &[pg_sys::REGCLASSOID],
                &mut [pg_sys::Datum::from(relid)],
                false,
                |d| d.value() != 0,
            );
            Ok(pg_sys::Datum::from(found.unwrap_or(false)))
        })
    }
}

v1_finfo!(pg_finfo_fencing_prune_tombstones);
/// `fencing_prune_tombstones(relation regclass, floor bigint, max_tombstones bigint DEFAULT NULL)
/// RETURNS bigint`: per-row mode, raises the table's tombstone floor to `floor` and deletes its
/// tombstones at or below it (at most `max_tombstones`; NULL: all); returns how many were
/// deleted (`state::tombstones::prune`). Owner only (`42501`); `FT004` not protected; `22023`
/// resource mode, `floor <= 0` or `max_tombstones < 0`; `22004` NULL relation or floor.
///
/// SQL: `@extschema@.fencing_prune_tombstones(relation regclass, floor bigint, max_tombstones bigint DEFAULT NULL) RETURNS bigint VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn fencing_prune_tombstones(
    fcinfo: FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is the function manager's, for the declared signature (this function's
    // contract), so each `pg_getarg(fcinfo, i)` reads an argument that exists and has the SQL
    // type of its Rust type. This frame holds nothing but `fcinfo`, as `run` requires.
    unsafe {
        run(fcinfo, || {
            let null = |what: &str| {
                FenceError::NullArgument(error::Text::new(format!("{what} must not be NULL")))
            };
            let relid: pg_sys::Oid =
                pgrx::fcinfo::pg_getarg(fcinfo, 0).ok_or_else(|| null("relation"))?;
            let floor: i64 = pgrx::fcinfo::pg_getarg(fcinfo, 1).ok_or_else(|| null("floor"))?;
            let max: Option<i64> = pgrx::fcinfo::pg_getarg(fcinfo, 2);
            if floor <= 0 {
                return Err(FenceError::TokenNotPositive(floor.to_string()));
            }
            if let Some(m) = max.filter(|m| *m < 0) {
                return Err(FenceError::InvalidArgument(format!(
                    "max_tombstones must not be negative (got {m})"
                )));
            }
            crate::state::tombstones::require_table(relid)?;
            require_owner(relid)?;
            let deleted = crate::state::tombstones::prune(relid, floor, max, true)?;
            Ok(pg_sys::Datum::from(deleted.unwrap_or(0)))
        })
    }
}

v1_finfo!(pg_finfo_fencing_tombstone_retention);
/// `fencing_tombstone_retention(relation regclass, retention interval) RETURNS void`: per-row
/// mode, the automatic tombstone retention the pruner worker applies (`src/tombstone_retention.rs`);
/// NULL turns it off. Owner only (`42501`); `FT004` not protected; `22023` resource mode or a
/// retention that is not positive; `22004` NULL relation.
///
/// SQL: `@extschema@.fencing_tombstone_retention(relation regclass, retention interval) RETURNS void VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn fencing_tombstone_retention(
    fcinfo: FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is the function manager's, for the declared signature (this function's
    // contract), so each `pg_getarg(fcinfo, i)` reads an argument that exists and has the SQL
    // type of its Rust type, and `pg_getarg_datum(fcinfo, 1)` is the interval argument's datum
    // (valid for the call). This frame holds nothing but `fcinfo`, as `run` requires.
    unsafe {
        run(fcinfo, || {
            let relid: pg_sys::Oid = pgrx::fcinfo::pg_getarg(fcinfo, 0).ok_or_else(|| {
                FenceError::NullArgument(error::Text::new("relation must not be NULL".to_string()))
            })?;
            let retention: Option<pgrx::datum::Interval> = pgrx::fcinfo::pg_getarg(fcinfo, 1);
            if let Some(iv) = retention {
                let parts = [iv.months() as i64, iv.days() as i64, iv.micros()];
                if parts.iter().any(|p| *p < 0) || parts.iter().all(|p| *p == 0) {
                    return Err(FenceError::InvalidArgument(
                        "retention must be a positive interval (no negative part)".into(),
                    ));
                }
                // The pruner subtracts it from the current time: keep that a timestamp (100
                // years, counted as PostgreSQL counts interval months, 30 days).
                let days =
                    parts[0] as i128 * 30 + parts[1] as i128 + parts[2] as i128 / 86_400_000_000;
                if days > 36_000 {
                    return Err(FenceError::InvalidArgument(
                        "retention must be at most 100 years".into(),
                    ));
                }
            }
            crate::state::tombstones::require_table(relid)?;
            require_owner(relid)?;
            let datum = retention.and_then(|_| pgrx::fcinfo::pg_getarg_datum(fcinfo, 1));
            crate::state::tombstones::set_retention(relid, datum)?;
            Ok(pg_sys::Datum::from(0usize))
        })
    }
}

v1_finfo!(pg_finfo_fencing_acquire);
/// `fencing_acquire(lock_name text, timeout interval DEFAULT '10s') RETURNS bigint`: the
/// background worker takes etcd lock `pg_fencing.lock_prefix || lock_name` under a lease of its
/// own and returns the fencing token (the etcd revision at which the lock was granted); the token
/// also becomes this session's `pg_fencing.token`. Waits at most `timeout`, honouring query
/// cancel and `statement_timeout`. Errors: `55P03` timeout, `FT005` etcd unreachable, `FT003`
/// lease lost before the grant, `55000` worker not available (not preloaded, no endpoints),
/// `22023` bad name or timeout.
///
/// SQL: `@extschema@.fencing_acquire(lock_name text, timeout interval DEFAULT '10s') RETURNS bigint VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn fencing_acquire(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is the function manager's, for the declared signature (this function's
    // contract), so each `pg_getarg(fcinfo, i)` reads an argument that exists and has the SQL
    // type of its Rust type. This frame holds nothing but `fcinfo`, as `run` requires.
    unsafe {
        run(fcinfo, || {
            let name: Option<String> = pgrx::fcinfo::pg_getarg(fcinfo, 0);
            let timeout: Option<pgrx::datum::Interval> = pgrx::fcinfo::pg_getarg(fcinfo, 1);
            let name = name
                .ok_or_else(|| FenceError::InvalidArgument("lock_name must not be NULL".into()))?;
            let micros = match timeout {
                None => {
                    return Err(FenceError::InvalidArgument(
                        "timeout must not be NULL".into(),
                    ))
                }
                Some(iv) => {
                    iv.micros() as i128
                        + iv.days() as i128 * 86_400_000_000
                        + iv.months() as i128 * 30 * 86_400_000_000
                }
            };
            if !(0..=86_400_000_000 * 365).contains(&micros) {
                return Err(FenceError::InvalidArgument(
                    "timeout must be between 0 and 1 year".into(),
                ));
            }
            let token = crate::lock_service::etcd_locks::acquire(
                &name,
                std::time::Duration::from_micros(micros as u64),
            )?;
            crate::pg::guc::set_session_token(Some(token));
            Ok(pg_sys::Datum::from(token))
        })
    }
}

v1_finfo!(pg_finfo_pg_fencing_reset_lock_service);
/// `_pg_fencing.reset_lock_service() RETURNS void`: forget what the worker knew about etcd
/// (cluster id, highest revision, a revision regression); called by `fencing_reset`, not granted
/// to PUBLIC.
///
/// SQL: `_pg_fencing.reset_lock_service() RETURNS void VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_reset_lock_service(
    fcinfo: FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is the function manager's, for the declared signature (this function's
    // contract), so each `pg_getarg(fcinfo, i)` reads an argument that exists and has the SQL
    // type of its Rust type. This frame holds nothing but `fcinfo`, as `run` requires.
    unsafe {
        run(fcinfo, || {
            crate::lock_service::etcd_locks::reset_lock_service();
            Ok(pgrx::fcinfo::pg_return_void())
        })
    }
}

v1_finfo!(pg_finfo_pg_fencing_lock_service_problem);
/// `_pg_fencing.lock_service_problem() RETURNS text`: why the worker no longer hands out tokens
/// (etcd's revisions went backwards), or NULL.
///
/// SQL: `_pg_fencing.lock_service_problem() RETURNS text VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_lock_service_problem(
    fcinfo: FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is the function manager's, for the declared signature (this function's
    // contract), so each `pg_getarg(fcinfo, i)` reads an argument that exists and has the SQL
    // type of its Rust type. This frame holds nothing but `fcinfo`, as `run` requires.
    unsafe {
        run(
            fcinfo,
            || match crate::lock_service::etcd_locks::lock_service_problem() {
                Some(why) => Ok(crate::pg::spi::text_datum(&why)),
                None => Ok(pgrx::fcinfo::pg_return_null(fcinfo)),
            },
        )
    }
}

v1_finfo!(pg_finfo_fencing_watch);
/// `fencing_watch(resource text, lock_name text DEFAULT NULL, verify boolean DEFAULT false)`:
/// the background worker watches etcd lock `lock_name` (default: the resource's name) and raises
/// the resource's mark to the revision of every hand-over (see `lock_service/watch.rs`). Errors: `42501`
/// unless superuser or allowed to write a table protected with the resource, `55000` without the
/// worker, `22023` bad names, `53400` all 64 watch slots in use.
///
/// SQL: `@extschema@.fencing_watch(resource text, lock_name text DEFAULT NULL, verify boolean DEFAULT false) RETURNS void VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn fencing_watch(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is the function manager's, for the declared signature (this function's
    // contract), so each `pg_getarg(fcinfo, i)` reads an argument that exists and has the SQL
    // type of its Rust type. This frame holds nothing but `fcinfo`, as `run` requires.
    unsafe {
        run(fcinfo, || {
            let resource: Option<String> = pgrx::fcinfo::pg_getarg(fcinfo, 0);
            let lock: Option<String> = pgrx::fcinfo::pg_getarg(fcinfo, 1);
            let verify: Option<bool> = pgrx::fcinfo::pg_getarg(fcinfo, 2);
            let resource = resource
                .ok_or_else(|| FenceError::InvalidArgument("resource must not be NULL".into()))?;
            let lock = lock.unwrap_or_else(|| resource.clone());
            crate::lock_service::watch::watch(&resource, &lock, verify.unwrap_or(false))?;
            Ok(pgrx::fcinfo::pg_return_void())
        })
    }
}

v1_finfo!(pg_finfo_fencing_unwatch);
/// `fencing_unwatch(resource text) RETURNS boolean`: stops watching (true if it was watched).
/// The mark keeps what the watch raised it to: the hand-over revision is stored as the mark, and
/// that mark is durable before the call's transaction commits, whatever `synchronous_commit`
/// says (`pg::process::make_commit_durable`), since the watch itself is gone at once. Error: `42501` as for
/// `fencing_watch`.
///
/// SQL: `@extschema@.fencing_unwatch(resource text) RETURNS boolean VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn fencing_unwatch(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is the function manager's, for the declared signature (this function's
    // contract), so each `pg_getarg(fcinfo, i)` reads an argument that exists and has the SQL
    // type of its Rust type. This frame holds nothing but `fcinfo`, as `run` requires.
    unsafe {
        run(fcinfo, || {
            let resource: Option<String> = pgrx::fcinfo::pg_getarg(fcinfo, 0);
            let resource = resource
                .ok_or_else(|| FenceError::InvalidArgument("resource must not be NULL".into()))?;
            let was_watched = crate::lock_service::watch::unwatch(&resource)?;
            if was_watched {
                crate::pg::process::make_commit_durable();
            }
            Ok(pg_sys::Datum::from(was_watched))
        })
    }
}

v1_finfo!(pg_finfo_pg_fencing_watch_changed);
/// `_pg_fencing.watch_changed(resource text, lock_key_prefix text, verify boolean) RETURNS void`:
/// called by the row trigger of `_pg_fencing.watch` for each changed row (`lock_key_prefix` NULL:
/// the row is gone); the change reaches the worker when the transaction commits. Not granted to
/// PUBLIC.
///
/// SQL: `_pg_fencing.watch_changed(resource text, lock_key_prefix text, verify boolean) RETURNS void VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_watch_changed(
    fcinfo: FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is the function manager's, for the declared signature (this function's
    // contract), so each `pg_getarg(fcinfo, i)` reads an argument that exists and has the SQL
    // type of its Rust type. This frame holds nothing but `fcinfo`, as `run` requires.
    unsafe {
        run(fcinfo, || {
            let resource: Option<String> = pgrx::fcinfo::pg_getarg(fcinfo, 0);
            let prefix: Option<String> = pgrx::fcinfo::pg_getarg(fcinfo, 1);
            let verify: Option<bool> = pgrx::fcinfo::pg_getarg(fcinfo, 2);
            if let Some(r) = resource {
                crate::lock_service::watch::queue_change(
                    &r,
                    prefix.map(|p| (p, verify.unwrap_or(false))),
                );
            }
            Ok(pgrx::fcinfo::pg_return_void())
        })
    }
}

v1_finfo!(pg_finfo_pg_fencing_replicated_row);
/// `_pg_fencing.replicated_row() RETURNS boolean`: true in a logical replication worker (apply or
/// table sync) except while one of pg_fencing's own internal statements runs there. The REPLICA
/// triggers on `_pg_fencing`'s tables use it to tell rows that a subscription applies from the
/// subscriber's own bookkeeping (and from a superuser's session in replica mode).
///
/// SQL: `_pg_fencing.replicated_row() RETURNS boolean VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_replicated_row(
    fcinfo: FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is the function manager's, for the declared signature (this function's
    // contract), so each `pg_getarg(fcinfo, i)` reads an argument that exists and has the SQL
    // type of its Rust type; IsLogicalWorker only reads a backend-local global. This frame holds nothing but `fcinfo`, as `run` requires.
    unsafe {
        run(fcinfo, || {
            Ok(pg_sys::Datum::from(
                pg_sys::IsLogicalWorker() && !crate::pg::spi::internal_write(),
            ))
        })
    }
}

v1_finfo!(pg_finfo_pg_fencing_reset_watch);
/// `_pg_fencing.reset_watch(resource text, token bigint) RETURNS void`: `fencing_reset` of a
/// watched resource also sets its hand-over revision. Not granted to PUBLIC.
///
/// SQL: `_pg_fencing.reset_watch(resource text, token bigint) RETURNS void VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_reset_watch(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is the function manager's, for the declared signature (this function's
    // contract), so each `pg_getarg(fcinfo, i)` reads an argument that exists and has the SQL
    // type of its Rust type. This frame holds nothing but `fcinfo`, as `run` requires.
    unsafe {
        run(fcinfo, || {
            let resource: Option<String> = pgrx::fcinfo::pg_getarg(fcinfo, 0);
            let tok: Option<i64> = pgrx::fcinfo::pg_getarg(fcinfo, 1);
            if let (Some(r), Some(t)) = (resource, tok) {
                crate::lock_service::watch::reset(&r, t)?;
            }
            Ok(pgrx::fcinfo::pg_return_void())
        })
    }
}

v1_finfo!(pg_finfo_pg_fencing_watch_handover);
/// `_pg_fencing.watch_handover(resource text) RETURNS bigint`: the last hand-over revision of a
/// watched resource, NULL if none.
///
/// SQL: `_pg_fencing.watch_handover(resource text) RETURNS bigint VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_watch_handover(
    fcinfo: FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is the function manager's, for the declared signature (this function's
    // contract), so each `pg_getarg(fcinfo, i)` reads an argument that exists and has the SQL
    // type of its Rust type. This frame holds nothing but `fcinfo`, as `run` requires.
    unsafe {
        run(fcinfo, || {
            let resource: Option<String> = pgrx::fcinfo::pg_getarg(fcinfo, 0);
            match resource.map(|r| crate::lock_service::watch::handover(&r)) {
                Some(h) if h > 0 => Ok(pg_sys::Datum::from(h)),
                _ => Ok(pgrx::fcinfo::pg_return_null(fcinfo)),
            }
        })
    }
}

/// `fencing_watch_status()`: the rows of view `fencing_watches`: resource, etcd key prefix of
/// the lock, verify, hand-over revision, latest revision the watch has seen, age of that view in
/// milliseconds, status.
#[pg_extern(volatile)]
pub fn fencing_watch_status() -> TableIterator<
    'static,
    (
        name!(resource, String),
        name!(lock_key_prefix, String),
        name!(verify, bool),
        name!(handover_revision, Option<i64>),
        name!(latest_revision, Option<i64>),
        name!(view_age_ms, Option<i64>),
        name!(status, String),
    ),
> {
    TableIterator::new(crate::lock_service::watch::rows())
}

v1_finfo!(pg_finfo_fencing_release);
/// `fencing_release(lock_name text) RETURNS boolean`: releases a lock this session took with
/// `fencing_acquire` (true), or returns false if it holds no such lock, or had lost it (a
/// WARNING then says why; the lock's slot is freed either way). Clears `pg_fencing.token` if it
/// was this lock's token. Error: `55000` worker not available.
///
/// SQL: `@extschema@.fencing_release(lock_name text) RETURNS boolean VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn fencing_release(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is the function manager's, for the declared signature (this function's
    // contract), so each `pg_getarg(fcinfo, i)` reads an argument that exists and has the SQL
    // type of its Rust type. This frame holds nothing but `fcinfo`, as `run` requires.
    unsafe {
        run(fcinfo, || {
            let name: Option<String> = pgrx::fcinfo::pg_getarg(fcinfo, 0);
            let name = name
                .ok_or_else(|| FenceError::InvalidArgument("lock_name must not be NULL".into()))?;
            Ok(pg_sys::Datum::from(
                crate::lock_service::etcd_locks::release(&name)?,
            ))
        })
    }
}

/// `fencing_lock_status()`: the rows of view `fencing_locks`: locks of the background worker,
/// their etcd key, token, lease id, TTL left in seconds, state (`acquiring`, `held`, `lost`,
/// `releasing`, ...) and the holding backend's pid. Empty without `shared_preload_libraries`.
#[pg_extern(volatile)]
pub fn fencing_lock_status() -> TableIterator<
    'static,
    (
        name!(lock, String),
        name!(key, String),
        name!(token, Option<i64>),
        name!(lease_id, Option<i64>),
        name!(ttl_left, Option<f64>),
        name!(state, String),
        name!(pid, i32),
    ),
> {
    TableIterator::new(crate::lock_service::etcd_locks::lock_rows())
}

v1_finfo!(pg_finfo_pg_fencing_tombstone_key_hash);
/// `_pg_fencing.tombstone_key_hash(protection_id bigint, key text) RETURNS bigint` (STRICT):
/// the `row_tombstone.key_hash` of a tombstone of that per-row protection whose key prints as
/// `key`; NULL for a key identified by its text, an unknown protection, or text that is no key
/// of the table's key types (`pg/key_identity.rs`). For the SQL paths that write tombstones
/// (TRUNCATE, logical replication's apply, recomputation after a change of key types).
///
/// SQL: `_pg_fencing.tombstone_key_hash(protection_id bigint, key text) RETURNS bigint VOLATILE STRICT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_tombstone_key_hash(
    fcinfo: FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is the function manager's, for the declared signature (this function's
    // contract), so each `pg_getarg(fcinfo, i)` reads an argument that exists and has the SQL
    // type of its Rust type. This frame holds nothing but `fcinfo`, as `run` requires.
    unsafe {
        run(fcinfo, || {
            let protection: Option<i64> = pgrx::fcinfo::pg_getarg(fcinfo, 0);
            let key: Option<String> = pgrx::fcinfo::pg_getarg(fcinfo, 1);
            let hash = protection
                .zip(key)
                .and_then(|(p, k)| crate::state::tombstones::key_hash_of_text(p, &k));
            match hash {
                Some(h) => Ok(pg_sys::Datum::from(h)),
                None => Ok(pgrx::fcinfo::pg_return_null(fcinfo)),
            }
        })
    }
}

v1_finfo!(pg_finfo_pg_fencing_expand_tombstone_runs);
/// `_pg_fencing.expand_tombstone_runs(protection bigint) RETURNS bigint` (STRICT): this
/// transaction's pending tombstones written, then the tombstone runs of that per-row protection
/// turned into `row_tombstone` rows (`state/tombstone_runs.rs`); returns how many keys they held.
/// For the SQL paths that work on tombstones one by one (`fencing_protect` carrying a
/// partition's, a key form changed, the tombstone feed filled, `fencing_reset_rows`). Owner of
/// the protection's table only (`42501`; a protection without a table: superuser only); it
/// waits for a merge of the protection's runs in progress (`state/tombstone_runs.rs`).
///
/// SQL: `_pg_fencing.expand_tombstone_runs(protection bigint) RETURNS bigint VOLATILE STRICT PARALLEL UNSAFE`
///
/// # Safety
/// As `pg_fencing_tombstone_key_hash`.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_expand_tombstone_runs(
    fcinfo: FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: as in `pg_fencing_tombstone_key_hash` (one bigint argument).
    unsafe {
        run(fcinfo, || {
            let protection: Option<i64> = pgrx::fcinfo::pg_getarg(fcinfo, 0);
            let Some(protection) = protection else {
                return Ok(pg_sys::Datum::from(0i64));
            };
            // The owner of the protection's table (as for fencing_prune_tombstones); a
            // protection without a table, the superuser.
            match crate::state::tombstones::protected_relation(protection) {
                Some(relid) => require_owner(relid)?,
                None => {
                    // (superuser() reads the current user's role flags: main thread, inside the
                    // calling statement's transaction; this closure runs in the block above)
                    if !pg_sys::superuser() {
                        return Err(FenceError::NotAllowed(crate::error::Text::new(format!(
                            "only a superuser may expand the tombstone runs of protection {protection}, which has no table"
                        ))));
                    }
                }
            }
            let n = crate::state::tombstones::expand_runs(protection);
            Ok(pg_sys::Datum::from(n))
        })
    }
}

v1_finfo!(pg_finfo_pg_fencing_tombstone_key_hash_of);
/// `_pg_fencing.tombstone_key_hash_of(protection_id bigint, VARIADIC key "any") RETURNS bigint`:
/// the `row_tombstone.key_hash` of the key whose columns have these values; NULL for a key
/// identified by its text, an unknown protection, a NULL, or values not of the key's column types
/// (checked, so no hash function sees a value of another type). For TRUNCATE's tombstones, which
/// would otherwise parse each key's text (`state/tombstones.rs`, `truncate_rows`).
///
/// SQL: `_pg_fencing.tombstone_key_hash_of(protection_id bigint, VARIADIC key "any") RETURNS bigint VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_tombstone_key_hash_of(
    fcinfo: FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is the function manager's for this call (this function's contract), as
    // `StampCall::new` requires; the value lives only inside this call, whose frame holds
    // nothing else (as `run` requires).
    unsafe {
        run(fcinfo, || {
            let call = crate::pg::plan::StampCall::new(fcinfo);
            let hash = call
                .bigint(0)
                .and_then(|p| crate::state::tombstones::key_hash_of_values(p, &call.typed(1)));
            match hash {
                Some(h) => Ok(pg_sys::Datum::from(h)),
                None => Ok(pgrx::fcinfo::pg_return_null(fcinfo)),
            }
        })
    }
}

v1_finfo!(pg_finfo_pg_fencing_tombstone_key_text);
/// `_pg_fencing.tombstone_key_text(protection_id bigint, key text) RETURNS text` (STRICT): a
/// tombstone's key text printed again as a key of the table's current key types prints (after
/// a change of the key's types, `numeric` 5.0 is `int` 5); NULL for an unknown protection or
/// text that is no key of those types. For `_pg_fencing.rehash_tombstones`.
///
/// SQL: `_pg_fencing.tombstone_key_text(protection_id bigint, key text) RETURNS text VOLATILE STRICT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_tombstone_key_text(
    fcinfo: FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: as for `pg_fencing_tombstone_key_hash`; the text result is palloc'd by pgrx's
    // into_datum in the function's memory context, as the function manager expects.
    unsafe {
        run(fcinfo, || {
            let protection: Option<i64> = pgrx::fcinfo::pg_getarg(fcinfo, 0);
            let key: Option<String> = pgrx::fcinfo::pg_getarg(fcinfo, 1);
            let text = protection
                .zip(key)
                .and_then(|(p, k)| crate::state::tombstones::key_text_of_text(p, &k));
            match text {
                Some(t) => Ok(t.into_datum().unwrap_or(pg_sys::Datum::from(0usize))),
                None => Ok(pgrx::fcinfo::pg_return_null(fcinfo)),
            }
        })
    }
}

v1_finfo!(pg_finfo_pg_fencing_tombstone_key_signature);
/// `_pg_fencing.tombstone_key_signature(relation regclass) RETURNS text` (STRICT): what the
/// hashes of the table's tombstones depend on (its key columns' types and collations; NULL
/// without a primary key or table), compared with `protected_table.tombstone_key_signature` by
/// `_pg_fencing.rehash_tombstones`. Writes this transaction's pending tombstones first.
///
/// SQL: `_pg_fencing.tombstone_key_signature(relation regclass) RETURNS text VOLATILE STRICT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn pg_fencing_tombstone_key_signature(
    fcinfo: FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: as for `pg_fencing_tombstone_key_hash`; the text result is palloc'd by pgrx's
    // into_datum in the function's memory context, as the function manager expects.
    unsafe {
        run(fcinfo, || {
            let relid: Option<pg_sys::Oid> = pgrx::fcinfo::pg_getarg(fcinfo, 0);
            match relid.and_then(crate::state::tombstones::key_signature) {
                Some(s) => Ok(s.into_datum().unwrap_or(pg_sys::Datum::from(0usize))),
                None => Ok(pgrx::fcinfo::pg_return_null(fcinfo)),
            }
        })
    }
}

/// An interval argument's length in microseconds, counted as PostgreSQL counts interval months
/// (30 days) and days (24 hours); `22023` if any part is negative, it is longer than
/// `max_years` years (of 12 such months), or (unless `zero_ok`) it is zero; `22004` for NULL.
fn interval_argument(
    iv: Option<pgrx::datum::Interval>,
    what: &str,
    zero_ok: bool,
    max_years: i128,
) -> Result<i64, FenceError> {
    let iv = iv.ok_or_else(|| {
        FenceError::NullArgument(error::Text::new(format!("{what} must not be NULL")))
    })?;
    let parts = [iv.months() as i128, iv.days() as i128, iv.micros() as i128];
    if parts.iter().any(|p| *p < 0) {
        return Err(FenceError::InvalidArgument(format!(
            "{what} must not be negative (no negative part)"
        )));
    }
    let micros = parts[0] * 30 * 86_400_000_000 + parts[1] * 86_400_000_000 + parts[2];
    if micros == 0 && !zero_ok {
        return Err(FenceError::InvalidArgument(format!(
            "{what} must be positive"
        )));
    }
    if micros > max_years * 360 * 86_400_000_000 {
        return Err(FenceError::InvalidArgument(format!(
            "{what} must be at most {max_years} years"
        )));
    }
    Ok(micros as i64)
}

/// A lease name argument: not NULL (`22004`), not empty and at most 1024 bytes (`22023`; the
/// name is the key of a B-tree index, whose entries have a limit of their own).
fn lease_name_argument(name: Option<String>) -> Result<String, FenceError> {
    match name {
        None => Err(FenceError::NullArgument(error::Text::new(
            "name must not be NULL",
        ))),
        Some(n) if n.is_empty() => Err(FenceError::InvalidArgument(
            "name must be a non-empty lease name".into(),
        )),
        Some(n) if n.len() > 1024 => Err(FenceError::InvalidArgument(format!(
            "name must be at most 1024 bytes, not {}",
            n.len()
        ))),
        Some(n) => Ok(n),
    }
}

/// A lease token argument: not NULL (`22004`), positive (`22023`).
fn lease_token_argument(tok: Option<i64>) -> Result<i64, FenceError> {
    match tok {
        None => Err(FenceError::NullArgument(error::Text::new(
            "token must not be NULL",
        ))),
        Some(t) => error::token_from_bigint(t),
    }
}

v1_finfo!(pg_finfo_fencing_lease_acquire);
/// `fencing_lease_acquire(name text, ttl interval, wait interval DEFAULT '0') RETURNS bigint`:
/// grants PostgreSQL lease `name` for `ttl` by the database clock if it is free or its holder's
/// lease expired, and returns its fencing token; else waits up to `wait` (woken when the lease
/// is released or expires; query cancel, `statement_timeout` and postmaster death honoured).
/// Errors: `55P03` still held after `wait`; `22004` a NULL argument; `22023` an empty name or
/// one over 1024 bytes, a
/// `ttl` that is not positive or longer than 100 years, a negative `wait` or one longer than a
/// year; `25006` during recovery (lock_service/leases.rs).
///
/// SQL: `@extschema@.fencing_lease_acquire(name text, ttl interval, wait interval DEFAULT '0') RETURNS bigint VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn fencing_lease_acquire(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is the function manager's, for the declared signature (this function's
    // contract), so each `pg_getarg(fcinfo, i)` reads an argument that exists and has the SQL
    // type of its Rust type, and `pg_getarg_datum(fcinfo, 1)` is the ttl's interval datum, valid
    // for the call. This frame holds nothing but `fcinfo`, as `run` requires.
    unsafe {
        run(fcinfo, || {
            let name = lease_name_argument(pgrx::fcinfo::pg_getarg(fcinfo, 0))?;
            interval_argument(pgrx::fcinfo::pg_getarg(fcinfo, 1), "ttl", false, 100)?;
            let wait = interval_argument(pgrx::fcinfo::pg_getarg(fcinfo, 2), "wait", true, 1)?;
            let ttl = pgrx::fcinfo::pg_getarg_datum(fcinfo, 1)
                .ok_or_else(|| FenceError::Internal("ttl has no datum".into()))?;
            let token = crate::lock_service::leases::acquire(&name, ttl, (wait + 999) / 1000)?;
            Ok(pg_sys::Datum::from(token))
        })
    }
}

v1_finfo!(pg_finfo_fencing_lease_renew);
/// `fencing_lease_renew(token bigint, ttl interval DEFAULT NULL) RETURNS timestamptz`: extends
/// the live lease holding `token` to now plus `ttl` (NULL: the lease's own ttl; never shortened)
/// and returns the new expiry. Any session of a member of the acquiring role may renew. Errors: `FT003` the
/// lease expired, was released or was taken over; `42501` not a member of the acquiring role;
/// `22004`/`22023` as for acquire; `25006` during recovery.
///
/// SQL: `@extschema@.fencing_lease_renew(token bigint, ttl interval DEFAULT NULL) RETURNS timestamptz VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn fencing_lease_renew(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is the function manager's, for the declared signature (this function's
    // contract), so each `pg_getarg(fcinfo, i)` reads an argument that exists and has the SQL
    // type of its Rust type, and `pg_getarg_datum(fcinfo, 1)` is the ttl's interval datum (None
    // for NULL), valid for the call. This frame holds nothing but `fcinfo`, as `run` requires.
    unsafe {
        run(fcinfo, || {
            let tok = lease_token_argument(pgrx::fcinfo::pg_getarg(fcinfo, 0))?;
            let ttl: Option<pgrx::datum::Interval> = pgrx::fcinfo::pg_getarg(fcinfo, 1);
            let ttl = match ttl {
                None => None,
                Some(iv) => {
                    interval_argument(Some(iv), "ttl", false, 100)?;
                    pgrx::fcinfo::pg_getarg_datum(fcinfo, 1)
                }
            };
            let expires = crate::lock_service::leases::renew(tok, ttl)?;
            Ok(pg_sys::Datum::from(expires))
        })
    }
}

v1_finfo!(pg_finfo_fencing_lease_release);
/// `fencing_lease_release(token bigint) RETURNS boolean`: ends the lease holding `token`; true
/// if it was live, false if it had already ended. Waiters are woken when the release commits.
/// Errors: `42501` not a member of the acquiring role; `22004`/`22023` a NULL or non-positive
/// token; `25006` during recovery.
///
/// SQL: `@extschema@.fencing_lease_release(token bigint) RETURNS boolean VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn fencing_lease_release(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is the function manager's, for the declared signature (this function's
    // contract), so each `pg_getarg(fcinfo, i)` reads an argument that exists and has the SQL
    // type of its Rust type. This frame holds nothing but `fcinfo`, as `run` requires.
    unsafe {
        run(fcinfo, || {
            let tok = lease_token_argument(pgrx::fcinfo::pg_getarg(fcinfo, 0))?;
            let was_live = crate::lock_service::leases::release(tok)?;
            Ok(pg_sys::Datum::from(was_live))
        })
    }
}

v1_finfo!(pg_finfo_fencing_lease_check);
/// `fencing_lease_check(token bigint) RETURNS void`: `FT003` unless `token` is the token of a
/// live PostgreSQL lease (Chubby's CheckSequencer, for storage outside PostgreSQL). Errors also
/// `22004`/`22023` for a NULL or non-positive token.
///
/// SQL: `@extschema@.fencing_lease_check(token bigint) RETURNS void VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE`
///
/// # Safety
/// Called by PostgreSQL's function manager (V1 convention, see `pg_finfo_*`) on the backend's
/// main thread, with the call's own `fcinfo` for the signature declared in
/// `sql/pg_fencing.sql` (only a superuser can declare a C function).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn fencing_lease_check(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is the function manager's, for the declared signature (this function's
    // contract), so each `pg_getarg(fcinfo, i)` reads an argument that exists and has the SQL
    // type of its Rust type. This frame holds nothing but `fcinfo`, as `run` requires.
    unsafe {
        run(fcinfo, || {
            let tok = lease_token_argument(pgrx::fcinfo::pg_getarg(fcinfo, 0))?;
            crate::lock_service::leases::check_live(tok)?;
            Ok(pgrx::fcinfo::pg_return_void())
        })
    }
}
