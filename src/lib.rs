//! pg_fencing: storage-side fencing tokens for PostgreSQL.
//!
//! Module map: `fence` (the rule and its locking), `trigger` (the guard trigger on protected
//! tables), `fenced` (the fenced_* functions), `entry` (C entry points that raise our SQLSTATEs), `gucs` (configuration),
//! `token` (token parsing), `error` (errors and SQLSTATEs). The SQL surface is in
//! `sql/pg_fencing.sql`.

use pgrx::prelude::*;

mod entry;
mod error;
mod fence;
mod fenced;
mod gucs;
#[cfg(feature = "pg_test")]
mod model_check;
mod shmem_text;
mod stats;
mod token;
mod trigger;
mod watch;
mod worker;

::pgrx::pg_module_magic!();

/// Insert into one of the per-backend caches, emptying it first once it holds `cap` entries:
/// every cache here refills cheaply on a miss, so this only bounds its memory.
pub(crate) fn cache_insert<K: std::hash::Hash + Eq, V>(
    map: &mut std::collections::HashMap<K, V>,
    key: K,
    value: V,
    cap: usize,
) {
    if map.len() >= cap {
        map.clear();
    }
    map.insert(key, value);
}

pgrx::extension_sql_file!(
    "../sql/pg_fencing.sql",
    name = "pg_fencing_api",
    requires = [
        stats::fencing_stats,
        stats::fencing_domain_stats,
        entry::fencing_lock_status,
        entry::fencing_watch_status
    ],
    finalize
);

/// Runs when the library is loaded: with `shared_preload_libraries`, or on the first call of
/// one of its functions in a backend.
#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    gucs::init();
    stats::init_if_preloading();
    worker::init_if_preloading();
    watch::init_if_preloading();
    trigger::register_relcache_callback();
    unsafe {
        pg_sys::RegisterXactCallback(Some(xact_callback), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(subxact_callback), std::ptr::null_mut());
    }
}

/// Locks taken by the fencing rule end with the transaction; so does what we know about them.
#[pg_guard]
unsafe extern "C-unwind" fn xact_callback(
    event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    if event == pg_sys::XactEvent::XACT_EVENT_PRE_COMMIT
        || event == pg_sys::XactEvent::XACT_EVENT_PRE_PREPARE
    {
        // Tombstones of this transaction's per-row deletes, batched (see fence.rs).
        fence::flush_tombstones();
        // Registration changes of watched resources reach shared memory with the commit.
        let applied = if event == pg_sys::XactEvent::XACT_EVENT_PRE_COMMIT {
            watch::apply_pending()
        } else {
            watch::refuse_prepare()
        };
        if let Err(e) = applied {
            // SAFETY: in a PRE_COMMIT/PRE_PREPARE callback an ERROR aborts the transaction
            // (PostgreSQL's CommitTransaction/PrepareTransaction allow it there).
            unsafe { error::raise(e) };
        }
        return;
    }
    fence::forget_all();
    fence::forget_internal_write();
    if event == pg_sys::XactEvent::XACT_EVENT_COMMIT
        || event == pg_sys::XactEvent::XACT_EVENT_ABORT
        || event == pg_sys::XactEvent::XACT_EVENT_PREPARE
    {
        fenced::free_stale_plans();
        fence::forget_tombstones();
    }
    if event == pg_sys::XactEvent::XACT_EVENT_ABORT {
        watch::forget_pending();
        trigger::forget_verified();
        worker::abort_pending();
    }
}

/// A subtransaction abort releases the locks it took and undoes the marks it wrote.
#[pg_guard]
unsafe extern "C-unwind" fn subxact_callback(
    event: pg_sys::SubXactEvent::Type,
    my: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        fence::forget_tombstones_of(my);
        watch::forget_pending_of(my);
        fence::forget_all();
        trigger::forget_verified();
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
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
