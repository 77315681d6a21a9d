//! Errors raised by pg_fencing, and the one mapping from each to its SQLSTATE (`sqlstate()`),
//! message, detail and hint. Plain Rust: they are raised by `pg/report.rs`.
//!
//! pgrx's `ErrorReport` only carries SQLSTATEs that PostgreSQL itself defines, and any error that
//! crosses a pgrx FFI boundary is re-raised with `PgSqlErrorCode`, which turns an unknown class
//! such as our `FTxxx` into `XX000`. So our errors are values (`FenceError`) until they reach the
//! outermost frame of a C entry point (`api/functions.rs`), and only there are they raised.
#![forbid(unsafe_code)]

use pg_fencing_core::token::TokenError;
use std::ffi::c_int;
use thiserror::Error;

/// `sqlstate!("FT001")`: a [`Sqlstate`] checked at compile time.
macro_rules! sqlstate {
    ($code:literal) => {
        const { $crate::error::Sqlstate::new($code) }
    };
}

/// A 64-bit fencing token as stored and compared (PostgreSQL `bigint`).
pub type Token = i64;

/// Where a high-water mark lives: a resource (resource mode) or one row (per-row mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Domain {
    Resource(String),
    Row {
        table: String,
        key: String,
    },
    /// A per-row key without a tombstone, refused by its table's tombstone floor
    /// (`fencing_prune_tombstones`): the message says so, since the holder may be a rightful one.
    RowFloor {
        table: String,
        key: String,
    },
}

impl std::fmt::Display for Domain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Domain::Resource(r) => write!(f, "resource \"{r}\""),
            Domain::Row { table, key } | Domain::RowFloor { table, key } => {
                write!(f, "row {key} of table {table}")
            }
        }
    }
}

/// The message, detail and hint of an error whose text is written where it is raised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text {
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

impl Text {
    /// A message without detail or hint.
    pub fn new(message: impl Into<String>) -> Self {
        Text {
            message: message.into(),
            detail: None,
            hint: None,
        }
    }
}

