//! The pod source from the API: the pods bound to this node
//! (`fieldSelector=spec.nodeName=NODE`, as the kubelet's own API source,
//! `pkg/kubelet/config/apiserver.go`), listed then watched, each kept in
//! the node model as the few facts criguard ranks and scores with
//! ([`ApiPod`]), matched to its sandbox by UID.
//!
//! It runs in the background and never blocks an eviction: a round uses
//! what the model holds. An API that is down, slow, forbidden, or answers
//! with a pod criguard cannot read leaves the model as it was (a pod it
//! cannot read keeps being ranked by inference), logged once per change of
//! state and counted (`criguard_kube_pod_watch_events_total`); the list is
//! asked again after every failure, with back-off.

use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};

use super::metrics::{KubeMetrics, PodWatchEvent};
use super::{KubeError, KubeSettings, backoff, bounded, client};
use crate::lock::RwLocked;
use crate::model::NodeModel;
use crate::model::spec::{ApiContainer, ApiPod, ContainerKind, EmptyDir, Resources};

/// The annotation a mirror pod carries: its static pod's UID, which is the
/// UID the kubelet gives the static pod's sandbox
/// (`pkg/kubelet/types/pod_update.go`, ConfigMirrorAnnotationKey).
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// How long one watch request stays open before it is asked again from
/// the last version seen (the API server ends it at this timeout).
const WATCH_TIMEOUT_S: u32 = 290;

/// A watch that ends sooner than this counts as failed.
const MIN_WATCH: std::time::Duration = std::time::Duration::from_secs(1);

/// The facts criguard keeps of `pod`, or why they cannot be read (the
/// field and value).
pub fn api_pod(pod: &Pod) -> Result<ApiPod, String> {
    let meta = &pod.metadata;
    let uid = sandbox_uid(pod)
        .cloned()
        .ok_or_else(|| "metadata.uid is missing".to_owned())?;
    let mirror = meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION));
    let spec = pod.spec.clone().unwrap_or_default();
    let status = pod.status.as_ref();
    let statuses = |init: bool| {
        status
            .and_then(|s| {
                if init {
                    s.init_container_statuses.as_ref()
                } else {
                    s.container_statuses.as_ref()
                }
            })
            .map_or(&[][..], Vec::as_slice)
    };
    let mut containers = Vec::new();
    for c in &spec.containers {
        containers.push(container(c, ContainerKind::Regular, statuses(false))?);
    }
    for c in spec.init_containers.iter().flatten() {
        let kind = if c.restart_policy.as_deref() == Some("Always") {
            ContainerKind::Sidecar
        } else {
            ContainerKind::Init
        };
        containers.push(container(c, kind, statuses(true))?);
    }
    let pod_resources = spec.resources.as_ref();
    let pod_requests = pod_resources.and_then(|r| r.requests.as_ref());
    let pod_limits = pod_resources.and_then(|r| r.limits.as_ref());
    // IsPodLevelResourcesSet: CPU, memory or huge pages named at pod level.
    let pod_level = [pod_requests, pod_limits].into_iter().flatten().any(|l| {
        l.keys()
            .any(|k| k == "cpu" || k == "memory" || k.starts_with("hugepages-"))
    });
    let mut empty_dirs = Vec::new();
    for v in spec.volumes.iter().flatten() {
        if let Some(e) = &v.empty_dir {
            empty_dirs.push(EmptyDir {
                name: v.name.clone(),
                memory: e.medium.as_deref() == Some("Memory"),
                size_limit: e
                    .size_limit
                    .as_ref()
                    .map(|q| bytes(&format!("volumes[{}].emptyDir.sizeLimit", v.name), q))
                    .transpose()?,
            });
        }
    }
    Ok(ApiPod {
        uid,
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        priority: spec.priority,
        priority_class: spec.priority_class_name.clone().unwrap_or_default(),
        mirror,
        containers,
        pod_level,
        pod_memory_request: get(pod_requests, "memory", "spec.resources.requests")?,
        pod_memory_limit: get(pod_limits, "memory", "spec.resources.limits")?,
        overhead: resources(spec.overhead.as_ref(), "spec.overhead")?,
        empty_dirs,
    })
}

