//! The evicted pods' state file, `<state-dir>/evicted-pods.json`, and the
//! eviction manager's memory, `<state-dir>/pressure.json`.
//!
//! `pressure.json` ([`Remembered`]) holds what a restarted criguard needs
//! to carry on as if it had not restarted: when each pressure condition's
//! threshold was last observed met, so that the pressure transition period
//! counts from that observation across the restart (the condition, the
//! admission refusals it brings and the node's condition and taint in the
//! API stay until then), and the last [`KEPT_EVICTIONS`] evictions, which
//! `criguard evictions` lists. Its times are wall-clock, ms since the epoch:
//! the monotonic clock the running manager uses restarts with the process
//! (and with the machine). The cost: a clock stepped while criguard was
//! down shifts the remembered pressure by the step; a last observation
//! that lies in the future (the clock went back) counts as observed now,
//! so a condition never outlives one transition period from the restart.
//!
//! The decisions are in [`super::records`]; this is only the file:
//! read once at start, written atomically (a temporary file, fsynced, renamed
//! over the old one, the directory fsynced) whenever the set changed. The
//! directory is created 0700 and the file is 0600: pod names and eviction
//! messages are the node's business. A file that cannot be read or parsed is
//! logged and set aside as `evicted-pods.json.bad`, and criguard starts with
//! no records: that must never keep it from serving.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::time::Duration;

use crate::lock::RwLocked;
use serde::{Deserialize, Serialize};

use super::records::EvictedPods;
use super::status::{Eviction, NodeStatus};
use crate::signals::table::Condition;

/// The file's name in the state directory.
pub const FILE_NAME: &str = "evicted-pods.json";
/// The eviction manager's memory's name in the state directory.
pub const PRESSURE_FILE: &str = "pressure.json";
/// How many evictions are kept across restarts (the latest).
pub const KEPT_EVICTIONS: usize = 256;

/// What the eviction manager remembers across restarts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Remembered {
    /// Condition (`MemoryPressure`, `DiskPressure`, `PIDPressure`) → when
    /// a threshold of it was last observed met, ms since the epoch.
    pub last_observed: BTreeMap<String, u64>,
    /// The latest evictions, oldest first.
    pub evictions: Vec<Eviction>,
}

const CONDITIONS: [Condition; 3] = [
    Condition::MemoryPressure,
    Condition::DiskPressure,
    Condition::PIDPressure,
];

/// The kubelet's name of condition `c`.
pub fn condition_name(c: Condition) -> &'static str {
    match c {
        Condition::MemoryPressure => "MemoryPressure",
        Condition::DiskPressure => "DiskPressure",
        Condition::PIDPressure => "PIDPressure",
    }
}

impl Remembered {
    /// The remembered last observations, by condition, none later than
    /// `now_ms` (a later one is taken as observed at `now_ms`); unknown
    /// names are left out.
    pub fn observations(&self, now_ms: u64) -> BTreeMap<Condition, u64> {
        CONDITIONS
            .iter()
            .filter_map(|c| {
                let at = *self.last_observed.get(condition_name(*c))?;
                Some((*c, at.min(now_ms)))
            })
            .collect()
    }

    /// What to save: `last` observations and the latest [`KEPT_EVICTIONS`]
    /// of `evictions`.
    pub fn of(last: &BTreeMap<Condition, u64>, evictions: &[Eviction]) -> Self {
        let from = evictions.len().saturating_sub(KEPT_EVICTIONS);
        Self {
            last_observed: last
                .iter()
                .map(|(c, at)| (condition_name(*c).to_owned(), *at))
                .collect(),
            evictions: evictions[from..].to_vec(),
        }
    }
}

/// The conditions that still hold at `now_ms` by their last observations
/// `last`: those observed less than `period` ago (or at `now_ms` itself,
/// for a zero period), as the kubelet's transition period has it.
pub fn held(last: &BTreeMap<Condition, u64>, now_ms: u64, period: Duration) -> BTreeSet<Condition> {
    let period = period.as_millis() as u64;
    last.iter()
        .filter(|(_, at)| **at >= now_ms || now_ms - **at < period)
        .map(|(c, _)| *c)
        .collect()
}

/// How long from `now_ms` until the next of the held conditions in `last`
/// runs out of its transition period; `None` when none is held.
pub fn next_expiry(
    last: &BTreeMap<Condition, u64>,
    now_ms: u64,
    period: Duration,
) -> Option<Duration> {
    let period = period.as_millis() as u64;
    last.values()
        .map(|at| at.saturating_add(period))
        .filter(|end| *end > now_ms)
        .min()
        .map(|end| Duration::from_millis(end - now_ms))
}

