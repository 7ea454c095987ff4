//! Prometheus metrics, owned: each component holds the handles it updates,
//! registered once in one registry that the metrics endpoint encodes.
//!
//! Served as OpenMetrics text on `--metrics-address` (loopback by default:
//! the node's own Prometheus agent scrapes it; exposing it wider is the
//! operator's choice) by [`http::serve`], which bounds what connections
//! may cost.

pub mod http;

pub use http::serve;

use std::sync::Arc;

use std::time::Instant;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::fmt::Write as _;
use std::sync::atomic::AtomicI64;

use crate::model::QosClass;
use crate::signal::{Condition, Refusal, Signal};

/// An enum whose variants are metric label values, each written as its text.
macro_rules! label_values {
    ($(#[$m:meta])* pub enum $name:ident {
        $($(#[$vm:meta])* $v:ident => $text:literal,)+
    }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
        pub enum $name {
            $($(#[$vm])* $v,)+
        }

        impl $name {
            /// The label value.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$v => $text,)+
                }
            }
        }

        impl EncodeLabelValue for $name {
            fn encode(&self, e: &mut LabelValueEncoder) -> std::fmt::Result {
                e.write_str(self.as_str())
            }
        }
    };
}

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

/// Labels of one CRI call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// `service/method`, e.g. `runtime.v1.RuntimeService/Version`; `other`
    /// for paths outside CRI (keeps the label set bounded).
    pub method: &'static str,
    /// gRPC status code name, e.g. `OK`, `NotFound`; `Cancelled` when the
    /// client reset the call before its answer ended.
    pub code: &'static str,
}

/// Metrics of the CRI proxy.
#[derive(Clone, Debug)]
pub struct CriMetrics {
    duration: Family<CallLabels, Histogram>,
}

impl CriMetrics {
    fn new(registry: &mut Registry) -> Self {
        let duration = Family::<CallLabels, Histogram>::new_with_constructor(|| {
            // 50 µs … ~3.3 s.
            Histogram::new(exponential_buckets(0.000_05, 2.0, 17))
        });
        registry.register(
            "criguard_cri_request_duration_seconds",
            "CRI calls through criguard: time from request to the end of the answer, by method and gRPC code",
            duration.clone(),
        );
        crate::cri::budget::register(registry);
        Self { duration }
    }

    /// Records one finished call of `method` (a label from `cri::methods`).
    pub fn observe(&self, method: &'static str, code: i32, started: Instant) {
        let labels = CallLabels {
            method,
            code: code_name(code),
        };
        self.duration
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
    }
}

/// Metrics of the dynamic `oom_score_adj` adjuster.
#[derive(Clone, Debug, Default)]
pub struct OomMetrics {
    /// Processes whose score criguard wrote.
    pub writes: Counter,
    /// Rounds that ranked the pods for memory (with or without writes).
    pub rounds: Counter,
}

/// Labels of a kernel OOM kill.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OomKillLabels {
    /// True when the killed container's pod was criguard's first-ranked pod.
    pub matched_rank: bool,
}

/// Labels of a containerd event topic.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TopicLabels {
    /// `/tasks/exit` or `/tasks/oom`.
    pub topic: &'static str,
}

/// Metrics of containerd's task events and the kernel OOM kills they reveal.
#[derive(Clone, Debug, Default)]
pub struct TaskEventMetrics {
    /// Subscriptions made to containerd's events service (the first, then
    /// one per re-subscription after containerd went away).
    pub subscriptions: Counter,
    /// Catch-up syncs completed after a subscription (what the events
    /// could not tell: before it was registered, or while containerd was down).
    pub catch_ups: Counter,
    /// Task events received, by topic.
    pub events: Family<TopicLabels, Counter>,
    /// Kernel OOM kills in pods, by whether the pod was criguard's first.
    pub oom_kills: Family<OomKillLabels, Counter>,
}

impl TaskEventMetrics {
    fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "criguard_containerd_event_subscriptions",
            "Subscriptions to containerd's events service (/tasks/exit, /tasks/oom): the first and each one after containerd went away",
            m.subscriptions.clone(),
        );
        registry.register(
            "criguard_containerd_event_catch_up_syncs",
            "Model syncs run right after subscribing to containerd's events, for what happened before the subscription",
            m.catch_ups.clone(),
        );
        registry.register(
            "criguard_containerd_events",
            "containerd task events received, by topic",
            m.events.clone(),
        );
        registry.register(
            "criguard_kernel_oom_kills",
            "Processes the kernel's OOM killer took from pods' containers, by whether the pod was the one criguard ranked first for memory at the time",
            m.oom_kills.clone(),
        );
        m
    }
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

