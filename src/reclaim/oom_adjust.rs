//! Keeping the kernel's OOM choice in line with criguard's ranking.
//!
//! Each round reads every running pod's and container's working set, ranks
//! the pods ([`crate::policy::rank::rank_memory`]), computes target scores
//! ([`crate::policy::oom::dynamic_scores`]) and writes them to
//! `/proc/<pid>/oom_score_adj` of every process in the container's cgroup.
//! Containers it changed earlier and no longer needs to change get the
//! kubelet's value back. A write that fails (a process gone, a value below
//! what this host lets criguard set) is logged and retried next round; it
//! never affects the CRI path.
//!
//! Each round's first-ranked pod is also recorded in a [`RankHistory`], so
//! that a kernel OOM kill can be matched against the ranking of its moment
//! (`reclaim::oom_kills`). With the dynamic rule off the adjuster still
//! ranks (and writes nothing), so the kills are matched either way.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use crate::metrics::OomMetrics;
use crate::model::{ContainerState, NodeModel, SandboxState};
use crate::policy::oom::{ContainerMemory, dynamic_scores};
use crate::policy::oom_kill::RankHistory;
use crate::policy::rank::{PodMemory, rank_memory};
use crate::signals::cgroup_path::kubepods_of;
use crate::signals::memory::CgroupFs;

/// What one round decided, for logs and tests.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Round {
    /// The pod the kernel should pick first, if any.
    pub first_victim: Option<String>,
    /// Container id → score written this round.
    pub written: HashMap<String, i64>,
}

/// Adjusts `oom_score_adj` of running containers; holds what it changed.
#[derive(Debug)]
pub struct OomAdjuster {
    model: Arc<RwLock<NodeModel>>,
    cgroups: CgroupFs,
    proc_root: PathBuf,
    changed: HashSet<String>,
    /// (container, score) pairs already logged at info, so each change is said once.
    announced: HashSet<(String, i64)>,
    metrics: OomMetrics,
    /// Where each round's first-ranked pod is recorded.
    ranks: Arc<Mutex<RankHistory>>,
    /// False: rank and record only (`--dynamic-oom-score-adj=false`).
    write: bool,
}

impl OomAdjuster {
    /// An adjuster over `model`, reading cgroups at `cgroup_root` and writing
    /// under `proc_root` (normally `/sys/fs/cgroup` and `/proc`).
    pub fn new(model: Arc<RwLock<NodeModel>>, cgroup_root: PathBuf, proc_root: PathBuf) -> Self {
        Self {
            model,
            cgroups: CgroupFs::detect(&cgroup_root),
            proc_root,
            changed: HashSet::new(),
            announced: HashSet::new(),
            metrics: OomMetrics::default(),
            ranks: Arc::default(),
            write: true,
        }
    }

    /// The same adjuster, recording each round's first-ranked pod in `ranks`.
    pub fn with_rank_history(mut self, ranks: Arc<Mutex<RankHistory>>) -> Self {
        self.ranks = ranks;
        self
    }

    /// The same adjuster ranking only: scores stay the kubelet's.
    pub fn rank_only(mut self) -> Self {
        self.write = false;
        self
    }

