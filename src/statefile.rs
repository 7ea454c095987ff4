//! criguard's state files under `--state-dir` (`evicted-pods.json`,
//! `image-gc.json`, `pressure.json`, `kube-pods.json`): private and
//! written atomically, read back leniently.
//!
//! Pod names, eviction messages and image references are the node's
//! business: the directory is created 0700 and each file is 0600. A write
//! goes to a temporary file next to the target, is fsynced, renamed over
//! the old file and the directory fsynced, so a crash leaves either the old
//! file or the new one, never a torn one; a failed write removes its
//! temporary file (on a full filesystem it holds the last free blocks).
//! `serve` makes an existing directory 0700 at start ([`make_dir_private`]).
//!
//! A write that must not be lost (the evicted pods: a restart that forgets
//! one lets the kubelet run it again) goes through [`write_or_retry`]: when
//! it fails (the state directory full, read-only, gone) the bytes stay in
//! memory and a thread of their own tries again every [`RETRY_PERIOD`]
//! until they are written, a newer write of the same file replacing them.
//! Each failed attempt is counted by file in
//! `criguard_state_write_failures_total{file}` ([`write_failures`]); the
//! first is logged as an error, later ones at most once a minute, and the
//! write that finally succeeds says how many attempts it took.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use crate::lock::Locked;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Mode of a state directory criguard creates.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every state file.
pub const FILE_MODE: u32 = 0o600;

/// Writes `bytes` to `path` atomically with [`FILE_MODE`], creating its
/// directory with [`DIR_MODE`] when missing; errors name the path.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let wrap = |p: &Path, e: std::io::Error| {
        std::io::Error::new(e.kind(), format!("{}: {e}", p.display()))
    };
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
        .map_err(|e| wrap(dir, e))?;
    let mut tmp_name = path.file_name().unwrap_or_default().to_owned();
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    // A temporary file left by a crash may carry an older, wider mode:
    // start from a fresh one.
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(wrap(&tmp, e)),
        _ => {}
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(&tmp)
        .map_err(|e| wrap(&tmp, e))?;
    let written = f
        .write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| wrap(&tmp, e))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| wrap(path, e)));
    if written.is_err() {
        // A partial temporary file on a full filesystem holds the space a
        // retry needs.
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    // The rename itself is durable once the directory is synced.
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| wrap(dir, e))
}

/// Reads the JSON state file at `path`: `None` when it does not exist;
/// when it cannot be read or parsed, the error is logged (naming the path)
/// and the file is set aside as `<name>.bad`, so a bad file never keeps
/// criguard from starting and is not read again.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return None,
        Err(err) => {
            tracing::error!(path = %path.display(), %err, "cannot read the state file; starting without it");
            return None;
        }
    };
    match serde_json::from_slice(&text) {
        Ok(v) => Some(v),
        Err(err) => {
            let mut bad = path.file_name().unwrap_or_default().to_owned();
            bad.push(".bad");
            let bad = path.with_file_name(bad);
            let _ = std::fs::rename(path, &bad);
            tracing::error!(path = %path.display(), set_aside = %bad.display(), %err, "state file not valid; starting without it");
            None
        }
    }
}

/// Makes the existing directory `dir` private ([`DIR_MODE`]) when others
/// may read or enter it; the mode it had when it changed it, `None` when
/// there was nothing to do (already private, or missing: criguard creates
/// it 0700 at its first write).
pub fn make_dir_private(dir: &Path) -> std::io::Result<Option<u32>> {
    let meta = match std::fs::metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(std::io::Error::new(
                e.kind(),
                format!("{}: {e}", dir.display()),
            ));
        }
    };
    let mode = meta.permissions().mode() & 0o7777;
    if !meta.is_dir() || mode & 0o077 == 0 {
        return Ok(None);
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(DIR_MODE))
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: chmod: {e}", dir.display())))?;
    Ok(Some(mode))
}

/// How long between two attempts at a write that failed.
pub const RETRY_PERIOD: Duration = Duration::from_secs(1);

