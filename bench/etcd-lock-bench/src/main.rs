//! Lock round trip with `etcd-client` directly, as a service would do it: grant a lease, lock
//! under it, (the service would write here), unlock, revoke. Prints two latencies in
//! microseconds per line: the acquisition (lease grant + etcd's Lock request, the request
//! `fencing_acquire` replaces by the mutex's own transaction when the lock is free) and the whole
//! round trip. With `session` as fifth argument, one lease serves every sample (granted before,
//! revoked after, as with Go's `concurrency.Session`): the acquisition is etcd's Lock request
//! alone. Usage: etcd-lock-bench ENDPOINT LOCK_NAME ITERATIONS [session]
use etcd_client::{Client, LockOptions};
use std::time::Instant;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (endpoint, name, n) = (&args[1], &args[2], args[3].parse::<usize>()?);
    // "session": one lease for all the locks, granted before and revoked after the samples,
    // as with Go's concurrency.Session (and pg_fencing's session lease); otherwise a lease per
    // lock, granted and revoked in each sample.
    let session = args.get(4).map(|a| a == "session").unwrap_or(false);
    let mut c = Client::connect([endpoint.as_str()], None).await?;
    let shared = if session {
        Some(c.lease_grant(10, None).await?.id())
    } else {
        None
    };
    for _ in 0..n {
        let t0 = Instant::now();
        let lease = match shared {
            Some(l) => l,
            None => c.lease_grant(10, None).await?.id(),
        };
        let resp = c
            .lock(name.as_bytes(), Some(LockOptions::new().with_lease(lease)))
            .await?;
        let _token = resp.header().map(|h| h.revision());
        let acquired = t0.elapsed();
        c.unlock(resp.key()).await?;
        if shared.is_none() {
            c.lease_revoke(lease).await?;
        }
        println!("{} {}", acquired.as_micros(), t0.elapsed().as_micros());
    }
    if let Some(l) = shared {
        c.lease_revoke(l).await?;
    }
    Ok(())
}
