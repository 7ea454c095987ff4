//! Dead-container and sandbox garbage collection, the kubelet's policy
//! (`pkg/kubelet/kuberuntime/kuberuntime_gc.go`), as pure functions.
//!
//! Containers that are not running and older than the minimum age are
//! grouped by (pod, container name), newest first. Each group keeps at most
//! `max_per_pod_container` dead instances; if the node then still holds more
//! than `max_containers` dead containers, each group is cut to
//! `max_containers / groups` (at least one) and, if that is not enough, the
//! oldest go first across groups. A running container is never chosen. Dead
//! sandboxes with no containers left go too, except a pod's newest sandbox.

use std::collections::BTreeMap;
use std::time::Duration;

/// The kubelet's container GC settings and defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcPolicy {
    /// Minimum age of a dead container before it may go (kubelet default 0).
    pub min_age: Duration,
    /// Dead instances kept per (pod, container name); negative: no limit (default 1).
    pub max_per_pod_container: i32,
    /// Dead containers kept on the node; negative: no limit (default −1).
    pub max_containers: i32,
}

impl Default for GcPolicy {
    fn default() -> Self {
        Self {
            min_age: Duration::ZERO,
            max_per_pod_container: 1,
            max_containers: -1,
        }
    }
}

/// A container that is not running.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadContainer {
    /// Container id.
    pub id: String,
    /// Its pod's UID.
    pub pod_uid: String,
    /// Container name.
    pub name: String,
    /// Creation time, ns since the epoch.
    pub created_at_ns: i64,
}

/// A sandbox, for sandbox GC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxRecord {
    /// Sandbox id.
    pub id: String,
    /// Its pod's UID.
    pub pod_uid: String,
    /// Ready (running).
    pub ready: bool,
    /// Creation time, ns since the epoch.
    pub created_at_ns: i64,
    /// Containers it still has (any state).
    pub containers: usize,
}

fn cut(units: &mut [Vec<&DeadContainer>], keep: usize, out: &mut Vec<String>) {
    for unit in units.iter_mut() {
        while unit.len() > keep {
            out.push(unit.pop().expect("len > keep").id.clone());
        }
    }
}

/// The dead containers to remove now, oldest-first within the rules above.
pub fn containers_to_remove(dead: &[DeadContainer], policy: GcPolicy, now_ns: i64) -> Vec<String> {
    let min_age = policy.min_age.as_nanos() as i64;
    let mut groups: BTreeMap<(&str, &str), Vec<&DeadContainer>> = BTreeMap::new();
    for c in dead.iter().filter(|c| now_ns - c.created_at_ns >= min_age) {
        groups
            .entry((c.pod_uid.as_str(), c.name.as_str()))
            .or_default()
            .push(c);
    }
    let mut units: Vec<Vec<&DeadContainer>> = groups.into_values().collect();
    for u in &mut units {
        u.sort_by_key(|c| std::cmp::Reverse(c.created_at_ns)); // newest first
    }
    let mut out = Vec::new();
    if policy.max_per_pod_container >= 0 {
        cut(&mut units, policy.max_per_pod_container as usize, &mut out);
    }
    if policy.max_containers >= 0 {
        let max = policy.max_containers as usize;
        let total: usize = units.iter().map(Vec::len).sum();
        if total > max && !units.is_empty() {
            let per_unit = (max / units.len()).max(1);
            cut(&mut units, per_unit, &mut out);
        }
        let mut rest: Vec<&DeadContainer> = units.into_iter().flatten().collect();
        if rest.len() > max {
            rest.sort_by_key(|c| c.created_at_ns);
            let extra = rest.len() - max;
            out.extend(rest[..extra].iter().map(|c| c.id.clone()));
        }
    }
    out
}

/// Under disk pressure (the kubelet's DeleteAllUnusedContainers): every dead
/// container past the minimum age whose pod has no ready sandbox left (a
/// terminated or evicted pod needs none of them), on top of
/// [`containers_to_remove`].
pub fn containers_of_terminated_pods(
    dead: &[DeadContainer],
    ready_pods: &std::collections::BTreeSet<String>,
    policy: GcPolicy,
    now_ns: i64,
) -> Vec<String> {
    let min_age = policy.min_age.as_nanos() as i64;
    let mut out = containers_to_remove(dead, policy, now_ns);
    for c in dead {
        if !ready_pods.contains(&c.pod_uid)
            && now_ns - c.created_at_ns >= min_age
            && !out.contains(&c.id)
        {
            out.push(c.id.clone());
        }
    }
    out
}

