//! `--mode nri`: criguard attached to the runtime as an NRI plugin instead
//! of standing in the kubelet's call path. The same observer as the
//! proxy's decides (admission, `oom_score_adj`) and keeps the node model;
//! everything else (signals, ranking, the kill, stops and GC through the
//! runtime's CRI socket, the API report, admin, metrics) is the same in
//! both modes. After each synchronisation the model is reconciled with the
//! runtime's CRI list (a container created during one can be missing from
//! it, containerd #13698); `Status` tells whether criguard is attached and
//! reconciled (`criguard status --ready`, the DaemonSet's readiness).

use std::sync::{Arc, RwLock};
use std::time::Duration;

use criguard::admin::ConfigStatus;
use criguard::cgroup::fs::CgroupFs;
use criguard::cri::proxy::Ready;
use criguard::intercept::nri::NriObserver;
use criguard::lock::RwLocked;
use criguard::metrics::Metrics;
use criguard::model::NodeModel;
use criguard::nri::attach::{Registration, attach, stay_attached};
use criguard::oom::adjust::raise_processes;
use criguard::runtime::{Upstream, sync};
use tokio::sync::{Notify, watch};

use super::loops::Stopping;
use super::servers::Relay;
use crate::cli::args::ServeCmd;

/// The name criguard registers under.
pub const PLUGIN_NAME: &str = "criguard";

/// How long a failed reconcile waits before it lists again.
const RECONCILE_RETRY: Duration = Duration::from_secs(1);

/// What the reconcile keeps in step besides the observer's model.
struct Link {
    /// The plugin: which containers its synchronisations found unscored.
    plugin: Arc<NriObserver>,
    /// Where those containers' processes are found.
    cgroups: CgroupFs,
    /// The model the observer keeps, reconciled after each synchronisation.
    node: Arc<RwLock<NodeModel>>,
    /// Set once criguard's own rebuild of the model at start is done: a
    /// reconcile waits for it, which would else write the scores that
    /// containers were created with over the raised ones.
    rebuilt: Ready,
    /// The runtime's CRI socket, listed to reconcile.
    upstream: Upstream,
    /// Where `Status` reads whether criguard is attached and reconciled.
    config: watch::Sender<ConfigStatus>,
}

/// Attaches to `--nri-socket` (an error, one line naming the socket and
/// the containerd setting, when no runtime answers there) with the
/// relay's observer and keeps attached across runtime restarts until
/// `stopping`; the reconcile runs beside it.
pub async fn start(
    cmd: &ServeCmd,
    relay: &Relay,
    metrics: &Metrics,
    config: watch::Sender<ConfigStatus>,
    stopping: Stopping,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let observer = relay.observer(metrics);
    let metrics = metrics.nri.clone();
    let reg = Registration {
        socket: cmd.nri_socket.clone(),
        name: PLUGIN_NAME.into(),
        index: cmd.nri_index.clone(),
    };
    let synchronised = Arc::new(Notify::new());
    let handler = Arc::new(
        NriObserver::new(observer)
            .with_metrics(metrics.clone())
            .on_synchronised(synchronised.clone()),
    );
    let link = Link {
        plugin: handler.clone(),
        cgroups: CgroupFs::detect(&cmd.node.cgroup_root),
        node: relay.node.clone(),
        rebuilt: relay.ready.clone(),
        upstream: relay.upstream.clone(),
        config,
    };
    let first = attach(&reg, handler.clone()).await?;
    let config = link.config.clone();
    let attached = move |on: bool| {
        metrics.set_attached(on);
        config.send_modify(|c| {
            if let Some(n) = c.serving.nri.as_mut() {
                n.attached = on;
                // A loss: the next registration synchronises anew.
                n.reconciled &= on;
            }
        });
    };
    let stop = stopping.cancelled_owned();
    Ok(tokio::spawn(async move {
        tokio::select! {
            () = stay_attached(reg, handler, Some(first), attached, stop) => {}
            () = reconcile(synchronised, link) => {}
        }
    }))
}

/// After each synchronisation, the model reconciled with the runtime's CRI
/// list (retried until it succeeds or the next synchronisation comes).
async fn reconcile(synchronised: Arc<Notify>, link: Link) {
    loop {
        synchronised.notified().await;
        link.rebuilt.wait().await;
        loop {
            let started = std::time::Instant::now();
            match sync::sync(&link.node, &link.upstream).await {
                Ok(()) => {
                    let (s, c) = link.node.read_locked().ids();
                    tracing::info!(
                        sandboxes = s.len(),
                        containers = c.len(),
                        ms = started.elapsed().as_millis() as u64,
                        "NRI synchronisation reconciled with the runtime's CRI list"
                    );
                    raise_missed(&link);
                    link.config.send_modify(|c| {
                        if let Some(n) = c.serving.nri.as_mut() {
                            n.reconciled = true;
                        }
                    });
                    break;
                }
                Err(err) => {
                    criguard::log_limited!(warn, %err, "reconcile after the NRI synchronisation failed; listing again");
                    tokio::select! {
                        () = tokio::time::sleep(RECONCILE_RETRY) => {}
                        () = synchronised.notified() => {}
                    }
                }
            }
        }
    }
}

/// The processes of each container the synchronisation found unscored,
/// raised to criguard's score (a container gone since is no failure).
fn raise_missed(link: &Link) {
    for missed in link.plugin.take_missed() {
        let pod = link.node.read_locked().pod_of_container(&missed.container);
        let cgroup =
            pod.and_then(|p| Some(p.containers.get(&missed.container)?.cgroup_path.clone()));
        let Some(cgroup) = cgroup.filter(|c| !c.is_empty()) else {
            continue;
        };
        let raised = raise_processes(&link.cgroups, &cgroup, missed.score);
        if raised.is_ok() {
            let mut m = link.node.write_locked();
            m.set_container_oom_score_adj(&missed.container, missed.score);
        }
        match raised {
            Ok(n) => {
                tracing::info!(container = %missed.container, to = missed.score, processes = n, "oom_score_adj of a container created while criguard was not attached raised to criguard's")
            }
            Err(err) => {
                tracing::warn!(container = %missed.container, %err, "oom_score_adj of a container created while criguard was not attached not raised")
            }
        }
    }
}
