//! `criguard serve`: the proxy and criguard's own loops, composed.
//!
//! criguard must never make the node less stable than containerd alone,
//! so a configuration it cannot accept does not stop it: it **fails
//! open**. The settings split in two:
//!
//! - **relay essentials**, without which there is nothing to relay: the
//!   CRI socket (`--listen`, or the socket systemd passes), the runtime
//!   (`--runtime-endpoint`) and the admin socket (`--admin-socket`), and
//!   the command line's own shape (an unknown flag, a value clap cannot
//!   parse). A bad one exits 2 before anything starts
//!   (systemd's `RestartPreventExitStatus=2`);
//! - **guardian settings**, everything else: the configuration file, the
//!   eviction, GC, dry-run, memory-event and API-report flags, the
//!   kubeconfig, `--metrics-address`. A bad one leaves criguard relaying
//!   every call unchanged, with no eviction, GC, patch, refusal or API
//!   report ([`guard`]), and saying so: an error line naming the key and
//!   value at start and every minute, `criguard_config_valid 0`, and the
//!   admin API's `Status` (`criguard status`).
//!
//! SIGHUP (`systemctl reload criguard`) reads the file and the kubeconfig
//! again with the same command line (flags still override the file): a
//! valid configuration takes effect at once, without dropping a connection
//! or forgetting the model, the evicted pods or the pressure memory, and
//! starts the guardian if criguard was failing open; an invalid one is
//! refused, logged and counted, and the running configuration stays.
//!
//! [`main`] checks the relay essentials, loads the guardian's settings and
//! runs [`serve`] on a current-thread runtime. `serve` builds criguard
//! ([`App::build`]: binds the sockets ([`servers`]) and makes the parts,
//! starting nothing), spawns it ([`App::spawn`]: starts rebuilding the node
//! model from the runtime ([`runtime`]), the guardian when the settings are
//! valid ([`guard`]), containerd's task events, the admin and metrics
//! servers, and relays CRI calls on a thread of its own), serves until
//! SIGTERM ([`Running::until_stopped`]), then stops the relay, the loops,
//! and removes its sockets ([`Running::stop`]).
//!
//! Calls are relayed at once, the rebuild going on meanwhile: only the
//! calls criguard observes (`cri::observe`) wait for it, and the loops that
//! read the model (eviction, the adjuster, the sync) start once it is done
//! ([`after_ready`]), so that a restart on a node with hundreds of pods
//! never keeps the kubelet's other calls waiting.

mod config;
mod eviction;
mod guard;
mod handoff;
mod loops;
mod nri;
mod oom;
mod runtime;
mod servers;

use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, RwLock};

use anyhow::Context;
use criguard::admin::ConfigStatus;
use criguard::config::ConfigError;
use criguard::cri::proxy::Ready;
use criguard::eviction::NodeStatus;
use criguard::eviction::rank::Ranker;
use criguard::eviction::store::EvictedStore;
use criguard::gc::image_uses::ImageUses;
use criguard::metrics::Metrics;
use criguard::model::NodeModel;
use criguard::oom::history::RankHistory;
use criguard::oom::kills::OomKills;
use criguard::runtime::track::TaskEvents;
use criguard::runtime::{RuntimeEndpoint, Upstream};
use criguard::signals::node::NodeSources;
use criguard::{admin, listen};
use tokio::sync::watch;

use crate::cli::EXIT_CONFIG;
use crate::cli::args::ServeCmd;
use crate::cli::settings::Guardian;
use config::{
    Notice, announce, complain, complaint_period, complaints, initial_config, load, node_notice,
    reload, serving,
};
use loops::{Stopping, after_ready};

/// Ignores SIGHUP, SIGUSR1 and SIGUSR2 until serve's own handlers are
/// installed.
fn ignore_early_signals() {
    // A SIGHUP (`systemctl reload`) before serve's own handler is
    // installed must not end criguard (its default action); the
    // configuration read next is then already the one the reload asked
    // for. A SIGUSR1 or SIGUSR2 (a handoff) likewise.
    for sig in [
        nix::sys::signal::Signal::SIGHUP,
        nix::sys::signal::Signal::SIGUSR1,
        nix::sys::signal::Signal::SIGUSR2,
    ] {
        // SAFETY: setting a signal's disposition to SIG_IGN runs no code of ours.
        if let Err(err) =
            unsafe { nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigIgn) }
        {
            tracing::warn!(%err, ?sig, "cannot ignore the signal until its handler is installed");
        }
    }
}

