//! The node model: every pod and container on the node, as the kubelet's
//! eviction manager would know them.
//!
//! Plain data with pure updates. criguard feeds it from two sides: the CRI
//! calls it forwards (immediately, see `cri::observe`) and the runtime's own
//! lists (at start and on every sync, see `runtime::sync`), so the model is rebuilt
//! from containerd after a restart and needs no state file of its own.
//! Derived fields (QoS class, memory requests, criticality) are recomputed
//! from the stored inputs whenever those change, never patched by hand.
//! containerd's task events (applied by `runtime::track`) tell it at once
//! of what the calls do not show: a container that exits by itself. The
//! model does no I/O and knows no client: those loops live beside the
//! runtime client and write it through its pure updates.
//!
//! States only move forward (Created → Running → Exited, Ready → NotReady):
//! CRI never restarts a container or a sandbox under the same id, so a
//! stale report (a list read before an exit event, a StartContainer answer
//! observed after the container already died) cannot undo a newer one.

pub mod convert;
pub mod derive;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod keys;
pub mod qos;
pub mod spec;

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use qos::QosClass;
use spec::{ApiPod, Resource};

/// A sandbox's state, as CRI reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SandboxState {
    /// Running.
    Ready,
    /// Stopped (or not yet started).
    NotReady,
}

/// A container's state, as CRI reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContainerState {
    /// Created, not started.
    Created,
    /// Running.
    Running,
    /// Exited.
    Exited,
    /// The runtime does not know.
    Unknown,
}

impl SandboxState {
    /// The state after `self` when `next` is reported: NotReady is final.
    pub fn then(self, next: SandboxState) -> SandboxState {
        match self {
            SandboxState::NotReady => SandboxState::NotReady,
            SandboxState::Ready => next,
        }
    }
}

impl ContainerState {
    fn order(self) -> u8 {
        match self {
            ContainerState::Unknown => 0,
            ContainerState::Created => 1,
            ContainerState::Running => 2,
            ContainerState::Exited => 3,
        }
    }

    /// The state after `self` when `next` is reported: never backwards
    /// (Exited is final); Unknown replaces nothing the model knew.
    pub fn then(self, next: ContainerState) -> ContainerState {
        if next.order() >= self.order() {
            next
        } else {
            self
        }
    }
}

/// Who a task id belongs to, after a task exit was applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskOwner {
    /// A container of sandbox `sandbox_id`; it is Exited now.
    Container {
        /// Its sandbox.
        sandbox_id: String,
    },
    /// A sandbox's own (pause) task; the sandbox is NotReady now.
    Sandbox,
    /// Nothing the model knows (yet): the next sync learns it.
    Unknown,
}

/// A sandbox as learned from RunPodSandbox or the runtime: inputs only.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct SandboxInfo {
    /// Sandbox id.
    pub id: String,
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod UID.
    pub uid: String,
    /// Sandbox attempt.
    pub attempt: u32,
    /// The pod annotations criguard reads ([`convert::READ_ANNOTATIONS`]).
    pub annotations: HashMap<String, String>,
    /// `LinuxPodSandboxConfig.cgroup_parent`.
    pub cgroup_parent: String,
    /// Pod log directory.
    pub log_directory: String,
    /// Creation time, ns since the epoch (0 until the runtime tells).
    pub created_at_ns: i64,
    /// State (None until the runtime tells; RunPodSandbox success means Ready).
    pub state: Option<SandboxState>,
}

/// A container as learned from CreateContainer or the runtime: inputs only.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ContainerInfo {
    /// Container id.
    pub id: String,
    /// Its sandbox.
    pub sandbox_id: String,
    /// Container name.
    pub name: String,
    /// Container attempt (restart count).
    pub attempt: u32,
    /// Image reference as the kubelet asked for it.
    pub image: String,
    /// The container annotations criguard reads ([`convert::READ_ANNOTATIONS`]).
    pub annotations: HashMap<String, String>,
    /// CPU shares.
    pub cpu_shares: i64,
    /// CPU CFS quota (µs per period; 0 or −1: none).
    pub cpu_quota: i64,
    /// CPU CFS period (µs).
    pub cpu_period: i64,
    /// Memory limit in bytes (0: none).
    pub memory_limit: i64,
    /// The `oom_score_adj` the container was created with (the kubelet's,
    /// after criguard's patch; what containerd stores).
    pub oom_score_adj: i64,
    /// Creation time, ns since the epoch (0 until the runtime tells).
    pub created_at_ns: i64,
    /// State (None until the runtime tells).
    pub state: Option<ContainerState>,
}

