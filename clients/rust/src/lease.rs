//! PostgreSQL leases (`fencing_lease_acquire` / `_renew` / `_release`, the extension's
//! docs/leases.md) renewed by a tokio task on a connection of their own.
//!
//! States: **held** → **lost** (a renewal failed, or the TTL passed since the last confirmed
//! grant or renewal was *sent*: a renewal stuck on a stalled connection cannot keep it alive, and
//! the server's own expiry is never earlier) or → **released** ([`Lease::release`]). Lost is
//! final: [`Lease::lost`] resolves and [`Lease::check`] returns `FT003` from then on.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::time::{sleep, sleep_until, timeout, Instant};

use crate::{check_token, Error, FencingError};

/// A connection of its own for one lease; the drivers' modules implement it (tokio-postgres'
/// `Client`, sqlx's `PgConnection`).
pub trait LeaseConn: Send + 'static {
    /// `fencing_lease_acquire(name, ttl, wait)`: the token.
    fn acquire(
        &mut self,
        name: &str,
        ttl: Duration,
        wait: Duration,
    ) -> impl Future<Output = Result<i64, Error>> + Send;
    /// How long the live lease holding `token` still has (after a grant that waited).
    fn remaining(&mut self, token: i64) -> impl Future<Output = Result<Duration, Error>> + Send;
    /// `fencing_lease_renew(token, ttl)`; `FT003` once the lease has ended.
    fn renew(
        &mut self,
        token: i64,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), Error>> + Send;
    /// `fencing_lease_release(token)`: true if it was still live.
    fn release(&mut self, token: i64) -> impl Future<Output = Result<bool, Error>> + Send;
}

/// How a lease is taken: `wait` is how long `fencing_lease_acquire` may wait for the current
/// holder (zero: not at all, `55P03` if held); `renew_every` defaults to a third of the TTL.
#[derive(Debug, Clone, Default)]
pub struct LeaseOptions {
    /// How long `fencing_lease_acquire` may wait for the current holder (zero: `55P03` at once
    /// if the lease is held).
    pub wait: Duration,
    /// The renewal period; `None`: a third of the TTL.
    pub renew_every: Option<Duration>,
}

struct State {
    valid_until: Instant,
    lost: Option<FencingError>,
}

struct Shared {
    name: String,
    token: i64,
    ttl: Duration,
    state: Mutex<State>,
    lost_tx: watch::Sender<bool>,
}

impl Shared {
    fn lose(&self, why: &str) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.lost.is_none() {
            s.lost = Some(FencingError::lease_lost(format!(
                "lease \"{}\" (token {}) was lost: {why}",
                self.name, self.token
            )));
        }
        drop(s);
        self.lost_tx.send_replace(true);
    }

    fn expired(&self) {
        self.lose(&format!(
            "no renewal got through within its TTL ({:?})",
            self.ttl
        ));
    }

    fn valid_until(&self) -> Instant {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .valid_until
    }

    fn is_lost(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .lost
            .is_some()
    }
}

/// A PostgreSQL lease renewed in the background until [`Lease::release`]. Dropping it stops the
/// renewal without releasing (the lease then ends at its expiry).
pub struct Lease {
    shared: Arc<Shared>,
    every: Duration,
    lost_rx: watch::Receiver<bool>,
    release_tx: Option<oneshot::Sender<oneshot::Sender<Result<bool, Error>>>>,
}