impl std::fmt::Display for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Every error pg_fencing raises on purpose. Each variant maps to one SQLSTATE, in one place
/// (`sqlstate()`); the table in docs/reference.md lists them (`error_table_matches_the_docs`).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FenceError {
    /// FT001: the token is lower than the high-water mark of what the write touches.
    #[error("stale fencing token {token} for {domain}")]
    StaleToken {
        domain: Domain,
        token: Token,
        high_water: Token,
    },

    /// FT002: a write to a protected table (or an advance) without a token. `ignored`: the
    /// session's `pg_fencing.token` holds a token whose source does not count here, and why
    /// (`rule/session_token.rs`, "TokenSource").
    #[error("no fencing token for {target}")]
    NoToken {
        target: String,
        ignored: Option<&'static str>,
        /// The session looks like a restore (`check_function_bodies = off`, as pg_dump's
        /// scripts set it): the hint names the restore procedure.
        restoring: bool,
    },

    /// 22P02: the token text is not an integer.
    #[error("invalid fencing token \"{0}\": not an integer")]
    TokenSyntax(String),

    /// 22003: the token does not fit in a bigint.
    #[error("fencing token \"{0}\" is out of range (1 .. 9223372036854775807)")]
    TokenRange(String),

    /// 22023: the token is zero or negative.
    #[error("fencing token {0} is not positive")]
    TokenNotPositive(String),

    /// 22023: some other argument is unusable (empty resource name, NULL where not allowed).
    #[error("{0}")]
    InvalidArgument(String),

    /// 22023: a jsonb argument of a `fenced_*` call has the wrong shape (not an object, a key
    /// that is not the primary key, changes that set the token column or nothing).
    #[error("{0}")]
    ArgumentShape(Text),

    /// 22023: `fencing_domain_stats` was asked for a kind of domain that does not exist.
    #[error("unknown kind of fencing domain \"{0}\"")]
    UnknownDomainKind(String),

    /// 22004: a `fenced_*` argument that must not be NULL is.
    #[error("{0}")]
    NullArgument(Text),

    /// 42703: a `fenced_*` jsonb argument names a column the table does not have.
    #[error("{0}")]
    UndefinedColumn(Text),

    /// P0002: `fenced_update` / `fenced_delete` found no row with the key.
    #[error("{0}")]
    NoSuchRow(Text),

    /// FT002: a `fenced_*` call without a token (its last argument is NULL).
    #[error("{0}")]
    NoTokenArgument(Text),

    /// FT004: a `fenced_*` call on a table that is not protected, or whose protection is not
    /// active.
    #[error("{0}")]
    NotProtected(Text),

    /// 2BP01: `DROP EXTENSION pg_fencing` while tables are protected (it would delete their
    /// marks and tombstones).
    #[error("{0}")]
    DependentObjects(Text),

    /// 55000: a schema change that would lower the fence (a partition of a per-row table dropped
    /// by a command that cannot carry its marks first).
    #[error("{0}")]
    SchemaChangeRefused(Text),

    /// 42P16: the table's definition does not allow the protection (e.g. a deferrable primary
    /// key in per-row mode).
    #[error("{0}")]
    InvalidTableDefinition(Text),

    /// 42501: the caller lacks a privilege (not the table's owner, no write privilege on the
    /// resource's tables, not a superuser).
    #[error("{0}")]
    NotAllowed(Text),

    /// 0A000: something the extension does not support (PREPARE TRANSACTION after a watch
    /// registration change).
    #[error("{0}")]
    NotSupported(Text),

    /// 55000: the database's extension objects are older than the library needs (`fencing_watch`
    /// before `ALTER EXTENSION pg_fencing UPDATE` from 0.1.0).
    #[error("{0}")]
    ExtensionNotUpdated(Text),

    /// 53400: every watch slot of the worker is in use.
    #[error("{0}")]
    WatchSlotsFull(Text),

    /// XX000: pg_fencing could not read its own catalog entries (a bug or a broken
    /// installation, never bad input).
    #[error("pg_fencing: {0}")]
    Internal(String),

    /// FT003: the token belongs to a lock whose lease was lost (expired or revoked).
    #[error("fencing token {token} belongs to lock \"{lock}\", which was lost")]
    LockLost {
        lock: String,
        token: Token,
        why: String,
    },

    /// FT003: `fencing_acquire`'s lease ended (expired or was revoked) while its request waited,
    /// so the lock was not granted and no token was issued.
    #[error("lock \"{lock}\" was not granted: its lease ended while the request waited")]
    NotGranted { lock: String, why: String },

    /// FT003: the token is in the range of PostgreSQL lease tokens (from 2^48 up,
    /// `lock_service/leases.rs`) but no live lease holds it: the lease expired, was released or
    /// was taken over, or the token was granted in a history this database lost or never granted.
    #[error("fencing token {token} is not the token of a live PostgreSQL lease")]
    LeaseEnded {
        token: Token,
        why: String,
        /// Refused as a write's token (the time fence; logged at `pg_fencing.log_rejections`),
        /// not as an argument of `fencing_lease_renew` or `fencing_lease_check`.
        write: bool,
    },

    /// 55P03: `fencing_lease_acquire` found the lease held and its `wait` ran out.
    #[error("{}", .0.message)]
    LeaseNotFree(Text),

    /// 25006: a lease cannot be granted, renewed or released on a server in recovery.
    #[error("{}", .0.message)]
    ReadOnly(Text),

    /// 25000: pg_fencing was asked to check or record a write during a parallel operation (a
    /// function wrongly declared `PARALLEL SAFE` writes under a parallel plan): PostgreSQL's own
    /// answer for such a write (`pg::process::latest_snapshot`).
    #[error("{}", .0.message)]
    ParallelMode(Text),

    /// FT005: the lock service is unreachable (or answered with an error).
    #[error("the lock service is unavailable: {0}")]
    LockServiceUnavailable(String),

    /// 55P03: `fencing_acquire` timed out.
    #[error("could not obtain lock \"{0}\" within the timeout")]
    LockTimeout(String),

    /// 53400: every lock slot of the worker is in use.
    #[error("all {0} lock slots of the pg_fencing worker are in use")]
    TooManyLocks(usize),

    /// 55000: the background worker is not available (not preloaded, not configured, full).
    #[error("{0}")]
    WorkerUnavailable(String),

    /// 39P01: the trigger function was called outside a trigger, or with the wrong arguments.
    #[error("{0}")]
    TriggerProtocol(String),

    /// FT006: verify mode of a watched resource: the token cannot have been issued to the
    /// current holder, or the worker's view of etcd is too old to tell.
    #[error("fencing token {token} for resource \"{resource}\" is not verified: {why}")]
    NotVerified {
        resource: String,
        token: Token,
        why: String,
    },
}

