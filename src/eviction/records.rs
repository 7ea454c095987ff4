//! The pods criguard evicted, which never run again on this node.
//!
//! For the kubelet an eviction ends a pod UID for good (phase Failed, reason
//! Evicted); its controller makes a new pod with a new UID. The kubelet does
//! not know criguard evicted a pod and keeps re-creating its sandbox (at once,
//! after a second, then every 12–15 s), so criguard remembers each evicted
//! UID and refuses its RunPodSandbox for as long as the kubelet keeps asking.
//!
//! A record is forgotten once nobody has asked for its pod for
//! [`EvictedPods::forget_after`] (the kubelet asks until the pod is deleted
//! from the API), and the set is bounded: past [`EvictedPods::max_records`]
//! the records idle longest go first. Times are Unix milliseconds passed in
//! by the caller; nothing here reads a clock or a file.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One evicted pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvictedPod {
    /// `namespace/name`, for messages.
    pub pod: String,
    /// The kubelet-style eviction message.
    pub message: String,
    /// When it was evicted, Unix ms.
    pub evicted_at_ms: u64,
    /// The last time its sandbox was asked for (or the eviction), Unix ms.
    pub last_asked_ms: u64,
    /// RunPodSandbox calls refused for it so far.
    pub refusals: u64,
}

/// Evicted pods by UID, with the rule for forgetting them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvictedPods {
    /// Pod UID → record.
    pub pods: BTreeMap<String, EvictedPod>,
    /// A record nobody asked for this long (ms) is forgotten.
    pub forget_after_ms: u64,
    /// At most this many records are kept.
    pub max_records: usize,
    /// Changed since [`EvictedPods::take_dirty`] was last called.
    #[serde(skip)]
    dirty: bool,
}

/// How long a record outlives the kubelet's last request: one day.
pub const FORGET_AFTER_MS: u64 = 24 * 3600 * 1000;
/// How many records are kept at most.
pub const MAX_RECORDS: usize = 4096;

impl Default for EvictedPods {
    fn default() -> Self {
        Self::new(FORGET_AFTER_MS, MAX_RECORDS)
    }
}

impl EvictedPods {
    /// An empty set with the given limits.
    pub fn new(forget_after_ms: u64, max_records: usize) -> Self {
        Self {
            pods: BTreeMap::new(),
            forget_after_ms,
            max_records: max_records.max(1),
            dirty: false,
        }
    }

    /// How long an unasked record is kept.
    pub fn forget_after(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.forget_after_ms)
    }

    /// The most records kept.
    pub fn max_records(&self) -> usize {
        self.max_records
    }

    /// Records an eviction of `uid` at `now_ms`.
    pub fn insert(&mut self, uid: &str, pod: &str, message: &str, now_ms: u64) {
        self.pods.insert(
            uid.to_owned(),
            EvictedPod {
                pod: pod.to_owned(),
                message: message.to_owned(),
                evicted_at_ms: now_ms,
                last_asked_ms: now_ms,
                refusals: 0,
            },
        );
        self.dirty = true;
        self.bound();
    }

    /// The record of `uid`, if it was evicted.
    pub fn get(&self, uid: &str) -> Option<&EvictedPod> {
        self.pods.get(uid)
    }

    /// Notes that `uid`'s sandbox was asked for (and refused) at `now_ms`.
    pub fn asked(&mut self, uid: &str, now_ms: u64) {
        if let Some(p) = self.pods.get_mut(uid) {
            p.last_asked_ms = p.last_asked_ms.max(now_ms);
            p.refusals += 1;
            self.dirty = true;
        }
    }

    /// Forgets records nobody asked for since `now_ms − forget_after`;
    /// returns the UIDs forgotten.
    pub fn prune(&mut self, now_ms: u64) -> Vec<String> {
        let cutoff = now_ms.saturating_sub(self.forget_after_ms);
        let gone: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, p)| p.last_asked_ms < cutoff)
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in &gone {
            self.pods.remove(uid);
        }
        if !gone.is_empty() {
            self.dirty = true;
        }
        gone
    }

    /// Drops the records idle longest until at most `max_records` remain.
    fn bound(&mut self) {
        while self.pods.len() > self.max_records {
            let oldest = self
                .pods
                .iter()
                .min_by_key(|(uid, p)| (p.last_asked_ms, (*uid).clone()))
                .map(|(uid, _)| uid.clone());
            match oldest {
                Some(uid) => self.pods.remove(&uid),
                None => break,
            };
        }
    }

    /// Whether anything changed since the last call (and clears the flag):
    /// the caller saves the set when it did.
    pub fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty)
    }

    /// The same records under this set's limits (a loaded file's own
    /// limits give way to the configured ones), pruned at `now_ms`.
    pub fn adopt(&mut self, loaded: EvictedPods, now_ms: u64) {
        self.pods = loaded.pods;
        self.bound();
        self.prune(now_ms);
        self.dirty = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1000;

    #[test]
    fn an_evicted_uid_is_remembered_while_the_kubelet_keeps_asking() {
        let mut e = EvictedPods::new(60 * S, 10);
        e.insert("u1", "ns/a", "The node was low on resource: memory.", 0);
        // The kubelet asks every 15 s for ten minutes: never forgotten.
        for t in (15..600).step_by(15) {
            e.asked("u1", t * S);
            assert!(e.prune(t * S).is_empty(), "forgotten at {t}s");
        }
        assert_eq!(e.get("u1").unwrap().refusals, 39);
        // Then it stops asking (the pod was deleted): gone a minute later.
        assert!(e.prune(645 * S).is_empty());
        assert_eq!(e.prune(646 * S), vec!["u1".to_owned()]);
        assert!(e.get("u1").is_none());
    }

    #[test]
    fn the_set_is_bounded_dropping_the_longest_idle_first() {
        let mut e = EvictedPods::new(3600 * S, 3);
        for (i, uid) in ["a", "b", "c"].iter().enumerate() {
            e.insert(uid, uid, "m", i as u64 * S);
        }
        e.asked("a", 10 * S); // a is still asked for: b is now the idlest
        e.insert("d", "d", "m", 11 * S);
        let kept: Vec<&str> = e.pods.keys().map(String::as_str).collect();
        assert_eq!(kept, ["a", "c", "d"]);
    }

    #[test]
    fn changes_mark_the_set_dirty_once() {
        let mut e = EvictedPods::default();
        assert!(!e.take_dirty());
        e.insert("u", "p", "m", 5);
        assert!(e.take_dirty());
        assert!(!e.take_dirty());
        e.asked("other", 6); // not evicted: nothing changes
        assert!(!e.take_dirty());
        e.asked("u", 6);
        assert!(e.take_dirty());
    }

    #[test]
    fn a_loaded_set_takes_the_configured_limits_and_is_pruned() {
        let mut file = EvictedPods::new(u64::MAX, 100);
        file.insert("old", "p", "m", 0);
        file.insert("new", "p", "m", 100 * S);
        let mut e = EvictedPods::new(60 * S, 10);
        e.adopt(file, 120 * S);
        assert_eq!(e.pods.keys().collect::<Vec<_>>(), ["new"]);
        assert_eq!(e.forget_after_ms, 60 * S);
        assert!(!e.take_dirty());
    }
}
