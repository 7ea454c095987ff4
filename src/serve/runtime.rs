//! The runtime side of `serve`: the node model rebuilt from containerd
//! while calls are already relayed (only the observed calls, which need the
//! model, wait for it), then kept in step by containerd's task events
//! (exits at once, kernel OOM kills recorded) and by the periodic sync, the
//! safety net for what passes criguard by.

use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use criguard::cri::proxy::Ready;
use criguard::kube::metrics::KubeMetrics;
use criguard::lock::RwLocked;
use criguard::metrics::Metrics;
use criguard::model::NodeModel;
use criguard::oom::history::RankHistory;
use criguard::oom::kills::{OomKillWatcher, OomKills, kmsg};
use criguard::runtime::track::TaskEvents;
use criguard::runtime::{Upstream, sync};

use super::loops::{Stopping, periodic};

/// Rebuilds `node` from the runtime in the background; `ready` is set
/// once it is done, or once the rebuild ends in any other way. A runtime that is down must not keep the kubelet
/// out: readiness is then given anyway, with what the model holds, and the
/// sync loop fills it once the runtime is up.
pub fn rebuild(
    node: &Arc<RwLock<NodeModel>>,
    upstream: &Upstream,
    ready: Ready,
) -> tokio::task::JoinHandle<()> {
    let (node, upstream) = (node.clone(), upstream.clone());
    tokio::spawn(async move {
        let _ready = ready.set_on_drop();
        let started = std::time::Instant::now();
        match sync::sync(&node, &upstream).await {
            Ok(()) => {
                let (s, c) = node.read_locked().ids();
                tracing::info!(
                    sandboxes = s.len(),
                    containers = c.len(),
                    ms = started.elapsed().as_millis() as u64,
                    "node model rebuilt from the runtime"
                );
            }
            Err(err) => {
                tracing::warn!(%err, "node model not rebuilt yet; serving, the sync loop retries");
            }
        }
    })
}

/// containerd's task events applied to the model, each kernel OOM kill in
/// a pod matched against the adjuster's rankings in `ranks`.
pub fn task_events(
    node: &Arc<RwLock<NodeModel>>,
    upstream: &Upstream,
    cgroup_root: &Path,
    ranks: &Arc<Mutex<RankHistory>>,
    oom_kills: OomKills,
    metrics: &Metrics,
) -> TaskEvents {
    let watcher = OomKillWatcher::new(cgroup_root, ranks.clone(), oom_kills)
        .with_metrics(metrics.oom_kills.clone());
    let log = watcher.wants_kernel_log().then(kmsg::follow);
    let events = TaskEvents::new(node.clone(), upstream.clone())
        .with_watcher(watcher)
        .with_metrics(metrics.events.clone());
    match log {
        Some(Ok(kills)) => events.with_kernel_kills(kills),
        Some(Err(err)) => {
            tracing::warn!(%err, "/dev/kmsg not readable: on cgroup v1 an OOM kill whose cgroup is removed before its counter is read goes unrecorded");
            events
        }
        None => events,
    }
}

/// Syncs the model with the runtime every `every` until criguard stops,
/// counting its pods by source after each sync (`criguard_pods`).
pub async fn sync_loop(
    node: Arc<RwLock<NodeModel>>,
    upstream: Upstream,
    every: Duration,
    stopping: Stopping,
    kube: KubeMetrics,
) {
    periodic(every, stopping.clone().cancelled_owned(), move || {
        let (node, upstream, kube) = (node.clone(), upstream.clone(), kube.clone());
        async move {
            if let Err(err) = sync::sync(&node, &upstream).await {
                tracing::warn!(%err, "node model sync failed");
            }
            kube.count_sources(&node.read_locked());
        }
    })
    .await;
}
