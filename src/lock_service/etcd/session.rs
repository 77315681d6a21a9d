//! The etcd thread's sessions (like Go's `concurrency.Session`): the one lease the locks of a
//! backend share, granted by its first `fencing_acquire` (`session_lease`), kept alive and
//! confirmed every TTL/3 by one task (`keep_session_alive`), given up when etcd no longer has it
//! or no lock has used it for one TTL (`retire_lease`), and the loss of every lock under a lease
//! that is gone (`lose_all`). The acquisition and release of the locks themselves are in
//! `mutex.rs`. Runs on tokio, never calls PostgreSQL, and only reads and writes the slots' atomics.
#![forbid(unsafe_code)]

use super::client::{classify, describe, EtcdFailure};
use crate::lock_service::etcd_locks::*;
use etcd_client::{Client, Compare, CompareOp, LeaseTimeToLiveOptions, Txn, TxnOp};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The lease a session's locks share (like Go's `concurrency.Session`): granted by the
/// session's first `fencing_acquire`, kept alive by one task (`keep_session_alive`), revoked
/// when the session has held no lock for one TTL (or at shutdown). Keyed by the backend's pid.
pub(super) type Sessions =
    std::sync::Arc<std::sync::Mutex<std::collections::HashMap<i32, Arc<Session>>>>;

pub(super) struct Session {
    pub(super) pid: i32,
    /// The current lease (`None`: none yet, or given up); held while a slot is attached to it,
    /// so that the keepalive task never revokes a lease a new lock is being put under.
    pub(super) lease: tokio::sync::Mutex<Option<Lease>>,
    /// Removed from `Sessions`: a new acquisition takes the map's entry instead.
    pub(super) retired: std::sync::atomic::AtomicBool,
    /// When a lock of the session was last acquired or released (CLOCK_MONOTONIC ms): the lease
    /// goes once the session has held no lock for one TTL since.
    pub(super) last_used: AtomicI64,
}

#[derive(Clone)]
pub(super) struct Lease {
    pub(super) id: i64,
    pub(super) ttl: i64,
    pub(super) client: Client,
    /// CLOCK_MONOTONIC ms before which etcd cannot have expired the lease (last confirmation's
    /// send time plus the remaining TTL etcd reported then).
    pub(super) valid_until: Arc<AtomicI64>,
    /// Given up (`retire_lease`): no lock may become held under it, and no confirmation may
    /// raise its locks' validity again.
    pub(super) retired: Arc<std::sync::atomic::AtomicBool>,
}

