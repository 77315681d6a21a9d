//! In-database tests (`cargo pgrx test`). SQLSTATE-level checks of every error are in the
//! pg_regress suite (tests/pg_regress); these check values and the rule end to end.
use pgrx::prelude::*;

#[pg_test]
fn equal_and_higher_tokens_are_accepted_and_raise_the_mark() {
    Spi::run("CREATE TABLE acct (id int PRIMARY KEY, balance int)").unwrap();
    Spi::run("SELECT fencing_protect('acct', 'ledger')").unwrap();
    Spi::run("SET LOCAL pg_fencing.token = '5'").unwrap();
    Spi::run("INSERT INTO acct VALUES (1, 100)").unwrap();
    Spi::run("UPDATE acct SET balance = 110 WHERE id = 1").unwrap();
    assert_eq!(Spi::get_one::<i64>("SELECT fencing_high_water('ledger')").unwrap(), Some(5));
    Spi::run("SET LOCAL pg_fencing.token = '7'").unwrap();
    Spi::run("UPDATE acct SET balance = 120 WHERE id = 1").unwrap();
    assert_eq!(Spi::get_one::<i64>("SELECT fencing_high_water('ledger')").unwrap(), Some(7));
    assert_eq!(Spi::get_one::<i64>("SELECT fence_token FROM acct WHERE id = 1").unwrap(), Some(7));
}

#[pg_test(error = "stale fencing token 4 for resource \"ledger2\"")]
fn lower_token_is_rejected() {
    Spi::run("CREATE TABLE acct2 (id int PRIMARY KEY, balance int)").unwrap();
    Spi::run("SELECT fencing_protect('acct2', 'ledger2')").unwrap();
    Spi::run("SELECT fencing_advance('ledger2', 5)").unwrap();
    Spi::run("SET LOCAL pg_fencing.token = '4'").unwrap();
    Spi::run("INSERT INTO acct2 VALUES (1, 100)").unwrap();
}

#[pg_test]
fn fenced_update_returns_the_new_row() {
    Spi::run("CREATE TABLE job (id int PRIMARY KEY, state text)").unwrap();
    Spi::run("SELECT fencing_protect('job')").unwrap();
    Spi::run("SELECT fenced_insert('job', '{\"id\": 1, \"state\": \"new\"}', 3)").unwrap();
    let row = Spi::get_one::<pgrx::JsonB>(
        "SELECT fenced_update('job', '{\"id\": \"1\"}', '{\"state\": \"done\"}', 3)",
    )
    .unwrap()
    .unwrap();
    assert_eq!(row.0, serde_json::json!({"id": 1, "state": "done", "fence_token": 3}));
    // The call's token did not leak into the session.
    assert_eq!(Spi::get_one::<String>("SELECT current_setting('pg_fencing.token')").unwrap(), Some(String::new()));
}
