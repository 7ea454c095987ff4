//! The kubelet's quality-of-service classes and the `oom_score_adj` values
//! and priority bound that go with them (`pkg/apis/core/v1/helper/qos`,
//! `pkg/kubelet/qos/policy.go`, `pkg/apis/scheduling`).

use serde::{Deserialize, Serialize};

/// A pod's quality-of-service class, as the kubelet computes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum QosClass {
    /// Every container has equal requests and limits for CPU and memory.
    Guaranteed,
    /// Some request or limit is set, not Guaranteed.
    Burstable,
    /// No requests or limits at all.
    BestEffort,
}

/// Kubelet `oom_score_adj` of Guaranteed and node-critical containers
/// (`pkg/kubelet/qos/policy.go`, guaranteedOOMScoreAdj).
pub const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
/// Kubelet `oom_score_adj` of BestEffort containers (besteffortOOMScoreAdj).
pub const BESTEFFORT_OOM_SCORE_ADJ: i64 = 1000;
/// Priority at and above which a pod is critical
/// (`pkg/apis/scheduling`, SystemCriticalPriority = 2·10⁹).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
