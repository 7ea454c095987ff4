//! The configuration's state as the admin API serves it (`Status`,
//! `criguard status`): whether criguard runs a configuration it accepted
//! or fails open on one it could not, what runs, and what the reloads did.
//! `serve` publishes a [`ConfigStatus`] on a watch channel whenever this
//! changes; the server answers from the latest value.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::client::{ClientError, connect};
use super::pb;
use crate::config::{Amount, ConfigError, Threshold};
use crate::signals::table::Signal;

/// Where a running criguard serves and what it forwards to.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Serving {
    /// The runtime's CRI endpoint (`unix:///…`).
    pub runtime_endpoint: String,
    /// criguard's CRI socket, the kubelet's endpoint (empty: none, `--mode nri`).
    pub cri_socket: String,
    /// The metrics endpoint (empty: none).
    pub metrics_address: String,
    /// The API report's kubeconfig (`in-cluster` for the pod's service
    /// account; empty: no API report).
    pub kubeconfig: String,
    /// The link to the runtime as an NRI plugin (`None`: proxy mode).
    pub nri: Option<NriLink>,
}

/// criguard attached to the runtime as an NRI plugin (`--mode nri`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NriLink {
    /// The runtime's NRI socket.
    pub socket: String,
    /// Registered with the runtime now.
    pub attached: bool,
    /// The model reconciled with the runtime's CRI list since the last
    /// synchronisation (containers created during one can be missing
    /// from it).
    pub reconciled: bool,
}

/// The Kubernetes API report's writes since criguard started (each
/// attempt counts).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ApiWrites {
    /// Writes that succeeded.
    pub ok: u64,
    /// Failed writes by kind (`pod_status`, `event`, …).
    pub failed: BTreeMap<String, u64>,
}

/// The configuration's state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ConfigStatus {
    /// criguard's version.
    pub version: String,
    /// Why criguard fails open (`None`: it runs an accepted configuration).
    /// While it fails open, every CRI call is relayed unchanged and nothing
    /// is evicted, collected, patched, refused or reported.
    pub error: Option<ConfigError>,
    /// The settings in effect, one per line, as `check-config` prints them
    /// (empty while failing open).
    pub settings: String,
    /// The configuration file (empty: none).
    pub config_file: String,
    /// Reloads applied since start.
    pub reloads_applied: u64,
    /// Reloads refused since start.
    pub reloads_refused: u64,
    /// Why the last reload was refused, until one is applied.
    pub last_reload_error: Option<ConfigError>,
    /// Settings that differ from the running ones but need a restart.
    pub needs_restart: Vec<String>,
    /// The thresholds in effect, hard then soft (served typed; not in
    /// `--json`, whose settings text names them).
    #[serde(skip)]
    pub thresholds: Vec<Threshold>,
    /// Where it serves and what it forwards to.
    pub serving: Serving,
    /// The API report's writes (`None`: no API report), read when asked.
    pub api_report: Option<ApiWrites>,
}

impl ConfigStatus {
    /// Running an accepted configuration (at start, or `reloaded`): its
    /// settings text and thresholds, and the settings that changed but
    /// need a restart; leaves fail-open mode and forgets an earlier refusal.
    pub fn running(
        &mut self,
        settings: String,
        thresholds: Vec<Threshold>,
        needs_restart: Vec<String>,
        reloaded: bool,
    ) {
        self.reloads_applied += u64::from(reloaded);
        self.error = None;
        self.last_reload_error = None;
        self.settings = settings;
        self.thresholds = thresholds;
        self.needs_restart = needs_restart;
    }

    /// Failing open on `error` (at start: nothing else runs).
    pub fn failing_open(&mut self, error: ConfigError) {
        self.error = Some(error);
    }

    /// A reload refused for `error`: counted, and whatever ran before (a
    /// configuration, or failing open) goes on; failing open, `error` is
    /// now the reason (the file as it is now is what needs fixing).
    pub fn refused(&mut self, error: ConfigError) {
        self.reloads_refused += 1;
        if self.error.is_some() {
            self.error = Some(error.clone());
        }
        self.last_reload_error = Some(error);
    }

