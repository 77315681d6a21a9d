//! The client side of pg_fencing, the PostgreSQL extension that refuses a write whose fencing
//! token is below the highest one it has seen (the high-water mark of the resource or row).
//!
//! What this crate gives a Rust service:
//! - a **fenced transaction**: BEGIN and the token go to the server in one simple-protocol query,
//!   `BEGIN NOT DEFERRABLE; SELECT pg_catalog.set_config('pg_fencing.token', '<token>', true)`
//!   (`SET LOCAL pg_fencing.token = '<token>'` where the driver shows a server of PostgreSQL 16
//!   or later, [`TokenForm`]), so it takes as many round trips as the same transaction
//!   unfenced, and the token is transaction-scoped: it ends with
//!   the transaction, and the next user of a pooled connection never carries it (also when the
//!   future is dropped half-way: the transaction is rolled back). For tokio-postgres
//!   ([`tokio_postgres::fenced`]) and sqlx ([`sqlx::fenced`] on a pool's connection,
//!   [`sqlx::fenced_pool`]);
//! - **typed errors** for the extension's SQLSTATEs `FT001` … `FT006` ([`FencingError`], with
//!   the resource, or the row and table, and the high-water mark of a stale token), and
//!   [`Error::RolledBack`] when a statement failed and the transaction could not commit;
//! - **PostgreSQL leases** ([`Lease`]): `fencing_lease_acquire`, renewed every third of the TTL
//!   on a connection of its own by a tokio task, released at the end; lost (and
//!   [`Lease::lost`] resolves) when a renewal fails or its TTL passes without a confirmed one;
//! - the **one-call form**: take a lease, run a function in a transaction fenced by its token
//!   while the lease is renewed, check the lease before committing, release
//!   (`run_with_lease` for each driver);
//! - with the `etcd` feature, the token of an etcd lock ([`etcd::lock`]): the revision of the
//!   lock response's header, checked to be still held.
//!
//! Features: `tokio-postgres` (default), `sqlx`, `etcd`. Rust 1.85 or later (async closures).
//! The SQLSTATEs and the SQL functions are the extension's: see its docs/sqlstates.md and
//! docs/leases.md.

mod error;
mod lease;

#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "sqlx")]
pub mod sqlx;
#[cfg(feature = "tokio-postgres")]
pub mod tokio_postgres;

pub use error::{Code, Error, FencingError};
pub use lease::{Lease, LeaseConn, LeaseOptions};

/// Checks that `token` is a fencing token: 1 … 2^63 − 1 ([`Error::BadToken`] otherwise).
pub fn check_token(token: i64) -> Result<i64, Error> {
    if token < 1 {
        return Err(Error::BadToken(token));
    }
    Ok(token)
}

/// How the token goes with `BEGIN`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenForm {
    /// `SELECT pg_catalog.set_config('pg_fencing.token', '<token>', true)`: for any server.
    /// PostgreSQL 15's pg_stat_statements keeps the constant of a `SET` statement (one entry per
    /// token), not this call's.
    SetConfig,
    /// `SET LOCAL pg_fencing.token = '<token>'`: no row to send back, cheaper; for PostgreSQL
    /// 16 or later, whose pg_stat_statements keeps one entry for it whatever the token, and for
    /// a server without pg_stat_statements.
    SetLocal,
}

impl TokenForm {
    /// The form for a server of `server_version_num` (`None`: not known).
    pub fn for_server(server_version_num: Option<u32>) -> TokenForm {
        match server_version_num {
            Some(v) if v >= 160000 => TokenForm::SetLocal,
            _ => TokenForm::SetConfig,
        }
    }

    /// The query that asks a connection which form it takes ([`TokenForm::from_answer`] reads
    /// its one row): [`TokenForm::SetLocal`] on PostgreSQL 16 or later, or where
    /// pg_stat_statements is not loaded (its settings are defined in every session of a server
    /// that preloads it; loading it needs a restart, which ends the connection).
    pub const PROBE_SQL: &'static str = "SELECT pg_catalog.current_setting('server_version_num')::int OPERATOR(pg_catalog.>=) 160000 OR pg_catalog.current_setting('pg_stat_statements.max', true) IS NULL";

    /// The form [`TokenForm::PROBE_SQL`]'s answer (its one boolean) names.
    pub fn from_answer(set_local: bool) -> TokenForm {
        if set_local {
            TokenForm::SetLocal
        } else {
            TokenForm::SetConfig
        }
    }
}

