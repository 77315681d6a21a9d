//! The thin PostgreSQL-interface layer: safe wrappers around the `pg_sys` calls the layers above
//! need (internal statements, index point reads, resource locks, GUC internals, raising errors
//! with our own SQLSTATEs, the session's origin). Most of the crate's `unsafe` is here, each
//! block with a `// SAFETY:` note; the layers above call these as plain functions.
//!
//! What every safe function here assumes (as pgrx's own safe wrappers do): it runs on the
//! backend's main thread and inside a pgrx guard (a `#[pg_guard]` or `#[pg_extern]` function, or
//! `pgrx_extern_c_guard`), because every `pg_sys` call may raise a PostgreSQL ERROR, which pgrx
//! turns into a Rust panic that only such a guard may catch. Most also need a transaction; their
//! `// SAFETY:` notes say so.

pub mod catalog;
pub mod citus;
pub mod compat;
pub mod copy_stmt;
pub mod event_trigger;
pub mod guc;
pub mod index;
pub mod key_identity;
pub mod lock_manager;
pub mod plan;
pub mod process;
pub mod report;
pub mod session;
pub mod shmem;
pub mod spi;
pub mod trigger_event;
