//! Against a real server with pg_fencing preloaded (tests/rustclient/run.sh of the repository):
//! PGFENCING_TEST_DSN (a libpq-style connection string), PGFENCING_TEST_LOG (the server's log,
//! log_statement = all, '[%a] ' prefix), PGFENCING_TEST_ETCD (host:port of an etcd).

use std::time::Duration;

use pg_fencing::{Code, Error, LeaseOptions, TokenForm};
use tokio_postgres::{Client, NoTls};

fn dsn() -> String {
    std::env::var("PGFENCING_TEST_DSN")
        .expect("PGFENCING_TEST_DSN is not set: run tests/rustclient/run.sh")
}

async fn connect(app: &str) -> Client {
    let (client, conn) =
        tokio_postgres::connect(&format!("{} application_name={app}", dsn()), NoTls)
            .await
            .unwrap();
    tokio::spawn(conn);
    client
}

async fn setup(table: &str, resource: &str, mark: i64) -> Client {
    let admin = connect("admin").await;
    admin
        .batch_execute(&format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, v int);
             SELECT fencing_protect('{table}', '{resource}');
             SELECT fencing_advance('{resource}', {mark});"
        ))
        .await
        .unwrap();
    admin
}

async fn value(c: &Client, q: &str) -> Option<i64> {
    c.query_opt(q, &[])
        .await
        .unwrap()
        .map(|r| r.get::<_, i64>(0))
}

/// The form `token_form` must answer on the server behind `admin`: `SET LOCAL` on PostgreSQL 16
/// or later, or where pg_stat_statements is not preloaded.
async fn expected_form(admin: &Client) -> TokenForm {
    let preloads: String = admin
        .query_one("SHOW shared_preload_libraries", &[])
        .await
        .unwrap()
        .get(0);
    let v16 = value(
        admin,
        "SELECT current_setting('server_version_num')::bigint",
    )
    .await
    .unwrap()
        >= 160000;
    if v16 || !preloads.contains("pg_stat_statements") {
        TokenForm::SetLocal
    } else {
        TokenForm::SetConfig
    }
}

/// Row 1 of `table` back to `v = 1`, written by holder 10.
async fn reset_row(admin: &Client, table: &str) {
    admin
        .batch_execute(&format!(
            "BEGIN; SET LOCAL pg_fencing.token = '10'; UPDATE {table} SET v = 1 WHERE id = 1; COMMIT"
        ))
        .await
        .unwrap();
}