impl FenceError {
    /// The five-character SQLSTATE of this error (see the SQLSTATE table in docs/reference.md; `error_table_matches_the_docs` checks it).
    pub fn sqlstate(&self) -> Sqlstate {
        match self {
            FenceError::StaleToken { .. } => sqlstate!("FT001"),
            FenceError::NoToken { .. } => sqlstate!("FT002"),
            FenceError::TokenSyntax(_) => sqlstate!("22P02"),
            FenceError::TokenRange(_) => sqlstate!("22003"),
            FenceError::TokenNotPositive(_) => sqlstate!("22023"),
            FenceError::InvalidArgument(_) => sqlstate!("22023"),
            FenceError::NotAllowed(_) => sqlstate!("42501"),
            FenceError::InvalidTableDefinition(_) => sqlstate!("42P16"),
            FenceError::ArgumentShape(_) => sqlstate!("22023"),
            FenceError::UnknownDomainKind(_) => sqlstate!("22023"),
            FenceError::NullArgument(_) => sqlstate!("22004"),
            FenceError::UndefinedColumn(_) => sqlstate!("42703"),
            FenceError::NoSuchRow(_) => sqlstate!("P0002"),
            FenceError::NoTokenArgument(_) => sqlstate!("FT002"),
            FenceError::NotProtected(_) => sqlstate!("FT004"),
            FenceError::DependentObjects(_) => sqlstate!("2BP01"),
            FenceError::SchemaChangeRefused(_) => sqlstate!("55000"),
            FenceError::NotSupported(_) => sqlstate!("0A000"),
            FenceError::ExtensionNotUpdated(_) => sqlstate!("55000"),
            FenceError::WatchSlotsFull(_) => sqlstate!("53400"),
            FenceError::Internal(_) => sqlstate!("XX000"),
            FenceError::LockLost { .. } => sqlstate!("FT003"),
            FenceError::NotGranted { .. } => sqlstate!("FT003"),
            FenceError::LeaseEnded { .. } => sqlstate!("FT003"),
            FenceError::LeaseNotFree(_) => sqlstate!("55P03"),
            FenceError::ReadOnly(_) => sqlstate!("25006"),
            FenceError::ParallelMode(_) => sqlstate!("25000"),
            FenceError::LockServiceUnavailable(_) => sqlstate!("FT005"),
            FenceError::LockTimeout(_) => sqlstate!("55P03"),
            FenceError::WorkerUnavailable(_) => sqlstate!("55000"),
            FenceError::TooManyLocks(_) => sqlstate!("53400"),
            FenceError::TriggerProtocol(_) => sqlstate!("39P01"),
            FenceError::NotVerified { .. } => sqlstate!("FT006"),
        }
    }

    /// The text of the variants whose text is written where they are raised.
    fn text(&self) -> Option<&Text> {
        match self {
            FenceError::ArgumentShape(t)
            | FenceError::NullArgument(t)
            | FenceError::UndefinedColumn(t)
            | FenceError::NoSuchRow(t)
            | FenceError::NoTokenArgument(t)
            | FenceError::NotProtected(t)
            | FenceError::DependentObjects(t)
            | FenceError::SchemaChangeRefused(t)
            | FenceError::InvalidTableDefinition(t)
            | FenceError::NotAllowed(t)
            | FenceError::NotSupported(t)
            | FenceError::ExtensionNotUpdated(t)
            | FenceError::WatchSlotsFull(t)
            | FenceError::LeaseNotFree(t)
            | FenceError::ReadOnly(t)
            | FenceError::ParallelMode(t) => Some(t),
            _ => None,
        }
    }

    pub fn detail(&self) -> Option<String> {
        match self {
            FenceError::StaleToken { domain: domain @ Domain::RowFloor { .. }, token, high_water } => Some(format!(
                "The write carries fencing token {token}, but {domain} has no tombstone and its table's tombstone floor is {high_water}: tokens below the floor are refused for keys without a tombstone."
            )),
            FenceError::StaleToken { domain, token, high_water } => Some(format!(
                "The write carries fencing token {token}, but the high-water mark of {domain} is {high_water}."
            )),
            FenceError::NoToken { ignored: Some(why), .. } => Some((*why).into()),
            FenceError::NoToken { .. } => Some(
                "Writes to a table protected by pg_fencing must carry the lock holder's fencing token.".into(),
            ),
            FenceError::LockLost { why, .. } if !why.is_empty() => Some(format!("{why}.")),
            FenceError::NotGranted { why, .. } => Some(format!("{why}.")),
            FenceError::LeaseEnded { why, .. } => Some(format!("{why}.")),
            FenceError::UnknownDomainKind(_) => Some("kind is 'resource' or 'table'.".into()),
            _ => self.text().and_then(|t| t.detail.clone()),
        }
    }

