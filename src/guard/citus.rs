//! The Citus shape (docs/citus.md, "How a distributed table is fenced"): a hash-distributed or
//! reference table protected in resource mode, fenced where Citus plans its writes.
//!
//! Citus plans every write to a distributed table on the node it enters and sends each shard its
//! own statement; it evaluates a statement's stable expressions once, on that node, and sends
//! the shards their values. So:
//! * **Coordinator, planner hook** (`plan_write`): an INSERT or UPDATE of such a table gets
//!   `_pg_fencing.citus_stamp(protection)` as its token column's value (replacing whatever the
//!   statement gave it; in an `INSERT … SELECT`, a subquery Citus runs on the coordinator:
//!   `WriteQuery::set_column`), a DELETE the condition `citus_stamp(protection) IS NOT NULL`; a
//!   MERGE is refused (`0A000`). `citus_stamp` (`stamp`) is the one check of the shape: the protection
//!   active (`FT004`), the session's token (`FT002`, `FT003`) admitted against the resource's mark
//!   under its lock, raised when higher (`FT001`), the same rule as every other path
//!   (`rule::admit_resource`). It is also the token column's default.
//! * **Coordinator, utility hook** (`begin_copy`, `truncate`): a COPY into such a table is
//!   checked once before it runs, and must leave the token column to its default (`0A000`
//!   otherwise: Citus's COPY has no per-row hook through which pg_fencing could overwrite a
//!   value); a TRUNCATE is checked as a write.
//! * **Every node, a write to a shard** (`check_write`: executor start of a statement whose
//!   result relations carry the marker, COPY, TRUNCATE): let through only the statement that
//!   Citus's own connection for a command started on the coordinator sent (which the coordinator
//!   checked), not one a function, trigger or foreign key action runs inside it; on the
//!   coordinator, any other write (Citus's local execution of a shard there, a write aimed at a
//!   shard directly) is checked itself; on a worker it is refused (`FT004`): a write entering
//!   at a worker, or aimed at a shard directly, is not checked there.
//! * The marker constraint that tells the hooks which relations these are is refused to
//!   `ALTER TABLE … DROP CONSTRAINT` and `RENAME CONSTRAINT` while its protection stands
//!   (`55000`; on a worker unless the coordinator sent it; `fencing_unprotect` removes it); the
//!   table cannot become a partition or an inheritance child (`0A000`), and a token column
//!   default other than `citus_stamp` makes the protection inactive (`citus_problem`, FT004).
//!
//! * **Coordinator, executor hook, Citus's table functions** (`table_calls_begin`,
//!   `table_calls_end`, `write_while_taken`): a table protected before Citus distributes or
//!   re-creates it loses its protection for the run of the statement that calls the function
//!   (nothing else in it; `0A000` otherwise) and gets it back, in the shape Citus left, when the
//!   run returns; a write to it in between that is not Citus's own is refused (`FT004`). A
//!   call's life: taken (before the DDL that removes the protection), named (the table's name,
//!   resource and token column known), ended (protected again), or rolled back with its
//!   (sub)transaction.
//! * **Coordinator, commit** (`at_commit`): a transaction that changed Citus's node table
//!   commits only if every active node preloads pg_fencing while a table has the Citus shape.
//!
//! Invariant: on every node, a write to a relation carrying the marker runs only after
//! `admit` admitted its token on the coordinator, in the same distributed transaction (whose
//! commit raises the mark), or is refused.

#![forbid(unsafe_code)]

use crate::backend_event::BackendEvent;
use crate::error::{FenceError, Text, Token};
use crate::pg::citus::{self, Marker, Node, WriteCommand, WriteQuery};
use crate::pg::plan;
use crate::pg::trigger_event::relation_name;
use crate::rule;
use pgrx::pg_sys;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::CString;

