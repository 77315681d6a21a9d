//! The etcd thread's lock tasks (see `lock_service/etcd_locks.rs` for the slots they serve and the
//! lock protocol): the loop that takes the worker's commands, and per lock the acquisition, the
//! lease keepalive, the watch on the holder's key and the release. Runs on tokio, never calls
//! PostgreSQL, and only reads and writes the slots' atomics.
#![forbid(unsafe_code)]

use super::client::{connect, describe, Config};
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
    Client, Compare, CompareOp, EventType, GetOptions, LeaseTimeToLiveOptions, LockOptions,
    PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse, WatchOptions,
};
use tokio::sync::mpsc::UnboundedReceiver;

/// The lease a session's locks share (like Go's `concurrency.Session`): granted by the
/// session's first `fencing_acquire`, kept alive by one task (`keep_session_alive`), revoked
/// when the session has held no lock for one TTL (or at shutdown). Keyed by the backend's pid.
type Sessions = std::sync::Arc<std::sync::Mutex<std::collections::HashMap<i32, Arc<Session>>>>;

struct Session {
    pid: i32,
    /// The current lease (`None`: none yet, or given up); held while a slot is attached to it,
    /// so that the keepalive task never revokes a lease a new lock is being put under.
    lease: tokio::sync::Mutex<Option<Lease>>,
    /// Removed from `Sessions`: a new acquisition takes the map's entry instead.
    retired: std::sync::atomic::AtomicBool,
    /// When a lock of the session was last acquired or released (CLOCK_MONOTONIC ms): the lease
    /// goes once the session has held no lock for one TTL since.
    last_used: AtomicI64,
}

#[derive(Clone)]
struct Lease {
    id: i64,
    ttl: i64,
    client: Client,
    /// CLOCK_MONOTONIC ms before which etcd cannot have expired the lease (last confirmation's
    /// send time plus the remaining TTL etcd reported then).
    valid_until: Arc<AtomicI64>,
    /// Given up (`retire_lease`): no lock may become held under it, and no confirmation may
    /// raise its locks' validity again.
    retired: Arc<std::sync::atomic::AtomicBool>,
}

