//! pg_fencing with tokio-postgres: [`fenced`], [`run_with_lease`], and [`crate::LeaseConn`] for
//! a `Client` on a connection of its own. A pooled client (deadpool-postgres' `Object`) derefs
//! to `&mut Client`.

use std::time::Duration;

use tokio_postgres::Client;

use crate::{
    begin_sql_as, in_transaction_code, Error, FencingError, Lease, LeaseConn, LeaseOptions,
    TokenForm, COMMIT_SQL, ENDED_BY_FUNCTION, IN_TRANSACTION,
};

impl From<tokio_postgres::Error> for Error {
    /// An error with a SQLSTATE of class `FT` becomes [`Error::Fencing`]; any other,
    /// [`Error::Database`] (the driver's error as the source).
    fn from(e: tokio_postgres::Error) -> Error {
        if let Some(db) = e.as_db_error() {
            if let Some(f) =
                FencingError::from_fields(db.code().code(), db.message(), db.detail(), db.hint())
            {
                return Error::Fencing(Box::new(f));
            }
        }
        Error::Database(Box::new(e))
    }
}

/// Rolls back a transaction left open when the future running it is dropped (cancelled): the
/// same request tokio-postgres' own `Transaction` sends from its `Drop` (queued, not awaited).
struct Open<'a> {
    client: &'a Client,
    done: bool,
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.client.__private_api_rollback(None);
        }
    }
}

/// Runs `f` in a transaction on `client` fenced by `token`: BEGIN and the token go in one query
/// ([`crate::begin_sql`]: no extra round trip), committed when `f` returns `Ok`, rolled back
/// when it returns `Err` or the future is dropped. `f` gets `&Client` (it cannot open or end a
/// transaction of its own through tokio-postgres' `transaction()`). A statement of `f` that
/// failed while `f` went on anyway: [`Error::RolledBack`]. `f` sent `COMMIT` or `ROLLBACK`
/// itself: [`Error::Usage`], never success. `client` must not be in a
/// transaction that has read or written anything: if it is, that transaction is rolled back and
/// the call fails with [`Error::Usage`] (the token must not reach statements that are not
/// `f`'s). One in which only statements that PostgreSQL runs without a snapshot have run (`SET`,
/// `LOCK`, `NOTIFY`, `LISTEN`, a released `SAVEPOINT` …; no read or write of a table) becomes
/// `f`'s transaction, and what they did commits with it.
///
/// The token goes by `set_config`, the form every server takes (tokio-postgres does not show the
/// server's version): [`fenced_as`] with the form of [`token_form`] sends the cheaper `SET LOCAL`
/// where the server allows it.
pub async fn fenced<T, E, F>(client: &mut Client, token: i64, f: F) -> Result<T, E>
where
    F: AsyncFnOnce(&Client) -> Result<T, E>,
    E: From<Error>,
{
    fenced_as(client, token, TokenForm::SetConfig, f).await
}

/// The [`TokenForm`] `client`'s server takes, asked once (one query, [`TokenForm::PROBE_SQL`]):
/// keep it with the connection (a pool's `post_create` hook, say) and pass it to [`fenced_as`].
pub async fn token_form(client: &Client) -> Result<TokenForm, Error> {
    let row = client.query_one(TokenForm::PROBE_SQL, &[]).await?;
    Ok(TokenForm::from_answer(row.get(0)))
}

