//! What the API's pod object says and CRI does not: exact requests and
//! limits (per container and pod-level), overhead, priority, the
//! containers' kinds, emptyDir volumes. Plain data and pure functions that
//! compute from it what the kubelet v1.37 computes from the same pod:
//!
//! - [`pod_request`] is `GetResourceRequestQuantity`
//!   (`pkg/api/v1/resource/helpers.go`), the request the eviction manager
//!   ranks by, over `PodRequests` (`k8s.io/component-helpers/resource`):
//!   init containers, sidecars, pod-level requests and overhead;
//! - [`oom_score_adj`] is `GetContainerOOMScoreAdjust`
//!   (`pkg/kubelet/qos/policy.go`): node-critical pods, the pod-level share
//!   and the sidecar rule;
//! - [`ApiPod::critical`] is `IsCriticalPod` (`pkg/kubelet/types/pod_update.go`).
//!
//! The kubelet ranks its pods "updated to their allocated state"
//! (`getAllocatedPods`): a container's requests are the ones the kubelet
//! allocated after an in-place resize, which the API shows in
//! `status.containerStatuses[].allocatedResources`; the conversion from
//! the API object (`kube::pods`) takes those where present.

use serde::{Deserialize, Serialize};

use super::qos::{
    BESTEFFORT_OOM_SCORE_ADJ, GUARANTEED_OOM_SCORE_ADJ, QosClass, SYSTEM_CRITICAL_PRIORITY,
};

/// The priority class of pods the kubelet scores as node-critical
/// (`pkg/apis/scheduling`, SystemNodeCritical).
pub const SYSTEM_NODE_CRITICAL: &str = "system-node-critical";

/// The resources criguard reads, each `None` when the list does not name it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    /// `memory`, bytes.
    pub memory: Option<i64>,
    /// `ephemeral-storage`, bytes.
    pub ephemeral_storage: Option<i64>,
}

/// Which resource a computation is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    /// `memory`.
    Memory,
    /// `ephemeral-storage`.
    EphemeralStorage,
}

impl Resources {
    /// The value of `r`, if named.
    pub fn get(&self, r: Resource) -> Option<i64> {
        match r {
            Resource::Memory => self.memory,
            Resource::EphemeralStorage => self.ephemeral_storage,
        }
    }
}

/// How a container runs in its pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContainerKind {
    /// `spec.containers`.
    Regular,
    /// `spec.initContainers`, run to completion before the regular ones.
    Init,
    /// `spec.initContainers` with `restartPolicy: Always` (a sidecar).
    Sidecar,
}

/// A container of the API's pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiContainer {
    /// `name`, as the kubelet passes it to CRI.
    pub name: String,
    /// Regular, init or sidecar.
    pub kind: ContainerKind,
    /// Requests (the allocated ones after a resize).
    pub requests: Resources,
    /// Limits.
    pub limits: Resources,
}

/// An emptyDir volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmptyDir {
    /// Volume name.
    pub name: String,
    /// `medium: Memory` (a tmpfs, charged to the pod's memory).
    pub memory: bool,
    /// `sizeLimit`, bytes.
    pub size_limit: Option<i64>,
}

/// The facts of one pod from the API, keyed by the UID its sandbox carries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiPod {
    /// The UID the kubelet gives the pod's sandbox: the pod's own, or for a
    /// mirror pod the static pod's (its `kubernetes.io/config.mirror`).
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `spec.priority` (`None`: not set, which the kubelet reads as 0).
    pub priority: Option<i32>,
    /// `spec.priorityClassName`.
    pub priority_class: String,
    /// A mirror pod (the API's copy of a static pod).
    pub mirror: bool,
    /// Containers, regular and init, in spec order (regular first).
    pub containers: Vec<ApiContainer>,
    /// Pod-level resources are set: `spec.resources` names CPU, memory or
    /// huge pages (`IsPodLevelResourcesSet`).
    pub pod_level: bool,
    /// Pod-level memory request (`spec.resources.requests.memory`).
    pub pod_memory_request: Option<i64>,
    /// Pod-level memory limit (`spec.resources.limits.memory`).
    pub pod_memory_limit: Option<i64>,
    /// `spec.overhead`.
    pub overhead: Resources,
    /// emptyDir volumes.
    pub empty_dirs: Vec<EmptyDir>,
}

impl ApiPod {
    /// The priority the kubelet ranks by (`PodPriority`: 0 when unset).
    pub fn priority(&self) -> i32 {
        self.priority.unwrap_or(0)
    }

    /// `IsCriticalPod`: a mirror (static) pod, or priority at least
    /// `SystemCriticalPriority`. A static pod with no mirror in the API is
    /// recognised from its sandbox's config source instead.
    pub fn critical(&self) -> bool {
        self.mirror || self.priority() >= SYSTEM_CRITICAL_PRIORITY
    }

