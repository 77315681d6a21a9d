//! The client side of pg_fencing, the PostgreSQL extension that refuses a write whose fencing
//! token is below the highest one it has seen (the high-water mark of the resource or row).
//!
//! What this crate gives a Rust service:
//! - a **fenced transaction**: BEGIN and the token go to the server in one simple-protocol query,
//!   `BEGIN; SELECT pg_catalog.set_config('pg_fencing.token', '<token>', true)`, so it takes as many round
//!   trips as the same transaction unfenced, and the token is transaction-scoped: it ends with
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

/// The one query that opens a fenced transaction: BEGIN and the token set with
/// `set_config(…, true)` (transaction-scoped; not the `SET LOCAL` statement, whose constant
/// PostgreSQL 15's pg_stat_statements keeps, one entry per token). Only the checked integer is
/// written into it.
pub fn begin_sql(token: i64) -> Result<String, Error> {
    let token = check_token(token)?;
    Ok(format!(
        "BEGIN; SELECT pg_catalog.set_config('pg_fencing.token', '{token}', true)"
    ))
}

/// [`begin_sql`] that also refuses a connection already in a transaction: the token's value is
/// a text that is no token (the extension refuses it, `22P02`, its message containing
/// [`IN_TRANSACTION`]) unless the transaction began in this very query (its start is this
/// query's start).
#[cfg(feature = "sqlx")]
pub(crate) fn begin_sql_checked(token: i64) -> Result<String, Error> {
    let token = check_token(token)?;
    Ok(format!(
        "BEGIN; SELECT pg_catalog.set_config('pg_fencing.token', CASE WHEN pg_catalog.now() OPERATOR(pg_catalog.=) pg_catalog.statement_timestamp() THEN '{token}' ELSE '{IN_TRANSACTION}' END, true)"
    ))
}

/// What the refused value of [`begin_sql_checked`] says.
#[cfg(feature = "sqlx")]
pub(crate) const IN_TRANSACTION: &str =
    "not a token: fenced() starts its own transaction and the connection was already in one";

/// The query that ends a fenced transaction: `SELECT 1` fails (`25P02`) if a statement of the
/// transaction failed and it is aborted; PostgreSQL answers a plain `COMMIT` of an aborted
/// transaction with `ROLLBACK` and no error, which the drivers report as success.
pub(crate) const COMMIT_SQL: &str = "SELECT 1; COMMIT";

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
            "BEGIN; SELECT pg_catalog.set_config('pg_fencing.token', '42', true)"
        );
        assert!(begin_sql(0).is_err());
    }
}

/// The README's examples, compiled as doctests (`no_run`: they need a server).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeExamples;
