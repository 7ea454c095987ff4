//! criguard's decisions, as pure functions over plain data.
//!
//! Nothing here reads a clock, a file or the runtime: callers pass in what
//! they observed and get back what to do, so every rule is tested with plain
//! tables.

pub mod gc;
pub mod image_gc;
pub mod local_storage;
pub mod oom;
pub mod oom_kill;
pub mod qos;
pub mod rank;
pub mod reclaim;
pub mod spec;
pub mod thresholds;
