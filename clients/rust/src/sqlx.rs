//! pg_fencing with sqlx (PostgreSQL): [`fenced`] on a connection, [`fenced_pool`] on a pool,
//! [`run_with_lease`], and [`crate::LeaseConn`] for a `PgConnection` of its own.
//!
//! The function gets a [`FencedConnection`], an sqlx `Executor`
//! (`sqlx::query(…).execute(&mut *conn)`) that opens no transaction of its own and notes a
//! statement that failed, so that a transaction PostgreSQL has aborted is reported as
//! [`Error::RolledBack`] instead of a commit (PostgreSQL answers `COMMIT` with `ROLLBACK` then,
//! and sqlx reports success).

use std::time::Duration;

use futures_core::future::BoxFuture;
use futures_core::stream::BoxStream;
use futures_util::{FutureExt, StreamExt};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnection, PgPool, PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::{Connection, Describe, Either, Execute, Executor, Postgres};

use crate::{
    begin_sql_as, in_transaction_code, Error, FencingError, Lease, LeaseConn, LeaseOptions,
    TokenForm, COMMIT_SQL, ENDED_BY_FUNCTION, IN_TRANSACTION,
};

impl From<sqlx::Error> for Error {
    /// An error with a SQLSTATE of class `FT` becomes [`Error::Fencing`]; any other,
    /// [`Error::Database`] (the driver's error as the source).
    fn from(e: sqlx::Error) -> Error {
        if let sqlx::Error::Database(db) = &e {
            if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                if let Some(f) =
                    FencingError::from_fields(pg.code(), pg.message(), pg.detail(), pg.hint())
                {
                    return Error::Fencing(Box::new(f));
                }
            }
        }
        Error::Database(Box::new(e))
    }
}

/// The connection a fenced function writes through (an sqlx `Executor` for `&mut` of it).
#[derive(Debug)]
pub struct FencedConnection<'c> {
    conn: &'c mut PgConnection,
    failed: bool,
}

fn note<T>(failed: &mut bool, r: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
    // Any error the server sent aborts the transaction (there are no savepoints here).
    if let Err(sqlx::Error::Database(_)) = &r {
        *failed = true;
    }
    r
}

impl<'c, 't> Executor<'t> for &'t mut FencedConnection<'c> {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        't: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let failed = &mut self.failed;
        self.conn
            .fetch_many(query)
            .map(move |r| note(failed, r))
            .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        't: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let failed = &mut self.failed;
        self.conn
            .fetch_optional(query)
            .map(move |r| note(failed, r))
            .boxed()
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement<'q>, sqlx::Error>>
    where
        't: 'e,
    {
        let failed = &mut self.failed;
        self.conn
            .prepare_with(sql, parameters)
            .map(move |r| note(failed, r))
            .boxed()
    }

    fn describe<'e, 'q: 'e>(
        self,
        sql: &'q str,
    ) -> BoxFuture<'e, Result<Describe<Postgres>, sqlx::Error>>
    where
        't: 'e,
    {
        let failed = &mut self.failed;
        self.conn
            .describe(sql)
            .map(move |r| note(failed, r))
            .boxed()
    }
}

/// Closes the pool's connection when dropped armed: the future running a fenced transaction was
/// dropped (cancelled) before the transaction was known to be over, or it could not be ended.
/// (sqlx's own rollback on drop does not cover a `BEGIN` still in flight: the connection would
/// go back to the pool inside the fenced transaction, its token used by the next borrower.)
struct Armed<'a> {
    conn: &'a mut PoolConnection<Postgres>,
    armed: bool,
}

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.conn.close_on_drop();
        }
    }
}

