//! The fencing rule, and the locking that makes it hold under concurrency.
//!
//! # The rule (docs/design.md, "The rule")
//! A write carrying token `t` is accepted iff `t >= high-water` of everything it touches; equal
//! tokens are accepted. On commit the high-water becomes `max(high-water, t)`. Otherwise the
//! statement fails with `FT001`. This module is the only implementation of that rule: the guard
//! trigger (plain DML, COPY, TRUNCATE, and the `fenced_*` functions, which run plain DML) and
//! `fencing_advance` all come through [`admit_resource`], [`admit_row`] and [`admit_row_insert`]
//! (an admitted per-row delete then leaves its tombstone, `state::tombstones::record_row_delete`;
//! a per-row TRUNCATE is checked and tombstoned set-wise, `state::tombstones::truncate_rows`).
//!
//! # Why it holds under concurrency
//! Invariant: for each resource and each row, the tokens of committed writes, in commit order,
//! never decrease. Each resource has a transaction-scoped lock in PostgreSQL's lock manager (an
//! advisory-type lock tag of our own, so it never collides with `pg_advisory_lock` keys):
//! * a write whose token equals the high-water mark holds it in **share** mode until commit;
//! * a write (or `fencing_advance`) that raises the mark holds it in **exclusive** mode until commit.
//!
//! So a raise waits for every in-flight writer with the old token to commit or abort, and every
//! later writer waits for the raise to commit before it reads the mark. The mark is read with the
//! latest committed snapshot (not the transaction's), so the check is right in READ COMMITTED,
//! REPEATABLE READ and SERIALIZABLE alike.
//!
//! Rows in per-row mode are guarded by PostgreSQL's own locks, so per-row mode takes no lock of
//! its own (and a bulk write cannot exhaust the lock table): UPDATE and DELETE hold the row lock
//! and see the latest row version; an INSERT of a key whose delete is still in flight waits in
//! the primary key's unique check until that delete commits, and only then (in the `AFTER
//! INSERT` trigger) is the key's tombstone read, with the latest snapshot.
#![forbid(unsafe_code)]

pub mod session_token;

use crate::backend_event::BackendEvent;
use crate::error::{Domain, FenceError, Token};
use crate::pg::lock_manager::{lock_resource, LockMode};
use crate::state::mark_versions;
use crate::state::marks::{read_resource_mark, store_resource_mark, versions_trusted};
use crate::state::stats;
pub use crate::state::tombstones::TombKey;
use crate::state::tombstones::{read_tombstone, tombstone_floor};
use rustc_hash::FxHashMap;
use std::cell::RefCell;

/// Outcome of comparing a token with a high-water mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// `t >= high-water`; `raises` when `t > high-water` (or no mark yet).
    Accept { raises: bool },
    /// `t < high-water`.
    Reject,
}

/// THE rule. `None` high-water: never seen, so any token is accepted and raises the mark.
#[inline]
pub fn rule(token: Token, high_water: Option<Token>) -> Verdict {
    match high_water {
        None => Verdict::Accept { raises: true },
        Some(h) if token > h => Verdict::Accept { raises: true },
        Some(h) if token == h => Verdict::Accept { raises: false },
        Some(_) => Verdict::Reject,
    }
}

/// What this transaction knows about a resource whose lock it holds. While we hold the lock in
/// any mode nobody else can raise the mark, so `high_water` stays exact until our transaction
/// (or the subtransaction that took it) ends. Cleared by the transaction callbacks in `backend.rs`.
#[derive(Debug, Clone, Copy)]
struct Held {
    high_water: Option<Token>,
    mode: LockMode,
}

thread_local! {
    static HELD: RefCell<FxHashMap<String, Held>> = RefCell::new(FxHashMap::default());
    /// The mark this backend last read for each resource, kept across transactions, with the
    /// version it had (`state/mark_versions.rs`) when it was read under the resource's lock.
    /// Without a version only a hint for choosing the lock mode; with one, the mark itself for as
    /// long as the version stays the same.
    static LAST_SEEN: RefCell<FxHashMap<String, Seen>> = RefCell::new(FxHashMap::default());
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    version: Option<u64>,
    mark: Option<Token>,
}

/// Forget the marks read in earlier transactions (relcache invalidation: the marks table may
/// have been dropped, re-created or had its trigger disabled).
fn forget_seen_marks() {
    LAST_SEEN.with(|l| l.borrow_mut().clear());
}

/// Forget all cached lock and mark state (end of transaction, subtransaction abort, reset).
fn forget_all() {
    HELD.with(|h| h.borrow_mut().clear());
}

