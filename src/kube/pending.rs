//! The evicted pods whose API report is not over, kept in
//! `<state-dir>/kube-pods.json` so a restarted criguard carries on with
//! them where the last one stopped: a status not yet written is written; a
//! status written is watched (and written again when undone) until the
//! kubelet's own status is terminal with criguard's reason (see
//! [`super::reassert`]), with the writes again already made, the
//! first undo's time, the last write's time and resourceVersion carried
//! over.
//!
//! Times are wall-clock (ms since the epoch): a monotonic instant means
//! nothing to the next process. A clock stepped back makes a wait look
//! longer, by at most the step; one stepped forward ends it early. The
//! watch is bounded by [`super::pod::WATCH_FOR`], measured from the first
//! status write.
//!
//! The file is written atomically and privately ([`crate::statefile`])
//! whenever the set changes, off the async threads, under the set's lock,
//! so the last save always holds the current set. A file that cannot be
//! read is logged and set aside as `kube-pods.json.bad`; the report then
//! starts with nothing to resume, as before this file existed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::lock::Locked;
use serde::{Deserialize, Serialize};

use super::PodEviction;
use super::reassert::Reasserts;

/// The file's name in the state directory.
pub const FILE_NAME: &str = "kube-pods.json";

/// One evicted pod's report in progress.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PendingPod {
    /// The eviction being reported.
    pub eviction: PodEviction,
    /// When the report started, ms since the epoch.
    pub since_unix_ms: u64,
    /// Whether criguard's status was written (then only the watch is left).
    pub written: bool,
    /// When the status was first written, ms since the epoch (a file from
    /// before this field: `since_unix_ms` stands in).
    #[serde(default)]
    pub written_unix_ms: Option<u64>,
    /// criguard's last write of the status: when (ms since the epoch) and
    /// the resourceVersion it left.
    #[serde(default)]
    pub last_write: Option<(u64, String)>,
    /// The writes again made so far, and when the first undo was seen.
    #[serde(default)]
    pub reasserts: Reasserts,
}

impl PendingPod {
    /// A report just started at `since_unix_ms`: nothing written yet.
    pub fn new(eviction: PodEviction, since_unix_ms: u64) -> Self {
        Self {
            eviction,
            since_unix_ms,
            written: false,
            written_unix_ms: None,
            last_write: None,
            reasserts: Reasserts::default(),
        }
    }

    /// When the report started (the eviction's time in the status).
    pub fn since(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.since_unix_ms)
    }

    /// Where its window starts: the first status write, or the report's
    /// start while nothing is written.
    pub fn window_start_ms(&self) -> u64 {
        match (self.written, self.written_unix_ms) {
            (true, Some(at)) => at,
            _ => self.since_unix_ms,
        }
    }

    /// Records a status write at `at_ms` that left resourceVersion `rv`.
    pub fn wrote(&mut self, at_ms: u64, rv: &str) {
        if !self.written || self.written_unix_ms.is_none() {
            self.written_unix_ms = Some(at_ms);
        }
        self.written = true;
        self.last_write = Some((at_ms, rv.to_owned()));
    }
}

/// The pods of reports in progress, by UID, and where they are saved.
#[derive(Clone, Debug, Default)]
pub struct Pending {
    path: Option<PathBuf>,
    pods: Arc<Mutex<BTreeMap<String, PendingPod>>>,
}

impl Pending {
    /// Pending reports saved in `state_dir` (none: kept in memory only),
    /// and the reports a previous run left, still within `window` at `now`.
    pub fn load(
        state_dir: Option<&Path>,
        now: SystemTime,
        window: Duration,
    ) -> (Self, Vec<PendingPod>) {
        let path = state_dir.map(|d| d.join(FILE_NAME));
        let left: BTreeMap<String, PendingPod> = path
            .as_deref()
            .and_then(crate::statefile::read_json)
            .unwrap_or_default();
        let now_ms = crate::clock::unix_ms(now);
        let window_ms = window.as_millis() as u64;
        let resume: BTreeMap<String, PendingPod> = left
            .into_iter()
            .filter(|(_, p)| now_ms.saturating_sub(p.window_start_ms()) < window_ms)
            .collect();
        let list = resume.values().cloned().collect();
        let me = Self {
            path,
            pods: Arc::new(Mutex::new(resume)),
        };
        (me, list)
    }

    /// Records (or updates) `p` and saves the set in the background.
    pub fn upsert(&self, p: PendingPod) {
        self.lock().insert(p.eviction.uid.clone(), p);
        self.save_in_background();
    }

    /// Forgets the report of `uid` and saves the set in the background.
    pub fn remove(&self, uid: &str) {
        if self.lock().remove(uid).is_some() {
            self.save_in_background();
        }
    }

