//! One evicted pod's report: status, event, then a watch that keeps
//! criguard's status in place.
//!
//! The status write is retried with backoff for a few minutes (a pod whose
//! status never lands is counted `failed`); a 404 or a 409 (the UID
//! precondition: a new pod took the name) ends the report, since the pod
//! it was about is gone. After the status, the event; then a watch on the
//! pod by name, from the resourceVersion the status write returned, for
//! [`WATCH_FOR`]: whenever the status is undone (the kubelet's status
//! manager writes its cached `Running` back, or the kubelet's own first
//! `Failed` blanks reason and message: see [`super::reassert`]), criguard
//! writes it again after a growing wait, and deletes the pod (UID
//! precondition, grace 0) only when it is still undone past the bound.
//!
//! Each report in progress is kept in the state directory
//! ([`super::pending`]); a restarted criguard resumes it with [`resume`]:
//! the status is written if it was not, else the pod is read, judged, and
//! watched for the rest of its window (counted from the first write, by the
//! wall clock).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{
    Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent, WatchParams,
};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::metrics::{KubeWrite, PodOutcome};
use super::pending::PendingPod;
use super::reassert::{Next, Reasserts, Seen, Undo, judge};
use super::{Inner, PodEviction, backoff as new_backoff, body, bounded, code_of};
use crate::clock::unix_ms;

/// How long a pod is watched after its status was written (the kubelet
/// undoes criguard's status within seconds when it does).
pub const WATCH_FOR: Duration = Duration::from_secs(300);

/// Status attempts before the report gives up (about three minutes).
const STATUS_ATTEMPTS: u32 = 12;
/// Event attempts (an event matters less than the status).
const EVENT_ATTEMPTS: u32 = 5;

fn name(e: &PodEviction) -> String {
    format!("{}/{}", e.namespace, e.name)
}

/// Reports eviction `e`, started at `since`; `first` is told when the
/// first status attempt has answered, whatever the answer.
pub(super) async fn report(
    inner: Arc<Inner>,
    e: PodEviction,
    first: Option<oneshot::Sender<()>>,
    since: SystemTime,
) {
    let mut pending = PendingPod {
        eviction: e.clone(),
        since_unix_ms: unix_ms(since),
        written: false,
    };
    inner.pending.upsert(pending.clone());
    let api: Api<Pod> = Api::namespaced(inner.client.clone(), &e.namespace);
    let Some(rv) = first_status(&inner, &api, &e, first, since).await else {
        inner.pending.remove(&e.uid);
        return;
    };
    pending.written = true;
    inner.pending.upsert(pending);
    event(&inner, &e, &rv).await;
    hold(
        &inner,
        &api,
        &e,
        Some(rv),
        since,
        Instant::now() + WATCH_FOR,
    )
    .await;
    inner.pending.remove(&e.uid);
}

/// Carries on with a report a previous run of criguard left unfinished.
pub(super) async fn resume(inner: Arc<Inner>, p: PendingPod) {
    let since = UNIX_EPOCH + Duration::from_millis(p.since_unix_ms);
    if !p.written {
        return report(inner, p.eviction, None, since).await;
    }
    let e = p.eviction;
    let api: Api<Pod> = Api::namespaced(inner.client.clone(), &e.namespace);
    let elapsed = SystemTime::now().duration_since(since).unwrap_or_default();
    let end = Instant::now() + WATCH_FOR.saturating_sub(elapsed);
    hold(&inner, &api, &e, None, since, end).await;
    inner.pending.remove(&e.uid);
}

/// One status write; the resourceVersion it left, or the error.
async fn write_status(
    inner: &Inner,
    api: &Api<Pod>,
    e: &PodEviction,
    since: SystemTime,
) -> Result<String, String> {
    let patch = body::pod_status_patch(e, since);
    let answer =
        bounded(api.patch_status(&e.name, &PatchParams::default(), &Patch::Strategic(&patch)))
            .await;
    inner.metrics.write(KubeWrite::PodStatus, answer.is_ok());
    answer.map(|p| p.metadata.resource_version.unwrap_or_default())
}