/// The UID of the sandbox the kubelet runs `pod` in: a mirror pod's
/// static pod's, else the pod's own.
pub fn sandbox_uid(pod: &Pod) -> Option<&String> {
    let meta = &pod.metadata;
    let mirror = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(MIRROR_ANNOTATION));
    mirror.or(meta.uid.as_ref())
}

/// One container: its requests as the kubelet allocated them (the status's
/// `allocatedResources` after a resize, else the spec's), its limits as
/// the runtime applied them (the status's `resources`, else the spec's).
fn container(
    c: &Container,
    kind: ContainerKind,
    statuses: &[ContainerStatus],
) -> Result<ApiContainer, String> {
    let status = statuses.iter().find(|s| s.name == c.name);
    let spec = c.resources.as_ref();
    let field = |what: &str| format!("container {}: {what}", c.name);
    let requests = match status.and_then(|s| s.allocated_resources.as_ref()) {
        Some(allocated) => resources(Some(allocated), &field("allocatedResources"))?,
        None => resources(spec.and_then(|r| r.requests.as_ref()), &field("requests"))?,
    };
    let actual = status
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.limits.as_ref());
    let limits = match actual {
        Some(l) => resources(Some(l), &field("status.resources.limits"))?,
        None => resources(spec.and_then(|r| r.limits.as_ref()), &field("limits"))?,
    };
    Ok(ApiContainer {
        name: c.name.clone(),
        kind,
        requests,
        limits,
    })
}

type ResourceList = std::collections::BTreeMap<String, Quantity>;

fn resources(list: Option<&ResourceList>, field: &str) -> Result<Resources, String> {
    Ok(Resources {
        memory: get(list, "memory", field)?,
        ephemeral_storage: get(list, "ephemeral-storage", field)?,
    })
}

fn get(list: Option<&ResourceList>, name: &str, field: &str) -> Result<Option<i64>, String> {
    list.and_then(|l| l.get(name))
        .map(|q| bytes(&format!("{field}.{name}"), q))
        .transpose()
}

fn bytes(field: &str, q: &Quantity) -> Result<i64, String> {
    crate::quantity::parse_quantity(&q.0)
        .ok()
        .and_then(|v| i64::try_from(v).ok())
        .ok_or_else(|| format!("{field}={:?} is not a quantity of bytes", q.0))
}

/// The pod source for `settings`' node, writing `model`, until `stopped`
/// resolves. The client is built now (no request is made yet).
pub async fn source(
    settings: &KubeSettings,
    model: Arc<RwLock<NodeModel>>,
    metrics: KubeMetrics,
    stopped: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<impl std::future::Future<Output = ()> + Send + 'static, KubeError> {
    let api: Api<Pod> = Api::all(client(settings).await?);
    let selector = format!("spec.nodeName={}", settings.node_name);
    tracing::info!(node = %settings.node_name, "ranking with the API's pods bound to this node");
    Ok(async move {
        tokio::select! {
            () = run(api, selector, model, metrics) => {}
            () = stopped => {}
        }
    })
}

/// How the last attempt went, so that only a change is logged.
#[derive(Clone, Debug, PartialEq)]
enum State {
    Starting,
    Watching,
    Failing(String),
}

impl State {
    fn enter(&mut self, next: State) {
        if *self == next {
            return;
        }
        match &next {
            State::Watching => tracing::info!("API pods listed; watching"),
            State::Failing(err) => {
                tracing::warn!(%err, "API pods not read: ranking with what the model holds, retrying")
            }
            State::Starting => {}
        }
        *self = next;
    }
}

async fn run(api: Api<Pod>, selector: String, model: Arc<RwLock<NodeModel>>, metrics: KubeMetrics) {
    let mut state = State::Starting;
    let mut wait = backoff();
    loop {
        let err = match list(&api, &selector, &model, &metrics).await {
            Ok(version) => {
                state.enter(State::Watching);
                wait.reset();
                watch(&api, &selector, version, &model, &metrics).await
            }
            Err(err) => err,
        };
        metrics.watch_event(PodWatchEvent::Error);
        state.enter(State::Failing(err));
        tokio::time::sleep(wait.next_wait()).await;
    }
}

