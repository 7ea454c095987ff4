//! The TOML configuration file, with KubeletConfiguration's key names:
//!
//! ```toml
//! evictionHard = { "memory.available" = "100Mi", "nodefs.available" = "10%" }
//! evictionSoft = { "memory.available" = "300Mi" }
//! evictionSoftGracePeriod = { "memory.available" = "1m30s" }
//! evictionMaxPodGracePeriod = 60
//! evictionMinimumReclaim = { "memory.available" = "50Mi" }
//! evictionPressureTransitionPeriod = "5m"
//! housekeepingInterval = "10s"
//! imageGCHighThresholdPercent = 85
//! imageGCLowThresholdPercent = 80
//! imageMinimumGCAge = "2m"
//! imageMaximumGCAge = "0s"
//! dryRun = false          # true: decide and log evictions, stop nothing
//! kubeconfig = "/etc/criguard/kubeconfig"  # optional: report to the API
//! nodeName = "worker-1"   # default: the hostname
//! kubeStatusTimeout = "250ms"
//! nodeTaints = true
//! ```
//!
//! Unknown keys are refused, naming the key, so a typo never silently
//! falls back to a default.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::image_gc::RawImageGc;
use super::kube::RawKube;
use super::{ConfigError, RawEviction};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FileConfig {
    eviction_hard: Option<BTreeMap<String, String>>,
    #[serde(default)]
    eviction_soft: BTreeMap<String, String>,
    #[serde(default)]
    eviction_soft_grace_period: BTreeMap<String, String>,
    eviction_max_pod_grace_period: Option<i64>,
    #[serde(default)]
    eviction_minimum_reclaim: BTreeMap<String, String>,
    eviction_pressure_transition_period: Option<String>,
    housekeeping_interval: Option<String>,
    #[serde(rename = "imageGCHighThresholdPercent")]
    image_gc_high_threshold_percent: Option<i64>,
    #[serde(rename = "imageGCLowThresholdPercent")]
    image_gc_low_threshold_percent: Option<i64>,
    #[serde(rename = "imageMinimumGCAge")]
    image_minimum_gc_age: Option<String>,
    #[serde(rename = "imageMaximumGCAge")]
    image_maximum_gc_age: Option<String>,
    #[serde(alias = "dry_run")]
    dry_run: Option<bool>,
    kubeconfig: Option<String>,
    node_name: Option<String>,
    kube_status_timeout: Option<String>,
    node_taints: Option<bool>,
}

/// Everything a configuration file sets, before validation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RawFile {
    /// The eviction keys.
    pub eviction: RawEviction,
    /// The image GC keys.
    pub image_gc: RawImageGc,
    /// `dryRun` (also `dry_run`): decide and log evictions, stop nothing.
    pub dry_run: Option<bool>,
    /// The Kubernetes API report's keys.
    pub kube: RawKube,
}

/// Parses the file's text; `origin` names it in errors.
pub fn parse(origin: &str, text: &str) -> Result<RawFile, ConfigError> {
    let f: FileConfig = toml::from_str(text).map_err(|e| {
        let msg = e.message().to_owned();
        // The parser names the key in its message (unknown field `x`, …).
        let value = e
            .span()
            .and_then(|s| text.get(s))
            .unwrap_or("")
            .trim()
            .to_owned();
        ConfigError {
            key: origin.to_owned(),
            value,
            rule: msg,
        }
    })?;
    let eviction = RawEviction {
        hard: f.eviction_hard,
        soft: f.eviction_soft,
        soft_grace_period: f.eviction_soft_grace_period,
        max_pod_grace_period: f.eviction_max_pod_grace_period,
        minimum_reclaim: f.eviction_minimum_reclaim,
        pressure_transition_period: f.eviction_pressure_transition_period,
        housekeeping_interval: f.housekeeping_interval,
    };
    let image_gc = RawImageGc {
        high_percent: f.image_gc_high_threshold_percent,
        low_percent: f.image_gc_low_threshold_percent,
        min_age: f.image_minimum_gc_age,
        max_age: f.image_maximum_gc_age,
    };
    let kube = RawKube {
        kubeconfig: f.kubeconfig,
        node_name: f.node_name,
        status_timeout: f.kube_status_timeout,
        taints: f.node_taints,
    };
    Ok(RawFile {
        eviction,
        image_gc,
        dry_run: f.dry_run,
        kube,
    })
}

/// Reads and parses a configuration file.
pub fn load(path: &Path) -> Result<RawFile, ConfigError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        key: origin.clone(),
        value: String::new(),
        rule: e.to_string(),
    })?;
    parse(&origin, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_parses_and_validates() {
        let text = r#"
            evictionHard = { "memory.available" = "100Mi", "nodefs.available" = "10%" }
            evictionSoft = { "memory.available" = "300Mi" }
            evictionSoftGracePeriod = { "memory.available" = "1m30s" }
            evictionMaxPodGracePeriod = 60
            evictionMinimumReclaim = { "memory.available" = "50Mi" }
            evictionPressureTransitionPeriod = "5m"
            housekeepingInterval = "10s"
            imageGCHighThresholdPercent = 90
            imageGCLowThresholdPercent = 70
            imageMinimumGCAge = "5m"
            imageMaximumGCAge = "168h"
            dry_run = true
            kubeconfig = "/etc/criguard/kubeconfig"
            nodeName = "worker-1"
            kubeStatusTimeout = "300ms"
            nodeTaints = false
        "#;
        let f = parse("config.toml", text).unwrap();
        assert_eq!(f.dry_run, Some(true));
        let k = f.kube.clone().validate("host").unwrap().unwrap();
        assert_eq!(k.node_name, "worker-1");
        assert_eq!(k.status_timeout, std::time::Duration::from_millis(300));
        assert!(!k.taints);
        let g = f.image_gc.validate().unwrap();
        assert_eq!((g.high_percent, g.low_percent), (90, 70));
        assert_eq!(g.max_age, Some(std::time::Duration::from_secs(7 * 86400)));
        let c = f.eviction.validate().unwrap();
        assert_eq!(c.hard.len(), 2);
        assert_eq!(c.soft.len(), 1);
        assert_eq!(
            c.max_pod_grace_period,
            Some(std::time::Duration::from_secs(60))
        );
    }

    #[test]
    fn unknown_keys_and_wrong_types_are_named() {
        let e = parse("config.toml", "evictionHardd = {}\n").unwrap_err();
        assert!(e.rule.contains("evictionHardd"), "{e}");
        let e = parse(
            "config.toml",
            "evictionHard = { \"memory.available\" = 100 }\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("100"), "{e}");
    }
}
