//! What the watch on an evicted pod makes of its status, and what criguard
//! does about it: pure, with time passed in.
//!
//! # What the kubelet does to a status criguard wrote
//!
//! Read from the kubelet's source (v1.26 to v1.34, `pkg/kubelet/status/
//! status_manager.go` and `pkg/kubelet/kubelet_pods.go`):
//!
//! - The status manager keeps its own cached status per pod and, on every
//!   sync (the pod informer's update and the 10 s reconcile alike), patches
//!   the API with `mergePodStatus(api status, cached status)`. That merge
//!   keeps the conditions the kubelet does not own (`DisruptionTarget`
//!   written by another party stays), but phase, reason and message are
//!   the kubelet's: they come from the cache. A cache still saying
//!   `Running` (criguard's write came before the pod worker's next sync)
//!   is written back over criguard's `Failed` a few hundred milliseconds
//!   later.
//! - The pod worker's `generateAPIPodStatus` never leaves a terminal phase
//!   the API shows: with the API at `Failed` and the runtime's containers
//!   dead it computes `Failed` itself. It keeps reason and message only
//!   when the phase it computes equals the cached phase (then the cached
//!   ones, or the API's when the cached ones are empty). Its first `Failed`,
//!   computed while the cache still says `Running`, therefore carries no
//!   reason and no message, and its patch blanks criguard's. From then on the cache says `Failed`, so the next status
//!   it generates takes reason and message from the API: whatever criguard
//!   wrote last stays.
//!
//! So the end state the kubelet alone leaves (Failed, Evicted, the message,
//! `DisruptionTarget`) is reached by writing criguard's status again
//! whenever it has been undone: once the kubelet's cache is `Failed` the
//! kubelet stops undoing it. Each write again waits a little longer
//! ([`Reasserts`]); if the status is still being undone past
//! [`MAX_REASSERTS`] writes or [`REASSERT_WINDOW`], something else keeps
//! writing over it, and the pod is deleted (UID precondition, grace 0) so
//! its controller replaces it: the last resort.
//!
//! # When the report is over
//!
//! Not after a fixed time: once the kubelet's own status for the pod is
//! terminal with criguard's reason. The pod is `Failed`, Evicted, with
//! criguard's message and condition, every container terminated
//! ([`terminal`]: the pod worker is done with it), and it has stayed so for
//! [`QUIET`] after criguard's last write: three of the status manager's
//! 10 s reconciles, each of which writes the kubelet's cached status back
//! when it differs, found nothing to change. A write by someone else that
//! shows criguard's status is no word from the kubelet: it can be an
//! earlier criguard process's, delayed in a stalled API server and landing
//! after a restart, while the kubelet's cache still says `Running`. The
//! counts and times here are wall-clock and saved with the report, so a
//! restart goes on where the last process stopped.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use super::body::{DISRUPTION_TARGET, REASON_EVICTED};

/// How many times criguard writes its status again before it deletes the pod.
pub const MAX_REASSERTS: u32 = 8;
/// How long after the first undo criguard keeps writing its status again.
pub const REASSERT_WINDOW: Duration = Duration::from_secs(120);
/// The wait before the first write again; it doubles each time.
pub const FIRST_WAIT: Duration = Duration::from_millis(200);
/// The longest wait between two writes again: with [`MAX_REASSERTS`] the
/// writes span about 21 s, two of the status manager's 10 s reconciles.
pub const LONGEST_WAIT: Duration = Duration::from_secs(5);

/// How long criguard's status must stay in place on a terminated pod,
/// written by nobody, before the report ends: three of the kubelet status
/// manager's 10 s reconciles, each of which would have undone it.
pub const QUIET: Duration = Duration::from_secs(30);

/// What the watch saw of the evicted pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// criguard's status: Failed, Evicted, its message, DisruptionTarget.
    Ours,
    /// Someone wrote over it.
    Undone(Undo),
    /// Deleted, or replaced by a pod with another UID.
    Gone,
}

/// How criguard's status was undone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Undo {
    /// A phase other than Failed (the status manager's cached `Running`).
    NotFailed,
    /// Failed, but another (or no) reason or message, or no
    /// `DisruptionTarget` condition (the kubelet's first own Failed).
    NotOurs,
}

/// Judges pod `p` against eviction of UID `uid` with `message`.
pub fn judge(p: &Pod, uid: &str, message: &str) -> Seen {
    if p.metadata.uid.as_deref() != Some(uid) {
        return Seen::Gone;
    }
    let Some(s) = p.status.as_ref() else {
        return Seen::Undone(Undo::NotFailed);
    };
    if s.phase.as_deref() != Some("Failed") {
        return Seen::Undone(Undo::NotFailed);
    }
    let target = s
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == DISRUPTION_TARGET && c.status == "True");
    let ours = s.reason.as_deref() == Some(REASON_EVICTED)
        && s.message.as_deref() == Some(message)
        && target;
    if ours {
        Seen::Ours
    } else {
        Seen::Undone(Undo::NotOurs)
    }
}

/// Whether the kubelet is done with pod `p`: `Failed` and every container
/// (init and regular) terminated, or none ever reported.
pub fn terminal(p: &Pod) -> bool {
    let Some(s) = p.status.as_ref() else {
        return false;
    };
    let done = |c: &k8s_openapi::api::core::v1::ContainerStatus| {
        c.state.as_ref().is_some_and(|st| st.terminated.is_some())
    };
    s.phase.as_deref() == Some("Failed")
        && s.container_statuses.iter().flatten().all(done)
        && s.init_container_statuses.iter().flatten().all(done)
}

/// What to do about an undone status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Write criguard's status again after this wait.
    Reassert(Duration),
    /// Undone past the bound: delete the pod.
    Delete,
}

