//! `serve`'s side of a handoff ([`criguard::handoff`]): the predecessor
//! starts its successor, stops acting, hands over and drains; the
//! successor waits for its turn and says when it serves.
//!
//! SIGUSR2 always hands over; SIGHUP (`systemctl reload`) hands over when
//! the binary criguard was started from has been replaced on disk (a
//! package upgrade) and otherwise reloads the configuration in place.
//! Either tells systemd the successor's PID. SIGUSR1 hands over for a
//! `systemctl restart` (the unit's `ExecStop=` sends it): systemd is told
//! nothing, its stop waits for this process, and the process systemd then
//! starts adopts the successor ([`adopt`]).

use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;

use criguard::handoff::{self, Control, Msg, Sockets};
use criguard::sdnotify;

/// How long a successor has to load its configuration, and then to serve.
pub const SUCCESSOR_WAIT: Duration = Duration::from_secs(60);

/// The binary criguard was started from, as the path and the file's
/// identity then: a different file there now is an upgrade.
#[derive(Debug, Clone)]
pub struct Binary {
    path: Option<PathBuf>,
    id: Option<(u64, u64)>,
}

impl Binary {
    /// The running binary's path and identity, now.
    pub fn at_start() -> Self {
        let path = handoff::exe_on_disk().ok();
        let id = path.as_deref().and_then(handoff::file_id);
        Self { path, id }
    }

    /// The replacement on disk, if the file at the path is no longer the
    /// one criguard started from.
    pub fn replaced(&self) -> Option<PathBuf> {
        let path = self.path.as_ref()?;
        let now = handoff::file_id(path)?;
        (Some(now) != self.id).then(|| path.clone())
    }

    /// The file at the path now (a SIGUSR2 hands over to it, replaced or
    /// not).
    pub fn on_disk(&self) -> PathBuf {
        self.path
            .clone()
            .unwrap_or_else(|| PathBuf::from(handoff::SELF_EXE))
    }
}

/// A successor that has loaded its configuration and waits for `go`.
#[derive(Debug)]
pub struct Prepared {
    child: Child,
    control: Control,
    /// Whether systemd is told the successor's PID once it serves.
    tell_systemd: bool,
}

/// Starts `exe` as the successor with `sockets` and waits until it is
/// prepared. `None` (logged) when it refused or did not answer: the
/// running process carries on as it was.
pub async fn prepare(
    exe: PathBuf,
    sockets: &Sockets,
    guarding: bool,
    tell_systemd: bool,
) -> Option<Prepared> {
    let (child, control) = start(&exe, sockets, guarding)?;
    tokio::task::spawn_blocking(move || await_prepared(child, control, tell_systemd))
        .await
        .ok()
        .flatten()
}

/// Starts `exe` with `sockets` (logged either way).
fn start(exe: &std::path::Path, sockets: &Sockets, guarding: bool) -> Option<(Child, Control)> {
    match handoff::spawn(exe, sockets, guarding) {
        Ok((child, control)) => {
            tracing::info!(exe = %exe.display(), pid = child.id(), "handoff: new process started; waiting for it to load its configuration");
            Some((child, control))
        }
        Err(err) => {
            tracing::error!(exe = %exe.display(), %err, "handoff: cannot start the new process");
            None
        }
    }
}

/// Waits (blocking, at most [`SUCCESSOR_WAIT`]) until the started
/// successor is prepared; one that refused or did not answer is stopped
/// and `None` returned (logged).
fn await_prepared(child: Child, control: Control, tell_systemd: bool) -> Option<Prepared> {
    let mut p = Prepared {
        child,
        control,
        tell_systemd,
    };
    match p.control.recv(Some(SUCCESSOR_WAIT)) {
        Ok(Some(Msg::Prepared)) => Some(p),
        Ok(Some(Msg::Refused(why))) => {
            tracing::error!(pid = p.child.id(), %why, "handoff: the new process refused to take over; carrying on with this one");
            p.end();
            None
        }
        other => {
            tracing::error!(pid = p.child.id(), answer = ?other, "handoff: the new process did not prepare; carrying on with this one");
            p.end();
            None
        }
    }
}