/// Where the evicted pods are kept.
#[derive(Clone, Debug)]
pub struct EvictedStore {
    path: PathBuf,
    pressure: PathBuf,
}

impl EvictedStore {
    /// The store in `state_dir`.
    pub fn new(state_dir: &Path) -> Self {
        Self {
            path: state_dir.join(FILE_NAME),
            pressure: state_dir.join(PRESSURE_FILE),
        }
    }

    /// What the last run remembered (nothing when there is no file, or a
    /// bad one, which is set aside).
    pub fn load_remembered(&self) -> Remembered {
        crate::statefile::read_json(&self.pressure).unwrap_or_default()
    }

    /// Saves `r` atomically and privately, retried until written
    /// ([`crate::statefile::write_or_retry`]); errors carry the path.
    pub fn save_remembered(&self, r: &Remembered) -> std::io::Result<()> {
        crate::statefile::write_or_retry(&self.pressure, serde_json::to_vec_pretty(r)?)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The records saved last time (none when there is no file), under the
    /// limits of `into`, pruned at `now_ms`.
    pub fn load_into(&self, into: &mut EvictedPods, now_ms: u64) {
        let text = match std::fs::read(&self.path) {
            Ok(t) => t,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return,
            Err(err) => {
                tracing::error!(path = %self.path.display(), %err, "cannot read the evicted pods; starting without them");
                return;
            }
        };
        match serde_json::from_slice::<EvictedPods>(&text) {
            Ok(loaded) => {
                into.adopt(loaded, now_ms);
                tracing::info!(path = %self.path.display(), pods = into.pods.len(), "evicted pods loaded: their sandboxes stay refused");
            }
            Err(err) => {
                let bad = self.path.with_extension("json.bad");
                let _ = std::fs::rename(&self.path, &bad);
                tracing::error!(path = %self.path.display(), set_aside = %bad.display(), %err, "evicted pods file not valid JSON; starting without it");
            }
        }
    }

    /// The node status criguard starts with: the evicted pods and the
    /// evictions saved by the last run; the conditions come with the
    /// eviction manager, which knows the transition period.
    pub fn initial_status(&self) -> NodeStatus {
        let mut status = NodeStatus::default();
        self.load_into(&mut status.evicted, crate::clock::now_ms());
        status.evictions = self.load_remembered().evictions;
        status.recorded.send_replace(status.evictions.len());
        status
    }

    /// Writes `pods` atomically and privately, retried until written
    /// ([`crate::statefile::write_or_retry`]); errors carry the path.
    pub fn save(&self, pods: &EvictedPods) -> std::io::Result<()> {
        crate::statefile::write_or_retry(&self.path, serde_json::to_vec_pretty(pods)?)
    }
}

/// Records eviction `e` in `status` for admission at once and starts saving
/// the set to `store` off the proxy's thread; the caller awaits the save
/// once the pod is stopped, so a restart cannot let the pod back in.
pub fn remember(
    status: &RwLock<NodeStatus>,
    store: Option<&EvictedStore>,
    e: &Eviction,
) -> Option<tokio::task::JoinHandle<()>> {
    let snapshot = {
        let mut st = status.write_locked();
        st.evicted.insert(&e.uid, &e.pod, &e.message, e.at_unix_ms);
        st.evicted.take_dirty();
        st.evicted.clone()
    };
    let store = store?.clone();
    let pod = e.pod.clone();
    Some(tokio::task::spawn_blocking(move || {
        if let Err(err) = store.save(&snapshot) {
            tracing::error!(%err, %pod, "cannot save the evicted pods yet; the pod stays refused, and the save is retried until written");
        }
    }))
}

/// Forgets evicted pods nobody asked for in a long while and saves the set
/// to `store` if it changed (off the proxy's thread: the save fsyncs).
pub async fn persist(status: &RwLock<NodeStatus>, store: Option<&EvictedStore>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    // One save in flight at a time: a save stuck on a hung state directory
    // is not joined by another each round (the set stays dirty meanwhile
    // and is saved by the first round after it returns).
    static SAVING: AtomicBool = AtomicBool::new(false);
    let snapshot = {
        let mut st = status.write_locked();
        for uid in st.evicted.prune(crate::clock::now_ms()) {
            tracing::info!(%uid, "evicted pod forgotten: its sandbox was not asked for in a long while");
        }
        if SAVING.load(Ordering::Acquire) {
            return;
        }
        st.evicted.take_dirty().then(|| st.evicted.clone())
    };
    if let (Some(store), Some(pods)) = (store.cloned(), snapshot) {
        SAVING.store(true, Ordering::Release);
        let save = tokio::task::spawn_blocking(move || {
            let r = store.save(&pods);
            SAVING.store(false, Ordering::Release);
            r
        });
        match tokio::time::timeout(STATE_WRITE_DEADLINE, save).await {
            Ok(Ok(Err(err))) => tracing::error!(%err, "cannot save the evicted pods"),
            Ok(_) => {}
            Err(_) => tracing::warn!(
                deadline = ?STATE_WRITE_DEADLINE,
                "saving the evicted pods has not finished (a hung state directory?); no other save starts until it does"
            ),
        }
    }
}

/// How long an eviction round waits for a state file save before it goes
/// on without it (the save goes on on its thread).
pub const STATE_WRITE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn saved_records_come_back_with_private_modes() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        let store = EvictedStore::new(&dir);
        let mut pods = EvictedPods::default();
        pods.insert(
            "uid-1",
            "ns/hog",
            "The node was low on resource: memory.",
            1_000,
        );
        store.save(&pods).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(store.path()), 0o600);
        assert!(!dir.join("evicted-pods.json.tmp").exists());
        let mut back = EvictedPods::default();
        store.load_into(&mut back, 2_000);
        assert_eq!(back.pods, pods.pods);
    }

    #[test]
    fn conditions_hold_for_the_transition_period_from_their_last_observation() {
        let period = Duration::from_secs(60);
        let last = BTreeMap::from([
            (Condition::MemoryPressure, 100_000),
            (Condition::DiskPressure, 50_000),
        ]);
        assert_eq!(
            held(&last, 120_000, period),
            BTreeSet::from([Condition::MemoryPressure])
        );
        assert_eq!(held(&last, 160_000, period), BTreeSet::new());
        assert_eq!(
            next_expiry(&last, 120_000, period),
            Some(Duration::from_secs(40))
        );
        assert_eq!(next_expiry(&last, 160_000, period), None);
        // A zero period holds a condition only at the instant it was seen.
        assert_eq!(held(&last, 100_000, Duration::ZERO).len(), 1);
    }

    #[test]
    fn remembered_pressure_and_evictions_come_back_bounded() {
        let tmp = tempfile::tempdir().unwrap();
        let store = EvictedStore::new(tmp.path());
        assert_eq!(store.load_remembered(), Remembered::default());
        let e = |i: u64| Eviction {
            at_unix_ms: i,
            pod: format!("default/p{i}"),
            uid: format!("u{i}"),
            sandbox_id: format!("s{i}"),
            signal: "memory.available".into(),
            threshold: "memory.available<100Mi".into(),
            available: 1,
            usage: 2,
            request: 0,
            grace_s: 0,
            message: "m".into(),
            dry_run: false,
        };
        let all: Vec<Eviction> = (0..300).map(e).collect();
        let last = BTreeMap::from([(Condition::PIDPressure, 5_000)]);
        store.save_remembered(&Remembered::of(&last, &all)).unwrap();
        let back = store.load_remembered();
        assert_eq!(back.evictions.len(), KEPT_EVICTIONS);
        assert_eq!(back.evictions[0].uid, "u44", "the latest are kept");
        assert_eq!(back.observations(9_000), last);
        // A last observation in the future (the clock went back) is now.
        assert_eq!(back.observations(4_000)[&Condition::PIDPressure], 4_000);
        let st = store.initial_status();
        assert_eq!(st.evictions.len(), KEPT_EVICTIONS);
        assert_eq!(*st.recorded.borrow(), KEPT_EVICTIONS);
    }

    #[test]
    fn a_corrupt_file_is_set_aside_and_nothing_is_loaded() {
        let tmp = tempfile::tempdir().unwrap();
        let store = EvictedStore::new(tmp.path());
        std::fs::write(store.path(), b"{not json").unwrap();
        let mut back = EvictedPods::default();
        store.load_into(&mut back, 0);
        assert!(back.pods.is_empty());
        assert!(tmp.path().join("evicted-pods.json.bad").exists());
        // And a missing file is simply no records.
        store.load_into(&mut back, 0);
        assert!(back.pods.is_empty());
    }
}