    /// Whether criguard runs a configuration it accepted.
    pub fn valid(&self) -> bool {
        self.error.is_none()
    }

    /// Whether criguard guards the node (`criguard status --ready`, the
    /// DaemonSet's readiness probe): a configuration accepted and, as an
    /// NRI plugin, registered and its model reconciled; else why not.
    pub fn ready(&self) -> Result<(), String> {
        if let Some(e) = &self.error {
            return Err(format!("failing open: {e}"));
        }
        match &self.serving.nri {
            Some(n) if !n.attached => Err(format!(
                "not attached to the runtime's NRI socket {}",
                n.socket
            )),
            Some(n) if !n.reconciled => Err(format!(
                "attached to {}, the model not yet reconciled with the runtime's CRI list",
                n.socket
            )),
            _ => Ok(()),
        }
    }

    /// What `criguard status` prints: [`Self::head`], then the settings.
    pub fn text(&self) -> String {
        self.head() + &self.settings
    }

    /// The version, the file, whether the configuration is valid (or why
    /// not), the reloads and what needs a restart; one per line.
    pub fn head(&self) -> String {
        let mut out = format!("criguard {}\n", self.version);
        let file = if self.config_file.is_empty() {
            "(none)"
        } else {
            &self.config_file
        };
        out.push_str(&format!("configuration file: {file}\n"));
        match &self.error {
            Some(e) => out.push_str(&format!(
                "configuration: INVALID: {e}\n\
                 failing open: every CRI call relayed unchanged; no eviction, garbage collection, \
                 oom_score_adj patch, admission refusal or API report until a valid configuration \
                 is loaded (systemctl reload criguard)\n"
            )),
            None => out.push_str("configuration: valid\n"),
        }
        if let Some(n) = &self.serving.nri {
            let state = match (n.attached, n.reconciled) {
                (true, true) => "attached, model reconciled",
                (true, false) => "attached, model not yet reconciled",
                (false, _) => "NOT attached (attaching again)",
            };
            out.push_str(&format!("NRI plugin on {}: {state}\n", n.socket));
        }
        out.push_str(&format!(
            "reloads: {} applied, {} refused\n",
            self.reloads_applied, self.reloads_refused
        ));
        if let Some(e) = &self.last_reload_error {
            out.push_str(&format!(
                "last reload refused (the running configuration stays): {e}\n"
            ));
        }
        for n in &self.needs_restart {
            out.push_str(&format!("needs a restart to take effect: {n}\n"));
        }
        out
    }
}

impl From<&ConfigError> for pb::ConfigError {
    fn from(e: &ConfigError) -> Self {
        Self {
            key: e.key.clone(),
            value: e.value.clone(),
            rule: e.rule.clone(),
        }
    }
}

impl From<pb::ConfigError> for ConfigError {
    fn from(e: pb::ConfigError) -> Self {
        Self {
            key: e.key,
            value: e.value,
            rule: e.rule,
        }
    }
}

impl From<&ConfigStatus> for pb::StatusResponse {
    fn from(s: &ConfigStatus) -> Self {
        Self {
            version: s.version.clone(),
            config_valid: s.valid(),
            config_error: s.error.as_ref().map(Into::into),
            settings: s.settings.clone(),
            config_file: s.config_file.clone(),
            reloads_applied: s.reloads_applied,
            reloads_refused: s.reloads_refused,
            last_reload_error: s.last_reload_error.as_ref().map(Into::into),
            needs_restart: s.needs_restart.clone(),
            pid: std::process::id(),
            serving: Some(pb::Serving {
                runtime_endpoint: s.serving.runtime_endpoint.clone(),
                cri_socket: s.serving.cri_socket.clone(),
                metrics_address: s.serving.metrics_address.clone(),
                kubeconfig: s.serving.kubeconfig.clone(),
                nri: s.serving.nri.as_ref().map(|n| pb::NriLink {
                    socket: n.socket.clone(),
                    attached: n.attached,
                    reconciled: n.reconciled,
                }),
            }),
            thresholds: s.thresholds.iter().map(Into::into).collect(),
            api_report: s.api_report.as_ref().map(|w| pb::ApiReport {
                writes_ok: w.ok,
                writes_failed: w.failed.clone().into_iter().collect(),
            }),
        }
    }
}

