//! The tombstone pruner: a background worker that applies `fencing_tombstone_retention` in the
//! database `pg_fencing.tombstone_prune_database` (docs/operations.md, "Tombstone retention").
//!
//! Every `pg_fencing.tombstone_prune_interval` it
//! 1. samples the highest etcd revision the etcd worker has seen (`etcd_locks::revision_seen`) into
//!    `_pg_fencing.revision_sample` (WAL-logged, so a restart or promotion keeps the history);
//! 2. for each per-row table with a retention `R`, takes as its floor the highest revision
//!    sampled at least `R` ago, and prunes the table's tombstones at or below it
//!    (`state::tombstones::prune`), 10,000 per transaction;
//! 3. forgets samples older than the newest one any retention still needs (all of them, and
//!    samples nothing, while no table has a retention).
//!
//! Why the floor is safe: a sample is a revision etcd had reached by the time it was taken, so a
//! lock granted after that moment has a higher revision, and so a higher token. A floor taken
//! `R` ago refuses (for keys without a tombstone) only tokens of locks granted more than `R` ago;
//! the retention must exceed the longest time a holder keeps its lock. Without a worker that
//! trusts etcd (none preloaded, no endpoints yet, a revision regression) nothing is sampled, and
//! without a sample old enough nothing is pruned.
//!
//! Worker discipline as in `worker.rs`: it waits on its latch (exiting if the postmaster dies),
//! handles SIGHUP (settings), takes SIGTERM with PostgreSQL's own `die` (the next interrupt check
//! ends it, also in a lock wait), and runs each step in a transaction of its own. It takes a
//! table's lock only when no transaction is writing the table (looking for such a moment for up
//! to a second per round), so it never queues in front of the table's writers; a table written
//! without a pause is left to `fencing_prune_tombstones`, which waits. An error ends the worker; the postmaster starts it
//! again after the interval.

use crate::gucs;
use crate::lock_service::etcd_locks::revision_seen;
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, SignalWakeFlags};
use pgrx::prelude::*;
use std::time::Duration;

/// Tombstones deleted per transaction (each holds the table's SHARE lock until it commits).
const BATCH: i64 = 10_000;

/// Attempts, 5 ms apart, to find a table free of writers in one round.
const BUSY_TRIES: u32 = 200;

/// Register the pruner if `pg_fencing.tombstone_prune_database` is set (only while preloading).
pub fn init_if_preloading() {
    if !crate::pg::process::preloading() || gucs::tombstone_prune_database().is_empty() {
        return;
    }
    BackgroundWorkerBuilder::new("pg_fencing tombstone pruner")
        .set_type("pg_fencing tombstone pruner")
        .set_function("pg_fencing_pruner_main")
        .set_library("pg_fencing")
        .enable_spi_access()
        .set_restart_time(Some(Duration::from_secs(
            gucs::tombstone_prune_interval_s().max(1) as u64,
        )))
        .load();
}

/// Entry point of the pruner.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pg_fencing_pruner_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP);
    // SIGTERM (shutdown, pg_terminate_backend) as PostgreSQL's own workers take it: the next
    // interrupt check ends the process, also inside a lock wait.
    crate::pg::process::sigterm_as_die();
    let db = gucs::tombstone_prune_database();
    BackgroundWorker::connect_worker_to_spi(Some(&db), None);
    pgrx::log!("pg_fencing: tombstone pruner started in database \"{db}\"");
    loop {
        // Exits if the postmaster dies; SIGTERM ends it in the interrupt check.
        crate::pg::process::nap(gucs::tombstone_prune_interval_s().max(1) as i64 * 1000);
        if BackgroundWorker::sighup_received() {
            crate::pg::process::reload_config();
        }
        round();
    }
}

