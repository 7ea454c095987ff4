//! What CRI tells about a pod, derived the kubelet's way. Pure functions.
//!
//! CRI carries no QoS class, no memory request and no priority; the kubelet
//! encodes each of them into something CRI does carry. Each function below
//! inverts one such encoding and names the kubelet source it inverts.

use super::qos::QosClass;
use crate::model::qos::{
    BESTEFFORT_OOM_SCORE_ADJ, GUARANTEED_OOM_SCORE_ADJ, SYSTEM_CRITICAL_PRIORITY,
};

/// `oom_score_adj` of the sandbox (pause) container (PodInfraOOMAdj; containerd
/// applies it to the sandbox itself, `pkg/cri/server/sandbox_run.go`).
pub const SANDBOX_OOM_SCORE_ADJ: i64 = -998;
/// Pod annotation criguard reads the pod's priority from (an integer, as in
/// `pod.spec.priority`). The kubelet passes pod annotations to
/// RunPodSandbox but not the priority, so a cluster that wants priorities
/// honoured sets this annotation (e.g. with a mutating webhook that copies
/// `spec.priority`); pods without it have priority 0, as the kubelet assumes
/// for pods without a priority.
pub const PRIORITY_ANNOTATION: &str = "criguard.io/priority";
/// Pod annotation the kubelet sets to the pod's source
/// (`pkg/kubelet/types/pod_update.go`, ConfigSourceAnnotationKey).
pub const CONFIG_SOURCE_ANNOTATION: &str = super::keys::ANNOTATION_CONFIG_SOURCE;

/// QoS class from `LinuxPodSandboxConfig.cgroup_parent`.
///
/// The kubelet names pod cgroups by class (`pkg/kubelet/cm/qos_container_manager_linux.go`
/// and `pod_container_manager_linux.go`): with the cgroupfs driver
/// `…/kubepods/burstable/pod<uid>`, `…/kubepods/besteffort/pod<uid>` and
/// `…/kubepods/pod<uid>` for Guaranteed; with the systemd driver the leaf
/// slice is `kubepods-burstable-pod<uid>.slice`, `kubepods-besteffort-pod<uid>.slice`
/// or `kubepods-pod<uid>.slice`, possibly under its parent slices. `None`
/// when the parent is not a kubelet pod cgroup.
pub fn qos_from_cgroup_parent(parent: &str) -> Option<QosClass> {
    let parts: Vec<&str> = parent.split('/').filter(|p| !p.is_empty()).collect();
    let leaf = *parts.last()?;
    if let Some(slice) = leaf.strip_suffix(".slice") {
        return if slice.starts_with("kubepods-besteffort-pod") {
            Some(QosClass::BestEffort)
        } else if slice.starts_with("kubepods-burstable-pod") {
            Some(QosClass::Burstable)
        } else if slice.starts_with("kubepods-pod") {
            Some(QosClass::Guaranteed)
        } else {
            None
        };
    }
    if !leaf.starts_with("pod") || parts.len() < 2 {
        return None;
    }
    match parts[parts.len() - 2] {
        "besteffort" => Some(QosClass::BestEffort),
        "burstable" => Some(QosClass::Burstable),
        p if p == "kubepods" || p.ends_with("kubepods") => Some(QosClass::Guaranteed),
        _ => None,
    }
}

/// QoS class from a container's kubelet `oom_score_adj`, the fallback when
/// the cgroup parent says nothing: −997 Guaranteed, 1000 BestEffort, else
/// Burstable. (A critical Burstable pod also carries −997 and is taken as
/// Guaranteed here; criticality is derived separately.)
pub fn qos_from_oom_score_adj(adj: i64) -> QosClass {
    match adj {
        GUARANTEED_OOM_SCORE_ADJ => QosClass::Guaranteed,
        BESTEFFORT_OOM_SCORE_ADJ => QosClass::BestEffort,
        _ => QosClass::Burstable,
    }
}

/// A container's memory request in bytes.
///
/// Guaranteed: equal to the limit. BestEffort: 0. Burstable: recovered from
/// the kubelet's formula `adj = 1000 − ⌊1000·request/capacity⌋`, clamped to
/// [3, 999] (`pkg/kubelet/qos/policy.go`). The formula keeps 1/1000 of the
/// node's memory as its step, so the result is the lower end of the range
/// that gives `adj`: at most `capacity/1000` below the true request (8 MiB on
/// an 8 GiB node). At the clamps the range is wider: `adj` 999 means "less
/// than 0.2 % of capacity" (we return 0), `adj` 3 means "at least 99.7 %"
/// (we return 99.7 %, capped at the limit).
pub fn memory_request(qos: QosClass, adj: i64, limit: i64, capacity: i64) -> i64 {
    match qos {
        QosClass::Guaranteed => limit,
        QosClass::BestEffort => 0,
        QosClass::Burstable => {
            if adj >= 999 {
                return 0;
            }
            let permille = 1000 - adj.max(3);
            // The smallest request that gives `adj`: rounding up keeps the
            // round trip exact (this request gives back the same score).
            let request = (permille as u128 * capacity.max(0) as u128).div_ceil(1000) as i64;
            if limit > 0 {
                request.min(limit)
            } else {
                request
            }
        }
    }
}