impl From<&Threshold> for pb::Threshold {
    fn from(t: &Threshold) -> Self {
        use pb::threshold::Amount as A;
        Self {
            signal: t.signal.name().to_owned(),
            amount: Some(match t.amount {
                Amount::Quantity(q) => A::Quantity(q),
                Amount::Percentage(p) => A::Percentage(p),
            }),
            grace_period_ms: t.grace_period.map(|g| g.as_millis() as u64),
        }
    }
}

/// A threshold as served; `None` for a signal or amount this criguard
/// does not know (a newer server's).
fn threshold(t: pb::Threshold) -> Option<Threshold> {
    use pb::threshold::Amount as A;
    let amount = match t.amount? {
        A::Quantity(q) => Amount::Quantity(q),
        A::Percentage(p) => Amount::Percentage(p),
    };
    Some(Threshold {
        grace_period: t.grace_period_ms.map(Duration::from_millis),
        ..Threshold::hard(Signal::parse(&t.signal)?, amount)
    })
}

impl From<pb::StatusResponse> for ConfigStatus {
    fn from(r: pb::StatusResponse) -> Self {
        Self {
            version: r.version,
            // A newer criguard that says "not valid" without an error is
            // still not valid.
            error: match (r.config_valid, r.config_error) {
                (true, _) => None,
                (false, e) => Some(e.map(Into::into).unwrap_or(ConfigError {
                    key: "(unknown)".into(),
                    value: String::new(),
                    rule: "criguard reports its configuration invalid".into(),
                })),
            },
            settings: r.settings,
            config_file: r.config_file,
            reloads_applied: r.reloads_applied,
            reloads_refused: r.reloads_refused,
            last_reload_error: r.last_reload_error.map(Into::into),
            needs_restart: r.needs_restart,
            thresholds: r.thresholds.into_iter().filter_map(threshold).collect(),
            serving: r
                .serving
                .map(|s| Serving {
                    runtime_endpoint: s.runtime_endpoint,
                    cri_socket: s.cri_socket,
                    metrics_address: s.metrics_address,
                    kubeconfig: s.kubeconfig,
                    nri: s.nri.map(|n| NriLink {
                        socket: n.socket,
                        attached: n.attached,
                        reconciled: n.reconciled,
                    }),
                })
                .unwrap_or_default(),
            api_report: r.api_report.map(|a| ApiWrites {
                ok: a.writes_ok,
                failed: a.writes_failed.into_iter().collect(),
            }),
        }
    }
}