/// What this backend learnt of Citus and of the Citus shape's protections, until the next
/// relcache invalidation (every change of a protection of the Citus shape changes its table's
/// marker constraint, which invalidates the table's relcache entry in every backend; Citus
/// invalidates relcache entries when its metadata changes).
#[derive(Default)]
struct Known {
    /// The node this backend runs on.
    node: Option<Node>,
    /// The coordinator's node id.
    coordinator: Option<u64>,
    /// Relations with a marker: the Citus table (or its shell), or a shard.
    citus_tables: HashMap<u32, bool>,
    /// Protections: table, resource, token column.
    protections: HashMap<i64, (pg_sys::Oid, Option<String>, String)>,
    /// `_pg_fencing.citus_stamp(bigint)`.
    stamp_function: Option<pg_sys::Oid>,
    /// The COPY into a table of the Citus shape running now (`begin_copy`), if any.
    copying: Option<Copying>,
    /// Executors started for EXPLAIN without ANALYZE now (Citus evaluates a statement's
    /// functions for its plan then too): `citus_stamp` admits nothing there.
    explaining: u32,
    /// The protection, table and resource of the `citus_stamp` call site checked last
    /// (`StampCall::checked_for` says which site and user: each new site checks again).
    site: Option<(i64, pg_sys::Oid, String)>,
}

/// A COPY admitted by `begin_copy`: its rows' defaults (`citus_stamp`, evaluated for each row by
/// Citus's COPY on the coordinator) stamp the admitted token without checking it again, as a
/// COPY of one server is checked once (docs/design.md, "The set-based shape"). Not for a
/// statement that runs inside the COPY (`inner`: executors started since).
#[derive(Clone, Copy)]
struct Copying {
    protection: i64,
    token: Token,
    inner: u32,
}

/// A call of one of Citus's functions that distribute or re-create a table
/// (`citus::TABLE_FUNCTIONS`) on a protected table, running now: its statement (the executor's
/// QueryDesc, by address), subtransaction, and the table's name, resource and token column that
/// `table_calls_end` protects again once the statement's run returned.
struct TableCall {
    statement: usize,
    subxact: pg_sys::SubTransactionId,
    relid: pg_sys::Oid,
    call: Vec<String>,
}

thread_local! {
    static KNOWN: RefCell<Known> = RefCell::new(Known::default());
    /// Kept apart from `KNOWN`: the calls' own DDL invalidates relcache entries.
    static CALLS: RefCell<Vec<TableCall>> = const { RefCell::new(Vec::new()) };
    /// Relations whose relcache entries were invalidated in this transaction, up to
    /// `INVALIDATED_CAP` (`None`: more), for `at_commit` to tell whether Citus's node table
    /// changed.
    static INVALIDATED: RefCell<Option<Vec<pg_sys::Oid>>> = const { RefCell::new(Some(Vec::new())) };
}

/// The node this backend runs on (`citus::node`, once a transaction).
fn node() -> Node {
    if let Some(n) = KNOWN.with(|k| k.borrow().node) {
        return n;
    }
    let n = citus::node();
    KNOWN.with(|k| k.borrow_mut().node = Some(n));
    n
}

/// Is this backend one of Citus's connections for a command that started on the coordinator
/// (`citus::from_coordinator`, the coordinator's node id remembered)?
fn from_coordinator() -> bool {
    let id = KNOWN.with(|k| k.borrow().coordinator).unwrap_or_else(|| {
        let id = citus::coordinator_node_id();
        KNOWN.with(|k| k.borrow_mut().coordinator = Some(id));
        id
    });
    citus::from_coordinator(id)
}

/// Is `relid` the Citus table (or its shell) rather than a shard (`citus::is_citus_table`,
/// remembered until the transaction ends or the relcache is invalidated)?
fn is_citus_table(relid: pg_sys::Oid) -> bool {
    if let Some(b) = KNOWN.with(|k| k.borrow().citus_tables.get(&relid.to_u32()).copied()) {
        return b;
    }
    let b = citus::is_citus_table(relid);
    KNOWN.with(|k| {
        crate::cache::cache_insert(&mut k.borrow_mut().citus_tables, relid.to_u32(), b, 1_000)
    });
    b
}

/// Table, resource and token column of protection `protection` (`protections::protection_of`,
/// remembered until the next relcache invalidation).
fn protection_of(protection: i64) -> Option<(pg_sys::Oid, Option<String>, String)> {
    if let Some(p) = KNOWN.with(|k| k.borrow().protections.get(&protection).cloned()) {
        return Some(p);
    }
    let p = crate::state::protections::protection_of(protection)?;
    KNOWN.with(|k| {
        crate::cache::cache_insert(
            &mut k.borrow_mut().protections,
            protection,
            p.clone(),
            1_000,
        )
    });
    Some(p)
}

