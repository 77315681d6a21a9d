//! A service's side of pg_fencing, with etcd as the lock service.
//!
//! 1. Grant an etcd lease and keep it alive on a background task.
//! 2. Take the etcd lock under that lease. The **fencing token** is the revision in the lock
//!    response's header: the revision at which the lock was granted (the same number as
//!    `etcdctl lock`'s `ETCD_LOCK_REV` and Go's `Mutex.Header().Revision`; not the lock key's
//!    create revision, which orders differently when holders queue).
//! 3. Write to PostgreSQL with that token, one transaction per write, in one of two styles:
//!    `sql` (the crate pg-fencing's `fenced`: BEGIN and the token in one query, then plain SQL)
//!    or `function`
//!    (`fenced_update` / `fenced_insert`, the token as an argument).
//! 4. If PostgreSQL refuses a write as fenced off (`FT001`, `FT003`, `FT006`), stop at once:
//!    a newer holder has (or may have) the lock. Never retry with the same token.
//!
//! It writes to a table `ledger (account int PRIMARY KEY, balance bigint)` protected with
//! `SELECT fencing_protect('ledger', 'settlement')`; each write adds `--amount` to the account's
//! balance (inserting the row if it is missing).
//!
//! Output: `token=<n>` once the lock is held, then `wrote account=<a> balance=<b> token=<n>` per
//! committed write (stdout); errors on stderr. Exit status: 0 done (lock released, lease
//! revoked), 1 any other error, 2 bad arguments, 3 fenced off.

use std::process::ExitCode;
use std::time::Duration;

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use tokio_postgres::error::SqlState;
use tokio_postgres::NoTls;

const USAGE: &str = "\
usage: pg-fencing-client [options]
  --etcd ENDPOINTS   etcd endpoints, comma-separated     (default 127.0.0.1:2379)
  --pg CONNINFO      libpq-style connection string      (default \"host=127.0.0.1 user=postgres dbname=postgres\")
  --lock NAME        etcd lock name                      (default settlement)
  --ttl SECS         lease TTL in seconds                (default 10)
  --account ID       ledger row to write                 (default 1)
  --amount N         added to the balance by each write  (default 1)
  --writes N         number of writes, one transaction each (default 1)
  --interval-ms MS   pause between writes                (default 1000)
  --style STYLE      sql | function                      (default sql)
exit status: 0 done, 1 error, 2 bad arguments, 3 fenced off (a newer lock holder exists)";

const EXIT_FAILED: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_FENCED_OFF: u8 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    /// The crate's `fenced` (BEGIN and `set_config('pg_fencing.token', …, true)` in one query),
    /// then plain SQL.
    Sql,
    /// `fenced_update` / `fenced_insert` with the token as an argument.
    Function,
}

#[derive(Debug, Clone, PartialEq)]
struct Args {
    etcd: Vec<String>,
    pg: String,
    lock: String,
    ttl: i64,
    account: i32,
    amount: i64,
    writes: u32,
    interval: Duration,
    style: Style,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            etcd: vec!["127.0.0.1:2379".into()],
            pg: "host=127.0.0.1 user=postgres dbname=postgres".into(),
            lock: "settlement".into(),
            ttl: 10,
            account: 1,
            amount: 1,
            writes: 1,
            interval: Duration::from_millis(1000),
            style: Style::Sql,
        }
    }
}

impl Args {
    fn parse(args: impl IntoIterator<Item = String>) -> Result<Args, String> {
        let mut a = Args::default();
        let mut it = args.into_iter();
        while let Some(flag) = it.next() {
            let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
            match flag.as_str() {
                "--etcd" => a.etcd = value()?.split(',').map(str::to_owned).collect(),
                "--pg" => a.pg = value()?,
                "--lock" => a.lock = value()?,
                "--ttl" => a.ttl = number(&flag, &value()?)?,
                "--account" => a.account = number(&flag, &value()?)?,
                "--amount" => a.amount = number(&flag, &value()?)?,
                "--writes" => a.writes = number(&flag, &value()?)?,
                "--interval-ms" => a.interval = Duration::from_millis(number(&flag, &value()?)?),
                "--style" => {
                    a.style = match value()?.as_str() {
                        "sql" => Style::Sql,
                        "function" => Style::Function,
                        other => {
                            return Err(format!("--style must be sql or function, not {other:?}"))
                        }
                    }
                }
                _ => return Err(format!("unknown argument {flag:?}")),
            }
        }
        if a.ttl < 1 {
            return Err("--ttl must be at least 1".into());
        }
        Ok(a)
    }
}