impl Prepared {
    /// Stops the successor (by its PID) and reaps it.
    fn end(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Tells it to go (this process has stopped acting) and waits until it
    /// serves; then systemd is told its PID. Its PID, or `None` (logged,
    /// the successor stopped).
    fn go(mut self) -> Option<u32> {
        let pid = self.child.id();
        let answer = self
            .control
            .send(&Msg::Go)
            .and_then(|()| self.control.recv(Some(SUCCESSOR_WAIT)));
        match answer {
            Ok(Some(Msg::Ready)) if !self.tell_systemd => Some(pid),
            Ok(Some(Msg::Ready)) => {
                match sdnotify::notify(&format!("MAINPID={pid}")) {
                    Ok(true) => tracing::info!(pid, "handoff: systemd told the new main PID"),
                    Ok(false) => {}
                    Err(err) => {
                        tracing::error!(pid, %err, "handoff: cannot tell systemd the new main PID")
                    }
                }
                Some(pid)
            }
            other => {
                tracing::error!(pid, answer = ?other, "handoff: the new process did not take over");
                self.end();
                None
            }
        }
    }
}

/// The predecessor's last steps, its runtime gone (no loop of its acts any
/// more) and its state written: hands over to `prepared`, or to a copy of
/// the running binary if that fails; `true` once a successor serves.
pub fn complete(prepared: Prepared, sockets: &Sockets) -> bool {
    let tell_systemd = prepared.tell_systemd;
    if let Some(pid) = prepared.go() {
        tracing::info!(
            pid,
            "handoff: the new process accepts and guards; draining the calls in flight here"
        );
        return true;
    }
    tracing::warn!("handoff: starting the running binary again instead");
    let retry = start(std::path::Path::new(handoff::SELF_EXE), sockets, false)
        .and_then(|(child, control)| await_prepared(child, control, tell_systemd))
        .and_then(Prepared::go);
    match retry {
        Some(pid) => {
            tracing::info!(pid, "handoff: the running binary took over; draining");
            true
        }
        None => {
            tracing::error!(
                "handoff: no process took over; draining and exiting (systemd starts criguard again)"
            );
            false
        }
    }
}

/// The successor's side before it binds anything: says whether it takes
/// over (`refused`: a configuration it cannot load) and waits for `go`.
/// `false`: it must exit.
pub fn successor_prepare(control: &mut Control, refused: Option<String>) -> bool {
    if let Some(why) = refused {
        tracing::error!(%why, "handoff: not taking over");
        let _ = control.send(&Msg::Refused(why));
        return false;
    }
    if let Err(err) = control.send(&Msg::Prepared) {
        tracing::warn!(%err, "handoff: the running process is gone; taking over");
        return true;
    }
    match control.recv(None) {
        Ok(Some(Msg::Go)) => true,
        Ok(None) => {
            tracing::warn!("handoff: the running process ended before handing over; taking over");
            true
        }
        other => {
            tracing::error!(answer = ?other, "handoff: unexpected answer; not taking over");
            false
        }
    }
}

/// The successor serves: tells the predecessor, or systemd when there is
/// none.
pub fn announce_ready(control: Option<&mut Control>) {
    match control {
        Some(c) => {
            if let Err(err) = c.send(&Msg::Ready) {
                tracing::warn!(%err, "handoff: cannot tell the previous process; it drains at its own limit");
            }
        }
        None => {
            if let Err(err) = sdnotify::notify("READY=1") {
                tracing::warn!(%err, "cannot tell systemd criguard is ready");
            }
        }
    }
}

/// Under systemd, a criguard already serving `admin_socket` from this
/// unit's own cgroup is the successor a `systemctl restart` handed over
/// to: systemd is told it is the main process and ready, and this process
/// ends there. `true` when it adopted one.
pub fn adopt(admin_socket: &std::path::Path) -> bool {
    // A process started by a handoff is the successor itself.
    let successor = std::env::var_os(handoff::ENV).is_some();
    if successor || std::env::var_os("NOTIFY_SOCKET").is_none() || !admin_socket.exists() {
        return false;
    }
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return false;
    };
    let asked = rt.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(5),
            criguard::admin::client::serving_pid(admin_socket),
        )
        .await
    });
    let Ok(Ok(pid)) = asked else {
        return false;
    };
    let cgroup = |p: &str| std::fs::read_to_string(format!("/proc/{p}/cgroup")).ok();
    let ours = cgroup("self");
    if pid == 0 || pid == std::process::id() || ours.is_none() || cgroup(&pid.to_string()) != ours {
        return false;
    }
    match sdnotify::notify(&format!("MAINPID={pid}\nREADY=1")) {
        Ok(true) => {
            tracing::info!(
                pid,
                "handoff: the criguard a restart handed over to serves; systemd told it is the main process"
            );
            // systemd reads the message before it sees this process end.
            std::thread::sleep(Duration::from_millis(200));
            true
        }
        _ => false,
    }
}
