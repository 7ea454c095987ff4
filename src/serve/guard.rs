//! The guardian: everything criguard does beyond relaying (eviction, node
//! reclaim, the `oom_score_adj` patch and adjuster, admission refusals, the
//! API report), started with the first configuration criguard accepts and
//! told of each one accepted after it.
//!
//! Until then criguard fails open: the proxy forwards every request
//! unchanged (the observer's `guarding` flag is off), no loop that acts on
//! the node runs, and the configuration's error is published for the
//! admin API, the metric and the complaint in the log. The model, task
//! events and the admin API run either way: they only read.
//!
//! The settings in effect live in one place, a watch channel of [`Live`]
//! that the collectors' loops read each round; the eviction manager gets
//! each new [`Reloadable`] on a channel of its own and keeps its state
//! machine, pressure memory and evicted pods. What cannot change while
//! running (the API report's settings, which own a client and background
//! writers) is reported as needing a restart, not silently ignored.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use anyhow::Context;
use criguard::config::ConfigError;
use criguard::cri::proxy::Ready;
use criguard::eviction::store::EvictedStore;
use criguard::eviction::{NodeStatus, Reloadable};
use criguard::kube::KubeSettings;
use criguard::metrics::Metrics;
use criguard::model::NodeModel;
use criguard::oom::history::RankHistory;
use criguard::signals::node::NodeSources;
use criguard::signals::notify::MemoryEvents;
use tokio::sync::watch;

use super::eviction::{Live, Parts};
use super::loops::{Stopping, after_ready};
use super::oom;
use crate::cli::settings::{Guardian, Settings};

/// What the guardian needs that outlives any one configuration.
pub struct Handles {
    /// The node model.
    pub node: Arc<RwLock<NodeModel>>,
    /// Conditions, evictions, evicted pods.
    pub status: Arc<RwLock<NodeStatus>>,
    /// Where the node's signals are read.
    pub sources: NodeSources,
    /// The reclaim parts.
    pub parts: Parts,
    /// Metrics.
    pub metrics: Metrics,
    /// The model's readiness (rebuilt from the runtime).
    pub ready: Ready,
    /// criguard is stopping.
    pub stopping: Stopping,
    /// The adjuster's rankings, matched against kernel OOM kills.
    pub ranks: Arc<Mutex<RankHistory>>,
    /// The cgroup filesystem's root.
    pub cgroup_root: std::path::PathBuf,
    /// `--dynamic-oom-score-adj` and `--oom-adjust-interval`.
    pub oom: (bool, Duration),
    /// Where evicted pods and the pressure memory are kept.
    pub state_dir: std::path::PathBuf,
    /// The proxy changes requests only while this is true.
    pub guarding: Arc<AtomicBool>,
}

/// The guardian's life: off (failing open) until [`Guard::apply`] is given
/// valid settings, then running and taking up each new valid settings.
pub struct Guard {
    handles: Handles,
    /// The settings in effect, for the collectors' loops (`None`: failing open).
    live: watch::Sender<Option<Live>>,
    /// The running eviction manager's reloads, and the settings it started
    /// with that it cannot change.
    running: Option<Running>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

struct Running {
    reloads: watch::Sender<Arc<Reloadable>>,
    kube: Option<KubeSettings>,
    psi: Option<criguard::signals::notify::v2::PsiSettings>,
}

/// What differs between the running guardian (its API report's settings
/// `kube`, its memory events' `psi`) and `g` but can only change with a
/// restart: the report owns a client, its node reconciler and the pod
/// reports in progress; the memory events' PSI trigger is armed once.
fn needs_restart(
    kube: &Option<KubeSettings>,
    psi: Option<criguard::signals::notify::v2::PsiSettings>,
    g: &Guardian,
) -> Vec<String> {
    let mut restart = Vec::new();
    if *kube != g.settings.kube {
        restart.push(
            "the Kubernetes API report (kubeconfig, nodeName, kubeStatusTimeout, nodeTaints)"
                .into(),
        );
    }
    if psi != g.psi {
        restart.push("--memory-events, --memory-psi-stall, --memory-psi-window".into());
    }
    restart
}

/// `what` of the API could not start with `k`: the error names the
/// `kubeconfig` key and its value.
fn kube_error(k: &KubeSettings, what: &str, e: criguard::kube::KubeError) -> ConfigError {
    ConfigError {
        key: "kubeconfig".into(),
        value: match &k.source {
            criguard::kube::ApiSource::Kubeconfig(p) => p.display().to_string(),
            criguard::kube::ApiSource::InCluster => "in-cluster".into(),
        },
        rule: format!("{what} cannot start: {e}"),
    }
}

impl Guard {
    /// The guardian, off; the collectors' loops start now and wait for
    /// the first valid settings.
    pub fn new(handles: Handles) -> Self {
        let (live, rx) = watch::channel(None);
        let stopping = handles.stopping.clone();
        let tasks = vec![
            tokio::spawn(super::eviction::image_gc_loop(rx.clone(), stopping.clone())),
            tokio::spawn(super::eviction::container_gc_loop(rx, stopping)),
        ];
        handles.metrics.config.valid.set(0);
        Self {
            handles,
            live,
            running: None,
            tasks,
        }
    }

    /// Whether the guardian runs (a configuration was accepted).
    pub fn running(&self) -> bool {
        self.running.is_some()
    }

