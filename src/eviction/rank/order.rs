//! The kubelet's eviction ranking (`pkg/kubelet/eviction/helpers.go`), and
//! criguard's swap ranking in its spirit.

use std::cmp::Ordering;

use crate::model::qos::QosClass;

/// What memory ranking needs to know of a pod.
#[derive(Clone, Debug, PartialEq)]
pub struct PodMemory {
    /// Sandbox id.
    pub sandbox_id: String,
    /// Priority (lower is evicted first).
    pub priority: i32,
    /// Sum of the containers' memory requests, bytes.
    pub request: i64,
    /// Working set, bytes; `None` when it could not be read.
    pub usage: Option<i64>,
    /// Critical pods are never ranked.
    pub critical: bool,
}

/// Orders pods for memory pressure, first victim first, as the kubelet's
/// rankMemoryPressure does: a pod without stats before one with; pods whose
/// usage exceeds their request first; then lower priority first; then the
/// larger `usage − request` first. Critical pods are left out. Ties keep
/// input order.
pub fn rank_memory(pods: &[PodMemory]) -> Vec<&PodMemory> {
    let mut ranked: Vec<&PodMemory> = pods.iter().filter(|p| !p.critical).collect();
    ranked.sort_by(|a, b| compare_memory(a, b));
    ranked
}

fn compare_memory(a: &PodMemory, b: &PodMemory) -> Ordering {
    match (a.usage, b.usage) {
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (None, None) => a.priority.cmp(&b.priority),
        (Some(ua), Some(ub)) => (ub > b.request)
            .cmp(&(ua > a.request))
            .then(a.priority.cmp(&b.priority))
            .then((ub - b.request).cmp(&(ua - a.request))),
    }
}

/// What swap ranking needs to know of a pod.
#[derive(Clone, Debug, PartialEq)]
pub struct PodSwap {
    /// Sandbox id.
    pub sandbox_id: String,
    /// Priority (lower is evicted first).
    pub priority: i32,
    /// The swap its containers may use under `LimitedSwap`, bytes.
    pub entitlement: i64,
    /// Swap in use (`memory.swap.current`), bytes; `None` when unread.
    pub usage: Option<i64>,
    /// Critical pods are never ranked.
    pub critical: bool,
}

/// The swap the kubelet lets one container use under `LimitedSwap`
/// (`pkg/kubelet/kuberuntime/kuberuntime_container_linux.go`,
/// `GetContainerSwapBehavior` and `calcSwapForBurstablePods`): its memory
/// request's share of the node's memory, of the node's swap; none for a
/// critical pod, a pod that is not Burstable, a container that asks no
/// memory or whose request equals its limit, or a request above the node's
/// memory.
pub fn limited_swap(
    qos: QosClass,
    critical: bool,
    request: i64,
    limit: i64,
    node_memory: u64,
    node_swap: u64,
) -> i64 {
    let no_swap = critical
        || qos != QosClass::Burstable
        || (request == 0 && limit == 0)
        || request == limit
        || node_memory == 0
        || request < 0
        || request as u64 > node_memory;
    if no_swap {
        return 0;
    }
    (request as f64 / node_memory as f64 * node_swap as f64) as i64
}

/// Orders pods for swap pressure, first victim first, after the kubelet's
/// memory ranking: a pod without stats before one with; pods using more
/// swap than their `LimitedSwap` entitlement first; then lower priority
/// first; then more swap first. Critical pods are left out. Ties keep input
/// order.
pub fn rank_swap(pods: &[PodSwap]) -> Vec<&PodSwap> {
    let mut ranked: Vec<&PodSwap> = pods.iter().filter(|p| !p.critical).collect();
    ranked.sort_by(|a, b| match (a.usage, b.usage) {
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (None, None) => a.priority.cmp(&b.priority),
        (Some(ua), Some(ub)) => (ub > b.entitlement)
            .cmp(&(ua > a.entitlement))
            .then(a.priority.cmp(&b.priority))
            .then(ub.cmp(&ua)),
    });
    ranked
}

