//! The etcd thread's lock tasks (see `lock_service/locks.rs` for the slots they serve and the
//! lock protocol): the loop that takes the worker's commands, and per lock the acquisition, the
//! lease keepalive, the watch on the holder's key and the release. Runs on tokio, never calls
//! PostgreSQL, and only reads and writes the slots' atomics.
#![forbid(unsafe_code)]

use super::client::{connect, Config};
use crate::lock_service::locks::*;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// What the worker's main thread asks of the etcd thread.
pub(crate) enum Cmd {
    Config(Config),
    Acquire(usize, u64),
    Release(usize, u64),
    Cancel(usize, u64),
    Shutdown(std::sync::mpsc::Sender<()>),
}
use etcd_client::{Client, EventType, LockOptions, WatchOptions};
use tokio::sync::mpsc::UnboundedReceiver;

/// The client each held lock was taken with: a release must reach the etcd cluster that
/// holds the key, even after `pg_fencing.etcd_endpoints` changed.
type Owners = std::sync::Arc<std::sync::Mutex<std::collections::HashMap<usize, Client>>>;

/// The (slot, generation) pairs whose acquire task is running. Only the task frees its slot
/// once it runs (it may be about to take the lock in etcd); `Cmd::Cancel` frees a cancelled slot
/// only when no task serves it.
type InFlight = std::sync::Arc<std::sync::Mutex<std::collections::HashSet<(usize, u64)>>>;

/// Removes its (slot, generation) from [`InFlight`] when the acquire task ends, however it ends.
struct Serving(InFlight, (usize, u64));

impl Drop for Serving {
    fn drop(&mut self) {
        if let Ok(mut f) = self.0.lock() {
            f.remove(&self.1);
        }
    }
}

