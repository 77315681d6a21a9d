//! pg_fencing: storage-side fencing tokens for PostgreSQL.
//!
//! Layers, each depending only on those below it (docs/design.md, "Module map"):
//! * `api` — the SQL surface: C entry points, argument decoding, raising errors;
//! * `guard` — the guard trigger: decodes trigger events;
//! * `rule` — the one implementation of the fencing rule and its locking order;
//! * `state` — marks, tombstones, privileges, counters; `lock_service` — the background worker,
//!   its lock and watch slots, and the etcd thread (reached by `rule` through a narrow interface);
//! * `pg` — the thin PostgreSQL-interface layer; `gucs`, `error`, `cache` depend on nothing of
//!   ours but `error`.
//!
//! `backend` owns the per-backend state's life cycle (transaction, subtransaction and relcache
//! callbacks). The SQL surface is declared in `sql/pg_fencing.sql`.

mod api;
mod backend;
mod backend_event;
mod cache;
mod error;
mod guard;
mod gucs;
mod lock_service;
#[cfg(feature = "pg_test")]
mod model_check;
mod pg;
mod rule;
mod state;
mod text;
mod tombstone_retention;

::pgrx::pg_module_magic!();

pgrx::extension_sql_file!(
    "../sql/pg_fencing.sql",
    name = "pg_fencing_api",
    requires = [
        state::stats::fencing_stats,
        state::stats::fencing_domain_stats,
        api::functions::fencing_lock_status,
        api::functions::fencing_watch_status
    ],
    finalize
);

/// Runs when the library is loaded: with `shared_preload_libraries`, or on the first call of
/// one of its functions in a backend.
#[pgrx::pg_guard]
pub extern "C-unwind" fn _PG_init() {
    pg::process::note_preloading();
    gucs::init();
    state::stats::init_if_preloading();
    state::mark_versions::init_if_preloading();
    lock_service::etcd_locks::init_if_preloading();
    lock_service::watch::init_if_preloading();
    tombstone_retention::init_if_preloading();
    backend::init();
    api::hooks::init();
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    // In-database tests (`cargo pgrx test`). SQLSTATE-level checks of every error are in the
    // pg_regress suite (tests/pg_regress); these check values and the rule end to end.
    use pgrx::prelude::*;

    #[pg_test]
    fn equal_and_higher_tokens_are_accepted_and_raise_the_mark() {
        Spi::run("CREATE TABLE acct (id int PRIMARY KEY, balance int)").unwrap();
        Spi::run("SELECT fencing_protect('acct', 'ledger')").unwrap();
        Spi::run("SET LOCAL pg_fencing.token = '5'").unwrap();
        Spi::run("INSERT INTO acct VALUES (1, 100)").unwrap();
        Spi::run("UPDATE acct SET balance = 110 WHERE id = 1").unwrap();
        assert_eq!(
            Spi::get_one::<i64>("SELECT fencing_high_water('ledger')").unwrap(),
            Some(5)
        );
        Spi::run("SET LOCAL pg_fencing.token = '7'").unwrap();
        Spi::run("UPDATE acct SET balance = 120 WHERE id = 1").unwrap();
        assert_eq!(
            Spi::get_one::<i64>("SELECT fencing_high_water('ledger')").unwrap(),
            Some(7)
        );
        assert_eq!(
            Spi::get_one::<i64>("SELECT fence_token FROM acct WHERE id = 1").unwrap(),
            Some(7)
        );
    }

    #[pg_test(error = "stale fencing token 4 for resource \"ledger2\"")]
    fn lower_token_is_rejected() {
        Spi::run("CREATE TABLE acct2 (id int PRIMARY KEY, balance int)").unwrap();
        Spi::run("SELECT fencing_protect('acct2', 'ledger2')").unwrap();
        Spi::run("SELECT fencing_advance('ledger2', 5)").unwrap();
        Spi::run("SET LOCAL pg_fencing.token = '4'").unwrap();
        Spi::run("INSERT INTO acct2 VALUES (1, 100)").unwrap();
    }

    /// Random sequences of fenced operations from several holders agree with a model of the
    /// rule (proptest; see `model_check.rs`).
    #[cfg(feature = "pg_test")]
    /// A caller's row limit (SPI_execute's count, as PL/Python's `plpy.execute(q, n)` passes
    /// it) does not apply to an INSERT or DELETE without RETURNING: the fast paths' hidden
    /// RETURNING list must not make it stop part-way (it inserted or deleted 2 of 5 rows).
    #[pg_test(error = "stale fencing token 4 for row (5) of table public.lim")]
    fn a_row_limit_does_not_cut_short_a_fast_path_write() {
        Spi::run("CREATE TABLE lim (id int PRIMARY KEY, v int)").unwrap();
        Spi::run("SELECT fencing_protect('lim')").unwrap();
        Spi::run("SET LOCAL pg_fencing.token = '5'").unwrap();
        Spi::connect_mut(|client| {
            client
                .update(
                    "INSERT INTO lim SELECT g, 0 FROM generate_series(1, 5) g",
                    Some(2),
                    &[],
                )
                .unwrap();
        });
        assert_eq!(
            Spi::get_one::<i64>("SELECT count(*) FROM lim").unwrap(),
            Some(5)
        );
        Spi::connect_mut(|client| {
            client.update("DELETE FROM lim", Some(2), &[]).unwrap();
        });
        assert_eq!(
            Spi::get_one::<i64>("SELECT count(*) FROM lim").unwrap(),
            Some(0)
        );
        // Every deleted key left its tombstone: the last one refuses a lower token.
        Spi::run("SET LOCAL pg_fencing.token = '4'").unwrap();
        Spi::run("INSERT INTO lim VALUES (5, 0)").unwrap();
    }

    #[pg_test]
    fn random_fenced_operations_agree_with_a_model_of_the_rule() {
        crate::model_check::run();
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
        assert_eq!(
            row.0,
            serde_json::json!({"id": 1, "state": "done", "fence_token": 3})
        );
        // The call's token did not leak into the session.
        assert_eq!(
            Spi::get_one::<String>("SELECT current_setting('pg_fencing.token')").unwrap(),
            Some(String::new())
        );
    }
}

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
