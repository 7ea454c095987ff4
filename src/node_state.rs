//! What the eviction manager and image GC share with the proxy and the
//! admin API: the node's status (conditions, evicted pods, the evictions
//! made) and the image uses the proxy sees between image collections.
//!
//! These are plain shared state, written by one part and read by another;
//! they live here so that the proxy (`crate::cri`) depends on nothing in
//! `crate::reclaim`, only on this small module.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::policy::evicted::EvictedPods;
use crate::policy::thresholds::{Condition, Observations};

/// One eviction, as logged and as `criguard evictions` shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Eviction {
    /// When, ms since the epoch.
    pub at_unix_ms: u64,
    /// `namespace/name`.
    pub pod: String,
    /// Pod UID.
    pub uid: String,
    /// Sandbox id.
    pub sandbox_id: String,
    /// The signal whose threshold was met.
    pub signal: String,
    /// The threshold, as configured.
    pub threshold: String,
    /// The signal's available amount when the pod was chosen.
    pub available: i64,
    /// The pod's working set, bytes.
    pub usage: i64,
    /// The pod's memory request, bytes.
    pub request: i64,
    /// Grace given to its containers, seconds.
    pub grace_s: i64,
    /// The kubelet-style message.
    pub message: String,
    /// Decided but not carried out (`--dry-run`).
    pub dry_run: bool,
}

/// What the rest of criguard needs to know: conditions, evicted pods, history.
#[derive(Clone, Debug, Default)]
pub struct NodeStatus {
    /// Node conditions now.
    pub conditions: BTreeSet<Condition>,
    /// The pods criguard evicted: never admitted again (kept across restarts).
    pub evicted: EvictedPods,
    /// The latest evictions from before a restart (at most 256), then every one since.
    pub evictions: Vec<Eviction>,
    /// The last observations (none before the first round).
    pub observations: Option<Observations>,
    /// How many evictions were recorded; the admin API's WatchEvictions
    /// waits on it.
    pub recorded: tokio::sync::watch::Sender<usize>,
    /// `--dry-run` in effect: the conditions are observed and shown, but
    /// admission refuses nothing for them (an evicted pod stays refused).
    pub dry_run: bool,
}

impl NodeStatus {
    /// Appends `e` to the evictions and wakes every watcher.
    pub fn record_eviction(&mut self, e: Eviction) {
        self.evictions.push(e);
        self.recorded.send_replace(self.evictions.len());
    }
}

/// Image uses seen between collections (a container created through the
/// proxy): image reference as the kubelet wrote it → when, ms since the epoch.
#[derive(Clone, Debug, Default)]
pub struct ImageUses(Arc<Mutex<HashMap<String, i64>>>);

impl ImageUses {
    /// Records that a container was just created from `image`.
    pub fn touch(&self, image: &str) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.insert(image.to_owned(), now_ms());
    }

    /// Takes every use recorded since the last call.
    pub(crate) fn take(&self) -> HashMap<String, i64> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Now, ms since the epoch (0 before it).
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
