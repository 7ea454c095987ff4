//! The Kubernetes API report's settings: file keys and flags, validated
//! into [`KubeSettings`] (which `crate::kube` runs the report with).
//!
//! ```toml
//! kubeconfig = "/etc/criguard/kubeconfig"   # or "in-cluster"; absent: no API report
//! nodeName = "worker-1"                     # default: the hostname, lowercased
//! kubeStatusTimeout = "250ms"               # an eviction waits at most this for the pod status write
//! nodeTaints = true                         # criguard.io/*-pressure NoSchedule taints under pressure
//! ```

use std::path::PathBuf;
use std::time::Duration;

use super::{ConfigError, duration};

/// Where the API's address and credentials come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiSource {
    /// A kubeconfig file (its current context).
    Kubeconfig(PathBuf),
    /// The pod's service account (`KUBERNETES_SERVICE_HOST`, the mounted token).
    InCluster,
}

/// The report's settings, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeSettings {
    /// Where the client's configuration comes from.
    pub source: ApiSource,
    /// This node's name in the API.
    pub node_name: String,
    /// How long an eviction waits for the pod status write.
    pub status_timeout: Duration,
    /// Whether criguard taints the node NoSchedule under pressure.
    pub taints: bool,
}

/// The report's keys as given, before validation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RawKube {
    /// `kubeconfig`: a path, or `in-cluster`.
    pub kubeconfig: Option<String>,
    /// `nodeName`.
    pub node_name: Option<String>,
    /// `kubeStatusTimeout`.
    pub status_timeout: Option<String>,
    /// `nodeTaints`.
    pub taints: Option<bool>,
}

/// The default bound on the pod status write.
pub const DEFAULT_STATUS_TIMEOUT: Duration = Duration::from_millis(250);

impl RawKube {
    /// Overrides this (file) configuration with `flags`, key by key.
    pub fn merge(self, flags: RawKube) -> RawKube {
        RawKube {
            kubeconfig: flags.kubeconfig.or(self.kubeconfig),
            node_name: flags.node_name.or(self.node_name),
            status_timeout: flags.status_timeout.or(self.status_timeout),
            taints: flags.taints.or(self.taints),
        }
    }

    /// The settings (`None`: no API configured), or the error naming the
    /// key and value; `hostname` is the node name's default.
    pub fn validate(self, hostname: &str) -> Result<Option<KubeSettings>, ConfigError> {
        let timeout = match &self.status_timeout {
            None => DEFAULT_STATUS_TIMEOUT,
            Some(v) => {
                let d = duration("kubeStatusTimeout", v)?;
                if d.is_zero() || d > Duration::from_secs(10) {
                    return Err(ConfigError::new(
                        "kubeStatusTimeout",
                        v.as_str(),
                        "must be more than 0 and at most 10s: evictions wait this long",
                    ));
                }
                d
            }
        };
        let Some(kubeconfig) = self.kubeconfig else {
            return Ok(None);
        };
        let source = match kubeconfig.as_str() {
            "" => {
                return Err(ConfigError::new(
                    "kubeconfig",
                    "",
                    "a path or \"in-cluster\"",
                ));
            }
            "in-cluster" => ApiSource::InCluster,
            path => ApiSource::Kubeconfig(PathBuf::from(path)),
        };
        let node_name = self
            .node_name
            .unwrap_or_else(|| hostname.trim().to_lowercase());
        if node_name.is_empty()
            || !node_name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        {
            return Err(ConfigError::new(
                "nodeName",
                node_name,
                "must be the node's name in the API (lowercase letters, digits, '-' and '.')",
            ));
        }
        Ok(Some(KubeSettings {
            source,
            node_name,
            status_timeout: timeout,
            taints: self.taints.unwrap_or(true),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(kubeconfig: Option<&str>) -> RawKube {
        RawKube {
            kubeconfig: kubeconfig.map(str::to_owned),
            ..Default::default()
        }
    }

    #[test]
    fn no_kubeconfig_means_no_report_and_defaults_fill_the_rest() {
        assert_eq!(raw(None).validate("Node-A").unwrap(), None);
        let s = raw(Some("/etc/criguard/kubeconfig"))
            .validate("Node-A\n")
            .unwrap()
            .unwrap();
        assert_eq!(
            s.source,
            ApiSource::Kubeconfig("/etc/criguard/kubeconfig".into())
        );
        assert_eq!(s.node_name, "node-a");
        assert_eq!(s.status_timeout, Duration::from_millis(250));
        assert!(s.taints);
        let s = raw(Some("in-cluster")).validate("n").unwrap().unwrap();
        assert_eq!(s.source, ApiSource::InCluster);
    }

    #[test]
    fn flags_override_the_file_and_bad_values_name_their_key() {
        let file = RawKube {
            kubeconfig: Some("/a".into()),
            status_timeout: Some("1s".into()),
            taints: Some(false),
            ..Default::default()
        };
        let flags = RawKube {
            status_timeout: Some("100ms".into()),
            node_name: Some("w1".into()),
            ..Default::default()
        };
        let s = file.merge(flags).validate("host").unwrap().unwrap();
        assert_eq!(
            (s.node_name.as_str(), s.status_timeout, s.taints),
            ("w1", Duration::from_millis(100), false)
        );
        let bad = |r: RawKube| r.validate("h").unwrap_err();
        let e = bad(RawKube {
            status_timeout: Some("0s".into()),
            ..raw(Some("/a"))
        });
        assert_eq!(
            (e.key.as_str(), e.value.as_str()),
            ("kubeStatusTimeout", "0s")
        );
        let e = bad(RawKube {
            status_timeout: Some("1 minute".into()),
            ..raw(None)
        });
        assert_eq!(e.key, "kubeStatusTimeout");
        let e = bad(RawKube {
            node_name: Some("Bad_Name".into()),
            ..raw(Some("/a"))
        });
        assert_eq!((e.key.as_str(), e.value.as_str()), ("nodeName", "Bad_Name"));
        assert_eq!(bad(raw(Some(""))).key, "kubeconfig");
    }
}
