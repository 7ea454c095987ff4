//! `criguard serve`: the proxy and criguard's own loops, composed.
//!
//! [`main`] validates the configuration first (a bad one exits 2 before
//! anything starts, as does one found while starting: the socket systemd
//! passed, the runtime endpoint, a metrics address that is not this
//! machine's) and runs [`serve`] on a current-thread runtime. `serve` binds
//! the sockets ([`servers`]), starts rebuilding the node model from the
//! runtime ([`runtime`]), starts the eviction and garbage-collection loops
//! ([`reclaim`]), the `oom_score_adj` adjuster ([`adjuster`]), containerd's
//! task events, the admin and metrics servers, and relays CRI calls on a
//! thread of its own until SIGTERM; then it stops the relay, the loops, and
//! removes its sockets.
//!
//! Calls are relayed at once, the rebuild going on meanwhile: only the
//! calls criguard observes (`cri::observe`) wait for it, and the loops that
//! read the model (eviction, the adjuster, the sync) start once it is done
//! ([`after_ready`]), so that a restart on a node with hundreds of pods
//! never keeps the kubelet's other calls waiting.

mod adjuster;
mod reclaim;
mod runtime;
mod servers;

use std::future::Future;
use std::process::ExitCode;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use criguard::signals::events::{MemoryEvents, v2::PsiSettings};
use criguard::{admin, config, listen};

use crate::cli::EXIT_CONFIG;
use crate::cli::args::{Endpoints, ServeCmd};
use crate::cli::settings::Settings;

