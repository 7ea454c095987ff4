//! The eviction order for each kind of signal, read now: what the eviction
//! manager takes its victims from and what `criguard rank` prints. The
//! readings are I/O (cgroups, per-pod usage); the orders come from the pure
//! functions in [`crate::eviction::rank::order`] and [`crate::eviction::reclaim`].

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use crate::config::Threshold;
use crate::eviction::local_storage::{Exceeded, StorageUse, exceeded, fullness, has_limits};
use crate::eviction::rank::order::{PodMemory, PodSwap, limited_swap, rank_memory, rank_swap};
use crate::eviction::reclaim::{PodUse, UsageRequest, rank_usage};
use crate::lock::RwLocked;
use crate::model::spec::ApiPod;
use crate::model::{ContainerState, NodeModel, Pod, SandboxState};
use crate::signals::disk::DiskUsage;
use crate::signals::node::NodeSources;
use crate::signals::table::Signal;
use crate::signals::usage::{PodUsage, UsageContainer, UsagePod, UsageReader, counted};

pub mod order;
mod report;

pub use report::{NotRanked, RankEntry, disk_ranking_wanted};

/// A ranked pod, with what the signal counts of it.
#[derive(Clone, Debug)]
pub struct Victim {
    /// The pod.
    pub pod: Pod,
    /// Usage the signal counts (bytes, inodes or tasks); `None`: unread.
    pub usage: Option<i64>,
    /// The pod's request of the signal's resource (memory; ephemeral-storage
    /// for disk, 0 without the API; none for pids).
    pub request: i64,
    /// Its heaviest container: name, usage, request; read for the first
    /// victim of an order only (the one an eviction message names).
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
            request: None,
        }
    }
}

/// Reads what ranking needs and ranks; cheap to clone.
#[derive(Clone, Debug)]
pub struct Ranker {
    model: Arc<RwLock<NodeModel>>,
    sources: NodeSources,
    usage: Option<UsageReader>,
    /// The thresholds configured, so that `report` walks disk only near them.
    thresholds: Vec<Threshold>,
}