/// Labels saying what started an eviction round.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TriggerLabels {
    /// `tick` (housekeeping), `deadline` (a grace or transition period
    /// ran out), `reload` (a reloaded configuration taken up), or the
    /// memory event: `memcg_threshold`, `psi` or `memory_events`.
    pub trigger: &'static str,
}

label_values! {
    /// What became of a reload (SIGHUP).
    pub enum ReloadOutcome {
        /// The new configuration was valid and now runs.
        Applied => "applied",
        /// The new configuration was refused; the running one stays.
        Refused => "refused",
    }
}

/// Labels of a reload.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    /// `applied` or `refused`.
    pub outcome: ReloadOutcome,
}

/// Metrics of the configuration: whether criguard runs one it accepted
/// (0: failing open, relaying only) and what became of each reload.
#[derive(Clone, Debug)]
pub struct ConfigMetrics {
    /// 1 while criguard runs a configuration it accepted, 0 while it fails
    /// open (relaying every call unchanged, guarding nothing).
    pub valid: Gauge<i64, AtomicI64>,
    /// Reloads (SIGHUP), by outcome.
    pub reloads: Family<ReloadLabels, Counter>,
}

impl ConfigMetrics {
    fn new(registry: &mut Registry) -> Self {
        let m = Self {
            valid: Gauge::default(),
            reloads: Family::default(),
        };
        registry.register(
            "criguard_config_valid",
            "1 while criguard runs a configuration it accepted; 0 while it fails open: every CRI call relayed unchanged, no eviction, GC, patch, refusal or API report",
            m.valid.clone(),
        );
        registry.register(
            "criguard_config_reloads",
            "Configuration reloads (SIGHUP), by outcome: applied, or refused (the running configuration stays)",
            m.reloads.clone(),
        );
        for outcome in [ReloadOutcome::Applied, ReloadOutcome::Refused] {
            let _ = m.reloads.get_or_create(&ReloadLabels { outcome });
        }
        m
    }
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
    /// RunPodSandbox calls refused by admission, by the condition or reason.
    pub admission_refusals: Family<RefusalLabels, Counter>,
    /// From the first observation of a met threshold to the pod's StopPodSandbox returning.
    pub pressure_to_action: Histogram,
    /// From the first observation of a met threshold to the pod's processes
    /// killed through its cgroup (evictions with a grace period of 0).
    pub pressure_to_kill: Histogram,
    /// Eviction rounds, by what started them.
    pub rounds: Family<TriggerLabels, Counter>,
}

impl EvictionMetrics {
    fn new(registry: &mut Registry) -> Self {
        let m = Self {
            available: Family::default(),
            threshold: Family::default(),
            condition: Family::default(),
            evictions: Family::default(),
            admission_refusals: Family::default(),
            pressure_to_action: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            pressure_to_kill: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            rounds: Family::default(),
        };
        registry.register(
            "criguard_signal_available",
            "Available amount of each eviction signal (bytes, inodes or pids), as last observed",
            m.available.clone(),
        );
        registry.register(
            "criguard_signal_threshold",
            "Hard eviction threshold of each signal, resolved against its capacity",
            m.threshold.clone(),
        );
        registry.register(
            "criguard_node_condition",
            "1 while the node condition holds",
            m.condition.clone(),
        );
        registry.register(
            "criguard_evictions",
            "Pods evicted, by signal and QoS class",
            m.evictions.clone(),
        );
        registry.register(
            "criguard_admission_refusals",
            "RunPodSandbox calls refused, by node condition (or evicted)",
            m.admission_refusals.clone(),
        );
        registry.register(
            "criguard_pressure_to_action_seconds",
            "Time from the first observation of a met threshold to the evicted pod's StopPodSandbox",
            m.pressure_to_action.clone(),
        );
        registry.register(
            "criguard_pressure_to_kill_seconds",
            "Time from the first observation of a met threshold to the evicted pod's processes killed through its cgroup (grace period 0), before the runtime stops it",
            m.pressure_to_kill.clone(),
        );
        registry.register(
            "criguard_eviction_rounds",
            "Eviction rounds (observe, decide, act), by what started them: the housekeeping tick, a deadline or a memory event",
            m.rounds.clone(),
        );
        m
    }
}

