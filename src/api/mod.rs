//! The SQL surface: the C entry points of every SQL function (argument decoding, and the one
//! place where a `FenceError` is raised, at the outermost frame), the `fenced_*` functions and
//! the set-returning functions behind the views. SQL declarations are in `sql/pg_fencing.sql`.

pub mod fenced;
pub mod functions;
pub mod hooks;