/// Labels of a state file's failed writes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FileLabels {
    /// The file's name in the state directory.
    pub file: String,
}

static FAILURES: LazyLock<Family<FileLabels, Counter>> = LazyLock::new(Family::default);

/// Failed attempts at writing each state file, process-wide: [`register`]
/// registers it as `criguard_state_write_failures_total`.
pub fn write_failures() -> Family<FileLabels, Counter> {
    FAILURES.clone()
}

/// Registers the failed writes ([`write_failures`]).
pub fn register(registry: &mut Registry) {
    registry.register(
        "criguard_state_write_failures",
        "Failed attempts at writing a state file, by file (the state directory full, read-only or gone); an eviction record that could not be written is kept in memory and retried every second until it is",
        write_failures(),
    );
}

/// A write that failed, kept until it succeeds or a newer one replaces it.
#[derive(Debug)]
struct Unwritten {
    bytes: Vec<u8>,
    since: Instant,
    attempts: u64,
}

/// The writes not done yet, by path, and whether the retry thread runs.
#[derive(Debug, Default)]
struct Pending {
    files: BTreeMap<PathBuf, Unwritten>,
    retrying: bool,
}

static PENDING: LazyLock<Mutex<Pending>> = LazyLock::new(Mutex::default);

fn pending() -> std::sync::MutexGuard<'static, Pending> {
    PENDING.locked()
}

fn count_failure(path: &Path) {
    let file = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    FAILURES.get_or_create(&FileLabels { file }).inc();
}

/// Writes `bytes` to `path` like [`write_private`]; when that fails, the
/// bytes are kept and written again every [`RETRY_PERIOD`] until they are
/// (or a newer `write_or_retry` of `path` replaces them). The error of this
/// attempt is returned all the same; it is counted and the first failure of
/// a run of them is logged here.
pub fn write_or_retry(path: &Path, bytes: Vec<u8>) -> std::io::Result<()> {
    let mut p = pending();
    let result = write_private(path, &bytes);
    match &result {
        Ok(()) => {
            if let Some(u) = p.files.remove(path) {
                tracing::info!(path = %path.display(), failed_attempts = u.attempts, "state file written; the earlier content that could not be written is superseded");
            }
        }
        Err(err) => {
            count_failure(path);
            let u = p.files.entry(path.to_owned()).or_insert_with(|| {
                tracing::error!(path = %path.display(), %err, retry_every = ?RETRY_PERIOD, "cannot write the state file; its content is kept in memory and written as soon as it can be");
                Unwritten {
                    bytes: Vec::new(),
                    since: Instant::now(),
                    attempts: 0,
                }
            });
            u.bytes = bytes;
            u.attempts += 1;
            if !p.retrying {
                let started = std::thread::Builder::new()
                    .name("criguard-state-retry".into())
                    .spawn(retry_loop);
                match started {
                    Ok(_) => p.retrying = true,
                    Err(e) => {
                        tracing::warn!(%e, "cannot start the state file retry thread; retried at the next write")
                    }
                }
            }
        }
    }
    result
}

/// Tries the pending writes every [`RETRY_PERIOD`] until none is left.
fn retry_loop() {
    loop {
        std::thread::sleep(RETRY_PERIOD);
        let mut p = pending();
        retry_once(&mut p);
        if p.files.is_empty() {
            p.retrying = false;
            return;
        }
    }
}

/// One attempt at each pending write.
fn retry_once(p: &mut Pending) {
    p.files.retain(|path, u| match write_private(path, &u.bytes) {
        Ok(()) => {
            tracing::info!(path = %path.display(), failed_attempts = u.attempts, after = ?u.since.elapsed(), "state file written at last");
            false
        }
        Err(err) => {
            u.attempts += 1;
            count_failure(path);
            crate::log_limited!(warn, burst = 1, period = Duration::from_secs(60), path = %path.display(), %err, failed_attempts = u.attempts, "still cannot write the state file; retrying");
            true
        }
    });
}

