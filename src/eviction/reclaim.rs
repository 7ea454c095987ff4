//! Reclaim planning for every signal: what node-level reclaim to try first,
//! how to rank pods under disk and pid pressure, and how few pods can cover
//! a deficit (`pkg/kubelet/eviction/helpers.go`: buildSignalToNodeReclaimFuncs,
//! rankDiskPressureFunc, rankPIDPressure).

use std::cmp::Ordering;

use crate::signals::table::{Filesystem, Signal, Source};

/// Node-level reclaim, tried before any pod is evicted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeAction {
    /// Remove dead containers and sandboxes (their writable layers and logs).
    ContainerGc,
    /// Remove unused images.
    ImageGc,
}

/// The node-level reclaim for `signal`, in order. As the kubelet: memory and
/// pid (and swap) have none; every disk signal deletes dead containers then unused
/// images, except nodefs signals with a dedicated imagefs, where images
/// free nothing. Unlike the kubelet (which does nothing there) criguard
/// still removes dead containers for them: their logs live on nodefs.
pub fn node_actions(signal: Signal, dedicated_imagefs: bool) -> &'static [NodeAction] {
    use NodeAction::*;
    match signal.source() {
        Source::Memcg(_) | Source::Pids | Source::Swap | Source::Psi(_) => &[],
        Source::Statfs(Filesystem::Nodefs) if dedicated_imagefs => &[ContainerGc],
        Source::Statfs(Filesystem::Nodefs | Filesystem::Imagefs) => &[ContainerGc, ImageGc],
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
    /// What the usage is measured against under a disk signal; `None` for
    /// pids, which the kubelet ranks by priority and usage alone.
    pub request: Option<UsageRequest>,
}

/// A pod's request as the kubelet's disk ranking uses it
/// (`exceedDiskRequests`, then `disk`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsageRequest {
    /// The usage exceeds the request of the signal's own resource
    /// (ephemeral-storage for bytes; for inodes the request is always 0).
    pub exceeds: bool,
    /// The pod's ephemeral-storage request, subtracted from the usage before
    /// pods of equal standing are compared (for inodes too, as the kubelet).
    pub amount: u64,
}

impl UsageRequest {
    /// The request of a pod using `usage` of a signal counted in bytes
    /// (`bytes`) or inodes, with an ephemeral-storage request of `amount`.
    pub fn new(usage: Option<u64>, bytes: bool, amount: u64) -> Self {
        let line = if bytes { amount } else { 0 };
        Self {
            exceeds: usage.is_some_and(|u| u > line),
            amount,
        }
    }
}

/// Orders pods for disk or pid pressure, first victim first, as the
/// kubelet does: a pod without stats first; then, for disk, pods whose
/// usage exceeds their request; then lower priority first; then the larger
/// usage above the request first. Critical pods are left out; ties keep
/// input order.
pub fn rank_usage(pods: &[PodUse]) -> Vec<&PodUse> {
    let mut ranked: Vec<&PodUse> = pods.iter().filter(|p| !p.critical).collect();
    ranked.sort_by(|a, b| compare_usage(a, b));
    ranked
}

fn compare_usage(a: &PodUse, b: &PodUse) -> Ordering {
    let exceeds = |p: &PodUse| p.request.is_some_and(|r| r.exceeds);
    let above = |p: &PodUse, u: u64| u as i128 - p.request.map_or(0, |r| r.amount) as i128;
    match (a.usage, b.usage) {
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (None, None) => a.priority.cmp(&b.priority),
        (Some(ua), Some(ub)) => exceeds(b)
            .cmp(&exceeds(a))
            .then(a.priority.cmp(&b.priority))
            .then(above(b, ub).cmp(&above(a, ua))),
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

/// Reclaim an eviction has started but the signal may not show yet: the
/// runtime removes a stopped pod's writable layers in the background, so
/// the next observation can miss them and a naive loop would take another
/// pod for space already on its way back.
#[derive(Clone, Debug, PartialEq)]
pub struct InFlight {
    /// The signal it was started for.
    pub signal: Signal,
    /// What the eviction is expected to give back (bytes or inodes).
    pub amount: u64,
    /// The signal's available amount when the eviction was decided.
    pub baseline: i64,
    /// Past this, it is assumed landed (or lost) and no longer counted.
    pub until: std::time::Instant,
}

/// Forgets reclaim that has landed (the signal rose by its amount since the
/// baseline) or expired, and returns what is still on its way for `signal`.
pub fn pending(
    in_flight: &mut Vec<InFlight>,
    signal: Signal,
    available: i64,
    now: std::time::Instant,
) -> u64 {
    in_flight.retain(|f| {
        now < f.until && !(f.signal == signal && available >= f.baseline + f.amount as i64)
    });
    in_flight
        .iter()
        .filter(|f| f.signal == signal)
        .map(|f| {
            f.amount
                .saturating_sub((available - f.baseline).max(0) as u64)
        })
        .sum()
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
            request: None,
        }
    }

    fn disk(id: &str, priority: i32, usage: u64, request: u64) -> PodUse {
        PodUse {
            request: Some(UsageRequest::new(Some(usage), true, request)),
            ..pod(id, priority, usage)
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
    fn disk_ranking_puts_pods_over_their_request_first_then_measures_above_it() {
        // The kubelet's rankDiskPressureFunc: exceedDiskRequests, priority,
        // then usage minus the ephemeral-storage request.
        let pods = [
            disk("within-request", 0, 900, 1000),
            disk("important-over", 100, 50, 0),
            disk("over-by-100", 0, 600, 500),
            disk("over-by-300", 0, 400, 100),
        ];
        assert_eq!(
            ids(&rank_usage(&pods)),
            [
                "over-by-300",
                "over-by-100",
                "important-over",
                "within-request"
            ]
        );
        // Inodes: every pod using any exceeds (no inode request), and the
        // byte request is still subtracted, as the kubelet does.
        let inodes = |id: &str, usage: u64, request: u64| PodUse {
            request: Some(UsageRequest::new(Some(usage), false, request)),
            ..pod(id, 0, usage)
        };
        let pods = [
            inodes("a", 500, 400),
            inodes("b", 300, 0),
            inodes("none", 0, 0),
        ];
        assert_eq!(ids(&rank_usage(&pods)), ["b", "a", "none"]);
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

    #[test]
    fn reclaim_in_flight_counts_until_it_lands_or_expires() {
        let t0 = std::time::Instant::now();
        let secs = std::time::Duration::from_secs;
        let mut f = vec![InFlight {
            signal: Signal::ImagefsAvailable,
            amount: 40,
            baseline: 100,
            until: t0 + secs(30),
        }];
        // Nothing visible yet: all 40 still on the way.
        assert_eq!(pending(&mut f, Signal::ImagefsAvailable, 100, t0), 40);
        // Another signal is not helped by it.
        assert_eq!(pending(&mut f, Signal::NodefsAvailable, 0, t0), 0);
        // Half landed.
        assert_eq!(
            pending(&mut f, Signal::ImagefsAvailable, 120, t0 + secs(1)),
            20
        );
        // All landed: forgotten.
        assert_eq!(
            pending(&mut f, Signal::ImagefsAvailable, 140, t0 + secs(2)),
            0
        );
        assert!(f.is_empty());
        // Expired: forgotten even if never seen.
        let mut f = vec![InFlight {
            signal: Signal::PidAvailable,
            amount: 5,
            baseline: 10,
            until: t0 + secs(30),
        }];
        assert_eq!(pending(&mut f, Signal::PidAvailable, 10, t0 + secs(31)), 0);
        assert!(f.is_empty());
    }
}
