//! The guard trigger on protected tables: decodes PostgreSQL's trigger events (row and statement
//! level, TRUNCATE, replica mode) and hands each write to the fencing rule (`rule`).

pub mod citus;
pub mod copy_from;
pub mod fast_path;
pub mod trigger;

use crate::pg::trigger_event::TriggerInfo;
use std::ffi::CStr;

/// The guard's row trigger, installed by `fencing_protect` (`sql/pg_fencing.sql`).
pub const GUARD: &CStr = c"zz_pg_fencing_guard";
/// The guard's statement trigger (resource mode; per-row mode in the set-based shape).
pub const STATEMENT: &CStr = c"zz_pg_fencing_stmt";

/// The shape of a protected table (docs/design.md, "The set-based shape"), as its guard row
/// trigger `guard` says: the row-trigger shape checks and stamps each inserted row in its BEFORE
/// INSERT row trigger; the set-based shape has none (so that COPY keeps its multi-row inserts)
/// and relies on the hooks of a preloaded library (`copy_from`, `fast_path::plan_insert`).
pub fn set_based(guard: &TriggerInfo) -> bool {
    guard.tgtype & pgrx::pg_sys::TRIGGER_TYPE_INSERT == 0
}
