//! A fenced one-row transaction through this crate (tokio-postgres' `fenced`, and `fenced_as`
//! with the form `token_form` asked for; sqlx's `fenced`, and its `fenced_as` with its
//! `token_form`) against the same transaction unfenced through the same driver
//! (`Client::transaction`, `Connection::begin`), against its floor (the same call and token on an
//! unprotected table, the token stamped by the statement: no check), and against the unfenced
//! transaction with nothing added but the token in BEGIN's query (what a transaction-scoped token
//! costs by itself: one more statement). One connection per driver, BENCH_ROUNDS rounds of
//! BENCH_TXNS transactions of each variant interleaved transaction by transaction (the order
//! rotating), the median latency of a transaction per round, then the median over rounds. Run by
//! bench/rustclient.sh of the repository:
//!     bench <conninfo> <markdown file>

use std::time::Instant;

use pg_fencing::{Error, TokenForm};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::Connection;
use tokio_postgres::{Client, NoTls};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&v| v > 0)
        .unwrap_or(default)
}

fn median(xs: &[f64]) -> f64 {
    let mut s = xs.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

const FENCED: &str = "UPDATE rb_fenced SET v = v + 1 WHERE id = $1";
const FLOOR: &str = "UPDATE rb_plain SET v = v + 1, fence_token = 5 WHERE id = $1";
const PLAIN: &str = "UPDATE rb_plain SET v = v + 1 WHERE id = $1";

async fn tp(c: &mut Client, form: TokenForm, variant: usize, id: i32) -> Result<(), Error> {
    match variant {
        0 | 1 => {
            let sql = if variant == 0 { FENCED } else { FLOOR };
            let f = async |tx: &Client| -> Result<(), Error> {
                tx.execute(sql, &[&id]).await?;
                Ok(())
            };
            // `fenced` is `fenced_as` with the set_config form.
            pg_fencing::tokio_postgres::fenced_as(c, 5, form, f).await
        }
        2 => {
            let tx = c.transaction().await?;
            tx.execute(PLAIN, &[&id]).await?;
            tx.commit().await?;
            Ok(())
        }
        _ => {
            // The unfenced transaction with the token added to BEGIN's query and nothing else:
            // what any transaction-scoped token costs (one more statement), no check.
            c.batch_execute(&pg_fencing::begin_sql_as(5, form)?).await?;
            c.execute(PLAIN, &[&id]).await?;
            c.batch_execute("COMMIT").await?;
            Ok(())
        }
    }
}

/// sqlx: each transaction on a connection taken from a pool of one (`fenced` takes it and gives
/// it back; the unfenced variant does the same).
async fn sx(pool: &PgPool, form: TokenForm, variant: usize, id: i32) -> Result<(), Error> {
    let mut c = pool.acquire().await?;
    match variant {
        0 | 1 => {
            let sql = if variant == 0 { FENCED } else { FLOOR };
            pg_fencing::sqlx::fenced_as(
                c,
                5,
                form,
                async |tx: &mut pg_fencing::sqlx::FencedConnection<'_>| -> Result<(), Error> {
                    sqlx::query(sql).bind(id).execute(&mut *tx).await?;
                    Ok(())
                },
            )
            .await
        }
        2 => {
            let mut tx = c.begin().await?;
            sqlx::query(PLAIN).bind(id).execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(())
        }
        _ => {
            sqlx::raw_sql(&pg_fencing::begin_sql_as(5, form)?)
                .execute(&mut *c)
                .await?;
            sqlx::query(PLAIN).bind(id).execute(&mut *c).await?;
            sqlx::raw_sql("COMMIT").execute(&mut *c).await?;
            Ok(())
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [conninfo, out] = &args[..] else {
        eprintln!("usage: bench <conninfo> <markdown file>");
        std::process::exit(2);
    };
    let (rounds, txns) = (env("BENCH_ROUNDS", 7), env("BENCH_TXNS", 2000));
    let connect = async || -> Result<Client, Error> {
        let (c, conn) = tokio_postgres::connect(conninfo, NoTls).await?;
        tokio::spawn(conn);
        Ok(c)
    };
    let admin = connect().await?;
    admin
        .batch_execute(
            "DROP TABLE IF EXISTS rb_fenced, rb_plain;
             CREATE TABLE rb_fenced (id int PRIMARY KEY, v int);
             CREATE TABLE rb_plain (id int PRIMARY KEY, v int, fence_token bigint);
             SELECT fencing_protect('rb_fenced', 'rustbench');
             SELECT fencing_advance('rustbench', 5);
             BEGIN; SET LOCAL pg_fencing.token = '5';
             INSERT INTO rb_fenced (id, v) SELECT g, 0 FROM generate_series(1, 1000) g;
             INSERT INTO rb_plain (id, v) SELECT g, 0 FROM generate_series(1, 1000) g; COMMIT",
        )
        .await?;
    let key = |i: usize| (i % 1000 + 1) as i32;
    let mut results = Vec::new();
    let version: String = admin.query_one("SHOW server_version", &[]).await?.get(0);
    for driver in [
        "tokio-postgres (`fenced`: set_config)",
        "tokio-postgres (`fenced_as`, `token_form`)",
        "sqlx (`fenced`)",
        "sqlx (`fenced_as`, `token_form`)",
    ] {
        let mut tpc = connect().await?;
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect(&url(conninfo))
            .await?;
        let form = if driver.contains("token_form") {
            if driver.starts_with("tokio") {
                pg_fencing::tokio_postgres::token_form(&tpc).await?
            } else {
                pg_fencing::sqlx::token_form(&mut *pool.acquire().await?).await?
            }
        } else if driver.starts_with("sqlx") {
            // What `fenced` chooses: by the server's version alone.
            TokenForm::for_server(pool.acquire().await?.server_version_num())
        } else {
            TokenForm::SetConfig
        };
        let mut per: [Vec<f64>; 4] = Default::default();
        for _ in 0..rounds {
            let mut lat: [Vec<f64>; 4] = Default::default();
            for i in 0..txns {
                for k in 0..4 {
                    let n = (i + k) % 4;
                    let t0 = Instant::now();
                    if driver.starts_with("tokio") {
                        tp(&mut tpc, form, n, key(i)).await?;
                    } else {
                        sx(&pool, form, n, key(i)).await?;
                    }
                    lat[n].push(t0.elapsed().as_nanos() as f64 / 1000.0);
                }
            }
            for n in 0..4 {
                per[n].push(median(&lat[n]));
            }
        }
        let driver = format!("{driver}, {form:?}");
        results.push((driver, per.map(|p| median(&p))));
    }
    let mut md = format!(
        "PostgreSQL {version}, one connection per driver on loopback (fsync off); {rounds} rounds of {txns} one-row UPDATE transactions of each variant, interleaved transaction by transaction; median latency per transaction.\n\n\
         | driver | fenced (µs) | floor (µs) | unfenced (µs) | unfenced + token only (µs) | fenced / floor | fenced / unfenced | (unfenced + token only) / unfenced |\n|---|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    for (driver, [f, fl, u, t]) in &results {
        md += &format!(
            "| {driver} | {f:.0} | {fl:.0} | {u:.0} | {t:.0} | {:.3} | {:.3} | {:.3} |\n",
            f / fl,
            f / u,
            t / u
        );
    }
    print!("{md}");
    std::fs::write(out, md).map_err(|e| Error::Usage(format!("{out}: {e}")))?;
    Ok(())
}

/// sqlx takes a URL: the conninfo's host, port, user and dbname.
fn url(conninfo: &str) -> String {
    let mut host = "127.0.0.1";
    let (mut port, mut user, mut db) = ("5432", "postgres", "postgres");
    for kv in conninfo.split_whitespace() {
        match kv.split_once('=') {
            Some(("host", v)) => host = v,
            Some(("port", v)) => port = v,
            Some(("user", v)) => user = v,
            Some(("dbname", v)) => db = v,
            _ => {}
        }
    }
    format!("postgres://{user}@{host}:{port}/{db}")
}
