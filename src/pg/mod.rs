//! The thin PostgreSQL-interface layer: safe wrappers around the `pg_sys` calls the layers above
//! need (internal statements, index point reads, resource locks, GUC internals, raising errors
//! with our own SQLSTATEs, the session's origin). Most of the crate's `unsafe` is here, each
//! block with a `// SAFETY:` note; the layers above call these as plain functions.

pub mod guc;
pub mod index;
pub mod locks;
pub mod report;
pub mod session;
pub mod spi;