    /// `IsNodeCriticalPod`: critical and of class `system-node-critical`.
    pub fn node_critical(&self) -> bool {
        self.critical() && self.priority_class == SYSTEM_NODE_CRITICAL
    }

    /// The container named `name`.
    pub fn container(&self, name: &str) -> Option<&ApiContainer> {
        self.containers.iter().find(|c| c.name == name)
    }

    fn regular(&self) -> impl Iterator<Item = &ApiContainer> {
        self.containers
            .iter()
            .filter(|c| c.kind == ContainerKind::Regular)
    }
}

/// The containers' aggregate of `value` (a request or a limit), as the
/// kubelet aggregates both (`aggregateContainerResourcesByFn`): the
/// regular containers and sidecars summed, and no less than what any init
/// container needs while it runs (itself plus the sidecars started before
/// it). `None` when no container has a value.
pub fn aggregate(pod: &ApiPod, value: impl Fn(&ApiContainer) -> Option<i64>) -> Option<i64> {
    let mut named = false;
    let mut sum = 0i64;
    let mut sidecars = 0i64;
    let mut init_peak = 0i64;
    for c in &pod.containers {
        let v = value(c);
        named |= v.is_some();
        let v = v.unwrap_or(0);
        match c.kind {
            ContainerKind::Regular => sum += v,
            ContainerKind::Sidecar => {
                sum += v;
                sidecars += v;
                init_peak = init_peak.max(sidecars);
            }
            ContainerKind::Init => init_peak = init_peak.max(v + sidecars),
        }
    }
    named.then_some(sum.max(init_peak))
}

/// The containers' aggregate request of `r` (`AggregateContainerRequests`,
/// [`aggregate`]).
pub fn aggregate_container_requests(pod: &ApiPod, r: Resource) -> Option<i64> {
    aggregate(pod, |c| c.requests.get(r))
}

/// The pod's request of `r` the eviction manager ranks by
/// (`GetResourceRequestQuantity`): with pod-level resources set, the
/// pod-level request alone (memory only: ephemeral-storage is no pod-level
/// resource, so such a pod requests none); else the containers' aggregate;
/// plus the overhead when that is not zero.
pub fn pod_request(pod: &ApiPod, r: Resource) -> i64 {
    let base = if pod.pod_level {
        match r {
            Resource::Memory => pod.pod_memory_request.unwrap_or(0),
            Resource::EphemeralStorage => 0,
        }
    } else {
        aggregate_container_requests(pod, r).unwrap_or(0)
    };
    if base == 0 {
        return 0;
    }
    base + pod.overhead.get(r).unwrap_or(0)
}

/// The part of the pod-level memory request no container requests, shared
/// per container (`remainingPodMemReqPerContainer`); 0 without one.
fn remaining_memory_per_container(pod: &ApiPod) -> i64 {
    let Some(pod_req) = pod.pod_memory_request.filter(|m| *m > 0) else {
        return 0;
    };
    let containers = pod.containers.len().max(1) as i64;
    let aggregate = aggregate_container_requests(pod, Resource::Memory).unwrap_or(0);
    (pod_req - aggregate).max(0) / containers
}

/// The kubelet's `oom_score_adj` for container `name` of `pod`, whose QoS
/// class is `qos`, on a node of `capacity` bytes
/// (`GetContainerOOMScoreAdjust`, v1.37, without the alpha DRA share):
/// node-critical and Guaranteed −997, BestEffort 1000; Burstable
/// `1000 − 1000·request/capacity` where the request includes the container's
/// share of an unallocated pod-level request, a sidecar scores no higher
/// than the regular container with the smallest request, and the result is
/// kept within [3, 999]. `None` when the pod has no such container.
pub fn oom_score_adj(pod: &ApiPod, qos: QosClass, name: &str, capacity: i64) -> Option<i64> {
    let container = pod.container(name)?;
    if pod.node_critical() {
        return Some(GUARANTEED_OOM_SCORE_ADJ);
    }
    match qos {
        QosClass::Guaranteed => return Some(GUARANTEED_OOM_SCORE_ADJ),
        QosClass::BestEffort => return Some(BESTEFFORT_OOM_SCORE_ADJ),
        QosClass::Burstable => {}
    }
    let capacity = capacity.max(1) as i128;
    let score = |request: i64| 1000 - (1000 * request as i128 / capacity) as i64;
    let share = remaining_memory_per_container(pod);
    let request = container.requests.memory.unwrap_or(0);
    let mut adj = score(request + share);
    if container.kind == ContainerKind::Sidecar
        && let Some(min) = pod.regular().map(|c| c.requests.memory.unwrap_or(0)).min()
    {
        adj = adj.min(score(min + share));
    }
    Some(if adj < 1000 + GUARANTEED_OOM_SCORE_ADJ {
        1000 + GUARANTEED_OOM_SCORE_ADJ
    } else if adj == BESTEFFORT_OOM_SCORE_ADJ {
        adj - 1
    } else {
        adj
    })
}

#[cfg(test)]
mod tests;
