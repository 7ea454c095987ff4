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
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{
    Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent, WatchParams,
};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::metrics::{KubeWrite, PodOutcome};
use super::pending::PendingPod;
use super::reassert::{Next, QUIET, Seen, Undo, judge, terminal};
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
    let pending = PendingPod::new(e, unix_ms(since));
    write_then_hold(inner, pending, first).await;
}

/// Writes the status of `pending` (not written yet), then the event, then
/// holds the status until the kubelet settles.
async fn write_then_hold(
    inner: Arc<Inner>,
    mut pending: PendingPod,
    first: Option<oneshot::Sender<()>>,
) {
    inner.pending.upsert(pending.clone());
    let e = pending.eviction.clone();
    let since = pending.since();
    let api: Api<Pod> = Api::namespaced(inner.client.clone(), &e.namespace);
    let Some(rv) = first_status(&inner, &api, &e, first, since).await else {
        inner.pending.remove(&e.uid);
        return;
    };
    pending.wrote(unix_ms(SystemTime::now()), &rv);
    inner.pending.upsert(pending.clone());
    event(&inner, &e, &rv).await;
    Hold::new(&inner, api, pending).run(Some(rv)).await;
    inner.pending.remove(&e.uid);
}

/// Carries on with a report a previous run of criguard left unfinished,
/// where it stopped.
pub(super) async fn resume(inner: Arc<Inner>, p: PendingPod) {
    if !p.written {
        return write_then_hold(inner, p, None).await;
    }
    let uid = p.eviction.uid.clone();
    let api: Api<Pod> = Api::namespaced(inner.client.clone(), &p.eviction.namespace);
    Hold::new(&inner, api, p).run(None).await;
    inner.pending.remove(&uid);
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

/// Why a report ended when criguard deleted the pod (not `settled`).
const DELETED: &str = "pod deleted";

/// How a watch on the pod ended.
enum WatchEnd {
    /// criguard's status was undone, this way.
    Undone(Undo),
    /// The pod was deleted or replaced.
    Gone,
    /// The deadline passed.
    Deadline,
    /// The watch broke or the server ended it; go on from this
    /// resourceVersion (`None`: read the pod again first).
    Again(Option<String>),
}

/// Keeps criguard's status on an evicted pod until the kubelet's own
/// status is terminal with it ([`QUIET`] on a terminated pod after
/// criguard's last write), writing it again whenever it is
/// undone, deleting the pod past the bound. Its state is saved with the
/// report at each change.
struct Hold<'a> {
    inner: &'a Inner,
    api: Api<Pod>,
    p: PendingPod,
    /// Whether the last state seen was criguard's status on a terminated pod.
    terminal: bool,
    /// [`WATCH_FOR`] after the first write: the report ends there whatever
    /// the kubelet does.
    end: Instant,
}

impl<'a> Hold<'a> {
    fn new(inner: &'a Inner, api: Api<Pod>, p: PendingPod) -> Self {
        let end = instant_at(p.window_start_ms() + WATCH_FOR.as_millis() as u64);
        Self {
            inner,
            api,
            p,
            terminal: false,
            end,
        }
    }

    /// Watches from `rv` (or from a fresh read when `None`) until the
    /// report is over.
    async fn run(mut self, mut rv: Option<String>) {
        let pod = name(&self.p.eviction);
        let mut backoff = new_backoff();
        let how = loop {
            if Instant::now() >= self.end {
                break "window over";
            }
            let from = match rv.take() {
                Some(v) => v,
                None => match self.read().await {
                    Ok(Ok(v)) => v,
                    Ok(Err(end)) => match self.on_end(end).await {
                        Ok(next) => {
                            rv = next;
                            continue;
                        }
                        Err(how) => break how,
                    },
                    Err(err) => {
                        let wait = backoff.next_wait();
                        tracing::debug!(%pod, %err, retry_in = ?wait, "cannot read the evicted pod; trying again");
                        tokio::time::sleep(
                            wait.min(self.end.saturating_duration_since(Instant::now())),
                        )
                        .await;
                        continue;
                    }
                },
            };
            let end = self.watch(from).await;
            if let WatchEnd::Again(None) = end {
                tokio::time::sleep(backoff.next_wait()).await;
            }
            match self.on_end(end).await {
                Ok(next) => rv = next,
                Err(how) => break how,
            }
        };
        if how != DELETED {
            self.inner.metrics.pod(PodOutcome::Settled);
        }
        tracing::info!(%pod, uid = %self.p.eviction.uid, reasserted = self.p.reasserts.done(), how, "evicted pod's report over");
    }

    /// Reads the pod: the resourceVersion to watch from, or how the read
    /// ended the watch.
    async fn read(&mut self) -> Result<Result<String, WatchEnd>, String> {
        match bounded(self.api.get_opt(&self.p.eviction.name)).await {
            Ok(Some(p)) => Ok(match self.look(&p) {
                None => Ok(p.metadata.resource_version.unwrap_or_default()),
                Some(end) => Err(end),
            }),
            Ok(None) => Ok(Err(WatchEnd::Gone)),
            Err(err) => Err(err),
        }
    }