async fn token_setting(c: &Client) -> String {
    c.query_one(
        "SELECT coalesce(current_setting('pg_fencing.token', true), '')",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

async fn in_transaction(c: &Client) -> bool {
    // now() is the transaction's start: older than the statement's only inside a transaction
    // that an earlier statement began.
    // (The simple protocol: one message, one statement start.)
    let rows = c
        .simple_query("SELECT now() <> statement_timestamp()")
        .await
        .unwrap();
    rows.iter()
        .any(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(r) if r.get(0) == Some("t")))
}

#[tokio::test(flavor = "multi_thread")]
async fn tokio_postgres_fenced() {
    use pg_fencing::tokio_postgres::fenced;
    let admin = setup("rt_acct", "rt", 10).await;
    let mut c = connect("rt_client").await;
    fenced(&mut c, 10, async |c: &Client| -> Result<(), Error> {
        c.execute("INSERT INTO rt_acct VALUES (1, 1)", &[]).await?;
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(
        value(&admin, "SELECT fence_token FROM rt_acct WHERE id = 1").await,
        Some(10)
    );

    let err = fenced(&mut c, 9, async |c: &Client| -> Result<(), Error> {
        c.execute("UPDATE rt_acct SET v = 2 WHERE id = 1", &[])
            .await?;
        Ok(())
    })
    .await
    .unwrap_err();
    let f = err.fencing().expect("a typed refusal");
    assert_eq!(f.code, Code::StaleToken, "{err}");
    assert_eq!((f.token, f.high_water), (Some(9), Some(10)), "{f:?}");
    assert_eq!(f.resource.as_deref(), Some("rt"));
    assert!(err.superseded());
    assert_eq!(
        value(&admin, "SELECT v::bigint FROM rt_acct WHERE id = 1").await,
        Some(1)
    );
    assert!(
        !in_transaction(&c).await,
        "the connection is left in a transaction"
    );
    assert_eq!(
        token_setting(&c).await,
        "",
        "the token outlived the fenced transaction"
    );
    let e = Error::from(
        c.execute("UPDATE rt_acct SET v = 3 WHERE id = 1", &[])
            .await
            .unwrap_err(),
    );
    assert_eq!(e.fencing().map(|f| &f.code), Some(&Code::NoToken), "{e}");

    // The function's own error comes back unchanged, and its write is rolled back.
    #[derive(Debug)]
    #[allow(dead_code)] // Fencing's field: shown by Debug when an assertion fails
    enum Mine {
        Handler,
        Fencing(Error),
    }
    impl From<Error> for Mine {
        fn from(e: Error) -> Mine {
            Mine::Fencing(e)
        }
    }
    let r = fenced(&mut c, 10, async |c: &Client| -> Result<(), Mine> {
        c.execute("UPDATE rt_acct SET v = 4 WHERE id = 1", &[])
            .await
            .map_err(Error::from)?;
        Err(Mine::Handler)
    })
    .await;
    assert!(matches!(r, Err(Mine::Handler)), "{r:?}");
    assert_eq!(
        value(&admin, "SELECT v::bigint FROM rt_acct WHERE id = 1").await,
        Some(1)
    );

    // A failed statement whose error the function swallowed: rolled back, reported.
    let r = fenced(&mut c, 10, async |c: &Client| -> Result<(), Error> {
        c.execute("UPDATE rt_acct SET v = 5 WHERE id = 1", &[])
            .await?;
        let _ = c.execute("SELECT 1/0", &[]).await;
        Ok(())
    })
    .await;
    assert!(matches!(r, Err(Error::RolledBack)), "{r:?}");
    assert_eq!(
        value(&admin, "SELECT v::bigint FROM rt_acct WHERE id = 1").await,
        Some(1)
    );
    assert!(!in_transaction(&c).await);

    // The function ended the transaction itself: never reported as a commit.
    for end in ["ROLLBACK", "COMMIT"] {
        let r = fenced(&mut c, 10, async |c: &Client| -> Result<(), Error> {
            c.execute("UPDATE rt_acct SET v = 7 WHERE id = 1", &[])
                .await?;
            c.batch_execute(end).await?;
            Ok(())
        })
        .await;
        assert!(
            matches!(&r, Err(Error::Usage(m)) if m.contains("ended the fenced transaction")),
            "{end} inside the function: {r:?}"
        );
        assert!(!in_transaction(&c).await);
        assert_eq!(token_setting(&c).await, "");
    }
    reset_row(&admin, "rt_acct").await;

    // Cancelled half-way (the future dropped): rolled back; the token gone with it.
    let r = tokio::time::timeout(
        Duration::from_millis(300),
        fenced(&mut c, 10, async |c: &Client| -> Result<(), Error> {
            c.execute("UPDATE rt_acct SET v = 6 WHERE id = 1", &[])
                .await?;
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok(())
        }),
    )
    .await;
    assert!(r.is_err(), "the timeout dropped the future");
    assert!(
        !in_transaction(&c).await,
        "a dropped fenced future left its transaction open"
    );
    assert_eq!(token_setting(&c).await, "");
    assert_eq!(
        value(&admin, "SELECT v::bigint FROM rt_acct WHERE id = 1").await,
        Some(1)
    );

    // A connection already in a transaction (begun by hand, a read in it): refused, that
    // transaction rolled back; also one that is aborted (a tokenless write failed in it), and
    // one inside a savepoint.
    for opened in [
        "BEGIN; SELECT 1",
        "BEGIN; UPDATE rt_acct SET v = 7 WHERE id = 1",
        "BEGIN; SAVEPOINT s",
    ] {
        let _ = c.batch_execute(opened).await;
        assert!(opened.contains("UPDATE") || in_transaction(&c).await);
        let r = fenced(&mut c, 10, async |c: &Client| -> Result<(), Error> {
            c.execute("UPDATE rt_acct SET v = 8 WHERE id = 1", &[])
                .await?;
            Ok(())
        })
        .await;
        assert!(
            matches!(r, Err(Error::Usage(_))),
            "fenced inside {opened:?}: {r:?}"
        );
        assert!(!in_transaction(&c).await, "{opened}");
        assert_eq!(token_setting(&c).await, "");
        assert_eq!(
            value(&admin, "SELECT v::bigint FROM rt_acct WHERE id = 1").await,
            Some(1)
        );
    }
    // One begun by hand with nothing run in it: it becomes f's transaction, ended by fenced.
    c.batch_execute("BEGIN; SET LOCAL application_name = 'rt_by_hand'")
        .await
        .unwrap();
    fenced(&mut c, 10, async |c: &Client| -> Result<(), Error> {
        c.execute("UPDATE rt_acct SET v = 9 WHERE id = 1", &[])
            .await?;
        Ok(())
    })
    .await
    .unwrap();
    assert!(!in_transaction(&c).await);
    assert_eq!(token_setting(&c).await, "");
    assert_eq!(
        value(&admin, "SELECT v::bigint FROM rt_acct WHERE id = 1").await,
        Some(9)
    );
    reset_row(&admin, "rt_acct").await;

    let r = fenced(&mut c, 0, async |_c: &Client| -> Result<(), Error> {
        Ok(())
    })
    .await;
    assert!(matches!(r, Err(Error::BadToken(0))), "{r:?}");

    // The COMMIT query fails (a deferred trigger raises): the error, nothing committed, the
    // connection out of any transaction and without the token.
    admin
        .batch_execute(
            "CREATE FUNCTION rt_refuse() RETURNS trigger LANGUAGE plpgsql AS
               $$BEGIN RAISE EXCEPTION 'refused at commit' USING ERRCODE = 'P0001'; END$$;
             CREATE CONSTRAINT TRIGGER rt_at_commit AFTER UPDATE ON rt_acct
               DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION rt_refuse();",
        )
        .await
        .unwrap();
    let r = fenced(&mut c, 10, async |c: &Client| -> Result<(), Error> {
        c.execute("UPDATE rt_acct SET v = 11 WHERE id = 1", &[])
            .await?;
        Ok(())
    })
    .await;
    assert_eq!(
        r.as_ref().err().and_then(|e| e.sqlstate()).as_deref(),
        Some("P0001"),
        "{r:?}"
    );
    assert!(!in_transaction(&c).await);
    assert_eq!(token_setting(&c).await, "");
    assert_eq!(
        value(&admin, "SELECT v::bigint FROM rt_acct WHERE id = 1").await,
        Some(1)
    );
}

fn statements(app: &str) -> Vec<String> {
    let log = std::fs::read_to_string(
        std::env::var("PGFENCING_TEST_LOG").expect("PGFENCING_TEST_LOG is not set"),
    )
    .unwrap();
    log.lines()
        .filter(|l| l.contains(&format!("[{app}]")))
        .filter(|l| l.contains("LOG:  statement:") || l.contains("LOG:  execute"))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn round_trips() {
    use pg_fencing::tokio_postgres::fenced;
    let admin = setup("rt_rt", "rt_rt", 10).await;
    admin
        .batch_execute(
            "CREATE TABLE rt_plain (id int PRIMARY KEY, v int); INSERT INTO rt_plain VALUES (1, 0);
             BEGIN; SET LOCAL pg_fencing.token = '10'; INSERT INTO rt_rt VALUES (1, 0); COMMIT",
        )
        .await
        .unwrap();
    let mut f = connect("rt_rt_fenced").await;
    let mut u = connect("rt_rt_plain").await;
    let upd = f
        .prepare("UPDATE rt_rt SET v = v + 1 WHERE id = $1")
        .await
        .unwrap();
    fenced(&mut f, 10, async |c: &Client| -> Result<(), Error> {
        c.execute(&upd, &[&1i32]).await?;
        Ok(())
    })
    .await
    .unwrap();
    // The form the server takes, asked once, and a transaction in it: the same round trips.
    let mut g = connect("rt_rt_form").await;
    let form = pg_fencing::tokio_postgres::token_form(&g).await.unwrap();
    assert_eq!(
        form,
        expected_form(&admin).await,
        "tokio-postgres' token_form"
    );
    let upd_g = g
        .prepare("UPDATE rt_rt SET v = v + 1 WHERE id = $1")
        .await
        .unwrap();
    pg_fencing::tokio_postgres::fenced_as(
        &mut g,
        10,
        form,
        async |c: &Client| -> Result<(), Error> {
            c.execute(&upd_g, &[&1i32]).await?;
            Ok(())
        },
    )
    .await
    .unwrap();
    assert_eq!(
        value(&admin, "SELECT fence_token FROM rt_rt WHERE id = 1").await,
        Some(10)
    );
    let upd = u
        .prepare("UPDATE rt_plain SET v = v + 1 WHERE id = $1")
        .await
        .unwrap();
    let tx = u.transaction().await.unwrap();
    tx.execute(&upd, &[&1i32]).await.unwrap();
    tx.commit().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (nf, nu) = (statements("rt_rt_fenced"), statements("rt_rt_plain"));
    assert!(
        !nf.is_empty() && nf.len() == nu.len(),
        "fenced {nf:#?}\nunfenced {nu:#?}"
    );
    // rt_rt_form also sent the probe (and its prepare, as the others did theirs).
    let sent = match form {
        TokenForm::SetLocal => "BEGIN NOT DEFERRABLE; SET LOCAL pg_fencing.token = '10'",
        TokenForm::SetConfig => {
            "BEGIN NOT DEFERRABLE; SELECT pg_catalog.set_config('pg_fencing.token', '10', true)"
        }
    };
    let ng = statements("rt_rt_form");
    assert!(
        ng.len() == nf.len() + 1 && ng.iter().any(|l| l.ends_with(sent)),
        "fenced_as({form:?}) {ng:#?}"
    );
    println!("statements: fenced {}, unfenced {}", nf.len(), nu.len());
}

#[tokio::test(flavor = "multi_thread")]
async fn tokio_postgres_lease() {
    use pg_fencing::tokio_postgres::run_with_lease;
    let admin = setup("rt_job", "rt_job", 1).await;
    admin
        .batch_execute(
            "BEGIN; SET LOCAL pg_fencing.token = '1'; INSERT INTO rt_job VALUES (1, 0); COMMIT",
        )
        .await
        .unwrap();
    // A whole job: lease, fenced write, release.
    let mut c = connect("rt_lease_work").await;
    let token = run_with_lease(
        connect("rt_lease").await,
        &mut c,
        "rt_job",
        Duration::from_secs(3),
        LeaseOptions::default(),
        async |c: &Client, lease: &pg_fencing::Lease| -> Result<i64, Error> {
            c.execute("UPDATE rt_job SET v = 1 WHERE id = 1", &[])
                .await?;
            Ok(lease.token())
        },
    )
    .await
    .unwrap();
    assert_eq!(
        value(&admin, "SELECT fence_token FROM rt_job WHERE id = 1").await,
        Some(token)
    );
    assert_eq!(
        value(&admin, &format!("SELECT count(*) FROM fencing_leases WHERE token = {token} AND expires_at > clock_timestamp()")).await,
        Some(0),
        "the lease was released"
    );

    // Lost mid-job (released from outside, as a take-over after expiry would end it): the
    // function is stopped before its write, FT003, nothing committed.
    let started = std::time::Instant::now();
    let r = run_with_lease(
        connect("rt_lease").await,
        &mut c,
        "rt_job",
        Duration::from_millis(1500),
        LeaseOptions::default(),
        async |c: &Client, lease: &pg_fencing::Lease| -> Result<(), Error> {
            let outside = connect("rt_outside").await;
            outside
                .execute("SELECT fencing_lease_release($1)", &[&lease.token()])
                .await?;
            tokio::time::sleep(Duration::from_secs(4)).await;
            c.execute("UPDATE rt_job SET v = 2 WHERE id = 1", &[])
                .await?;
            Ok(())
        },
    )
    .await;
    let e = r.unwrap_err();
    assert_eq!(e.fencing().map(|f| &f.code), Some(&Code::LeaseLost), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "stopped at the loss, not after the job"
    );
    assert_eq!(
        value(&admin, "SELECT v::bigint FROM rt_job WHERE id = 1").await,
        Some(1)
    );
    assert!(!in_transaction(&c).await);

    // A stalled lease connection (its backend frozen): lost once the TTL passes without a
    // confirmed renewal, although the renewal never returns.
    let lease_client = connect("rt_lease_frozen").await;
    let lease = pg_fencing::Lease::acquire(
        lease_client,
        "rt_frozen",
        Duration::from_millis(1500),
        LeaseOptions::default(),
    )
    .await
    .unwrap();
    let pid: i32 = admin
        .query_one(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'rt_lease_frozen'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let stop = std::process::Command::new("kill")
        .args(["-STOP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(stop.success());
    let lost = tokio::time::timeout(Duration::from_secs(4), lease.lost()).await;
    std::process::Command::new("kill")
        .args(["-CONT", &pid.to_string()])
        .status()
        .unwrap();
    assert!(
        lost.is_ok(),
        "a lease whose renewal is stuck is lost within its TTL"
    );
    assert!(lease.check().is_err());
    assert!(!lease.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlx_fenced() {
    use pg_fencing::sqlx::{fenced_pool, run_with_lease, FencedConnection};
    use sqlx::postgres::PgPoolOptions;
    let admin = setup("sx_acct", "sx", 10).await;
    let opts: sqlx::postgres::PgConnectOptions = std::env::var("PGFENCING_TEST_URL")
        .expect("PGFENCING_TEST_URL is not set: run tests/rustclient/run.sh")
        .parse()
        .unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(opts.application_name("sx_client"))
        .await
        .unwrap();
    fenced_pool(
        &pool,
        10,
        async |c: &mut FencedConnection<'_>| -> Result<(), Error> {
            sqlx::query("INSERT INTO sx_acct VALUES (1, 1)")
                .execute(&mut *c)
                .await?;
            Ok(())
        },
    )
    .await
    .unwrap();
    assert_eq!(
        value(&admin, "SELECT fence_token FROM sx_acct WHERE id = 1").await,
        Some(10)
    );
    // The token's form follows the server: SET LOCAL from PostgreSQL 16 on, set_config before.
    let v16: bool = value(
        &admin,
        "SELECT current_setting('server_version_num')::bigint",
    )
    .await
    .unwrap()
        >= 160000;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let begins: Vec<String> = statements("sx_client")
        .into_iter()
        .filter(|l| l.contains("BEGIN"))
        .collect();
    let want = if v16 {
        "BEGIN NOT DEFERRABLE; SET LOCAL pg_fencing.token = '10'"
    } else {
        "BEGIN NOT DEFERRABLE; SELECT pg_catalog.set_config('pg_fencing.token', '10', true)"
    };
    assert!(
        begins.len() == 1 && begins[0].ends_with(want),
        "sqlx's BEGIN on this server: {begins:#?}"
    );
    let err = fenced_pool(
        &pool,
        9,
        async |c: &mut FencedConnection<'_>| -> Result<(), Error> {
            sqlx::query("UPDATE sx_acct SET v = 2 WHERE id = 1")
                .execute(&mut *c)
                .await?;
            Ok(())
        },
    )
    .await
    .unwrap_err();
    let f = err.fencing().expect("typed");
    assert_eq!(
        (f.code.clone(), f.token, f.high_water),
        (Code::StaleToken, Some(9), Some(10))
    );
    // The pool's next borrower (the same connection: max 1) carries no token.
    let t: String =
        sqlx::query_scalar("SELECT coalesce(current_setting('pg_fencing.token', true), '')")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(t, "");
    let e = Error::from(
        sqlx::query("UPDATE sx_acct SET v = 3 WHERE id = 1")
            .execute(&pool)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.fencing().map(|f| &f.code), Some(&Code::NoToken), "{e}");

    // Swallowed failure: RolledBack.
    let r = fenced_pool(
        &pool,
        10,
        async |c: &mut FencedConnection<'_>| -> Result<(), Error> {
            sqlx::query("UPDATE sx_acct SET v = 5 WHERE id = 1")
                .execute(&mut *c)
                .await?;
            let _ = sqlx::query("SELECT 1/0").execute(&mut *c).await;
            Ok(())
        },
    )
    .await;
    assert!(matches!(r, Err(Error::RolledBack)), "{r:?}");
    assert_eq!(
        value(&admin, "SELECT v::bigint FROM sx_acct WHERE id = 1").await,
        Some(1)
    );

    // The function ended the transaction itself: never reported as a commit.
    for end in ["ROLLBACK", "COMMIT"] {
        let r = fenced_pool(
            &pool,
            10,
            async |c: &mut FencedConnection<'_>| -> Result<(), Error> {
                sqlx::query("UPDATE sx_acct SET v = 7 WHERE id = 1")
                    .execute(&mut *c)
                    .await?;
                sqlx::raw_sql(end).execute(&mut *c).await?;
                Ok(())
            },
        )
        .await;
        assert!(
            matches!(&r, Err(Error::Usage(m)) if m.contains("ended the fenced transaction")),
            "{end} inside the function: {r:?}"
        );
    }
    reset_row(&admin, "sx_acct").await;

    // The form asked of the server, and a transaction in it.
    let mut conn = pool.acquire().await.unwrap();
    let form = pg_fencing::sqlx::token_form(&mut conn).await.unwrap();
    assert_eq!(form, expected_form(&admin).await, "sqlx's token_form");
    pg_fencing::sqlx::fenced_as(
        conn,
        10,
        form,
        async |c: &mut FencedConnection<'_>| -> Result<(), Error> {
            sqlx::query("UPDATE sx_acct SET v = 8 WHERE id = 1")
                .execute(&mut *c)
                .await?;
            Ok(())
        },
    )
    .await
    .unwrap();
    assert_eq!(
        value(&admin, "SELECT v::bigint FROM sx_acct WHERE id = 1").await,
        Some(8)
    );
    reset_row(&admin, "sx_acct").await;

    // Cancelled half-way: the next borrower is not in the fenced transaction.
    let r = tokio::time::timeout(
        Duration::from_millis(300),
        fenced_pool(
            &pool,
            10,
            async |c: &mut FencedConnection<'_>| -> Result<(), Error> {
                sqlx::query("UPDATE sx_acct SET v = 6 WHERE id = 1")
                    .execute(&mut *c)
                    .await?;
                tokio::time::sleep(Duration::from_secs(5)).await;
                Ok(())
            },
        ),
    )
    .await;
    assert!(r.is_err());
    let (t, busy): (String, bool) = sqlx::query_as(
        // The fenced transaction had written: still in it, it would have an xid.
        "SELECT coalesce(current_setting('pg_fencing.token', true), ''), pg_current_xact_id_if_assigned() IS NOT NULL",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        (t.as_str(), busy),
        ("", false),
        "a dropped fenced future leaked to the pool's next borrower"
    );
    assert_eq!(
        value(&admin, "SELECT v::bigint FROM sx_acct WHERE id = 1").await,
        Some(1)
    );

    // The one-call form on sqlx, and a loss mid-job.
    admin
        .batch_execute("SELECT fencing_protect('sx_acct', 'sx'); ")
        .await
        .ok();
    let r = run_with_lease(
        &pool,
        "sx_job",
        Duration::from_millis(1500),
        LeaseOptions::default(),
        async |c: &mut FencedConnection<'_>, lease: &pg_fencing::Lease| -> Result<(), Error> {
            let outside = connect("sx_outside").await;
            outside
                .execute("SELECT fencing_lease_release($1)", &[&lease.token()])
                .await?;
            tokio::time::sleep(Duration::from_secs(4)).await;
            sqlx::query("UPDATE sx_acct SET v = 8 WHERE id = 1")
                .execute(&mut *c)
                .await?;
            Ok(())
        },
    )
    .await;
    let e = r.unwrap_err();
    assert_eq!(e.fencing().map(|f| &f.code), Some(&Code::LeaseLost), "{e}");
    assert_eq!(
        value(&admin, "SELECT v::bigint FROM sx_acct WHERE id = 1").await,
        Some(1)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn etcd_lock_token() {
    use pg_fencing::tokio_postgres::fenced;
    let endpoint = std::env::var("PGFENCING_TEST_ETCD").expect("PGFENCING_TEST_ETCD is not set");
    let admin = setup("et_acct", "et", 1).await;
    let mut etcd = etcd_client::Client::connect([endpoint.as_str()], None)
        .await
        .unwrap();
    let lease_a = etcd.lease_grant(30, None).await.unwrap().id();
    let a = pg_fencing::etcd::lock(&mut etcd, "et", lease_a)
        .await
        .unwrap();
    let mut c = connect("et_client").await;
    fenced(&mut c, a.token, async |c: &Client| -> Result<(), Error> {
        c.execute("INSERT INTO et_acct VALUES (1, 1)", &[]).await?;
        Ok(())
    })
    .await
    .unwrap();
    // A's lease revoked (its holder presumed dead); B takes the lock with a higher token, writes.
    etcd.lease_revoke(lease_a).await.unwrap();
    let lease_b = etcd.lease_grant(30, None).await.unwrap().id();
    let b = pg_fencing::etcd::lock(&mut etcd, "et", lease_b)
        .await
        .unwrap();
    assert!(b.token > a.token, "{b:?} after {a:?}");
    fenced(&mut c, b.token, async |c: &Client| -> Result<(), Error> {
        c.execute("UPDATE et_acct SET v = 2 WHERE id = 1", &[])
            .await?;
        Ok(())
    })
    .await
    .unwrap();
    // A, back from its pause, is refused.
    let e = fenced(&mut c, a.token, async |c: &Client| -> Result<(), Error> {
        c.execute("UPDATE et_acct SET v = 3 WHERE id = 1", &[])
            .await?;
        Ok(())
    })
    .await
    .unwrap_err();
    assert_eq!(e.fencing().map(|f| &f.code), Some(&Code::StaleToken), "{e}");
    assert_eq!(
        value(&admin, "SELECT v::bigint FROM et_acct WHERE id = 1").await,
        Some(2)
    );
    // A lock requested under a lease that is gone is not granted.
    let e = pg_fencing::etcd::lock(&mut etcd, "et2", lease_a)
        .await
        .unwrap_err();
    println!("a lock under a revoked lease: {e}");
    etcd.lease_revoke(lease_b).await.unwrap();
}

/// The pool's next borrower: its token setting and whether a tokenless write to `table` is let
/// through (it must be refused, FT002: a leaked fenced transaction would admit it).
async fn next_borrower(pool: &sqlx::PgPool, table: &str) -> (String, Option<String>) {
    let mut c = pool.acquire().await.unwrap();
    let t: String =
        sqlx::query_scalar("SELECT coalesce(current_setting('pg_fencing.token', true), '')")
            .fetch_one(&mut *c)
            .await
            .unwrap();
    let w = sqlx::query(&format!("UPDATE {table} SET v = 99 WHERE id = 1"))
        .execute(&mut *c)
        .await;
    let code = w
        .err()
        .map(|e| Error::from(e).sqlstate().unwrap_or_default());
    let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *c).await;
    (t, code)
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlx_cancelled_and_unclean() {
    use futures_util::FutureExt;
    use pg_fencing::sqlx::{fenced, fenced_pool, FencedConnection};
    use sqlx::postgres::PgPoolOptions;
    let admin = setup("sx_cancel", "sx_cancel", 10).await;
    admin
        .batch_execute(
            "BEGIN; SET LOCAL pg_fencing.token = '10'; INSERT INTO sx_cancel VALUES (1, 0); COMMIT",
        )
        .await
        .unwrap();
    let opts: sqlx::postgres::PgConnectOptions = std::env::var("PGFENCING_TEST_URL")
        .unwrap()
        .parse()
        .unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(opts.application_name("sx_cancel"))
        .await
        .unwrap();
    let write = async |c: &mut FencedConnection<'_>| -> Result<(), Error> {
        sqlx::query("UPDATE sx_cancel SET v = v + 1 WHERE id = 1")
            .execute(&mut *c)
            .await?;
        Ok(())
    };
    // Dropped after its first poll: the BEGIN query is in flight.
    assert!(fenced_pool(&pool, 10, write).now_or_never().is_none());
    assert_eq!(
        next_borrower(&pool, "sx_cancel").await,
        (String::new(), Some("FT002".into())),
        "a fenced_pool dropped during its BEGIN"
    );
    // Dropped at every moment: timeouts of 0 to 3 ms.
    for us in (0..3000).step_by(50) {
        let _ =
            tokio::time::timeout(Duration::from_micros(us), fenced_pool(&pool, 10, write)).await;
        assert_eq!(
            next_borrower(&pool, "sx_cancel").await,
            (String::new(), Some("FT002".into())),
            "a fenced_pool dropped after {us} µs"
        );
    }
    // (Some of those ran to their end and committed; a cancelled one did not leak.)
    let before = value(&admin, "SELECT v::bigint FROM sx_cancel WHERE id = 1").await;
    // An earlier query's error still pending on the connection when fenced begins.
    let mut c = pool.acquire().await.unwrap();
    let _ = tokio::time::timeout(
        Duration::from_millis(50),
        sqlx::query("SELECT 1 / (0 * count(*)) FROM pg_sleep(0.2)").execute(&mut *c),
    )
    .await;
    let r = fenced(c, 10, write).await;
    assert!(r.is_err(), "{r:?}");
    assert_eq!(
        next_borrower(&pool, "sx_cancel").await,
        (String::new(), Some("FT002".into())),
        "fenced after an abandoned query"
    );
    // A connection in a transaction begun by hand, a read in it: refused, the connection closed.
    let mut c = pool.acquire().await.unwrap();
    sqlx::raw_sql("BEGIN; SELECT 1")
        .execute(&mut *c)
        .await
        .unwrap();
    let r = fenced(c, 10, write).await;
    assert!(matches!(r, Err(Error::Usage(_))), "{r:?}");
    assert_eq!(
        next_borrower(&pool, "sx_cancel").await,
        (String::new(), Some("FT002".into()))
    );
    assert_eq!(
        value(&admin, "SELECT v::bigint FROM sx_cancel WHERE id = 1").await,
        before,
        "no refused transaction committed"
    );
    // One begun by hand with nothing run in it: it becomes f's transaction, ended by fenced.
    let mut c = pool.acquire().await.unwrap();
    sqlx::raw_sql("BEGIN").execute(&mut *c).await.unwrap();
    fenced(c, 10, write).await.unwrap();
    assert_eq!(
        next_borrower(&pool, "sx_cancel").await,
        (String::new(), Some("FT002".into()))
    );
    assert_eq!(
        value(&admin, "SELECT v::bigint FROM sx_cancel WHERE id = 1").await,
        before.map(|v| v + 1)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn lease_lost_during_a_slow_commit() {
    use pg_fencing::tokio_postgres::run_with_lease;
    // A deferred constraint trigger that takes 2.5 s at COMMIT; the lease is released from
    // outside while it runs. What run_with_lease reports must be what happened.
    let admin = setup("rt_slow", "rt_slow", 1).await;
    admin
        .batch_execute(
            "BEGIN; SET LOCAL pg_fencing.token = '1'; INSERT INTO rt_slow VALUES (1, 0); COMMIT;
             CREATE FUNCTION rt_slow_commit() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN PERFORM pg_sleep(2.5); RETURN NULL; END $$;
             CREATE CONSTRAINT TRIGGER rt_slow_commit AFTER UPDATE ON rt_slow
               DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION rt_slow_commit();",
        )
        .await
        .unwrap();
    let mut c = connect("rt_slow").await;
    let r = run_with_lease(
        connect("rt_slow_lease").await,
        &mut c,
        "rt_slow",
        Duration::from_millis(1500),
        LeaseOptions::default(),
        async |c: &Client, lease: &pg_fencing::Lease| -> Result<(), Error> {
            c.execute("UPDATE rt_slow SET v = 1 WHERE id = 1", &[])
                .await?;
            let token = lease.token();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let outside = connect("rt_slow_outside").await;
                let _ = outside
                    .execute("SELECT fencing_lease_release($1)", &[&token])
                    .await;
            });
            Ok(())
        },
    )
    .await;
    let v = value(&admin, "SELECT v::bigint FROM rt_slow WHERE id = 1").await;
    println!("a lease lost during a slow COMMIT: {r:?}, v = {v:?}");
    assert_eq!(r.is_ok(), v == Some(1), "reported {r:?} but v = {v:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn etcd_key_recreated_while_queued() {
    // B queues behind A; B's key is deleted; C queues; B's key is created again under B's lease
    // (a second request); A unlocks. C owns the lock (its key is the oldest): B's first request
    // must not be granted, or two holders would carry tokens of the same order.
    let endpoint = std::env::var("PGFENCING_TEST_ETCD").unwrap();
    let connect_etcd = async || {
        etcd_client::Client::connect([endpoint.as_str()], None)
            .await
            .unwrap()
    };
    let mut etcd = connect_etcd().await;
    let lease =
        async |etcd: &mut etcd_client::Client| etcd.lease_grant(30, None).await.unwrap().id();
    let (la, lb, lc) = (
        lease(&mut etcd).await,
        lease(&mut etcd).await,
        lease(&mut etcd).await,
    );
    let a = pg_fencing::etcd::lock(&mut etcd, "et3", la).await.unwrap();
    let mut eb = connect_etcd().await;
    let b1 = tokio::spawn(async move { pg_fencing::etcd::lock(&mut eb, "et3", lb).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b_key = format!("et3/{lb:x}");
    assert_eq!(etcd.delete(b_key.clone(), None).await.unwrap().deleted(), 1);
    let mut ec = connect_etcd().await;
    let c = tokio::spawn(async move { pg_fencing::etcd::lock(&mut ec, "et3", lc).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut eb2 = connect_etcd().await;
    let b2 = tokio::spawn(async move { pg_fencing::etcd::lock(&mut eb2, "et3", lb).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    etcd.unlock(a.key.clone()).await.unwrap();
    let c = tokio::time::timeout(Duration::from_secs(5), c)
        .await
        .unwrap()
        .unwrap();
    let b1 = tokio::time::timeout(Duration::from_secs(5), b1)
        .await
        .unwrap()
        .unwrap();
    println!("C: {c:?}\nB's first request: {b1:?}");
    assert!(c.is_ok(), "C owns the lock: {c:?}");
    let e = b1.expect_err("B's first request is not granted");
    assert_eq!(e.fencing().map(|f| &f.code), Some(&Code::LeaseLost), "{e}");
    for l in [la, lb, lc] {
        let _ = etcd.lease_revoke(l).await;
    }
    b2.abort();
}