    /// Puts `g` in effect: starts the guardian with it, or hands it to the
    /// running one. Returns the settings that differ from the running ones
    /// but need a restart (the running values stay for those). An error
    /// (the API report cannot start) leaves everything as it was.
    pub async fn apply(&mut self, g: &Guardian) -> Result<Vec<String>, ConfigError> {
        let settings = Arc::new(g.settings.clone());
        match &self.running {
            None => {
                self.start(settings, g.psi).await?;
                Ok(Vec::new())
            }
            Some(r) => {
                let restart = needs_restart(&r.kube, r.psi, g);
                let live = self
                    .handles
                    .parts
                    .live(settings, self.live.borrow().as_ref());
                r.reloads.send_replace(Arc::new(Reloadable {
                    config: live.settings.eviction.clone(),
                    dry_run: live.settings.dry_run,
                    node_reclaim: Some(Arc::new(
                        self.handles
                            .parts
                            .node_reclaim(&live, &self.handles.sources),
                    )),
                }));
                self.live.send_replace(Some(live));
                Ok(restart)
            }
        }
    }

    /// Starts the guardian with `settings`: the API report (when
    /// configured), the eviction manager with memory events, the adjuster,
    /// the collectors; then lets the proxy patch and refuse.
    async fn start(
        &mut self,
        settings: Arc<Settings>,
        psi: Option<criguard::signals::notify::v2::PsiSettings>,
    ) -> Result<(), ConfigError> {
        let h = &self.handles;
        let report = match &settings.kube {
            Some(k) => Some(
                criguard::kube::KubeReport::start(k, h.metrics.kube.clone(), Some(&h.state_dir))
                    .await
                    .map_err(|e| kube_error(k, "the Kubernetes API report", e))?,
            ),
            None => None,
        };
        if let Some(k) = &settings.kube {
            let source = criguard::kube::pods::source(
                k,
                h.node.clone(),
                h.metrics.kube.clone(),
                h.stopping.clone().cancelled_owned(),
            )
            .await
            .map_err(|e| kube_error(k, "the API pod source", e))?;
            self.tasks.push(tokio::spawn(source));
        }
        let live = h.parts.live(settings.clone(), None);
        let events = psi.map(|psi| MemoryEvents::new(h.sources.clone(), &settings.eviction, psi));
        let (reloads, reloads_rx) = watch::channel(Arc::new(Reloadable {
            config: settings.eviction.clone(),
            dry_run: settings.dry_run,
            node_reclaim: None,
        }));
        let manager = h
            .parts
            .eviction_manager(
                settings.eviction.clone(),
                h.sources.clone(),
                (&h.node, &h.status),
                &live,
            )
            .with_metrics(h.metrics.eviction.clone())
            .with_evicted_store(EvictedStore::new(&h.state_dir))
            .with_reloads(reloads_rx);
        let manager = match report {
            Some(r) => manager.with_report(Arc::new(r)),
            None => manager,
        };
        self.tasks.push(tokio::spawn(after_ready(
            h.ready.clone(),
            h.stopping.clone().cancelled_owned(),
            manager.run(events, h.stopping.clone().cancelled_owned()),
        )));
        // The adjuster ranks every round (the kernel OOM kills are matched
        // against it); it writes scores only with --dynamic-oom-score-adj.
        let (dynamic, every) = h.oom;
        let adjuster = oom::build(
            &h.node,
            &h.cgroup_root,
            &h.metrics,
            h.ranks.clone(),
            dynamic,
        );
        self.tasks.push(tokio::spawn(after_ready(
            h.ready.clone(),
            h.stopping.clone().cancelled_owned(),
            oom::run(adjuster, every, h.stopping.clone()),
        )));
        self.live.send_replace(Some(live));
        h.guarding.store(true, Ordering::Release);
        h.metrics.config.valid.set(1);
        tracing::info!(
            "guardian started: evicting, collecting, patching and admitting by the configuration"
        );
        self.running = Some(Running {
            reloads,
            kube: settings.kube.clone(),
            psi,
        });
        Ok(())
    }

    /// Waits for the guardian's tasks to end (criguard is stopping).
    pub async fn join(self) -> anyhow::Result<()> {
        for t in self.tasks {
            t.await.context("a guardian task failed")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::args::{EvictionArgs, GcArgs, KubeArgs};
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        eviction: EvictionArgs,
        #[command(flatten)]
        gc: GcArgs,
        #[command(flatten)]
        kube: KubeArgs,
    }

    fn guardian(args: &[&str]) -> Guardian {
        let f = Flags::parse_from(std::iter::once("criguard").chain(args.iter().copied()));
        Guardian {
            settings: Settings::load(&f.eviction, &f.gc, &f.kube).unwrap(),
            psi: None,
        }
    }

    #[test]
    fn thresholds_and_gc_reload_live_the_api_report_needs_a_restart() {
        let running = guardian(&[]);
        let changed = guardian(&[
            "--eviction-hard=memory.available<1Gi",
            "--image-gc-high-threshold=90",
        ]);
        assert!(needs_restart(&running.settings.kube, None, &changed).is_empty());
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n",
        )
        .unwrap();
        let with_api = guardian(&[
            &format!("--kubeconfig={}", kubeconfig.display()),
            "--node-name=n1",
        ]);
        let r = needs_restart(&running.settings.kube, None, &with_api);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(r[0].contains("kubeconfig"), "{r:?}");
        let psi = criguard::signals::notify::v2::PsiSettings::default();
        let r = needs_restart(&running.settings.kube, Some(psi), &running);
        assert!(r[0].contains("--memory-psi"), "{r:?}");
    }
}