    /// What pod `p` as seen now means: `None` to watch on.
    fn look(&mut self, p: &Pod) -> Option<WatchEnd> {
        let e = &self.p.eviction;
        match judge(p, &e.uid, &e.message) {
            Seen::Gone => Some(WatchEnd::Gone),
            Seen::Undone(how) => Some(WatchEnd::Undone(how)),
            Seen::Ours => {
                self.terminal = terminal(p);
                None
            }
        }
    }

    /// Acts on how a watch ended: `Ok` with where to go on from, `Err`
    /// with why the report is over.
    async fn on_end(&mut self, end: WatchEnd) -> Result<Option<String>, &'static str> {
        match end {
            WatchEnd::Undone(how) => self.undone(how).await.ok_or(DELETED),
            WatchEnd::Gone => Err("pod gone"),
            WatchEnd::Deadline if self.terminal && Instant::now() < self.end => {
                Err("criguard's status stood unchanged on the terminated pod")
            }
            WatchEnd::Deadline => Ok(None),
            WatchEnd::Again(next) => Ok(next),
        }
    }

    /// When the quiet rule ends the report if nothing changes: [`QUIET`]
    /// after criguard's last write, within [`Self::end`].
    fn deadline(&self) -> Instant {
        let quiet = self
            .p
            .last_write
            .as_ref()
            .map(|(at, _)| instant_at(at + QUIET.as_millis() as u64));
        match quiet {
            Some(q) if q > Instant::now() => q.min(self.end),
            Some(_) if self.terminal => Instant::now(),
            _ => self.end,
        }
    }

    /// criguard's status was undone: writes it again after the policy's
    /// wait (`Some(rv)` to watch on from, `Some(None)` to read the pod
    /// first), or deletes the pod past the bound (`None`: the report is
    /// over).
    async fn undone(&mut self, how: Undo) -> Option<Option<String>> {
        let (inner, e) = (self.inner, self.p.eviction.clone());
        let pod = name(&e);
        self.terminal = false;
        inner.metrics.pod(PodOutcome::Reverted);
        let next = self.p.reasserts.on_undo(SystemTime::now());
        inner.pending.upsert(self.p.clone());
        let Next::Reassert(wait) = next else {
            tracing::warn!(%pod, uid = %e.uid, ?how, reasserted = self.p.reasserts.done(), "evicted pod's status still undone past the bound; deleting the pod so its controller replaces it");
            delete(inner, &self.api, &e).await;
            return None;
        };
        tracing::info!(%pod, uid = %e.uid, ?how, ?wait, "evicted pod's status undone (the kubelet's status manager); writing it again");
        tokio::time::sleep(wait).await;
        let since = self.p.since();
        match write_status(inner, &self.api, &e, since).await {
            Ok(rv) => {
                inner.metrics.pod(PodOutcome::Reasserted);
                self.p.wrote(unix_ms(SystemTime::now()), &rv);
                inner.pending.upsert(self.p.clone());
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

    /// Watches the pod from `rv` until its status is undone, it is gone,
    /// the deadline passes, or the watch breaks.
    async fn watch(&mut self, mut rv: String) -> WatchEnd {
        let deadline = self.deadline();
        let left = deadline
            .saturating_duration_since(Instant::now())
            .as_secs()
            .clamp(1, 290);
        let wp = WatchParams::default()
            .fields(&format!("metadata.name={}", self.p.eviction.name))
            .timeout(left as u32);
        let stream = match bounded(self.api.watch(&wp, &rv)).await {
            Ok(s) => s,
            Err(err) => {
                tracing::debug!(pod = %self.p.eviction.name, %err, "watch failed; reading the pod again");
                return WatchEnd::Again(None);
            }
        };
        let mut stream = std::pin::pin!(stream);
        loop {
            let item = match tokio::time::timeout_at(deadline, stream.next()).await {
                Err(_) => return WatchEnd::Deadline,
                Ok(None) => return WatchEnd::Again(Some(rv)),
                Ok(Some(item)) => item,
            };
            match item {
                Ok(WatchEvent::Added(p) | WatchEvent::Modified(p)) => {
                    if let Some(v) = &p.metadata.resource_version {
                        rv.clone_from(v);
                    }
                    if let Some(end) = self.look(&p) {
                        return end;
                    }
                }
                Ok(WatchEvent::Deleted(p))
                    if p.metadata.uid.as_deref() == Some(self.p.eviction.uid.as_str()) =>
                {
                    return WatchEnd::Gone;
                }
                Ok(WatchEvent::Bookmark(b)) => rv = b.metadata.resource_version,
                Ok(WatchEvent::Error(status)) => {
                    tracing::debug!(pod = %self.p.eviction.name, code = status.code, "watch error; reading the pod again");
                    return WatchEnd::Again(None);
                }
                Ok(_) => {}
                Err(err) => {
                    tracing::debug!(pod = %self.p.eviction.name, %err, "watch stream broke");
                    return WatchEnd::Again(None);
                }
            }
        }
    }
}

/// The monotonic instant of wall-clock time `at_ms` (ms since the epoch).
fn instant_at(at_ms: u64) -> Instant {
    let now = unix_ms(SystemTime::now());
    if at_ms >= now {
        Instant::now() + Duration::from_millis(at_ms - now)
    } else {
        Instant::now()
            .checked_sub(Duration::from_millis(now - at_ms))
            .unwrap_or_else(Instant::now)
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
