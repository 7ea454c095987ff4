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
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
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
    /// `LISTEN_FDS` was set but the passed descriptor is unusable: a
    /// configuration error (the socket unit), exit code 2.
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
/// removed so that children do not inherit them. fd 3 must be a listening
/// unix stream socket (`ListenStream=` of a path); anything else (a
/// datagram or TCP socket, a file, nothing) is refused with
/// [`ListenError::Activation`], where serving on it would fail every
/// accept. Call it before any thread is started (it edits the
/// environment); hand the result to `tokio::net::UnixListener::from_std`
/// inside the runtime.
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
    let fd = passed_listener(SD_LISTEN_FDS_START).map_err(|reason| ListenError::Activation {
        reason: format!("fd {SD_LISTEN_FDS_START}: {reason}"),
    })?;
    let listener = std::os::unix::net::UnixListener::from(fd);
    listener
        .set_nonblocking(true)
        .map_err(|e| ListenError::Activation {
            reason: format!("fd {SD_LISTEN_FDS_START}: set non-blocking: {e}"),
        })?;
    Ok(Some(listener))
}

/// The first descriptor systemd passes.
const SD_LISTEN_FDS_START: RawFd = 3;

/// Takes `raw` once it is known to be a listening unix stream socket; the
/// reason otherwise.
fn passed_listener(raw: RawFd) -> Result<OwnedFd, String> {
    use nix::sys::socket::{
        AddressFamily, SockType, SockaddrLike, SockaddrStorage, getsockname, getsockopt, sockopt,
    };
    // getsockname fails on a descriptor that is not open (EBADF) or not a
    // socket (ENOTSOCK), so nothing is taken that is not there.
    let addr = getsockname::<SockaddrStorage>(raw).map_err(|e| format!("not a socket ({e})"))?;
    if addr.family() != Some(AddressFamily::Unix) {
        return Err(format!(
            "not a unix socket ({:?}); criguard.socket needs ListenStream=/path",
            addr.family()
        ));
    }
    // SAFETY: `raw` is open (getsockname succeeded) and was passed by
    // systemd to this process alone; it is taken exactly once, here.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let kind = getsockopt(&fd, sockopt::SockType).map_err(|e| format!("socket type: {e}"))?;
    if kind != SockType::Stream {
        return Err(format!(
            "a unix {kind:?} socket, not a stream socket; criguard.socket needs ListenStream=/path"
        ));
    }
    if !getsockopt(&fd, sockopt::AcceptConn).map_err(|e| format!("SO_ACCEPTCONN: {e}"))? {
        return Err("a unix stream socket that is not listening".into());
    }
    Ok(fd)
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

    #[test]
    fn only_a_listening_unix_stream_socket_is_taken() {
        use std::os::fd::{AsRawFd, IntoRawFd};
        let tmp = tempfile::tempdir().unwrap();
        let listening = std::os::unix::net::UnixListener::bind(tmp.path().join("l.sock")).unwrap();
        let fd = passed_listener(listening.into_raw_fd()).expect("a listening unix stream socket");
        drop(fd);
        let dgram = std::os::unix::net::UnixDatagram::unbound().unwrap();
        let err = passed_listener(dgram.into_raw_fd()).unwrap_err();
        assert!(err.contains("not a stream socket"), "{err}");
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(
            passed_listener(a.into_raw_fd())
                .unwrap_err()
                .contains("not listening")
        );
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(
            passed_listener(tcp.as_raw_fd())
                .unwrap_err()
                .contains("not a unix socket")
        );
        let file = std::fs::File::open("/dev/null").unwrap();
        assert!(
            passed_listener(file.as_raw_fd())
                .unwrap_err()
                .contains("not a socket")
        );
    }
}
