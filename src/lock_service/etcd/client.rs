//! How the etcd thread connects to etcd, and the settings it connects with (no PostgreSQL).
#![forbid(unsafe_code)]

use etcd_client::{Client, ConnectOptions};
use std::time::Duration;

/// The worker's etcd settings, as its main thread read them (`pg_fencing.etcd_endpoints`,
/// `pg_fencing.lease_ttl`) and sent them to the etcd thread.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) endpoints: Vec<String>,
    pub(crate) ttl: i64,
    /// The data directory, where the etcd thread saves its state files.
    pub(crate) state_dir: String,
}

impl Config {
    pub(crate) fn endpoints(&self) -> &[String] {
        &self.endpoints
    }
}

/// A connection that has answered a status request.
pub(crate) async fn connect(cfg: &Config) -> Result<Client, String> {
    if cfg.endpoints.is_empty() {
        return Err("pg_fencing.etcd_endpoints is empty".into());
    }
    // No per-request timeout: a Lock request legitimately waits as long as the caller's
    // timeout; every call below has its own deadline.
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2));
    let mut c = tokio::time::timeout(
        Duration::from_secs(2),
        Client::connect(cfg.endpoints.clone(), Some(opts)),
    )
    .await
    .map_err(|_| "connection timed out".to_string())?
    .map_err(|e| e.to_string())?;
    // A connection is only established lazily; make sure somebody answers.
    tokio::time::timeout(Duration::from_secs(2), c.status())
        .await
        .map_err(|_| "status request timed out".to_string())?
        .map_err(|e| e.to_string())?;
    Ok(c)
}
