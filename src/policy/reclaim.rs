//! Reclaim planning for every signal: what node-level reclaim to try first,
//! how to rank pods under disk and pid pressure, and how few pods can cover
//! a deficit (`pkg/kubelet/eviction/helpers.go`: buildSignalToNodeReclaimFuncs,
//! rankDiskPressureFunc, rankPIDPressure).

use std::cmp::Ordering;

use crate::config::Signal;

/// Node-level reclaim, tried before any pod is evicted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeAction {
    /// Remove dead containers and sandboxes (their writable layers and logs).
    ContainerGc,
    /// Remove unused images.
    ImageGc,
}

/// The node-level reclaim for `signal`, in order. As the kubelet: memory and
/// pid have none; every disk signal deletes dead containers then unused
/// images, except nodefs signals with a dedicated imagefs, where images
/// free nothing. Unlike the kubelet (which does nothing there) criguard
/// still removes dead containers for them: their logs live on nodefs.
pub fn node_actions(signal: Signal, dedicated_imagefs: bool) -> &'static [NodeAction] {
    use NodeAction::*;
    match signal {
        Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable | Signal::PidAvailable => &[],
        Signal::NodefsAvailable | Signal::NodefsInodesFree if dedicated_imagefs => &[ContainerGc],
        Signal::NodefsAvailable
        | Signal::NodefsInodesFree
        | Signal::ImagefsAvailable
        | Signal::ImagefsInodesFree => &[ContainerGc, ImageGc],
    }
}

/// What ranking under a disk or pid signal needs to know of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodUse {
    /// Sandbox id.
    pub sandbox_id: String,
    /// Priority (lower is evicted first).
    pub priority: i32,
    /// Critical pods are never ranked.
    pub critical: bool,
    /// What the signal counts (bytes, inodes or processes); `None` when it
    /// could not be read.
    pub usage: Option<u64>,
    /// How much of it evicting the pod gives back (for disk: writable
    /// layers and logs; emptyDirs stay until the kubelet deletes the pod).
    pub reclaimable: u64,
}

/// Orders pods for disk or pid pressure, first victim first, as the
/// kubelet does: a pod without stats first; then lower priority first; then
/// the larger usage first. (The kubelet's disk ranking puts pods over their
/// ephemeral-storage request first; CRI carries no such request, so every
/// pod counts as over it.) Critical pods are left out; ties keep input order.
pub fn rank_usage(pods: &[PodUse]) -> Vec<&PodUse> {
    let mut ranked: Vec<&PodUse> = pods.iter().filter(|p| !p.critical).collect();
    ranked.sort_by(|a, b| compare_usage(a, b));
    ranked
}

fn compare_usage(a: &PodUse, b: &PodUse) -> Ordering {
    match (a.usage, b.usage) {
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (None, None) => a.priority.cmp(&b.priority),
        (Some(ua), Some(ub)) => a.priority.cmp(&b.priority).then(ub.cmp(&ua)),
    }
}

/// The smallest prefix of `ranked` whose reclaimable amounts add up to
/// `need`; the whole ranking when even that is not enough. Pods are still
/// stopped one at a time with a fresh observation after each: this says how
/// many the episode is expected to take.
pub fn plan_victims<'a>(ranked: &[&'a PodUse], need: u64) -> Vec<&'a PodUse> {
    let mut sum = 0u64;
    let mut out = Vec::new();
    for p in ranked {
        if sum >= need && !out.is_empty() {
            break;
        }
        sum = sum.saturating_add(p.reclaimable);
        out.push(*p);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(id: &str, priority: i32, usage: u64) -> PodUse {
        PodUse {
            sandbox_id: id.into(),
            priority,
            critical: false,
            usage: Some(usage),
            reclaimable: usage,
        }
    }

    fn ids<'a>(v: &[&'a PodUse]) -> Vec<&'a str> {
        v.iter().map(|p| p.sandbox_id.as_str()).collect()
    }

    #[test]
    fn node_reclaim_follows_the_kubelet_with_and_without_imagefs() {
        use NodeAction::*;
        for s in [
            Signal::NodefsAvailable,
            Signal::NodefsInodesFree,
            Signal::ImagefsAvailable,
            Signal::ImagefsInodesFree,
        ] {
            assert_eq!(node_actions(s, false), [ContainerGc, ImageGc], "{s}");
        }
        assert_eq!(
            node_actions(Signal::ImagefsAvailable, true),
            [ContainerGc, ImageGc]
        );
        assert_eq!(node_actions(Signal::NodefsAvailable, true), [ContainerGc]);
        assert!(node_actions(Signal::MemoryAvailable, false).is_empty());
        assert!(node_actions(Signal::PidAvailable, true).is_empty());
    }

    #[test]
    fn disk_ranking_is_priority_then_usage_and_ignores_qos() {
        // Seed: under disk pressure the largest consumer goes, even a
        // Guaranteed pod; QoS plays no part, priority does.
        let pods = [
            pod("small", 0, 10),
            pod("guaranteed-big", 0, 900),
            pod("important-huge", 100, 5000),
            pod("mid", 0, 300),
        ];
        assert_eq!(
            ids(&rank_usage(&pods)),
            ["guaranteed-big", "mid", "small", "important-huge"]
        );
    }

    #[test]
    fn unknown_usage_goes_first_and_critical_pods_never() {
        let mut unknown = pod("unknown", 5, 0);
        unknown.usage = None;
        let mut critical = pod("critical", -10, 10_000);
        critical.critical = true;
        let pods = [pod("a", 0, 50), unknown, critical];
        assert_eq!(ids(&rank_usage(&pods)), ["unknown", "a"]);
    }

    #[test]
    fn the_plan_is_the_smallest_prefix_that_covers_the_need() {
        let pods = [pod("a", 0, 60), pod("b", 0, 30), pod("c", 0, 20)];
        let ranked = rank_usage(&pods);
        assert_eq!(ids(&plan_victims(&ranked, 50)), ["a"]);
        assert_eq!(ids(&plan_victims(&ranked, 60)), ["a"]);
        assert_eq!(ids(&plan_victims(&ranked, 61)), ["a", "b"]);
        assert_eq!(ids(&plan_victims(&ranked, 1000)), ["a", "b", "c"]);
        // Nothing needed still names the first victim: a met threshold
        // with no measurable deficit takes one pod, as the kubelet does.
        assert_eq!(ids(&plan_victims(&ranked, 0)), ["a"]);
        assert!(plan_victims(&[], 10).is_empty());
    }
}
