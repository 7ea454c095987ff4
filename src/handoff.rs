//! Handing the listening sockets to a new criguard process, so that a
//! restart or an upgrade never leaves the CRI socket without a process
//! accepting on it (the binary-upgrade pattern of nginx and Envoy's hot
//! restart).
//!
//! The running process (the predecessor) starts the new binary with
//! duplicates of its CRI, admin and metrics listeners and one end of a
//! control socket; their descriptor numbers travel in [`ENV`]. Over the
//! control socket, one line each:
//!
//! 1. successor → `prepared` once its command line and configuration load
//!    (or `refused <why>` and it exits: the predecessor carries on as it
//!    was);
//! 2. predecessor → `go` once it has stopped its own loops and written its
//!    state: only one process ever acts on the node and the state
//!    directory;
//! 3. successor → `ready` once it accepts connections and its guardian
//!    runs; the predecessor then tells systemd the new main PID
//!    ([`crate::sdnotify`]), stops accepting, lets its calls in flight
//!    finish (GOAWAY, `--drain`) and exits.
//!
//! Both processes accept on the same socket between `go` and `ready`;
//! the kernel queues connections for whichever accepts next, so no
//! connection is refused at any moment.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The environment variable that carries the inherited descriptors.
pub const ENV: &str = "CRIGUARD_HANDOFF";

/// The descriptors a successor inherits, by number, and whether the CRI
/// socket's file is criguard's own (not systemd's) to remove at its stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Passed {
    cri: RawFd,
    admin: RawFd,
    control: RawFd,
    metrics: Option<RawFd>,
    own_cri: bool,
    /// The predecessor guards the node: a successor that cannot load its
    /// configuration refuses rather than take over failing open.
    #[serde(default)]
    guarding: bool,
}

/// What a process started by a handoff inherits.
#[derive(Debug)]
pub struct Inherited {
    /// The CRI listener.
    pub cri: std::os::unix::net::UnixListener,
    /// The admin listener.
    pub admin: std::os::unix::net::UnixListener,
    /// The metrics listener, if metrics are served.
    pub metrics: Option<std::net::TcpListener>,
    /// Whether the CRI socket's file is criguard's to remove (it bound it;
    /// systemd's socket unit owns its own).
    pub own_cri: bool,
    /// Whether the predecessor guards the node (its configuration was
    /// valid): then a configuration that does not load is refused.
    pub predecessor_guarding: bool,
    /// The control socket to the predecessor.
    pub control: Control,
}