/// The first status write, retried; `None` when it never landed.
async fn first_status(
    inner: &Inner,
    api: &Api<Pod>,
    e: &PodEviction,
    mut first: Option<oneshot::Sender<()>>,
    since: SystemTime,
) -> Option<String> {
    let pod = name(e);
    let mut backoff = new_backoff();
    loop {
        let answer = write_status(inner, api, e, since).await;
        if let Some(f) = first.take() {
            let _ = f.send(());
        }
        match answer {
            Ok(rv) => {
                inner.metrics.pod(PodOutcome::Written);
                tracing::info!(%pod, uid = %e.uid, "pod status written: Failed, Evicted");
                return Some(rv);
            }
            Err(err) => {
                if matches!(code_of(&err), Some(404 | 409)) {
                    inner.metrics.pod(PodOutcome::Failed);
                    tracing::warn!(%pod, uid = %e.uid, %err, "pod status not written: the pod is gone from the API (or a new pod has its name)");
                    return None;
                }
                if backoff.attempts() + 1 >= STATUS_ATTEMPTS {
                    inner.metrics.pod(PodOutcome::Failed);
                    tracing::error!(%pod, uid = %e.uid, %err, attempts = STATUS_ATTEMPTS, "pod status not written; giving up");
                    return None;
                }
                let wait = backoff.next_wait();
                tracing::warn!(%pod, %err, retry_in = ?wait, "pod status write failed; retrying in the background");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// The Warning event, retried a few times.
async fn event(inner: &Inner, e: &PodEviction, rv: &str) {
    let api: Api<Event> = Api::namespaced(inner.client.clone(), &e.namespace);
    let mut backoff = new_backoff();
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
                if backoff.attempts() + 1 >= EVENT_ATTEMPTS || code_of(&err) == Some(403) {
                    tracing::warn!(pod = %e.name, %err, "eviction event not recorded");
                    return;
                }
                tokio::time::sleep(backoff.next_wait()).await;
            }
        }
    }
}

/// How a watch on the pod ended.
enum WatchEnd {
    /// criguard's status was undone, this way.
    Undone(Undo),
    /// The pod was deleted or replaced.
    Gone,
    /// The window is over.
    Over,
    /// The watch broke or the server ended it; go on from this
    /// resourceVersion (`None`: read the pod again first).
    Again(Option<String>),
}

/// Keeps criguard's status on the pod until `end`: watches it (from `rv`,
/// or from a fresh read when `None`) and writes the status again whenever
/// it is undone, within the bound; past the bound the pod is deleted.
async fn hold(
    inner: &Inner,
    api: &Api<Pod>,
    e: &PodEviction,
    mut rv: Option<String>,
    since: SystemTime,
    end: Instant,
) {
    let pod = name(e);
    let mut reasserts = Reasserts::default();
    let mut backoff = new_backoff();
    while Instant::now() < end {
        let from = match rv.take() {
            Some(v) => v,
            None => match bounded(api.get_opt(&e.name)).await {
                Ok(Some(p)) => match judge(&p, &e.uid, &e.message) {
                    Seen::Gone => break,
                    Seen::Ours => p.metadata.resource_version.unwrap_or_default(),
                    Seen::Undone(how) => {
                        match undone(inner, api, e, how, &mut reasserts, since).await {
                            Some(next) => rv = next,
                            None => return,
                        }
                        continue;
                    }
                },
                Ok(None) => break,
                Err(err) => {
                    let wait = backoff.next_wait();
                    tracing::debug!(%pod, %err, retry_in = ?wait, "cannot read the evicted pod; trying again");
                    tokio::time::sleep(wait.min(end.saturating_duration_since(Instant::now())))
                        .await;
                    continue;
                }
            },
        };
        match watch(api, e, from, end).await {
            WatchEnd::Undone(how) => {
                match undone(inner, api, e, how, &mut reasserts, since).await {
                    Some(next) => rv = next,
                    None => return,
                }
            }
            WatchEnd::Gone | WatchEnd::Over => break,
            WatchEnd::Again(next) => {
                if next.is_none() {
                    tokio::time::sleep(backoff.next_wait()).await;
                }
                rv = next;
            }
        }
    }
    inner.metrics.pod(PodOutcome::Settled);
    tracing::debug!(%pod, reasserted = reasserts.done(), "evicted pod's report over: it kept criguard's status");
}

/// criguard's status was undone: writes it again after the policy's wait
/// (`Some(rv)` to watch on from, `Some(None)` to read the pod first), or
/// deletes the pod past the bound (`None`: the report is over).
async fn undone(
    inner: &Inner,
    api: &Api<Pod>,
    e: &PodEviction,
    how: Undo,
    reasserts: &mut Reasserts,
    since: SystemTime,
) -> Option<Option<String>> {
    let pod = name(e);
    inner.metrics.pod(PodOutcome::Reverted);
    match reasserts.on_undo(std::time::Instant::now()) {
        Next::Reassert(wait) => {
            tracing::info!(%pod, uid = %e.uid, ?how, ?wait, "evicted pod's status undone (the kubelet's status manager); writing it again");
            tokio::time::sleep(wait).await;
            match write_status(inner, api, e, since).await {
                Ok(rv) => {
                    inner.metrics.pod(PodOutcome::Reasserted);
                    Some(Some(rv))
                }
                Err(err) if matches!(code_of(&err), Some(404 | 409)) => {
                    tracing::debug!(%pod, %err, "evicted pod gone before its status was written again");
                    Some(None)
                }
                Err(err) => {
                    tracing::warn!(%pod, %err, "evicted pod's status not written again; reading it again");
                    Some(None)
                }
            }
        }
        Next::Delete => {
            tracing::warn!(%pod, uid = %e.uid, ?how, reasserted = reasserts.done(), "evicted pod's status still undone past the bound; deleting the pod so its controller replaces it");
            delete(inner, api, e).await;
            None
        }
    }
}

/// Watches the pod from `rv` until its status is undone, it is gone, the
/// window ends at `end`, or the watch breaks.
async fn watch(api: &Api<Pod>, e: &PodEviction, mut rv: String, end: Instant) -> WatchEnd {
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
            return WatchEnd::Again(None);
        }
    };
    let mut stream = std::pin::pin!(stream);
    loop {
        let next = tokio::time::timeout_at(end, stream.next()).await;
        let item = match next {
            Err(_) => return WatchEnd::Over,
            Ok(None) => return WatchEnd::Again(Some(rv)),
            Ok(Some(item)) => item,
        };
        match item {
            Ok(WatchEvent::Added(p) | WatchEvent::Modified(p)) => {
                if let Some(v) = &p.metadata.resource_version {
                    rv.clone_from(v);
                }
                match judge(&p, &e.uid, &e.message) {
                    Seen::Undone(how) => return WatchEnd::Undone(how),
                    Seen::Gone => return WatchEnd::Gone,
                    Seen::Ours => {}
                }
            }
            Ok(WatchEvent::Deleted(p)) if p.metadata.uid.as_deref() == Some(e.uid.as_str()) => {
                return WatchEnd::Gone;
            }
            Ok(WatchEvent::Bookmark(b)) => rv = b.metadata.resource_version,
            Ok(WatchEvent::Error(status)) => {
                tracing::debug!(pod = %e.name, code = status.code, "watch error; reading the pod again");
                return WatchEnd::Again(None);
            }
            Ok(_) => {}
            Err(err) => {
                tracing::debug!(pod = %e.name, %err, "watch stream broke");
                return WatchEnd::Again(None);
            }
        }
    }
}

/// The last resort: delete the pod (this UID only, at once).
async fn delete(inner: &Inner, api: &Api<Pod>, e: &PodEviction) {
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(e.uid.clone()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let mut backoff = new_backoff();
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
                    || backoff.attempts() + 1 >= STATUS_ATTEMPTS
                {
                    tracing::warn!(pod = %e.name, %err, "evicted pod not deleted");
                    return;
                }
                tokio::time::sleep(backoff.next_wait()).await;
            }
        }
    }
}