/// Forget one resource (after `fencing_reset` changed its mark in this transaction).
pub fn forget(resource: &str) {
    HELD.with(|h| {
        h.borrow_mut().remove(resource);
    });
}

/// Admit a write (or an advance) carrying `token` on `resource`.
///
/// `store`: write the raised mark now. The `BEFORE INSERT` trigger passes `false` (an
/// `INSERT … ON CONFLICT DO NOTHING` may not write at all, and a write that does not happen must
/// not move a mark) and the `AFTER INSERT` trigger then stores it; everything else passes `true`.
/// Returns the high-water mark after admission.
pub fn admit_resource(resource: &str, token: Token, store: bool) -> Result<Token, FenceError> {
    let stale = |h: Token| {
        stats::rejected(stats::Kind::Resource, resource, token, h);
        FenceError::StaleToken {
            domain: Domain::Resource(resource.to_string()),
            token,
            high_water: h,
        }
    };
    // A watched resource: the lock's last hand-over revision fences like a mark (and `verify`
    // may refuse the token outright, FT006; see lock_service/watch.rs).
    let handover = crate::lock_service::watch::check(resource, token)?;
    if token < handover {
        return Err(stale(handover));
    }
    let held = HELD.with(|h| h.borrow().get(resource).copied());
    let mut held = match held {
        Some(h) => h,
        None => {
            // Choose the lock mode from the mark this backend saw last (or an unlocked read):
            // exclusive if the token looks like it raises the mark, share otherwise. Marks only
            // go up, except by fencing_reset, which takes the exclusive lock; either way the
            // decision below uses the mark read under the lock.
            let seen = LAST_SEEN.with(|l| l.borrow().get(resource).copied());
            let peek = match seen {
                Some(seen) => seen.mark,
                None => read_resource_mark(resource),
            };
            let mode = match rule(token, peek) {
                Verdict::Accept { raises: true } => LockMode::Exclusive,
                _ => LockMode::Share,
            };
            lock_resource(resource, mode);
            // Under the lock: the version first, then (unless it says the mark we read is still
            // the stored one) the mark (see state/mark_versions.rs for why this is exact).
            // A mark this transaction changed itself is read uncommitted: never kept with a
            // version (a rollback would take it back without a bump).
            let version = mark_versions::version(resource)
                .filter(|_| versions_trusted() && !mark_versions::changed_here(resource));
            let high_water = match (seen, version) {
                (
                    Some(Seen {
                        version: Some(v0),
                        mark,
                    }),
                    Some(v),
                ) if v0 == v => mark,
                _ => read_resource_mark(resource),
            };
            LAST_SEEN.with(|l| {
                crate::cache::cache_insert(
                    &mut l.borrow_mut(),
                    resource.to_string(),
                    Seen {
                        version,
                        mark: high_water,
                    },
                    10_000,
                )
            });
            Held { high_water, mode }
        }
    };
    let result = match rule(token, held.high_water) {
        Verdict::Reject => Err(stale(held.high_water.unwrap_or_default())),
        Verdict::Accept { raises: false } => Ok(token),
        Verdict::Accept { raises: true } => {
            if held.mode < LockMode::Exclusive {
                // We held share mode all along, so the mark cannot have moved meanwhile.
                lock_resource(resource, LockMode::Exclusive);
                held.mode = LockMode::Exclusive;
            }
            if store {
                store_resource_mark(resource, token);
                if let Some(previous) = held.high_water {
                    // A live lease's holder learns that it was fenced off (NOTIFY pg_fencing).
                    crate::lock_service::leases::notify_mark_raised(resource, previous, token);
                }
                held.high_water = Some(token);
                // Not committed yet: a hint only (no version), read again next time.
                LAST_SEEN.with(|l| {
                    l.borrow_mut().insert(
                        resource.to_string(),
                        Seen {
                            version: None,
                            mark: Some(token),
                        },
                    )
                });
            }
            Ok(token)
        }
    };
    HELD.with(|h| h.borrow_mut().insert(resource.to_string(), held));
    if store && result.is_ok() {
        stats::accepted(stats::Kind::Resource, resource);
    }
    result
}

thread_local! {
    /// Per protection id: why it is not active (`None`: active), as last read. Dropped on every
    /// relcache invalidation (a trigger of a partition disabled, a column dropped, a child
    /// inherited), every change of `pg_subscription_rel` and every subtransaction abort.
    static ACTIVITY: RefCell<FxHashMap<i64, Option<std::rc::Rc<str>>>> = RefCell::new(FxHashMap::default());
}

