//! The configuration part of `serve`: loading it, what the admin API and
//! the log say of it, reloading it on SIGHUP, the complaint repeated while
//! criguard fails open, and the node-condition notice of a configured API.

use std::time::Duration;

use criguard::admin::ConfigStatus;
use criguard::config::ConfigError;
use criguard::config::kube::ApiSource;
use criguard::config::metrics::{ReloadLabels, ReloadOutcome};
use criguard::runtime::Upstream;
use tokio::sync::watch;

use super::loops::{Stopping, periodic_on};
use super::{guard, servers};
use crate::cli::args::ServeCmd;
use crate::cli::settings::Guardian;

/// How often a failing-open criguard repeats its complaint in the log; the
/// environment variable `CRIGUARD_CONFIG_COMPLAINT_PERIOD` (e.g. `200ms`)
/// changes it, for tests.
pub const COMPLAINT_PERIOD: Duration = Duration::from_secs(60);

/// The guardian's settings from the file and the flags, or the first
/// error, naming its key and value; `flag_error` (a flag refused, which
/// stays until a restart) comes first.
pub fn load(cmd: &ServeCmd, flag_error: Option<&ConfigError>) -> Result<Guardian, ConfigError> {
    match flag_error {
        Some(e) => Err(e.clone()),
        None => Guardian::load(cmd),
    }
}

/// Logs that criguard fails open on `err` (`when`: at start, or again).
pub fn complain(err: &ConfigError, when: &str) {
    tracing::error!(
        key = %err.key,
        value = %err.value,
        rule = %err.rule,
        when,
        "invalid configuration: {err}; failing open: every CRI call is relayed unchanged, \
         with no eviction, garbage collection, oom_score_adj patch, admission refusal or API \
         report, until a valid configuration is loaded (fix it, then systemctl reload criguard)"
    );
}

/// The complaint's period: `CRIGUARD_CONFIG_COMPLAINT_PERIOD` or [`COMPLAINT_PERIOD`].
pub fn complaint_period() -> Duration {
    std::env::var("CRIGUARD_CONFIG_COMPLAINT_PERIOD")
        .ok()
        .and_then(|v| criguard::quantity::parse_duration(&v).ok())
        .filter(|d| !d.is_zero())
        .unwrap_or(COMPLAINT_PERIOD)
}

/// Where this criguard serves and what it forwards to, for `Status`: the
/// CRI socket's own path (systemd's or a predecessor's socket included).
pub fn serving(
    upstream: &Upstream,
    listeners: &servers::Listeners,
    metrics: Option<&tokio::net::TcpListener>,
    cmd: &ServeCmd,
) -> criguard::admin::Serving {
    let cri = listeners.cri.as_ref().map(|l| {
        let addr = l.local_addr().ok();
        let path = addr
            .as_ref()
            .and_then(|a| a.as_pathname())
            .map(std::path::Path::to_owned);
        path.unwrap_or_else(|| cmd.listen.clone())
    });
    criguard::admin::Serving {
        runtime_endpoint: upstream.endpoint().to_string(),
        cri_socket: cri.map(|p| p.display().to_string()).unwrap_or_default(),
        metrics_address: (metrics.and_then(|m| m.local_addr().ok()))
            .map(|a| a.to_string())
            .unwrap_or_default(),
        kubeconfig: String::new(),
        nri: (cmd.mode == crate::cli::args::Mode::Nri).then(|| criguard::admin::NriLink {
            socket: cmd.nri_socket.display().to_string(),
            ..Default::default()
        }),
    }
}

/// The configuration's state before anything is loaded: the version and
/// the file.
pub fn initial_config(cmd: &ServeCmd) -> ConfigStatus {
    ConfigStatus {
        version: env!("CARGO_PKG_VERSION").into(),
        config_file: cmd
            .eviction
            .config
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        ..Default::default()
    }
}