use std::sync::atomic::AtomicI64;
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
                        fail_or_free(slot, ERR_UNREACHABLE, &last_failure);
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
                            fail_or_free(slot, ERR_UNREACHABLE, &why);
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
                    let _ = sh.slots()[i].transition(RELEASING, FREE);
                }
            }
            Cmd::Cancel(i, generation) => {
                // The acquire task sees CANCELLED and cleans up; if none serves the request
                // (it ended without freeing the slot), free the slot here.
                let slot = &sh.slots()[i];
                let served = in_flight
                    .lock()
                    .map(|f| f.contains(&(i, generation)))
                    .unwrap_or(true);
                if !served && current(slot, generation) {
                    let _ = slot.transition(CANCELLED, FREE);
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
type Failure = Option<(u32, String)>;

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
            ERR_OTHER,
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
            if !current(slot, generation) || slot.state.load(Ordering::Acquire) == CANCELLED {
                return;
            }
        }
    };
    tokio::select! {
        r = tokio::time::timeout(remaining, request) => match r {
            Ok(answer) => Ok(answer),
            Err(_) => Err(Some((ERR_TIMEOUT, "timed out".to_string()))),
        },
        _ = cancelled => Err(None),
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

/// The session's lease for a new lock in `slot` (granted if the session has none that is
/// confirmed alive), attached to the slot (`lease`, `ttl`, `valid_until_ms`) before the session's
/// lease lock is let go, so that the keepalive task counts the slot as a user. `None`: the slot
/// failed (or was freed) with the reason.
async fn session_lease(
    c: &mut Client,
    sh: &'static Shared,
    slot: &'static Slot,
    ttl: i64,
    sessions: &Sessions,
) -> Option<(Arc<Session>, Lease)> {
    let pid = slot.owner_pid.load(Ordering::Relaxed);
    loop {
        let entry = sessions.lock().ok().map(|mut map| {
            map.entry(pid)
                .or_insert_with(|| {
                    Arc::new(Session {
                        pid,
                        lease: tokio::sync::Mutex::new(None),
                        retired: std::sync::atomic::AtomicBool::new(false),
                        last_used: AtomicI64::new(now_ms()),
                    })
                })
                .clone()
        });
        let Some(session) = entry else {
            fail_or_free(slot, ERR_OTHER, "the worker's session table is unusable");
            return None;
        };
        let mut current = session.lease.lock().await;
        if session.retired.load(Ordering::Acquire) {
            continue; // removed from the map meanwhile: take the entry that replaced it
        }
        let usable = current
            .as_ref()
            .filter(|l| now_ms() < l.valid_until.load(Ordering::Acquire))
            .cloned();
        let lease = match usable {
            Some(l) => l,
            None => {
                let sent = now_ms();
                let floor = sh.etcd_highest_revision.load(Ordering::Acquire);
                let granted =
                    match tokio::time::timeout(Duration::from_secs(3), c.lease_grant(ttl, None))
                        .await
                    {
                        Ok(Ok(r)) => r,
                        Ok(Err(e)) => {
                            fail_or_free(
                                slot,
                                ERR_UNREACHABLE,
                                &format!("lease grant failed: {}", describe(&e)),
                            );
                            return None;
                        }
                        Err(_) => {
                            fail_or_free(slot, ERR_UNREACHABLE, "lease grant timed out");
                            return None;
                        }
                    };
                if let Err(why) = observe(sh, granted.header(), floor) {
                    fail_or_free(slot, ERR_OTHER, &why);
                    let _ =
                        tokio::time::timeout(Duration::from_secs(2), c.lease_revoke(granted.id()))
                            .await;
                    return None;
                }
                let l = Lease {
                    id: granted.id(),
                    ttl: granted.ttl(),
                    client: c.clone(),
                    valid_until: Arc::new(AtomicI64::new(
                        sent + granted.ttl() * 1000 - clock_margin(granted.ttl(), granted.ttl()),
                    )),
                    retired: Arc::new(std::sync::atomic::AtomicBool::new(false)),
                };
                if let Some(old) = current.replace(l.clone()) {
                    old.retired.store(true, Ordering::Release);
                    // Not confirmed within its TTL: its locks are lost (their tokens are refused
                    // already), and it goes.
                    lose_all(
                        sh,
                        pid,
                        old.id,
                        "the session's lease was not confirmed by etcd within its TTL",
                    );
                    let mut oc = old.client.clone();
                    tokio::spawn(async move {
                        let _ =
                            tokio::time::timeout(Duration::from_secs(2), oc.lease_revoke(old.id))
                                .await;
                    });
                }
                tokio::spawn(keep_session_alive(
                    sh,
                    session.clone(),
                    l.clone(),
                    sessions.clone(),
                ));
                l
            }
        };
        session.last_used.store(now_ms(), Ordering::Release);
        slot.lease.store(lease.id, Ordering::Relaxed);
        slot.ttl.store(lease.ttl, Ordering::Relaxed);
        slot.valid_until_ms
            .store(lease.valid_until.load(Ordering::Acquire), Ordering::Relaxed);
        drop(current);
        return Some((session, lease));
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
            Ok(Err(e)) if attempts == 0 && describe(&e).contains("requested lease not found") => {
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
                    Some((ERR_OTHER, why)),
                )
                .await;
            }
        }
    };
    let lease_id = lease.id;
    if let Err(why) = observe(sh, first.header(), floor) {
        return give_up(
            c,
            slot,
            generation,
            &session,
            lease_id,
            &my_key,
            Some((ERR_OTHER, why)),
        )
        .await;
    }
    // When our key was created: by this transaction, or before (it found the key in place).
    let created = key_created(&first);
    let (token, key, waited) = if let Some(token) = owned_at_once(&first) {
        (token, my_key.clone().into_bytes(), false)
    } else {
        // Somebody holds the lock: queue behind them with etcd's Lock service, which finds our
        // key (the same name) and waits for every key of the lock created before it.
        let floor = sh.etcd_highest_revision.load(Ordering::Acquire);
        let lock = c.lock(
            name.as_bytes(),
            Some(LockOptions::new().with_lease(lease_id)),
        );
        let resp = match step(lock, slot, generation).await {
            Ok(resp) => resp,
            Err(why) => {
                return give_up(c, slot, generation, &session, lease_id, &my_key, why).await
            }
        };
        if let Err(why) = observe(sh, resp.header(), floor) {
            return give_up(
                c,
                slot,
                generation,
                &session,
                lease_id,
                &my_key,
                Some((ERR_OTHER, why)),
            )
            .await;
        }
        match resp.header().map(|h| h.revision()) {
            Some(rev) if rev > 0 => (rev, resp.key().to_vec(), true),
            _ => {
                let why = "etcd granted the lock without a revision in its response header";
                return give_up(
                    c,
                    slot,
                    generation,
                    &session,
                    lease_id,
                    &my_key,
                    Some((ERR_OTHER, why.to_string())),
                )
                .await;
            }
        }
    };
    // etcd 3.4 can grant the lock to a waiter whose key was deleted while it waited (its lease
    // expired or was revoked, or the key deleted), before the revision it gets as token, so the
    // watch below cannot see it: after a wait, read our key. If it is still the key created at
    // `created` under our lease, it has existed all along (a key deleted and made again has a
    // newer creation), so it was the oldest at the token's revision and still holds the lock.
    // Without a wait there is nothing to check: our key was created at the token's revision
    // under the lease (etcd refuses a put under a lease it no longer has); a deletion after that
    // revision is seen by the watch (mark_lost) and by the keepalive rounds.
    if waited {
        let read = tokio::time::timeout(Duration::from_secs(2), c.get(key.clone(), None)).await;
        let still = match &read {
            Ok(Ok(r)) => r.kvs().first().is_some_and(|kv| {
                created.is_some_and(|cr| kv.create_revision() == cr) && kv.lease() == lease_id
            }),
            _ => false,
        };
        if !still {
            let code = if matches!(read, Ok(Ok(_))) {
                ERR_LEASE
            } else {
                ERR_OTHER
            };
            let why = match read {
                Ok(Ok(_)) => "etcd granted the lock after the request's key was deleted (its lease expired or was revoked, or the key deleted)".to_string(),
                Ok(Err(e)) => format!("the lock's key could not be read after the wait: {}", describe(&e)),
                Err(_) => "the lock's key could not be read after the wait: no answer within 2 s".to_string(),
            };
            return give_up(
                c,
                slot,
                generation,
                &session,
                lease_id,
                &my_key,
                Some((code, why)),
            )
            .await;
        }
    }
    if lease.retired.load(Ordering::Acquire) {
        let why = "the session's lease was given up while the lock was being taken";
        return give_up(
            c,
            slot,
            generation,
            &session,
            lease_id,
            &my_key,
            Some((ERR_LEASE, why.to_string())),
        )
        .await;
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

fn fail_or_free(slot: &Slot, code: u32, msg: &str) {
    slot.fail(code, msg);
    let _ = slot.transition(CANCELLED, FREE);
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
        let _ = slot.transition(CANCELLED, FREE);
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
        let _ = slot.transition(RELEASING, FREE);
    }
}

