//! `COPY … FROM` into a table of the set-based shape (docs/design.md, "The set-based shape"):
//! checked once per statement by the ProcessUtility hook, which the library has in every backend
//! only where the server preloads it.
//!
//! A table of that shape has no BEFORE ROW INSERT trigger, so `copyfrom.c` keeps its multi-row
//! inserts. What the row trigger did per row is done here instead:
//! * before the COPY runs (`begin`): the protection must be active (`rule::require_active`: also
//!   FT004 where the library was not preloaded), the writer's token admitted
//!   (`rule::write_token`: FT002, FT003), in resource mode against the resource's mark under its
//!   lock (`rule::admit_resource`: FT001);
//! * each row's token column gets that token from its column default
//!   (`_pg_fencing.stamp_default()`, STABLE: `stamp_default` here); a COPY that gives
//!   the column values itself has each checked to be that token (`_pg_fencing.copy_token`, added
//!   to its WHERE clause: `check_token`);
//! * per-row mode: each row's key is noted (`_pg_fencing.copy_key`, added to its WHERE clause:
//!   `note_key`) and checked when the COPY finished (`finish`), once every row is in the unique
//!   index, as the AFTER INSERT trigger checks it: in one look at the protection's highest
//!   tombstone when the token is at least that (`fast_path::finish_new_keys`), else key by key;
//! * resource mode: the raised mark is stored when the COPY finished, if it wrote a row.
//!
//! The table's own triggers close every other way in: its statement trigger
//! `zz_pg_fencing_stmt` (BEFORE INSERT FOR EACH STATEMENT, which COPY fires too) refuses (FT004)
//! every write in a backend that did not preload the library (`rule::require_active`), and its
//! AFTER INSERT row trigger, whose WHEN clause is `_pg_fencing.insert_check_due(protection)`,
//! checks every inserted row except those of a COPY admitted here (`insert_check_due`: not for
//! a statement that the COPY's own rows run, such as an INSERT of a user's trigger, which is
//! listed by `executor_started`): the rows of the writes that neither this hook nor the
//! planner's fast path (`fast_path::plan_insert`) took (a MERGE's INSERT, an INSERT in a WITH
//! clause or a rule), stamped by the column default (`stamp_default`). That trigger accepts
//! only a token pg_fencing stamped in the transaction (`trigger::note_stamped_token`), so a
//! value a statement gives the column itself is refused there.
//!
//! Invariants: a running COPY's entry is removed when it finished, and with the subtransaction
//! that started it when that aborts; `insert_check_due` is false only for rows of the COPY at the
//! top of the stack while no executor that started inside it runs (one left listed by a failed inner
//! statement only makes the AFTER INSERT trigger check rows the COPY checks too); the stamp, the
//! token check and the key notes never depend on that list; an executor that started before
//! the COPY is not in it, so ending one inside the COPY changes nothing. A COPY run inside another's row
//! (from a function) is the top of the stack while it runs.

#![forbid(unsafe_code)]

use crate::backend_event::BackendEvent;
use crate::error::{FenceError, Text, Token};
use crate::guard::fast_path;
use crate::guard::trigger;
use crate::pg::copy_stmt::CopyFrom;
use crate::pg::plan::{self, StampCall};
use crate::pg::trigger_event::relation_name;
use crate::rule;
use pgrx::pg_sys;
use std::cell::RefCell;
use std::ffi::CString;

/// The key text noted by one COPY, at most this many bytes (about 10 per integer key, plus the
/// offsets): past it, the COPY is refused when its keys must be looked up one by one.
const NOTED_BYTES: usize = 256 << 20;

/// The keys one per-row COPY wrote, in one buffer.
#[derive(Default)]
struct KeyNotes {
    text: String,
    ends: Vec<u32>,
    /// More keys than `NOTED_BYTES` hold were written.
    overflow: bool,
}

impl KeyNotes {
    fn push(&mut self, key: &str) {
        if self.text.len() + key.len() > NOTED_BYTES {
            self.overflow = true;
            return;
        }
        self.text.push_str(key);
        self.ends.push(self.text.len() as u32);
    }

    fn iter(&self) -> impl Iterator<Item = &str> {
        let mut start = 0usize;
        self.ends.iter().map(move |&end| {
            let s = &self.text[start..end as usize];
            start = end as usize;
            s
        })
    }
}

/// A COPY admitted by `begin`, while it runs.
struct Running {
    relid: pg_sys::Oid,
    protection: i64,
    resource: Option<String>,
    token: Token,
    /// Per-row mode: the keys its rows gave.
    keys: Option<KeyNotes>,
    /// The executors started while it runs and not ended yet (by their QueryDesc's address):
    /// statements run by its rows (triggers, functions), whose own inserts are not its rows. An
    /// executor that started before the COPY (a cursor closed inside it) is not one of them.
    inner: Vec<usize>,
    subxact: pg_sys::SubTransactionId,
}

thread_local! {
    /// The admitted COPYs running now, innermost last.
    static COPIES: RefCell<Vec<Running>> = const { RefCell::new(Vec::new()) };
}