pub(crate) async fn run(mut rx: UnboundedReceiver<Cmd>, mut cfg: Config, sh: &'static Shared) {
    let owners: Owners = Default::default();
    let in_flight: InFlight = Default::default();
    let watch_cfg = std::sync::Arc::new(std::sync::Mutex::new(cfg.clone()));
    tokio::spawn(super::watch::supervise(watch_cfg.clone()));
    let mut client: Option<Client> = None;
    let mut backoff = Duration::from_millis(100);
    let mut next_try = tokio::time::Instant::now();
    while let Some(cmd) = rx.recv().await {
        match cmd {
            Cmd::Config(c) => {
                if c.endpoints != cfg.endpoints {
                    client = None;
                }
                if let Ok(mut w) = watch_cfg.lock() {
                    *w = c.clone();
                }
                cfg = c;
            }
            Cmd::Acquire(i, generation) => {
                let slot = &sh.slots[i];
                if client.is_none() {
                    if tokio::time::Instant::now() < next_try {
                        // Back off between reconnection attempts, but never fail a request
                        // only because of the backoff: wait for the next attempt.
                        tokio::time::sleep_until(next_try).await;
                    }
                    match connect(&cfg).await {
                        Ok(c) => {
                            client = Some(c);
                            backoff = Duration::from_millis(100);
                            sh.etcd.store(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            sh.etcd.store(2, Ordering::Relaxed);
                            next_try = tokio::time::Instant::now() + backoff;
                            backoff = (backoff * 2).min(Duration::from_secs(5));
                            // No task will serve it: a request cancelled meanwhile is freed here.
                            fail_or_free(
                                slot,
                                ERR_UNREACHABLE,
                                &format!("etcd is unreachable at {}: {e}", cfg.endpoints.join(",")),
                            );
                            continue;
                        }
                    }
                }
                let Some(c) = client.clone() else {
                    fail_or_free(slot, ERR_UNREACHABLE, "no connection to etcd");
                    continue;
                };
                if !current(slot, generation) {
                    continue;
                }
                let ttl = cfg.ttl;
                if let Ok(mut f) = in_flight.lock() {
                    f.insert((i, generation));
                }
                let serving = Serving(in_flight.clone(), (i, generation));
                let (owners, state_dir) = (owners.clone(), cfg.state_dir.clone());
                tokio::spawn(async move {
                    let _serving = serving;
                    acquire(c, sh, i, generation, ttl, owners, state_dir).await
                });
            }
            Cmd::Release(i, generation) => {
                let own = owners.lock().map(|mut o| o.remove(&i)).ok().flatten();
                if let Some(c) = own.or_else(|| client.clone()) {
                    tokio::spawn(release(c, &sh.slots[i], generation));
                } else {
                    // Without a connection the lease cannot be revoked; it expires by itself.
                    let _ = sh.slots[i].transition(RELEASING, FREE);
                }
            }
            Cmd::Cancel(i, generation) => {
                // The acquire task sees CANCELLED and cleans up; if none serves the request
                // (it ended without freeing the slot), free the slot here.
                let slot = &sh.slots[i];
                let served = in_flight
                    .lock()
                    .map(|f| f.contains(&(i, generation)))
                    .unwrap_or(true);
                if !served && current(slot, generation) {
                    let _ = slot.transition(CANCELLED, FREE);
                }
            }
            Cmd::Shutdown(done) => {
                let held: Vec<(Client, i64)> = {
                    let o = owners.lock().map(|o| o.clone()).unwrap_or_default();
                    sh.slots
                        .iter()
                        .enumerate()
                        .filter(|(_, s)| {
                            matches!(
                                s.state.load(Ordering::Acquire),
                                HELD | LOST | RELEASING | RELEASE_REQUESTED
                            )
                        })
                        .filter_map(|(i, s)| {
                            let lease = s.lease.load(Ordering::Relaxed);
                            let c = o.get(&i).cloned().or_else(|| client.clone())?;
                            (lease != 0).then_some((c, lease))
                        })
                        .collect()
                };
                let _ = tokio::time::timeout(Duration::from_millis(500), async {
                    for (mut c, l) in held {
                        let _ = c.lease_revoke(l).await;
                    }
                })
                .await;
                let _ = done.send(());
                return;
            }
        }
    }
}

fn current(slot: &Slot, generation: u64) -> bool {
    slot.generation.load(Ordering::Acquire) == generation
}

/// Check a write's response header against what we know of etcd (see "Revision
/// regression"); save the state file in the background when it changed.
fn observe(
    sh: &'static Shared,
    header: Option<&etcd_client::ResponseHeader>,
    floor: i64,
    state_dir: &str,
) -> Result<(), String> {
    let result = match header {
        Some(h) => sh.observe_etcd(h.cluster_id(), h.revision(), floor),
        None => Ok(()),
    };
    if sh.etcd_state_dirty.load(Ordering::Acquire) != 0 && !state_dir.is_empty() {
        let dir = state_dir.to_string();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = save_state(sh, &dir, "etcd") {
                eprintln!("pg_fencing: could not save {STATE_FILE}: {e}");
            }
        });
    }
    result
}

