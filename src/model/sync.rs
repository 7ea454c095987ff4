//! Keeping the model equal to the runtime.
//!
//! [`rebuild`] reads everything from the runtime (lists, then each object's
//! verbose status for the original config): criguard runs it before serving
//! its first call, so a restart loses nothing. [`sync`] is the cheap
//! follow-up: two list calls refresh states and creation times, objects the
//! model has not seen are read verbosely, and objects gone from the runtime
//! are dropped. It catches what passes criguard by (a container that exits
//! by itself, a call made straight to containerd).

use std::collections::HashSet;
use std::sync::RwLock;

use futures::{StreamExt, TryStreamExt, stream};
use k8s_cri::v1 as cri;

use super::NodeModel;
use super::convert::{self, InfoError};
use crate::runtime::Upstream;

/// Why the model could not be read from the runtime.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// A CRI call failed.
    #[error("{call}: {status}")]
    Call {
        /// The method.
        call: &'static str,
        /// The runtime's answer.
        status: tonic::Status,
    },
    /// A verbose status could not be read.
    #[error(transparent)]
    Info(#[from] InfoError),
}

/// How many verbose status calls a sync has in flight at once.
const FETCH_AT_ONCE: usize = 16;

fn call_err(call: &'static str) -> impl FnOnce(tonic::Status) -> SyncError {
    move |status| SyncError::Call { call, status }
}

async fn fetch_sandbox(up: &Upstream, id: &str) -> Result<Option<super::SandboxInfo>, SyncError> {
    let req = cri::PodSandboxStatusRequest {
        pod_sandbox_id: id.to_owned(),
        verbose: true,
    };
    match up.runtime().pod_sandbox_status(req).await {
        Ok(resp) => Ok(Some(convert::sandbox_from_status(&resp.into_inner())?)),
        // Removed between the list and this call.
        Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
        Err(s) => Err(call_err("PodSandboxStatus")(s)),
    }
}

async fn fetch_container(
    up: &Upstream,
    id: &str,
) -> Result<Option<super::ContainerInfo>, SyncError> {
    let req = cri::ContainerStatusRequest {
        container_id: id.to_owned(),
        verbose: true,
    };
    match up.runtime().container_status(req).await {
        Ok(resp) => Ok(Some(convert::container_from_status(&resp.into_inner())?)),
        Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
        Err(s) => Err(call_err("ContainerStatus")(s)),
    }
}

async fn lists(up: &Upstream) -> Result<(Vec<cri::PodSandbox>, Vec<cri::Container>), SyncError> {
    let sandboxes = up
        .runtime()
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .map_err(call_err("ListPodSandbox"))?
        .into_inner()
        .items;
    let containers = up
        .runtime()
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .map_err(call_err("ListContainers"))?
        .into_inner()
        .containers;
    Ok((sandboxes, containers))
}

/// Reads the whole model from the runtime.
pub async fn rebuild(up: &Upstream, memory_capacity: i64) -> Result<NodeModel, SyncError> {
    let model = RwLock::new(NodeModel::new(memory_capacity));
    sync(&model, up).await?;
    Ok(model.into_inner().unwrap_or_else(|e| e.into_inner()))
}

/// Brings `model` up to date with the runtime (see the module docs).
pub async fn sync(model: &RwLock<NodeModel>, up: &Upstream) -> Result<(), SyncError> {
    let (sandboxes, containers) = lists(up).await?;
    let (known_sandboxes, known_containers) = {
        let m = model.read().unwrap_or_else(|e| e.into_inner());
        let (s, c) = m.ids();
        (
            s.into_iter().collect::<HashSet<_>>(),
            c.into_iter().collect::<HashSet<_>>(),
        )
    };
    // Statuses are read a few at a time: a rebuild of hundreds of pods
    // takes a fraction of one call after another.
    let new_sandboxes: Vec<String> = sandboxes
        .iter()
        .filter(|s| !known_sandboxes.contains(&s.id))
        .map(|s| s.id.clone())
        .collect();
    let new_sandboxes = stream::iter(new_sandboxes)
        .map(|id| {
            let up = up.clone();
            async move { fetch_sandbox(&up, &id).await }
        })
        .buffer_unordered(FETCH_AT_ONCE)
        .try_collect::<Vec<_>>()
        .await?;
    let new_containers: Vec<String> = containers
        .iter()
        .filter(|c| !known_containers.contains(&c.id))
        .map(|c| c.id.clone())
        .collect();
    let new_containers = stream::iter(new_containers)
        .map(|id| {
            let up = up.clone();
            async move { fetch_container(&up, &id).await }
        })
        .buffer_unordered(FETCH_AT_ONCE)
        .try_collect::<Vec<_>>()
        .await?;
    let mut m = model.write().unwrap_or_else(|e| e.into_inner());
    for info in new_sandboxes.into_iter().flatten() {
        m.upsert_sandbox(info);
    }
    for info in new_containers.into_iter().flatten() {
        m.upsert_container(info);
    }
    let live_sandboxes: HashSet<&str> = sandboxes.iter().map(|s| s.id.as_str()).collect();
    let live_containers: HashSet<&str> = containers.iter().map(|c| c.id.as_str()).collect();
    let (have_s, have_c) = m.ids();
    for id in have_c
        .iter()
        .filter(|id| !live_containers.contains(id.as_str()))
    {
        m.remove_container(id);
    }
    for id in have_s
        .iter()
        .filter(|id| !live_sandboxes.contains(id.as_str()))
    {
        m.remove_sandbox(id);
    }
    for s in &sandboxes {
        m.refresh_sandbox(&s.id, convert::sandbox_state(s.state), s.created_at);
    }
    for c in &containers {
        m.refresh_container(&c.id, convert::container_state(c.state), c.created_at);
    }
    Ok(())
}

/// `MemTotal` from `/proc/meminfo` text, in bytes: the capacity the kubelet
/// (through cAdvisor) uses in its `oom_score_adj` formula.
pub fn mem_total(meminfo: &str) -> Option<i64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: i64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    #[test]
    fn mem_total_reads_kib() {
        let text = "MemTotal:       24567892 kB\nMemFree:         1000 kB\n";
        assert_eq!(super::mem_total(text), Some(24567892 * 1024));
        assert_eq!(super::mem_total("MemFree: 1 kB"), None);
    }
}
