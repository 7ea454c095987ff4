//! The eviction order for each kind of signal, read now: what the eviction
//! manager takes its victims from and what `criguard rank` prints. The
//! readings are I/O (cgroups, per-pod usage); the orders come from the pure
//! functions in [`crate::policy::rank`] and [`crate::policy::reclaim`].

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

use crate::config::Signal;
use crate::model::{ContainerState, NodeModel, Pod, SandboxState};
use crate::policy::rank::{PodMemory, rank_memory};
use crate::policy::reclaim::{PodUse, rank_usage};
use crate::signal::Ranking;
use crate::signals::disk::DiskUsage;
use crate::signals::node::NodeSources;
use crate::signals::usage::{PodUsage, UsageReader, counted};

/// A ranked pod, with what the signal counts of it.
#[derive(Clone, Debug)]
pub struct Victim {
    /// The pod.
    pub pod: Pod,
    /// Usage the signal counts (bytes, inodes or tasks); `None`: unread.
    pub usage: Option<i64>,
    /// Request (memory only; CRI carries no other).
    pub request: i64,
    /// Its heaviest container: name, usage, request.
    pub heaviest: Option<(String, i64, i64)>,
    /// What evicting it is expected to give back, in the signal's units.
    pub reclaimable: u64,
}

impl Victim {
    /// The plain data the pure planning functions take.
    pub fn as_use(&self) -> PodUse {
        PodUse {
            sandbox_id: self.pod.sandbox_id.clone(),
            priority: self.pod.priority,
            critical: self.pod.critical,
            usage: self.usage.map(|u| u.max(0) as u64),
            reclaimable: self.reclaimable,
        }
    }
}

/// One line of `criguard rank`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankEntry {
    /// The signal ranked for.
    pub signal: String,
    /// 1 for the first victim.
    pub rank: usize,
    /// `namespace/name`.
    pub pod: String,
    /// QoS class.
    pub qos: String,
    /// Priority.
    pub priority: i32,
    /// What the signal counts of it (`None`: could not be read).
    pub usage: Option<i64>,
    /// Its request for that resource (memory only).
    pub request: i64,
}

/// Reads what ranking needs and ranks; cheap to clone.
#[derive(Clone, Debug)]
pub struct Ranker {
    model: Arc<RwLock<NodeModel>>,
    sources: NodeSources,
    usage: Option<UsageReader>,
}

/// The part of a pod's usage that evicting it gives back for `signal`:
/// writable layers and logs (emptyDirs stay), limited to the filesystem
/// the signal watches.
pub fn reclaimable(signal: Signal, u: &PodUsage, dedicated_imagefs: bool) -> DiskUsage {
    match signal.pod_parts(dedicated_imagefs) {
        Some(p) => u.rootfs.only(p.rootfs) + u.logs.only(p.logs),
        // Not a disk signal: as without a dedicated imagefs.
        None => u.rootfs + u.logs,
    }
}

impl Ranker {
    /// A ranker over the node model, its signal sources and (for disk) the
    /// per-pod usage reader.
    pub fn new(
        model: Arc<RwLock<NodeModel>>,
        sources: NodeSources,
        usage: Option<UsageReader>,
    ) -> Self {
        Self {
            model,
            sources,
            usage,
        }
    }

    /// Running pods not in `tried`.
    fn candidates(&self, tried: &BTreeSet<String>) -> Vec<Pod> {
        let pods = self.model.read().unwrap_or_else(|e| e.into_inner()).pods();
        pods.into_iter()
            .filter(|p| p.state == SandboxState::Ready && !tried.contains(&p.sandbox_id))
            .collect()
    }

    /// The kubelet's memory ranking, by working set.
    pub fn memory(&self, tried: &BTreeSet<String>) -> Vec<Victim> {
        let pods = self.candidates(tried);
        // Cgroups resolved for either driver; an unknown one (empty) is unread.
        let working_set = |cgroup: &str| {
            (!cgroup.is_empty())
                .then(|| Some(self.sources.cgroups.memory(cgroup).ok()?.working_set as i64))
                .flatten()
        };
        let usage: HashMap<&str, i64> = pods
            .iter()
            .filter_map(|p| Some((p.sandbox_id.as_str(), working_set(&p.cgroup()?)?)))
            .collect();
        let input: Vec<PodMemory> = pods
            .iter()
            .map(|p| PodMemory {
                sandbox_id: p.sandbox_id.clone(),
                priority: p.priority,
                request: p.memory_request(),
                usage: usage.get(p.sandbox_id.as_str()).copied(),
                critical: p.critical,
            })
            .collect();
        rank_memory(&input)
            .into_iter()
            .filter_map(|r| {
                let pod = pods.iter().find(|p| p.sandbox_id == r.sandbox_id)?.clone();
                let heaviest = pod
                    .containers
                    .values()
                    .filter(|c| c.state == ContainerState::Running)
                    .filter_map(|c| {
                        Some((
                            c.name.clone(),
                            working_set(&c.cgroup_path)?,
                            c.memory_request,
                        ))
                    })
                    .max_by_key(|(_, u, _)| *u);
                Some(Victim {
                    usage: r.usage,
                    request: r.request,
                    heaviest,
                    reclaimable: r.usage.unwrap_or(0).max(0) as u64,
                    pod,
                })
            })
            .collect()
    }