/// Runs `f` in a transaction on `conn`, a pool's connection, fenced by `token`: BEGIN and the
/// token go in one query (no extra round trip), committed when `f` returns `Ok`, rolled back when
/// it returns `Err`. The connection is taken, and goes back to its pool at the end; if the future
/// is dropped (cancelled) or the transaction cannot be ended, it is closed instead (nobody can use
/// it inside the fenced transaction: with `&mut`, the caller could after a cancelled `BEGIN`). A
/// statement of `f` that failed while `f` went on anyway: [`Error::RolledBack`] (with `f`'s own
/// savepoints too: any failed statement rolls the whole transaction back). `f` sent `COMMIT` or
/// `ROLLBACK` itself: [`Error::Usage`], never success. A connection already in a transaction
/// (begun by hand) that has read or written anything: [`Error::Usage`], and the connection is
/// closed (its transaction with it). One in which only statements that PostgreSQL runs without a
/// snapshot have run (`SET`, `LOCK`, `NOTIFY`, `LISTEN`, a released `SAVEPOINT` …; no read or
/// write of a table) becomes `f`'s transaction, and what they did commits with it. The token goes
/// as `SET LOCAL` where the connection's server is PostgreSQL 16 or later, else by `set_config`
/// ([`TokenForm`]; [`fenced_as`] with [`token_form`]'s answer sends `SET LOCAL` also to an older
/// server that does not load pg_stat_statements).
pub async fn fenced<T, E, F>(conn: PoolConnection<Postgres>, token: i64, f: F) -> Result<T, E>
where
    F: AsyncFnOnce(&mut FencedConnection<'_>) -> Result<T, E>,
    E: From<Error>,
{
    let form = TokenForm::for_server(conn.server_version_num());
    fenced_as(conn, token, form, f).await
}

/// The [`TokenForm`] `conn`'s server takes, asked once (one query, [`TokenForm::PROBE_SQL`]):
/// keep it with the pool (the answer is the same for every connection of one server) and pass it
/// to [`fenced_as`].
pub async fn token_form(conn: &mut PgConnection) -> Result<TokenForm, Error> {
    let set_local: bool = sqlx::query_scalar(TokenForm::PROBE_SQL)
        .fetch_one(&mut *conn)
        .await?;
    Ok(TokenForm::from_answer(set_local))
}

/// [`fenced`] with the token in `form` (from [`token_form`]: a [`TokenForm::SetLocal`] on a
/// PostgreSQL 15 that preloads pg_stat_statements leaves it one entry per token).
pub async fn fenced_as<T, E, F>(
    mut conn: PoolConnection<Postgres>,
    token: i64,
    form: TokenForm,
    f: F,
) -> Result<T, E>
where
    F: AsyncFnOnce(&mut FencedConnection<'_>) -> Result<T, E>,
    E: From<Error>,
{
    let begin = begin_sql_as(token, form)?;
    let mut guard = Armed {
        conn: &mut conn,
        armed: true,
    };
    if let Err(e) = sqlx::raw_sql(&begin).execute(&mut **guard.conn).await {
        // Also an earlier query's error still pending on the connection: whether the BEGIN
        // went through is unknown; the guard closes the connection.
        let in_transaction = match &e {
            sqlx::Error::Database(db) => db.code().is_some_and(|c| in_transaction_code(&c)),
            _ => false,
        };
        if in_transaction {
            return Err(Error::Usage(format!("{IN_TRANSACTION} (closed)")).into());
        }
        return Err(Error::from(e).into());
    }
    let mut fc = FencedConnection {
        conn: guard.conn,
        failed: false,
    };
    let out = f(&mut fc).await;
    let failed = fc.failed;
    let conn: &mut PgConnection = guard.conn;
    let result = match out {
        Ok(_) if failed => {
            sqlx::raw_sql("ROLLBACK")
                .execute(&mut *conn)
                .await
                .map_err(Error::from)?;
            Err(Error::RolledBack.into())
        }
        Ok(value) => match sqlx::raw_sql(COMMIT_SQL).execute(&mut *conn).await {
            Ok(_) => Ok(value),
            Err(e) => {
                let code = match &e {
                    sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
                    _ => None,
                };
                match code.as_deref() {
                    // The savepoint outside a transaction block: f sent COMMIT or ROLLBACK.
                    Some("25P01") => Err(Error::Usage(ENDED_BY_FUNCTION.to_owned()).into()),
                    _ => {
                        // Aborted (25P02: a statement f ran outside this connection's notes
                        // failed), COMMIT itself failed, or the connection broke: end what may
                        // be open; if that fails too, the guard closes the connection.
                        sqlx::raw_sql("ROLLBACK")
                            .execute(&mut *conn)
                            .await
                            .map_err(Error::from)?;
                        if code.as_deref() == Some("25P02") {
                            Err(Error::RolledBack.into())
                        } else {
                            Err(Error::from(e).into())
                        }
                    }
                }
            }
        },
        Err(e) => {
            // f's own error either way; if the ROLLBACK fails, the guard closes the connection.
            if sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await.is_err() {
                return Err(e);
            }
            Err(e)
        }
    };
    guard.armed = false;
    result
}

/// [`fenced`] on a connection of `pool`, given back afterwards (closed instead when the
/// transaction could not be seen to its end).
pub async fn fenced_pool<T, E, F>(pool: &PgPool, token: i64, f: F) -> Result<T, E>
where
    F: AsyncFnOnce(&mut FencedConnection<'_>) -> Result<T, E>,
    E: From<Error>,
{
    crate::check_token(token)?;
    let conn = pool.acquire().await.map_err(Error::from)?;
    fenced(conn, token, f).await
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

impl LeaseConn for PgConnection {
    async fn acquire(&mut self, name: &str, ttl: Duration, wait: Duration) -> Result<i64, Error> {
        Ok(sqlx::query_scalar(
            "SELECT fencing_lease_acquire($1, make_interval(secs => $2), make_interval(secs => $3))",
        )
        .bind(name)
        .bind(secs(ttl))
        .bind(secs(wait))
        .fetch_one(&mut *self)
        .await?)
    }

    async fn remaining(&mut self, token: i64) -> Result<Duration, Error> {
        let s: f64 = sqlx::query_scalar(
            "SELECT greatest(extract(epoch FROM expires_at - clock_timestamp()), 0)::float8 FROM fencing_leases WHERE token = $1",
        )
        .bind(token)
        .fetch_one(&mut *self)
        .await?;
        Ok(Duration::from_secs_f64(s))
    }

    async fn renew(&mut self, token: i64, ttl: Duration) -> Result<(), Error> {
        sqlx::query("SELECT fencing_lease_renew($1, make_interval(secs => $2))")
            .bind(token)
            .bind(secs(ttl))
            .execute(&mut *self)
            .await?;
        Ok(())
    }

    async fn release(&mut self, token: i64) -> Result<bool, Error> {
        Ok(sqlx::query_scalar("SELECT fencing_lease_release($1)")
            .bind(token)
            .fetch_one(&mut *self)
            .await?)
    }
}

/// The one-call form: takes lease `name` for `ttl` on a new connection made with `pool`'s
/// options (owned by the lease), runs `f` in a transaction on a connection of `pool` fenced by
/// its token while the lease is renewed, checks the lease before committing, and releases it. If
/// the lease is lost, `f` is stopped where it is (its future dropped, the transaction rolled
/// back) and the result is `FT003` ([`Error::Fencing`]); nothing of it committed.
pub async fn run_with_lease<T, E, F>(
    pool: &PgPool,
    name: &str,
    ttl: Duration,
    options: LeaseOptions,
    f: F,
) -> Result<T, E>
where
    F: AsyncFnOnce(&mut FencedConnection<'_>, &Lease) -> Result<T, E>,
    E: From<Error>,
{
    let lease_conn = PgConnection::connect_with(&pool.connect_options())
        .await
        .map_err(Error::from)?;
    let lease = Lease::acquire(lease_conn, name, ttl, options).await?;
    let result = {
        let lease = &lease;
        fenced_pool(
            pool,
            lease.token(),
            async move |c: &mut FencedConnection<'_>| {
                crate::lease::while_held(lease, f(c, lease)).await
            },
        )
        .await
    };
    crate::lease::finish(lease, result).await
}