    pub fn hint(&self) -> Option<String> {
        match self {
            FenceError::StaleToken { domain: Domain::RowFloor { .. }, .. } => Some(
                "Either this client's lock is no longer valid (stop and re-acquire it), or the floor \
                 was set above a holder that is still running: see docs/operations.md, \
                 \"Tombstone retention\"."
                    .into(),
            ),
            FenceError::StaleToken { .. } => Some(
                "A newer lock holder has written; this client's lock is no longer valid. Stop and \
                 re-acquire the lock instead of retrying with the same token."
                    .into(),
            ),
            FenceError::NoToken { restoring: true, .. } => Some(
                "This looks like a restore (check_function_bodies = off). Rows of a data-only dump are loaded with session_replication_role = replica, as a superuser: PGOPTIONS='-c session_replication_role=replica' psql -f data.sql (docs/operations.md, \"Backup and restore\"). Otherwise run SET LOCAL pg_fencing.token = <token> in the transaction."
                    .into(),
            ),
            FenceError::NoToken { .. } => Some(
                "Run SET LOCAL pg_fencing.token = <token> in the transaction, or use fenced_insert/fenced_update/fenced_delete."
                    .into(),
            ),
            FenceError::LockLost { .. } => Some(
                "Another client may hold the lock now. Stop; call fencing_acquire again for a new token.".into(),
            ),
            FenceError::NotGranted { .. } => Some(
                "Nothing was written with a token of this request. Call fencing_acquire again."
                    .into(),
            ),
            FenceError::LockServiceUnavailable(_) => Some(
                "Check pg_fencing.etcd_endpoints and that etcd is running; the worker reconnects by itself.".into(),
            ),
            FenceError::LeaseEnded { .. } => Some(
                "Stop: another holder may have the lease now. Call fencing_lease_acquire again for a new token (docs/leases.md)."
                    .into(),
            ),
            FenceError::LockTimeout(_) => Some(
                "Another client holds the lock. Retry later or pass a longer timeout.".into(),
            ),
            FenceError::TooManyLocks(_) => Some(
                "Release locks that are no longer needed (fencing_release, or end the sessions holding them; see fencing_locks), or raise pg_fencing.max_locks (server start).".into(),
            ),
            FenceError::WorkerUnavailable(_) => Some(
                "Set shared_preload_libraries = 'pg_fencing' and pg_fencing.etcd_endpoints, then restart the server.".into(),
            ),
            FenceError::TokenSyntax(_) | FenceError::TokenRange(_) | FenceError::TokenNotPositive(_) => Some(
                "A fencing token is a positive 64-bit integer, e.g. the revision etcd returned when it granted the lock.".into(),
            ),
            FenceError::NotVerified { .. } => Some(
                "The resource is watched with verify: a token must lie between the lock's last hand-over revision and the latest revision etcd has reported, as seen by the worker within pg_fencing.verify_max_lag. Take tokens only from the lock service; retry if the worker was busy.".into(),
            ),
            _ => self.text().and_then(|t| t.hint.clone()),
        }
    }
}

/// A SQLSTATE: five ASCII digits or capital letters, checked when it is made. Written as
/// `sqlstate!("FT001")`, which is evaluated at compile time, so a malformed code is a build error
/// and raising an error can never fail (or panic into C) on one.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Sqlstate([u8; 5]);

impl Sqlstate {
    pub const fn new(code: &str) -> Sqlstate {
        let b = code.as_bytes();
        assert!(b.len() == 5, "a SQLSTATE has five characters");
        let mut i = 0;
        while i < 5 {
            assert!(
                b[i].is_ascii_digit() || b[i].is_ascii_uppercase(),
                "a SQLSTATE is made of digits and capital letters"
            );
            i += 1;
        }
        Sqlstate([b[0], b[1], b[2], b[3], b[4]])
    }

    pub fn as_str(&self) -> &str {
        // Always ASCII (checked in `new`), so the fallback is never taken.
        std::str::from_utf8(&self.0).unwrap_or("XX000")
    }
}