async fn acquire(
    mut c: Client,
    sh: &'static Shared,
    index: usize,
    generation: u64,
    ttl: i64,
    owners: Owners,
    state_dir: String,
) {
    let slot = &sh.slots[index];
    let name = slot.key();
    let deadline_ms = slot.deadline_ms.load(Ordering::Relaxed);
    let remaining = Duration::from_millis((deadline_ms - now_ms()).max(0) as u64);
    let sent = now_ms();
    let floor = sh.etcd_highest_revision.load(Ordering::Acquire);
    let lease = match tokio::time::timeout(Duration::from_secs(3), c.lease_grant(ttl, None)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            return fail_or_free(slot, ERR_UNREACHABLE, &format!("lease grant failed: {e}"))
        }
        Err(_) => return fail_or_free(slot, ERR_UNREACHABLE, "lease grant timed out"),
    };
    let lease_id = lease.id();
    if let Err(why) = observe(sh, lease.header(), floor, &state_dir) {
        slot.fail(ERR_OTHER, &why);
        return give_up(c, slot, generation, lease_id).await;
    }
    slot.lease.store(lease_id, Ordering::Relaxed);
    slot.ttl.store(lease.ttl(), Ordering::Relaxed);
    slot.valid_until_ms
        .store(sent + lease.ttl() * 1000, Ordering::Relaxed);
    tokio::spawn(keep_alive(
        c.clone(),
        slot,
        generation,
        lease_id,
        lease.ttl(),
    ));

    let floor = sh.etcd_highest_revision.load(Ordering::Acquire);
    let lock = c.lock(
        name.as_bytes(),
        Some(LockOptions::new().with_lease(lease_id)),
    );
    let cancelled = async {
        loop {
            tokio::time::sleep(Duration::from_millis(5)).await;
            if !current(slot, generation) || slot.state.load(Ordering::Acquire) == CANCELLED {
                return;
            }
        }
    };
    let outcome = tokio::select! {
        r = tokio::time::timeout(remaining, lock) => Some(r),
        _ = cancelled => None,
    };
    let resp = match outcome {
        None => return give_up(c, slot, generation, lease_id).await,
        Some(Err(_)) => {
            slot.fail(ERR_TIMEOUT, "timed out");
            return give_up(c, slot, generation, lease_id).await;
        }
        Some(Ok(Err(e))) => {
            slot.fail(ERR_OTHER, &format!("etcd lock failed: {e}"));
            return give_up(c, slot, generation, lease_id).await;
        }
        Some(Ok(Ok(r))) => r,
    };
    if let Err(why) = observe(sh, resp.header(), floor, &state_dir) {
        slot.fail(ERR_OTHER, &why);
        let _ = c.unlock(resp.key().to_vec()).await;
        return give_up(c, slot, generation, lease_id).await;
    }
    let token = match resp.header().map(|h| h.revision()) {
        Some(rev) if rev > 0 => rev,
        _ => {
            slot.fail(
                ERR_OTHER,
                "etcd granted the lock without a revision in its response header",
            );
            let _ = c.unlock(resp.key().to_vec()).await;
            return give_up(c, slot, generation, lease_id).await;
        }
    };
    let key = resp.key().to_vec();
    // etcd 3.4 can grant the lock to a waiter whose lease has just expired: check it is alive.
    let alive =
        match tokio::time::timeout(Duration::from_secs(2), c.lease_time_to_live(lease_id, None))
            .await
        {
            Ok(Ok(r)) => r.ttl() > 0,
            _ => false,
        };
    if !alive {
        slot.fail(
            ERR_LEASE,
            "etcd reports the request's lease expired or revoked when it granted the lock",
        );
        return give_up(c, slot, generation, lease_id).await;
    }
    slot.set_key(&key);
    slot.token.store(token, Ordering::Relaxed);
    if let Ok(mut o) = owners.lock() {
        o.insert(index, c.clone());
    }
    if !slot.transition(ACQUIRING, HELD) {
        // Cancelled meanwhile: undo.
        if let Ok(mut o) = owners.lock() {
            o.remove(&index);
        }
        let _ = c.unlock(key).await;
        give_up(c, slot, generation, lease_id).await;
        return;
    }
    // Watch our key from the grant on: its deletion (lease revoked or expired, key deleted by
    // someone) means the lock is gone, and is reported at once. The watch is set up after the
    // token is handed out, but from revision token + 1, so no deletion is missed. Without a
    // watch, loss is still detected by the keepalive (within TTL/3) and by the lease's
    // validity time.
    let watch = tokio::time::timeout(
        Duration::from_secs(2),
        c.watch(
            key,
            Some(WatchOptions::new().with_start_revision(token + 1)),
        ),
    )
    .await;
    if let Ok(Ok(stream)) = watch {
        watch_key(stream, slot, generation).await;
    }
}

async fn watch_key(mut stream: etcd_client::WatchStream, slot: &'static Slot, generation: u64) {
    loop {
        if !current(slot, generation) || !matches!(slot.state.load(Ordering::Acquire), HELD) {
            return;
        }
        match tokio::time::timeout(Duration::from_millis(500), stream.message()).await {
            Err(_) => continue,
            Ok(Ok(Some(resp))) => {
                if resp
                    .events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
                {
                    mark_lost(
                        slot,
                        generation,
                        "its etcd key was deleted (lease revoked or expired)",
                    );
                    return;
                }
                if resp.canceled() {
                    return;
                }
            }
            Ok(_) => return,
        }
    }
}

