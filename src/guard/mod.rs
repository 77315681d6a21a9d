//! The guard trigger on protected tables: decodes PostgreSQL's trigger events (row and statement
//! level, TRUNCATE, replica mode) and hands each write to the fencing rule (`rule`).

pub mod fast_path;
pub mod trigger;