fn mark_lost(slot: &Slot, generation: u64, why: &str) {
    if current(slot, generation) {
        let _ = slot.transition_saying(HELD, LOST, why);
    }
}

/// The slots whose lock is under `lease` of the session `pid`: being acquired, held, being
/// released or cleaned up. Not a lost one: its key has no use any more (the keepalive round
/// deletes it) and it keeps no lease alive.
fn users(sh: &'static Shared, pid: i32, lease: i64) -> impl Iterator<Item = &'static Slot> {
    sh.slots().iter().filter(move |s| {
        s.lease.load(Ordering::Relaxed) == lease
            && s.owner_pid.load(Ordering::Relaxed) == pid
            && !matches!(
                s.state.load(Ordering::Acquire),
                FREE | RESERVED | REQUESTED | LOST
            )
    })
}

/// The lease is gone or given up: every lock under it is lost (a held one LOST with `why`, one
/// being acquired no longer counts as confirmed, so its acquisition reads the lease).
fn lose_all(sh: &'static Shared, pid: i32, lease: i64, why: &str) {
    for s in users(sh, pid, lease) {
        s.valid_until_ms.store(0, Ordering::Relaxed);
        let _ = s.transition_saying(HELD, LOST, why);
    }
}

/// Stop using `lease` for the session: no new lock is put under it, its keepalive stops (it
/// expires within its TTL unless the revoke gets through first), and its locks are lost.
async fn retire_lease(session: &Arc<Session>, lease: i64, why: &str) {
    let client = {
        let mut current = session.lease.lock().await;
        match current.as_ref() {
            Some(l) if l.id == lease => current.take().map(|l| {
                l.retired.store(true, Ordering::Release);
                l.client
            }),
            _ => None,
        }
    };
    if let Some(sh) = shared_if_enabled() {
        lose_all(
            sh,
            session.pid,
            lease,
            &format!("the session's lease was given up: {why}"),
        );
    }
    if let Some(mut c) = client {
        let _ = tokio::time::timeout(Duration::from_secs(2), c.lease_revoke(lease)).await;
    }
}

fn shared_if_enabled() -> Option<&'static Shared> {
    shared().ok()
}