/// Sandboxes to remove: not ready, no containers left, and not their pod's newest.
pub fn sandboxes_to_remove(sandboxes: &[SandboxRecord]) -> Vec<String> {
    let mut newest: BTreeMap<&str, i64> = BTreeMap::new();
    for s in sandboxes {
        let n = newest.entry(&s.pod_uid).or_insert(s.created_at_ns);
        *n = (*n).max(s.created_at_ns);
    }
    sandboxes
        .iter()
        .filter(|s| !s.ready && s.containers == 0 && newest[s.pod_uid.as_str()] != s.created_at_ns)
        .map(|s| s.id.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dead(id: &str, pod: &str, name: &str, t: i64) -> DeadContainer {
        DeadContainer {
            id: id.into(),
            pod_uid: pod.into(),
            name: name.into(),
            created_at_ns: t,
        }
    }

    #[test]
    fn keeps_the_newest_dead_instance_per_container_by_default() {
        let d = [
            dead("a1", "p", "a", 1),
            dead("a3", "p", "a", 3),
            dead("a2", "p", "a", 2),
            dead("b1", "p", "b", 1),
        ];
        let mut out = containers_to_remove(&d, GcPolicy::default(), 10);
        out.sort();
        assert_eq!(out, ["a1", "a2"]);
    }

    #[test]
    fn minimum_age_protects_young_containers() {
        let d = [dead("old", "p", "a", 0), dead("young", "p", "a", 95)];
        let policy = GcPolicy {
            min_age: Duration::from_nanos(10),
            max_per_pod_container: 0,
            ..Default::default()
        };
        assert_eq!(containers_to_remove(&d, policy, 100), ["old"]);
    }

    #[test]
    fn node_limit_cuts_groups_evenly_then_oldest_first() {
        // 3 groups × 2 dead, max 4 per node: 4/3 = 1 per group, leaving 3.
        let d: Vec<DeadContainer> = ["x", "y", "z"]
            .iter()
            .enumerate()
            .flat_map(|(i, n)| {
                [
                    dead(&format!("{n}-old"), "p", n, i as i64),
                    dead(&format!("{n}-new"), "p", n, 10 + i as i64),
                ]
            })
            .collect();
        let policy = GcPolicy {
            max_per_pod_container: -1,
            max_containers: 4,
            ..Default::default()
        };
        let mut out = containers_to_remove(&d, policy, 100);
        out.sort();
        assert_eq!(out, ["x-old", "y-old", "z-old"]);
        // max 1: one per group is still too many, the oldest of the rest go.
        let policy = GcPolicy {
            max_containers: 1,
            ..policy
        };
        let out = containers_to_remove(&d, policy, 100);
        assert_eq!(out.len(), 5);
        assert!(
            !out.contains(&"z-new".to_string()),
            "the newest survives: {out:?}"
        );
    }

    #[test]
    fn only_empty_dead_sandboxes_that_are_not_the_pods_newest_go() {
        let s = |id: &str, pod: &str, ready, t, containers| SandboxRecord {
            id: id.into(),
            pod_uid: pod.into(),
            ready,
            created_at_ns: t,
            containers,
        };
        let all = [
            s("p-old-empty", "p", false, 1, 0),
            s("p-old-busy", "p", false, 2, 1),
            s("p-new", "p", false, 3, 0),
            s("q-running", "q", true, 1, 0),
        ];
        assert_eq!(sandboxes_to_remove(&all), ["p-old-empty"]);
    }

    #[test]
    fn under_pressure_terminated_pods_lose_every_dead_container() {
        let dead = [
            dead("run-old", "running", "app", 1),
            dead("run-new", "running", "app", 2),
            dead("gone-1", "terminated", "app", 1),
            dead("gone-2", "terminated", "app", 2),
            dead("young", "terminated", "side", 100),
        ];
        let ready: std::collections::BTreeSet<String> = ["running".to_owned()].into();
        let policy = GcPolicy {
            min_age: Duration::from_nanos(10),
            ..GcPolicy::default()
        };
        let mut got = containers_of_terminated_pods(&dead, &ready, policy, 105);
        got.sort();
        // The running pod keeps its newest dead instance; the terminated
        // pod keeps nothing old enough.
        assert_eq!(got, ["gone-1", "gone-2", "run-old"]);
    }
}