/// Labels of a node-level reclaim action.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    /// `image_gc` or `container_gc`.
    pub action: Action,
}

label_values! {
    /// A node-level reclaim action.
    pub enum Action {
        /// Unused images removed.
        ImageGc => "image_gc",
        /// Dead containers and sandboxes removed.
        ContainerGc => "container_gc",
    }
}

/// Metrics of image and container garbage collection.
#[derive(Clone, Debug, Default)]
pub struct ReclaimMetrics {
    /// Bytes freed, by action (measured on the filesystems, not estimated).
    pub bytes: Family<ActionLabels, Counter>,
    /// Objects removed (images, containers, sandboxes), by action.
    pub removed: Family<ActionLabels, Counter>,
}

impl ReclaimMetrics {
    fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "criguard_reclaimed_bytes",
            "Bytes freed on imagefs/nodefs by node-level reclaim, by action (image_gc, container_gc)",
            m.bytes.clone(),
        );
        registry.register(
            "criguard_reclaim_removals",
            "Images, containers and sandboxes removed by node-level reclaim, by action",
            m.removed.clone(),
        );
        m
    }

    /// Records one action's removals and the bytes they freed.
    pub fn record(&self, action: Action, removed: u64, bytes: u64) {
        let l = ActionLabels { action };
        self.removed.get_or_create(&l).inc_by(removed);
        self.bytes.get_or_create(&l).inc_by(bytes);
    }
}

/// Labels of one kind of Kubernetes API write and how it went.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KubeWriteLabels {
    /// `pod_status`, `event`, `pod_delete`, `node_conditions` or `node_taints`.
    pub write: KubeWrite,
    /// `ok` or `failed`.
    pub outcome: WriteOutcome,
}

label_values! {
    /// A kind of Kubernetes API write.
    pub enum KubeWrite {
        /// An evicted pod's status (Failed, Evicted).
        PodStatus => "pod_status",
        /// The eviction's event.
        Event => "event",
        /// The delete of an evicted pod whose status kept being undone
        /// (the last resort).
        PodDelete => "pod_delete",
        /// criguard's node conditions.
        NodeConditions => "node_conditions",
        /// criguard's node taints.
        NodeTaints => "node_taints",
    }
}

label_values! {
    /// How an API write went.
    pub enum WriteOutcome {
        /// Written.
        Ok => "ok",
        /// Refused or not answered.
        Failed => "failed",
    }
}

/// Labels of what became of an evicted pod's report.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KubeOutcomeLabels {
    /// `written`, `reverted`, `reasserted`, `settled`, `deleted` or `failed`.
    pub outcome: PodOutcome,
}

label_values! {
    /// What became of an evicted pod's report.
    pub enum PodOutcome {
        /// Status Failed/Evicted written.
        Written => "written",
        /// Its report ended with criguard's status in place (the pod was
        /// deleted by others, or the watch ran its course).
        Settled => "settled",
        /// criguard's status was seen undone (Running written back, or
        /// another reason or message written over it); once per undo.
        Reverted => "reverted",
        /// criguard's status written again after an undo; once per write.
        Reasserted => "reasserted",
        /// Deleted as the last resort: still undone past the bound.
        Deleted => "deleted",
        /// Status never written.
        Failed => "failed",
    }
}

/// Metrics of the Kubernetes API report.
#[derive(Clone, Debug, Default)]
pub struct KubeMetrics {
    /// API writes, by kind and outcome (each attempt counts).
    pub writes: Family<KubeWriteLabels, Counter>,
    /// Evicted pods: status written; each undo seen and each write again;
    /// then settled (criguard's status kept) or deleted as the last resort;
    /// or never written.
    pub pods: Family<KubeOutcomeLabels, Counter>,
}

