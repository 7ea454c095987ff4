//! What the eviction manager shares with the proxy's admission and the
//! admin API: the node's status (conditions, evicted pods, the evictions
//! made). Plain shared state, written by the manager (and admission, which
//! notes refusals) and read by the others.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::records::EvictedPods;
use crate::eviction::thresholds::Observations;
use crate::signals::table::Condition;

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