/// The resources of a container the runtime can change in place
/// (`LinuxContainerResources`, UpdateContainerResources).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContainerResources {
    /// CPU shares.
    pub cpu_shares: i64,
    /// CPU CFS quota.
    pub cpu_quota: i64,
    /// CPU CFS period.
    pub cpu_period: i64,
    /// Memory limit in bytes (0: none).
    pub memory_limit: i64,
}

/// A container in the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Container {
    /// Container id.
    pub id: String,
    /// Container name.
    pub name: String,
    /// Attempt.
    pub attempt: u32,
    /// Image reference.
    pub image: String,
    /// Cgroup path from the hierarchy root, as
    /// [`crate::cgroup::path::container`] resolves it (cgroupfs:
    /// `<cgroup parent>/<id>`; systemd: the expanded slice's
    /// `cri-containerd-<id>.scope`); empty when the pod has no cgroup parent.
    pub cgroup_path: String,
    /// CPU shares.
    pub cpu_shares: i64,
    /// CPU quota.
    pub cpu_quota: i64,
    /// CPU period.
    pub cpu_period: i64,
    /// Memory limit in bytes (0: none).
    pub memory_limit: i64,
    /// The `oom_score_adj` it was created with (after criguard's patch).
    pub oom_score_adj: i64,
    /// Memory request in bytes: the API's (the allocated one after a
    /// resize) where the pod is known there, else derived from the score
    /// ([`derive::memory_request`]).
    pub memory_request: i64,
    /// Ephemeral-storage request in bytes, from the API (0 without it:
    /// CRI carries none).
    #[serde(default)]
    pub ephemeral_storage_request: i64,
    /// The kubelet's `oom_score_adj` for it computed from the API's pod
    /// ([`spec::oom_score_adj`]); `None` without the API's pod.
    #[serde(default)]
    pub api_oom_score_adj: Option<i64>,
    /// State.
    pub state: ContainerState,
    /// Creation time, ns since the epoch.
    pub created_at_ns: i64,
}

/// Where a pod's requests, priority and criticality come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PodSource {
    /// The API's pod object (`kubeconfig` set and the pod seen there).
    Api,
    /// Inferred from what CRI carries (the score, annotations, cgroup).
    #[default]
    Inferred,
}

impl PodSource {
    /// `api` or `inferred`, as shown and counted.
    pub fn as_str(self) -> &'static str {
        match self {
            PodSource::Api => "api",
            PodSource::Inferred => "inferred",
        }
    }
}

/// A pod's requests as the eviction manager ranks by them
/// (`GetResourceRequestQuantity`, [`spec::pod_request`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRequests {
    /// Memory, bytes.
    pub memory: i64,
    /// Ephemeral storage, bytes (0 without the API: CRI carries none).
    pub ephemeral_storage: i64,
    /// The pod-level memory request, when pod-level resources are set: the
    /// eviction message then names the pod's usage against it.
    pub pod_level_memory: Option<i64>,
}

/// A pod in the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pod {
    /// Pod UID.
    pub uid: String,
    /// Pod name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Sandbox id.
    pub sandbox_id: String,
    /// Sandbox attempt.
    pub attempt: u32,
    /// Cgroup parent.
    pub cgroup_parent: String,
    /// Log directory.
    pub log_directory: String,
    /// QoS class.
    pub qos: QosClass,
    /// Priority (see [`derive::PRIORITY_ANNOTATION`]).
    pub priority: i32,
    /// Static pod (config source other than the API server).
    pub static_pod: bool,
    /// Critical: never chosen for eviction.
    pub critical: bool,
    /// Termination grace period in seconds, from the containers' annotation.
    pub grace_period_s: Option<i64>,
    /// Sandbox state.
    pub state: SandboxState,
    /// Creation time, ns since the epoch.
    pub created_at_ns: i64,
    /// Containers by id.
    pub containers: BTreeMap<String, Container>,
    /// Where requests, priority and criticality come from.
    #[serde(default)]
    pub source: PodSource,
    /// The requests the eviction manager ranks by.
    #[serde(default)]
    pub requests: PodRequests,
}

