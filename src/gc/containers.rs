//! Dead-container and sandbox garbage collection through the CRI.
//!
//! Each round lists the runtime's containers and sandboxes, asks the pure
//! policy ([`crate::gc::container_policy`]) what may go, and removes it with
//! RemoveContainer and RemovePodSandbox, so containerd's own bookkeeping
//! stays right. One deviation from the kubelet, for safety: a container in
//! state Created (made but not yet started) is never collected, since the
//! kubelet may be about to start it.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

use k8s_cri::v1 as cri;

use super::metrics::{Action, GcMetrics};
use crate::gc::container_policy::{
    DeadContainer, GcPolicy, SandboxRecord, containers_of_terminated_pods, containers_to_remove,
    sandboxes_to_remove,
};
use crate::model::keys::LABEL_POD_UID;
use crate::runtime::remove::remove_container;
use crate::runtime::{CALL_DEADLINE, Upstream, bounded};
use crate::signals::probe;

/// What one round removed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GcReport {
    /// Container ids removed.
    pub containers: Vec<String>,
    /// Sandbox ids removed.
    pub sandboxes: Vec<String>,
    /// Bytes freed on the watched filesystems, measured (`statvfs`).
    pub freed: u64,
}

/// The container garbage collector.
#[derive(Clone, Debug)]
pub struct ContainerGc {
    upstream: Upstream,
    policy: GcPolicy,
    filesystems: Vec<PathBuf>,
    metrics: GcMetrics,
}

/// Free bytes of each distinct filesystem among `paths` (by device).
/// Read through [`crate::signals::probe`]: a hung filesystem is skipped
/// after its deadline, never waited on.
async fn free_space(paths: &[PathBuf]) -> HashMap<u64, u64> {
    let mut out = HashMap::new();
    for p in paths {
        if let Ok((fs, id)) = probe::statvfs_id(p).await {
            out.insert(id, fs.available);
        }
    }
    out
}

/// Bytes freed between two [`free_space`] readings (0 where one is missing).
fn freed_between(before: &HashMap<u64, u64>, after: &HashMap<u64, u64>) -> u64 {
    before
        .iter()
        .filter_map(|(dev, b)| Some(after.get(dev)?.saturating_sub(*b)))
        .sum()
}

impl ContainerGc {
    /// A collector with `policy`, acting through `upstream`.
    pub fn new(upstream: Upstream, policy: GcPolicy) -> Self {
        Self {
            upstream,
            policy,
            filesystems: Vec::new(),
            metrics: GcMetrics::default(),
        }
    }

    /// The same collector, measuring the space it frees on the filesystems
    /// holding `filesystems` (imagefs: writable layers; nodefs: logs) and
    /// counting it in `metrics`.
    pub fn with_reclaim(mut self, filesystems: Vec<PathBuf>, metrics: GcMetrics) -> Self {
        self.filesystems = filesystems;
        self.metrics = metrics;
        self
    }

    /// One periodic round; runtime errors are logged and the round ends early.
    pub async fn round(&self) -> GcReport {
        self.collect(false).await
    }

    /// Reclaim under disk pressure (the kubelet's DeleteAllUnusedContainers):
    /// a round that also removes every dead container of pods with no ready
    /// sandbox.
    pub async fn reclaim(&self) -> GcReport {
        self.collect(true).await
    }

    async fn collect(&self, pressure: bool) -> GcReport {
        let before = free_space(&self.filesystems).await;
        let mut report = self.remove(pressure).await;
        report.freed = freed_between(&before, &free_space(&self.filesystems).await);
        let n = (report.containers.len() + report.sandboxes.len()) as u64;
        self.metrics.record(Action::ContainerGc, n, report.freed);
        if n > 0 {
            tracing::info!(
                containers = report.containers.len(),
                sandboxes = report.sandboxes.len(),
                freed = report.freed,
                "container GC: freed {}",
                crate::quantity::format_bytes(report.freed)
            );
        }
        report
    }

    /// Lists, decides and removes: dead containers first, then the
    /// sandboxes left without containers. A list call that fails is
    /// logged (warn) and ends the round with nothing removed.
    async fn remove(&self, pressure: bool) -> GcReport {
        let mut report = GcReport::default();
        let mut rt = self.upstream.runtime();
        let (sandboxes, containers) = match list(&mut rt).await {
            Ok(lists) => lists,
            Err(err) => {
                tracing::warn!(%err, "container GC: cannot list sandboxes and containers; skipped");
                return report;
            }
        };
        let dead = dead_containers(&containers);
        let ids = if pressure {
            let ready = ready_pods(&sandboxes);
            containers_of_terminated_pods(&dead, &ready, self.policy, crate::clock::now_ns())
        } else {
            containers_to_remove(&dead, self.policy, crate::clock::now_ns())
        };
        for id in ids {
            if remove_container(&mut rt, &id).await {
                tracing::info!(container = %id, policy = ?self.policy, pressure, "container GC: removed a dead container and its log");
                report.containers.push(id);
            }
        }
        let records = sandbox_records(&sandboxes, &containers, &report.containers);
        for id in sandboxes_to_remove(&records) {
            if remove_sandbox(&mut rt, &id).await {
                report.sandboxes.push(id);
            }
        }
        report
    }
}