fn fail_or_free(slot: &Slot, code: u32, msg: &str) {
    slot.fail(code, msg);
    let _ = slot.transition(CANCELLED, FREE);
}

/// Revoke the lease (deleting any key under it) and free a cancelled slot.
async fn give_up(mut c: Client, slot: &Slot, generation: u64, lease: i64) {
    let _ = tokio::time::timeout(Duration::from_secs(2), c.lease_revoke(lease)).await;
    if current(slot, generation) {
        let _ = slot.transition(CANCELLED, FREE);
    }
}

async fn release(mut c: Client, slot: &'static Slot, generation: u64) {
    let key = slot.key();
    let lease = slot.lease.load(Ordering::Relaxed);
    // Revoking the lease deletes our key with it (one request); without a lease, delete the
    // key itself. Our key carries our lease id, so this never deletes another holder's key.
    let revoked = lease != 0
        && matches!(
            tokio::time::timeout(Duration::from_secs(2), c.lease_revoke(lease)).await,
            Ok(Ok(_))
        );
    if !revoked {
        let _ = tokio::time::timeout(Duration::from_secs(2), c.unlock(key.as_bytes())).await;
    }
    if current(slot, generation) {
        slot.token.store(0, Ordering::Relaxed);
        let _ = slot.transition(RELEASING, FREE);
    }
}

fn mark_lost(slot: &Slot, generation: u64, why: &str) {
    if current(slot, generation) {
        let _ = slot.transition_saying(HELD, LOST, why);
    }
}

/// Keep one lease alive every TTL/3 until its slot moves on; mark the lock lost when etcd
/// says the lease is gone or when it could not be confirmed within its TTL.
async fn keep_alive(mut c: Client, slot: &'static Slot, generation: u64, lease: i64, ttl: i64) {
    let period = Duration::from_millis((ttl.max(1) * 1000 / 3) as u64);
    let mut stream = None;
    loop {
        tokio::time::sleep(period).await;
        if !current(slot, generation) {
            return;
        }
        match slot.state.load(Ordering::Acquire) {
            ACQUIRING | HELD => {}
            _ => return,
        }
        if stream.is_none() {
            stream = match tokio::time::timeout(Duration::from_secs(2), c.lease_keep_alive(lease))
                .await
            {
                Ok(Ok(s)) => Some(s),
                _ => None,
            };
        }
        let sent = now_ms();
        let answer = match stream.as_mut() {
            Some((keeper, responses)) => tokio::time::timeout(period, async {
                keeper.keep_alive().await.ok()?;
                responses.message().await.ok().flatten()
            })
            .await
            .ok()
            .flatten(),
            None => None,
        };
        match answer {
            Some(r) if r.ttl() > 0 => {
                slot.valid_until_ms
                    .store(sent + r.ttl() * 1000, Ordering::Relaxed);
            }
            Some(_) => {
                mark_lost(
                    slot,
                    generation,
                    "etcd reports the lease expired or was revoked",
                );
                return;
            }
            None => {
                stream = None; // reconnect the keepalive stream on the next round
                               // Is the lease gone (revoked), or is etcd just not answering?
                if let Ok(Ok(r)) =
                    tokio::time::timeout(Duration::from_secs(1), c.lease_time_to_live(lease, None))
                        .await
                {
                    if r.ttl() <= 0 {
                        mark_lost(
                            slot,
                            generation,
                            "etcd reports the lease expired or was revoked",
                        );
                        return;
                    }
                }
                if now_ms() >= slot.valid_until_ms.load(Ordering::Relaxed) {
                    mark_lost(
                        slot,
                        generation,
                        "the lease could not be kept alive within its TTL",
                    );
                    return;
                }
            }
        }
    }
}
