//! What the fencing rule decides with, as stored in the database: resource marks, tombstones,
//! the privilege checks on them, and the shared-memory counters of accepted and refused writes.
//! Marks and tombstones are rows of WAL-logged tables in schema `_pg_fencing`, so every
//! lifecycle path that copies the database carries them (docs/design.md, "Lifecycle guarantees").

pub mod mark_versions;
pub mod marks;
pub mod privileges;
pub mod protections;
pub mod stats;
pub mod tombstone_runs;
pub mod tombstones;
