//! PostgreSQL leases: the database itself as the lock service (`fencing_lease_acquire`,
//! `fencing_lease_renew`, `fencing_lease_release`, `fencing_lease_check`, view
//! `fencing_leases`; docs/leases.md). Works without `shared_preload_libraries`.
//!
//! # State (schema `_pg_fencing`, WAL-logged, dumped with the extension)
//! * `lease`: one row per lease name that is held or ended without a release (name, token, ttl,
//!   acquired_at, expires_at, acquired_by, holder_pid). A lease is **live** while
//!   `expires_at > clock_timestamp()` (the database clock, microseconds).
//! * `lease_token_seq`: the tokens. `lease_history_seq`: a hash of the server history (system
//!   identifier, WAL timeline, server start time) under which the token sequence last moved to
//!   the clock.
//!
//! # A lease's life (the only transitions; each is one statement on `lease`'s row)
//! ```text
//!   (no row) --acquire--> live --renew (expires_at > now)--> live
//!   live --release--> (no row)                    [waiters woken after the commit]
//!   live --expires_at passes--> expired --acquire (take-over)--> live with a new token
//!   expired --release--> (no row)                  [returns false]
//! ```
//! One live holder per name at any instant: a grant inserts the row (the primary key serializes
//! two grants of a free name) or replaces the token of a row it has locked and seen expired, by
//! the database clock, after the lock.
//!
//! # Tokens never go back (docs/leases.md, "Tokens")
//! A token is `nextval` of `lease_token_seq`: WAL-logged (crash, restart, standbys, pg_upgrade
//! copy it) and dumped with the extension; a grant's commit is flushed whatever
//! `synchronous_commit` says. A promoted standby, a point-in-time recovery, a dump restored into
//! a new cluster or a copied data directory may lack the last grants of the history it came
//! from, so the first grant under a new server history (`pg::process::history`: every one of
//! those paths changes the system identifier, the timeline or the start time) first moves the
//! sequence to at least the database clock in microseconds since 2000 (a `timestamptz`). The
//! sequence then rises by one per grant, far slower than the clock, so each token is below the
//! clock reading of any later server start; a new history's tokens exceed every token of the
//! history it came from as long as its clock is past the moment that history last started
//! (docs/leases.md states the assumption). Every token is at least [`TOKEN_FLOOR`].
//!
//! # The time fence (docs/leases.md, "The time fence")
//! [`check_lease_live`] is called by the rule's one admission entry point (`rule::admit_token`) for
//! every write's token and by `fencing_advance`. A token in the lease range — at least
//! [`TOKEN_FLOOR`], whatever this database granted — counts only while a live lease holds it:
//! otherwise `FT003`, also before any newer holder wrote, and also for a token this database
//! cannot place (granted in a history it lost, or never granted: unknown never means admitted).
//! Tokens below the range (etcd revisions, ZooKeeper zxids) are never looked up. A live lease is
//! probed once per transaction through the token's unique index and its expiry kept; each later
//! write compares the clock with it, so a lease that expires during a transaction refuses that
//! transaction's next write.
#![forbid(unsafe_code)]

use crate::backend_event::BackendEvent;
use crate::error::{FenceError, Text, Token};
use crate::pg::index::{read_by_index, UniqueIndex};
use crate::pg::lock_manager::{register_lease_waiter, wake_lease_waiters, LeaseHistoryLock};
use crate::pg::process::{self, LockWaitBound};
use crate::pg::spi::{exec_internal, exec_internal_row, text_datum, text_of};
use pgrx::pg_sys;
use rustc_hash::FxHashMap;
use std::cell::RefCell;

/// The lowest lease token (2^48, about 2008-12-01 as microseconds since 2000): tokens below it
/// are never looked up as leases. etcd revisions and ZooKeeper zxids stay far below it.
pub const TOKEN_FLOOR: Token = 1 << 48;

const LEASE_BY_TOKEN: UniqueIndex = UniqueIndex {
    table: c"lease",
    index: c"lease_token_key",
    value: c"expires_at",
};

