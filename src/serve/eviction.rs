//! Reclaim as `serve` wires it: the per-pod usage reader, image GC (with
//! the image uses the proxy records), dead-container GC, and the eviction
//! manager that ranks by that usage and asks both collectors for space
//! before it evicts; plus the two collectors' periodic loops, which read
//! the settings in effect at each round ([`Live`]), so that a reload
//! changes their policies and periods without a restart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use criguard::config::EvictionConfig;
use criguard::config::image_gc::ImageGcPolicy;
use criguard::eviction::killer::RuntimeKiller;
use criguard::eviction::rank::Ranker;
use criguard::eviction::seams::SystemClock;
use criguard::eviction::{EvictionManager, NodeStatus, Seams};
use criguard::gc::collectors::Collectors;
use criguard::gc::container_policy::GcPolicy;
use criguard::gc::containers::ContainerGc;
use criguard::gc::image_uses::ImageUses;
use criguard::gc::images::ImageGc;
use criguard::metrics::Metrics;
use criguard::model::NodeModel;
use criguard::runtime::Upstream;
use criguard::signals::node::NodeSources;
use criguard::signals::usage::UsageReader;
use tokio::sync::watch;

use super::loops::Stopping;
use crate::cli::args::NodeArgs;
use crate::cli::settings::Settings;

/// The reclaim parts that live as long as `serve`, whatever the settings.
pub struct Parts {
    /// Per-pod disk and process usage (writable layers through
    /// containerd's snapshots, the content store through its content service).
    pub usage: UsageReader,
    /// Images used through the proxy since the last image collection.
    pub image_uses: ImageUses,
    upstream: Upstream,
    filesystems: (PathBuf, PathBuf),
    state_file: PathBuf,
    metrics: Metrics,
}

/// What the periodic collectors and the eviction manager run with now:
/// the settings and the collectors built for their policies. Published on
/// one watch channel (`None` while criguard fails open: nothing runs).
#[derive(Clone)]
pub struct Live {
    /// The settings in effect.
    pub settings: Arc<Settings>,
    /// Dead-container GC with the policy in effect.
    pub collector: ContainerGc,
    /// Image GC with the policy in effect.
    pub images: ImageGc,
    /// The image GC policy `images` was built with.
    pub image_policy: ImageGcPolicy,
}

impl Parts {
    /// The parts for the node `node_args` describes, with containerd's
    /// `snapshotter` and image GC state kept in `state_dir`.
    pub fn new(
        upstream: &Upstream,
        node_args: &NodeArgs,
        snapshotter: &str,
        state_dir: &Path,
        metrics: &Metrics,
    ) -> Self {
        let usage = UsageReader::new(upstream.snapshots(snapshotter), node_args.usage_sources())
            .with_content(upstream.content());
        Self {
            usage,
            image_uses: ImageUses::default(),
            upstream: upstream.clone(),
            filesystems: (node_args.imagefs.clone(), node_args.nodefs.clone()),
            state_file: state_dir.join("image-gc.json"),
            metrics: metrics.clone(),
        }
    }

    /// Dead-container GC with `policy`, measuring what it frees on imagefs
    /// and nodefs.
    pub fn collector(&self, policy: GcPolicy) -> ContainerGc {
        let (imagefs, nodefs) = self.filesystems.clone();
        ContainerGc::new(self.upstream.clone(), policy)
            .with_reclaim(vec![imagefs, nodefs], self.metrics.gc.clone())
    }

    /// Image GC with `policy` (its last-used times read from the state
    /// file, the proxy's image uses shared).
    pub fn images(&self, policy: ImageGcPolicy) -> ImageGc {
        ImageGc::new(
            self.upstream.clone(),
            policy,
            self.filesystems.0.clone(),
            Some(self.state_file.clone()),
            self.image_uses.clone(),
            self.metrics.gc.clone(),
        )
    }

    /// What runs with `settings`; the image collector of `previous` is
    /// kept when its policy has not changed (its memory stays).
    pub fn live(&self, settings: Arc<Settings>, previous: Option<&Live>) -> Live {
        let image_policy = settings.image_gc.0;
        let images = match previous {
            Some(p) if p.image_policy == image_policy => p.images.clone(),
            _ => self.images(image_policy),
        };
        Live {
            collector: self.collector(settings.container_gc.0),
            images,
            image_policy,
            settings,
        }
    }

    /// The eviction manager for `config` with its real collaborators:
    /// observing `sources`, ranking with the model, `sources` and this usage
    /// reader (disk pressure by per-pod usage), stopping pods through the
    /// runtime and their cgroups, reclaiming at node level with `live`'s
    /// collectors.
    pub fn eviction_manager(
        &self,
        config: EvictionConfig,
        sources: NodeSources,
        (node, status): (&Arc<RwLock<NodeModel>>, &Arc<RwLock<NodeStatus>>),
        live: &Live,
    ) -> EvictionManager {
        let seams = Seams {
            rank: Arc::new(Ranker::new(
                node.clone(),
                sources.clone(),
                Some(self.usage.clone()),
            )),
            killer: Arc::new(RuntimeKiller::new(
                self.upstream.clone(),
                sources.cgroups.clone(),
            )),
            clock: Arc::new(SystemClock),
            signals: Arc::new(sources.clone()),
        };
        EvictionManager::new(
            config,
            seams,
            node.clone(),
            status.clone(),
            live.settings.dry_run,
        )
        .with_node_reclaim(Arc::new(self.node_reclaim(live, &sources)))
    }

    /// Node-level reclaim with `live`'s collectors, on the filesystems of
    /// `sources`.
    pub fn node_reclaim(&self, live: &Live, sources: &NodeSources) -> Collectors {
        Collectors {
            containers: live.collector.clone(),
            images: live.images.clone(),
            nodefs: sources.nodefs.clone(),
            imagefs: sources.imagefs.clone(),
        }
    }
}

/// Runs `round` with the settings in effect every `period` of them, from
/// the first valid settings on, until criguard stops; a new period takes
/// effect at once (the next round one new period after the last).
async fn live_periodic<F, Fut>(
    mut live: watch::Receiver<Option<Live>>,
    period: fn(&Settings) -> Duration,
    stopping: Stopping,
    mut round: F,
) where
    F: FnMut(Live) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let stopped = stopping.clone().cancelled_owned();
    tokio::pin!(stopped);
    let mut last: Option<tokio::time::Instant> = None;
    loop {
        let current = live.borrow_and_update().clone();
        let next = match (&current, last) {
            (None, _) => None,
            (Some(_), None) => Some(tokio::time::Instant::now()),
            (Some(l), Some(at)) => Some(at + period(&l.settings)),
        };
        let sleep = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = sleep => {
                if let Some(l) = current {
                    last = Some(tokio::time::Instant::now());
                    round(l).await;
                }
            }
            changed = live.changed() => if changed.is_err() { return },
            () = &mut stopped => return,
        }
    }
}

/// Image GC every image GC period, with the policy in effect.
pub async fn image_gc_loop(live: watch::Receiver<Option<Live>>, stopping: Stopping) {
    live_periodic(
        live,
        |s| s.image_gc.1,
        stopping,
        |l| async move {
            l.images.round().await;
        },
    )
    .await;
}

/// Dead-container GC every container GC period, with the policy in effect.
pub async fn container_gc_loop(live: watch::Receiver<Option<Live>>, stopping: Stopping) {
    live_periodic(
        live,
        |s| s.container_gc.1,
        stopping,
        |l| async move {
            l.collector.round().await;
        },
    )
    .await;
}