/// Runs `criguard serve` to its end; the exit code: 2 for a configuration
/// error (systemd's `RestartPreventExitStatus=2`), 1 for any other failure.
pub fn main(cmd: ServeCmd) -> ExitCode {
    // Refused before anything starts, with the exit code systemd
    // does not restart on.
    let loaded =
        Settings::load(&cmd.eviction, &cmd.gc, &cmd.kube).and_then(|s| Ok((s, cmd.events.load()?)));
    let (mut settings, psi) = match loaded {
        Ok(c) => c,
        Err(err) => {
            eprintln!("criguard: invalid configuration: {err}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    settings.dry_run |= cmd.dry_run;
    tracing::info!(config = %settings.describe().replace('\n', "; "), memory_events = psi.is_some(), "configuration");
    // The socket unit and the endpoints are configuration too.
    let checked = listen::from_systemd()
        .map_err(anyhow::Error::from)
        .and_then(|a| Ok((a, cmd.endpoints()?)));
    let (activated, endpoints) = match checked {
        Ok(c) => c,
        Err(err) => {
            eprintln!("criguard: invalid configuration: {err}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    match criguard::limits::raise_nofile() {
        Ok(n) => tracing::info!(before = n.before, now = n.after, "open-file limit"),
        Err(err) => tracing::warn!(%err, "cannot raise the open-file limit"),
    }
    let run = || -> anyhow::Result<()> {
        // criguard's own loops (eviction, GC, sync, admin) share one
        // thread; the proxy relays on a thread of its own
        // (cri::server::ProxyThread), so they can never delay a call.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("start tokio runtime")?;
        rt.block_on(serve(activated, endpoints, cmd, settings, psi))
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err:#}");
            eprintln!("criguard: {err:#}");
            // A configuration error found while starting (an
            // address that is not this machine's) is still one.
            if err.downcast_ref::<config::ConfigError>().is_some() {
                ExitCode::from(EXIT_CONFIG)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// What every loop waits on to learn that criguard is stopping.
#[derive(Clone)]
struct Stopping(tokio::sync::watch::Receiver<bool>);

impl Stopping {
    /// Resolves once criguard is stopping.
    fn wait(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.0.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    }
}

/// Runs the proxy and its loops; `settings` and `psi` (memory events on)
/// are the validated forms of `cmd`'s settings.
async fn serve(
    activated: Option<std::os::unix::net::UnixListener>,
    (endpoint, metrics_address): Endpoints,
    cmd: ServeCmd,
    settings: Settings,
    psi: Option<PsiSettings>,
) -> anyhow::Result<()> {
    let Settings {
        eviction,
        container_gc: gc,
        image_gc,
        dry_run,
        kube,
    } = settings;
    let ServeCmd {
        listen: listen_path,
        drain,
        admin_socket,
        snapshotter,
        sync_interval,
        dynamic_oom_score_adj,
        oom_adjust_interval,
        node: node_args,
        state_dir,
        ..
    } = cmd;
    let sources = node_args.sources()?;
    let listeners =
        servers::Listeners::bind(metrics_address, activated, &listen_path, &admin_socket).await?;
    let metrics = criguard::metrics::Metrics::new();
    let upstream = criguard::runtime::Upstream::new(endpoint);
    let node = criguard::model::NodeModel::new(sources.memory_capacity as i64);
    let node = Arc::new(RwLock::new(node));
    let (rebuild_task, ready) = runtime::rebuild(&node, &upstream);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopping = Stopping(stop_rx);
    let evicted_store = criguard::reclaim::evicted::EvictedStore::new(&state_dir);
    let status = Arc::new(RwLock::new(evicted_store.initial_status()));
    let report = match &kube {
        Some(k) => Some(
            criguard::kube::KubeReport::start(k, metrics.kube.clone(), Some(&state_dir))
                .await
                .context("Kubernetes API report")?,
        ),
        None => None,
    };
    let parts = reclaim::Parts::new(
        &upstream,
        &node_args,
        &snapshotter,
        &state_dir,
        (gc.0, image_gc.0),
        &metrics,
    );
    let ranks = Arc::new(std::sync::Mutex::new(
        criguard::policy::oom_kill::RankHistory::default(),
    ));
    let oom_kills = criguard::reclaim::oom_kills::OomKills::default();
    let admin_state = admin::AdminState {
        model: node.clone(),
        upstream: upstream.clone(),
        status: status.clone(),
        usage: parts.usage.clone(),
        ranker: criguard::reclaim::rank::Ranker::new(
            node.clone(),
            sources.clone(),
            Some(parts.usage.clone()),
        )
        .with_thresholds(
            eviction
                .hard
                .iter()
                .chain(&eviction.soft)
                .cloned()
                .collect(),
        ),
        rank_signals: servers::rank_signals(&eviction),
        oom_kills: oom_kills.clone(),
    };
    let events = psi.map(|psi| MemoryEvents::new(sources.clone(), &eviction, psi));
    let manager = parts
        .eviction_manager(eviction, sources, &node, &upstream, &status, dry_run)
        .with_metrics(metrics.eviction.clone())
        .with_evicted_store(evicted_store);
    let manager = match report {
        Some(r) => manager.with_report(r),
        None => manager,
    };
    let evict_task = tokio::spawn(after_ready(
        ready.clone(),
        stopping.wait(),
        manager.run(events, stopping.wait()),
    ));
    let admin_task = tokio::spawn(admin::serve(listeners.admin, admin_state, stopping.wait()));
    let metrics_task = tokio::spawn(servers::metrics(
        listeners.metrics,
        metrics.clone(),
        stopping.wait(),
    ));
    let events_task = tokio::spawn(
        runtime::task_events(
            &node,
            &upstream,
            &node_args.cgroup_root,
            &ranks,
            oom_kills,
            &metrics,
        )
        .run(stopping.wait()),
    );
    // The adjuster ranks every round (the kernel OOM kills are matched
    // against it); it writes scores only with --dynamic-oom-score-adj.
    let adjuster = adjuster::build(
        &node,
        &node_args.cgroup_root,
        &metrics,
        ranks,
        dynamic_oom_score_adj,
    );
    let oom_task = tokio::spawn(after_ready(
        ready.clone(),
        stopping.wait(),
        adjuster::run(adjuster, oom_adjust_interval, stopping.clone()),
    ));
    let image_gc_task = tokio::spawn(reclaim::image_gc_loop(
        parts.images.clone(),
        image_gc.1,
        stopping.clone(),
    ));
    let gc_task = tokio::spawn(reclaim::container_gc_loop(
        parts.collector.clone(),
        gc.1,
        stopping.clone(),
    ));
    let sync_task = tokio::spawn(after_ready(
        ready.clone(),
        stopping.wait(),
        runtime::sync_loop(
            node.clone(),
            upstream.clone(),
            sync_interval,
            stopping.clone(),
        ),
    ));

    tracing::info!(runtime = %upstream.endpoint(), "forwarding CRI calls");
    let proxy = servers::start_proxy(
        listeners.cri,
        &upstream,
        (node, ready),
        status,
        parts.image_uses,
        &metrics,
        drain,
    )?;
    shutdown_signal().await;
    rebuild_task.abort();
    proxy.stop().await;
    let _ = stop_tx.send(true);
    let _ = tokio::join!(
        admin_task,
        sync_task,
        events_task,
        oom_task,
        metrics_task,
        evict_task,
        gc_task,
        image_gc_task
    );
    servers::remove_sockets(listeners.owned_path.as_deref(), &admin_socket)?;
    tracing::info!("stopped");
    Ok(())
}

/// Runs `run` once the node model is rebuilt (`ready` true, or its sender
/// gone), or nothing when `stopped` resolves first.
async fn after_ready(
    mut ready: tokio::sync::watch::Receiver<bool>,
    stopped: impl Future<Output = ()> + Send,
    run: impl Future<Output = ()> + Send,
) {
    let go = tokio::select! {
        _ = ready.wait_for(|r| *r) => true,
        () = stopped => false,
    };
    if go {
        run.await;
    }
}

/// Runs `round` every `every` until `stopped` resolves; a round in progress
/// finishes first, and a slow round delays the next instead of piling up.
async fn periodic<F, Fut>(every: Duration, stopped: impl Future<Output = ()>, mut round: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    tokio::pin!(stopped);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => round().await,
            () = &mut stopped => return,
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
