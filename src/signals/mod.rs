//! Reading what the kernel says about usage, directly and fresh.
//!
//! Readers take a root (never a hard-coded `/sys/fs/cgroup`) and parse plain
//! text, so tests run them against fixture trees. Errors carry the path.

pub mod cgroup_path;
pub mod disk;
pub mod events;
pub mod memory;
pub mod node;
pub mod probe;
pub mod usage;

use std::path::{Path, PathBuf};

/// An I/O error with the file it came from.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct ReadError {
    /// The file.
    pub path: PathBuf,
    /// The error.
    pub source: std::io::Error,
}

/// Reads a whole small file (cgroup and proc files are tiny).
pub fn read(path: &Path) -> Result<String, ReadError> {
    std::fs::read_to_string(path).map_err(|source| ReadError {
        path: path.to_owned(),
        source,
    })
}

/// Milliseconds since the Unix epoch of a past monotonic instant `at`, for
/// display (the wall clock now, less the time elapsed since `at`).
pub fn unix_ms(at: std::time::Instant) -> u64 {
    let wall = std::time::SystemTime::now() - at.elapsed();
    wall.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Writes a fixture file, creating its directories (tests only).
#[cfg(test)]
pub(crate) fn write_fixture(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().expect("a file under root")).unwrap();
    std::fs::write(p, text).unwrap();
}
