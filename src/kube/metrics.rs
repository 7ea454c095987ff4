//! What the Kubernetes API report counts: each write by kind and outcome,
//! and what became of each evicted pod's report.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

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

/// Labels of one event of the API pod source.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodWatchLabels {
    /// `list`, `changed`, `deleted`, `unreadable` or `error`.
    pub event: PodWatchEvent,
}

label_values! {
    /// An event of the API pod source.
    pub enum PodWatchEvent {
        /// The node's pods listed.
        List => "list",
        /// A pod added or changed.
        Changed => "changed",
        /// A pod deleted.
        Deleted => "deleted",
        /// A pod whose fields criguard cannot read (ranked by inference).
        Unreadable => "unreadable",
        /// A list or watch that failed (it is asked again).
        Error => "error",
    }
}

/// Labels of the pods counted by where their numbers come from.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodSourceLabels {
    /// `api` or `inferred`.
    pub source: PodSourceLabel,
}

label_values! {
    /// Where a pod's requests, priority and criticality come from.
    pub enum PodSourceLabel {
        /// The API's pod object.
        Api => "api",
        /// Inferred from CRI.
        Inferred => "inferred",
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
    /// The API pod source's events.
    pub pod_watch: Family<PodWatchLabels, Counter>,
    /// The model's pods by where their numbers come from.
    pub pod_sources: Family<PodSourceLabels, Gauge>,
}

impl KubeMetrics {
    /// The API writes so far: how many succeeded, and the failed ones by
    /// kind (kinds with none left out).
    pub fn write_counts(&self) -> (u64, std::collections::BTreeMap<&'static str, u64>) {
        let mut ok = 0;
        let mut failed = std::collections::BTreeMap::new();
        for &write in KubeWrite::ALL {
            for &outcome in WriteOutcome::ALL {
                let labels = KubeWriteLabels { write, outcome };
                let Some(n) = self.writes.get(&labels).map(|c| c.get()) else {
                    continue;
                };
                match outcome {
                    WriteOutcome::Ok => ok += n,
                    WriteOutcome::Failed if n > 0 => {
                        failed.insert(write.as_str(), n);
                    }
                    WriteOutcome::Failed => {}
                }
            }
        }
        (ok, failed)
    }

    /// Registers every metric of the group.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "criguard_kube_writes",
            "Kubernetes API writes by kind (pod_status, event, pod_delete, node_conditions, node_taints) and outcome (ok, failed); every attempt counts",
            self.writes.clone(),
        );
        registry.register(
            "criguard_kube_evicted_pods",
            "Evicted pods reported to the API, by outcome: written (status Failed/Evicted); reverted (each time the status was seen undone) and reasserted (each time criguard wrote it again); then settled (the report ended with criguard's status in place) or deleted (the last resort, still undone past the bound); failed (status never written)",
            self.pods.clone(),
        );
        registry.register(
            "criguard_kube_pod_watch_events",
            "Events of the API pod source (kubeconfig set): list (the node's pods listed), changed, deleted, unreadable (a pod whose fields could not be read: ranked by inference), error (a list or watch failed; asked again with back-off)",
            self.pod_watch.clone(),
        );
        registry.register(
            "criguard_pods",
            "Pods in criguard's node model by where their requests, priority and criticality come from: api (the API's pod object) or inferred (from what CRI carries)",
            self.pod_sources.clone(),
        );
    }

    /// Counts one event of the API pod source.
    pub fn watch_event(&self, event: PodWatchEvent) {
        self.pod_watch
            .get_or_create(&PodWatchLabels { event })
            .inc();
    }

    /// Sets the pod counts by source from `model`.
    pub fn count_sources(&self, model: &crate::model::NodeModel) {
        let (api, inferred) = model.sources();
        for (source, n) in [
            (PodSourceLabel::Api, api),
            (PodSourceLabel::Inferred, inferred),
        ] {
            self.pod_sources
                .get_or_create(&PodSourceLabels { source })
                .set(n as i64);
        }
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
