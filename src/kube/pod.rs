//! One evicted pod's report: status, event, then a watch for a revert.
//!
//! The status write is retried with backoff for a few minutes (a pod whose
//! status never lands is counted `failed`); a 404 or a 409 (the UID
//! precondition: a new pod took the name) ends the report, since the pod
//! it was about is gone. After the status, the event; then a watch on the
//! pod by name, from the resourceVersion the status write returned: if the
//! kubelet's status manager writes `Running` back (it had begun re-creating
//! the sandbox before it saw the Failed phase), the pod is deleted with a
//! UID precondition and grace 0 so its controller replaces it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{
    Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent, WatchParams,
};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Backoff, Inner, PodEviction, body, bounded, code_of};
use crate::metrics::{KubeWrite, PodOutcome};

/// How long a pod is watched for a revert to Running after its status was
/// written (the kubelet reverts within seconds when it does).
pub const WATCH_FOR: Duration = Duration::from_secs(300);

/// Status attempts before the report gives up (about three minutes).
const STATUS_ATTEMPTS: u32 = 12;
/// Event attempts (an event matters less than the status).
const EVENT_ATTEMPTS: u32 = 5;

/// Reports eviction `e`; `first` is told when the first status attempt has
/// answered, whatever the answer.
pub(super) async fn report(inner: Arc<Inner>, e: PodEviction, first: oneshot::Sender<()>) {
    let api: Api<Pod> = Api::namespaced(inner.client.clone(), &e.namespace);
    let pod = format!("{}/{}", e.namespace, e.name);
    let mut first = Some(first);
    let patch = body::pod_status_patch(&e, SystemTime::now());
    let mut backoff = Backoff::new();
    let rv = loop {
        let answer =
            bounded(api.patch_status(&e.name, &PatchParams::default(), &Patch::Strategic(&patch)))
                .await;
        if let Some(f) = first.take() {
            let _ = f.send(());
        }
        match answer {
            Ok(p) => {
                inner.metrics.write(KubeWrite::PodStatus, true);
                inner.metrics.pod(PodOutcome::Written);
                tracing::info!(%pod, uid = %e.uid, "pod status written: Failed, Evicted");
                break p.metadata.resource_version.unwrap_or_default();
            }
            Err(err) => {
                inner.metrics.write(KubeWrite::PodStatus, false);
                if matches!(code_of(&err), Some(404 | 409)) {
                    inner.metrics.pod(PodOutcome::Failed);
                    tracing::warn!(%pod, uid = %e.uid, %err, "pod status not written: the pod is gone from the API (or a new pod has its name)");
                    return;
                }
                if backoff.attempts + 1 >= STATUS_ATTEMPTS {
                    inner.metrics.pod(PodOutcome::Failed);
                    tracing::error!(%pod, uid = %e.uid, %err, attempts = STATUS_ATTEMPTS, "pod status not written; giving up");
                    return;
                }
                let wait = backoff.next();
                tracing::warn!(%pod, %err, retry_in = ?wait, "pod status write failed; retrying in the background");
                tokio::time::sleep(wait).await;
            }
        }
    };
    event(&inner, &e, &rv).await;
    if watch_for_revert(&api, &e, rv).await {
        revert(&inner, &api, &e).await;
    } else {
        inner.metrics.pod(PodOutcome::Settled);
        tracing::debug!(%pod, "evicted pod stayed Failed");
    }
}

/// The Warning event, retried a few times.
async fn event(inner: &Inner, e: &PodEviction, rv: &str) {
    let api: Api<Event> = Api::namespaced(inner.client.clone(), &e.namespace);
    let mut backoff = Backoff::new();
    loop {
        let body = body::pod_event(e, &inner.node, rv, SystemTime::now());
        let ev: Event = match serde_json::from_value(body) {
            Ok(ev) => ev,
            Err(err) => {
                tracing::error!(%err, "event body does not fit the API's Event type");
                return;
            }
        };
        match bounded(api.create(&PostParams::default(), &ev)).await {
            Ok(_) => {
                inner.metrics.write(KubeWrite::Event, true);
                return;
            }
            Err(err) => {
                inner.metrics.write(KubeWrite::Event, false);
                if backoff.attempts + 1 >= EVENT_ATTEMPTS || code_of(&err) == Some(403) {
                    tracing::warn!(pod = %e.name, %err, "eviction event not recorded");
                    return;
                }
                tokio::time::sleep(backoff.next()).await;
            }
        }
    }
}

