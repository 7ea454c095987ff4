//! What is kept of each kernel OOM kill, for `criguard evictions`.

use std::sync::{Arc, RwLock};

use crate::lock::RwLocked;
use serde::{Deserialize, Serialize};

use crate::model::qos::QosClass;

/// How many kills are kept for `criguard evictions` (oldest dropped first).
pub const KEEP: usize = 1024;

/// One kernel OOM kill (or several at once) in a container.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OomKill {
    /// When: the OOM notification's time, else the exit's or the reading's;
    /// ms since the epoch.
    pub at_unix_ms: u64,
    /// `namespace/name` of the pod.
    pub pod: String,
    /// Pod UID.
    pub uid: String,
    /// Sandbox id.
    pub sandbox_id: String,
    /// Container name ([`SANDBOX_TASK`] for the pause task).
    pub container: String,
    /// Container id (the sandbox id for the pause task).
    pub container_id: String,
    /// The pod's QoS class.
    pub qos: QosClass,
    /// Processes killed (the counter's increase).
    pub kills: u64,
    /// `namespace/name` of the pod criguard ranked first then, if any.
    pub first_ranked: Option<String>,
    /// True when the killed container's pod was criguard's first.
    pub matched_rank: bool,
    /// True when the kill was announced: containerd's `/tasks/oom` for
    /// this task was seen (before the kill was read, or after the task's
    /// exit recorded it: containerd 2 on a loaded machine publishes it
    /// late), or the kernel's log named its cgroup (v1).
    pub notified: bool,
}

/// The kills recorded since start; clones share them.
#[derive(Clone, Debug, Default)]
pub struct OomKills {
    list: Arc<RwLock<Vec<OomKill>>>,
}

impl OomKills {
    /// Every kill kept, oldest first.
    pub fn list(&self) -> Vec<OomKill> {
        self.list.read_locked().clone()
    }

    pub(super) fn push(&self, kill: OomKill) {
        let mut l = self.list.write_locked();
        if l.len() == KEEP {
            l.remove(0);
        }
        l.push(kill);
    }

    /// Marks the latest kill in `container_id` not yet marked as notified;
    /// false when there is none.
    pub(super) fn mark_notified(&self, container_id: &str) -> bool {
        let mut l = self.list.write_locked();
        let latest = l
            .iter_mut()
            .rev()
            .find(|k| k.container_id == container_id && !k.notified);
        latest.map(|k| k.notified = true).is_some()
    }
}
