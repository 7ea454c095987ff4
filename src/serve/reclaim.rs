//! Reclaim as `serve` wires it: the per-pod usage reader, image GC (with
//! the image uses the proxy records), dead-container GC, and the eviction
//! manager that ranks by that usage and asks both collectors for space
//! before it evicts; plus the two collectors' periodic loops.

use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use criguard::config::EvictionConfig;
use criguard::metrics::Metrics;
use criguard::model::NodeModel;
use criguard::node_state::{ImageUses, NodeStatus};
use criguard::policy::gc::GcPolicy;
use criguard::policy::image_gc::ImageGcPolicy;
use criguard::reclaim::container_gc::ContainerGc;
use criguard::reclaim::evict::EvictionManager;
use criguard::reclaim::image_gc::ImageGc;
use criguard::runtime::Upstream;
use criguard::signals::node::NodeSources;
use criguard::signals::usage::UsageReader;

use super::{Stopping, periodic};
use crate::cli::settings::NodeArgs;

/// The reclaim parts the eviction manager, the admin API and the proxy share.
pub struct Parts {
    /// Per-pod disk and process usage (writable layers through
    /// containerd's snapshots, the content store through its content service).
    pub usage: UsageReader,
    /// Images used through the proxy since the last image collection.
    pub image_uses: ImageUses,
    /// Image GC.
    pub images: ImageGc,
    /// Dead-container GC, measuring what it frees on imagefs and nodefs.
    pub collector: ContainerGc,
}

impl Parts {
    /// The parts for the node `node_args` describes, with containerd's
    /// `snapshotter`, image GC state kept in `state_dir`, and the
    /// container and image GC policies.
    pub fn new(
        upstream: &Upstream,
        node_args: &NodeArgs,
        snapshotter: &str,
        state_dir: &Path,
        (container_gc, image_gc): (GcPolicy, ImageGcPolicy),
        metrics: &Metrics,
    ) -> Self {
        let usage = UsageReader::new(upstream.snapshots(snapshotter), node_args.usage_sources())
            .with_content(upstream.content());
        let image_uses = ImageUses::default();
        let images = ImageGc::new(
            upstream.clone(),
            image_gc,
            node_args.imagefs.clone(),
            Some(state_dir.join("image-gc.json")),
            image_uses.clone(),
            metrics.reclaim.clone(),
        );
        let collector = ContainerGc::new(upstream.clone(), container_gc).with_reclaim(
            vec![node_args.imagefs.clone(), node_args.nodefs.clone()],
            metrics.reclaim.clone(),
        );
        Self {
            usage,
            image_uses,
            images,
            collector,
        }
    }

    /// The eviction manager for `config`, reclaiming at node level with
    /// these collectors and ranking disk pressure by this usage reader.
    pub fn eviction_manager(
        &self,
        config: EvictionConfig,
        sources: NodeSources,
        node: &Arc<RwLock<NodeModel>>,
        upstream: &Upstream,
        status: &Arc<RwLock<NodeStatus>>,
        dry_run: bool,
    ) -> EvictionManager {
        EvictionManager::new(
            config,
            sources,
            node.clone(),
            upstream.clone(),
            status.clone(),
            dry_run,
        )
        .with_node_reclaim(self.collector.clone(), self.images.clone())
        .with_usage(self.usage.clone())
    }
}

/// Image GC every `every` until criguard stops.
pub async fn image_gc_loop(images: ImageGc, every: Duration, stopping: Stopping) {
    periodic(every, stopping.wait(), move || {
        let images = images.clone();
        async move {
            images.round().await;
        }
    })
    .await;
}

/// Dead-container GC every `every` until criguard stops.
pub async fn container_gc_loop(collector: ContainerGc, every: Duration, stopping: Stopping) {
    periodic(every, stopping.wait(), move || {
        let c = collector.clone();
        async move {
            c.round().await;
        }
    })
    .await;
}