impl std::fmt::Display for Sqlstate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for Sqlstate {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl From<TokenError> for FenceError {
    fn from(e: TokenError) -> Self {
        match e {
            TokenError::Syntax(s) => FenceError::TokenSyntax(s),
            TokenError::Range(s) => FenceError::TokenRange(s),
            TokenError::NotPositive(s) => FenceError::TokenNotPositive(s),
        }
    }
}

/// Parse the text form of a token (`pg_fencing.token`). The empty string (after trimming) means
/// "no token" (`None`). The parsing itself is `pg_fencing_core::token` (fuzzed on its own).
pub fn parse_token(text: &str) -> Result<Option<Token>, FenceError> {
    Ok(pg_fencing_core::token::parse_token(text)?)
}

/// Check a token that arrived as a bigint (positive).
pub fn token_from_bigint(token: i64) -> Result<Token, FenceError> {
    Ok(pg_fencing_core::token::check_token(token)?)
}

/// PostgreSQL's MAKE_SQLSTATE. Total: a `Sqlstate` always has five valid characters.
pub fn make_sqlstate(code: Sqlstate) -> c_int {
    let mut v: c_int = 0;
    for (i, ch) in code.0.iter().enumerate() {
        v += (((*ch as c_int) - ('0' as c_int)) & 0x3F) << (6 * i);
    }
    v
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn token_errors_keep_their_sqlstate() {
        for (text, code) in [
            ("x", "22P02"),
            ("9223372036854775808", "22003"),
            ("0", "22023"),
        ] {
            let core_code = pg_fencing_core::token::parse_token(text)
                .unwrap_err()
                .sqlstate();
            assert_eq!(parse_token(text).unwrap_err().sqlstate(), code);
            assert_eq!(core_code, code);
        }
        assert_eq!(parse_token(" 7 ").unwrap(), Some(7));
        assert_eq!(token_from_bigint(-1).unwrap_err().sqlstate(), "22023");
    }

    /// Every SQLSTATE the mapping (`sqlstate()`) can produce is in the SQLSTATE table of
    /// docs/reference.md, and every `FTxxx` code there is one the mapping produces. (XX000 is
    /// an internal failure, never a documented outcome.)
    #[test]
    fn error_table_matches_the_docs() {
        let source = include_str!("error.rs");
        let start = source.find("pub fn sqlstate(&self)").unwrap();
        let end = start + source[start..].find("\n    }\n").unwrap();
        let mapped: std::collections::BTreeSet<&str> = source[start..end]
            .split("sqlstate!(\"")
            .skip(1)
            .map(|rest| &rest[..5])
            .filter(|c| *c != "XX000")
            .collect();
        assert!(mapped.len() >= 15, "the mapping was not found: {mapped:?}");
        let docs = include_str!("../docs/reference.md");
        let t0 = docs
            .find("## SQLSTATEs")
            .expect("docs/reference.md has a SQLSTATEs section");
        let table: String = docs[t0..]
            .lines()
            .skip(1)
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .map(|l| l.split('|').nth(1).unwrap_or("").to_string())
            .collect::<Vec<_>>()
            .join(" ");
        let documented: std::collections::BTreeSet<String> = table
            .split('`')
            .filter(|w| {
                w.len() == 5
                    && w.chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
            })
            .map(str::to_string)
            .collect();
        for code in &mapped {
            assert!(
                documented.contains(*code),
                "SQLSTATE {code} is raised but not in docs/reference.md's table"
            );
        }
        for code in documented.iter().filter(|c| c.starts_with("FT")) {
            assert!(
                mapped.contains(code.as_str()),
                "{code} is documented but never raised"
            );
        }
    }

    #[test]
    fn sqlstate_text_round_trips() {
        assert_eq!(sqlstate!("FT006").as_str(), "FT006");
        assert_eq!(sqlstate!("42P16").to_string(), "42P16");
    }

    #[test]
    #[should_panic(expected = "five characters")]
    fn sqlstate_of_four_characters_is_refused() {
        // At run time this panics; written as sqlstate!("FT01") it does not compile.
        let _ = Sqlstate::new("FT01");
    }

    #[test]
    #[should_panic(expected = "digits and capital letters")]
    fn sqlstate_in_lower_case_is_refused() {
        let _ = Sqlstate::new("ft001");
    }

    #[test]
    fn sqlstate_encoding_matches_postgres() {
        // ERRCODE_UNIQUE_VIOLATION = MAKE_SQLSTATE('2','3','5','0','5') = 23505 in PostgreSQL.
        assert_eq!(
            make_sqlstate(sqlstate!("23505")),
            pgrx::PgSqlErrorCode::ERRCODE_UNIQUE_VIOLATION as c_int
        );
        assert_ne!(
            make_sqlstate(sqlstate!("FT001")),
            make_sqlstate(sqlstate!("FT002"))
        );
    }
}
