//! The fencing token of an etcd lock (etcd's lock service, `etcdctl lock`, Go's
//! `concurrency.Mutex`): the revision in the lock response's header, the revision at which the
//! lock was granted (not the lock key's create revision, which orders differently when holders
//! queue). A lock whose key was deleted while it queued (its lease revoked or expired, or the key
//! deleted by hand) is not granted: [`lock`] reads the lock's keys back and requires its own key
//! to be the oldest under the lock's prefix (the owner, in etcd's lock protocol) and to carry its
//! lease (a key deleted and created again by a second request under the same lease is younger
//! than a waiter that queued in between, which owns the lock).

use etcd_client::{Client, GetOptions, LockOptions, SortOrder, SortTarget};

use crate::{Error, FencingError};

/// An etcd lock held under a lease: its fencing token and its key (for `unlock`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lock {
    /// The fencing token: the revision of the lock response's header.
    pub token: i64,
    /// The lock's key (`<name>/<lease id in hex>`), for `unlock`.
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
    // The lock's keys are `<name>/<lease id in hex>`; the owner is the oldest.
    let mut prefix = name.as_bytes().to_vec();
    prefix.push(b'/');
    let owner = client
        .get(
            prefix,
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend)
                    .with_limit(1),
            ),
        )
        .await?;
    let ours = owner
        .kvs()
        .first()
        .is_some_and(|kv| kv.key() == key.as_slice() && kv.lease() == lease_id);
    if !ours {
        return Err(Error::from(FencingError::lease_lost(format!(
            "etcd lock \"{name}\" not granted: its key was deleted while it queued (lease {lease_id:x} revoked or expired, or the key deleted), so it is not the lock's owner"
        ))));
    }
    Ok(Lock { token, key })
}