/// Lists the node's pods into the model; the list's resource version.
async fn list(
    api: &Api<Pod>,
    selector: &str,
    model: &RwLock<NodeModel>,
    metrics: &KubeMetrics,
) -> Result<String, String> {
    let list = bounded(api.list(&ListParams::default().fields(selector))).await?;
    metrics.watch_event(PodWatchEvent::List);
    let mut pods = Vec::with_capacity(list.items.len());
    let mut unreadable = Vec::new();
    for p in &list.items {
        match readable(p, metrics) {
            Some(pod) => pods.push(pod),
            None => unreadable.extend(sandbox_uid(p)),
        }
    }
    // A pod that cannot be read keeps what the model had of it.
    let mut m = model.write_locked();
    let kept: Vec<ApiPod> = unreadable
        .into_iter()
        .filter_map(|uid| m.api_pod(uid).cloned())
        .collect();
    m.set_api_pods(pods.into_iter().chain(kept));
    metrics.count_sources(&m);
    Ok(list.metadata.resource_version.unwrap_or_default())
}

/// `pod`'s facts, or `None` (logged, counted) when they cannot be read.
fn readable(pod: &Pod, metrics: &KubeMetrics) -> Option<ApiPod> {
    match api_pod(pod) {
        Ok(p) => Some(p),
        Err(err) => {
            metrics.watch_event(PodWatchEvent::Unreadable);
            let name = format!(
                "{}/{}",
                pod.metadata.namespace.as_deref().unwrap_or(""),
                pod.metadata.name.as_deref().unwrap_or("")
            );
            crate::log_limited!(warn, pod = %name, %err, "API pod not readable: ranked by inference");
            None
        }
    }
}

/// Watches from `version` until the watch fails; why it ended. A watch
/// the server closes at its timeout is opened again from the last version.
async fn watch(
    api: &Api<Pod>,
    selector: &str,
    mut version: String,
    model: &RwLock<NodeModel>,
    metrics: &KubeMetrics,
) -> String {
    loop {
        let params = WatchParams::default()
            .fields(selector)
            .timeout(WATCH_TIMEOUT_S)
            .disable_bookmarks();
        let stream = match api.watch(&params, &version).await {
            Ok(s) => s,
            Err(e) => return super::describe(&e),
        };
        let mut stream = std::pin::pin!(stream);
        let opened = std::time::Instant::now();
        while let Some(event) = stream.next().await {
            let event = match event {
                Ok(e) => e,
                Err(e) => return super::describe(&e),
            };
            match event {
                WatchEvent::Added(p) | WatchEvent::Modified(p) => {
                    version = p.metadata.resource_version.clone().unwrap_or(version);
                    metrics.watch_event(PodWatchEvent::Changed);
                    if let Some(pod) = readable(&p, metrics) {
                        let mut m = model.write_locked();
                        m.upsert_api_pod(pod);
                        metrics.count_sources(&m);
                    }
                }
                WatchEvent::Deleted(p) => {
                    version = p.metadata.resource_version.clone().unwrap_or(version);
                    metrics.watch_event(PodWatchEvent::Deleted);
                    if let Some(uid) = sandbox_uid(&p) {
                        let mut m = model.write_locked();
                        m.remove_api_pod(uid);
                        metrics.count_sources(&m);
                    }
                }
                WatchEvent::Bookmark(b) => version = b.metadata.resource_version,
                // 410 Gone (the version is too old) and every other error:
                // list again.
                WatchEvent::Error(s) => {
                    return format!("watch: HTTP {} {}: {}", s.code, s.reason, s.message);
                }
            }
        }
        // A watch the server ends long before its timeout (a proxy that
        // cuts it, say) is listed again with back-off, not reopened in a
        // tight loop.
        if opened.elapsed() < MIN_WATCH {
            return format!("watch ended after {:?}", opened.elapsed());
        }
    }
}

#[cfg(test)]
mod tests;
