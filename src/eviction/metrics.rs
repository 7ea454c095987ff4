//! The eviction manager's and admission's metrics: each signal's available
//! amount and threshold, the node conditions, evictions, admission
//! refusals, the time from pressure to action and the rounds.

use std::fmt::Write as _;
use std::sync::atomic::AtomicI64;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::model::qos::QosClass;
use crate::signals::table::{Condition, Refusal, Signal};

/// Label values that are criguard's own types, written as their names.
macro_rules! label_value_by {
    ($($t:ty => $f:expr;)+) => {
        $(impl EncodeLabelValue for $t {
            fn encode(&self, e: &mut LabelValueEncoder) -> std::fmt::Result {
                let name: fn(&$t) -> &'static str = $f;
                e.write_str(name(self))
            }
        })+
    };
}

label_value_by! {
    Signal => |s| s.name();
    Refusal => |r| r.label();
    Condition => |c| match c {
        Condition::MemoryPressure => "MemoryPressure",
        Condition::DiskPressure => "DiskPressure",
        Condition::PIDPressure => "PIDPressure",
    };
    QosClass => |q| match q {
        QosClass::Guaranteed => "Guaranteed",
        QosClass::Burstable => "Burstable",
        QosClass::BestEffort => "BestEffort",
    };
}

/// Labels naming an eviction signal.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignalLabels {
    /// The signal, by the kubelet's name.
    pub signal: Signal,
}

/// Labels naming a node condition.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConditionLabels {
    /// `MemoryPressure`, `DiskPressure` or `PIDPressure`.
    pub condition: Condition,
}

/// Labels of an admission refusal.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    /// Why: `Evicted`, `DiskPressure` or `MemoryPressure`.
    pub condition: Refusal,
}

/// Labels of an eviction.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvictionLabels {
    /// The signal whose threshold was met.
    pub signal: Signal,
    /// The evicted pod's QoS class.
    pub qos: QosClass,
}

/// Labels of an eviction for a local-storage limit.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    /// The kubelet's label for the limit: `emptydirfs.limit`,
    /// `ephemeralpodfs.limit` or `ephemeralcontainerfs.limit`.
    pub limit: &'static str,
}

/// Labels saying what started an eviction round.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TriggerLabels {
    /// `tick` (housekeeping), `deadline` (a grace or transition period
    /// ran out), `reload` (a reloaded configuration taken up), or the
    /// memory event: `memcg_threshold`, `psi`, `memory_events` or `poll`.
    pub trigger: &'static str,
}

/// Metrics of the eviction manager and admission.
#[derive(Clone, Debug)]
pub struct EvictionMetrics {
    /// Available amount per signal, as last observed.
    pub available: Family<SignalLabels, Gauge<i64, AtomicI64>>,
    /// The hard threshold per signal, in the signal's units, as last resolved.
    pub threshold: Family<SignalLabels, Gauge<i64, AtomicI64>>,
    /// 1 while a node condition holds.
    pub condition: Family<ConditionLabels, Gauge<i64, AtomicI64>>,
    /// Pods evicted, by signal and QoS class.
    pub evictions: Family<EvictionLabels, Counter>,
    /// RunPodSandbox calls refused by admission, by the condition or reason
    /// (counted by the observer in `crate::intercept`).
    pub admission_refusals: Family<RefusalLabels, Counter>,
    /// From the first observation of a met threshold to the pod's StopPodSandbox returning.
    pub pressure_to_action: Histogram,
    /// From the first observation of a met threshold to the pod's processes
    /// killed through its cgroup (evictions with a grace period of 0).
    pub pressure_to_kill: Histogram,
    /// Eviction rounds, by what started them.
    pub rounds: Family<TriggerLabels, Counter>,
    /// Pods killed at a memory event's crossing by the ranking kept ready, before
    /// the round that records their eviction.
    pub crossing_kills: Counter,
    /// Pods evicted for a local-storage limit, by the limit.
    pub local_storage: Family<LimitLabels, Counter>,
}

impl Default for EvictionMetrics {
    fn default() -> Self {
        Self {
            available: Family::default(),
            threshold: Family::default(),
            condition: Family::default(),
            evictions: Family::default(),
            admission_refusals: Family::default(),
            pressure_to_action: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            pressure_to_kill: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            rounds: Family::default(),
            crossing_kills: Counter::default(),
            local_storage: Family::default(),
        }
    }
}

impl EvictionMetrics {
    /// Registers every metric of the group.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "criguard_signal_available",
            "Available amount of each eviction signal (bytes, inodes or pids), as last observed",
            self.available.clone(),
        );
        registry.register(
            "criguard_signal_threshold",
            "Hard eviction threshold of each signal, resolved against its capacity",
            self.threshold.clone(),
        );
        registry.register(
            "criguard_node_condition",
            "1 while the node condition holds",
            self.condition.clone(),
        );
        registry.register(
            "criguard_evictions",
            "Pods evicted, by signal and QoS class",
            self.evictions.clone(),
        );
        registry.register(
            "criguard_admission_refusals",
            "RunPodSandbox calls refused, by node condition (or evicted)",
            self.admission_refusals.clone(),
        );
        registry.register(
            "criguard_pressure_to_action_seconds",
            "Time from the first observation of a met threshold to the evicted pod's StopPodSandbox",
            self.pressure_to_action.clone(),
        );
        registry.register(
            "criguard_pressure_to_kill_seconds",
            "Time from the first observation of a met threshold to the evicted pod's processes killed through its cgroup (grace period 0), before the runtime stops it",
            self.pressure_to_kill.clone(),
        );
        registry.register(
            "criguard_eviction_rounds",
            "Eviction rounds (observe, decide, act), by what started them: the housekeeping tick, a deadline or a memory event",
            self.rounds.clone(),
        );
        registry.register(
            "criguard_crossing_kills",
            "Pods killed the moment a memory event read a hard memory threshold crossed, by the memory ranking kept ready near the line, before the round that records their eviction",
            self.crossing_kills.clone(),
        );
        registry.register(
            "criguard_local_storage_evictions",
            "Pods evicted for a local-storage limit (the kubelet's localStorageEviction), by limit: emptydirfs.limit, ephemeralpodfs.limit, ephemeralcontainerfs.limit",
            self.local_storage.clone(),
        );
    }
}
