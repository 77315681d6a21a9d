//! The etcd thread's lock tasks (see `lock_service/etcd_locks.rs` for the slots they serve and the
//! lock protocol): the loop that takes the worker's commands, and per lock the acquisition (etcd's
//! concurrency mutex), the watch on the holder's key and the release. The sessions' shared
//! leases and their keepalives are in `session.rs`. Runs on tokio, never calls PostgreSQL, and
//! only reads and writes the slots' atomics.
#![forbid(unsafe_code)]

use super::client::{classify, connect, describe, Config, EtcdFailure};
use super::session::{
    fail_or_free, observe, retire_lease, session_lease, Session, Sessions, RECONNECT,
};
use crate::lock_service::etcd_locks::*;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// What the worker's main thread asks of the etcd thread.
pub(crate) enum Cmd {
    Config(Box<Config>),
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

use std::sync::Arc;

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
    let sessions: Sessions = Default::default();
    let in_flight: InFlight = Default::default();
    let watch_cfg = std::sync::Arc::new(std::sync::Mutex::new(cfg.clone()));
    tokio::spawn(super::watch::supervise(watch_cfg.clone()));
    tokio::spawn(save_state_periodically(sh, cfg.state_dir.clone()));
    let mut client: Option<Client> = None;
    let mut backoff = Duration::from_millis(100);
    let mut next_try = tokio::time::Instant::now();
    // Why the last connection attempt failed (requests during the backoff fail with it).
    let mut last_failure = String::new();
    while let Some(cmd) = rx.recv().await {
        match cmd {
            Cmd::Config(c) => {
                if !c.same_connection(&cfg) {
                    // New settings: a new connection, tried at once.
                    client = None;
                    next_try = tokio::time::Instant::now();
                    backoff = Duration::from_millis(100);
                }
                if let Ok(mut w) = watch_cfg.lock() {
                    *w = (*c).clone();
                }
                cfg = *c;
            }
            Cmd::Acquire(i, generation) => {
                let slot = &sh.slots()[i];
                if RECONNECT.swap(false, Ordering::AcqRel) {
                    client = None;
                }
                if client.is_none() {
                    if tokio::time::Instant::now() < next_try {
                        // Between attempts (at most a second apart): fail with the last
                        // attempt's reason rather than hold up this loop, which must take the
                        // other commands (a reload with fixed settings among them) meanwhile.
                        fail_or_free(slot, AcquireFailure::Unreachable, &last_failure);
                        continue;
                    }
                    match connect(&cfg).await {
                        Ok(c) => {
                            client = Some(c);
                            backoff = Duration::from_millis(100);
                            sh.etcd.store(1, Ordering::Relaxed);
                            report_problem("locks", None);
                        }
                        Err(e) => {
                            sh.etcd.store(2, Ordering::Relaxed);
                            next_try = tokio::time::Instant::now() + backoff;
                            backoff = (backoff * 2).min(Duration::from_secs(1));
                            let why =
                                format!("etcd is unreachable at {}: {e}", cfg.endpoints.join(","));
                            report_problem("locks", Some(why.clone()));
                            last_failure = why.clone();
                            // No task will serve it: a request cancelled meanwhile is freed here.
                            fail_or_free(slot, AcquireFailure::Unreachable, &why);
                            continue;
                        }
                    }
                }
                let Some(c) = client.clone() else {
                    fail_or_free(slot, AcquireFailure::Unreachable, "no connection to etcd");
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
                let sessions = sessions.clone();
                tokio::spawn(async move {
                    let _serving = serving;
                    acquire(c, sh, i, generation, ttl, owners, sessions).await
                });
            }
            Cmd::Release(i, generation) => {
                let own = owners.lock().map(|mut o| o.remove(&i)).ok().flatten();
                if let Some(c) = own.or_else(|| client.clone()) {
                    tokio::spawn(release(c, sh, i, generation, sessions.clone()));
                } else {
                    // Without a connection the key cannot be deleted; it goes with the
                    // session's lease, which nobody keeps alive without a connection.
                    let _ = sh.slots()[i].transition(S::Releasing, S::Free);
                }
            }
            Cmd::Cancel(i, generation) => {
                // The acquire task sees Cancelled and cleans up; if none serves the request
                // (it ended without freeing the slot), free the slot here.
                let slot = &sh.slots()[i];
                let served = in_flight
                    .lock()
                    .map(|f| f.contains(&(i, generation)))
                    .unwrap_or(true);
                if !served && current(slot, generation) {
                    let _ = slot.transition(S::Cancelled, S::Free);
                }
            }
            Cmd::Shutdown(done) => {
                // Every session's lease (deleting the keys of its locks).
                let all: Vec<Arc<Session>> = sessions
                    .lock()
                    .map(|m| m.values().cloned().collect())
                    .unwrap_or_default();
                let mut held: Vec<(Client, i64)> = Vec::new();
                for session in all {
                    if let Ok(l) = session.lease.try_lock() {
                        if let Some(l) = l.as_ref() {
                            held.push((l.client.clone(), l.id));
                        }
                    }
                }
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
fn key_created(resp: &TxnResponse) -> Option<i64> {
    if resp.succeeded() {
        return resp.header().map(|h| h.revision()).filter(|r| *r > 0);
    }
    match resp.op_responses().first() {
        Some(TxnOpResponse::Get(mine)) => mine.kvs().first().map(|kv| kv.create_revision()),
        _ => None,
    }
}

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

/// Why an acquisition gives up: the slot's failure code and reason (set by `give_up` after it
/// has deleted our key, so that the backend, which frees a failed slot at once and may ask for
/// the same lock again, never races that deletion); `None` when the backend cancelled.
type Failure = Option<(AcquireFailure, String)>;

/// One etcd request of an acquisition, until it is answered, the request's deadline passes, or
/// the backend cancels the request (checked every 5 ms). `Err`: no answer to go on with (an
/// error, 55P03 past the deadline, or cancelled); the caller gives up with it.
async fn step<T>(
    request: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    slot: &Slot,
    generation: u64,
) -> Result<T, Failure> {
    match step_result(request, slot, generation).await? {
        Ok(answer) => Ok(answer),
        Err(e) => Err(Some((
            AcquireFailure::Other,
            format!("etcd lock failed: {}", describe(&e)),
        ))),
    }
}

/// `step`, leaving an etcd error to the caller.
async fn step_result<T>(
    request: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    slot: &Slot,
    generation: u64,
) -> Result<Result<T, etcd_client::Error>, Failure> {
    let deadline_ms = slot.deadline_ms.load(Ordering::Relaxed);
    let remaining = Duration::from_millis((deadline_ms - now_ms()).max(0) as u64);
    let cancelled = async {
        loop {
            tokio::time::sleep(Duration::from_millis(5)).await;
            if !current(slot, generation) || slot.state() == S::Cancelled {
                return;
            }
        }
    };
    tokio::select! {
        r = tokio::time::timeout(remaining, request) => match r {
            Ok(answer) => Ok(answer),
            Err(_) => Err(Some((AcquireFailure::Timeout, "timed out".to_string()))),
        },
        _ = cancelled => Err(None),
    }
}

fn current(slot: &Slot, generation: u64) -> bool {
    slot.generation.load(Ordering::Acquire) == generation
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
    sessions: Sessions,
) {
    let slot = &sh.slots()[index];
    let name = slot.key();
    // First, in one request, what etcd's Lock service (`concurrency.Mutex.Lock` of etcd 3.4)
    // does first: put our key `<name>/<lease id in hex>` under the lease unless it exists, and
    // read the lock's owner (the key under `<name>/` created first) in the same transaction.
    // If the owner is our key, the lock is ours and the token is the transaction's revision (our
    // key's creation): the answer etcd's Lock service gives without waiting, one request less
    // than asking it (it needs this transaction too) and no lease read (below).
    let mut attempts = 0;
    let (session, lease, my_key, first, floor) = loop {
        let Some((session, lease)) = session_lease(&mut c, sh, slot, ttl, &sessions).await else {
            return;
        };
        let my_key = format!("{name}/{:x}", lease.id);
        let floor = sh.etcd_highest_revision.load(Ordering::Acquire);
        let txn = c.txn(enqueue(&name, &my_key, lease.id));
        match step_result(txn, slot, generation).await {
            Err(why) => {
                return give_up(c, slot, generation, &session, lease.id, &my_key, why).await
            }
            Ok(Ok(r)) => break (session, lease, my_key, r, floor),
            // The session's lease ended before its keepalive noticed (revoked from outside,
            // say): give it up and try once more with a new one.
            Ok(Err(e)) if attempts == 0 && classify(&e) == EtcdFailure::NotFound => {
                attempts += 1;
                retire_lease(&session, lease.id, "etcd no longer has it").await;
            }
            Ok(Err(e)) => {
                let why = format!("etcd lock failed: {}", describe(&e));
                return give_up(
                    c,
                    slot,
                    generation,
                    &session,
                    lease.id,
                    &my_key,
                    Some((AcquireFailure::Other, why)),
                )
                .await;
            }
        }
    };
    let lease_id = lease.id;
    let (token, key) = match grant(
        &mut c,
        sh,
        slot,
        generation,
        (&name, lease_id, &lease.retired),
        &first,
        floor,
    )
    .await
    {
        Ok(granted) => granted,
        Err(why) => return give_up(c, slot, generation, &session, lease_id, &my_key, why).await,
    };
    if lease.retired.load(Ordering::Acquire) {
        let why = "the session's lease was given up while the lock was being taken";
        return give_up(
            c,
            slot,
            generation,
            &session,
            lease_id,
            &my_key,
            Some((AcquireFailure::Lease, why.to_string())),
        )
        .await;
    }
    slot.set_key(&key);
    slot.token.store(token, Ordering::Relaxed);
    if let Ok(mut o) = owners.lock() {
        o.insert(index, c.clone());
    }
    if !slot.transition(S::Acquiring, S::Held) {
        // Cancelled meanwhile: undo.
        if let Ok(mut o) = owners.lock() {
            o.remove(&index);
        }
        give_up(c, slot, generation, &session, lease_id, &my_key, None).await;
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
    // Should the watch not start or end early, the keepalive rounds still find a deleted key
    // (`keep_session_alive`), within TTL/3.
    if let Ok(Ok(stream)) = watch {
        watch_key(stream, slot, generation).await;
    }
}
/// The lock for our key, once `enqueue` answered (`first`, with `floor` the highest revision
/// known when it was sent): the token and the key that holds the lock, or why to give up. Ours
/// at once if our key is the oldest (the token is the transaction's revision); else queued
/// behind the holders with etcd's Lock service, and after that wait our key read back.
/// `request` is the lock's name, the lease our key is under and that lease's `retired` flag
/// (set when the keepalive finds the lease gone, or the session gives it up).
async fn grant(
    c: &mut Client,
    sh: &'static Shared,
    slot: &Slot,
    generation: u64,
    request: (&str, i64, &std::sync::atomic::AtomicBool),
    first: &TxnResponse,
    floor: i64,
) -> Result<(i64, Vec<u8>), Failure> {
    let (name, lease_id, retired) = request;
    observe(sh, first.header(), floor).map_err(|why| Some((AcquireFailure::Other, why)))?;
    // When our key was created: by this transaction, or before (it found the key in place).
    let created = key_created(first);
    if let Some(token) = owned_at_once(first) {
        // Our key was created at the token's revision under the lease (etcd refuses a put under
        // a lease it no longer has); a deletion after that revision is seen by the watch
        // (mark_lost) and by the keepalive rounds.
        return Ok((token, format!("{name}/{lease_id:x}").into_bytes()));
    }
    // Somebody holds the lock: queue behind them with etcd's Lock service, which finds our key
    // (the same name) and waits for every key of the lock created before it.
    let floor = sh.etcd_highest_revision.load(Ordering::Acquire);
    let lock = c.lock(
        name.as_bytes(),
        Some(LockOptions::new().with_lease(lease_id)),
    );
    // etcd 3.4's Lock service waits for the keys before ours even when ours is deleted meanwhile
    // (its lease revoked or expired: `concurrency.Mutex.Lock` waits only for older keys), so a
    // request whose lease is gone would wait for the holder to let go. Stop waiting as soon as
    // the keepalive finds the lease gone (within TTL/3): such a request can never be granted.
    let lease_gone = async {
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if retired.load(Ordering::Acquire) {
                return;
            }
        }
    };
    let resp = tokio::select! {
        r = step(lock, slot, generation) => r?,
        _ = lease_gone => {
            let why = "the request's lease expired or was revoked while it waited in etcd's queue";
            return Err(Some((AcquireFailure::Lease, why.to_string())));
        }
    };
    observe(sh, resp.header(), floor).map_err(|why| Some((AcquireFailure::Other, why)))?;
    let (token, key) = match resp.header().map(|h| h.revision()) {
        Some(rev) if rev > 0 => (rev, resp.key().to_vec()),
        _ => {
            let why = "etcd granted the lock without a revision in its response header";
            return Err(Some((AcquireFailure::Other, why.to_string())));
        }
    };
    // etcd 3.4 can grant the lock to a waiter whose key was deleted while it waited (its lease
    // expired or was revoked, or the key deleted), before the revision it gets as token, so the
    // watch cannot see it: after a wait, read our key. If it is still the key created at
    // `created` under our lease, it has existed all along (a key deleted and made again has a
    // newer creation), so it was the oldest at the token's revision and still holds the lock.
    let read = tokio::time::timeout(Duration::from_secs(2), c.get(key.clone(), None)).await;
    let still = match &read {
        Ok(Ok(r)) => r.kvs().first().is_some_and(|kv| {
            created.is_some_and(|cr| kv.create_revision() == cr) && kv.lease() == lease_id
        }),
        _ => false,
    };
    if still {
        return Ok((token, key));
    }
    Err(Some(match read {
        Ok(Ok(_)) => (AcquireFailure::Lease, "etcd granted the lock after the request's key was deleted (its lease expired or was revoked, or the key deleted)".to_string()),
        Ok(Err(e)) => (AcquireFailure::Other, format!("the lock's key could not be read after the wait: {}", describe(&e))),
        Err(_) => (AcquireFailure::Other, "the lock's key could not be read after the wait: no answer within 2 s".to_string()),
    }))
}

async fn watch_key(mut stream: etcd_client::WatchStream, slot: &'static Slot, generation: u64) {
    loop {
        if !current(slot, generation) || !matches!(slot.state(), S::Held) {
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
                        "its etcd key was deleted (lease revoked or expired, or the key deleted)",
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

/// Delete our key `my_key` (a cancelled or failed acquisition may have created it; etcd's Lock
/// service deletes it too when its request is cancelled) and free a cancelled slot. If the key
/// cannot be deleted, the session's lease is given up, so that the key goes with it.
async fn give_up(
    mut c: Client,
    slot: &Slot,
    generation: u64,
    session: &Arc<Session>,
    lease: i64,
    my_key: &str,
    failure: Failure,
) {
    let deleted = matches!(
        tokio::time::timeout(Duration::from_secs(2), c.delete(my_key.as_bytes(), None)).await,
        Ok(Ok(_))
    );
    if !deleted {
        retire_lease(
            session,
            lease,
            &format!("the key {my_key} of a failed acquisition could not be deleted"),
        )
        .await;
    }
    // Only now may the backend see the failure (and ask again for the same lock).
    if let Some((code, why)) = failure {
        slot.fail(code, &why);
    }
    if current(slot, generation) {
        let _ = slot.transition(S::Cancelled, S::Free);
    }
}

async fn release(
    mut c: Client,
    sh: &'static Shared,
    index: usize,
    generation: u64,
    sessions: Sessions,
) {
    let slot = &sh.slots()[index];
    let key = slot.key();
    let lease = slot.lease.load(Ordering::Relaxed);
    let pid = slot.owner_pid.load(Ordering::Relaxed);
    // Delete our key (the session's lease stays for its other locks). Our key carries our
    // lease id, so this never deletes another holder's key.
    let deleted = matches!(
        tokio::time::timeout(Duration::from_secs(2), c.delete(key.as_bytes(), None)).await,
        Ok(Ok(_))
    );
    if let Some(s) = sessions.lock().ok().and_then(|m| m.get(&pid).cloned()) {
        s.last_used.store(now_ms(), Ordering::Release);
    }
    if !deleted {
        // The key would hold the lock as long as the session's lease lives: give the lease up.
        let session = sessions.lock().ok().and_then(|m| m.get(&pid).cloned());
        match session {
            Some(s) => {
                retire_lease(
                    &s,
                    lease,
                    &format!("the key {key} of a released lock could not be deleted"),
                )
                .await
            }
            None => {
                let _ = tokio::time::timeout(Duration::from_secs(2), c.lease_revoke(lease)).await;
            }
        }
    }
    if current(slot, generation) {
        slot.token.store(0, Ordering::Relaxed);
        let _ = slot.transition(S::Releasing, S::Free);
    }
}

fn mark_lost(slot: &Slot, generation: u64, why: &str) {
    if current(slot, generation) {
        let _ = slot.transition_saying(S::Held, S::Lost, why);
    }
}