/// What `begin` adds to the COPY's WHERE clause.
pub struct Conditions {
    /// `_pg_fencing.copy_token(token_column)`: the COPY gives the token column values itself.
    pub token_column: Option<CString>,
    /// `_pg_fencing.copy_key(key columns…)`: per-row mode.
    pub key_columns: Vec<CString>,
}

/// ProcessUtility hook, before a `COPY … FROM`: if it writes a table of the set-based shape
/// whose statement trigger fires in this session, admit it (see the module header). `None`:
/// not such a COPY (the table's triggers do what they do).
pub fn begin(copy: &CopyFrom, guard_address: usize) -> Result<Option<Conditions>, FenceError> {
    if !crate::pg::process::preloaded() || crate::pg::process::replica_mode() {
        // Without the library preloaded the statement trigger refuses the COPY (FT004); in
        // replica mode the set-based shape records nothing on INSERT (docs/design.md).
        return Ok(None);
    }
    let Some(relid) = copy.relid() else {
        return Ok(None);
    };
    let Some(site) = plan::with_relation(relid, |rel| {
        let guard = rel.trigger_named(super::GUARD)?;
        if !fast_path::is_guard(guard.function, guard_address) || !super::set_based(&guard) {
            return None;
        }
        // The statement trigger that would refuse the COPY: disabled (a restore's
        // --disable-triggers), nothing is checked, as with the row-trigger shape.
        let stmt = rel.trigger_named(super::STATEMENT)?;
        if !stmt.fires_on_origin() {
            return None;
        }
        let args = trigger::args_of(guard.oid, &guard.args).ok()?;
        let column = args.token_column.clone();
        let (pk, _) = rel.primary_key();
        // The conditions added to the COPY's WHERE clause read the key columns (per-row mode)
        // and the token column (if the COPY gives it): PostgreSQL then wants SELECT on them. A
        // role without it is not admitted here: its COPY's rows are checked one by one by the
        // AFTER INSERT trigger, as for the writes no hook takes.
        let mut read = if args.resource.is_none() {
            pk.clone()
        } else {
            Vec::new()
        };
        if copy.names_column(&column) {
            read.push(rel.bigint_column(&column).ok()?);
        }
        if !read.is_empty() && !plan::may_select_columns(relid, &read) {
            return None;
        }
        let pk_names: Vec<CString> = pk
            .iter()
            .map(|a| CString::new(rel.column_name(*a)).unwrap_or_default())
            .collect();
        Some((args, column, pk_names))
    }) else {
        return Ok(None);
    };
    let (args, column, pk_names) = site;
    let table = || relation_name(relid);
    trigger::verify_protection(relid, &args, &table)?;
    rule::require_active(args.protection, &table)?;
    let token = rule::write_token(&|| format!("a COPY into protected table {}", table()))?;
    let keys = match &args.resource {
        Some(resource) => {
            rule::admit_resource(resource, token, false)?;
            None
        }
        None => {
            if pk_names.is_empty() {
                return Err(rule::inactive(
                    &table(),
                    "the per-row protected table has no primary key",
                ));
            }
            Some(KeyNotes::default())
        }
    };
    let per_row = keys.is_some();
    trigger::note_stamped_token(token);
    COPIES.with(|c| {
        c.borrow_mut().push(Running {
            relid,
            protection: args.protection,
            resource: args.resource.clone(),
            token,
            keys,
            inner: Vec::new(),
            subxact: crate::pg::process::current_subxact(),
        })
    });
    Ok(Some(Conditions {
        token_column: copy.names_column(&column).then_some(column),
        key_columns: if per_row { pk_names } else { Vec::new() },
    }))
}

/// ProcessUtility hook, after the COPY admitted by `begin` wrote `rows` rows (`None`: not
/// reported, taken as some): per-row mode checks its keys, resource mode stores the raised mark.
pub fn finish(rows: Option<u64>) -> Result<(), FenceError> {
    let rows = rows.unwrap_or(1);
    let Some(running) = COPIES.with(|c| c.borrow_mut().pop()) else {
        return Ok(());
    };
    let relid = running.relid;
    match (&running.resource, running.keys) {
        (Some(resource), _) => {
            if rows > 0 {
                rule::admit_resource(resource, running.token, true)?;
                crate::state::stats::accepted_more(
                    crate::state::stats::Kind::Resource,
                    resource,
                    rows - 1,
                );
            }
            Ok(())
        }
        (None, Some(keys)) => {
            if keys.overflow && !fast_path::new_keys_pass(running.protection, running.token) {
                return Err(FenceError::NotSupported(Text {
                    message: format!(
                        "COPY into per-row protected table {} wrote more keys than pg_fencing can \
                         check one by one",
                        relation_name(relid)
                    ),
                    detail: Some(format!(
                        "Its token {} is below the table's highest tombstone, so each key must be \
                         looked up, and the keys took more than {} MiB.",
                        running.token,
                        NOTED_BYTES >> 20
                    )),
                    hint: Some("Split the COPY into smaller ones.".into()),
                }));
            }
            fast_path::finish_new_keys(
                running.protection,
                relid,
                Some(running.token),
                keys.ends.len(),
                keys.iter().map(|k| (k, running.token)),
            )
        }
        (None, None) => Ok(()),
    }
}