/// The runtime's sandboxes and containers (ListPodSandbox, then
/// ListContainers).
async fn list(
    rt: &mut cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
) -> Result<(Vec<cri::PodSandbox>, Vec<cri::Container>), tonic::Status> {
    let list = rt.list_pod_sandbox(cri::ListPodSandboxRequest { filter: None });
    let sandboxes = bounded("ListPodSandbox", CALL_DEADLINE, list).await?;
    let list = rt.list_containers(cri::ListContainersRequest { filter: None });
    let containers = bounded("ListContainers", CALL_DEADLINE, list).await?;
    Ok((
        sandboxes.into_inner().items,
        containers.into_inner().containers,
    ))
}

/// The exited (or unknown) containers among `containers`, as the policy
/// sees them: their pod by its uid label, else by their sandbox.
fn dead_containers(containers: &[cri::Container]) -> Vec<DeadContainer> {
    let exited = cri::ContainerState::ContainerExited as i32;
    let unknown = cri::ContainerState::ContainerUnknown as i32;
    containers
        .iter()
        .filter(|c| c.state == exited || c.state == unknown)
        .map(|c| DeadContainer {
            id: c.id.clone(),
            pod_uid: c
                .labels
                .get(LABEL_POD_UID)
                .cloned()
                .unwrap_or_else(|| c.pod_sandbox_id.clone()),
            name: c
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default(),
            created_at_ns: c.created_at,
        })
        .collect()
}

/// The uids of the pods with a ready sandbox.
fn ready_pods(sandboxes: &[cri::PodSandbox]) -> BTreeSet<String> {
    let ready = cri::PodSandboxState::SandboxReady as i32;
    sandboxes
        .iter()
        .filter(|s| s.state == ready)
        .filter_map(|s| Some(s.metadata.as_ref()?.uid.clone()))
        .collect()
}

/// Each sandbox as the policy sees it, counting the containers that
/// remain once those in `removed` are gone.
fn sandbox_records(
    sandboxes: &[cri::PodSandbox],
    containers: &[cri::Container],
    removed: &[String],
) -> Vec<SandboxRecord> {
    let remaining: Vec<&cri::Container> = containers
        .iter()
        .filter(|c| !removed.contains(&c.id))
        .collect();
    sandboxes
        .iter()
        .map(|s| SandboxRecord {
            id: s.id.clone(),
            pod_uid: s
                .metadata
                .as_ref()
                .map(|m| m.uid.clone())
                .unwrap_or_default(),
            ready: s.state == cri::PodSandboxState::SandboxReady as i32,
            created_at_ns: s.created_at,
            containers: remaining
                .iter()
                .filter(|c| c.pod_sandbox_id == s.id)
                .count(),
        })
        .collect()
}

/// Removes sandbox `id` (RemovePodSandbox); false, logged, when it failed.
async fn remove_sandbox(
    rt: &mut cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
    id: &str,
) -> bool {
    let remove = rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: id.to_owned(),
    });
    match bounded("RemovePodSandbox", CALL_DEADLINE, remove).await {
        Ok(_) => {
            tracing::info!(sandbox = %id, "container GC: removed a dead sandbox with no containers");
            true
        }
        Err(err) => {
            tracing::warn!(sandbox = %id, %err, "container GC: RemovePodSandbox failed");
            false
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    fn container(id: &str, sandbox: &str, state: cri::ContainerState) -> cri::Container {
        cri::Container {
            id: id.to_owned(),
            pod_sandbox_id: sandbox.to_owned(),
            state: state as i32,
            ..Default::default()
        }
    }

    fn sandbox(id: &str, uid: &str, state: cri::PodSandboxState) -> cri::PodSandbox {
        cri::PodSandbox {
            id: id.to_owned(),
            metadata: Some(cri::PodSandboxMetadata {
                uid: uid.to_owned(),
                ..Default::default()
            }),
            state: state as i32,
            ..Default::default()
        }
    }

    #[test]
    fn exited_and_unknown_containers_are_dead_and_belong_to_their_uid_label_else_sandbox() {
        use cri::ContainerState::*;
        let mut labelled = container("a", "s1", ContainerExited);
        labelled
            .labels
            .insert(LABEL_POD_UID.to_owned(), "uid-1".to_owned());
        let containers = [
            labelled,
            container("b", "s2", ContainerUnknown),
            container("c", "s2", ContainerRunning),
            container("d", "s2", ContainerCreated),
        ];
        let dead = dead_containers(&containers);
        let got: Vec<_> = dead.iter().map(|d| (&*d.id, &*d.pod_uid)).collect();
        assert_eq!(got, [("a", "uid-1"), ("b", "s2")]);
    }

    #[test]
    fn sandboxes_count_only_the_containers_that_remain() {
        use cri::ContainerState::*;
        use cri::PodSandboxState::*;
        let sandboxes = [
            sandbox("s1", "u1", SandboxReady),
            sandbox("s2", "u2", SandboxNotready),
        ];
        let containers = [
            container("a", "s1", ContainerRunning),
            container("b", "s2", ContainerExited),
            container("c", "s2", ContainerExited),
        ];
        assert_eq!(ready_pods(&sandboxes), BTreeSet::from(["u1".to_owned()]));
        let records = sandbox_records(&sandboxes, &containers, &["b".to_owned()]);
        let got: Vec<_> = records
            .iter()
            .map(|r| (&*r.id, &*r.pod_uid, r.ready, r.containers))
            .collect();
        assert_eq!(got, [("s1", "u1", true, 1), ("s2", "u2", false, 1)]);
    }
}