/// The kubelet's `oom_score_adj` for a container (`pkg/kubelet/qos/policy.go`,
/// GetContainerOOMScoreAdjust): critical and Guaranteed −997, BestEffort
/// 1000, Burstable `1000 − ⌊1000·request/capacity⌋` kept within [3, 999].
pub fn kubelet_oom_score_adj(qos: QosClass, critical: bool, request: i64, capacity: i64) -> i64 {
    if critical {
        return GUARANTEED_OOM_SCORE_ADJ;
    }
    match qos {
        QosClass::Guaranteed => GUARANTEED_OOM_SCORE_ADJ,
        QosClass::BestEffort => BESTEFFORT_OOM_SCORE_ADJ,
        QosClass::Burstable => {
            let adj = 1000 - (1000 * request as i128 / capacity.max(1) as i128) as i64;
            if adj < 1000 + GUARANTEED_OOM_SCORE_ADJ {
                1000 + GUARANTEED_OOM_SCORE_ADJ
            } else if adj == BESTEFFORT_OOM_SCORE_ADJ {
                adj - 1
            } else {
                adj
            }
        }
    }
}

/// The pod's priority from [`PRIORITY_ANNOTATION`]; 0 when absent or not an
/// integer (logged by the caller).
pub fn priority(annotation: Option<&str>) -> Result<i32, String> {
    match annotation {
        None => Ok(0),
        Some(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("{PRIORITY_ANNOTATION}={v:?} is not a 32-bit integer")),
    }
}

/// Whether the pod is a static pod: its config source is not the API server
/// (`pkg/kubelet/types/pod_update.go`, IsStaticPod: source ≠ "api").
pub fn is_static(config_source: Option<&str>) -> bool {
    config_source.is_some_and(|s| s != "api")
}

/// Whether the pod is critical (`pkg/kubelet/types/pod_update.go`,
/// IsCriticalPod): static, or priority ≥ [`SYSTEM_CRITICAL_PRIORITY`]; and,
/// since the kubelet gives critical pods −997 whatever their class, any
/// non-Guaranteed pod whose containers carry −997.
pub fn is_critical(static_pod: bool, priority: i32, qos: QosClass, container_adjs: &[i64]) -> bool {
    static_pod
        || priority >= SYSTEM_CRITICAL_PRIORITY
        || (qos != QosClass::Guaranteed && container_adjs.contains(&GUARANTEED_OOM_SCORE_ADJ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use QosClass::*;

    #[test]
    fn qos_from_cgroupfs_and_systemd_parents() {
        let cases = [
            ("/kubepods/burstable/pod1234", Some(Burstable)),
            ("/kubepods/besteffort/pod1234", Some(BestEffort)),
            ("/kubepods/pod1234", Some(Guaranteed)),
            ("/custom-root/kubepods/pod1234", Some(Guaranteed)),
            ("kubepods-burstable-pod12_34.slice", Some(Burstable)),
            (
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12_34.slice",
                Some(BestEffort),
            ),
            ("kubepods-pod12_34.slice", Some(Guaranteed)),
            ("", None),
            ("/k8s.io", None),
            ("/system.slice/containerd.service", None),
        ];
        for (parent, want) in cases {
            assert_eq!(qos_from_cgroup_parent(parent), want, "{parent}");
        }
    }

    #[test]
    fn burstable_request_round_trips_within_one_permille_of_capacity() {
        let cap = 8i64 << 30;
        for request in [1i64 << 20, 100 << 20, 1 << 30, 3 << 30, 7 << 30] {
            let adj = kubelet_oom_score_adj(Burstable, false, request, cap);
            let back = memory_request(Burstable, adj, 0, cap);
            // One step of capacity/1000, two where the kubelet clamps to 999.
            let step = if adj == 999 {
                2 * cap / 1000
            } else {
                cap / 1000
            };
            assert!(
                back <= request && request - back <= step,
                "{request} -> {adj} -> {back}"
            );
        }
    }

    #[test]
    fn derived_request_gives_back_the_same_score() {
        for cap in [1000i64, 8 << 30, 25_276_923_904, 24_105 << 20] {
            for adj in 3..999 {
                let request = memory_request(Burstable, adj, 0, cap);
                assert_eq!(
                    kubelet_oom_score_adj(Burstable, false, request, cap),
                    adj,
                    "cap {cap} adj {adj}"
                );
            }
        }
    }

    #[test]
    fn kubelet_clamps_burstable_between_3_and_999() {
        let cap = 1000;
        assert_eq!(kubelet_oom_score_adj(Burstable, false, 0, cap), 999);
        assert_eq!(kubelet_oom_score_adj(Burstable, false, 999, cap), 3);
        assert_eq!(kubelet_oom_score_adj(Burstable, false, 250, cap), 750);
        assert_eq!(kubelet_oom_score_adj(BestEffort, true, 0, cap), -997);
    }

    #[test]
    fn guaranteed_request_is_the_limit_and_besteffort_zero() {
        assert_eq!(
            memory_request(Guaranteed, -997, 64 << 20, 1 << 30),
            64 << 20
        );
        assert_eq!(memory_request(BestEffort, 1000, 0, 1 << 30), 0);
    }

    #[test]
    fn critical_pods_are_static_high_priority_or_minus_997_outside_guaranteed() {
        assert!(is_critical(true, 0, BestEffort, &[1000]));
        assert!(is_critical(
            false,
            SYSTEM_CRITICAL_PRIORITY,
            Burstable,
            &[500]
        ));
        assert!(is_critical(false, 0, Burstable, &[-997]));
        assert!(!is_critical(false, 0, Guaranteed, &[-997]));
        assert!(is_static(Some("file")) && !is_static(Some("api")) && !is_static(None));
    }

    #[test]
    fn priority_annotation_must_be_an_integer() {
        assert_eq!(priority(None), Ok(0));
        assert_eq!(priority(Some("1000")), Ok(1000));
        assert!(priority(Some("high")).unwrap_err().contains("high"));
    }
}