/// What memory ranking needs of `pod`, whose working set is `usage`
/// (`None`: unread). The one place the ranking's input is built, for the
/// eviction manager and the `oom_score_adj` adjuster alike.
pub fn memory_input(pod: &Pod, usage: Option<i64>) -> PodMemory {
    PodMemory {
        sandbox_id: pod.sandbox_id.clone(),
        priority: pod.priority,
        request: pod.memory_request(),
        usage,
        critical: pod.critical,
    }
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
            thresholds: Vec::new(),
        }
    }

    /// The same ranker, told the configured thresholds: [`Ranker::report`]
    /// then orders pods for a disk signal only when it is near one of its
    /// thresholds ([`disk_ranking_wanted`]).
    pub fn with_thresholds(mut self, thresholds: Vec<Threshold>) -> Self {
        self.thresholds = thresholds;
        self
    }

    /// Running pods not in `tried`.
    fn candidates(&self, tried: &BTreeSet<String>) -> Vec<Pod> {
        let pods = self.model.read_locked().pods();
        pods.into_iter()
            .filter(|p| p.state == SandboxState::Ready && !tried.contains(&p.sandbox_id))
            .collect()
    }

    /// The kubelet's memory ranking, by working set, read on the blocking
    /// pool (see [`Ranker::memory_blocking`]).
    pub async fn memory(&self, tried: &BTreeSet<String>) -> Vec<Victim> {
        let (me, tried) = (self.clone(), tried.clone());
        blocking(move || me.memory_blocking(&tried)).await
    }

    /// The kubelet's memory ranking, by working set: each pod's cgroup read
    /// once (usage and `memory.stat`), pods read in parallel; the first
    /// victim's containers read for the eviction message. Blocking I/O.
    pub fn memory_blocking(&self, tried: &BTreeSet<String>) -> Vec<Victim> {
        let pods = self.candidates(tried);
        let cgroups = &self.sources.cgroups;
        let working_set = |cgroup: &str| Some(cgroups.working_set(cgroup).ok()? as i64);
        let usage = per_pod(&pods, |p| working_set(&p.cgroup()?));
        let input: Vec<PodMemory> = pods
            .iter()
            .zip(usage)
            .map(|(p, u)| memory_input(p, u))
            .collect();
        let ranked = rank_memory(&input).into_iter().map(|r| Ranked {
            sandbox_id: r.sandbox_id.clone(),
            usage: r.usage,
            request: r.request,
            reclaimable: r.usage.unwrap_or(0).max(0) as u64,
        });
        victims(pods, ranked, |pod| {
            running(pod)
                .filter_map(|c| {
                    let used = working_set(&c.cgroup_path)?;
                    Some((c.name.clone(), used, c.memory_request))
                })
                .max_by_key(|(_, u, _)| *u)
        })
    }

    /// The swap ranking, read on the blocking pool (see
    /// [`Ranker::swap_blocking`]).
    pub async fn swap(&self, tried: &BTreeSet<String>) -> Vec<Victim> {
        let (me, tried) = (self.clone(), tried.clone());
        blocking(move || me.swap_blocking(&tried)).await
    }

    /// The swap ranking ([`rank_swap`]): each pod's `memory.swap.current`
    /// against the `LimitedSwap` entitlement of its containers, out of the
    /// node's swap now; the first victim's container using the most swap
    /// named in the message. Blocking I/O.
    pub fn swap_blocking(&self, tried: &BTreeSet<String>) -> Vec<Victim> {
        let pods = self.candidates(tried);
        let cgroups = &self.sources.cgroups;
        let swap = |cgroup: &str| Some(cgroups.swap_current(cgroup).ok()? as i64);
        let node_swap = match self.sources.swap() {
            Ok(Some(o)) => o.capacity,
            _ => 0,
        };
        let memory = self.sources.memory_capacity;
        let entitled = |pod: &Pod, c: &crate::model::Container| {
            limited_swap(
                pod.qos,
                pod.critical,
                c.memory_request,
                c.memory_limit,
                memory,
                node_swap,
            )
        };
        let usage = per_pod(&pods, |p| swap(&p.cgroup()?));
        let input: Vec<PodSwap> = pods
            .iter()
            .zip(usage)
            .map(|(p, u)| PodSwap {
                sandbox_id: p.sandbox_id.clone(),
                priority: p.priority,
                entitlement: p.containers.values().map(|c| entitled(p, c)).sum(),
                usage: u,
                critical: p.critical,
            })
            .collect();
        let ranked = rank_swap(&input).into_iter().map(|r| Ranked {
            sandbox_id: r.sandbox_id.clone(),
            usage: r.usage,
            request: r.entitlement,
            reclaimable: r.usage.unwrap_or(0).max(0) as u64,
        });
        victims(pods, ranked, |pod| {
            running(pod)
                .filter_map(|c| Some((c.name.clone(), swap(&c.cgroup_path)?, entitled(pod, c))))
                .max_by_key(|(_, u, _)| *u)
        })
    }

    /// The kubelet's pid ranking, read on the blocking pool (see
    /// [`Ranker::pids_blocking`]).
    pub async fn pids(&self, tried: &BTreeSet<String>) -> Vec<Victim> {
        let (me, tried) = (self.clone(), tried.clone());
        blocking(move || me.pids_blocking(&tried)).await
    }

    /// The kubelet's pid ranking: priority, then tasks (threads included),
    /// each pod's `pids.current` read once, in parallel. Blocking I/O.
    pub fn pids_blocking(&self, tried: &BTreeSet<String>) -> Vec<Victim> {
        let pods = self.candidates(tried);
        let cgroups = &self.sources.cgroups;
        let tasks = |cgroup: &str| cgroups.pids_current(cgroup).ok();
        let tasks_of = per_pod(&pods, |p| tasks(&p.cgroup()?));
        let uses: Vec<PodUse> = pods
            .iter()
            .zip(tasks_of)
            .map(|(p, n)| pod_use(p, n, n.unwrap_or(0), None))
            .collect();
        victims(pods, ranked_uses(&uses), |pod| {
            running(pod)
                .filter_map(|c| Some((c.name.clone(), tasks(&c.cgroup_path)? as i64, 0)))
                .max_by_key(|(_, n, _)| *n)
        })
    }

    /// The kubelet's disk ranking for `signal`: priority, then the usage
    /// the signal counts (empty without a usage reader).
    pub async fn disk(&self, signal: Signal, tried: &BTreeSet<String>) -> Vec<Victim> {
        let Some(reader) = &self.usage else {
            return Vec::new();
        };
        let pods = self.candidates(tried);
        let node = reader.read(usage_pods(&pods)).await;
        let dedicated = node.dedicated_imagefs;
        let pick = |d: DiskUsage| {
            if signal.is_bytes() { d.bytes } else { d.inodes }
        };
        let by_id: HashMap<&str, &PodUsage> = node
            .pods
            .iter()
            .map(|u| (u.sandbox_id.as_str(), u))
            .collect();
        let uses: Vec<PodUse> = pods
            .iter()
            .map(|p| {
                let u = by_id.get(p.sandbox_id.as_str());
                let usage = u.and_then(|u| counted(signal, u, dedicated));
                let request = p.requests.ephemeral_storage.max(0) as u64;
                pod_use(
                    p,
                    usage,
                    u.map_or(0, |u| pick(reclaimable(signal, u, dedicated))),
                    Some(UsageRequest::new(usage, signal.is_bytes(), request)),
                )
            })
            .collect();
        victims(pods, ranked_uses(&uses), |pod| {
            by_id.get(pod.sandbox_id.as_str()).and_then(|u| {
                u.containers
                    .iter()
                    .map(|c| {
                        let part = c.rootfs.unwrap_or_default() + c.logs.unwrap_or_default();
                        let request = pod
                            .containers
                            .values()
                            .find(|m| m.name == c.name)
                            .map_or(0, |m| m.ephemeral_storage_request);
                        (c.name.clone(), pick(part) as i64, request)
                    })
                    .max_by_key(|(_, n, _)| *n)
            })
        })
    }
}

