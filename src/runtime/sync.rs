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

use crate::lock::RwLocked;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_cri::v1 as cri;

use super::{CALL_DEADLINE, Upstream, bounded};
use crate::model::convert::{self, InfoError};
use crate::model::{ContainerInfo, NodeModel, SandboxInfo};

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

async fn fetch_sandbox(up: &Upstream, id: &str) -> Result<Option<SandboxInfo>, SyncError> {
    let req = cri::PodSandboxStatusRequest {
        pod_sandbox_id: id.to_owned(),
        verbose: true,
    };
    match bounded(
        "PodSandboxStatus",
        CALL_DEADLINE,
        up.runtime().pod_sandbox_status(req),
    )
    .await
    {
        Ok(resp) => Ok(Some(convert::sandbox_from_status(&resp.into_inner())?)),
        // Removed between the list and this call.
        Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
        Err(s) => Err(call_err("PodSandboxStatus")(s)),
    }
}

async fn fetch_container(up: &Upstream, id: &str) -> Result<Option<ContainerInfo>, SyncError> {
    let req = cri::ContainerStatusRequest {
        container_id: id.to_owned(),
        verbose: true,
    };
    match bounded(
        "ContainerStatus",
        CALL_DEADLINE,
        up.runtime().container_status(req),
    )
    .await
    {
        Ok(resp) => Ok(Some(convert::container_from_status(&resp.into_inner())?)),
        Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
        Err(s) => Err(call_err("ContainerStatus")(s)),
    }
}

async fn lists(up: &Upstream) -> Result<(Vec<cri::PodSandbox>, Vec<cri::Container>), SyncError> {
    let mut rt = up.runtime();
    let list = rt.list_pod_sandbox(cri::ListPodSandboxRequest { filter: None });
    let sandboxes = bounded("ListPodSandbox", CALL_DEADLINE, list)
        .await
        .map_err(call_err("ListPodSandbox"))?
        .into_inner()
        .items;
    let list = rt.list_containers(cri::ListContainersRequest { filter: None });
    let containers = bounded("ListContainers", CALL_DEADLINE, list)
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
    // What the model knows *before* the lists are asked for: only these can
    // be judged gone by lists that lack them. An object the model learns
    // while the sync runs (an observed RunPodSandbox, an event) is newer
    // than the lists and stays.
    let known = Known::of(&model.read_locked());
    let (sandboxes, containers) = lists(up).await?;
    let new_sandboxes = fetch_unknown(
        sandboxes.iter().map(|s| &s.id),
        &known.sandboxes,
        |id| async move { fetch_sandbox(up, &id).await },
    )
    .await?;
    let new_containers = fetch_unknown(
        containers.iter().map(|c| &c.id),
        &known.containers,
        |id| async move { fetch_container(up, &id).await },
    )
    .await?;
    let mut m = model.write_locked();
    for info in new_sandboxes.into_iter().flatten() {
        m.upsert_sandbox(info);
    }
    for info in new_containers.into_iter().flatten() {
        m.upsert_container(info);
    }
    apply_lists(&mut m, &known, &sandboxes, &containers);
    Ok(())
}

/// Reads the verbose status of each listed id the model does not know,
/// a few at a time: a rebuild of hundreds of pods takes a fraction of one
/// call after another.
async fn fetch_unknown<'a, T, F, Fut>(
    listed: impl Iterator<Item = &'a String>,
    known: &HashSet<String>,
    fetch: F,
) -> Result<Vec<Option<T>>, SyncError>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, SyncError>>,
{
    let unknown: Vec<String> = listed.filter(|id| !known.contains(*id)).cloned().collect();
    stream::iter(unknown)
        .map(fetch)
        .buffer_unordered(FETCH_AT_ONCE)
        .try_collect()
        .await
}

/// The ids a model held at one moment.
#[derive(Debug, Default)]
struct Known {
    sandboxes: HashSet<String>,
    containers: HashSet<String>,
}

impl Known {
    fn of(m: &NodeModel) -> Self {
        let (s, c) = m.ids();
        Self {
            sandboxes: s.into_iter().collect(),
            containers: c.into_iter().collect(),
        }
    }
}

/// Applies the runtime's lists to `m`: what was `known` before the lists
/// were read and is missing from them is gone; states move forward and
/// creation times are refreshed.
fn apply_lists(
    m: &mut NodeModel,
    known: &Known,
    sandboxes: &[cri::PodSandbox],
    containers: &[cri::Container],
) {
    let live_sandboxes: HashSet<&str> = sandboxes.iter().map(|s| s.id.as_str()).collect();
    let live_containers: HashSet<&str> = containers.iter().map(|c| c.id.as_str()).collect();
    for id in known
        .containers
        .iter()
        .filter(|id| !live_containers.contains(id.as_str()))
    {
        m.remove_container(id);
    }
    for id in known
        .sandboxes
        .iter()
        .filter(|id| !live_sandboxes.contains(id.as_str()))
    {
        m.remove_sandbox(id);
    }
    for s in sandboxes {
        m.refresh_sandbox(&s.id, convert::sandbox_state(s.state), s.created_at);
    }
    for c in containers {
        m.refresh_container(&c.id, convert::container_state(c.state), c.created_at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::sandbox;

    fn listed(id: &str) -> cri::PodSandbox {
        cri::PodSandbox {
            id: id.into(),
            state: cri::PodSandboxState::SandboxReady as i32,
            ..Default::default()
        }
    }

    #[test]
    fn lists_drop_only_what_the_model_knew_before_they_were_read() {
        let mut m = NodeModel::new(1 << 30);
        m.upsert_sandbox(sandbox("old", "/kubepods/podold"));
        m.upsert_sandbox(sandbox("gone", "/kubepods/podgone"));
        m.upsert_container(ContainerInfo {
            id: "c-gone".into(),
            sandbox_id: "old".into(),
            ..Default::default()
        });
        let known = Known::of(&m);
        // Learned while the lists were in flight (an observed RunPodSandbox
        // and CreateContainer): absent from the lists, newer than them.
        m.upsert_sandbox(sandbox("new", "/kubepods/podnew"));
        m.upsert_container(ContainerInfo {
            id: "c-new".into(),
            sandbox_id: "new".into(),
            ..Default::default()
        });
        apply_lists(&mut m, &known, &[listed("old")], &[]);
        let (mut s, c) = m.ids();
        s.sort();
        assert_eq!(s, ["new", "old"]);
        assert_eq!(c, ["c-new"]);
    }
}
