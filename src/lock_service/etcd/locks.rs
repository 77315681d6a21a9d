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
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, LockOptions, PutOptions, SortOrder,
    SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse, WatchOptions,
};
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
    tokio::spawn(save_state_periodically(sh, cfg.state_dir.clone()));
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
                let owners = owners.clone();
                tokio::spawn(async move {
                    let _serving = serving;
                    acquire(c, sh, i, generation, ttl, owners).await
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

/// The transaction etcd's Lock service starts with (`concurrency.Mutex.Lock` in etcd 3.4, the
/// layout `etcdctl lock` and Go's Mutex share): if `my_key` does not exist, create it under the
/// lease, else read it; either way read the key under `<name>/` created first (the owner).
fn enqueue(name: &str, my_key: &str, lease_id: i64) -> Txn {
    let owner = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1);
    let prefix = format!("{name}/");
    Txn::new()
        .when([Compare::create_revision(my_key, CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put(my_key, "", Some(PutOptions::new().with_lease(lease_id))),
            TxnOp::get(prefix.as_str(), Some(owner.clone())),
        ])
        .or_else([TxnOp::get(my_key, None), TxnOp::get(prefix, Some(owner))])
}

/// The token if `enqueue` created our key and it is the owner: the transaction's revision, at
/// which our key was created. `None` (queue with etcd's Lock service) otherwise, also if the
/// answer is not what that transaction gives.
fn owned_at_once(resp: &TxnResponse) -> Option<i64> {
    let revision = resp.header()?.revision();
    if !resp.succeeded() || revision <= 0 {
        return None;
    }
    match resp.op_responses().get(1) {
        Some(TxnOpResponse::Get(owner)) => owner
            .kvs()
            .first()
            .filter(|kv| kv.create_revision() == revision)
            .map(|_| revision),
        _ => None,
    }
}

/// One etcd request of an acquisition, until it is answered, the request's deadline passes, or
/// the backend cancels the request (checked every 5 ms). `None`: no answer to go on with (the
/// slot failed with the reason: an error, 55P03 past the deadline; or it was cancelled); the
/// caller gives up.
async fn step<T>(
    request: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    slot: &Slot,
    generation: u64,
) -> Option<T> {
    let deadline_ms = slot.deadline_ms.load(Ordering::Relaxed);
    let remaining = Duration::from_millis((deadline_ms - now_ms()).max(0) as u64);
    let cancelled = async {
        loop {
            tokio::time::sleep(Duration::from_millis(5)).await;
            if !current(slot, generation) || slot.state.load(Ordering::Acquire) == CANCELLED {
                return;
            }
        }
    };
    tokio::select! {
        r = tokio::time::timeout(remaining, request) => match r {
            Ok(Ok(answer)) => Some(answer),
            Ok(Err(e)) => {
                slot.fail(ERR_OTHER, &format!("etcd lock failed: {e}"));
                None
            }
            Err(_) => {
                slot.fail(ERR_TIMEOUT, "timed out");
                None
            }
        },
        _ = cancelled => None,
    }
}

fn current(slot: &Slot, generation: u64) -> bool {
    slot.generation.load(Ordering::Acquire) == generation
}

/// Check a write's response header against what we know of etcd (see "Revision
/// regression"); what changed is saved by `save_state_periodically`.
fn observe(
    sh: &'static Shared,
    header: Option<&etcd_client::ResponseHeader>,
    floor: i64,
) -> Result<(), String> {
    match header {
        Some(h) => sh.observe_etcd(h.cluster_id(), h.revision(), floor),
        None => Ok(()),
    }
}

/// Save what the state file misses, off the lock requests' path, whoever raised it (lock
/// answers, the watches): a new cluster id or a regression within 100 ms, a higher revision
/// within `STATE_SAVE_INTERVAL`.
async fn save_state_periodically(sh: &'static Shared, state_dir: String) {
    if state_dir.is_empty() {
        return;
    }
    let mut last = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let due = match sh.etcd_state_dirty.load(Ordering::Acquire) {
            CLEAN => false,
            DIRTY_REVISION => last.elapsed() >= STATE_SAVE_INTERVAL,
            _ => true,
        };
        if due {
            last = tokio::time::Instant::now();
            let dir = state_dir.clone();
            let _ = tokio::task::spawn_blocking(move || {
                if let Err(e) = save_state(sh, &dir, "etcd") {
                    eprintln!("pg_fencing: could not save {STATE_FILE}: {e}");
                }
            })
            .await;
        }
    }
}

async fn acquire(
    mut c: Client,
    sh: &'static Shared,
    index: usize,
    generation: u64,
    ttl: i64,
    owners: Owners,
) {
    let slot = &sh.slots[index];
    let name = slot.key();
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
    if let Err(why) = observe(sh, lease.header(), floor) {
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

    // First, in one request, what etcd's Lock service (`concurrency.Mutex.Lock` of etcd 3.4)
    // does first: put our key `<name>/<lease id in hex>` under the lease unless it exists, and
    // read the lock's owner (the key under `<name>/` created first) in the same transaction.
    // If the owner is our key, the lock is ours and the token is the transaction's revision (our
    // key's creation): the answer etcd's Lock service gives without waiting, one request less
    // than asking it (it needs this transaction too) and no lease read (below).
    let my_key = format!("{name}/{lease_id:x}");
    let floor = sh.etcd_highest_revision.load(Ordering::Acquire);
    let Some(first) = step(c.txn(enqueue(&name, &my_key, lease_id)), slot, generation).await else {
        return give_up(c, slot, generation, lease_id).await;
    };
    if let Err(why) = observe(sh, first.header(), floor) {
        slot.fail(ERR_OTHER, &why);
        // Our key may own the lock: delete it, should the revoke in give_up not get through.
        let _ =
            tokio::time::timeout(Duration::from_secs(2), c.delete(my_key.as_bytes(), None)).await;
        return give_up(c, slot, generation, lease_id).await;
    }
    let (token, key, waited) = if let Some(token) = owned_at_once(&first) {
        (token, my_key.into_bytes(), false)
    } else {
        // Somebody holds the lock: queue behind them with etcd's Lock service, which finds our
        // key (the same name) and waits for every key of the lock created before it.
        let floor = sh.etcd_highest_revision.load(Ordering::Acquire);
        let lock = c.lock(
            name.as_bytes(),
            Some(LockOptions::new().with_lease(lease_id)),
        );
        let Some(resp) = step(lock, slot, generation).await else {
            return give_up(c, slot, generation, lease_id).await;
        };
        if let Err(why) = observe(sh, resp.header(), floor) {
            slot.fail(ERR_OTHER, &why);
            let _ = c.unlock(resp.key().to_vec()).await;
            return give_up(c, slot, generation, lease_id).await;
        }
        match resp.header().map(|h| h.revision()) {
            Some(rev) if rev > 0 => (rev, resp.key().to_vec(), true),
            _ => {
                slot.fail(
                    ERR_OTHER,
                    "etcd granted the lock without a revision in its response header",
                );
                let _ = c.unlock(resp.key().to_vec()).await;
                return give_up(c, slot, generation, lease_id).await;
            }
        }
    };
    // etcd 3.4 can grant the lock to a waiter whose lease expired or was revoked while it
    // waited (its key deleted before the revision it gets as token, so the watch below cannot
    // see it): after a wait, check that the lease is alive. Without a wait there is nothing to
    // check: our key was created at the token's revision under the lease, which cannot have
    // expired yet if etcd answered within half its TTL of the grant request (etcd counts the TTL
    // from the grant on); a deletion after that revision is seen by the watch (mark_lost).
    let young = now_ms() < sent + lease.ttl() * 500;
    let alive = (!waited && young)
        || match tokio::time::timeout(Duration::from_secs(2), c.lease_time_to_live(lease_id, None))
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