/// What each backend event clears: a relcache invalidation everything; the end of a
/// transaction or subtransaction the call site checked last.
pub fn on_event(ev: BackendEvent) {
    match ev {
        // A call's unprotect and its statement roll back together.
        BackendEvent::SubAbort(sub) => CALLS.with(|c| c.borrow_mut().retain(|t| t.subxact < sub)),
        e if e.ends_any_transaction() => {
            CALLS.with(|c| c.borrow_mut().clear());
            INVALIDATED.with(|i| *i.borrow_mut() = Some(Vec::new()));
        }
        // (A reset of every entry, `None`, comes from the shared invalidation queue overflowing,
        // never from this transaction's own changes, which name their relations.)
        BackendEvent::Relcache(Some(r)) => INVALIDATED.with(|i| {
            let mut i = i.borrow_mut();
            if let Some(v) = i.as_mut() {
                if v.len() >= INVALIDATED_CAP {
                    *i = None;
                } else if !v.contains(&r) {
                    v.push(r);
                }
            }
        }),
        _ => {}
    }
    match ev {
        BackendEvent::Relcache(_) => KNOWN.with(|k| *k.borrow_mut() = Known::default()),
        e if e.ends_any_transaction() || matches!(e, BackendEvent::SubAbort(_)) => {
            KNOWN.with(|k| {
                let mut k = k.borrow_mut();
                k.site = None;
                k.copying = None;
                k.explaining = 0;
            })
        }
        _ => {}
    }
}

/// How many invalidated relations a transaction remembers (`INVALIDATED`) before it assumes
/// any may have been Citus's node table.
const INVALIDATED_CAP: usize = 256;