/// What one local-storage reading found.
#[derive(Clone, Debug, Default)]
pub struct StorageReading {
    /// The pods over a limit, each with the first limit it exceeds.
    pub over: Vec<(Victim, Exceeded)>,
    /// How full each pod read is, by sandbox id ([`fullness`]).
    pub fullness: Vec<(String, f64)>,
}

impl Ranker {
    /// Reads the running pods with a local-storage limit of their API pod
    /// ([`crate::eviction::local_storage`]), leaving out those in `skip`:
    /// those over a limit, with the first limit each exceeds, and how full
    /// each is. Critical pods and pods without such a limit are not read.
    /// A victim's usage is the pod's ephemeral storage, its request the
    /// limit exceeded.
    pub async fn local_storage(&self, skip: &BTreeSet<String>) -> StorageReading {
        let mut out = StorageReading::default();
        let Some(reader) = &self.usage else {
            return out;
        };
        let (pods, specs): (Vec<Pod>, Vec<ApiPod>) = {
            let pods = self.candidates(skip);
            let m = self.model.read_locked();
            pods.into_iter()
                .filter(|p| !p.critical)
                .filter_map(|p| {
                    let spec = m.api_pod(&p.uid).filter(|s| has_limits(s))?.clone();
                    Some((p, spec))
                })
                .unzip()
        };
        if pods.is_empty() {
            return out;
        }
        let node = reader.read_pods(usage_pods(&pods)).await;
        for ((pod, spec), u) in pods.into_iter().zip(&specs).zip(&node.pods) {
            if !u.errors.is_empty() {
                tracing::debug!(pod = %format_args!("{}/{}", pod.namespace, pod.name), errors = ?u.errors, "local storage partly unread");
            }
            let usage = StorageUse {
                empty_dirs: u
                    .empty_dirs
                    .iter()
                    .map(|(n, d)| (n.clone(), d.bytes))
                    .collect(),
                containers: u
                    .containers
                    .iter()
                    .map(|c| {
                        let bytes = |d: Option<DiskUsage>| d.map_or(0, |d| d.bytes);
                        (c.name.clone(), bytes(c.logs), bytes(c.rootfs))
                    })
                    .collect(),
                total: u.total().bytes,
            };
            let full = fullness(spec, &usage, node.dedicated_imagefs);
            out.fullness.push((pod.sandbox_id.clone(), full));
            if let Some(over) = exceeded(spec, &usage, node.dedicated_imagefs) {
                let victim = Victim {
                    usage: Some(usage.total as i64),
                    request: over.limit(),
                    heaviest: None,
                    reclaimable: u.rootfs.bytes + u.logs.bytes,
                    pod,
                };
                out.over.push((victim, over));
            }
        }
        out
    }
}

