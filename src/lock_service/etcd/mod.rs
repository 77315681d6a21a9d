//! The etcd thread: tokio and etcd-client on a thread of its own, started by the worker with
//! every signal blocked, never calling PostgreSQL (no pgrx item is used below this folder, and
//! `unsafe` is forbidden). It talks to the backends and the worker's main thread only through
//! the atomics of the shared-memory slots (`lock_service/etcd_locks.rs`, `lock_service/watch.rs`)
//! and the worker's command channel.

#![forbid(unsafe_code)]

pub(crate) mod client;
pub(crate) mod mutex;
pub(crate) mod session;
pub(crate) mod watch;