/// Keep a session's lease alive every TTL/3; revoke it once no lock of the session has used it
/// for one TTL, or once the session has ended and none uses it. Each round sends a keepalive on the lease's stream and then reads
/// the lease's remaining TTL: its send time plus that TTL is when etcd can expire the lease at
/// the earliest (`valid_until` of the lease and of its locks). The read, not the keepalive's
/// answer, confirms the lease: through etcd's gRPC proxy a keepalive is answered by the
/// proxy's own renewals, at its own pace, so an answer cannot be matched with a request. The
/// locks are lost when etcd says the lease is gone, or when it could not be confirmed in time.
async fn keep_session_alive(
    sh: &'static Shared,
    session: Arc<Session>,
    lease: Lease,
    sessions: Sessions,
) {
    let pid = session.pid;
    let id = lease.id;
    let mut c = lease.client.clone();
    let period = Duration::from_millis((lease.ttl.max(1) * 1000 / 3) as u64);
    let source = format!("lease {id:x}");
    let mut stream = None;
    let stop = |why: Option<&str>| {
        report_problem(&source, None);
        if let Some(why) = why {
            lose_all(sh, pid, id, why);
        }
    };
    loop {
        // Every TTL/3, and sooner while the lease is confirmed for less than two of those: the
        // remaining TTL etcd reports is in whole seconds, and through a proxy the lease is
        // renewed at the proxy's pace, so a confirmation may reach only a second ahead.
        let ahead = lease.valid_until.load(Ordering::Acquire) - now_ms();
        let pause = period.min(Duration::from_millis((ahead / 2).max(50) as u64));
        tokio::time::sleep(pause).await;
        // Still the session's lease?
        let mine = session
            .lease
            .lock()
            .await
            .as_ref()
            .is_some_and(|l| l.id == id);
        if !mine {
            return stop(None);
        }
        if users(sh, pid, id).next().is_none() {
            // Unused for one TTL, or its session has ended (the backend's process is gone; its
            // locks were released when it exited).
            let since = session.last_used.load(Ordering::Acquire);
            let ended = !std::path::Path::new(&format!("/proc/{pid}")).exists();
            if ended || now_ms() - since >= lease.ttl * 1000 {
                let mut current = session.lease.lock().await;
                if users(sh, pid, id).next().is_none() {
                    if current.as_ref().is_some_and(|l| l.id == id) {
                        *current = None;
                    }
                    session.retired.store(true, Ordering::Release);
                    if let Ok(mut m) = sessions.lock() {
                        if m.get(&pid).is_some_and(|s| Arc::ptr_eq(s, &session)) {
                            m.remove(&pid);
                        }
                    }
                    drop(current);
                    let _ = tokio::time::timeout(Duration::from_secs(2), c.lease_revoke(id)).await;
                    return stop(None);
                }
            }
            // Unused for less than a TTL: kept alive all the same, so that the session's next
            // acquisition finds it confirmed.
        }
        if stream.is_none() {
            stream =
                match tokio::time::timeout(Duration::from_secs(2), c.lease_keep_alive(id)).await {
                    Ok(Ok(s)) => Some(s),
                    _ => None,
                };
        }
        // The keepalive; its answer is awaited briefly (etcd answers at once, a proxy maybe not).
        let mut gone = false;
        if let Some((keeper, responses)) = stream.as_mut() {
            let answer = tokio::time::timeout(Duration::from_millis(100), async {
                keeper.keep_alive().await.map_err(|e| describe(&e))?;
                responses.message().await.map_err(|e| describe(&e))
            })
            .await;
            match answer {
                Ok(Ok(Some(r))) => gone = r.ttl() <= 0,
                Ok(Err(_)) | Ok(Ok(None)) => stream = None, // reopened next round
                Err(_) => {}                                // no answer yet: see the read
            }
        }
        // The locks held before the read is sent: only their keys must be in its answer (etcd
        // may list a lease's keys before it stamps the answer's revision).
        let held_before: std::collections::HashSet<(usize, u64)> = users(sh, pid, id)
            .filter(|s| s.state.load(Ordering::Acquire) == HELD)
            .map(|s| {
                (
                    s as *const Slot as usize,
                    s.generation.load(Ordering::Acquire),
                )
            })
            .collect();
        let sent = now_ms();
        let read = if gone {
            None
        } else {
            let opts = LeaseTimeToLiveOptions::new().with_keys();
            Some(
                tokio::time::timeout(Duration::from_secs(2), c.lease_time_to_live(id, Some(opts)))
                    .await,
            )
        };
        match read {
            // etcd says the lease is gone (-1), or the keepalive's answer did.
            None => {
                retire(&session, id).await;
                return stop(Some(
                    "etcd reports the session's lease expired or was revoked",
                ));
            }
            Some(Ok(Ok(r))) if r.ttl() < 0 => {
                retire(&session, id).await;
                return stop(Some(
                    "etcd reports the session's lease expired or was revoked",
                ));
            }
            Some(Ok(Ok(r)))
                if r.ttl() > 0 && now_ms() >= lease.valid_until.load(Ordering::Acquire) =>
            {
                // Alive after all, but its validity lapsed before the answer came, so writes
                // with its locks' tokens may have been refused (FT003): a lost lock stays lost,
                // and the lease is given up.
                retire(&session, id).await;
                let _ = tokio::time::timeout(Duration::from_secs(1), c.lease_revoke(id)).await;
                return stop(Some(
                    "the session's lease was not confirmed by etcd within its TTL",
                ));
            }
            Some(Ok(Ok(r))) if r.ttl() > 0 => {
                // Never beyond the TTL the lease was granted with: an etcd leader that has just
                // taken over may report a remaining TTL of "forever" for a while.
                let remaining = r.ttl().min(r.granted_ttl()).min(lease.ttl);
                let until = sent + remaining * 1000 - clock_margin(lease.ttl, remaining);
                lease.valid_until.store(until, Ordering::Release);
                let read_revision = r.header().map(|h| h.revision()).unwrap_or(0);
                let attached: std::collections::HashSet<&[u8]> =
                    r.keys().iter().map(|k| k.as_slice()).collect();
                let mut expected = std::collections::HashSet::new();
                for s in users(sh, pid, id) {
                    s.valid_until_ms.store(until, Ordering::Relaxed);
                    let key = s.key();
                    // A held lock whose key is gone (deleted from outside while the watch on it
                    // was not running): lost. Only for a key etcd had created by the read.
                    let token = s.token.load(Ordering::Relaxed);
                    let was_held = held_before.contains(&(
                        s as *const Slot as usize,
                        s.generation.load(Ordering::Acquire),
                    ));
                    if was_held
                        && s.state.load(Ordering::Acquire) == HELD
                        && token > 0
                        && token <= read_revision
                        && !attached.contains(key.as_bytes())
                    {
                        let _ = s.transition_saying(
                            HELD,
                            LOST,
                            "its etcd key is gone (deleted, or never kept by etcd)",
                        );
                        continue;
                    }
                    // Held or being released: the full key; being acquired or cleaned up: the key
                    // it has or may have made (a cancelled one may have the full key already).
                    expected.insert(format!("{key}/{id:x}"));
                    expected.insert(key);
                }
                // A retirement meanwhile (`retire_lease`) must not see its zero overwritten.
                if lease.retired.load(Ordering::Acquire) {
                    lose_all(sh, pid, id, "the session's lease was given up");
                }
                // Keys under the lease that no lock of the session uses (a transaction answered
                // after its acquisition gave up, a lost lock's key): deleted, unless created
                // after the read (a new acquisition's).
                for orphan in attached
                    .iter()
                    .filter(|k| !expected.contains(&*String::from_utf8_lossy(k)))
                {
                    let delete = Txn::new()
                        .when([Compare::create_revision(
                            orphan.to_vec(),
                            CompareOp::Less,
                            read_revision + 1,
                        )])
                        .and_then([TxnOp::delete(orphan.to_vec(), None)]);
                    let _ = tokio::time::timeout(Duration::from_secs(2), c.txn(delete)).await;
                }
                report_problem(&source, None);
            }
            Some(failed) => {
                let why = match failed {
                    Ok(Err(e)) => describe(&e),
                    Ok(Ok(_)) => "etcd reported less than a second left".to_string(),
                    Err(_) => "no answer within 2 s".to_string(),
                };
                if matches!(failed_kind(&why), RoundFailure::Connection) {
                    RECONNECT.store(true, Ordering::Release);
                }
                report_problem(
                    &source,
                    Some(format!("lease keepalives are not confirmed by etcd: {why}")),
                );
                if now_ms() >= lease.valid_until.load(Ordering::Acquire) {
                    retire(&session, id).await;
                    let _ = tokio::time::timeout(Duration::from_secs(1), c.lease_revoke(id)).await;
                    return stop(Some(
                        "the session's lease could not be kept alive within its TTL",
                    ));
                }
            }
        }
    }
}

/// What is taken off a lease's validity (ms): 1 % of its TTL, as etcd's leader times the lease
/// with its own clock, whose rate may differ a little from this machine's; never more than half
/// of what is left (`remaining`, seconds).
fn clock_margin(ttl: i64, remaining: i64) -> i64 {
    (ttl * 10).min(remaining * 500)
}

/// Set when etcd did not answer a lease's keepalive round in time: the lock loop makes a new
/// connection for the next acquisition (the old one may be half-open: HTTP/2 pings are rare).
static RECONNECT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

enum RoundFailure {
    Connection,
    Answer,
}

fn failed_kind(why: &str) -> RoundFailure {
    if why.starts_with("no answer") || why.contains("transport") || why.contains("connection") {
        RoundFailure::Connection
    } else {
        RoundFailure::Answer
    }
}

/// Forget `id` as the session's lease (a new acquisition grants another).
async fn retire(session: &Arc<Session>, id: i64) {
    let mut current = session.lease.lock().await;
    if let Some(l) = current.as_ref().filter(|l| l.id == id) {
        l.retired.store(true, Ordering::Release);
        *current = None;
    }
}
