//! The lock services: PostgreSQL leases (`leases.rs`, the database itself, no worker needed),
//! and the optional background worker that takes etcd locks and leases for sessions
//! (`fencing_acquire`) and watches locks that others take (`fencing_watch`).
//!
//! Processes and threads:
//! * a **backend** calling `fencing_acquire` writes a request into a slot of shared memory
//!   (`etcd_locks.rs`), sets the worker's latch and waits on its own latch (checking for interrupts,
//!   its timeout and the slot's state);
//! * the **worker's main thread** (`worker.rs`, the only one that calls PostgreSQL) waits on its
//!   latch, handles SIGHUP/SIGTERM/postmaster death, and forwards requests to the etcd thread over
//!   a channel;
//! * the **etcd thread** (`etcd/`) runs tokio and `etcd-client`, never calls PostgreSQL, blocks
//!   all signals, and reports results by writing the slots' atomics.
//!
//! What the fencing rule asks of this layer is narrow: `leases::check_lease_live` (the time fence of
//! PostgreSQL leases, FT003), `etcd_locks::check_lock_not_lost` (is the token of a
//! lock this session took still valid, FT003), `etcd_locks::held_by_this_session` (token scope) and
//! `watch::check` (a watched resource's hand-over revision, FT005/FT006). Nothing here calls the
//! rule; the marks a stopped watch leaves are stored by the caller of `watch::apply_pending`.

pub mod etcd;
pub mod etcd_locks;
pub mod leases;
pub mod shmem_text;
pub mod watch;
pub mod worker;