impl Pod {
    /// The memory request the eviction manager ranks by: the API's pod
    /// request (init containers, sidecars, pod-level, overhead) where
    /// known, else the sum of the containers' derived requests.
    pub fn memory_request(&self) -> i64 {
        self.requests.memory
    }

    /// The pod's cgroup from the hierarchy root, for either cgroup driver
    /// ([`crate::cgroup::path::pod`]); `None` without a cgroup parent.
    pub fn cgroup(&self) -> Option<String> {
        crate::cgroup::path::pod(&self.cgroup_parent)
    }
}

/// Where containerd puts a container's cgroup, from the hierarchy root
/// ([`crate::cgroup::path::container`]); empty when unknown.
pub fn container_cgroup(parent: &str, id: &str) -> String {
    crate::cgroup::path::container(parent, id).unwrap_or_default()
}

/// Sets `*field` to `value`; true when that changed it.
fn set<T: PartialEq>(field: &mut T, value: T) -> bool {
    let changed = *field != value;
    *field = value;
    changed
}

/// A state moved forward to `next` by `then` ([`SandboxState::then`],
/// [`ContainerState::then`]); true when that changed it.
fn forward<S: Copy + PartialEq>(state: &mut Option<S>, next: S, then: fn(S, S) -> S) -> bool {
    let value = Some(state.map_or(next, |o| then(o, next)));
    set(state, value)
}

/// All pods on the node, by sandbox id.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeModel {
    memory_capacity: i64,
    sandboxes: BTreeMap<String, SandboxInfo>,
    containers: BTreeMap<String, ContainerInfo>,
    /// The API's pods bound to this node, by the UID their sandbox carries.
    api: HashMap<String, ApiPod>,
    /// Bumped by every change (see [`NodeModel::generation`]).
    generation: u64,
}

impl NodeModel {
    /// An empty model for a node with `memory_capacity` bytes (used to
    /// recover Burstable memory requests).
    pub fn new(memory_capacity: i64) -> Self {
        Self {
            memory_capacity,
            ..Default::default()
        }
    }

    /// The node memory capacity the model derives requests with.
    pub fn memory_capacity(&self) -> i64 {
        self.memory_capacity
    }

    /// A number that changes whenever anything in the model does (a pod or
    /// container added, removed, or moved to another state): readers that
    /// derive data from the model compare it to know whether to derive
    /// again. It never changes when an update changes nothing (a sync that
    /// finds the runtime as the model already knew it).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Adds or replaces a sandbox. Runtime-owned fields that `info` leaves
    /// unset (creation time, state) keep what the model knew.
    pub fn upsert_sandbox(&mut self, mut info: SandboxInfo) {
        if let Some(old) = self.sandboxes.get(&info.id) {
            if info.created_at_ns == 0 {
                info.created_at_ns = old.created_at_ns;
            }
            info.state = match (old.state, info.state) {
                (Some(o), Some(n)) => Some(o.then(n)),
                (o, n) => n.or(o),
            };
        }
        if self.sandboxes.get(&info.id) != Some(&info) {
            self.generation += 1;
            self.sandboxes.insert(info.id.clone(), info);
        }
    }

    /// Adds or replaces a container, keeping runtime-owned fields as above.
    pub fn upsert_container(&mut self, mut info: ContainerInfo) {
        if let Some(old) = self.containers.get(&info.id) {
            if info.created_at_ns == 0 {
                info.created_at_ns = old.created_at_ns;
            }
            info.state = match (old.state, info.state) {
                (Some(o), Some(n)) => Some(o.then(n)),
                (o, n) => n.or(o),
            };
        }
        if self.containers.get(&info.id) != Some(&info) {
            self.generation += 1;
            self.containers.insert(info.id.clone(), info);
        }
    }

