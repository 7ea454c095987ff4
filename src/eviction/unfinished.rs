//! Stops that an earlier criguard process began and may not have seen
//! through: it recorded an eviction (the record outlives a restart or a
//! handoff), then stopped before StopPodSandbox completed, or with a stop
//! still being retried. The kubelet does not know of the eviction until its
//! status reaches the API, so nothing else would release the sandbox.
//!
//! Each process asks the runtime to stop every sandbox of an evicted pod it
//! finds in the model once (StopPodSandbox is idempotent: a stopped
//! sandbox answers at once), killing its processes first when the eviction
//! gave no grace.

use std::collections::BTreeSet;

use super::records::EvictedPods;
use crate::model::NodeModel;

/// The sandboxes in `model` of pods in `evicted` that this process has not
/// stopped yet (`taken`), ordered by id.
pub fn unfinished(
    model: &NodeModel,
    evicted: &EvictedPods,
    taken: &BTreeSet<String>,
) -> Vec<String> {
    model
        .sandbox_infos()
        .filter(|s| evicted.get(&s.uid).is_some() && !taken.contains(&s.id))
        .map(|s| s.id.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{SandboxInfo, SandboxState};

    fn sandbox(id: &str, uid: &str) -> SandboxInfo {
        SandboxInfo {
            id: id.into(),
            uid: uid.into(),
            name: id.into(),
            namespace: "default".into(),
            state: Some(SandboxState::Ready),
            ..Default::default()
        }
    }

    #[test]
    fn only_evicted_pods_not_yet_stopped_by_this_process_are_taken_up() {
        let mut model = NodeModel::new(1 << 30);
        model.upsert_sandbox(sandbox("sb-evicted", "uid-evicted"));
        model.upsert_sandbox(sandbox("sb-evicted-again", "uid-evicted"));
        model.upsert_sandbox(sandbox("sb-stopped", "uid-stopped"));
        model.upsert_sandbox(sandbox("sb-kept", "uid-kept"));
        let mut evicted = EvictedPods::default();
        evicted.insert("uid-evicted", "default/evicted", "m", 1);
        evicted.insert("uid-stopped", "default/stopped", "m", 1);
        let taken = BTreeSet::from(["sb-stopped".to_owned()]);
        assert_eq!(
            unfinished(&model, &evicted, &taken),
            ["sb-evicted", "sb-evicted-again"]
        );
        assert!(unfinished(&model, &EvictedPods::default(), &taken).is_empty());
    }
}