/// What per-pod usage reads of `pods` ([`UsageReader::read`]): each pod's
/// identity, log directory, cgroup and containers, taken from the model.
pub fn usage_pods(pods: &[Pod]) -> Vec<UsagePod> {
    pods.iter().map(usage_pod).collect()
}

/// What per-pod usage reads of `pod`.
pub fn usage_pod(pod: &Pod) -> UsagePod {
    UsagePod {
        sandbox_id: pod.sandbox_id.clone(),
        uid: pod.uid.clone(),
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        log_directory: pod.log_directory.clone(),
        cgroup: pod.cgroup(),
        containers: pod
            .containers
            .values()
            .map(|c| UsageContainer {
                id: c.id.clone(),
                name: c.name.clone(),
            })
            .collect(),
    }
}

/// One place in an order, before it becomes a [`Victim`].
struct Ranked {
    sandbox_id: String,
    usage: Option<i64>,
    request: i64,
    reclaimable: u64,
}

/// The pod's entry for the usage orders (pid, disk; `request` for disk).
fn pod_use(p: &Pod, usage: Option<u64>, reclaimable: u64, request: Option<UsageRequest>) -> PodUse {
    PodUse {
        sandbox_id: p.sandbox_id.clone(),
        priority: p.priority,
        critical: p.critical,
        usage,
        reclaimable,
        request,
    }
}

/// The kubelet's usage order (priority, then usage) as places.
fn ranked_uses(uses: &[PodUse]) -> impl Iterator<Item = Ranked> + '_ {
    rank_usage(uses).into_iter().map(|u| Ranked {
        sandbox_id: u.sandbox_id.clone(),
        usage: u.usage.map(|n| n as i64),
        request: u.request.map_or(0, |r| r.amount as i64),
        reclaimable: u.reclaimable,
    })
}

/// The one shape of every order: each place becomes a [`Victim`] with its
/// pod; only the first victim, the one an eviction names, gets its
/// heaviest container read (`heaviest`).
fn victims(
    pods: Vec<Pod>,
    ranked: impl Iterator<Item = Ranked>,
    heaviest: impl Fn(&Pod) -> Option<(String, i64, i64)>,
) -> Vec<Victim> {
    let mut by_id: HashMap<String, Pod> = pods
        .into_iter()
        .map(|p| (p.sandbox_id.clone(), p))
        .collect();
    ranked
        .filter_map(|r| {
            let pod = by_id.remove(&r.sandbox_id)?;
            Some(Victim {
                usage: r.usage,
                request: r.request,
                heaviest: None,
                reclaimable: r.reclaimable,
                pod,
            })
        })
        .enumerate()
        .map(|(i, mut v)| {
            if i == 0 {
                v.heaviest = heaviest(&v.pod);
            }
            v
        })
        .collect()
}

/// A pod's running containers with a known cgroup.
fn running(pod: &Pod) -> impl Iterator<Item = &crate::model::Container> {
    pod.containers
        .values()
        .filter(|c| c.state == ContainerState::Running && !c.cgroup_path.is_empty())
}

/// `read` over every pod, a few threads at a time (cgroup files are read by
/// the kernel on the reader's CPU, so more threads than CPUs gain nothing);
/// results in the pods' order.
fn per_pod<T: Send>(pods: &[Pod], read: impl Fn(&Pod) -> Option<T> + Sync) -> Vec<Option<T>> {
    const PER_THREAD: usize = 32;
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4)
        .min(pods.len().div_ceil(PER_THREAD))
        .max(1);
    if threads == 1 {
        return pods.iter().map(&read).collect();
    }
    let chunk = pods.len().div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .chunks(chunk)
            .map(|part| s.spawn(|| part.iter().map(&read).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    })
}

/// Runs blocking reads on tokio's blocking pool, off the thread that runs
/// criguard's loops (and never on the proxy's own thread).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => v,
        Err(err) => std::panic::resume_unwind(err.into_panic()),
    }
}

#[cfg(test)]
mod tests;