    /// Replaces every API pod with `pods` (a fresh list of the API's).
    pub fn set_api_pods(&mut self, pods: impl IntoIterator<Item = ApiPod>) {
        let pods: HashMap<String, ApiPod> = pods.into_iter().map(|p| (p.uid.clone(), p)).collect();
        if pods != self.api {
            self.api = pods;
            self.generation += 1;
        }
    }

    /// Adds or replaces one API pod.
    pub fn upsert_api_pod(&mut self, pod: ApiPod) {
        if self.api.get(&pod.uid) != Some(&pod) {
            self.api.insert(pod.uid.clone(), pod);
            self.generation += 1;
        }
    }

    /// Forgets the API pod of `uid`.
    pub fn remove_api_pod(&mut self, uid: &str) {
        if self.api.remove(uid).is_some() {
            self.generation += 1;
        }
    }

    /// The API pod of `uid`, if the API told of one.
    pub fn api_pod(&self, uid: &str) -> Option<&ApiPod> {
        self.api.get(uid)
    }

    /// How many sandboxes the model holds with their API pod, and without.
    pub fn sources(&self) -> (usize, usize) {
        let api = self
            .sandboxes
            .values()
            .filter(|s| self.api.contains_key(&s.uid))
            .count();
        (api, self.sandboxes.len() - api)
    }

    /// Sets a container's resources as an UpdateContainerResources call set
    /// them (an in-place resize): limits and CPU, the score unchanged.
    pub fn update_container_resources(&mut self, id: &str, res: &ContainerResources) {
        if let Some(c) = self.containers.get_mut(id) {
            let changed = set(&mut c.memory_limit, res.memory_limit)
                | set(&mut c.cpu_shares, res.cpu_shares)
                | set(&mut c.cpu_quota, res.cpu_quota)
                | set(&mut c.cpu_period, res.cpu_period);
            self.generation += u64::from(changed);
        }
    }

    /// Sets the score a container's processes were given outside its
    /// creation (a container created while criguard was not attached,
    /// raised to criguard's score): the running round's baseline for it.
    pub fn set_container_oom_score_adj(&mut self, id: &str, adj: i64) {
        if let Some(c) = self.containers.get_mut(id) {
            let changed = set(&mut c.oom_score_adj, adj);
            self.generation += u64::from(changed);
        }
    }

    /// Sets a sandbox's state (forward only); stopping a sandbox stops its containers.
    pub fn set_sandbox_state(&mut self, id: &str, state: SandboxState) {
        let mut changed = false;
        if let Some(s) = self.sandboxes.get_mut(id) {
            changed |= forward(&mut s.state, state, SandboxState::then);
        }
        if state == SandboxState::NotReady {
            for c in self.containers.values_mut().filter(|c| c.sandbox_id == id) {
                if c.state != Some(ContainerState::Created) {
                    changed |= set(&mut c.state, Some(ContainerState::Exited));
                }
            }
        }
        self.generation += u64::from(changed);
    }

    /// Sets a container's state (forward only).
    pub fn set_container_state(&mut self, id: &str, state: ContainerState) {
        if let Some(c) = self.containers.get_mut(id) {
            let changed = forward(&mut c.state, state, ContainerState::then);
            self.generation += u64::from(changed);
        }
    }

    /// A task's init process exited (containerd's `/tasks/exit`): a
    /// container is Exited; a sandbox's pause task leaves the sandbox
    /// NotReady, its containers as they are (they may still run; the kubelet
    /// stops them).
    pub fn task_exited(&mut self, task_id: &str) -> TaskOwner {
        if let Some(c) = self.containers.get_mut(task_id) {
            let changed = set(&mut c.state, Some(ContainerState::Exited));
            self.generation += u64::from(changed);
            return TaskOwner::Container {
                sandbox_id: c.sandbox_id.clone(),
            };
        }
        if let Some(s) = self.sandboxes.get_mut(task_id) {
            let changed = set(&mut s.state, Some(SandboxState::NotReady));
            self.generation += u64::from(changed);
            return TaskOwner::Sandbox;
        }
        TaskOwner::Unknown
    }