fn number<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("{flag}: not a valid number: {v:?}"))
}

/// What a failed database call means for this client, decided by its SQLSTATE alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// The write was refused because this client is no longer (or may no longer be) the lock
    /// holder: stop writing immediately and never retry with the same token.
    /// `FT001` stale token (a newer holder wrote), `FT003` lock lost (lease expired or revoked),
    /// `FT006` token not verified as the current holder's.
    FencedOff,
    /// `40001` serialization failure, `40P01` deadlock: PostgreSQL rolled the transaction back
    /// for a concurrency reason that says nothing about the lock. Retrying the whole transaction
    /// with the *same* token is safe: if a newer holder has written meanwhile, the retry gets
    /// `FT001`.
    Retry,
    /// Anything else (constraint, connection, a missing token `FT002`, etcd unreachable
    /// `FT005`, …): an ordinary error, not a verdict about who holds the lock.
    Failed,
}

fn classify(sqlstate: Option<&str>) -> Verdict {
    match sqlstate {
        Some("FT001" | "FT003" | "FT006") => Verdict::FencedOff,
        Some("40001" | "40P01") => Verdict::Retry,
        _ => Verdict::Failed,
    }
}

/// `SQLSTATE FT001: <message> (<detail>)`, the detail only if there is one.
fn describe(code: &str, message: &str, detail: Option<&str>) -> String {
    match detail {
        Some(detail) => format!("SQLSTATE {code}: {message} ({detail})"),
        None => format!("SQLSTATE {code}: {message}"),
    }
}

/// Why `run` stopped before finishing.
#[derive(Debug)]
enum Stop {
    FencedOff(String),
    Failed(String),
}

impl From<tokio_postgres::Error> for Stop {
    /// Every PostgreSQL error goes through `classify`, whichever statement raised it.
    fn from(e: tokio_postgres::Error) -> Self {
        let text = match e.as_db_error() {
            Some(db) => describe(db.code().code(), db.message(), db.detail()),
            None => match std::error::Error::source(&e) {
                Some(cause) => format!("postgres: {e}: {cause}"),
                None => format!("postgres: {e}"),
            },
        };
        match classify(e.code().map(SqlState::code)) {
            Verdict::FencedOff => Stop::FencedOff(text),
            // Only after `write` has used up its retries.
            Verdict::Retry | Verdict::Failed => Stop::Failed(text),
        }
    }
}

impl From<pg_fencing::Error> for Stop {
    /// The crate's typed errors: a refusal that means a newer holder exists (`FT001`, `FT003`,
    /// `FT006`) stops the client as fenced off; the rest through `classify` by SQLSTATE.
    fn from(e: pg_fencing::Error) -> Self {
        let text = match e.fencing() {
            Some(f) => describe(f.code.sqlstate(), &f.message, f.detail.as_deref()),
            None => e.to_string(),
        };
        match classify(e.sqlstate().as_deref()) {
            Verdict::FencedOff => Stop::FencedOff(text),
            Verdict::Retry | Verdict::Failed => Stop::Failed(text),
        }
    }
}

