//! The configuration's metrics: whether criguard runs one it accepted and
//! what became of each reload (set by `serve`, which loads and reloads it).

use std::sync::atomic::AtomicI64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

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

impl Default for ConfigMetrics {
    /// Both reload outcomes present from the start, at 0.
    fn default() -> Self {
        let m = Self {
            valid: Gauge::default(),
            reloads: Family::default(),
        };
        for outcome in [ReloadOutcome::Applied, ReloadOutcome::Refused] {
            let _ = m.reloads.get_or_create(&ReloadLabels { outcome });
        }
        m
    }
}

impl ConfigMetrics {
    /// Registers every metric of the group.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "criguard_config_valid",
            "1 while criguard runs a configuration it accepted; 0 while it fails open: every CRI call relayed unchanged, no eviction, GC, patch, refusal or API report",
            self.valid.clone(),
        );
        registry.register(
            "criguard_config_reloads",
            "Configuration reloads (SIGHUP), by outcome: applied, or refused (the running configuration stays)",
            self.reloads.clone(),
        );
    }
}