/// The one query that opens a fenced transaction: BEGIN and the transaction-scoped token
/// (`set_config(…, true)`, [`TokenForm::SetConfig`]). Only the checked integer is written into
/// it. `BEGIN NOT DEFERRABLE` fails (`25001`) on a connection whose transaction has already read
/// or written anything (PostgreSQL sets a transaction's modes only before its first snapshot)
/// or is inside a savepoint, and (`25P02`) on one whose transaction failed, so that the token
/// never reaches a read or write before it;
/// `NOT DEFERRABLE` is the default mode, and it matters only to `SERIALIZABLE READ ONLY`
/// transactions (PostgreSQL's `SET TRANSACTION`).
pub fn begin_sql(token: i64) -> Result<String, Error> {
    begin_sql_as(token, TokenForm::SetConfig)
}

/// [`begin_sql`] with the token in `form`.
pub fn begin_sql_as(token: i64, form: TokenForm) -> Result<String, Error> {
    let token = check_token(token)?;
    Ok(match form {
        TokenForm::SetConfig => format!(
            "BEGIN NOT DEFERRABLE; SELECT pg_catalog.set_config('pg_fencing.token', '{token}', true)"
        ),
        TokenForm::SetLocal => {
            format!("BEGIN NOT DEFERRABLE; SET LOCAL pg_fencing.token = '{token}'")
        }
    })
}

/// Whether `code`, the SQLSTATE of [`begin_sql`]'s query, says the connection was already in a
/// transaction: `25001` (it had taken a snapshot, or a savepoint was open) or `25P02` (it had
/// failed).
pub(crate) fn in_transaction_code(code: &str) -> bool {
    code == "25001" || code == "25P02"
}

/// What a fenced call says when the connection was already in a transaction.
pub(crate) const IN_TRANSACTION: &str =
    "fenced starts its own transaction: the connection was already in one";

/// The query that ends a fenced transaction where the driver does not show `COMMIT`'s command
/// tag. PostgreSQL answers a plain `COMMIT` of an aborted transaction with `ROLLBACK`, and one sent
/// after the transaction was already ended with a warning, both without an error, which the drivers
/// report as success. The `SAVEPOINT` before it fails instead: `25P02` if a statement of the
/// transaction failed and it is aborted ([`Error::RolledBack`]), `25P01` if there is no
/// transaction block any more, because the function ended it itself ([`ENDED_BY_FUNCTION`]).
/// (A savepoint costs the server less than a `SELECT 1`, which catches only the first case.)
pub(crate) const COMMIT_SQL: &str = "SAVEPOINT pg_fencing_commit; COMMIT";

/// What a fenced call says when the function ended the fenced transaction itself (`COMMIT` or
/// `ROLLBACK` sent inside it): whether its writes committed is not known to the call, so it
/// never reports success.
#[cfg(any(feature = "tokio-postgres", feature = "sqlx"))]
pub(crate) const ENDED_BY_FUNCTION: &str = "the function ended the fenced transaction itself \
     (COMMIT or ROLLBACK inside it); whether its writes committed is unknown";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens() {
        assert!(matches!(check_token(0), Err(Error::BadToken(0))));
        assert!(matches!(check_token(-5), Err(Error::BadToken(-5))));
        assert_eq!(check_token(i64::MAX).unwrap(), i64::MAX);
        assert_eq!(
            begin_sql(42).unwrap(),
            "BEGIN NOT DEFERRABLE; SELECT pg_catalog.set_config('pg_fencing.token', '42', true)"
        );
        assert_eq!(
            begin_sql_as(42, TokenForm::SetLocal).unwrap(),
            "BEGIN NOT DEFERRABLE; SET LOCAL pg_fencing.token = '42'"
        );
        assert!(begin_sql(0).is_err());
        assert!(begin_sql_as(-1, TokenForm::SetLocal).is_err());
        assert_eq!(TokenForm::for_server(None), TokenForm::SetConfig);
        assert_eq!(TokenForm::for_server(Some(150018)), TokenForm::SetConfig);
        assert_eq!(TokenForm::for_server(Some(160000)), TokenForm::SetLocal);
        assert_eq!(TokenForm::for_server(Some(180006)), TokenForm::SetLocal);
    }
}

/// The README's examples, compiled as doctests (`no_run`: they need a server).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeExamples;