/// Whether a signal with `available` units left is near a threshold at
/// `line` units: less than twice the line left, i.e. no farther above the
/// threshold than the threshold is above nothing. `criguard rank` walks
/// every pod's disk usage for a disk signal only then: far from every
/// threshold no eviction can come of it soon, and the walk is the costliest
/// reading there is.
pub fn near(available: i64, line: u64) -> bool {
    (available as i128) < 2 * line as i128
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: i64 = 1 << 20;

    fn pod(id: &str, priority: i32, request: i64, usage: i64) -> PodMemory {
        PodMemory {
            sandbox_id: id.into(),
            priority,
            request,
            usage: Some(usage),
            critical: false,
        }
    }

    fn order(pods: &[PodMemory]) -> Vec<&str> {
        rank_memory(pods)
            .iter()
            .map(|p| p.sandbox_id.as_str())
            .collect()
    }

    #[test]
    fn burstable_over_request_ranks_before_guaranteed_under_request() {
        let pods = [
            pod("guaranteed", 0, 512 * MI, 500 * MI),
            pod("burstable-over", 0, 100 * MI, 150 * MI),
        ];
        assert_eq!(order(&pods), ["burstable-over", "guaranteed"]);
    }

    #[test]
    fn among_pods_over_request_lower_priority_goes_first_whatever_the_usage() {
        // Seed (priority proposal): priority outranks usage once both exceed requests.
        let pods = [
            pod("big-important", 1000, 0, 900 * MI),
            pod("small-unimportant", 0, 0, 10 * MI),
        ];
        assert_eq!(order(&pods), ["small-unimportant", "big-important"]);
    }

    #[test]
    fn equal_priority_orders_by_usage_above_request() {
        let pods = [
            pod("a", 0, 100 * MI, 150 * MI),
            pod("b", 0, 0, 40 * MI),
            pod("c", 0, 10 * MI, 200 * MI),
        ];
        assert_eq!(order(&pods), ["c", "a", "b"]);
    }

    #[test]
    fn near_a_threshold_is_less_than_twice_it_left() {
        assert!(near(150 * MI, 100 << 20));
        assert!(!near(200 * MI, 100 << 20));
        assert!(near(-1, 0), "over-committed is always near");
        assert!(!near(0, 0));
    }

    #[test]
    fn pods_without_stats_go_first_and_critical_pods_never() {
        let mut unknown = pod("unknown", 10, 0, 0);
        unknown.usage = None;
        let mut critical = pod("critical", -1, 0, 999 * MI);
        critical.critical = true;
        let pods = [pod("over", 0, 0, 50 * MI), unknown, critical];
        assert_eq!(order(&pods), ["unknown", "over"]);
    }

    fn swapping(id: &str, priority: i32, entitlement: i64, usage: Option<i64>) -> PodSwap {
        PodSwap {
            sandbox_id: id.into(),
            priority,
            entitlement,
            usage,
            critical: false,
        }
    }

    #[test]
    fn limited_swap_is_the_kubelets_share_of_the_nodes_swap() {
        use QosClass::*;
        let (mem, swap) = (8192 * MI as u64, 2048 * MI as u64);
        // 1 GiB of 8 GiB requested: an eighth of the swap.
        assert_eq!(
            limited_swap(Burstable, false, 1024 * MI, 0, mem, swap),
            256 * MI
        );
        assert_eq!(
            limited_swap(Burstable, false, 1024 * MI, 2048 * MI, mem, swap),
            256 * MI
        );
        // None: not Burstable, critical, request = limit, nothing asked,
        // more asked than the node has.
        assert_eq!(
            limited_swap(Guaranteed, false, 1024 * MI, 1024 * MI, mem, swap),
            0
        );
        assert_eq!(limited_swap(BestEffort, false, 0, 0, mem, swap), 0);
        assert_eq!(limited_swap(Burstable, true, 1024 * MI, 0, mem, swap), 0);
        assert_eq!(
            limited_swap(Burstable, false, 512 * MI, 512 * MI, mem, swap),
            0
        );
        assert_eq!(limited_swap(Burstable, false, 0, 0, mem, swap), 0);
        assert_eq!(limited_swap(Burstable, false, 0, 512 * MI, mem, swap), 0);
        assert_eq!(limited_swap(Burstable, false, 9000 * MI, 0, mem, swap), 0);
        assert_eq!(limited_swap(Burstable, false, 1024 * MI, 0, 0, swap), 0);
        assert_eq!(limited_swap(Burstable, false, 1024 * MI, 0, mem, 0), 0);
    }

    #[test]
    fn swap_ranks_over_entitlement_then_priority_then_swap_used() {
        let pods = [
            swapping("within-low-priority", -10, 100 * MI, Some(50 * MI)),
            swapping("over-small", 0, 10 * MI, Some(20 * MI)),
            swapping("within-big", 0, 900 * MI, Some(800 * MI)),
            swapping("over-big-high-priority", 100, 0, Some(300 * MI)),
            swapping("over-big", 0, 0, Some(300 * MI)),
            swapping("unread", 1000, 0, None),
        ];
        let order: Vec<&str> = rank_swap(&pods)
            .iter()
            .map(|p| p.sandbox_id.as_str())
            .collect();
        assert_eq!(
            order,
            [
                "unread",
                "over-big",
                "over-small",
                "over-big-high-priority",
                "within-low-priority",
                "within-big"
            ]
        );
        let mut critical = swapping("critical", -100, 0, Some(999 * MI));
        critical.critical = true;
        assert!(rank_swap(&[critical]).is_empty());
    }
}