const SQL_LOOK: &str = "SELECT token, expires_at FROM _pg_fencing.lease \
     WHERE name OPERATOR(pg_catalog.=) $1";
// The caller ($2) may renew or release if it is a member of the acquiring role: the role with
// the OID recorded at the grant, if it still has the name recorded then (a role dropped and
// made again under the name, renamed, or a restore into another cluster, where OIDs differ:
// nobody but a superuser, $3).
const SQL_LOOK_TOKEN: &str = "SELECT l.name, l.expires_at, \
     COALESCE(pg_catalog.pg_has_role($2, (SELECT a.oid FROM pg_catalog.pg_roles a \
     WHERE a.oid OPERATOR(pg_catalog.=) l.acquirer AND a.rolname OPERATOR(pg_catalog.=) l.acquired_by), \
     'MEMBER'), false) OR $3, \
     pg_catalog.to_char(l.expires_at, 'YYYY-MM-DD HH24:MI:SS.USOF') \
     FROM _pg_fencing.lease l WHERE l.token OPERATOR(pg_catalog.=) $1";
const SQL_INSERT: &str = "INSERT INTO _pg_fencing.lease \
     (name, token, ttl, acquired_at, expires_at, acquired_by, acquirer, holder_pid) \
     SELECT $1, $2, $3, c.n, c.n OPERATOR(pg_catalog.+) $3, pg_catalog.pg_get_userbyid($4), $4, \
     pg_catalog.pg_backend_pid() \
     FROM (SELECT pg_catalog.clock_timestamp() AS n) c \
     ON CONFLICT (name) DO NOTHING RETURNING acquired_at";
// The clock is read before the insert may wait for another grant of the name in the unique
// index; a grant that waited starts its ttl when it got the name.
const SQL_RESTART: &str = "UPDATE _pg_fencing.lease SET acquired_at = c.n, \
     expires_at = c.n OPERATOR(pg_catalog.+) ttl FROM (SELECT pg_catalog.clock_timestamp() AS n) c \
     WHERE token OPERATOR(pg_catalog.=) $1 RETURNING token";
const SQL_TAKE_OVER: &str = "WITH old AS (SELECT token FROM _pg_fencing.lease \
     WHERE name OPERATOR(pg_catalog.=) $1 AND token OPERATOR(pg_catalog.=) $5 \
     AND expires_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp() FOR UPDATE) \
     UPDATE _pg_fencing.lease l SET token = $2, ttl = $3, acquired_at = c.n, \
     expires_at = c.n OPERATOR(pg_catalog.+) $3, acquired_by = pg_catalog.pg_get_userbyid($4), acquirer = $4, \
     holder_pid = pg_catalog.pg_backend_pid() \
     FROM old, (SELECT pg_catalog.clock_timestamp() AS n) c \
     WHERE l.name OPERATOR(pg_catalog.=) $1 RETURNING l.token";
// A renewal extends, never shortens: the expiry a transaction read stays a lower bound.
const SQL_RENEW: &str = "UPDATE _pg_fencing.lease SET ttl = $2, \
     expires_at = pg_catalog.timestamptz_larger(expires_at, pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) $2) \
     WHERE token OPERATOR(pg_catalog.=) $1 \
     AND expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp() RETURNING expires_at";
const SQL_RENEW_SAME: &str = "UPDATE _pg_fencing.lease SET \
     expires_at = pg_catalog.timestamptz_larger(expires_at, pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) ttl) \
     WHERE token OPERATOR(pg_catalog.=) $1 \
     AND expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp() RETURNING expires_at";
// The grant's own token, issued once it holds the name (see `retoken`).
const SQL_RETOKEN: &str = "UPDATE _pg_fencing.lease SET token = $2 \
     WHERE token OPERATOR(pg_catalog.=) $1 RETURNING token";
const SQL_RELEASE: &str = "DELETE FROM _pg_fencing.lease WHERE token OPERATOR(pg_catalog.=) $1 \
     RETURNING name, expires_at";
