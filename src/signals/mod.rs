//! Reading what the kernel says about usage, directly and fresh.
//!
//! Readers take a root (never a hard-coded `/sys/fs/cgroup`) and parse plain
//! text, so tests run them against fixture trees. Errors carry the path.

pub mod disk;
pub mod events;
pub mod node;
pub mod probe;
pub mod usage;

pub use crate::cgroup::{ReadError, read};

/// Milliseconds since the Unix epoch of a past monotonic instant `at`, for
/// display (the wall clock now, less the time elapsed since `at`).
pub fn unix_ms(at: std::time::Instant) -> u64 {
    let wall = std::time::SystemTime::now() - at.elapsed();
    wall.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
pub(crate) use crate::cgroup::write_fixture;