/// The CRI socket systemd passed (if any) and what a previous criguard
/// handed over (if anything).
type Given = (
    Option<std::os::unix::net::UnixListener>,
    Option<criguard::handoff::Inherited>,
);

/// The relay essentials: the sockets a previous criguard handed over (or
/// systemd passed) and the runtime.
fn essentials(cmd: &ServeCmd) -> anyhow::Result<(Given, RuntimeEndpoint)> {
    criguard::handoff::inherited()
        .map_err(anyhow::Error::msg)
        .and_then(|inherited| match inherited {
            Some(i) => Ok((None, Some(i))),
            None => Ok((listen::from_systemd()?, None)),
        })
        .and_then(|(a, i)| Ok(((a, i), cmd.runtime_endpoint()?)))
}

/// Runs `criguard serve` to its end; the exit code: 2 for a bad relay
/// essential (systemd's `RestartPreventExitStatus=2`), 1 for any other
/// failure to start. A bad guardian setting does not stop it: it fails open.
pub fn main(cmd: ServeCmd, flag_error: Option<ConfigError>) -> ExitCode {
    ignore_early_signals();
    if handoff::adopt(&cmd.admin_socket) {
        return ExitCode::SUCCESS;
    }
    // The relay essentials, refused before anything starts with the exit
    // code systemd does not restart on.
    let ((activated, mut inherited), endpoint) = match essentials(&cmd) {
        Ok(c) => c,
        Err(err) => {
            eprintln!("criguard: invalid configuration: {err}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    // A flag clap could not parse (dropped), else a bad metrics address:
    // flags stay as they are until a restart, so this error does too.
    let metrics_address = cmd.metrics_address();
    let flag_error = flag_error.or_else(|| metrics_address.as_ref().err().cloned());
    let loaded = load(&cmd, flag_error.as_ref());
    match &loaded {
        Ok(g) => {
            tracing::info!(config = %g.describe().replace('\n', "; "), "configuration")
        }
        Err(e) => complain(e, "at start"),
    }
    if let Some(i) = inherited.as_mut() {
        let refused = match &loaded {
            Err(e) if i.predecessor_guarding => Some(e.to_string()),
            _ => None,
        };
        if !handoff::successor_prepare(&mut i.control, refused) {
            return ExitCode::FAILURE;
        }
    }
    match criguard::limits::raise_nofile() {
        Ok(n) => tracing::info!(before = n.before, now = n.after, "open-file limit"),
        Err(err) => tracing::warn!(%err, "cannot raise the open-file limit"),
    }
    match criguard::limits::lock_memory() {
        Ok(()) => tracing::info!("memory locked as it is touched (mlockall, MCL_ONFAULT)"),
        Err(err) => {
            tracing::info!(%err, "memory not locked: under memory pressure criguard's pages may be evicted (needs CAP_IPC_LOCK or LimitMEMLOCK=infinity)")
        }
    }
    let run = || -> anyhow::Result<Option<HandedOver>> {
        // criguard's own loops (eviction, GC, sync, admin) share one
        // thread; the proxy relays on a thread of its own
        // (cri::server::ProxyThread), so they can never delay a call.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("start tokio runtime")?;
        let metrics = metrics_address.as_ref().ok().copied().flatten();
        rt.block_on(serve(
            (activated, inherited),
            endpoint,
            cmd,
            (loaded, flag_error),
            metrics,
        ))
        // The runtime ends here: every task of this process's is gone
        // before a handoff completes.
    };
    match run() {
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some(handed)) => handed.finish(),
        Err(err) => {
            tracing::error!("{err:#}");
            eprintln!("criguard: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the proxy and its loops; `loaded` is the guardian's settings or
/// why criguard fails open, with the flag error that stays until a restart
/// (if any); `metrics_address` where metrics are served (`None`: not at all).
/// `Some` when it handed over to a successor: what is left to do once
/// the runtime is gone ([`HandedOver::finish`]).
async fn serve(
    given: Given,
    endpoint: RuntimeEndpoint,
    cmd: ServeCmd,
    loaded: (Result<Guardian, ConfigError>, Option<ConfigError>),
    metrics_address: Option<std::net::SocketAddr>,
) -> anyhow::Result<Option<HandedOver>> {
    let app = App::build(given, endpoint, cmd, loaded, metrics_address).await?;
    let mut running = app.spawn().await?;
    match running.until_stopped().await {
        None => running.stop().await.map(|()| None),
        Some(successor) => Ok(Some(running.quiesce(successor).await)),
    }
}

/// A predecessor whose loops have stopped, its successor prepared: what is
/// left of it once its runtime is gone.
struct HandedOver {
    successor: handoff::Prepared,
    handoff: criguard::handoff::Sockets,
    proxy: Option<criguard::cri::server::ProxyThread>,
    sockets: servers::OwnedSockets,
}

impl HandedOver {
    /// Writes the state still pending, hands over, drains the calls in
    /// flight and ends: 0 once a successor serves, 1 when none took over
    /// (systemd starts criguard again).
    fn finish(self) -> ExitCode {
        for path in criguard::statefile::flush_pending() {
            tracing::error!(path = %path.display(), "handing over with a state file still not written (the state directory is full or unwritable): what it records is lost");
        }
        let served = handoff::complete(self.successor, &self.handoff);
        if served {
            self.sockets.disown();
        }
        if let Some(proxy) = self.proxy {
            futures::executor::block_on(proxy.stop());
        }
        tracing::info!(handed_over = served, "stopped");
        if served {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }
}

/// criguard, built by [`App::build`] from the command line and the
/// configuration: the sockets bound and the parts made, nothing running yet
/// but the SIGHUP handler. [`App::spawn`] starts it.
struct App {
    cmd: ServeCmd,
    /// The guardian's settings, or why criguard fails open.
    loaded: Result<Guardian, ConfigError>,
    /// A flag refused at start: it stays until a restart.
    flag_error: Option<ConfigError>,
    hangup: tokio::signal::unix::Signal,
    /// SIGUSR2 and SIGUSR1: hand over to the binary on disk (SIGUSR1: for
    /// a `systemctl restart`).
    usr: (tokio::signal::unix::Signal, tokio::signal::unix::Signal),
    /// The CRI and admin sockets; their files are removed however serve ends.
    listeners: servers::Listeners,
    metrics_listener: Option<tokio::net::TcpListener>,
    /// Duplicates of the listeners for a successor (`None`: they could not
    /// be made, no handoff).
    handoff: Option<criguard::handoff::Sockets>,
    /// The predecessor's control socket, when this process took over.
    predecessor: Option<criguard::handoff::Control>,
    parts: Parts,
}

/// The parts of criguard and the state they share, made by [`Parts::build`].
struct Parts {
    metrics: Metrics,
    upstream: Upstream,
    node: Arc<RwLock<NodeModel>>,
    /// The model's readiness, set by the rebuild.
    ready: Ready,
    /// Cancelled when criguard stops.
    stop: Stopping,
    status: Arc<RwLock<NodeStatus>>,
    image_uses: ImageUses,
    /// The proxy changes requests only while this is true.
    guarding: Arc<AtomicBool>,
    events: TaskEvents,
    admin: admin::AdminState,
    guard: guard::Handles,
    config: watch::Sender<ConfigStatus>,
    notice: (watch::Sender<Notice>, watch::Receiver<Notice>),
}

/// What runs once [`App::spawn`] returns, kept to be stopped in order.
struct Running {
    cmd: ServeCmd,
    flag_error: Option<ConfigError>,
    hangup: tokio::signal::unix::Signal,
    metrics: Metrics,
    guard: guard::Guard,
    config: watch::Sender<ConfigStatus>,
    notice: watch::Sender<Notice>,
    rebuild: tokio::task::JoinHandle<()>,
    proxy: Option<criguard::cri::server::ProxyThread>,
    stop: Stopping,
    /// The admin, sync, events, metrics, complaint and notice loops.
    tasks: Vec<tokio::task::JoinHandle<()>>,
    sockets: servers::OwnedSockets,
    usr: (tokio::signal::unix::Signal, tokio::signal::unix::Signal),
    handoff: Option<criguard::handoff::Sockets>,
    binary: handoff::Binary,
}

impl App {
    /// Binds the sockets and makes the parts; the SIGHUP handler is
    /// installed first of all.
    async fn build(
        (activated, inherited): Given,
        endpoint: RuntimeEndpoint,
        cmd: ServeCmd,
        (loaded, flag_error): (Result<Guardian, ConfigError>, Option<ConfigError>),
        metrics_address: Option<std::net::SocketAddr>,
    ) -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        // First of all: the default action of SIGHUP, SIGUSR1 or SIGUSR2 would
        // end criguard.
        let hangup = signal(SignalKind::hangup()).context("install the SIGHUP handler")?;
        let usr = (
            signal(SignalKind::user_defined2()).context("install the SIGUSR2 handler")?,
            signal(SignalKind::user_defined1()).context("install the SIGUSR1 handler")?,
        );
        let (given, metrics_listener, flag_error, predecessor) = match inherited {
            Some(i) => {
                let metrics = i
                    .metrics
                    .map(|l| {
                        l.set_nonblocking(true)
                            .and_then(|()| tokio::net::TcpListener::from_std(l))
                    })
                    .transpose()
                    .context("register the metrics socket handed over")?;
                let given = servers::Given::Handoff {
                    cri: i.cri,
                    admin: i.admin,
                    own_cri: i.own_cri,
                };
                (given, metrics, flag_error, Some(i.control))
            }
            None => {
                let (m, f) = bind_metrics(metrics_address, flag_error).await?;
                let given = activated.map_or(servers::Given::Nothing, servers::Given::Systemd);
                (given, m, f, None)
            }
        };
        let loaded = match (loaded, &flag_error) {
            (Ok(_), Some(e)) => Err(e.clone()),
            (l, _) => l,
        };
        let sources = cmd.node.sources()?;
        if let Ok(g) = &loaded {
            config::absent_signals(&g.settings.eviction, &sources);
        }
        // As an NRI plugin criguard relays nothing: no CRI socket of its own.
        let listen = (cmd.mode == crate::cli::args::Mode::Proxy).then_some(cmd.listen.as_path());
        let listeners = servers::Listeners::bind(given, listen, &cmd.admin_socket).await?;
        // From here on, any way out of serve removes the sockets bound above.
        let handoff = keep_for_handoff(&listeners, metrics_listener.as_ref());
        tighten_state_dir(&cmd.state_dir);
        let parts = Parts::build(&cmd, endpoint, sources);
        let serving = serving(&parts.upstream, &listeners, metrics_listener.as_ref(), &cmd);
        parts.config.send_modify(|c| c.serving = serving);
        Ok(Self {
            cmd,
            loaded,
            flag_error,
            hangup,
            usr,
            listeners,
            metrics_listener,
            handoff,
            predecessor,
            parts,
        })
    }

    /// Starts it: the model's rebuild, the guardian with the settings
    /// loaded (or failing open), criguard's loops, then the relay.
    async fn spawn(self) -> anyhow::Result<Running> {
        let (p, cmd) = (self.parts, self.cmd);
        let ready = p.ready;
        let rebuild = runtime::rebuild(&p.node, &p.upstream, ready.clone());
        let mut guard = guard::Guard::new(p.guard);
        let started = match self.loaded {
            Ok(g) => guard.apply(&g).await.map(|_| g),
            Err(e) => Err(e),
        };
        let (notice, notice_rx) = p.notice;
        announce(&cmd, started.as_ref(), &p.config, &notice);
        let stopping = p.stop.clone();
        let (node, upstream) = (p.node.clone(), p.upstream.clone());
        let sync = runtime::sync_loop(
            node,
            upstream,
            cmd.sync_interval,
            stopping.clone(),
            p.metrics.kube.clone(),
        );
        let period = complaint_period();
        let metrics_listener = self.metrics_listener;
        let mut tasks = vec![
            tokio::spawn(node_notice(notice_rx, period, stopping.clone())),
            tokio::spawn(admin::serve(
                self.listeners.admin,
                p.admin,
                stopping.clone().cancelled_owned(),
            )),
            tokio::spawn(servers::metrics(
                metrics_listener,
                p.metrics.clone(),
                stopping.clone().cancelled_owned(),
            )),
            tokio::spawn(p.events.run(stopping.clone().cancelled_owned())),
            tokio::spawn(after_ready(
                ready.clone(),
                stopping.clone().cancelled_owned(),
                sync,
            )),
            tokio::spawn(complaints(p.config.subscribe(), period, stopping.clone())),
        ];
        tracing::info!(runtime = %p.upstream.endpoint(), "forwarding CRI calls");
        let relay = servers::Relay {
            upstream: p.upstream,
            node: p.node,
            ready,
            status: p.status,
            guarding: p.guarding,
            image_uses: p.image_uses,
            drain: cmd.drain,
            max_connections: cmd.max_connections,
        };
        if cmd.mode == crate::cli::args::Mode::Nri {
            let config = p.config.clone();
            tasks.push(nri::start(&cmd, &relay, &p.metrics, config, stopping.clone()).await?);
        }
        let proxy = (self.listeners.cri)
            .map(|l| relay.spawn(l, &p.metrics))
            .transpose()?;
        let mut predecessor = self.predecessor;
        handoff::announce_ready(predecessor.as_mut());
        Ok(Running {
            cmd,
            flag_error: self.flag_error,
            hangup: self.hangup,
            metrics: p.metrics,
            guard,
            config: p.config,
            notice,
            rebuild,
            proxy,
            stop: p.stop,
            tasks,
            sockets: self.listeners.owned,
            usr: self.usr,
            handoff: self.handoff,
            binary: handoff::Binary::at_start(),
        })
    }
}

/// Duplicates of the listeners for a later handoff; `None` (logged) when
/// they cannot be made.
fn keep_for_handoff(
    l: &servers::Listeners,
    metrics: Option<&tokio::net::TcpListener>,
) -> Option<criguard::handoff::Sockets> {
    use std::os::fd::AsFd;
    let Some(cri) = &l.cri else {
        tracing::info!(
            "no CRI socket (--mode nri): a restart attaches again instead of handing over"
        );
        return None;
    };
    let kept = criguard::handoff::Sockets::keep(
        cri.as_fd(),
        l.admin.as_fd(),
        metrics.map(AsFd::as_fd),
        l.own_cri,
    );
    kept.inspect_err(|err| tracing::warn!(%err, "cannot keep the sockets for a handoff: SIGUSR2 and a reload after an upgrade restart nothing"))
        .ok()
}

impl Parts {
    /// Makes the parts from the command line: the metrics, the runtime
    /// client, the node model (empty until the rebuild), the evicted pods
    /// and conditions (from the state directory), the reclaim parts, the
    /// task-events loop with its OOM kill recorder, the admin API's state
    /// and the guardian's handles.
    fn build(cmd: &ServeCmd, endpoint: RuntimeEndpoint, sources: NodeSources) -> Self {
        let metrics = Metrics::new();
        let upstream = Upstream::new(endpoint);
        let node = Arc::new(RwLock::new(NodeModel::new(sources.memory_capacity as i64)));
        let ready = Ready::default();
        let stop = Stopping::new();
        let status = EvictedStore::new(&cmd.state_dir).initial_status();
        let status = Arc::new(RwLock::new(status));
        let parts = eviction::Parts::new(
            &upstream,
            &cmd.node,
            &cmd.snapshotter,
            &cmd.state_dir,
            &metrics,
        );
        let ranks = Arc::new(Mutex::new(RankHistory::default()));
        let oom_kills = OomKills::default();
        let (config, config_rx) = watch::channel(initial_config(cmd));
        let admin = admin::AdminState {
            model: node.clone(),
            upstream: upstream.clone(),
            status: status.clone(),
            usage: parts.usage.clone(),
            ranker: Ranker::new(node.clone(), sources.clone(), Some(parts.usage.clone())),
            oom_kills: oom_kills.clone(),
            config: config_rx,
            kube: metrics.kube.clone(),
        };
        let cgroup_root = &cmd.node.cgroup_root;
        let events =
            runtime::task_events(&node, &upstream, cgroup_root, &ranks, oom_kills, &metrics);
        let image_uses = parts.image_uses.clone();
        let guarding = Arc::new(AtomicBool::new(false));
        let guard = guard::Handles {
            node: node.clone(),
            status: status.clone(),
            sources,
            parts,
            metrics: metrics.clone(),
            ready: ready.clone(),
            stopping: stop.clone(),
            ranks,
            cgroup_root: cgroup_root.clone(),
            oom: (cmd.dynamic_oom_score_adj, cmd.oom_adjust_interval),
            state_dir: cmd.state_dir.clone(),
            guarding: guarding.clone(),
        };
        Self {
            metrics,
            upstream,
            node,
            ready,
            stop,
            status,
            image_uses,
            guarding,
            events,
            admin,
            guard,
            config,
            notice: watch::channel(None),
        }
    }
}

impl Running {
    /// Relays until SIGTERM or SIGINT (`None`) or until a successor is
    /// prepared to take over (SIGUSR2, SIGUSR1 for a restart, or SIGHUP
    /// with the binary replaced on disk); reloads the configuration at any
    /// other SIGHUP.
    async fn until_stopped(&mut self) -> Option<handoff::Prepared> {
        let shutdown = shutdown_signal();
        tokio::pin!(shutdown);
        loop {
            let mut tell_systemd = true;
            let exe = tokio::select! {
                () = &mut shutdown => return None,
                _ = self.hangup.recv() => match self.binary.replaced() {
                    Some(exe) => {
                        tracing::info!(exe = %exe.display(), "SIGHUP: the binary was replaced on disk; handing over to it");
                        exe
                    }
                    None => {
                        let channels = (&self.config, &self.notice);
                        let flag_error = self.flag_error.as_ref();
                        reload(&self.cmd, &mut self.guard, channels, &self.metrics, flag_error).await;
                        continue;
                    }
                },
                _ = self.usr.0.recv() => {
                    tracing::info!("SIGUSR2: handing over to a new process");
                    self.binary.on_disk()
                }
                _ = self.usr.1.recv() => {
                    tracing::info!("SIGUSR1: handing over to a new process for a restart");
                    tell_systemd = false;
                    self.binary.on_disk()
                }
            };
            let Some(sockets) = &self.handoff else {
                tracing::error!("handoff unavailable (the sockets could not be kept); carrying on");
                continue;
            };
            // A restart asked for takes the configuration as it is (failing
            // open on a bad one, as any start); an upgrade or SIGUSR2 is
            // refused by a successor that cannot load it.
            let refuse_bad = self.guard.running() && tell_systemd;
            if let Some(p) = handoff::prepare(exe, sockets, refuse_bad, tell_systemd).await {
                return Some(p);
            }
        }
    }

    /// Stops everything but the relay, which keeps accepting until the
    /// successor serves: the rebuild, criguard's loops and the guardian
    /// (each finishing the round it is in).
    async fn quiesce(mut self, successor: handoff::Prepared) -> HandedOver {
        self.rebuild.abort();
        self.stop.cancel();
        futures::future::join_all(self.tasks).await;
        if let Err(err) = self.guard.join().await {
            tracing::error!("{err:#}");
        }
        let handoff = self
            .handoff
            .take()
            .expect("a handoff is prepared only with the sockets kept");
        HandedOver {
            successor,
            handoff,
            proxy: self.proxy,
            sockets: self.sockets,
        }
    }

    /// Stops in order: the rebuild, the relay (draining its connections),
    /// criguard's loops, the guardian; then writes what state is pending
    /// and removes the sockets.
    async fn stop(self) -> anyhow::Result<()> {
        self.rebuild.abort();
        if let Some(proxy) = self.proxy {
            proxy.stop().await;
        }
        self.stop.cancel();
        futures::future::join_all(self.tasks).await;
        self.guard.join().await?;
        let unwritten = tokio::task::spawn_blocking(criguard::statefile::flush_pending)
            .await
            .unwrap_or_default();
        for path in unwritten {
            tracing::error!(path = %path.display(), "stopping with a state file still not written (the state directory is full or unwritable): what it records is lost");
        }
        self.sockets.remove()?;
        tracing::info!("stopped");
        Ok(())
    }
}

/// Binds the metrics port. A metrics address that does not parse, or is
/// not this machine's, fails open too; it stays refused until a restart
/// (the flag cannot change meanwhile), as the flag error returned.
async fn bind_metrics(
    address: Option<std::net::SocketAddr>,
    flag_error: Option<ConfigError>,
) -> anyhow::Result<(Option<tokio::net::TcpListener>, Option<ConfigError>)> {
    Ok(match servers::bind_metrics(address).await? {
        Ok(l) => (l, flag_error),
        Err(e) => {
            complain(&e, "at start");
            (None, flag_error.or(Some(e)))
        }
    })
}

/// Makes an existing state directory private (0700) as the README promises,
/// logging the mode it had; a directory criguard creates is made 0700. A
/// failure is logged: the state files are still written 0600.
fn tighten_state_dir(dir: &std::path::Path) {
    match criguard::statefile::make_dir_private(dir) {
        Ok(Some(was)) => tracing::warn!(
            path = %dir.display(),
            was = format!("{was:04o}"),
            now = format!("{:04o}", criguard::statefile::DIR_MODE),
            "state directory was open to others; made private"
        ),
        Ok(None) => {}
        Err(err) => {
            tracing::warn!(path = %dir.display(), %err, "cannot make the state directory private")
        }
    }
}

/// Resolves at SIGTERM or SIGINT, logging which.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: draining"),
        _ = int.recv() => tracing::info!("SIGINT: draining"),
    }
}
