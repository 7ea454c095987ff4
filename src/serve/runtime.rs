//! The runtime side of `serve`: the node model rebuilt from containerd
//! before the first call is served, then kept in step by containerd's task
//! events (exits at once, kernel OOM kills recorded) and by the periodic
//! sync, the safety net for what passes criguard by.

use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use criguard::metrics::Metrics;
use criguard::model::{self, NodeModel};
use criguard::policy::oom_kill::RankHistory;
use criguard::reclaim::oom_kills::{OomKillWatcher, OomKills};
use criguard::runtime::Upstream;

use super::{Stopping, periodic};

/// The model rebuilt from the runtime. A runtime that is down must not keep
/// the kubelet out: criguard then serves anyway, with an empty model, and
/// the sync loop fills it once the runtime is up.
pub async fn rebuild(upstream: &Upstream, capacity: i64) -> NodeModel {
    match model::sync::rebuild(upstream, capacity).await {
        Ok(m) => {
            let (s, c) = m.ids();
            tracing::info!(
                sandboxes = s.len(),
                containers = c.len(),
                "node model rebuilt from the runtime"
            );
            m
        }
        Err(err) => {
            tracing::warn!(%err, "node model not rebuilt yet; serving, the sync loop retries");
            NodeModel::new(capacity)
        }
    }
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
) -> model::events::TaskEvents {
    model::events::TaskEvents::new(node.clone(), upstream.clone())
        .with_oom_kills(
            OomKillWatcher::new(cgroup_root, ranks.clone(), oom_kills)
                .with_metrics(metrics.events.oom_kills.clone()),
        )
        .with_metrics(metrics.events.clone())
}

/// Syncs the model with the runtime every `every` until criguard stops.
pub async fn sync_loop(
    node: Arc<RwLock<NodeModel>>,
    upstream: Upstream,
    every: Duration,
    stopping: Stopping,
) {
    periodic(every, stopping.wait(), move || {
        let (node, upstream) = (node.clone(), upstream.clone());
        async move {
            if let Err(err) = model::sync::sync(&node, &upstream).await {
                tracing::warn!(%err, "node model sync failed");
            }
        }
    })
    .await;
}