const SQL_HISTORY: &str = "SELECT last_value FROM _pg_fencing.lease_history_seq";
const SQL_MOVE_TO_CLOCK: &str =
    "SELECT pg_catalog.setval('_pg_fencing.lease_token_seq'::pg_catalog.regclass, \
     pg_catalog.int8larger(CASE WHEN s.is_called THEN s.last_value ELSE 0 END, $1), true) \
     FROM _pg_fencing.lease_token_seq s";
const SQL_SET_HISTORY: &str =
    "SELECT pg_catalog.setval('_pg_fencing.lease_history_seq'::pg_catalog.regclass, $1, true)";
const SQL_NEXT: &str =
    "SELECT pg_catalog.nextval('_pg_fencing.lease_token_seq'::pg_catalog.regclass)";
const SQL_NOTIFY_TAKE_OVER: &str = "SELECT pg_catalog.pg_notify('pg_fencing', \
     pg_catalog.json_build_object('event', 'lease_taken_over', 'lease', $1, 'token', $2, \
     'previous_token', $3)::text)";
const SQL_NOTIFY_MARK: &str = "SELECT pg_catalog.pg_notify('pg_fencing', \
     pg_catalog.json_build_object('event', 'mark_raised', 'resource', $1, 'token', $2, \
     'previous_token', $3)::text)";

