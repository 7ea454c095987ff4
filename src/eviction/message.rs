//! The kubelet's eviction message (`pkg/kubelet/eviction/helpers.go`),
//! logged, recorded and written to the evicted pod's status.

use crate::config::Threshold;
use crate::quantity::format_bytes;

/// The kubelet's message: which resource, the threshold, what was
/// available, for a memory signal the pod's usage against its pod-level
/// request where `pod_level` gives them (pod name, usage, request: pod-level
/// resources set), and which container used how much against which
/// request; every sentence ends with ". ", trailing space included, as the
/// kubelet's (`pkg/kubelet/eviction/helpers.go`), so the API report
/// matches it.
pub fn eviction_message(
    t: &Threshold,
    available: i64,
    pod_level: Option<(&str, i64, i64)>,
    heaviest: Option<&(String, i64, i64)>,
) -> String {
    let res = t.signal.resource().name();
    // What pods use: bytes wherever pods are ranked by bytes (the stall
    // signals rank them by memory).
    let show = |v: i64| {
        if t.signal.ranks_bytes() {
            format_bytes(v.max(0) as u64)
        } else {
            v.to_string()
        }
    };
    let available = match t.signal.is_stall() {
        true => t.signal.show(available),
        false => show(available),
    };
    let mut m = format!(
        "The node was low on resource: {res}. Threshold quantity: {}{}, available: {available}. ",
        if t.signal.is_stall() {
            "stalled more than "
        } else {
            ""
        },
        t.amount_display(),
    );
    if res == "memory"
        && let Some((name, used, request)) = pod_level
    {
        m.push_str(&format!(
            "Pod {name} was using {}, request is {}, has larger consumption of {res}. ",
            show(used),
            show(request)
        ));
    }
    if let Some((name, used, request)) = heaviest {
        m.push_str(&format!(
            "Container {name} was using {}, request is {}, has larger consumption of {res}. ",
            show(*used),
            show(*request)
        ));
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Amount;
    use crate::signals::table::Signal;

    fn threshold(signal: Signal, amount: Amount) -> Threshold {
        Threshold::hard(signal, amount)
    }

    #[test]
    fn messages_name_the_kubelets_resource_and_units() {
        let t = threshold(Signal::NodefsAvailable, Amount::Quantity(64 << 20));
        let m = eviction_message(&t, 10 << 20, None, Some(&("writer".into(), 80 << 20, 0)));
        assert_eq!(
            m,
            "The node was low on resource: ephemeral-storage. Threshold quantity: 64Mi, available: 10Mi. \
             Container writer was using 80Mi, request is 0, has larger consumption of ephemeral-storage. "
        );
        let t = threshold(Signal::PidAvailable, Amount::Quantity(20));
        let m = eviction_message(&t, 12, None, Some(&("forker".into(), 40, 0)));
        assert_eq!(
            m,
            "The node was low on resource: pids. Threshold quantity: 20, available: 12. \
             Container forker was using 40, request is 0, has larger consumption of pids. "
        );
        let t = threshold(Signal::ImagefsInodesFree, Amount::Percentage(5.0));
        assert!(
            eviction_message(&t, 3, None, None)
                .starts_with("The node was low on resource: inodes.")
        );
    }

    #[test]
    fn a_pod_with_pod_level_resources_is_named_before_its_container_for_memory_only() {
        let t = threshold(Signal::MemoryAvailable, Amount::Quantity(100 << 20));
        let heaviest = ("app".to_owned(), 300 << 20, 100 << 20);
        let m = eviction_message(
            &t,
            90 << 20,
            Some(("web", 400 << 20, 256 << 20)),
            Some(&heaviest),
        );
        assert_eq!(
            m,
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 90Mi. \
             Pod web was using 400Mi, request is 256Mi, has larger consumption of memory. \
             Container app was using 300Mi, request is 100Mi, has larger consumption of memory. "
        );
        let t = threshold(Signal::NodefsAvailable, Amount::Quantity(100 << 20));
        let m = eviction_message(&t, 90 << 20, Some(("web", 400 << 20, 256 << 20)), None);
        assert!(!m.contains("Pod web"), "{m}");
    }
}