/// The executor hook, as a run of statement `statement` starts: `calls` are the calls of Citus's
/// functions that distribute or re-create a table at its top (`citus::table_function_calls`),
/// `alone` whether the statement is nothing else (docs/citus.md, "Distributing a protected
/// table"). Each protected table they take loses its protection for the run
/// (`_pg_fencing.citus_table_call_begins`, which refuses per-row mode and
/// `create_distributed_table_concurrently` with `0A000`); `table_calls_end` protects it again,
/// in the shape Citus left it in, when the run returns. A statement that would run anything
/// else meanwhile (another expression, a FROM list, a condition) is refused (`0A000`) when it
/// takes a protected table. The DDL's locks hold to the end of the transaction, so no other
/// transaction sees the table between the two, and no other statement of this one runs
/// between them (a cursor's calls run and end in each FETCH); an error between them rolls both
/// back, and a commit with a call not ended fails (`at_commit`).
pub fn table_calls_begin(
    statement: usize,
    calls: &[(&'static str, pg_sys::Oid)],
    alone: bool,
) -> Result<(), FenceError> {
    for (function, relid) in calls {
        if !alone && crate::state::protections::protection_of_table(*relid).is_some() {
            return Err(FenceError::NotSupported(Text {
                message: format!(
                    "{function} of protected table {} must be a statement of its own",
                    relation_name(*relid)
                ),
                detail: Some("pg_fencing takes the protection off for the call and puts it back after it; nothing else may run in between.".into()),
                hint: Some(format!("Run SELECT {function}(...) with constant arguments, alone; docs/citus.md, \"Distributing a protected table\".")),
            }));
        }
        // Taken before the protection comes off: the DDL that removes it runs event triggers.
        let subxact = crate::pg::process::current_subxact();
        CALLS.with(|c| {
            c.borrow_mut().push(TableCall {
                statement,
                subxact,
                relid: *relid,
                call: Vec::new(),
            })
        });
        let begun = citus::table_call_begins(*relid, function)
            .map_err(|e| FenceError::Internal(format!("{function} of a protected table: {e}")))?;
        CALLS.with(|c| {
            let mut c = c.borrow_mut();
            match begun {
                Some(call) => {
                    if let Some(t) = c.last_mut() {
                        t.call = call;
                    }
                }
                None => {
                    c.pop();
                }
            }
        });
    }
    Ok(())
}

/// Has a table function's run a table's protection off now (`write_while_taken` has work)?
pub fn taking() -> bool {
    CALLS.with(|c| !c.borrow().is_empty())
}

/// Every write path (the executor's result relations, COPY FROM, TRUNCATE), while a table
/// function's run has a table's protection off (`table_calls_begin`): a write to that table, by
/// its OID or by its name (the table Citus re-created under it), is refused (`FT004`). Citus's
/// own statements in the call write the shards and the table it builds under another name; a
/// statement run in between by anything else (an event trigger on the call's DDL) is refused.
pub fn write_while_taken(relids: &[pg_sys::Oid]) -> Result<(), FenceError> {
    if !taking() || relids.is_empty() {
        return Ok(());
    }
    let taken: Vec<(pg_sys::Oid, String)> = CALLS.with(|c| {
        c.borrow()
            .iter()
            .map(|t| (t.relid, t.call.first().cloned().unwrap_or_default()))
            .collect()
    });
    for (relid, name) in taken {
        // (No name yet while the protection comes off: the table is still the one taken.)
        let now = (!name.is_empty())
            .then(|| citus::relid_of_name(&name))
            .flatten();
        if relids.iter().any(|r| *r == relid || Some(*r) == now) {
            let name = if name.is_empty() {
                relation_name(relid)
            } else {
                name
            };
            return Err(FenceError::NotProtected(Text {
                message: format!("protection of table {name} is not active"),
                detail: Some("a Citus function in this transaction has its protection off while it distributes or re-creates the table; a write to it now is not Citus's own".into()),
                hint: Some("Write the table once the call has returned; docs/citus.md, \"Distributing a protected table\".".into()),
            }));
        }
    }
    Ok(())
}

/// The executor hook, once a run of statement `statement` returned: the tables its calls took
/// are protected again (`_pg_fencing.citus_table_call_ends`).
pub fn table_calls_end(statement: usize) -> Result<(), FenceError> {
    loop {
        // Still taken while the protection goes back on (its DDL runs event triggers too).
        let next = CALLS.with(|c| {
            c.borrow()
                .iter()
                .position(|t| t.statement == statement)
                .map(|i| (i, c.borrow()[i].call.clone()))
        });
        let Some((_, call)) = next else {
            return Ok(());
        };
        citus::table_call_ends(call).map_err(|e| {
            FenceError::Internal(format!(
                "protecting a table again after a Citus function: {e}"
            ))
        })?;
        CALLS.with(|c| {
            let mut c = c.borrow_mut();
            if let Some(i) = c.iter().position(|t| t.statement == statement) {
                c.remove(i);
            }
        });
    }
}

/// At commit: a call whose run never returned (`table_calls_end` did not run) leaves its table
/// unprotected, so the commit fails instead (`55000`); and a transaction of a client on the
/// coordinator that changed Citus's node table (`pg_dist_node`: `citus_add_node`,
/// `citus_activate_node`, `citus_update_node` or any other way; Citus's own trigger invalidates
/// its relcache entry) commits only if every active node preloads pg_fencing while a table is
/// protected in the Citus shape (`_pg_fencing.citus_nodes_changed`, `55000`; docs/citus.md,
/// "Adding a node").
pub fn at_commit() -> Result<(), FenceError> {
    let pending = CALLS.with(|c| c.borrow().first().map(|t| t.call.first().cloned()));
    if let Some(name) = pending {
        return Err(FenceError::SchemaChangeRefused(Text::new(format!(
            "table {} was taken by a Citus function whose run did not return, and is not protected again",
            name.unwrap_or_default()
        ))));
    }
    // (A transaction that changed the node table wrote: one that did not is not asked.)
    if !citus::client_backend() || !citus::installed() || !citus::process_own_invalidations() {
        return Ok(());
    }
    let invalidated = INVALIDATED.with(|i| i.borrow().clone());
    let changed = match invalidated {
        None => true,
        Some(v) if v.is_empty() => false,
        Some(v) => citus::node_table().is_some_and(|n| v.contains(&n)),
    };
    if changed && crate::pg::process::extension_schema_exists() {
        citus::nodes_changed().map_err(|e| {
            FenceError::Internal(format!("checking the Citus nodes for pg_fencing: {e}"))
        })?;
    }
    Ok(())
}

/// The utility hook, once the COPY `begin_copy` admitted finished (or failed).
pub fn end_copy() {
    KNOWN.with(|k| k.borrow_mut().copying = None);
}

/// The executor hooks: a statement starts or ends (inside an admitted COPY: not the COPY's).
pub fn executor_started() {
    KNOWN.with(|k| {
        if let Some(c) = k.borrow_mut().copying.as_mut() {
            c.inner += 1;
        }
    });
}

/// The executor hook, around the start of a statement only explained (`on`), and after it.
pub fn explain_only(on: bool) {
    KNOWN.with(|k| {
        let mut k = k.borrow_mut();
        k.explaining = if on {
            k.explaining + 1
        } else {
            k.explaining.saturating_sub(1)
        };
    });
}

/// See `executor_started`.
pub fn executor_ended() {
    KNOWN.with(|k| {
        if let Some(c) = k.borrow_mut().copying.as_mut() {
            c.inner = c.inner.saturating_sub(1);
        }
    });
}

/// The planner hook, before Citus plans a write: an INSERT, UPDATE or DELETE of a table of the
/// Citus shape calls `citus_stamp` (see the module header). `Err` for a MERGE, or a marker
/// whose protection is gone.
pub fn plan_write(q: &mut WriteQuery) -> Result<(), FenceError> {
    let Some(relid) = q.target() else {
        return Ok(());
    };
    let Some(Marker { protection }) = citus::marker_of(relid) else {
        return Ok(());
    };
    if !is_citus_table(relid) {
        return Ok(()); // a shard (or a table taken back from Citus): `check_write`
    }
    if node() != Node::Coordinator {
        return Err(on_worker(Some(relid)));
    }
    let (table, _, column) = protection_of(protection)
        .filter(|(t, _, _)| *t == relid)
        .ok_or_else(|| lost_marker(relid, protection))?;
    let function = match KNOWN.with(|k| k.borrow().stamp_function) {
        Some(f) => f,
        None => {
            let f = plan::internal_function(c"citus_stamp").ok_or_else(|| {
                FenceError::Internal("_pg_fencing.citus_stamp(bigint) does not exist".into())
            })?;
            KNOWN.with(|k| k.borrow_mut().stamp_function = Some(f));
            f
        }
    };
    match q.command() {
        WriteCommand::Merge => Err(FenceError::NotSupported(Text {
            message: format!(
                "MERGE into protected Citus table {} is not supported",
                relation_name(relid)
            ),
            detail: Some(
                "pg_fencing fences a distributed table's INSERT, UPDATE, DELETE, COPY and TRUNCATE."
                    .into(),
            ),
            hint: Some("Write the MERGE as INSERT … ON CONFLICT, UPDATE or DELETE statements; docs/citus.md.".into()),
        })),
        WriteCommand::Delete => {
            q.add_condition(function, protection);
            Ok(())
        }
        WriteCommand::Insert | WriteCommand::Update => {
            let name = CString::new(column).unwrap_or_default();
            let attnum = plan::with_relation(relid, |rel| rel.bigint_column(&name).ok())
                .ok_or_else(|| lost_marker(table, protection))?;
            q.set_column(attnum, &name, function, protection);
            q.set_conflict_column(attnum, &name);
            Ok(())
        }
    }
}

/// `FT004`: the marker names a protection that is gone or another table's.
fn lost_marker(relid: pg_sys::Oid, protection: i64) -> FenceError {
    rule::inactive(
        &relation_name(relid),
        &format!(
            "its marker constraint zz_pg_fencing_citus_{protection} names no protection of the table, or its token column is missing; run fencing_protect again"
        ),
    )
}

/// The one check of the Citus shape, on the coordinator: protection `protection` active, the
/// session's token admitted against its resource's mark. Returns the token. `Err` on a worker.
fn admit(protection: i64) -> Result<Token, FenceError> {
    if node() != Node::Coordinator {
        return Err(on_worker(None));
    }
    let (relid, resource, _) =
        protection_of(protection).ok_or_else(|| no_protection(protection))?;
    let resource = resource.ok_or_else(|| lost_marker(relid, protection))?;
    admit_site(protection, relid, &resource)
}

/// `admit` once the protection's table and resource are known (on the coordinator).
fn admit_site(protection: i64, relid: pg_sys::Oid, resource: &str) -> Result<Token, FenceError> {
    rule::require_active(protection, &|| relation_name(relid))?;
    let token =
        rule::write_token(&|| format!("a write to protected table {}", relation_name(relid)))?;
    crate::guard::trigger::count_guarded();
    rule::admit_resource(resource, token, true)
}

/// `FT004`: a marker or default names protection `protection`, which is gone (the table was
/// unprotected, or taken back from Citus by `undistribute_table`).
fn no_protection(protection: i64) -> FenceError {
    rule::inactive(
        "a protected Citus table",
        &format!("protection {protection}, which its marker constraint or its token column's default names, no longer exists; run fencing_protect again, or remove them with fencing_unprotect"),
    )
}

/// `FT004`: a write to a table of the Citus shape that is not checked on this node.
fn on_worker(relid: Option<pg_sys::Oid>) -> FenceError {
    rule::inactive(
        &relid.map_or_else(|| "a protected Citus table".to_string(), relation_name),
        &format!(
            "writes to a protected Citus table are checked on the coordinator, and this one runs on a worker (application_name {:?}): it entered at a worker, was aimed at a shard directly, or is an INSERT … SELECT (DISTINCT, grouped …) whose rows and stamp Citus computes on the workers",
            citus::application_name()
        ),
    )
}

/// `_pg_fencing.citus_stamp(protection)`: `admit`, for a caller allowed to write the table. A
/// call site (one expression of one statement, such as a COPY's default evaluated for each row)
/// looks up its protection, node and privilege once per user; each call admits the token.
pub fn stamp(call: &plan::StampCall) -> Result<Option<Token>, FenceError> {
    let protection = call
        .bigint(0)
        .ok_or_else(|| FenceError::InvalidArgument("protection must not be NULL".into()))?;
    if KNOWN.with(|k| k.borrow().explaining) > 0 {
        return Ok(None); // EXPLAIN without ANALYZE: nothing is written
    }
    let copying = KNOWN.with(|k| k.borrow().copying);
    if let Some(c) = copying.filter(|c| c.protection == protection && c.inner == 0) {
        return Ok(Some(c.token));
    }
    let user = crate::pg::process::current_user();
    let known = KNOWN.with(|k| {
        k.borrow()
            .site
            .as_ref()
            .filter(|(p, _, _)| *p == protection)
            .map(|(_, relid, resource)| (*relid, resource.clone()))
    });
    let (relid, resource) = match known {
        Some(site) if call.checked_for() == user => site,
        _ => {
            if node() != Node::Coordinator {
                return Err(on_worker(None));
            }
            let (relid, resource, _) =
                protection_of(protection).ok_or_else(|| no_protection(protection))?;
            if !(plan::may_insert(relid) || plan::may_update(relid) || plan::may_delete(relid)) {
                return Err(FenceError::NotAllowed(Text::new(format!(
                    "permission denied for table {}",
                    relation_name(relid)
                ))));
            }
            let resource = resource.ok_or_else(|| lost_marker(relid, protection))?;
            KNOWN.with(|k| k.borrow_mut().site = Some((protection, relid, resource.clone())));
            call.set_checked_for(user);
            (relid, resource)
        }
    };
    admit_site(protection, relid, &resource).map(Some)
}

/// A write to relation `relid` about to run (a statement's result relation, a COPY's or a
/// TRUNCATE's table; `sent`: the statement the client sent, not one run inside it): if it
/// carries the marker, the rule of the module header. `Ok` for every other relation.
pub fn check_write(relid: pg_sys::Oid, sent: bool) -> Result<(), FenceError> {
    let Some(marker) = citus::marker_of(relid) else {
        return Ok(());
    };
    if is_citus_table(relid) && node() == Node::Coordinator {
        // The table itself, on the coordinator: its statement was planned with
        // `citus_stamp` (`plan_write`), which checks it.
        return Ok(());
    }
    // Citus's connection from the coordinator, and the statement it sent (not one that a
    // function, trigger or foreign key action of it runs: those the coordinator never checked).
    if sent && from_coordinator() {
        return Ok(());
    }
    match node() {
        Node::Coordinator => admit(marker.protection).map(|_| ()),
        Node::Worker => Err(on_worker(Some(relid))),
    }
}

/// The utility hook, before a `COPY … FROM` into relation `relid`: a table of the Citus shape
/// is checked once, and its token column must be left to its default, which stamps the admitted
/// token (`Copying`; `end_copy` when the COPY ended). A shard: `check_write`.
pub fn begin_copy(
    relid: pg_sys::Oid,
    sent: bool,
    names_column: &dyn Fn(&str) -> bool,
) -> Result<(), FenceError> {
    let Some(marker) = citus::marker_of(relid) else {
        return Ok(());
    };
    if !is_citus_table(relid) {
        return check_write(relid, sent);
    }
    if node() != Node::Coordinator {
        return Err(on_worker(Some(relid)));
    }
    let (_, _, column) = protection_of(marker.protection)
        .filter(|(t, _, _)| *t == relid)
        .ok_or_else(|| lost_marker(relid, marker.protection))?;
    if names_column(&column) {
        return Err(FenceError::NotSupported(Text {
            message: format!(
                "COPY into protected Citus table {} gives token column {column} values",
                relation_name(relid)
            ),
            detail: Some(
                "pg_fencing stamps the token column of a distributed table through its default; Citus's COPY gives no way to overwrite a value the COPY carries.".into(),
            ),
            hint: Some(format!(
                "List the COPY's columns without {column} (COPY t (a, b) FROM …); docs/citus.md."
            )),
        }));
    }
    if !(plan::may_insert(relid)) {
        return Ok(()); // COPY's own privilege check refuses it
    }
    let token = admit(marker.protection)?;
    KNOWN.with(|k| {
        k.borrow_mut().copying = Some(Copying {
            protection: marker.protection,
            token,
            inner: 0,
        })
    });
    Ok(())
}

/// The utility hook, before a `TRUNCATE` of `relids` (`cascade`: with the tables that reference
/// them): each table of the Citus shape (or shard) is a write (`check_write`; the table itself is
/// checked on the coordinator).
pub fn truncate(relids: &[pg_sys::Oid], cascade: bool, sent: bool) -> Result<(), FenceError> {
    // CASCADE empties the tables whose foreign keys reference these too.
    let all;
    let relids = if cascade && citus::installed() && node() == Node::Coordinator {
        all = citus::referencing_closure(relids);
        &all[..]
    } else {
        relids
    };
    for relid in relids {
        if citus::marker_of(*relid).is_some() && !is_citus_table(*relid) {
            check_write(*relid, sent)?;
        } else if let Some(Marker { protection }) = citus::marker_of(*relid) {
            if node() != Node::Coordinator {
                return Err(on_worker(Some(*relid)));
            }
            admit(protection)?;
        }
    }
    Ok(())
}

/// The utility hook, before an `ALTER TABLE … ATTACH PARTITION` or `INHERIT` that would make
/// `relid` a child of another table: refused (`0A000`) for a table of the Citus shape, whose
/// writes through the parent would not be checked.
pub fn becoming_child(relid: pg_sys::Oid) -> Result<(), FenceError> {
    if citus::marker_of(relid).is_none() {
        return Ok(());
    }
    Err(FenceError::NotSupported(Text {
        message: format!(
            "protected Citus table {} cannot become a partition or an inheritance child",
            relation_name(relid)
        ),
        detail: Some("Writes through the parent table would not be checked.".into()),
        hint: Some(
            "Remove the protection with fencing_unprotect(table) first; docs/citus.md.".into(),
        ),
    }))
}

/// The utility hook, before an `ALTER TABLE` that drops or renames marker `name` of `relid`:
/// refused (`55000`) while its protection stands (on a worker: unless the coordinator sent it).
pub fn touch_marker(relid: pg_sys::Oid, name: &str) -> Result<(), FenceError> {
    let Some(marker) = citus::parse_marker(name) else {
        return Ok(());
    };
    // On a worker the protection is not known: only the coordinator's own DDL (fencing_unprotect
    // and fencing_protect, propagated by Citus) may change a marker there.
    let standing = if node() == Node::Coordinator {
        crate::state::protections::protection_of(marker.protection)
            .is_some_and(|(t, _, _)| t == relid)
    } else {
        !from_coordinator()
    };
    if !standing {
        return Ok(());
    }
    Err(FenceError::SchemaChangeRefused(Text {
        message: format!(
            "constraint {name} of {} marks a table protected by pg_fencing",
            relation_name(relid)
        ),
        detail: Some(
            "The hooks of every node find a protected Citus table and its shards by this constraint; without it their writes would not be checked.".into(),
        ),
        hint: Some("Remove the protection with fencing_unprotect(table) first.".into()),
    }))
}