    /// Records the runtime's view of a sandbox's state (forward only) and creation time.
    pub fn refresh_sandbox(&mut self, id: &str, state: SandboxState, created_at_ns: i64) {
        if let Some(s) = self.sandboxes.get_mut(id) {
            let changed = forward(&mut s.state, state, SandboxState::then)
                | set(&mut s.created_at_ns, created_at_ns);
            self.generation += u64::from(changed);
        }
    }

    /// Records the runtime's view of a container's state (forward only) and creation time.
    pub fn refresh_container(&mut self, id: &str, state: ContainerState, created_at_ns: i64) {
        if let Some(c) = self.containers.get_mut(id) {
            let changed = forward(&mut c.state, state, ContainerState::then)
                | set(&mut c.created_at_ns, created_at_ns);
            self.generation += u64::from(changed);
        }
    }

    /// Forgets a container.
    pub fn remove_container(&mut self, id: &str) {
        if self.containers.remove(id).is_some() {
            self.generation += 1;
        }
    }

    /// Forgets a sandbox and its containers.
    pub fn remove_sandbox(&mut self, id: &str) {
        let before = self.containers.len();
        let gone = self.sandboxes.remove(id).is_some();
        self.containers.retain(|_, c| c.sandbox_id != id);
        if gone || self.containers.len() != before {
            self.generation += 1;
        }
    }

    /// The sandbox ids and container ids the model holds.
    pub fn ids(&self) -> (Vec<String>, Vec<String>) {
        (
            self.sandboxes.keys().cloned().collect(),
            self.containers.keys().cloned().collect(),
        )
    }

    /// A container's state, cheaply (`None`: not in the model, or not yet told).
    pub fn container_state(&self, id: &str) -> Option<ContainerState> {
        self.containers.get(id)?.state
    }

    /// The inputs known for a sandbox.
    pub fn sandbox_info(&self, id: &str) -> Option<&SandboxInfo> {
        self.sandboxes.get(id)
    }

    /// Every sandbox, ordered by id, without deriving its pod.
    pub fn sandbox_infos(&self) -> impl Iterator<Item = &SandboxInfo> {
        self.sandboxes.values()
    }

    /// One pod with everything derived.
    pub fn pod(&self, sandbox_id: &str) -> Option<Pod> {
        let s = self.sandboxes.get(sandbox_id)?;
        let infos: Vec<&ContainerInfo> = self
            .containers
            .values()
            .filter(|c| c.sandbox_id == s.id)
            .collect();
        Some(self.derive(s, &infos))
    }

    /// The pod of sandbox `sandbox_id` as it would be with container
    /// `extra` added (and, when the model does not know the sandbox, with
    /// `fallback` as its inputs), derived without copying the model: what
    /// the CreateContainer patch asks before the container exists.
    pub fn pod_with(
        &self,
        sandbox_id: &str,
        fallback: Option<SandboxInfo>,
        extra: &ContainerInfo,
    ) -> Option<Pod> {
        let owned;
        let s = match self.sandboxes.get(sandbox_id) {
            Some(s) => s,
            None => {
                owned = fallback?;
                &owned
            }
        };
        let mut infos: Vec<&ContainerInfo> = self
            .containers
            .values()
            .filter(|c| c.sandbox_id == sandbox_id && c.id != extra.id)
            .collect();
        infos.push(extra);
        Some(self.derive(s, &infos))
    }