    /// The kubelet's pid ranking: priority, then tasks (threads included).
    pub fn pids(&self, tried: &BTreeSet<String>) -> Vec<Victim> {
        let pods = self.candidates(tried);
        let tasks = |cgroup: &str| {
            (!cgroup.is_empty())
                .then(|| self.sources.cgroups.pids_counter(cgroup).ok().map(|c| c.0))
                .flatten()
        };
        let uses: Vec<PodUse> = pods
            .iter()
            .map(|p| {
                let n = p.cgroup().and_then(|cg| tasks(&cg));
                PodUse {
                    sandbox_id: p.sandbox_id.clone(),
                    priority: p.priority,
                    critical: p.critical,
                    usage: n,
                    reclaimable: n.unwrap_or(0),
                }
            })
            .collect();
        rank_usage(&uses)
            .into_iter()
            .filter_map(|u| {
                let pod = pods.iter().find(|p| p.sandbox_id == u.sandbox_id)?.clone();
                let heaviest = pod
                    .containers
                    .values()
                    .filter_map(|c| Some((c.name.clone(), tasks(&c.cgroup_path)? as i64, 0)))
                    .max_by_key(|(_, n, _)| *n);
                Some(Victim {
                    usage: u.usage.map(|n| n as i64),
                    request: 0,
                    heaviest,
                    reclaimable: u.reclaimable,
                    pod,
                })
            })
            .collect()
    }

    /// The kubelet's disk ranking for `signal`: priority, then the usage
    /// the signal counts (empty without a usage reader).
    pub async fn disk(&self, signal: Signal, tried: &BTreeSet<String>) -> Vec<Victim> {
        let Some(reader) = &self.usage else {
            return Vec::new();
        };
        let pods = self.candidates(tried);
        let node = reader.read(pods.clone()).await;
        let dedicated = node.dedicated_imagefs;
        let pick = |d: DiskUsage| {
            if signal.is_bytes() { d.bytes } else { d.inodes }
        };
        let usage_of = |id: &str| node.pods.iter().find(|u| u.sandbox_id == id);
        let uses: Vec<PodUse> = pods
            .iter()
            .map(|p| {
                let u = usage_of(&p.sandbox_id);
                PodUse {
                    sandbox_id: p.sandbox_id.clone(),
                    priority: p.priority,
                    critical: p.critical,
                    usage: u.and_then(|u| counted(signal, u, dedicated)),
                    reclaimable: u.map_or(0, |u| pick(reclaimable(signal, u, dedicated))),
                }
            })
            .collect();
        rank_usage(&uses)
            .into_iter()
            .filter_map(|r| {
                let pod = pods.iter().find(|p| p.sandbox_id == r.sandbox_id)?.clone();
                let heaviest = usage_of(&pod.sandbox_id).and_then(|u| {
                    u.containers
                        .iter()
                        .map(|c| {
                            let part = c.rootfs.unwrap_or_default() + c.logs.unwrap_or_default();
                            (c.name.clone(), pick(part) as i64, 0)
                        })
                        .max_by_key(|(_, n, _)| *n)
                });
                Some(Victim {
                    usage: r.usage.map(|n| n as i64),
                    request: 0,
                    heaviest,
                    reclaimable: r.reclaimable,
                    pod,
                })
            })
            .collect()
    }

    /// The order for each of `signals` (one memory, pid and disk signal
    /// each at most), as `criguard rank` prints it.
    pub async fn report(&self, signals: &[Signal]) -> Vec<RankEntry> {
        let none = BTreeSet::new();
        let mut out = Vec::new();
        for &s in signals {
            let ranked = match s.ranking() {
                Ranking::Memory => self.memory(&none),
                Ranking::Pids => self.pids(&none),
                Ranking::Disk => self.disk(s, &none).await,
            };
            out.extend(ranked.into_iter().enumerate().map(|(i, v)| RankEntry {
                signal: s.to_string(),
                rank: i + 1,
                pod: format!("{}/{}", v.pod.namespace, v.pod.name),
                qos: format!("{:?}", v.pod.qos),
                priority: v.pod.priority,
                usage: v.usage,
                request: v.request,
            }));
        }
        out
    }
}