/// Publishes how the guardian started (`started`: its settings, or why it
/// fails open) for the admin API and the node condition
/// `CriguardConfigInvalid` (through the API report's own settings when
/// those are valid).
pub fn announce(
    cmd: &ServeCmd,
    started: Result<&Guardian, &ConfigError>,
    config: &watch::Sender<ConfigStatus>,
    notice: &watch::Sender<Notice>,
) {
    match started {
        Ok(g) => {
            publish(config, Ok(g), &[], false);
            notice.send_replace(g.settings.kube.clone().map(|k| (k, None)));
        }
        Err(e) => {
            // The API report failing to start is logged here; the others
            // were at once.
            if e.key == "kubeconfig" {
                complain(e, "at start");
            }
            publish(config, Err(e), &[], false);
            notice.send_replace(notice_api(cmd).map(|k| (k, Some(e.clone()))));
        }
    }
}

/// Says, once at start, which of criguard's own signals this node cannot
/// observe: `swap.available` without swap, the stall signals on a kernel
/// without PSI. Absent, they never cross; `criguard status` shows them
/// unobserved. A warning when a threshold names one.
pub fn absent_signals(
    eviction: &criguard::config::EvictionConfig,
    sources: &criguard::signals::node::NodeSources,
) {
    use criguard::signals::table::{Signal, Source};
    let configured = |s: Signal| {
        eviction
            .hard
            .iter()
            .chain(&eviction.soft)
            .any(|t| t.signal == s)
    };
    for s in Signal::ALL {
        let why = match s.source() {
            Source::Swap => match sources.swap() {
                Ok(Some(_)) => continue,
                Ok(None) => "this node has no swap".to_owned(),
                Err(err) => format!("swap cannot be read: {err}"),
            },
            Source::Psi(line) => match sources.stall(line) {
                Ok(_) => continue,
                Err(err) => format!("no PSI on this kernel (CONFIG_PSI, psi=1): {err}"),
            },
            Source::Memcg(_) | Source::Statfs(_) | Source::Pids => continue,
        };
        if configured(s) {
            tracing::warn!(signal = %s, "{why}: the signal is absent and its thresholds never cross");
        } else {
            tracing::info!(signal = %s, "{why}: the signal is absent");
        }
    }
}

/// SIGHUP: loads the configuration again and puts it in effect, or refuses
/// it (the running one stays); counted, logged and published either way.
pub async fn reload(
    cmd: &ServeCmd,
    guard: &mut guard::Guard,
    (config, notice): (&watch::Sender<ConfigStatus>, &watch::Sender<Notice>),
    metrics: &criguard::metrics::Metrics,
    flag_error: Option<&ConfigError>,
) {
    tracing::info!("SIGHUP: reloading the configuration");
    let loaded = load(cmd, flag_error);
    let was_running = guard.running();
    let applied = match loaded {
        Ok(g) => guard.apply(&g).await.map(|restart| (g, restart)),
        Err(e) => Err(e),
    };
    let outcome = match applied {
        Ok((g, restart)) => {
            for r in &restart {
                tracing::warn!(setting = %r, "reloaded configuration: this setting changed but takes effect only after a restart (systemctl restart criguard); the running value stays");
            }
            tracing::info!(config = %g.describe().replace('\n', "; "), left_fail_open = !was_running, "reloaded configuration applied");
            publish(config, Ok(&g), &restart, true);
            if !was_running {
                // Leaving fail-open mode: the condition goes (through the
                // API it was set through; the running report's cannot
                // change until a restart).
                let api = notice.borrow().as_ref().map(|(k, _)| k.clone());
                notice.send_replace(api.or_else(|| g.settings.kube.clone()).map(|k| (k, None)));
            }
            ReloadOutcome::Applied
        }
        Err(e) => {
            tracing::error!(key = %e.key, value = %e.value, rule = %e.rule, "reloaded configuration refused: {e}; the running configuration stays");
            if !was_running {
                notice.send_replace(notice_api(cmd).map(|k| (k, Some(e.clone()))));
            }
            config.send_modify(|s| s.refused(e));
            ReloadOutcome::Refused
        }
    };
    metrics
        .config
        .reloads
        .get_or_create(&ReloadLabels { outcome })
        .inc();
}