/// Takes the descriptors named in [`ENV`], if set, and removes the
/// variable. Each must be an open socket; an error names the one that is
/// not. Call it before any thread starts (it edits the
/// environment).
pub fn inherited() -> Result<Option<Inherited>, String> {
    let Ok(text) = std::env::var(ENV) else {
        return Ok(None);
    };
    // SAFETY: called before any other thread exists (see above).
    unsafe { std::env::remove_var(ENV) };
    let p: Passed =
        serde_json::from_str(&text).map_err(|e| format!("{ENV}={text}: not a handoff: {e}"))?;
    let take = |fd: RawFd, what: &str| -> Result<OwnedFd, String> {
        use nix::sys::stat::{SFlag, fstat};
        // SAFETY: the predecessor passed this number for us alone; it is
        // checked to be open and a socket before it is owned.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let st = fstat(borrowed).map_err(|e| format!("{ENV}: {what} fd {fd}: {e}"))?;
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFSOCK {
            return Err(format!("{ENV}: {what} fd {fd} is not a socket"));
        }
        nix::fcntl::fcntl(
            borrowed,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .map_err(|e| format!("{ENV}: {what} fd {fd}: {e}"))?;
        // SAFETY: see above; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    };
    let cri = take(p.cri, "cri")?;
    let admin = take(p.admin, "admin")?;
    let control = take(p.control, "control")?;
    let metrics = p.metrics.map(|fd| take(fd, "metrics")).transpose()?;
    Ok(Some(Inherited {
        cri: cri.into(),
        admin: admin.into(),
        metrics: metrics.map(Into::into),
        own_cri: p.own_cri,
        predecessor_guarding: p.guarding,
        control: Control::new(UnixStream::from(control)),
    }))
}

/// The listeners a predecessor hands on: its own duplicates, kept while it
/// runs.
#[derive(Debug)]
pub struct Sockets {
    /// The CRI listener.
    pub cri: OwnedFd,
    /// The admin listener.
    pub admin: OwnedFd,
    /// The metrics listener, if any.
    pub metrics: Option<OwnedFd>,
    /// Whether the CRI socket's file is criguard's own.
    pub own_cri: bool,
}

impl Sockets {
    /// Duplicates of the listeners given (high descriptor numbers,
    /// close-on-exec), kept to hand on later.
    pub fn keep(
        cri: BorrowedFd<'_>,
        admin: BorrowedFd<'_>,
        metrics: Option<BorrowedFd<'_>>,
        own_cri: bool,
    ) -> std::io::Result<Self> {
        Ok(Self {
            cri: dup_high(cri)?,
            admin: dup_high(admin)?,
            metrics: metrics.map(dup_high).transpose()?,
            own_cri,
        })
    }
}

/// `fd` duplicated at 10 or above, close-on-exec: above the numbers a
/// successor's descriptors are placed at, so placing them never
/// overwrites one not yet placed.
fn dup_high(fd: BorrowedFd<'_>) -> std::io::Result<OwnedFd> {
    let n = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(10))?;
    // SAFETY: a descriptor just made by F_DUPFD_CLOEXEC, owned by no one.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

/// The binary to start as the successor: the file at the path this
/// process was started from (a new binary there is the upgrade).
pub fn exe_on_disk() -> std::io::Result<PathBuf> {
    let link = std::fs::read_link(SELF_EXE)?;
    let text = link.to_string_lossy();
    Ok(PathBuf::from(
        text.strip_suffix(" (deleted)").unwrap_or(&text).to_owned(),
    ))
}

/// The running binary itself, even when its file was replaced or removed.
pub const SELF_EXE: &str = "/proc/self/exe";

/// The identity (device, inode) of the file at `path` now.
pub fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Starts `exe` with this process's arguments and `sockets` placed at
/// descriptors 3 and up (`guarding`: whether this process guards the
/// node); returns the child and the control socket to it.
pub fn spawn(exe: &Path, sockets: &Sockets, guarding: bool) -> std::io::Result<(Child, Control)> {
    let (ours, theirs) = UnixStream::pair()?;
    let theirs = dup_high(theirs.as_fd())?;
    let mut from: Vec<RawFd> = vec![
        sockets.cri.as_raw_fd(),
        sockets.admin.as_raw_fd(),
        theirs.as_raw_fd(),
    ];
    if let Some(m) = &sockets.metrics {
        from.push(m.as_raw_fd());
    }
    let passed = Passed {
        cri: 3,
        admin: 4,
        control: 5,
        metrics: sockets.metrics.as_ref().map(|_| 6),
        own_cri: sockets.own_cri,
        guarding,
    };
    let mut cmd = Command::new(exe);
    cmd.args(std::env::args_os().skip(1))
        .env(ENV, serde_json::to_string(&passed).unwrap_or_default())
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_PID")
        .env_remove("LISTEN_FDNAMES");
    // SAFETY: dup2 is async-signal-safe and allocates nothing; every
    // source is at 10 or above, every target below.
    unsafe {
        cmd.pre_exec(move || {
            for (i, &fd) in from.iter().enumerate() {
                if nix::libc::dup2(fd, 3 + i as RawFd) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    drop(theirs);
    Ok((child, Control::new(ours)))
}

/// A message on the control socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// The successor's configuration loaded; it waits for `Go`.
    Prepared,
    /// The successor will not take over, and why.
    Refused(String),
    /// The predecessor has stopped acting and written its state.
    Go,
    /// The successor accepts and guards.
    Ready,
}

impl Msg {
    fn line(&self) -> String {
        match self {
            Msg::Prepared => "prepared\n".into(),
            Msg::Refused(why) => format!("refused {}\n", why.replace('\n', "; ")),
            Msg::Go => "go\n".into(),
            Msg::Ready => "ready\n".into(),
        }
    }

    fn parse(line: &str) -> Option<Self> {
        let line = line.trim_end_matches('\n');
        match line {
            "prepared" => Some(Msg::Prepared),
            "go" => Some(Msg::Go),
            "ready" => Some(Msg::Ready),
            _ => line
                .strip_prefix("refused ")
                .map(|w| Msg::Refused(w.to_owned())),
        }
    }
}

/// One end of the control socket (blocking).
#[derive(Debug)]
pub struct Control {
    reader: BufReader<UnixStream>,
}

impl Control {
    fn new(stream: UnixStream) -> Self {
        Self {
            reader: BufReader::new(stream),
        }
    }

    /// Sends `m`.
    pub fn send(&mut self, m: &Msg) -> std::io::Result<()> {
        self.reader.get_mut().write_all(m.line().as_bytes())
    }

    /// The next message, waiting at most `wait` (`None`: for ever).
    /// `Ok(None)`: the other side closed its end (it exited).
    pub fn recv(&mut self, wait: Option<Duration>) -> std::io::Result<Option<Msg>> {
        self.reader.get_ref().set_read_timeout(wait)?;
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        Msg::parse(&line).map(Some).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("handoff control: unknown message {line:?}"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_back_as_written() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut a, mut b) = (Control::new(a), Control::new(b));
        for m in [
            Msg::Prepared,
            Msg::Refused("config: bad\nline".into()),
            Msg::Go,
            Msg::Ready,
        ] {
            a.send(&m).unwrap();
            let got = b.recv(Some(Duration::from_secs(5))).unwrap().unwrap();
            match m {
                Msg::Refused(_) => assert_eq!(got, Msg::Refused("config: bad; line".into())),
                m => assert_eq!(got, m),
            }
        }
        let err = {
            b.reader.get_mut().write_all(b"what\n").unwrap();
            a.recv(Some(Duration::from_secs(5))).unwrap_err()
        };
        assert!(err.to_string().contains("\"what\\n\""), "{err}");
        drop(b);
        assert_eq!(a.recv(Some(Duration::from_secs(5))).unwrap(), None);
    }

    #[test]
    fn a_silent_successor_times_out() {
        let (a, _b) = UnixStream::pair().unwrap();
        let mut a = Control::new(a);
        let err = a.recv(Some(Duration::from_millis(50))).unwrap_err();
        assert!(matches!(
            err.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ));
    }

    #[test]
    fn the_descriptor_numbers_travel_as_json() {
        let p = Passed {
            cri: 3,
            admin: 4,
            control: 5,
            metrics: None,
            own_cri: true,
            guarding: false,
        };
        let text = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<Passed>(&text).unwrap(), p);
    }
}