impl Lease {
    /// Takes lease `name` for `ttl` on `conn` (which the lease owns from then on) and starts its
    /// renewal on a tokio task. Must be called within a tokio runtime.
    pub async fn acquire<C: LeaseConn>(
        mut conn: C,
        name: &str,
        ttl: Duration,
        options: LeaseOptions,
    ) -> Result<Lease, Error> {
        let every = options.renew_every.unwrap_or(ttl / 3);
        if name.is_empty() {
            return Err(Error::Usage("a lease's name is a non-empty string".into()));
        }
        if ttl.is_zero() {
            return Err(Error::Usage("a lease's TTL must be positive".into()));
        }
        if every.is_zero() || every >= ttl {
            return Err(Error::Usage(format!(
                "renew_every must be positive and shorter than the TTL ({ttl:?}), not {every:?}"
            )));
        }
        let sent = Instant::now();
        let token = check_token(conn.acquire(name, ttl, options.wait).await?)?;
        let mut valid_until = sent + ttl;
        if !options.wait.is_zero() {
            // Granted at some moment of the wait: ask how long it has left.
            let sent = Instant::now();
            valid_until = sent + conn.remaining(token).await?;
        }
        let (lost_tx, lost_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            name: name.to_owned(),
            token,
            ttl,
            state: Mutex::new(State {
                valid_until,
                lost: None,
            }),
            lost_tx,
        });
        let (release_tx, release_rx) = oneshot::channel();
        tokio::spawn(renew(conn, Arc::clone(&shared), every, release_rx));
        Ok(Lease {
            shared,
            every,
            lost_rx,
            release_tx: Some(release_tx),
        })
    }

    /// The lease's fencing token.
    pub fn token(&self) -> i64 {
        self.shared.token
    }

    /// The lease's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// `Ok` while the lease holds; once it is lost, `FT003` saying why. Call it before each
    /// write (`run_with_lease` calls it before committing).
    pub fn check(&self) -> Result<(), Error> {
        if Instant::now() >= self.shared.valid_until() {
            self.shared.expired();
        }
        match &self
            .shared
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .lost
        {
            Some(e) => Err(Error::from(e.clone())),
            None => Ok(()),
        }
    }

    /// Resolves when the lease is lost (never, if it is released first).
    pub async fn lost(&self) {
        let mut rx = self.lost_rx.clone();
        let _ = rx.wait_for(|lost| *lost).await;
        if !*rx.borrow() {
            std::future::pending::<()>().await; // released: the sender is gone
        }
    }

    /// Stops the renewal and releases the lease: true if it was still held. Not waited for beyond
    /// one renewal period (then false; the renewal task still releases it when its call returns).
    pub async fn release(mut self) -> Result<bool, Error> {
        let Some(tx) = self.release_tx.take() else {
            return Ok(false);
        };
        let (reply_tx, reply_rx) = oneshot::channel();
        if tx.send(reply_tx).is_err() {
            return Ok(false); // the task ended: the lease was lost
        }
        match timeout(self.every, reply_rx).await {
            Ok(Ok(result)) => result,
            _ => Ok(false),
        }
    }
}

async fn renew<C: LeaseConn>(
    mut conn: C,
    shared: Arc<Shared>,
    every: Duration,
    mut release_rx: oneshot::Receiver<oneshot::Sender<Result<bool, Error>>>,
) {
    loop {
        tokio::select! {
            biased;
            request = &mut release_rx => {
                if let Ok(reply) = request {
                    let result = if shared.is_lost() {
                        Ok(false)
                    } else {
                        conn.release(shared.token).await
                    };
                    let _ = reply.send(result);
                }
                return; // a dropped Lease: stop renewing, the lease ends at its expiry
            }
            _ = sleep_until(shared.valid_until()) => {
                shared.expired();
                return;
            }
            _ = sleep(every) => {}
        }
        let sent = Instant::now();
        tokio::select! {
            result = conn.renew(shared.token, shared.ttl) => match result {
                Ok(()) => {
                    let mut s = shared.state.lock().unwrap_or_else(|p| p.into_inner());
                    s.valid_until = s.valid_until.max(sent + shared.ttl);
                }
                Err(e) => {
                    let why = match &e {
                        Error::Fencing(f) => f.message.clone(),
                        other => other.to_string(),
                    };
                    shared.lose(&why);
                    return;
                }
            },
            // The renewal is stuck (a stalled connection): the lease may have expired by now.
            _ = sleep_until(shared.valid_until()) => {
                shared.expired();
                return;
            }
        }
    }
}

/// The part of a `run_with_lease` that runs inside its fenced transaction: `work` (the user's
/// function) stopped where it is if the lease is lost, then the lease checked. Once it returns
/// the COMMIT is not raced with the loss: what is reported is what happened.
pub(crate) async fn while_held<T, E: From<Error>>(
    lease: &Lease,
    work: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let value = tokio::select! {
        value = work => value?,
        () = lease.lost() => return Err(E::from(lost(lease))),
    };
    lease.check()?;
    Ok(value)
}

/// The end of a `run_with_lease`: an error of a function stopped by the lease's loss is reported
/// as that loss (nothing of it committed); the lease is released.
pub(crate) async fn finish<T, E: From<Error>>(lease: Lease, result: Result<T, E>) -> Result<T, E> {
    let result = match result {
        Err(_) if lease.check().is_err() => Err(E::from(lost(&lease))),
        other => other,
    };
    let _ = lease.release().await;
    result
}

/// The error of a lease reported lost.
pub(crate) fn lost(lease: &Lease) -> Error {
    match lease.check() {
        Err(e) => e,
        Ok(()) => Error::Usage("the lease was reported lost but holds".into()),
    }
}