/// Forget what is known about the protections' activity (see `ACTIVITY`; called by `backend.rs`).
fn forget_activity() {
    ACTIVITY.with(|a| a.borrow_mut().clear());
}

/// `FT004` unless protection `protection` is active (`fencing_protected_tables.active`): a
/// protection that cannot hold refuses every write, with the reason in DETAIL and the fix in
/// HINT, before anything else is checked. Every write path of an ordinary session calls it (the
/// guard trigger, the UPDATE fast path, and `fenced_*` through both); the recording path of
/// replica mode does not (logical replication's apply worker must not stop).
pub fn require_active(protection: i64, table: &dyn Fn() -> String) -> Result<(), FenceError> {
    let cached = ACTIVITY.with(|a| a.borrow().get(&protection).cloned());
    let reason = match cached {
        Some(r) => r,
        None => {
            let r = crate::state::protections::inactive_reason(protection).map(std::rc::Rc::from);
            ACTIVITY.with(|a| {
                crate::cache::cache_insert(&mut a.borrow_mut(), protection, r.clone(), 10_000)
            });
            r
        }
    };
    match reason {
        None => Ok(()),
        Some(why) => Err(inactive(&table(), &why)),
    }
}

/// `FT004` for a write to `table`, whose protection is not active because of `why` (the
/// `inactive_reason` of `fencing_protected_tables`): the one wording of every path that refuses
/// it (the guard, the fast paths, `fenced_*`).
pub fn inactive(table: &str, why: &str) -> FenceError {
    // The set-based shape in a backend that did not preload the library: the two ways out.
    let unpreloaded = !crate::pg::process::preloaded() && why.contains("set-based shape");
    FenceError::NotProtected(crate::error::Text {
        message: format!("protection of table {table} is not active"),
        detail: Some(format!("{}.", why.trim_end_matches('.'))),
        hint: Some(if unpreloaded {
            // The call with the protection's own arguments: without its resource, a
            // resource-mode table would be switched to per-row mode.
            let call = crate::state::protections::protect_call(table).unwrap_or_else(|| {
                format!(
                    "fencing_protect('{}', <its resource or NULL>, <its token column>)",
                    table.replace('\'', "''")
                )
            });
            format!(
                "Preload the library (shared_preload_libraries = 'pg_fencing', then restart), or \
                 run SELECT {call} here to give the table the row-trigger shape with the same \
                 protection, which needs no preloading (docs/design.md, \"The set-based shape\")."
            )
        } else {
            "Writes are refused until the protection can hold: fix what the detail names \
             (fencing_protect on the table re-creates missing triggers and repairs their \
             firing modes; docs/guarantees.md, \"When a protection is not active\")."
                .into()
        }),
    })
}

/// The token a write carries, admitted as a token: step one of every write's admission, the one
/// entry point that the guard trigger, the UPDATE fast path and (through the guard) `fenced_*`
/// call before the domain checks below (`admit_resource`, `admit_row`, `admit_row_insert`).
/// * does the session carry a token that counts here (`session_token`: by its source, never
///   by its value)? `FT002` otherwise, saying why a token that is set does not count;
/// * is it the token of a lock taken through the worker that is lost, or of a PostgreSQL lease
///   that expired, was released or was taken over? `FT003`.
///
/// `target` names what is written, for the message of `FT002`.
pub fn write_token(target: &dyn Fn() -> String) -> Result<Token, FenceError> {
    let token = session_token::current_token().ok_or_else(|| FenceError::NoToken {
        target: target(),
        ignored: session_token::ignored_token(),
        restoring: crate::pg::process::restoring(),
    })?;
    admit_token(token)
}

/// As [`write_token`], but `None` instead of `FT002` when the session carries no token that
/// counts (the statement-level checks of resource mode, which take the resource's lock early;
/// the row-level checks then raise `FT002`).
pub fn write_token_if_any() -> Result<Option<Token>, FenceError> {
    session_token::current_token().map(admit_token).transpose()
}

/// A token given as an argument (`fencing_advance`): `FT003` if it is the token of a lost lock
/// or of a PostgreSQL lease that has ended (the time fence, `lock_service/leases.rs`).
pub fn admit_token(token: Token) -> Result<Token, FenceError> {
    crate::lock_service::etcd_locks::check_lock_not_lost(token)?;
    crate::lock_service::leases::check_lease_live(token)?;
    Ok(token)
}

/// Take the exclusive lock of `resource` and return its current mark (for `fencing_reset`).
pub fn lock_resource_exclusive(resource: &str) -> Option<Token> {
    lock_resource(resource, LockMode::Exclusive);
    forget(resource);
    read_resource_mark(resource)
}