    /// The pod of sandbox `s` with containers `infos`, everything derived.
    fn derive(&self, s: &SandboxInfo, infos: &[&ContainerInfo]) -> Pod {
        let adjs: Vec<i64> = infos.iter().map(|c| c.oom_score_adj).collect();
        let qos = derive::qos_from_cgroup_parent(&s.cgroup_parent).unwrap_or_else(|| {
            // No kubelet cgroup parent: the most telling container decides.
            adjs.iter()
                .map(|a| derive::qos_from_oom_score_adj(*a))
                .min_by_key(|q| match q {
                    QosClass::Burstable => 0,
                    QosClass::BestEffort => 1,
                    QosClass::Guaranteed => 2,
                })
                .unwrap_or(QosClass::BestEffort)
        });
        let api = self.api.get(&s.uid);
        let static_pod = derive::is_static(
            s.annotations
                .get(derive::CONFIG_SOURCE_ANNOTATION)
                .map(String::as_str),
        );
        let (priority, critical) = match api {
            Some(a) => (a.priority(), static_pod || a.critical()),
            None => {
                let priority = derive::priority(
                    s.annotations
                        .get(derive::PRIORITY_ANNOTATION)
                        .map(String::as_str),
                )
                .unwrap_or(0);
                (
                    priority,
                    derive::is_critical(static_pod, priority, qos, &adjs),
                )
            }
        };
        let grace_period_s = infos.iter().find_map(|c| {
            c.annotations
                .get(keys::ANNOTATION_GRACE)
                .and_then(|g| g.parse().ok())
        });
        let containers: BTreeMap<String, Container> = infos
            .iter()
            .map(|c| (c.id.clone(), self.container(s, c, qos, api)))
            .collect();
        let requests = match api {
            Some(a) => PodRequests {
                memory: spec::pod_request(a, Resource::Memory),
                ephemeral_storage: spec::pod_request(a, Resource::EphemeralStorage),
                pod_level_memory: a.pod_memory_request.filter(|_| a.pod_level),
            },
            None => PodRequests {
                memory: containers.values().map(|c| c.memory_request).sum(),
                ..Default::default()
            },
        };
        Pod {
            uid: s.uid.clone(),
            name: s.name.clone(),
            namespace: s.namespace.clone(),
            sandbox_id: s.id.clone(),
            attempt: s.attempt,
            cgroup_parent: s.cgroup_parent.clone(),
            log_directory: s.log_directory.clone(),
            qos,
            priority,
            static_pod,
            critical,
            grace_period_s,
            state: s.state.unwrap_or(SandboxState::NotReady),
            created_at_ns: s.created_at_ns,
            containers,
            source: if api.is_some() {
                PodSource::Api
            } else {
                PodSource::Inferred
            },
            requests,
        }
    }

    /// Container `c` of sandbox `s` (class `qos`), with its request and
    /// score from the API's pod `api` where it names the container.
    fn container(
        &self,
        s: &SandboxInfo,
        c: &ContainerInfo,
        qos: QosClass,
        api: Option<&ApiPod>,
    ) -> Container {
        let spec = api.and_then(|a| a.container(&c.name));
        let memory_request = match spec {
            Some(spec) => spec.requests.memory.unwrap_or(0),
            None => {
                derive::memory_request(qos, c.oom_score_adj, c.memory_limit, self.memory_capacity)
            }
        };
        Container {
            id: c.id.clone(),
            name: c.name.clone(),
            attempt: c.attempt,
            image: c.image.clone(),
            cgroup_path: container_cgroup(&s.cgroup_parent, &c.id),
            cpu_shares: c.cpu_shares,
            cpu_quota: c.cpu_quota,
            cpu_period: c.cpu_period,
            memory_limit: c.memory_limit,
            oom_score_adj: c.oom_score_adj,
            memory_request,
            ephemeral_storage_request: spec.and_then(|c| c.requests.ephemeral_storage).unwrap_or(0),
            api_oom_score_adj: api
                .and_then(|a| spec::oom_score_adj(a, qos, &c.name, self.memory_capacity)),
            state: c.state.unwrap_or(ContainerState::Unknown),
            created_at_ns: c.created_at_ns,
        }
    }

    /// Every pod, ordered by sandbox id (containers grouped in one pass,
    /// so that the cost grows with the pods, not with their square).
    pub fn pods(&self) -> Vec<Pod> {
        let mut by_sandbox: HashMap<&str, Vec<&ContainerInfo>> = HashMap::new();
        for c in self.containers.values() {
            by_sandbox.entry(&c.sandbox_id).or_default().push(c);
        }
        self.sandboxes
            .values()
            .map(|s| self.derive(s, by_sandbox.get(s.id.as_str()).map_or(&[], Vec::as_slice)))
            .collect()
    }

    /// The pod a container belongs to, derived, and the container's id.
    pub fn pod_of_container(&self, container_id: &str) -> Option<Pod> {
        let c = self.containers.get(container_id)?;
        self.pod(&c.sandbox_id)
    }
}

#[cfg(test)]
pub(crate) mod tests;