/// The bound on writing the status again: counts and the window, saved
/// with the report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reasserts {
    done: u32,
    /// When the first undo was seen, ms since the epoch.
    first_undo_unix_ms: Option<u64>,
}

impl Reasserts {
    /// How many times the status was written again so far.
    pub fn done(&self) -> u32 {
        self.done
    }

    /// The status was seen undone at `now`: write it again after a wait
    /// (200 ms, doubling, at most 5 s), or delete the pod once
    /// [`MAX_REASSERTS`] writes were undone or [`REASSERT_WINDOW`] passed
    /// since the first undo.
    pub fn on_undo(&mut self, now: SystemTime) -> Next {
        let now_ms = crate::clock::unix_ms(now);
        let first = *self.first_undo_unix_ms.get_or_insert(now_ms);
        let since_first = Duration::from_millis(now_ms.saturating_sub(first));
        if self.done >= MAX_REASSERTS || since_first >= REASSERT_WINDOW {
            return Next::Delete;
        }
        let wait = FIRST_WAIT
            .saturating_mul(1 << self.done.min(16))
            .min(LONGEST_WAIT);
        self.done += 1;
        Next::Reassert(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const MSG: &str = "The node was low on resource: memory. ";

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "hog", "namespace": "default", "uid": "u1"},
            "status": status,
        }))
        .unwrap()
    }

    fn target() -> serde_json::Value {
        json!([{"type": "Ready", "status": "False"},
               {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}])
    }

    #[test]
    fn only_failed_evicted_with_the_message_and_the_condition_is_ours() {
        let ours = pod(
            json!({"phase": "Failed", "reason": "Evicted", "message": MSG, "conditions": target()}),
        );
        assert_eq!(judge(&ours, "u1", MSG), Seen::Ours);
        let cases = [
            // The status manager's cached Running, written back.
            (
                json!({"phase": "Running", "reason": "Evicted", "message": MSG, "conditions": target()}),
                Seen::Undone(Undo::NotFailed),
            ),
            (json!({}), Seen::Undone(Undo::NotFailed)),
            // The kubelet's first own Failed: reason and message blanked.
            (
                json!({"phase": "Failed", "conditions": target()}),
                Seen::Undone(Undo::NotOurs),
            ),
            (
                json!({"phase": "Failed", "reason": "Evicted", "message": "other", "conditions": target()}),
                Seen::Undone(Undo::NotOurs),
            ),
            (
                json!({"phase": "Failed", "reason": "Evicted", "message": MSG}),
                Seen::Undone(Undo::NotOurs),
            ),
        ];
        for (status, want) in cases {
            assert_eq!(judge(&pod(status.clone()), "u1", MSG), want, "{status}");
        }
        assert_eq!(
            judge(&ours, "u2", MSG),
            Seen::Gone,
            "a new pod of that name"
        );
    }

    #[test]
    fn a_pod_is_terminal_once_every_container_is() {
        let ours = |containers: serde_json::Value| {
            pod(
                json!({"phase": "Failed", "reason": "Evicted", "message": MSG,
                       "conditions": target(), "containerStatuses": containers}),
            )
        };
        let dead = json!([{"name": "app", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                           "state": {"terminated": {"exitCode": 137}}}]);
        let running = json!([{"name": "app", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                              "state": {"running": {}}}]);
        assert!(terminal(&ours(dead.clone())));
        assert!(
            !terminal(&ours(running.clone())),
            "a container still running"
        );
        let blank =
            pod(json!({"phase": "Failed", "conditions": target(), "containerStatuses": dead}));
        assert!(terminal(&blank), "terminal says nothing of the reason");
        assert_ne!(judge(&blank, "u1", MSG), Seen::Ours, "reason blanked");
    }

    #[test]
    fn the_count_and_window_carry_over_a_restart() {
        let t0 = SystemTime::now();
        let mut r = Reasserts::default();
        for i in 0..3 {
            let _ = r.on_undo(t0 + Duration::from_secs(i));
        }
        let saved = serde_json::to_string(&r).unwrap();
        let mut back: Reasserts = serde_json::from_str(&saved).unwrap();
        assert_eq!(back.done(), 3);
        assert_eq!(
            back.on_undo(t0 + Duration::from_secs(5)),
            Next::Reassert(Duration::from_millis(1600))
        );
        assert_eq!(
            back.on_undo(t0 + REASSERT_WINDOW),
            Next::Delete,
            "the window runs from the first undo, before the restart"
        );
    }

    #[test]
    fn reasserts_back_off_then_delete_past_the_count() {
        let t0 = SystemTime::now();
        let mut r = Reasserts::default();
        let waits: Vec<Next> = (0..=MAX_REASSERTS)
            .map(|i| r.on_undo(t0 + Duration::from_secs(i as u64)))
            .collect();
        let ms = |m| Next::Reassert(Duration::from_millis(m));
        assert_eq!(
            waits,
            [
                ms(200),
                ms(400),
                ms(800),
                ms(1600),
                ms(3200),
                ms(5000),
                ms(5000),
                ms(5000),
                Next::Delete
            ]
        );
        assert_eq!(r.done(), MAX_REASSERTS);
    }

    #[test]
    fn reasserts_end_with_the_window_whatever_the_count() {
        let t0 = SystemTime::now();
        let mut r = Reasserts::default();
        assert_eq!(r.on_undo(t0), Next::Reassert(FIRST_WAIT));
        assert_eq!(
            r.on_undo(t0 + REASSERT_WINDOW - Duration::from_millis(1)),
            Next::Reassert(FIRST_WAIT * 2)
        );
        assert_eq!(r.on_undo(t0 + REASSERT_WINDOW), Next::Delete);
    }
}
