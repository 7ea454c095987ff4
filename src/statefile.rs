//! criguard's state files under `--state-dir` (`evicted-pods.json`,
//! `image-gc.json`, `pressure.json`, `kube-pods.json`): private and
//! written atomically, read back leniently.
//!
//! Pod names, eviction messages and image references are the node's
//! business: the directory is created 0700 and each file is 0600. A write
//! goes to a temporary file next to the target, is fsynced, renamed over
//! the old file and the directory fsynced, so a crash leaves either the old
//! file or the new one, never a torn one. An existing directory keeps the
//! mode it has (the systemd unit's `StateDirectoryMode=0700` makes it).

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

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
    f.write_all(bytes).map_err(|e| wrap(&tmp, e))?;
    f.sync_all().map_err(|e| wrap(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| wrap(path, e))?;
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
}