/// One round: sample, prune what is due, forget old samples.
fn round() {
    let revision = revision_seen();
    let due: Vec<(pg_sys::Oid, i64)> = BackgroundWorker::transaction(|| {
        if !extension_installed() {
            return Vec::new();
        }
        if !any_retention() {
            // Nothing needs a history: keep none (a retention set later starts a new one).
            Spi::run("DELETE FROM _pg_fencing.revision_sample").ok();
            return Vec::new();
        }
        if let Some(rev) = revision {
            Spi::run_with_args(
                "INSERT INTO _pg_fencing.revision_sample (sampled_at, revision) \
                 VALUES (pg_catalog.clock_timestamp(), $1) ON CONFLICT DO NOTHING",
                &[rev.into()],
            )
            .ok();
        }
        let due = tables_due();
        // Keep the newest sample that the longest retention still reads, and all newer ones.
        Spi::run(
            "DELETE FROM _pg_fencing.revision_sample s WHERE s.sampled_at OPERATOR(pg_catalog.<) ( \
                 SELECT pg_catalog.max(o.sampled_at) FROM _pg_fencing.revision_sample o \
                 WHERE o.sampled_at OPERATOR(pg_catalog.<=) (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) \
                     (SELECT pg_catalog.max(p.tombstone_retention) FROM _pg_fencing.protected_table p)))",
        )
        .ok();
        due
    });
    for (relid, floor) in due {
        let mut busy = 0;
        loop {
            pgrx::check_for_interrupts!();
            // Without queueing for the table's lock: a queued SHARE request would hold up every
            // writer of the table behind a long one. The lock is taken when no transaction is
            // writing the table; the pruner looks for such a moment every 5 ms for up to a second,
            // then leaves the table to the next round.
            let deleted = BackgroundWorker::transaction(|| {
                match crate::state::tombstones::prune(relid, floor, Some(BATCH), false) {
                    Ok(n) => Ok(n),
                    Err(e) => Err(e.to_string()),
                }
            });
            match deleted {
                Ok(Some(n)) if n >= BATCH => busy = 0,
                Ok(Some(_)) => break,
                Ok(None) if busy < BUSY_TRIES => {
                    busy += 1;
                    crate::pg::process::nap(5);
                }
                Ok(None) => break,
                Err(e) => {
                    // The table was dropped or unprotected since it was listed.
                    pgrx::log!("pg_fencing: tombstone pruner skipped a table: {e}");
                    break;
                }
            }
        }
    }
}

/// Is pg_fencing installed here, at a version with retention (0.2.0; before `ALTER EXTENSION
/// pg_fencing UPDATE` an older one has nothing for the pruner to do)?
fn extension_installed() -> bool {
    Spi::get_one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute \
         WHERE attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('_pg_fencing.protected_table') \
           AND attname OPERATOR(pg_catalog.=) 'tombstone_retention' AND NOT attisdropped)",
    )
    .ok()
    .flatten()
    .unwrap_or(false)
}

fn any_retention() -> bool {
    Spi::get_one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM _pg_fencing.protected_table p \
         WHERE p.resource IS NULL AND p.protected AND p.tombstone_retention IS NOT NULL)",
    )
    .ok()
    .flatten()
    .unwrap_or(false)
}

/// (table, floor) for each per-row table with a retention that has tombstones at or below its
/// floor (the highest revision sampled at least the retention ago). Tables that no longer exist
/// (a protected temporary table gone with its session leaves its protection behind) and other
/// sessions' temporary tables are left out. Raising a floor without deleting anything would
/// only flush every backend's caches, so that waits until there is something to delete.
fn tables_due() -> Vec<(pg_sys::Oid, i64)> {
    let mut due = Vec::new();
    let _ = Spi::connect(|client| {
        let rows = client.select(
            "SELECT p.relid::pg_catalog.oid, f.floor FROM _pg_fencing.protected_table p \
             CROSS JOIN LATERAL (SELECT pg_catalog.max(s.revision) AS floor FROM _pg_fencing.revision_sample s \
                 WHERE s.sampled_at OPERATOR(pg_catalog.<=) (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) p.tombstone_retention)) f \
             JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) p.relid::pg_catalog.oid \
             WHERE p.resource IS NULL AND p.protected AND p.tombstone_retention IS NOT NULL \
               AND c.relpersistence OPERATOR(pg_catalog.<>) 't' \
               AND f.floor IS NOT NULL \
               AND (EXISTS (SELECT 1 FROM _pg_fencing.row_tombstone t \
                            WHERE t.protection_id OPERATOR(pg_catalog.=) p.id \
                              AND t.high_water OPERATOR(pg_catalog.<=) f.floor) \
                    OR EXISTS (SELECT 1 FROM _pg_fencing.tombstone_run r \
                            WHERE r.protection_id OPERATOR(pg_catalog.=) p.id \
                              AND r.high_water OPERATOR(pg_catalog.<=) f.floor))",
            None,
            &[],
        )?;
        for row in rows {
            if let (Some(relid), Some(floor)) = (row.get::<pg_sys::Oid>(1)?, row.get::<i64>(2)?) {
                due.push((relid, floor));
            }
        }
        Ok::<_, pgrx::spi::Error>(())
    });
    due
}
