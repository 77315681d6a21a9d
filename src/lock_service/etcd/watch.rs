//! The etcd thread's side: tokio + etcd-client, no PostgreSQL calls.
#![forbid(unsafe_code)]

use super::client::{connect, Config};
use crate::lock_service::etcd_locks::{
    etcd_highest_revision, lock_service_problem, now_ms, observe_etcd_answer, observe_etcd_seen,
    report_problem,
};
use crate::lock_service::watch::*;
use etcd_client::{Client, EventType, GetOptions, WatchOptions};
use pg_fencing_core::handover::{self, holder, GrantSearch};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Starts, restarts and stops one watch task per registered resource; saves the state file
/// when a hand-over raised a mark.
pub(crate) async fn supervise(cfg: Arc<Mutex<Config>>) {
    let Some(sh) = shared() else { return };
    // Per slot: the generation and settings its task was started with, and the task.
    type Running = (u64, Config, tokio::task::JoinHandle<()>);
    let mut running: Vec<Option<Running>> = (0..WATCH_SLOTS).map(|_| None).collect();
    loop {
        let current_cfg = cfg.lock().map(|c| c.clone()).ok();
        let settings = current_cfg.clone().unwrap_or_default();
        for (i, s) in sh.slots.iter().enumerate() {
            let state = s.state();
            let generation = s.generation.load(Ordering::Acquire);
            let same = running[i]
                .as_ref()
                .map(|(g, c, _)| *g == generation && c.same_connection(&settings))
                .unwrap_or(false);
            if state == W::Active && !same {
                // A new registration, or new endpoints after a reload: start over.
                if let Some((_, _, h)) = running[i].take() {
                    h.abort();
                    let _ = h.await;
                }
                if let Some(c) = current_cfg.clone() {
                    running[i] = Some((
                        generation,
                        settings.clone(),
                        tokio::spawn(watch_slot(s, generation, c)),
                    ));
                }
            } else if state != W::Active {
                if let Some((_, _, h)) = running[i].take() {
                    h.abort();
                    let _ = h.await;
                    // An unregistered watch has no problem to report any more.
                    report_problem(&format!("watch {}", s.prefix()), None);
                }
                // The task is gone: the slot may be reused.
                let _ = s.transition(W::Draining, W::Free);
            }
        }
        if sh.dirty.swap(0, Ordering::AcqRel) != 0 {
            if let Some(dir) = current_cfg.map(|c| c.state_dir).filter(|d| !d.is_empty()) {
                let _ = tokio::task::spawn_blocking(move || {
                    let saved =
                        StateLock::take(&dir).and_then(|_lock| save_state(sh, &dir, "etcd"));
                    if let Err(e) = saved {
                        sh.dirty.store(1, Ordering::Release);
                        eprintln!("pg_fencing: could not save {STATE_FILE}: {e}");
                    }
                })
                .await;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn watch_slot(slot: &'static WatchSlot, generation: u64, cfg: Config) {
    let mut backoff = Duration::from_millis(100);
    loop {
        if slot.generation.load(Ordering::Acquire) != generation {
            return;
        }
        let source = format!("watch {}", slot.prefix());
        match watch_once(slot, generation, &cfg).await {
            Ok(()) => return report_problem(&source, None),
            Err(e) => {
                // Start over from a fresh read of the lock's keys: nothing is missed.
                report_problem(
                    &source,
                    Some(format!(
                        "the watch of \"{}\" reconnects: {e}",
                        slot.prefix()
                    )),
                );
                slot.report(generation, &format!("reconnecting: {e}"));
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// Raise to `rev`, the grant of the key created at `key` (0: a bound, not a known grant).
fn raise(slot: &WatchSlot, rev: i64, key: i64, generation: u64) {
    // etcd's revisions went backwards: no mark is advanced until fencing_reset.
    if lock_service_problem().is_some() {
        return;
    }
    if rev > 0 && slot.raise_handover(rev, key, generation) {
        if let Some(sh) = shared() {
            sh.dirty.store(1, Ordering::Release);
        }
    }
}

/// The lock's keys (key -> create revision) at `revision` (0: now), with the response's
/// revision. `Err((true, why))`: that revision is compacted away; `Err((false, why))`: any
/// other failure.
async fn keys_at(
    c: &mut Client,
    prefix: &str,
    revision: i64,
) -> Result<(BTreeMap<Vec<u8>, i64>, Option<etcd_client::ResponseHeader>), (bool, String)> {
    let mut opts = GetOptions::new().with_prefix();
    if revision > 0 {
        opts = opts.with_revision(revision);
    }
    let resp = tokio::time::timeout(Duration::from_secs(2), c.get(prefix, Some(opts)))
        .await
        .map_err(|_| (false, "reading the lock's keys timed out".to_string()))?
        .map_err(|e| {
            let compacted = super::client::classify(&e) == super::client::EtcdFailure::Compacted;
            (compacted, super::client::describe(&e))
        })?;
    let keys = resp
        .kvs()
        .iter()
        .map(|kv| (kv.key().to_vec(), kv.create_revision()))
        .collect();
    Ok((keys, resp.header().cloned()))
}

/// The revision etcd's history now starts after (its compaction revision), learnt from a
/// watch that asks for `from`, a revision known to be compacted away (a watch from the
/// compaction revision itself is not cancelled: it would wait instead of answering).
async fn compacted_up_to(c: &mut Client, prefix: &str, from: i64) -> Result<i64, String> {
    let mut stream = c
        .watch(
            prefix,
            Some(WatchOptions::new().with_prefix().with_start_revision(from)),
        )
        .await
        .map_err(|e| super::client::describe(&e))?;
    loop {
        let resp = tokio::time::timeout(Duration::from_secs(2), stream.message())
            .await
            .map_err(|_| "asking etcd for its compaction revision timed out".to_string())?
            .map_err(|e| super::client::describe(&e))?
            .ok_or("the watch stream ended")?;
        if resp.canceled() && resp.compact_revision() > 0 {
            return Ok(resp.compact_revision());
        }
        if !resp.created() || resp.canceled() {
            return Err("etcd reported no compaction revision".into());
        }
    }
}

/// One watch from a fresh start. Returns Ok when the registration changed, Err on any
/// failure (the caller starts over).
///
/// The decisions are `pg_fencing_core::handover`'s (checked there against every order of
/// events up to a bound). It starts from the lock's keys at the current revision `r0`, which
/// decide the hand-over revision without any history that happened while the watch was not
/// running (PostgreSQL or the worker stopped, the connection to etcd cut): if the lock is
/// free, every token issued so far is at most `r0` and belongs to a former holder, so the
/// mark becomes `r0`; if it is held, the holder's grant (found by `GrantSearch`, reading the
/// keys at past revisions) is above every former holder's token. Where etcd compacted the
/// revisions that search needs, it takes a safe bound instead (`handover::compacted_bound`)
/// and the status says so. Only then is the view confirmed, so the resource admits writes
/// (`wait_until_synced`); from `r0 + 1` on it follows etcd's events.
async fn watch_once(slot: &'static WatchSlot, generation: u64, cfg: &Config) -> Result<(), String> {
    let mut c = connect(cfg).await?;
    let prefix = slot.prefix();
    let floor = etcd_highest_revision();
    let (mut keys, header) = keys_at(&mut c, &prefix, 0).await.map_err(|(_, e)| e)?;
    let r0 = header.as_ref().map(|h| h.revision()).unwrap_or(0);
    if let Some(h) = &header {
        // A linearizable read sent after a write was answered sees at least its revision.
        observe_etcd_answer(h.cluster_id(), h.revision(), floor)
            .map_err(|why| format!("not advancing marks: {why}"))?;
    }
    // The last hand-over applied (and whose grant it was).
    let applied = slot.handover.load(Ordering::Acquire);
    let applied_key = slot.handover_key.load(Ordering::Acquire);
    let mut status = "watching".to_string();
    match holder(&keys) {
        None => {
            raise(slot, r0, 0, generation);
            if applied < r0 {
                status = format!("watching; the lock was free at revision {r0}: mark raised to it");
            }
        }
        Some(hc) => {
            let mut search = GrantSearch::new(hc, r0);
            let mut bound = None;
            while let Some(mid) = search.next() {
                match keys_at(&mut c, &prefix, mid).await {
                    Ok((k, _)) => search.holder_at(mid, holder(&k) == Some(hc)),
                    Err((true, _)) => {
                        // `mid` is compacted: etcd's history now starts at `cr`.
                        let cr = compacted_up_to(&mut c, &prefix, mid).await?;
                        let (k, _) = keys_at(&mut c, &prefix, cr).await.map_err(|(_, e)| e)?;
                        if holder(&k) == Some(hc) {
                            bound = Some((
                                cr,
                                handover::compacted_bound(Some(hc), cr, applied, applied_key),
                            ));
                            break;
                        }
                        search.holder_at(cr, false);
                    }
                    Err((false, e)) => return Err(e),
                }
            }
            match bound {
                None => raise(slot, search.grant(), hc, generation),
                Some((cr, b)) => {
                    raise(
                        slot,
                        b,
                        if b == applied { applied_key } else { 0 },
                        generation,
                    );
                    status = if b == cr {
                        format!("watching; history before revision {cr} compacted while the lock was held: mark raised to {cr} (the holder may have to take the lock again)")
                    } else {
                        format!("watching; history before revision {cr} compacted: the holder is the one whose grant ({b}) was applied last")
                    };
                }
            }
        }
    }
    let start = r0 + 1;
    let mut stream = tokio::time::timeout(
        Duration::from_secs(2),
        c.watch(
            prefix.clone(),
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_prev_key()
                    .with_start_revision(start),
            ),
        ),
    )
    .await
    .map_err(|_| "starting the watch timed out".to_string())?
    .map_err(|e| super::client::describe(&e))?;
    // Everything up to r0 is accounted for: the resource may admit writes.
    slot.confirm(r0, now_ms(), generation);
    report_problem(&format!("watch {prefix}"), None);
    let _ = stream.request_progress().await;
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    // When the view was last confirmed (by an answer on the stream or by `still_held`).
    let mut confirmed_at = now_ms();
    slot.report(generation, &status);
    loop {
        if slot.generation.load(Ordering::Acquire) != generation {
            return Ok(());
        }
        tokio::select! {
            msg = stream.message() => {
                let resp = msg.map_err(|e| super::client::describe(&e))?.ok_or("the watch stream ended")?;
                if resp.created() && !resp.canceled() {
                    continue;
                }
                if resp.canceled() {
                    // Compacted between the read and the watch, or cancelled by etcd: start
                    // over (from the keys at the then current revision).
                    return Err(format!("the watch was canceled ({})", resp.cancel_reason()));
                }
                for ev in resp.events() {
                    let Some(kv) = ev.kv() else { continue };
                    let rev = kv.mod_revision();
                    let put = match ev.event_type() {
                        EventType::Put => Some(kv.create_revision()),
                        EventType::Delete => None,
                    };
                    // A new holder: granted at the later of its key's creation and this
                    // event (its predecessor's deletion).
                    if let Some((granted, key)) = handover::apply_event(&mut keys, kv.key().to_vec(), put, rev) {
                        raise(slot, granted, key, generation);
                        slot.report(generation, &format!("lock changed hands at revision {granted}"));
                    }
                }
                // Every revision a watch sees counts for noticing a restored etcd: an answer below
                // it later is a regression, also when the worker wrote nothing since (issue 30).
                let seen = resp.events().iter().filter_map(|e| e.kv()).map(|kv| kv.mod_revision()).max().unwrap_or(0);
                let cluster = resp.header().map(|h| h.cluster_id()).unwrap_or(0);
                let header_rev = resp.header().map(|h| h.revision()).unwrap_or(0);
                observe_etcd_seen(cluster, seen.max(header_rev))?;
                if let Some(h) = resp.header() {
                    // Events are delivered in order and the watch started right after r0:
                    // an answer (events or a progress report) confirms etcd's state up to its
                    // revision, as far as this lock's keys are concerned.
                    confirmed_at = now_ms();
                    slot.confirm(h.revision(), confirmed_at, generation);
                }
            }
            _ = tick.tick() => {
                stream.request_progress().await.map_err(|e| super::client::describe(&e))?;
                // etcd's gRPC proxy answers no progress request: a view that no answer has
                // confirmed for two ticks is confirmed by a read instead (`still_held`).
                if now_ms() - confirmed_at >= 400 {
                    let sent = now_ms();
                    if let Some(rev) = still_held(&mut c, &prefix, &keys).await? {
                        confirmed_at = sent;
                        slot.confirm(rev, sent, generation);
                    }
                }
            }
        }
    }
}

/// A confirmation of the view without the watch stream: a linearizable read of the lock's keys
/// at the current revision `R`. If the holder at `R` is the key the view has as holder (the same
/// key, created at the same revision, so it existed and held the lock all along), nobody else
/// held the lock in between and the view's hand-over mark is right up to `R`: `Some(R)`, sent
/// at the time the caller took before the call. Otherwise (no holder, another one: the
/// stream has events still to deliver) `None`, and the view waits for them. A free lock's view
/// is never confirmed this way: a holder created and gone between two reads leaves no trace in
/// either, and a free lock has no rightful writer to keep waiting.
async fn still_held(
    c: &mut Client,
    prefix: &str,
    keys: &BTreeMap<Vec<u8>, i64>,
) -> Result<Option<i64>, String> {
    let oldest = |k: &BTreeMap<Vec<u8>, i64>| -> Option<(Vec<u8>, i64)> {
        let hc = holder(k)?;
        let first: Vec<&Vec<u8>> = k
            .iter()
            .filter(|(_, r)| **r == hc)
            .map(|(k, _)| k)
            .collect();
        // Two keys created by one transaction: no single holder to compare.
        (first.len() == 1).then(|| (first[0].clone(), hc))
    };
    let Some(mine) = oldest(keys) else {
        return Ok(None);
    };
    let floor = etcd_highest_revision();
    let (now, header) = keys_at(c, prefix, 0).await.map_err(|(_, e)| e)?;
    let Some(h) = header else { return Ok(None) };
    observe_etcd_answer(h.cluster_id(), h.revision(), floor)
        .map_err(|why| format!("not advancing marks: {why}"))?;
    Ok((oldest(&now) == Some(mine)).then_some(h.revision()))
}