impl KubeMetrics {
    fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "criguard_kube_writes",
            "Kubernetes API writes by kind (pod_status, event, pod_delete, node_conditions, node_taints) and outcome (ok, failed); every attempt counts",
            m.writes.clone(),
        );
        registry.register(
            "criguard_kube_evicted_pods",
            "Evicted pods reported to the API, by outcome: written (status Failed/Evicted); reverted (each time the status was seen undone) and reasserted (each time criguard wrote it again); then settled (the report ended with criguard's status in place) or deleted (the last resort, still undone past the bound); failed (status never written)",
            m.pods.clone(),
        );
        m
    }

    /// Counts one write attempt.
    pub fn write(&self, write: KubeWrite, ok: bool) {
        let outcome = if ok {
            WriteOutcome::Ok
        } else {
            WriteOutcome::Failed
        };
        self.writes
            .get_or_create(&KubeWriteLabels { write, outcome })
            .inc();
    }

    /// Counts one evicted pod's outcome.
    pub fn pod(&self, outcome: PodOutcome) {
        self.pods
            .get_or_create(&KubeOutcomeLabels { outcome })
            .inc();
    }
}

/// All of criguard's metrics.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// The proxy's.
    pub cri: CriMetrics,
    /// The OOM score adjuster's.
    pub oom: OomMetrics,
    /// The eviction manager's and admission's.
    pub eviction: EvictionMetrics,
    /// Image and container GC's.
    pub reclaim: ReclaimMetrics,
    /// The Kubernetes API report's.
    pub kube: KubeMetrics,
    /// containerd task events' and kernel OOM kills'.
    pub events: TaskEventMetrics,
    /// The configuration's: valid or not, reloads.
    pub config: ConfigMetrics,
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let cri = CriMetrics::new(&mut registry);
        let oom = OomMetrics::default();
        registry.register(
            "criguard_oom_score_adj_writes",
            "Processes whose oom_score_adj criguard set to follow its memory ranking",
            oom.writes.clone(),
        );
        registry.register(
            "criguard_oom_rank_rounds",
            "Rounds of the oom_score_adj adjuster, each ranking the pods for memory: the ranking kernel OOM kills are matched against",
            oom.rounds.clone(),
        );
        let eviction = EvictionMetrics::new(&mut registry);
        let reclaim = ReclaimMetrics::new(&mut registry);
        let kube = KubeMetrics::new(&mut registry);
        let events = TaskEventMetrics::new(&mut registry);
        let config = ConfigMetrics::new(&mut registry);
        registry.register(
            "criguard_state_write_failures",
            "Failed attempts at writing a state file, by file (the state directory full, read-only or gone); an eviction record that could not be written is kept in memory and retried every second until it is",
            crate::statefile::write_failures(),
        );
        registry.register(
            "criguard_observation_stuck",
            "1 while a statvfs of the path has not returned within its deadline (a hung filesystem): its disk signals are not observed",
            crate::signals::probe::stuck_gauge(),
        );
        Self {
            config,
            events,
            kube,
            registry: Arc::new(registry),
            cri,
            oom,
            eviction,
            reclaim,
        }
    }

    /// The exposition text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String");
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The canonical name of a gRPC status code.
pub fn code_name(code: i32) -> &'static str {
    use tonic::Code;
    match Code::from_i32(code) {
        Code::Ok => "OK",
        Code::Cancelled => "Cancelled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Typed label values are written as the names operators query by.
    #[test]
    fn typed_labels_are_written_by_their_names() {
        let m = Metrics::new();
        let e = &m.eviction;
        e.evictions
            .get_or_create(&EvictionLabels {
                signal: Signal::AllocatableMemoryAvailable,
                qos: QosClass::BestEffort,
            })
            .inc();
        e.condition
            .get_or_create(&ConditionLabels {
                condition: Condition::PIDPressure,
            })
            .set(1);
        e.admission_refusals
            .get_or_create(&RefusalLabels {
                condition: Refusal::Evicted,
            })
            .inc();
        m.reclaim.record(Action::ContainerGc, 2, 4096);
        m.kube.write(KubeWrite::NodeTaints, false);
        m.kube.pod(PodOutcome::Reverted);
        let text = m.encode();
        for want in [
            r#"criguard_evictions_total{signal="allocatableMemory.available",qos="BestEffort"} 1"#,
            r#"{condition="PIDPressure"} 1"#,
            r#"criguard_admission_refusals_total{condition="Evicted"} 1"#,
            r#"criguard_reclaimed_bytes_total{action="container_gc"} 4096"#,
            r#"criguard_kube_writes_total{write="node_taints",outcome="failed"} 1"#,
            r#"criguard_kube_evicted_pods_total{outcome="reverted"} 1"#,
        ] {
            assert!(text.contains(want), "{want} not in:\n{text}");
        }
    }
}