/// What the watch saw of the evicted pod.
enum Seen {
    /// Still there, not Running.
    Pending,
    /// Its phase is Running again.
    Reverted,
    /// Deleted, or replaced by a pod with another UID.
    Gone,
}

fn judge(p: &Pod, uid: &str) -> Seen {
    if p.metadata.uid.as_deref() != Some(uid) {
        return Seen::Gone;
    }
    match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Running") => Seen::Reverted,
        _ => Seen::Pending,
    }
}

/// Watches the pod for [`WATCH_FOR`] from `rv`; true if its phase went
/// back to Running, false if it stayed Failed until deleted (or replaced)
/// or the window ended.
async fn watch_for_revert(api: &Api<Pod>, e: &PodEviction, mut rv: String) -> bool {
    let end = Instant::now() + WATCH_FOR;
    let mut backoff = Backoff::new();
    while Instant::now() < end {
        let left = end
            .saturating_duration_since(Instant::now())
            .as_secs()
            .clamp(1, 290);
        let wp = WatchParams::default()
            .fields(&format!("metadata.name={}", e.name))
            .timeout(left as u32);
        let stream = match bounded(api.watch(&wp, &rv)).await {
            Ok(s) => s,
            Err(err) => {
                tracing::debug!(pod = %e.name, %err, "watch failed; reading the pod again");
                tokio::time::sleep(backoff.next()).await;
                match bounded(api.get_opt(&e.name)).await {
                    Ok(Some(p)) => match judge(&p, &e.uid) {
                        Seen::Reverted => return true,
                        Seen::Gone => return false,
                        Seen::Pending => rv = p.metadata.resource_version.unwrap_or_default(),
                    },
                    Ok(None) => return false,
                    Err(_) => {}
                }
                continue;
            }
        };
        let mut stream = std::pin::pin!(stream);
        loop {
            let next = tokio::time::timeout_at(end, stream.next()).await;
            let Ok(Some(item)) = next else {
                break; // watch window over, or the server ended this watch
            };
            match item {
                Ok(WatchEvent::Added(p) | WatchEvent::Modified(p)) => {
                    if let Some(v) = &p.metadata.resource_version {
                        rv.clone_from(v);
                    }
                    match judge(&p, &e.uid) {
                        Seen::Reverted => return true,
                        Seen::Gone => return false,
                        Seen::Pending => {}
                    }
                }
                Ok(WatchEvent::Deleted(p)) if p.metadata.uid.as_deref() == Some(e.uid.as_str()) => {
                    return false;
                }
                Ok(WatchEvent::Bookmark(b)) => rv = b.metadata.resource_version,
                Ok(WatchEvent::Error(status)) => {
                    tracing::debug!(pod = %e.name, code = status.code, "watch error; reading the pod again");
                    match bounded(api.get_opt(&e.name)).await {
                        Ok(Some(p)) => rv = p.metadata.resource_version.unwrap_or_default(),
                        Ok(None) => return false,
                        Err(_) => {}
                    }
                    break;
                }
                Ok(_) => {}
                Err(err) => {
                    tracing::debug!(pod = %e.name, %err, "watch stream broke");
                    break;
                }
            }
        }
    }
    false
}

/// The kubelet wrote Running back: delete the pod (this UID only, at once).
async fn revert(inner: &Inner, api: &Api<Pod>, e: &PodEviction) {
    inner.metrics.pod(PodOutcome::Reverted);
    tracing::warn!(pod = %e.name, uid = %e.uid, "evicted pod reported Running again by the kubelet; deleting it so its controller replaces it");
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(e.uid.clone()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let mut backoff = Backoff::new();
    loop {
        match bounded(api.delete(&e.name, &dp)).await {
            Ok(_) => {
                inner.metrics.write(KubeWrite::PodDelete, true);
                inner.metrics.pod(PodOutcome::Deleted);
                tracing::info!(pod = %e.name, uid = %e.uid, "evicted pod deleted");
                return;
            }
            Err(err) => {
                inner.metrics.write(KubeWrite::PodDelete, false);
                if matches!(code_of(&err), Some(404 | 409))
                    || backoff.attempts + 1 >= STATUS_ATTEMPTS
                {
                    tracing::warn!(pod = %e.name, %err, "evicted pod not deleted");
                    return;
                }
                tokio::time::sleep(backoff.next()).await;
            }
        }
    }
}
