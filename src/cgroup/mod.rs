//! The cgroup filesystem, at the bottom of everything that reads or acts
//! on a pod's cgroup: where a cgroup lives for either driver on either
//! version ([`path`]), its files read directly and fresh ([`fs`]), and
//! killing every process in one ([`kill`]).
//!
//! Readers take a root (never a hard-coded `/sys/fs/cgroup`) and parse plain
//! text, so tests run them against fixture trees. Errors carry the path.

pub mod fs;
pub mod kill;
pub mod path;

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

/// Writes a fixture file, creating its directories (tests only).
#[cfg(test)]
pub(crate) fn write_fixture(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().expect("a file under root")).unwrap();
    std::fs::write(p, text).unwrap();
}
