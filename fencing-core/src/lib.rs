//! The parts of pg_fencing that need no PostgreSQL, so that they can be fuzzed and model-checked
//! on their own (`../fuzz`): parsing of fencing tokens given as text, the shape check of the
//! jsonb arguments of `fenced_update` / `fenced_insert` / `fenced_delete`, the hand-over rule of
//! watched resources and its exhaustive model, the resource-lock hash, and the states of the lock
//! service's shared-memory slots with their transitions.
#![forbid(unsafe_code)]

pub mod handover;
pub mod hash;
pub mod json;
pub mod slot_states;
pub mod token;
