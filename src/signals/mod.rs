//! Reading what the kernel says about usage, directly and fresh.
//!
//! Readers take a root (never a hard-coded `/sys/fs/cgroup`) and parse plain
//! text, so tests run them against fixture trees. Errors carry the path.

pub mod disk;
pub mod node;
pub mod notify;
pub mod probe;
pub mod table;
pub mod usage;

pub use crate::cgroup::{ReadError, read};

#[cfg(test)]
pub(crate) use crate::cgroup::write_fixture;
