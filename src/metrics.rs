//! Prometheus metrics, owned: each component holds the handles it updates,
//! registered once in one registry that the metrics endpoint encodes.
//!
//! Each group is defined where it is counted, with its label types and its
//! `register` (names and help texts beside the code that counts):
//! [`CriMetrics`] in `cri::metrics`, [`OomMetrics`] in `oom::adjust`,
//! [`EvictionMetrics`] (admission's refusals included) in
//! `eviction::metrics`, [`GcMetrics`] in `gc::metrics`,
//! [`KubeMetrics`] in `kube::metrics`, [`TaskEventMetrics`] in
//! `runtime::track`, [`OomKillMetrics`] in `oom::kills`,
//! [`ConfigMetrics`] in `config::metrics`; the process-wide state-file and
//! statvfs ones in `statefile` and `signals::probe`. This module only builds
//! the registry from them (one table, in [`Metrics::new`]) and holds
//! the handles `serve` hands out.
//!
//! Served as OpenMetrics text on `--metrics-address` (loopback by default:
//! the node's own Prometheus agent scrapes it; exposing it wider is the
//! operator's choice) by [`http::serve`], which bounds what connections
//! may cost.

pub mod http;

pub use http::serve;

use std::sync::Arc;

use prometheus_client::registry::Registry;

use crate::config::metrics::ConfigMetrics;
use crate::cri::metrics::CriMetrics;
use crate::eviction::metrics::EvictionMetrics;
use crate::gc::metrics::GcMetrics;
use crate::kube::metrics::KubeMetrics;
use crate::oom::adjust::OomMetrics;
use crate::oom::kills::OomKillMetrics;
use crate::runtime::track::TaskEventMetrics;

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
    pub gc: GcMetrics,
    /// The Kubernetes API report's.
    pub kube: KubeMetrics,
    /// containerd task events'.
    pub events: TaskEventMetrics,
    /// Kernel OOM kills' (the recorder's).
    pub oom_kills: OomKillMetrics,
    /// The configuration's: valid or not, reloads.
    pub config: ConfigMetrics,
    /// The NRI plugin's (`--mode nri`).
    pub nri: crate::intercept::nri::NriMetrics,
}

impl Metrics {
    /// Every group, registered in one registry.
    pub fn new() -> Self {
        let mut m = Self {
            registry: Arc::default(),
            cri: CriMetrics::default(),
            oom: OomMetrics::default(),
            eviction: EvictionMetrics::default(),
            gc: GcMetrics::default(),
            kube: KubeMetrics::default(),
            events: TaskEventMetrics::default(),
            oom_kills: OomKillMetrics::default(),
            config: ConfigMetrics::default(),
            nri: Default::default(),
        };
        let mut registry = Registry::default();
        m.register(&mut registry);
        m.registry = Arc::new(registry);
        m
    }

    /// The table: each group registers its own metrics, in the order of
    /// the exposition text.
    fn register(&self, r: &mut Registry) {
        self.cri.register(r);
        self.oom.register(r);
        self.eviction.register(r);
        self.gc.register(r);
        self.kube.register(r);
        self.events.register(r);
        self.oom_kills.register(r);
        self.config.register(r);
        self.nri.register(r);
        crate::statefile::register(r);
        crate::signals::probe::register(r);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eviction::metrics::{ConditionLabels, EvictionLabels, RefusalLabels};
    use crate::gc::metrics::Action;
    use crate::kube::metrics::{KubeWrite, PodOutcome};
    use crate::model::qos::QosClass;
    use crate::signals::table::{Condition, Refusal, Signal};

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
        m.gc.record(Action::ContainerGc, 2, 4096);
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