/// `Status`: the configuration's state in a running criguard.
pub async fn get_status(socket: &Path) -> Result<ConfigStatus, ClientError> {
    let r = connect(socket).await?.status(pb::StatusRequest {}).await?;
    Ok(r.into_inner().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(key: &str, value: &str) -> ConfigError {
        ConfigError {
            key: key.into(),
            value: value.into(),
            rule: "bad".into(),
        }
    }

    #[test]
    fn thresholds_serving_and_api_writes_survive_the_wire_typed() {
        let soft = Threshold {
            grace_period: Some(Duration::from_secs(90)),
            ..Threshold::hard(Signal::NodefsAvailable, Amount::Percentage(15.0))
        };
        let hard = Threshold::hard(Signal::MemoryAvailable, Amount::Quantity(100 << 20));
        let s = ConfigStatus {
            thresholds: vec![hard, soft],
            serving: Serving {
                runtime_endpoint: "unix:///run/k3s/containerd/containerd.sock".into(),
                cri_socket: "/tmp/demo/criguard.sock".into(),
                metrics_address: "127.0.0.1:19809".into(),
                kubeconfig: "in-cluster".into(),
                nri: Some(NriLink {
                    socket: "/var/run/nri/nri.sock".into(),
                    attached: true,
                    reconciled: false,
                }),
            },
            api_report: Some(ApiWrites {
                ok: 7,
                failed: BTreeMap::from([("node_taints".to_owned(), 2)]),
            }),
            ..Default::default()
        };
        let back = ConfigStatus::from(pb::StatusResponse::from(&s));
        assert_eq!(back, s);
        // A newer server's signal is left out, not misread.
        let mut wire = pb::StatusResponse::from(&s);
        wire.thresholds[0].signal = "future.available".into();
        assert_eq!(ConfigStatus::from(wire).thresholds, s.thresholds[1..]);
    }

    #[test]
    fn a_refused_reload_keeps_what_ran_and_an_applied_one_leaves_fail_open() {
        let mut s = ConfigStatus::default();
        s.failing_open(error("evictionHard", "memory.available=lots"));
        s.refused(error("evictionSoft", "x"));
        assert!(!s.valid(), "a refused reload does not end fail-open mode");
        assert_eq!(
            s.error.as_ref().unwrap().key,
            "evictionSoft",
            "the file's error now"
        );
        assert_eq!((s.reloads_applied, s.reloads_refused), (0, 1));
        s.running(
            "evictionHard: memory.available<1Mi\n".into(),
            vec![],
            vec![],
            true,
        );
        assert!(s.valid());
        assert_eq!(s.last_reload_error, None);
        assert_eq!((s.reloads_applied, s.reloads_refused), (1, 1));
        s.refused(error("housekeepingInterval", "0s"));
        assert!(s.valid(), "the running configuration stays");
        assert!(s.settings.contains("1Mi"));
        assert!(s.text().contains("last reload refused"), "{}", s.text());
        let mut start = ConfigStatus::default();
        start.running(String::new(), vec![], vec![], false);
        assert_eq!(start.reloads_applied, 0, "the start is not a reload");
    }

    #[test]
    fn an_invalid_configuration_survives_the_wire_and_is_named_in_the_text() {
        let s = ConfigStatus {
            version: "1.0".into(),
            error: Some(ConfigError {
                key: "evictionHard".into(),
                value: "memory.available=lots".into(),
                rule: "not a quantity".into(),
            }),
            config_file: "/etc/criguard/config.toml".into(),
            reloads_refused: 2,
            ..Default::default()
        };
        let back = ConfigStatus::from(pb::StatusResponse::from(&s));
        assert_eq!(back, s);
        let text = back.text();
        assert!(
            text.contains("INVALID: evictionHard: \"memory.available=lots\""),
            "{text}"
        );
        assert!(text.contains("0 applied, 2 refused"), "{text}");
        let valid = ConfigStatus::from(pb::StatusResponse::from(&ConfigStatus::default()));
        assert!(valid.valid());
    }

    #[test]
    fn ready_needs_a_valid_configuration_and_as_a_plugin_attached_and_reconciled() {
        let mut s = ConfigStatus::default();
        assert_eq!(s.ready(), Ok(()), "a proxy with a valid configuration");
        s.serving.nri = Some(NriLink {
            socket: "/var/run/nri/nri.sock".into(),
            ..Default::default()
        });
        let why = s.ready().unwrap_err();
        assert!(
            why.contains("not attached") && why.contains("/var/run/nri/nri.sock"),
            "{why}"
        );
        s.serving.nri.as_mut().unwrap().attached = true;
        assert!(s.ready().unwrap_err().contains("not yet reconciled"));
        s.serving.nri.as_mut().unwrap().reconciled = true;
        assert_eq!(s.ready(), Ok(()));
        s.failing_open(error("eviction_hard", "memory.available<lots"));
        let why = s.ready().unwrap_err();
        assert!(
            why.starts_with("failing open") && why.contains("eviction_hard"),
            "{why}"
        );
    }
}
