//! The socket the kubelet connects to.
//!
//! Either criguard binds it itself ([`bind`]) or systemd passes it through
//! socket activation ([`from_systemd`]); the latter keeps the kubelet's
//! connection target alive while criguard restarts.
//!
//! Binding creates the parent directory with mode 0750 when it is missing
//! (an existing directory is left as the operator made it), replaces a stale
//! socket that nobody answers on, refuses a live one and anything that is not
//! a socket, and sets the socket to mode 0660. Between `bind` and `chmod` the
//! socket briefly carries the process umask's mode; the 0750 directory keeps
//! other users out during that window.

use std::io;
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

/// Mode of the listening socket: owner and group may connect.
pub const SOCKET_MODE: u32 = 0o660;
/// Mode of a socket directory that criguard creates.
pub const DIR_MODE: u32 = 0o750;

/// Errors from preparing the listening socket; each names the path.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// The path exists and is not a unix socket; criguard never deletes it.
    #[error(
        "listen path {path}: exists and is not a socket; remove it or choose another --listen path"
    )]
    NotASocket {
        /// The offending path.
        path: PathBuf,
    },
    /// Another process already serves on the socket.
    #[error("listen path {path}: another process is already listening on it")]
    InUse {
        /// The offending path.
        path: PathBuf,
    },
    /// A file-system or socket call failed.
    #[error("listen path {path}: {op}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// What criguard was doing.
        op: &'static str,
        /// The underlying error.
        source: io::Error,
    },
    /// `LISTEN_FDS` was set but the passed descriptor is unusable.
    #[error("socket activation: {reason}")]
    Activation {
        /// Why the descriptor was refused.
        reason: String,
    },
}

fn io_err<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(io::Error) -> ListenError + 'a {
    move |source| ListenError::Io {
        path: path.to_owned(),
        op,
        source,
    }
}

/// Binds a unix socket at `path` as described in the module docs.
/// Must be called inside a tokio runtime.
pub fn bind(path: &Path) -> Result<UnixListener, ListenError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.exists()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(dir)
            .map_err(io_err(dir, "create directory"))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(ListenError::InUse {
                    path: path.to_owned(),
                });
            }
            std::fs::remove_file(path).map_err(io_err(path, "remove stale socket"))?;
        }
        Ok(_) => {
            return Err(ListenError::NotASocket {
                path: path.to_owned(),
            });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(path, "stat")(e)),
    }
    let listener = UnixListener::bind(path).map_err(io_err(path, "bind"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))
        .map_err(io_err(path, "chmod"))?;
    Ok(listener)
}

/// The first socket passed by systemd socket activation, if this process was
/// given one (`LISTEN_PID` is ours and `LISTEN_FDS` ≥ 1). The variables are
/// removed so that children do not inherit them. Call it before any thread
/// is started (it edits the environment); hand the result to
/// `tokio::net::UnixListener::from_std` inside the runtime.
pub fn from_systemd() -> Result<Option<std::os::unix::net::UnixListener>, ListenError> {
    let fds = std::env::var("LISTEN_FDS").ok();
    let pid = std::env::var("LISTEN_PID").ok();
    let Some(fds) = fds else { return Ok(None) };
    if let Some(pid) = &pid
        && pid.parse::<u32>().ok() != Some(std::process::id())
    {
        return Ok(None);
    }
    let count: u32 = fds.parse().map_err(|_| ListenError::Activation {
        reason: format!("LISTEN_FDS={fds:?} is not a number"),
    })?;
    if count == 0 {
        return Ok(None);
    }
    for var in ["LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"] {
        // SAFETY: called once at start-up, before any other thread exists.
        unsafe { std::env::remove_var(var) };
    }
    const SD_LISTEN_FDS_START: RawFd = 3;
    // SAFETY: systemd hands descriptors from 3 on to this process only; we
    // take ownership of the first exactly once.
    let std_listener =
        unsafe { std::os::unix::net::UnixListener::from_raw_fd(SD_LISTEN_FDS_START) };
    std_listener
        .set_nonblocking(true)
        .map_err(|e| ListenError::Activation {
            reason: format!("fd 3: set non-blocking: {e}"),
        })?;
    Ok(Some(std_listener))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[tokio::test]
    async fn creates_private_dir_and_group_socket() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("run/criguard/criguard.sock");
        let _l = bind(&path).unwrap();
        let sock = std::fs::metadata(&path).unwrap();
        assert!(sock.file_type().is_socket());
        assert_eq!(sock.mode() & 0o777, SOCKET_MODE);
        let dir = std::fs::metadata(path.parent().unwrap()).unwrap();
        assert_eq!(dir.mode() & 0o777, DIR_MODE);
    }

    #[tokio::test]
    async fn replaces_stale_socket() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("c.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists(), "a dropped listener leaves its socket file");
        let listener = bind(&path).unwrap();
        let (accepted, connected) =
            tokio::join!(listener.accept(), tokio::net::UnixStream::connect(&path));
        accepted.unwrap();
        connected.unwrap();
    }

    #[tokio::test]
    async fn refuses_live_socket() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("c.sock");
        let _live = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let err = bind(&path).unwrap_err();
        assert!(matches!(err, ListenError::InUse { .. }), "{err}");
    }

    #[tokio::test]
    async fn refuses_regular_file_and_keeps_it() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("c.sock");
        std::fs::write(&path, b"precious").unwrap();
        let err = bind(&path).unwrap_err();
        assert!(err.to_string().contains(path.to_str().unwrap()), "{err}");
        assert!(matches!(err, ListenError::NotASocket { .. }));
        assert_eq!(std::fs::read(&path).unwrap(), b"precious");
    }
}
