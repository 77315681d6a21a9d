//! The fencing token of an etcd lock (etcd's lock service, `etcdctl lock`, Go's
//! `concurrency.Mutex`): the revision in the lock response's header, the revision at which the
//! lock was granted (not the lock key's create revision, which orders differently when holders
//! queue). A lock whose key was deleted while it queued (its lease revoked or expired) is not
//! granted: [`lock`] reads the key back under the same lease.

use etcd_client::{Client, LockOptions};

use crate::{Error, FencingError};

/// An etcd lock held under a lease: its fencing token and its key (for `unlock`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lock {
    pub token: i64,
    pub key: Vec<u8>,
}

/// Takes etcd lock `name` under lease `lease_id` (waiting while an earlier holder's key exists)
/// and returns its token. `FT003` if the lock's key is gone by the time it is granted.
pub async fn lock(client: &mut Client, name: &str, lease_id: i64) -> Result<Lock, Error> {
    let response = client
        .lock(name, Some(LockOptions::new().with_lease(lease_id)))
        .await?;
    let token = response
        .header()
        .map(|h| h.revision())
        .ok_or_else(|| Error::Usage("etcd's lock response has no header".into()))?;
    let key = response.key().to_vec();
    let held = client.get(key.clone(), None).await?;
    let ours = held.kvs().iter().any(|kv| kv.lease() == lease_id);
    if !ours {
        return Err(Error::from(FencingError::lease_lost(format!(
            "etcd lock \"{name}\" not granted: its key was deleted (lease {lease_id:x} revoked or expired) while it queued"
        ))));
    }
    Ok(Lock { token, key })
}