thread_local! {
    /// Lease tokens found live in this transaction, with the expiry read then: a lower bound,
    /// since a renewal never moves it earlier (only a release ends a lease before it, see the
    /// module comment). Cleared at the transaction's end and at every subtransaction abort (a
    /// grant or renewal rolled back); an entry is dropped when this session renews or releases
    /// the lease, so that the next write reads what it did.
    static LIVE: RefCell<FxHashMap<Token, i64>> = RefCell::new(FxHashMap::default());
    /// Names of the leases this transaction released: their waiters are woken after the commit.
    static RELEASED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// The transaction ended: what it saw of leases is forgotten (`backend.rs`).
fn forget_transaction() {
    LIVE.with(|l| l.borrow_mut().clear());
    RELEASED.with(|r| r.borrow_mut().clear());
}

/// A subtransaction aborted: what it may have seen (its own grants and renewals, now rolled
/// back) is read again by the next write (`backend.rs`).
fn forget_seen() {
    LIVE.with(|l| l.borrow_mut().clear());
}

/// The transaction committed: wake the waiters of the leases it released (`backend.rs`).
fn wake_released() {
    let names = RELEASED.with(|r| std::mem::take(&mut *r.borrow_mut()));
    for name in names {
        wake_lease_waiters(&name);
    }
}

fn require_writable(what: &str) -> Result<(), FenceError> {
    if process::in_recovery() {
        return Err(FenceError::ReadOnly(Text {
            message: format!("cannot {what} a lease during recovery"),
            detail: Some(
                "Leases are rows of the primary's database; a standby only replays them.".into(),
            ),
            hint: Some("Call it on the primary.".into()),
        }));
    }
    Ok(())
}

fn as_i64(d: Option<pg_sys::Datum>) -> Option<i64> {
    d.map(|d| d.value() as i64)
}

/// The expiry of the lease holding `token` (microseconds since 2000), through the token's
/// unique index (the key is the table's column 2, `token`). `None`: no lease table (the extension's SQL is older than the library);
/// `Some(None)`: no lease holds the token.
fn probe(token: Token) -> Option<Option<i64>> {
    read_by_index(
        &LEASE_BY_TOKEN,
        &[(2, pg_sys::F_INT8EQ, pg_sys::Datum::from(token))],
    )
}

/// The lease row holding `token`, as `SQL_LOOK_TOKEN` returns it, decoded by `decode`.
fn look_token<T>(token: Token, decode: impl FnOnce(&[Option<pg_sys::Datum>]) -> T) -> Option<T> {
    exec_internal_row(
        SQL_LOOK_TOKEN,
        true,
        &[pg_sys::INT8OID, pg_sys::OIDOID, pg_sys::BOOLOID],
        &mut [
            pg_sys::Datum::from(token),
            pg_sys::Datum::from(process::current_user()),
            pg_sys::Datum::from(process::is_superuser()),
        ],
        true,
        decode,
    )
}

/// Why `token`, in the lease range, is not a live lease's (the DETAIL of `FT003`).
fn why_not_live(token: Token) -> String {
    let row = look_token(token, |r| (r[0].map(text_of), r[3].map(text_of)));
    match row {
        Some((Some(name), Some(at))) => {
            format!("Lease \"{name}\" with this token expired at {at} (database clock)")
        }
        _ => "No lease of this database holds this token: it was released, taken over by a \
              newer holder, granted in a history this database lost (a promoted standby that \
              missed the grant, a recovery to an earlier point, a dump taken before it) or never \
              granted. Every token from 2^48 (281474976710656) up is a PostgreSQL lease token"
            .into(),
    }
}

/// The time fence: `FT003` if `token` is in the lease range (at least [`TOKEN_FLOOR`]) and no
/// live lease holds it (see the module comment). Called through `rule::admit_token` only.
pub fn check_lease_live(token: Token) -> Result<(), FenceError> {
    if token < TOKEN_FLOOR {
        return Ok(());
    }
    let now = process::now_us();
    if LIVE.with(|l| l.borrow().get(&token).is_some_and(|exp| now < *exp)) {
        return Ok(());
    }
    match probe(token) {
        Some(Some(exp)) if now < exp => {
            LIVE.with(|l| l.borrow_mut().insert(token, exp));
            Ok(())
        }
        // Unknown never means admitted (docs/leases.md, "The time fence"): a token no lease holds
        // was released, taken over, granted in a history this database lost (a promoted
        // standby that missed the grant, a recovery to an earlier point, a dump taken before
        // it) or never granted, also in a database that never granted a lease.
        Some(_) => Err(FenceError::LeaseEnded {
            token,
            why: why_not_live(token),
            write: true,
        }),
        // The extension's SQL has no leases yet (a 0.1.0 schema before ALTER EXTENSION
        // pg_fencing UPDATE): no token of the range can be placed, so none is admitted.
        None => Err(FenceError::LeaseEnded {
            token,
            why: "This database's pg_fencing schema has no leases yet (ALTER EXTENSION \
                  pg_fencing UPDATE adds them), so no token of the lease range can be a live \
                  lease's"
                .into(),
            write: true,
        }),
    }
}

/// `fencing_lease_check`: `FT003` unless `token` is a live lease's token, whatever its range.
pub fn check_live(token: Token) -> Result<(), FenceError> {
    let now = process::now_us();
    match probe(token) {
        Some(Some(exp)) if now < exp => Ok(()),
        _ => Err(FenceError::LeaseEnded {
            token,
            why: why_not_live(token),
            write: false,
        }),
    }
}

/// A 62-bit positive hash of the server history (`pg::process::history`) and of this database
/// (its OID: a dump restored into another database of the same cluster, or a database made
/// from this one as a template, is a new history too).
fn history_hash() -> Option<i64> {
    let (system, timeline, started) = process::history()?;
    let h = pg_fencing_core::hash::fnv1a(&[
        &system.to_le_bytes(),
        &timeline.to_le_bytes(),
        &started.to_le_bytes(),
        &process::my_database().to_le_bytes(),
    ]);
    Some((h >> 2).max(1) as i64)
}

/// A new token: the token sequence's next value, after moving the sequence to the clock if this
/// is the first grant under a new server history (module comment, "Tokens never go back").
fn issue_token() -> Result<Token, FenceError> {
    let Some(hist) = history_hash() else {
        return Err(FenceError::ReadOnly(Text::new(
            "cannot grant a lease during recovery",
        )));
    };
    let stored = exec_internal(SQL_HISTORY, true, &[], &mut [], true, |d| d.value() as i64);
    if stored != Some(hist) {
        // Serialized among backends by a short session lock: setval is not transactional, and
        // two backends moving the sequence at once could move it back. Released when `_guard`
        // drops, also if an ERROR unwinds through here.
        let _guard = LeaseHistoryLock::take();
        let stored = exec_internal(SQL_HISTORY, true, &[], &mut [], true, |d| d.value() as i64);
        if stored != Some(hist) {
            let floor = process::now_us().max(TOKEN_FLOOR);
            exec_internal(
                SQL_MOVE_TO_CLOCK,
                true,
                &[pg_sys::INT8OID],
                &mut [pg_sys::Datum::from(floor)],
                false,
                |_| (),
            );
            exec_internal(
                SQL_SET_HISTORY,
                true,
                &[pg_sys::INT8OID],
                &mut [pg_sys::Datum::from(hist)],
                false,
                |_| (),
            );
        }
    }
    exec_internal(SQL_NEXT, true, &[], &mut [], false, |d| d.value() as i64)
        .filter(|t| *t >= TOKEN_FLOOR)
        .ok_or_else(|| FenceError::Internal("the lease token sequence returned no token".into()))
}

/// What `fencing_lease_acquire` finds of a lease name (the states of the module comment, read
/// with the latest committed snapshot; a grant not yet committed reads as `Free`, and the grant
/// then waits for it in the unique index).
enum Seen {
    /// No row: never granted, or released.
    Free,
    /// Its holder's lease expired (by the database clock): it may be taken over.
    Expired { token: Token },
    /// Held until `expires` (microseconds since 2000).
    Live { expires: i64 },
}

fn look(name: &str, now: i64) -> Seen {
    let row = exec_internal_row(
        SQL_LOOK,
        true,
        &[pg_sys::TEXTOID],
        &mut [text_datum(name)],
        true,
        |r| (as_i64(r[0]), as_i64(r[1])),
    );
    match row {
        None => Seen::Free,
        Some((Some(token), Some(expires))) if expires <= now => Seen::Expired { token },
        // Both columns are NOT NULL; a row read without them is treated as held.
        Some((_, expires)) => Seen::Live {
            expires: expires.unwrap_or(now),
        },
    }
}

/// The token of a grant that now holds its name's row (inserted or taken over, not yet
/// committed): issued again, after the row was won. The first token was issued before the
/// statement that won the row, which may have waited (in the unique index, for a row lock) or
/// been delayed while another grant of the name committed and was released; a token issued now
/// comes after every token of a grant that committed before this one got the row (tokens come
/// from one sequence), so the name's grants and their tokens go up together.
fn retoken(placeholder: Token) -> Result<Token, FenceError> {
    let token = issue_token()?;
    exec_internal(
        SQL_RETOKEN,
        true,
        &[pg_sys::INT8OID, pg_sys::INT8OID],
        &mut [pg_sys::Datum::from(placeholder), pg_sys::Datum::from(token)],
        false,
        |_| (),
    );
    Ok(token)
}

/// `fencing_lease_acquire`: grant lease `name` for `ttl` (an `interval` datum, checked positive
/// by the caller) if it is free or expired, else wait up to `wait_ms` (woken by a release's
/// commit or at the holder's expiry) and then fail with `55P03`. Returns the token.
pub fn acquire(name: &str, ttl: pg_sys::Datum, wait_ms: i64) -> Result<Token, FenceError> {
    require_writable("acquire")?;
    let caller = process::current_user();
    let deadline = process::monotonic_ms().saturating_add(wait_ms);
    if wait_ms > 0 {
        // Before the first look, so that no release committed after it goes unnoticed.
        register_lease_waiter(name);
    }
    loop {
        let now = process::now_us();
        match look(name, now) {
            Seen::Free => {
                let token = issue_token()?;
                // A grant of the name not yet committed is waited for in the unique index, at
                // most for the wait left (then 55P03, lock_timeout's own error).
                let _bound = LockWaitBound::new(deadline.saturating_sub(process::monotonic_ms()));
                let granted = exec_internal(
                    SQL_INSERT,
                    true,
                    &[
                        pg_sys::TEXTOID,
                        pg_sys::INT8OID,
                        pg_sys::INTERVALOID,
                        pg_sys::OIDOID,
                    ],
                    &mut [
                        text_datum(name),
                        pg_sys::Datum::from(token),
                        ttl,
                        pg_sys::Datum::from(caller),
                    ],
                    false,
                    |d| d.value() as i64,
                );
                if let Some(acquired_at) = granted {
                    if process::now_us() - acquired_at > 1_000 {
                        exec_internal(
                            SQL_RESTART,
                            true,
                            &[pg_sys::INT8OID],
                            &mut [pg_sys::Datum::from(token)],
                            false,
                            |_| (),
                        );
                    }
                    let token = retoken(token)?;
                    process::make_commit_durable();
                    return Ok(token);
                }
                // Another grant of the free name came first: look again.
            }
            Seen::Expired { token: old } => {
                let token = issue_token()?;
                // A renewal or grant in flight holds the row: waited for at most the wait left.
                let _bound = LockWaitBound::new(deadline.saturating_sub(process::monotonic_ms()));
                let granted = exec_internal(
                    SQL_TAKE_OVER,
                    true,
                    &[
                        pg_sys::TEXTOID,
                        pg_sys::INT8OID,
                        pg_sys::INTERVALOID,
                        pg_sys::OIDOID,
                        pg_sys::INT8OID,
                    ],
                    &mut [
                        text_datum(name),
                        pg_sys::Datum::from(token),
                        ttl,
                        pg_sys::Datum::from(caller),
                        pg_sys::Datum::from(old),
                    ],
                    false,
                    |d| d.value() as i64,
                );
                if granted.is_some() {
                    let token = retoken(token)?;
                    exec_internal(
                        SQL_NOTIFY_TAKE_OVER,
                        true,
                        &[pg_sys::TEXTOID, pg_sys::INT8OID, pg_sys::INT8OID],
                        &mut [
                            text_datum(name),
                            pg_sys::Datum::from(token),
                            pg_sys::Datum::from(old),
                        ],
                        false,
                        |_| (),
                    );
                    process::make_commit_durable();
                    return Ok(token);
                }
                // Renewed, released or taken over meanwhile: look again.
            }
            Seen::Live { expires } => {
                let left = deadline.saturating_sub(process::monotonic_ms());
                if left <= 0 {
                    return Err(FenceError::LeaseNotFree(Text {
                        message: format!("lease \"{name}\" is held by another holder"),
                        detail: Some(if wait_ms > 0 {
                            format!("It stayed held for the {wait_ms} ms this call waited.")
                        } else {
                            "The call was not asked to wait (wait = 0).".into()
                        }),
                        hint: Some(
                            "Retry later or pass a longer wait; see fencing_leases for the holder and its expiry."
                                .into(),
                        ),
                    }));
                }
                // Until the holder's expiry (by the database clock) or a release's wake-up,
                // whichever comes first; never longer than the wait left.
                let until_expiry = (expires - now) / 1000 + 1;
                process::nap(left.min(until_expiry).max(1));
            }
        }
    }
}

/// The lease row holding `token`, checked for the caller's right to renew or release it:
/// (name, live). `FT003` if no lease holds it, `42501` if the caller is not a member of the role
/// that acquired it.
fn owned_lease(token: Token, what: &str) -> Result<Option<(String, bool)>, FenceError> {
    let row = look_token(token, |r| {
        (
            r[0].map(text_of),
            as_i64(r[1]),
            r[2].is_some_and(|d| d.value() != 0),
        )
    });
    match row {
        None => Ok(None),
        Some((Some(name), Some(expires), member)) => {
            if !member {
                return Err(FenceError::NotAllowed(Text {
                    message: format!("permission denied to {what} lease \"{name}\""),
                    detail: Some(
                        "Only members of the role that acquired a lease may renew or release it."
                            .into(),
                    ),
                    hint: Some("Connect as that role (fencing_leases.acquired_by).".into()),
                }));
            }
            Ok(Some((name, process::now_us() < expires)))
        }
        Some(_) => Err(FenceError::Internal(
            "lease row without name or expiry".into(),
        )),
    }
}

/// `fencing_lease_renew`: extend the live lease holding `token` by `ttl` from now (`None`: its
/// own ttl); returns the new expiry (microseconds since 2000). `FT003` if it has ended.
pub fn renew(token: Token, ttl: Option<pg_sys::Datum>) -> Result<i64, FenceError> {
    require_writable("renew")?;
    let ended = || FenceError::LeaseEnded {
        token,
        why: why_not_live(token),
        write: false,
    };
    match owned_lease(token, "renew")? {
        Some((_, true)) => {}
        _ => return Err(ended()),
    }
    let expires = match ttl {
        Some(ttl) => exec_internal(
            SQL_RENEW,
            true,
            &[pg_sys::INT8OID, pg_sys::INTERVALOID],
            &mut [pg_sys::Datum::from(token), ttl],
            false,
            |d| d.value() as i64,
        ),
        None => exec_internal(
            SQL_RENEW_SAME,
            true,
            &[pg_sys::INT8OID],
            &mut [pg_sys::Datum::from(token)],
            false,
            |d| d.value() as i64,
        ),
    }
    .ok_or_else(ended)?;
    // Read again by this transaction's next write (which sees this renewal; a rollback of it
    // is not seen).
    LIVE.with(|l| l.borrow_mut().remove(&token));
    Ok(expires)
}

/// `fencing_lease_release`: end the lease holding `token`; true if it was live, false if it had
/// already ended (expired, released or taken over). Its waiters are woken after the commit.
pub fn release(token: Token) -> Result<bool, FenceError> {
    require_writable("release")?;
    if owned_lease(token, "release")?.is_none() {
        return Ok(false);
    }
    let gone = exec_internal_row(
        SQL_RELEASE,
        true,
        &[pg_sys::INT8OID],
        &mut [pg_sys::Datum::from(token)],
        false,
        |r| (r[0].map(text_of), as_i64(r[1])),
    );
    LIVE.with(|l| l.borrow_mut().remove(&token));
    match gone {
        Some((Some(name), Some(expires))) => {
            let live = process::now_us() < expires;
            RELEASED.with(|r| r.borrow_mut().push(name));
            Ok(live)
        }
        _ => Ok(false),
    }
}

/// A resource's mark rose from `previous` to `token`: if `previous` is a live lease's token,
/// tell its holder (`NOTIFY pg_fencing`, sent at commit).
pub fn notify_mark_raised(resource: &str, previous: Token, token: Token) {
    if previous < TOKEN_FLOOR || previous == token {
        return;
    }
    let now = process::now_us();
    let live = LIVE.with(|l| l.borrow().get(&previous).is_some_and(|e| now < *e))
        || matches!(probe(previous), Some(Some(exp)) if now < exp);
    if live {
        exec_internal(
            SQL_NOTIFY_MARK,
            true,
            &[pg_sys::TEXTOID, pg_sys::INT8OID, pg_sys::INT8OID],
            &mut [
                text_datum(resource),
                pg_sys::Datum::from(token),
                pg_sys::Datum::from(previous),
            ],
            false,
            |_| (),
        );
    }
}

/// Per-backend state's life (`backend.rs`): at commit, waiters for the leases the transaction
/// released look again (now that it is visible); the leases it granted, renewed or read are
/// forgotten when it ends, and read again after a rolled-back savepoint (its grants and
/// renewals were rolled back).
pub fn on_event(ev: BackendEvent) {
    if ev == BackendEvent::Commit {
        wake_released();
    }
    if ev.ends_transaction() {
        forget_transaction();
    }
    if let BackendEvent::SubAbort(_) = ev {
        forget_seen();
    }
}