/// Tries every pending write once more (at a clean stop); the paths still
/// not written.
pub fn flush_pending() -> Vec<PathBuf> {
    let mut p = pending();
    retry_once(&mut p);
    p.files.keys().cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn creates_a_private_directory_and_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("state/sub/x.json");
        write_private(&path, b"{}").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
        assert_eq!(mode(&path), FILE_MODE);
        assert_eq!(mode(path.parent().unwrap()), DIR_MODE);
        assert_eq!(mode(&tmp.path().join("state")), DIR_MODE);
    }

    #[test]
    fn replaces_a_world_readable_file_and_a_stale_temporary() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("x.json");
        std::fs::write(&path, b"old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::write(tmp.path().join("x.json.tmp"), b"torn").unwrap();
        write_private(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert_eq!(mode(&path), FILE_MODE);
        assert!(!tmp.path().join("x.json.tmp").exists());
    }

    #[test]
    fn read_json_reads_back_and_sets_a_bad_file_aside() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("x.json");
        assert_eq!(read_json::<Vec<u32>>(&path), None, "no file");
        write_private(&path, b"[1,2]").unwrap();
        assert_eq!(read_json::<Vec<u32>>(&path), Some(vec![1, 2]));
        std::fs::write(&path, b"[1,").unwrap();
        assert_eq!(read_json::<Vec<u32>>(&path), None);
        assert!(tmp.path().join("x.json.bad").exists());
        assert!(!path.exists());
    }

    #[test]
    fn an_error_names_the_path() {
        let tmp = tempfile::tempdir().unwrap();
        let blocker = tmp.path().join("file");
        std::fs::write(&blocker, b"").unwrap();
        let err = write_private(&blocker.join("x.json"), b"").unwrap_err();
        assert!(err.to_string().contains(blocker.to_str().unwrap()), "{err}");
    }

    #[test]
    fn a_failed_write_is_counted_kept_and_retried_until_written() {
        let tmp = tempfile::tempdir().unwrap();
        // The state directory's path is taken by a file: every write fails
        // until it goes.
        let dir = tmp.path().join("state");
        std::fs::write(&dir, b"").unwrap();
        let path = dir.join("retry-test.json");
        let failures = || {
            write_failures()
                .get_or_create(&FileLabels {
                    file: "retry-test.json".into(),
                })
                .get()
        };
        assert!(write_or_retry(&path, b"[1]".to_vec()).is_err());
        assert!(write_or_retry(&path, b"[1,2]".to_vec()).is_err());
        assert_eq!(failures(), 2);
        std::thread::sleep(RETRY_PERIOD * 2);
        assert!(failures() >= 3, "the retries are counted too");
        std::fs::remove_file(&dir).unwrap();
        let deadline = Instant::now() + RETRY_PERIOD * 10;
        while !path.exists() {
            assert!(Instant::now() < deadline, "never written once it could be");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"[1,2]",
            "the latest content"
        );
        assert_eq!(mode(&path), FILE_MODE);
        assert!(!flush_pending().contains(&path));
    }

    #[test]
    fn a_newer_write_replaces_a_pending_one() {
        let tmp = tempfile::tempdir().unwrap();
        let blocker = tmp.path().join("x.json");
        std::fs::create_dir(&blocker).unwrap();
        std::fs::write(blocker.join("f"), b"").unwrap();
        // A directory in the way of the rename: the write fails.
        assert!(write_or_retry(&blocker, b"old".to_vec()).is_err());
        assert!(flush_pending().contains(&blocker), "still pending");
        std::fs::remove_dir_all(&blocker).unwrap();
        write_or_retry(&blocker, b"new".to_vec()).unwrap();
        assert!(!flush_pending().contains(&blocker));
        assert_eq!(std::fs::read(&blocker).unwrap(), b"new");
    }

    #[test]
    fn an_open_state_directory_is_made_private() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        assert_eq!(
            make_dir_private(&dir).unwrap(),
            None,
            "missing: nothing to do"
        );
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(make_dir_private(&dir).unwrap(), Some(0o755));
        assert_eq!(mode(&dir), DIR_MODE);
        assert_eq!(make_dir_private(&dir).unwrap(), None, "already private");
    }
}