/// The session's lease for a new lock in `slot` (granted if the session has none that is
/// confirmed alive), attached to the slot (`lease`, `ttl`, `valid_until_ms`) before the session's
/// lease lock is let go, so that the keepalive task counts the slot as a user. `None`: the slot
/// failed (or was freed) with the reason.
pub(super) async fn session_lease(
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
            fail_or_free(
                slot,
                AcquireFailure::Other,
                "the worker's session table is unusable",
            );
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
                                AcquireFailure::Unreachable,
                                &format!("lease grant failed: {}", describe(&e)),
                            );
                            return None;
                        }
                        Err(_) => {
                            fail_or_free(
                                slot,
                                AcquireFailure::Unreachable,
                                "lease grant timed out",
                            );
                            return None;
                        }
                    };
                if let Err(why) = observe(sh, granted.header(), floor) {
                    fail_or_free(slot, AcquireFailure::Other, &why);
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

/// The slots whose lock is under `lease` of the session `pid`: being acquired, held, being
/// released or cleaned up. Not a lost one: its key has no use any more (the keepalive round
/// deletes it) and it keeps no lease alive.
fn users(sh: &'static Shared, pid: i32, lease: i64) -> impl Iterator<Item = &'static Slot> {
    sh.slots().iter().filter(move |s| {
        s.lease.load(Ordering::Relaxed) == lease
            && s.owner_pid.load(Ordering::Relaxed) == pid
            && !matches!(s.state(), S::Free | S::Reserved | S::Requested | S::Lost)
    })
}

/// The lease is gone or given up: every lock under it is lost (a held one Lost with `why`, one
/// being acquired no longer counts as confirmed, so its acquisition reads the lease).
pub(super) fn lose_all(sh: &'static Shared, pid: i32, lease: i64, why: &str) {
    for s in users(sh, pid, lease) {
        s.valid_until_ms.store(0, Ordering::Relaxed);
        let _ = s.transition_saying(S::Held, S::Lost, why);
    }
}

/// Stop using `lease` for the session: no new lock is put under it, its keepalive stops (it
/// expires within its TTL unless the revoke gets through first), and its locks are lost.
pub(super) async fn retire_lease(session: &Arc<Session>, lease: i64, why: &str) {
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
pub(super) async fn keep_session_alive(
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
        if users(sh, pid, id).next().is_none()
            && revoke_if_unused(sh, &session, &sessions, &lease).await
        {
            return stop(None);
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
            .filter(|s| s.state() == S::Held)
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
                confirmed(sh, pid, &lease, &r, sent, &held_before, &mut c).await;
                report_problem(&source, None);
            }
            Some(failed) => {
                let (why, connection) = match failed {
                    Ok(Err(e)) => (describe(&e), classify(&e) == EtcdFailure::Connection),
                    Ok(Ok(_)) => ("etcd reported less than a second left".to_string(), false),
                    Err(_) => ("no answer within 2 s".to_string(), true),
                };
                if connection {
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

/// A lease no lock of the session uses: revoked (true) once it has been unused for one TTL or
/// the session has ended (the backend's process is gone; its locks were released when it
/// exited); until then kept alive all the same, so that the session's next acquisition finds it
/// confirmed (false).
async fn revoke_if_unused(
    sh: &'static Shared,
    session: &Arc<Session>,
    sessions: &Sessions,
    lease: &Lease,
) -> bool {
    let (pid, id) = (session.pid, lease.id);
    let since = session.last_used.load(Ordering::Acquire);
    let ended = !std::path::Path::new(&format!("/proc/{pid}")).exists();
    if !ended && now_ms() - since < lease.ttl * 1000 {
        return false;
    }
    let mut current = session.lease.lock().await;
    if users(sh, pid, id).next().is_some() {
        return false;
    }
    if current.as_ref().is_some_and(|l| l.id == id) {
        *current = None;
    }
    session.retired.store(true, Ordering::Release);
    if let Ok(mut m) = sessions.lock() {
        if m.get(&pid).is_some_and(|s| Arc::ptr_eq(s, session)) {
            m.remove(&pid);
        }
    }
    drop(current);
    let mut c = lease.client.clone();
    let _ = tokio::time::timeout(Duration::from_secs(2), c.lease_revoke(id)).await;
    true
}

/// A round's read confirmed the lease (`r`, sent at `sent`): its validity and its locks' move
/// on; a lock that was held before the read and whose key etcd no longer lists is lost; keys
/// under the lease that no lock of the session uses are deleted.
async fn confirmed(
    sh: &'static Shared,
    pid: i32,
    lease: &Lease,
    r: &etcd_client::LeaseTimeToLiveResponse,
    sent: i64,
    held_before: &std::collections::HashSet<(usize, u64)>,
    c: &mut Client,
) {
    let id = lease.id;
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
            && s.state() == S::Held
            && token > 0
            && token <= read_revision
            && !attached.contains(key.as_bytes())
        {
            let _ = s.transition_saying(
                S::Held,
                S::Lost,
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
}

/// What is taken off a lease's validity (ms): 1 % of its TTL, as etcd's leader times the lease
/// with its own clock, whose rate may differ a little from this machine's; never more than half
/// of what is left (`remaining`, seconds).
fn clock_margin(ttl: i64, remaining: i64) -> i64 {
    (ttl * 10).min(remaining * 500)
}

/// Set when etcd did not answer a lease's keepalive round in time: the lock loop makes a new
/// connection for the next acquisition (the old one may be half-open: HTTP/2 pings are rare).
pub(super) static RECONNECT: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Forget `id` as the session's lease (a new acquisition grants another).
pub(super) async fn retire(session: &Arc<Session>, id: i64) {
    let mut current = session.lease.lock().await;
    if let Some(l) = current.as_ref().filter(|l| l.id == id) {
        l.retired.store(true, Ordering::Release);
        *current = None;
    }
}

/// Check a write's response header against what we know of etcd (see "Revision
/// regression"); what changed is saved by `save_state_periodically`.
pub(super) fn observe(
    sh: &'static Shared,
    header: Option<&etcd_client::ResponseHeader>,
    floor: i64,
) -> Result<(), String> {
    match header {
        Some(h) => sh.observe_etcd(h.cluster_id(), h.revision(), floor),
        None => Ok(()),
    }
}

pub(super) fn fail_or_free(slot: &Slot, code: AcquireFailure, msg: &str) {
    slot.fail(code, msg);
    let _ = slot.transition(S::Cancelled, S::Free);
}