/// Publishes the configuration in effect (`Ok`) or why criguard fails
/// open (`Err`) for the admin API; `reloaded`: a reload applied it.
pub fn publish(
    config: &watch::Sender<ConfigStatus>,
    state: Result<&Guardian, &ConfigError>,
    needs_restart: &[String],
    reloaded: bool,
) {
    config.send_modify(|s| match state {
        Ok(g) => {
            let e = &g.settings.eviction;
            let thresholds = e.hard.iter().chain(&e.soft).cloned().collect();
            s.running(g.describe(), thresholds, needs_restart.to_vec(), reloaded);
            // The API report starts with the process: a reload cannot
            // change its kubeconfig (`needs_restart` says so).
            if !reloaded {
                s.serving.kubeconfig = match g.settings.kube.as_ref().map(|k| &k.source) {
                    Some(ApiSource::Kubeconfig(p)) => p.display().to_string(),
                    Some(ApiSource::InCluster) => "in-cluster".into(),
                    None => String::new(),
                };
            }
        }
        Err(e) => s.failing_open(e.clone()),
    });
}

/// What the node condition `CriguardConfigInvalid` reports, and through
/// which API: `None`, no API; `Some((api, Some(e)))`, failing open on `e`;
/// `Some((api, None))`, no condition.
pub type Notice = Option<(criguard::kube::KubeSettings, Option<ConfigError>)>;

/// The API report's settings as the file and flags give them, when those
/// are valid on their own (the file may be invalid elsewhere; a file that
/// does not parse leaves the flags alone), for the node condition.
pub fn notice_api(cmd: &ServeCmd) -> Option<criguard::kube::KubeSettings> {
    let file = cmd.eviction.file().unwrap_or_default();
    let raw = file.kube.merge(cmd.kube.raw());
    let k = raw.validate(&crate::cli::args::hostname()).ok()??;
    criguard::kube::check(&k).ok()?;
    Some(k)
}

/// Keeps the node condition `CriguardConfigInvalid` as the latest notice
/// says: set while failing open (again every `period`, and after a failed
/// write), removed once a configuration is accepted.
pub async fn node_notice(
    mut notice: watch::Receiver<Notice>,
    period: Duration,
    stopping: Stopping,
) {
    let stopped = stopping.clone().cancelled_owned();
    tokio::pin!(stopped);
    loop {
        let n = notice.borrow_and_update().clone();
        let mut again = false;
        if let Some((api, invalid)) = &n {
            again = invalid.is_some();
            let reported = tokio::select! {
                r = criguard::kube::config_condition::report(api, invalid.as_ref()) => r,
                () = &mut stopped => return,
            };
            if let Err(err) = reported {
                tracing::warn!(node = %api.node_name, %err, retry_in = ?period, "node condition {} not written", criguard::kube::config_condition::CONFIG_INVALID);
                again = true;
            }
        }
        let wait = async {
            if again {
                tokio::time::sleep(period).await
            } else {
                std::future::pending().await
            }
        };
        tokio::select! {
            () = wait => {}
            changed = notice.changed() => if changed.is_err() { return },
            () = &mut stopped => return,
        }
    }
}

/// While criguard fails open, repeats the complaint every `period`.
pub async fn complaints(
    config: watch::Receiver<ConfigStatus>,
    period: Duration,
    stopping: Stopping,
) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is at once: the start already complained.
    tick.tick().await;
    periodic_on(&mut tick, stopping.clone().cancelled_owned(), || {
        if let Some(e) = &config.borrow().error {
            complain(e, "still");
        }
    })
    .await;
}