/// Per-row mode, UPDATE/DELETE of an existing row: its own token column is its high-water mark
/// (the table's tombstone floor for a row never stamped).
/// The executor holds the row lock and hands us the latest row version, so no lock is needed.
/// `count`: count an accepted write in the statistics (false for early checks that are repeated).
/// `key` prints the row's key; it is only called for the error message.
pub fn admit_row(
    protection: i64,
    table: &dyn Fn() -> String,
    key: &dyn Fn() -> String,
    token: Token,
    row_token: Option<Token>,
    count: bool,
) -> Result<(), FenceError> {
    // A row never stamped (written before the table was protected, or before a switch from
    // resource mode) has no mark of its own: the table's tombstone floor is its mark, which is
    // where `fencing_protect` carries a previous protection's fence.
    let row_token = row_token.or_else(|| tombstone_floor(protection));
    match rule(token, row_token) {
        Verdict::Reject => {
            let high_water = row_token.unwrap_or_default();
            stats::rejected(
                stats::Kind::Table,
                &protection.to_string(),
                token,
                high_water,
            );
            Err(FenceError::StaleToken {
                domain: Domain::Row {
                    table: table(),
                    key: key(),
                },
                token,
                high_water,
            })
        }
        Verdict::Accept { .. } => {
            if count {
                stats::with_table_name(protection, |name| {
                    stats::accepted(stats::Kind::Table, name)
                });
            }
            Ok(())
        }
    }
}

/// Per-row mode, INSERT of `key` (or an UPDATE that gives a row this key): checked against the
/// key's tombstone, left by a delete. Authoritative when called after the row is in the unique
/// index (the `AFTER` triggers, see the module comment); an early refusal before that.
pub fn admit_row_insert(
    protection: i64,
    table: &dyn Fn() -> String,
    key: &TombKey,
    token: Token,
    count: bool,
) -> Result<(), FenceError> {
    // A key without a tombstone has the table's tombstone floor (`fencing_prune_tombstones`):
    // tombstones at or below it may have been pruned.
    let tomb = read_tombstone(protection, key);
    let floor = tombstone_floor(protection);
    let by_floor = floor.is_some_and(|f| tomb.is_none_or(|t| f > t));
    let high_water = match (tomb, floor) {
        (Some(t), Some(f)) => Some(t.max(f)),
        (t, f) => t.or(f),
    };
    // A refusal by the floor says so: its holder may be a rightful one (the floor set too high).
    admit_row(
        protection,
        table,
        &|| key.text.to_string(),
        token,
        high_water,
        count,
    )
    .map_err(|e| match e {
        FenceError::StaleToken {
            domain: Domain::Row { table, key },
            token,
            high_water,
        } if by_floor => FenceError::StaleToken {
            domain: Domain::RowFloor { table, key },
            token,
            high_water,
        },
        e => e,
    })
}

/// Raise the stored mark of `resource` to at least `token`, under its exclusive lock (a watch's
/// hand-over revision, kept when the watch ends).
pub fn raise_mark(resource: &str, token: Token) {
    let current = lock_resource_exclusive(resource);
    if current.is_none_or(|m| m < token) {
        store_resource_mark(resource, token);
        forget(resource);
    }
}

/// Per-backend state's life (`backend.rs`): the resource locks held and the marks read end with
/// any transaction and with a rolled-back savepoint; which protections are active is read again
/// after an abort, a rolled-back savepoint, a changed relation or subscription; marks read in
/// earlier transactions are dropped when a relation changed.
pub fn on_event(ev: BackendEvent) {
    if ev.ends_any_transaction() || matches!(ev, BackendEvent::SubAbort(_)) {
        forget_all();
    }
    if let BackendEvent::Relcache(_) = ev {
        forget_seen_marks();
    }
    if matches!(
        ev,
        BackendEvent::Abort
            | BackendEvent::SubAbort(_)
            | BackendEvent::Relcache(_)
            | BackendEvent::Subscriptions
    ) {
        forget_activity();
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn the_rule() {
        assert_eq!(rule(5, None), Verdict::Accept { raises: true });
        assert_eq!(rule(5, Some(4)), Verdict::Accept { raises: true });
        assert_eq!(rule(5, Some(5)), Verdict::Accept { raises: false });
        assert_eq!(rule(5, Some(6)), Verdict::Reject);
        assert_eq!(
            rule(i64::MAX, Some(i64::MAX)),
            Verdict::Accept { raises: false }
        );
    }
}