/// `_pg_fencing.stamp_default()`, the token column's default on a set-based table: the token of
/// the admitted COPY running now; in replica mode NULL (rows keep the token they carry); else
/// the writer's token, as the BEFORE INSERT row trigger of the row-trigger shape stamps it, for
/// the writes no hook admitted (a MERGE's INSERT, an INSERT in a WITH clause or a rule), whose
/// rows the AFTER INSERT trigger checks (and refuses with FT002 where this gave NULL for want of
/// a token). (The planner hook's INSERTs do not evaluate it. A table that copied the default
/// with `CREATE TABLE … LIKE … INCLUDING DEFAULTS` gets the token, or NULL.)
pub fn stamp_default() -> Result<Option<Token>, FenceError> {
    let copy = COPIES.with(|c| c.borrow().last().map(|r| r.token));
    if copy.is_some() {
        return Ok(copy);
    }
    if crate::pg::process::replica_mode() {
        return Ok(None);
    }
    let token = rule::write_token_if_any()?;
    if let Some(t) = token {
        trigger::note_stamped_token(t);
    }
    Ok(token)
}

/// `_pg_fencing.insert_check_due(protection)`, the WHEN clause of a set-based table's AFTER
/// INSERT row trigger: false only for the rows of the COPY admitted into it, which `finish`
/// checks (no executor started inside the COPY is running: the row is the COPY's own).
pub fn insert_check_due(protection: i64) -> bool {
    !COPIES.with(|c| {
        c.borrow()
            .last()
            .is_some_and(|r| r.protection == protection && r.inner.is_empty())
    })
}

/// `_pg_fencing.copy_key(key…)`: note the key of a row of the running COPY (checked when it
/// finished). A call outside an admitted per-row COPY notes nothing.
pub fn note_key(call: &StampCall) -> Result<bool, FenceError> {
    COPIES.with(|c| {
        let mut c = c.borrow_mut();
        let Some(r) = c.last_mut() else {
            return Ok(true);
        };
        if let Some(keys) = &mut r.keys {
            let key = crate::pg::trigger_event::key_text_of(&call.typed(0));
            keys.push(&key);
        }
        Ok(true)
    })
}

/// `_pg_fencing.copy_token(value)`: a row of the running COPY gives its token column `value`
/// itself, which must be the writer's token (the default would have stamped it; nothing can
/// overwrite what a COPY gives). 22023 otherwise.
pub fn check_token(value: Option<Token>) -> Result<bool, FenceError> {
    let running = COPIES.with(|c| c.borrow().last().map(|r| (r.relid, r.token)));
    let Some((relid, token)) = running else {
        return Ok(true);
    };
    if value == Some(token) {
        return Ok(true);
    }
    Err(FenceError::ArgumentShape(Text {
        message: format!(
            "COPY into protected table {} gives its token column {}, not the writer's fencing \
             token {token}",
            relation_name(relid),
            value.map_or("NULL".to_string(), |v| v.to_string())
        ),
        detail: Some(
            "The table has the set-based shape: pg_fencing stamps the token column through its \
             default and cannot overwrite a value that COPY gives."
                .into(),
        ),
        hint: Some(
            "Leave the token column out of COPY's column list, or give it the writer's token."
                .into(),
        ),
    }))
}

/// ExecutorStart of the statement whose QueryDesc is at `query_desc`: it starts inside the
/// running COPY, if any.
pub fn executor_started(query_desc: usize) {
    COPIES.with(|c| {
        if let Some(r) = c.borrow_mut().last_mut() {
            r.inner.push(query_desc);
        }
    });
}

/// ExecutorEnd of that statement. Only an executor the COPY saw start counts (a cursor opened
/// before the COPY and closed inside it does not make the COPY's count fall). One that failed
/// ends no executor: it stays listed, and the COPY's rows are then checked by the AFTER INSERT
/// trigger as well.
pub fn executor_ended(query_desc: usize) {
    COPIES.with(|c| {
        if let Some(r) = c.borrow_mut().last_mut() {
            if let Some(i) = r.inner.iter().rposition(|q| *q == query_desc) {
                r.inner.swap_remove(i);
            }
        }
    });
}

/// Per-backend state's life (`backend.rs`): a COPY whose subtransaction aborted failed; every
/// COPY ends with the transaction.
pub fn on_event(ev: BackendEvent) {
    match ev {
        BackendEvent::SubAbort(sub) => {
            COPIES.with(|c| c.borrow_mut().retain(|r| r.subxact < sub));
        }
        ev if ev.ends_transaction() => COPIES.with(|c| {
            let mut c = c.borrow_mut();
            if !c.is_empty() {
                c.clear();
            }
        }),
        _ => {}
    }
}