    /// The same adjuster, counting its writes in `metrics`.
    pub fn with_metrics(mut self, metrics: OomMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// One round: observe, decide, record the first-ranked pod, write.
    pub fn round(&mut self) -> Round {
        let started_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let (pods, capacity) = {
            let m = self.model.read().unwrap_or_else(|e| e.into_inner());
            (m.pods(), m.memory_capacity())
        };
        let running: Vec<_> = pods
            .iter()
            .filter(|p| p.state == SandboxState::Ready)
            .collect();
        let mut pod_mem = Vec::new();
        let mut containers = Vec::new();
        let mut total = capacity;
        for p in &running {
            // Resolved for either cgroup driver; a pod without one is unread.
            let cgroup = p.cgroup();
            if let Some(limit) = cgroup
                .as_deref()
                .and_then(kubepods_of)
                .and_then(|k| self.cgroups.memory(&k).ok())
                .and_then(|m| m.limit)
            {
                total = total.min(limit as i64);
            }
            pod_mem.push(PodMemory {
                sandbox_id: p.sandbox_id.clone(),
                priority: p.priority,
                request: p.memory_request(),
                usage: cgroup
                    .and_then(|cg| self.cgroups.memory(&cg).ok())
                    .map(|m| m.working_set as i64),
                critical: p.critical,
            });
            for c in p.containers.values().filter(|c| {
                self.write && c.state == ContainerState::Running && !c.cgroup_path.is_empty()
            }) {
                let Ok(usage) = self.cgroups.memory(&c.cgroup_path) else {
                    continue;
                };
                containers.push(ContainerMemory {
                    id: c.id.clone(),
                    sandbox_id: p.sandbox_id.clone(),
                    kubelet_adj: c.oom_score_adj,
                    usage: usage.working_set as i64,
                });
            }
        }
        let first_victim = rank_memory(&pod_mem).first().map(|p| p.sandbox_id.clone());
        self.ranks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(started_ms, first_victim.clone());
        if !self.write {
            return Round {
                first_victim,
                written: HashMap::new(),
            };
        }
        let targets = dynamic_scores(first_victim.as_deref(), &containers, total);
        let mut written = HashMap::new();
        for c in &containers {
            let target = match targets.get(&c.id) {
                Some(t) => *t,
                None if self.changed.contains(&c.id) => c.kubelet_adj,
                None => continue,
            };
            let cgroup = running
                .iter()
                .find_map(|p| p.containers.get(&c.id))
                .map(|x| x.cgroup_path.clone())
                .unwrap_or_default();
            // A lowered score is a ceiling: processes already at or below it
            // stay as they are, so usage jitter does not rewrite scores every
            // round. The first victim's 1000 and restores are exact.
            let ceiling =
                Some(&c.sandbox_id) != first_victim.as_ref() && targets.contains_key(&c.id);
            if self.write_all(&cgroup, target, ceiling) {
                if self.announced.insert((c.id.clone(), target)) {
                    let why = if Some(&c.sandbox_id) == first_victim.as_ref() {
                        "first in criguard's memory ranking: the kernel's OOM killer should pick it first"
                    } else {
                        "kept below the first-ranked pod's score"
                    };
                    tracing::info!(container = %c.id, pod = %c.sandbox_id, kubelet = c.kubelet_adj, to = target, why, "oom_score_adj adjusted");
                }
                written.insert(c.id.clone(), target);
            }
            if targets.contains_key(&c.id) {
                self.changed.insert(c.id.clone());
            } else {
                self.changed.remove(&c.id);
            }
        }
        let live: HashSet<&str> = containers.iter().map(|c| c.id.as_str()).collect();
        self.changed.retain(|id| live.contains(id.as_str()));
        self.announced.retain(|(id, _)| live.contains(id.as_str()));
        Round {
            first_victim,
            written,
        }
    }

    /// Writes `adj` to every process of `cgroup` whose score differs (with
    /// `ceiling`, only to those above it); true when one was changed.
    fn write_all(&self, cgroup: &str, adj: i64, ceiling: bool) -> bool {
        let pids = match self.cgroups.pids(cgroup) {
            Ok(p) => p,
            Err(err) => {
                tracing::debug!(%err, "container cgroup not readable; skipped");
                return false;
            }
        };
        let mut any = false;
        for pid in pids {
            let path = self.proc_root.join(pid.to_string()).join("oom_score_adj");
            let current = std::fs::read_to_string(&path)
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok());
            if current == Some(adj) || (ceiling && current.is_some_and(|c| c <= adj)) {
                continue;
            }
            match std::fs::write(&path, adj.to_string()) {
                Ok(()) => {
                    tracing::debug!(pid, cgroup, from = ?current, to = adj, "oom_score_adj written");
                    self.metrics.writes.inc();
                    any = true;
                }
                Err(err) => {
                    tracing::warn!(path = %path.display(), adj, %err, "cannot set oom_score_adj")
                }
            }
        }
        any
    }
}
