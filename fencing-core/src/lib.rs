//! The parts of pg_fencing that need no PostgreSQL, so that they can be fuzzed on their own
//! (`../fuzz`): parsing of fencing tokens given as text, and the shape check of the jsonb
//! arguments of `fenced_update` / `fenced_insert` / `fenced_delete`.

pub mod handover;
pub mod json;
pub mod token;