    /// The reports in progress now.
    pub fn list(&self) -> Vec<PendingPod> {
        self.lock().values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, PendingPod>> {
        self.pods.locked()
    }

    fn save_in_background(&self) {
        let Some(path) = self.path.clone() else {
            return;
        };
        let me = self.clone();
        let save = move || {
            // Under the lock: whichever save runs last writes the set as it
            // is then, never an older snapshot.
            let pods = me.lock();
            let bytes = serde_json::to_vec_pretty(&*pods).unwrap_or_default();
            if let Err(err) = crate::statefile::write_private(&path, &bytes) {
                tracing::error!(%err, "cannot save the evicted pods' API reports in progress");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(save);
            }
            Err(_) => save(),
        }
    }

    /// Saves now, on this thread (tests).
    #[cfg(test)]
    fn save_now(&self) {
        let path = self.path.clone().unwrap();
        let bytes = serde_json::to_vec_pretty(&*self.lock()).unwrap();
        crate::statefile::write_private(&path, &bytes).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, since: u64) -> PendingPod {
        let mut p = PendingPod::new(
            PodEviction {
                namespace: "default".into(),
                name: format!("p-{uid}"),
                uid: uid.into(),
                message: "The node was low on resource: memory. ".into(),
                resource: "memory".into(),
                offending: Some(("app".into(), "40Mi".into())),
            },
            since,
        );
        p.wrote(since, "7");
        p
    }

    #[test]
    fn reports_within_their_window_come_back_after_a_restart() {
        let tmp = tempfile::tempdir().unwrap();
        let at = |ms| UNIX_EPOCH + Duration::from_millis(ms);
        let window = Duration::from_secs(300);
        let (p, left) = Pending::load(Some(tmp.path()), at(1_000_000), window);
        assert!(left.is_empty());
        p.lock().insert("old".into(), pod("old", 1_000_000));
        p.lock().insert("new".into(), pod("new", 1_200_000));
        p.lock().insert("gone".into(), pod("gone", 1_200_000));
        p.lock().remove("gone");
        p.save_now();
        let (_, back) = Pending::load(Some(tmp.path()), at(1_350_000), window);
        assert_eq!(
            back,
            [pod("new", 1_200_000)],
            "the old one's window is over"
        );
        let mode = |path: &Path| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(path).unwrap().permissions().mode() & 0o777
        };
        assert_eq!(mode(&tmp.path().join(FILE_NAME)), 0o600);
    }

    #[test]
    fn the_watch_state_survives_a_restart_and_its_window_counts_from_the_write() {
        let tmp = tempfile::tempdir().unwrap();
        let at = |ms| UNIX_EPOCH + Duration::from_millis(ms);
        let window = Duration::from_secs(300);
        let (p, _) = Pending::load(Some(tmp.path()), at(1_000_000), window);
        // Started at 1 000 s, written only at 1 200 s (the API was down),
        // written again twice since.
        let mut slow = pod("slow", 1_000_000);
        slow.written = false;
        slow.written_unix_ms = None;
        slow.wrote(1_200_000, "10");
        let _ = slow.reasserts.on_undo(at(1_200_300));
        let _ = slow.reasserts.on_undo(at(1_200_900));
        slow.wrote(1_201_000, "14");
        p.lock().insert("slow".into(), slow.clone());
        p.save_now();
        let (_, back) = Pending::load(Some(tmp.path()), at(1_350_000), window);
        assert_eq!(back, [slow], "150 s after the write: within its window");
        assert_eq!(back[0].reasserts.done(), 2);
        assert_eq!(back[0].last_write, Some((1_201_000, "14".into())));
        let (_, late) = Pending::load(Some(tmp.path()), at(1_500_000), window);
        assert!(late.is_empty(), "300 s after the first write: over");
    }

    #[test]
    fn a_file_from_before_the_watch_state_is_read() {
        let tmp = tempfile::tempdir().unwrap();
        let old = r#"{"u1": {"eviction": {"namespace": "default", "name": "p", "uid": "u1",
            "message": "m", "resource": "memory", "offending": null},
            "since_unix_ms": 1000000, "written": true}}"#;
        std::fs::write(tmp.path().join(FILE_NAME), old).unwrap();
        let at = UNIX_EPOCH + Duration::from_millis(1_100_000);
        let (_, back) = Pending::load(Some(tmp.path()), at, Duration::from_secs(300));
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].window_start_ms(), 1_000_000);
        assert_eq!(back[0].reasserts, Reasserts::default());
    }

    #[test]
    fn a_corrupt_file_resumes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join(FILE_NAME), b"[not json").unwrap();
        let (_, left) = Pending::load(
            Some(tmp.path()),
            SystemTime::now(),
            Duration::from_secs(300),
        );
        assert!(left.is_empty());
        assert!(tmp.path().join("kube-pods.json.bad").exists());
    }
}