/// [`fenced`] with the token in `form` (from [`token_form`] on this connection: a
/// [`TokenForm::SetLocal`] on a PostgreSQL 15 that preloads pg_stat_statements leaves it one entry
/// per token).
pub async fn fenced_as<T, E, F>(
    client: &mut Client,
    token: i64,
    form: TokenForm,
    f: F,
) -> Result<T, E>
where
    F: AsyncFnOnce(&Client) -> Result<T, E>,
    E: From<Error>,
{
    let begin = begin_sql_as(token, form)?;
    let client: &Client = client;
    let mut open = Open {
        client,
        done: false,
    };
    if let Err(e) = client.batch_execute(&begin).await {
        // `open` rolls the caller's transaction back when it is dropped here.
        if e.code().is_some_and(|c| in_transaction_code(c.code())) {
            return Err(Error::Usage(format!("{IN_TRANSACTION} (rolled back)")).into());
        }
        return Err(Error::from(e).into());
    }
    match f(client).await {
        Ok(value) => match client.batch_execute(COMMIT_SQL).await {
            Ok(()) => {
                open.done = true;
                Ok(value)
            }
            Err(e) if e.code().map(|c| c.code()) == Some("25P02") => {
                // The savepoint in an aborted transaction: a statement of f failed.
                client
                    .batch_execute("ROLLBACK")
                    .await
                    .map_err(Error::from)?;
                open.done = true;
                Err(Error::RolledBack.into())
            }
            Err(e) if e.code().map(|c| c.code()) == Some("25P01") => {
                // The savepoint outside a transaction block: f sent COMMIT or ROLLBACK.
                open.done = true;
                Err(Error::Usage(ENDED_BY_FUNCTION.to_owned()).into())
            }
            Err(e) => {
                // COMMIT itself failed (PostgreSQL has ended the transaction), or the savepoint
                // did (cancelled, say: the transaction is aborted and still open), or the
                // connection broke. A ROLLBACK ends what may be open (a warning, no error, if
                // nothing is); if it cannot be sent, the guard queues one.
                if client.batch_execute("ROLLBACK").await.is_ok() {
                    open.done = true;
                }
                Err(Error::from(e).into())
            }
        },
        Err(e) => {
            if client.batch_execute("ROLLBACK").await.is_ok() {
                open.done = true;
            }
            Err(e)
        }
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

impl LeaseConn for Client {
    async fn acquire(&mut self, name: &str, ttl: Duration, wait: Duration) -> Result<i64, Error> {
        let row = self
            .query_one(
                "SELECT fencing_lease_acquire($1, make_interval(secs => $2), make_interval(secs => $3))",
                &[&name, &secs(ttl), &secs(wait)],
            )
            .await?;
        Ok(row.get(0))
    }

    async fn remaining(&mut self, token: i64) -> Result<Duration, Error> {
        let row = self
            .query_one(
                "SELECT greatest(extract(epoch FROM expires_at - clock_timestamp()), 0)::float8 FROM fencing_leases WHERE token = $1",
                &[&token],
            )
            .await?;
        Ok(Duration::from_secs_f64(row.get(0)))
    }

    async fn renew(&mut self, token: i64, ttl: Duration) -> Result<(), Error> {
        self.execute(
            "SELECT fencing_lease_renew($1, make_interval(secs => $2))",
            &[&token, &secs(ttl)],
        )
        .await?;
        Ok(())
    }

    async fn release(&mut self, token: i64) -> Result<bool, Error> {
        let row = self
            .query_one("SELECT fencing_lease_release($1)", &[&token])
            .await?;
        Ok(row.get(0))
    }
}

/// The one-call form: takes lease `name` for `ttl` on `lease_client` (a connection of its own,
/// owned by the lease from then on), runs `f` in a transaction on `client` fenced by its token
/// while the lease is renewed, checks the lease before committing, and releases it. If the lease
/// is lost, `f` is stopped where it is (its future dropped, the transaction rolled back) and the
/// result is `FT003` ([`Error::Fencing`]); nothing of it committed.
pub async fn run_with_lease<T, E, F>(
    lease_client: Client,
    client: &mut Client,
    name: &str,
    ttl: Duration,
    options: LeaseOptions,
    f: F,
) -> Result<T, E>
where
    F: AsyncFnOnce(&Client, &Lease) -> Result<T, E>,
    E: From<Error>,
{
    let lease = Lease::acquire(lease_client, name, ttl, options).await?;
    let result = {
        let lease = &lease;
        fenced(client, lease.token(), async move |c: &Client| {
            crate::lease::while_held(lease, f(c, lease)).await
        })
        .await
    };
    crate::lease::finish(lease, result).await
}