impl From<etcd_client::Error> for Stop {
    fn from(e: etcd_client::Error) -> Self {
        Stop::Failed(format!("etcd: {e}"))
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let args = match Args::parse(argv) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    match run(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Stop::FencedOff(why)) => {
            eprintln!("fenced off: {why}");
            ExitCode::from(EXIT_FENCED_OFF)
        }
        Err(Stop::Failed(why)) => {
            eprintln!("error: {why}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}

async fn run(args: &Args) -> Result<(), Stop> {
    // A service would take a connection from its pool here.
    let (mut db, connection) = tokio_postgres::connect(&args.pg, NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("postgres connection: {e}");
        }
    });

    let mut etcd = Client::connect(&args.etcd, None).await?;
    let lease = etcd.lease_grant(args.ttl, None).await?.id();
    let (keeper, responses) = etcd.lease_keep_alive(lease).await?;
    let keep_alive = tokio::spawn(keep_lease_alive(keeper, responses, args.ttl));

    let result = lock_and_write(&mut etcd, &mut db, lease, args).await;

    // Revoking the lease deletes our lock key if it still exists, so this also releases the
    // lock after an error. Best effort: when we were fenced off the lease is usually gone.
    keep_alive.abort();
    let _ = tokio::time::timeout(Duration::from_secs(2), etcd.lease_revoke(lease)).await;
    result
}

/// Refreshes the lease every TTL/3. If a refresh fails or etcd reports the lease gone, it says
/// so and stops; it does not stop the writer. A client cannot know in time that it lost its
/// lock (it may pause between any check and its write): the fencing token is what stops it.
async fn keep_lease_alive(mut keeper: LeaseKeeper, mut responses: LeaseKeepAliveStream, ttl: i64) {
    let period = Duration::from_millis((ttl as u64 * 1000 / 3).max(100));
    loop {
        let alive = match keeper.keep_alive().await {
            Ok(()) => matches!(responses.message().await, Ok(Some(r)) if r.ttl() > 0),
            Err(_) => false,
        };
        if !alive {
            eprintln!("lease {:x} lost (expired or not refreshed)", keeper.id());
            return;
        }
        tokio::time::sleep(period).await;
    }
}

async fn lock_and_write(
    etcd: &mut Client,
    db: &mut tokio_postgres::Client,
    lease: i64,
    args: &Args,
) -> Result<(), Stop> {
    // Waits while an earlier holder's key exists (until it unlocks or its lease expires); the
    // token is the revision of the lock response's header, the key read back under our lease.
    let lock = pg_fencing::etcd::lock(etcd, &args.lock, lease).await?;
    let token = lock.token;
    println!("token={token}");

    for i in 0..args.writes {
        if i > 0 {
            tokio::time::sleep(args.interval).await;
        }
        let balance = write(db, args, token).await?;
        println!(
            "wrote account={} balance={balance} token={token}",
            args.account
        );
    }

    etcd.unlock(lock.key).await?;
    Ok(())
}

/// One write, in its own transaction, retried (same token) after a serialization failure or a
/// deadlock, at most `ATTEMPTS` times in all. Every other error, fenced off above all, ends it.
async fn write(
    db: &mut tokio_postgres::Client,
    args: &Args,
    token: i64,
) -> Result<i64, pg_fencing::Error> {
    const ATTEMPTS: u32 = 3;
    let mut attempt = 1;
    loop {
        let result = match args.style {
            Style::Sql => write_sql(db, args.account, args.amount, token).await,
            Style::Function => write_function(db, args.account, args.amount, token).await,
        };
        // In style `function` a missing row is inserted; if another client inserted it first
        // (23505), the retry finds it and updates it.
        let retry = |e: &pg_fencing::Error| {
            let code = e.sqlstate();
            classify(code.as_deref()) == Verdict::Retry
                || (args.style == Style::Function
                    && code.as_deref() == Some(SqlState::UNIQUE_VIOLATION.code()))
        };
        match result {
            Err(e) if attempt < ATTEMPTS && retry(&e) => {
                eprintln!("retrying after {e} (attempt {attempt} of {ATTEMPTS}, same token)");
                tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// Style `sql`: the token for the whole transaction, set by the crate's `fenced` in the same
/// query as BEGIN (`set_config(…, true)`: transaction-scoped, one pg_stat_statements entry
/// whatever the token; nothing leaks through a pooler), then plain SQL.
async fn write_sql(
    db: &mut tokio_postgres::Client,
    account: i32,
    amount: i64,
    token: i64,
) -> Result<i64, pg_fencing::Error> {
    pg_fencing::tokio_postgres::fenced(db, token, async |tx: &tokio_postgres::Client| {
        let row = tx
            .query_one(
                "INSERT INTO ledger (account, balance) VALUES ($1, $2) \
                 ON CONFLICT (account) DO UPDATE SET balance = ledger.balance + EXCLUDED.balance \
                 RETURNING balance",
                &[&account, &amount],
            )
            .await?;
        Ok(row.get(0))
    })
    .await
}

/// Style `function`: `fenced_update` / `fenced_insert` take the token as an argument and leave
/// the session's `pg_fencing.token` alone. They set whole values, so read the row first.
///
/// A plain read, not `SELECT … FOR UPDATE`: the row lock would be taken before the resource's
/// fencing lock that `fenced_update` takes, the reverse of the order every plain write takes them
/// in, and two holders could deadlock. No lock is needed either: only the lock holder writes, and
/// if a newer holder writes between this read and `fenced_update`, the update fails with `FT001`
/// instead of overwriting it.
async fn write_function(
    db: &mut tokio_postgres::Client,
    account: i32,
    amount: i64,
    token: i64,
) -> Result<i64, pg_fencing::Error> {
    let tx = db.transaction().await?;
    let current = tx
        .query_opt("SELECT balance FROM ledger WHERE account = $1", &[&account])
        .await?;
    let sql = match current {
        Some(_) => {
            "SELECT (fenced_update('ledger', jsonb_build_object('account', $1::int), \
             jsonb_build_object('balance', $2::bigint), $3) ->> 'balance')::bigint"
        }
        None => {
            "SELECT (fenced_insert('ledger', jsonb_build_object('account', $1::int, \
             'balance', $2::bigint), $3) ->> 'balance')::bigint"
        }
    };
    // A NULL balance counts as 0.
    let balance = current
        .and_then(|row| row.get::<_, Option<i64>>(0))
        .unwrap_or(0)
        + amount;
    let row = tx.query_one(sql, &[&account, &balance, &token]).await?;
    tx.commit().await?;
    Ok(row.get(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fenced_off_sqlstates_stop_the_client() {
        for code in ["FT001", "FT003", "FT006"] {
            assert_eq!(classify(Some(code)), Verdict::FencedOff, "{code}");
            // The same, the way `run` gets it: tokio_postgres::Error::code() -> &SqlState.
            assert_eq!(
                classify(Some(SqlState::from_code(code).code())),
                Verdict::FencedOff
            );
        }
    }

    #[test]
    fn serialization_failures_and_deadlocks_are_retried() {
        for code in [
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::T_R_DEADLOCK_DETECTED,
        ] {
            assert_eq!(
                classify(Some(code.code())),
                Verdict::Retry,
                "{}",
                code.code()
            );
        }
    }

    #[test]
    fn other_errors_are_ordinary_failures() {
        for code in [
            "FT002", "FT004", "FT005", "23505", "55P03", "08006", "ft001", "",
        ] {
            assert_eq!(classify(Some(code)), Verdict::Failed, "{code}");
        }
        assert_eq!(
            classify(None),
            Verdict::Failed,
            "no SQLSTATE (connection error)"
        );
        assert_eq!(
            classify(Some(SqlState::UNIQUE_VIOLATION.code())),
            Verdict::Failed
        );
    }

    #[test]
    fn describe_shows_code_message_and_detail() {
        assert_eq!(
            describe("FT001", "stale fencing token 6", Some("mark is 8.")),
            "SQLSTATE FT001: stale fencing token 6 (mark is 8.)"
        );
        assert_eq!(
            describe("23505", "duplicate key", None),
            "SQLSTATE 23505: duplicate key"
        );
    }

    fn parse(args: &[&str]) -> Result<Args, String> {
        Args::parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn parses_arguments() {
        assert_eq!(parse(&[]).unwrap(), Args::default());
        let a = parse(&[
            "--etcd",
            "10.0.0.1:2379,10.0.0.2:2379",
            "--pg",
            "host=db port=5433",
            "--lock",
            "L",
            "--ttl",
            "2",
            "--account",
            "7",
            "--amount",
            "-5",
            "--writes",
            "3",
            "--interval-ms",
            "250",
            "--style",
            "function",
        ])
        .unwrap();
        assert_eq!(a.etcd, ["10.0.0.1:2379", "10.0.0.2:2379"]);
        assert_eq!((a.pg.as_str(), a.lock.as_str()), ("host=db port=5433", "L"));
        assert_eq!((a.ttl, a.account, a.amount, a.writes), (2, 7, -5, 3));
        assert_eq!(
            (a.interval, a.style),
            (Duration::from_millis(250), Style::Function)
        );
    }

    #[test]
    fn rejects_bad_arguments() {
        assert!(parse(&["--ttl"]).unwrap_err().contains("needs a value"));
        assert!(parse(&["--ttl", "0"]).is_err());
        assert!(parse(&["--writes", "x"]).is_err());
        assert!(parse(&["--style", "orm"]).is_err());
        assert!(parse(&["--bogus"]).is_err());
    }
}
