//! The optional Kubernetes API report: what the kubelet would write for a
//! node-pressure eviction, written by criguard, which made the eviction.
//!
//! For each eviction, in this order ([`pod`]):
//! 1. before the pod is stopped, its status (phase Failed, reason Evicted,
//!    the message, the `DisruptionTarget` condition), waiting at most the
//!    bound (`kubeStatusTimeout`, 250 ms by default); the pod is then
//!    stopped whatever the API did;
//! 2. a Warning event, reason Evicted;
//! 3. a watch on the pod for [`pod::WATCH_FOR`]: when the kubelet's status
//!    manager writes its cached `Running` back, or its own first `Failed`
//!    blanks reason and message, criguard writes its status again, with
//!    back-off and a bound ([`reassert`], which also says what the kubelet
//!    does and why this converges); only a status still undone past the
//!    bound gets the pod deleted (UID precondition, grace 0).
//!
//! The reports in progress are kept in the state directory ([`pending`]),
//! so a restarted criguard resumes them. While a pressure condition holds
//! the node carries criguard's own condition type and NoSchedule taint
//! ([`node`]); both go when it ends. While criguard fails open on a
//! configuration it cannot accept, the node carries `CriguardConfigInvalid`
//! ([`config_condition`]). Every request carries criguard's own
//! User-Agent ([`user_agent`]).
//!
//! Every write runs in the background and retries with backoff; nothing
//! here ever delays an eviction past the bound, and API errors (unreachable,
//! 403, 409) are logged and counted (`criguard_kube_*` metrics).

pub mod body;
pub mod config_condition;
pub mod metrics;
mod node;
pub mod pending;
mod pod;
pub mod pods;
pub mod reassert;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};

pub use crate::config::kube::{ApiSource, KubeSettings};
pub use body::PodEviction;

use self::metrics::KubeMetrics;
use crate::backoff::Backoff;
use crate::signals::table::Condition;

/// Why the report could not start.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The kubeconfig could not be read or used.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No in-cluster configuration (not running in a pod).
    #[error("in-cluster configuration: {0}")]
    InCluster(#[from] kube::config::InClusterError),
    /// The client could not be built from the configuration.
    #[error("Kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

/// Checks before start what can be checked without the API: a kubeconfig
/// file must be readable and parse, an in-cluster configuration must exist
/// (the service host variables and token); the error names the key.
pub fn check(settings: &KubeSettings) -> Result<(), crate::config::ConfigError> {
    let (value, rule) = match &settings.source {
        ApiSource::Kubeconfig(path) => match kube::config::Kubeconfig::read_from(path) {
            Ok(_) => return Ok(()),
            Err(e) => (path.display().to_string(), e.to_string()),
        },
        ApiSource::InCluster => match kube::Config::incluster() {
            Ok(_) => return Ok(()),
            Err(e) => ("in-cluster".to_owned(), e.to_string()),
        },
    };
    Err(crate::config::ConfigError {
        key: "kubeconfig".into(),
        value,
        rule,
    })
}

/// One API request never waits longer than this in the background.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The report: cheap to clone, every write in the background.
#[derive(Clone)]
pub struct KubeReport {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for KubeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeReport")
            .field("node", &self.inner.node)
            .field("bound", &self.inner.bound)
            .finish()
    }
}

struct Inner {
    client: kube::Client,
    node: String,
    bound: Duration,
    taints: bool,
    metrics: KubeMetrics,
    /// criguard's conditions as the eviction manager last published them;
    /// `None` until its first round.
    conditions: watch::Sender<Option<BTreeSet<Condition>>>,
    /// The conditions (and taints) the node reconciler last wrote to the
    /// node; `None` until its first write.
    applied: watch::Sender<Option<BTreeSet<Condition>>>,
    pending: pending::Pending,
}

/// criguard's User-Agent, shaped as the Kubernetes components' own
/// (`kubelet/v1.26.0 (linux/amd64) kubernetes/<commit>`):
/// `criguard/v<version> (<os>/<arch>) criguard/<commit>`, with Go's
/// architecture names and the commit from `CRIGUARD_GIT_COMMIT` at build
/// time, `unknown` without it. For example
/// `criguard/v0.1.0 (linux/amd64) criguard/unknown`.
pub fn user_agent() -> String {
    user_agent_of(
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH,
        option_env!("CRIGUARD_GIT_COMMIT").unwrap_or(""),
    )
}

/// [`user_agent`] from its parts (Rust's architecture names).
fn user_agent_of(version: &str, os: &str, arch: &str, commit: &str) -> String {
    let arch = match arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    };
    let commit = if commit.is_empty() { "unknown" } else { commit };
    format!("criguard/v{version} ({os}/{arch}) criguard/{commit}")
}

/// A client for `settings`' API, with criguard's User-Agent (no request
/// is made yet).
pub(crate) async fn client(settings: &KubeSettings) -> Result<kube::Client, KubeError> {
    let mut config = match &settings.source {
        ApiSource::Kubeconfig(path) => {
            let wrap = |source| KubeError::Kubeconfig {
                path: path.clone(),
                source,
            };
            let file = kube::config::Kubeconfig::read_from(path).map_err(wrap)?;
            kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .map_err(wrap)?
        }
        ApiSource::InCluster => kube::Config::incluster()?,
    };
    tracing::debug!(api = %config.cluster_url, node = %settings.node_name, "Kubernetes API client");
    let agent = http::HeaderValue::from_str(&user_agent())
        .unwrap_or_else(|_| http::HeaderValue::from_static("criguard"));
    config.headers.push((http::header::USER_AGENT, agent));
    Ok(kube::Client::try_from(config)?)
}

impl KubeReport {
    /// Builds the client (no request is made yet), starts the node
    /// reconciler and resumes the pod reports a previous run left in
    /// `state_dir` (`None`: nothing is kept). Must run inside the tokio
    /// runtime.
    pub async fn start(
        settings: &KubeSettings,
        metrics: KubeMetrics,
        state_dir: Option<&Path>,
    ) -> Result<Self, KubeError> {
        let client = client(settings).await?;
        tracing::info!(node = %settings.node_name, bound = ?settings.status_timeout, taints = settings.taints, "reporting evictions to the Kubernetes API");
        let (tx, rx) = watch::channel(None);
        let (pending, resume) =
            pending::Pending::load(state_dir, std::time::SystemTime::now(), pod::WATCH_FOR);
        let inner = Arc::new(Inner {
            client,
            node: settings.node_name.clone(),
            bound: settings.status_timeout,
            taints: settings.taints,
            metrics,
            conditions: tx,
            applied: watch::Sender::new(None),
            pending,
        });
        tokio::spawn(node::reconcile(inner.clone(), rx));
        for p in resume {
            tracing::info!(pod = %format!("{}/{}", p.eviction.namespace, p.eviction.name), uid = %p.eviction.uid, written = p.written, "resuming the API report of a pod evicted before the restart");
            tokio::spawn(pod::resume(inner.clone(), p));
        }
        Ok(Self { inner })
    }

    /// Reports an eviction about to be carried out: waits for the node's
    /// condition and taint of the pressure to be written, then starts the
    /// pod's report and returns once its status write has answered; all of
    /// it within the bound.
    ///
    /// The taint goes first because the pod's Failed status is what makes
    /// its ReplicaSet create a replacement at once: with the taint later,
    /// the scheduler can bind the replacement to the tainted node, where
    /// criguard's admission then refuses its sandbox until the pressure
    /// has passed.
    pub async fn pod_evicted(&self, e: PodEviction) {
        let deadline = tokio::time::Instant::now() + self.inner.bound;
        let pod = format!("{}/{}", e.namespace, e.name);
        let wanted = self.inner.conditions.borrow().clone().unwrap_or_default();
        if !wanted.is_empty() {
            let mut applied = self.inner.applied.subscribe();
            let written = matches!(
                tokio::time::timeout_at(
                    deadline,
                    applied.wait_for(|a| a.as_ref().is_some_and(|a| wanted.is_subset(a)))
                )
                .await,
                Ok(Ok(_))
            );
            if !written {
                tracing::warn!(%pod, bound = ?self.inner.bound, "node condition and taint not written within the bound: writing the pod's status anyway");
            }
        }
        let (tx, rx) = oneshot::channel();
        let since = std::time::SystemTime::now();
        tokio::spawn(pod::report(self.inner.clone(), e, Some(tx), since));
        if tokio::time::timeout_at(deadline, rx).await.is_err() {
            tracing::warn!(%pod, bound = ?self.inner.bound, "pod status not written within the bound: stopping the pod now, the write goes on in the background");
        }
    }

    /// The node's pressure conditions now; the API follows in the
    /// background. Until the first call the node is left as it is: a
    /// restarted criguard does not clear conditions its first round, with
    /// the pressure it remembers, may keep.
    pub fn node_conditions(&self, conditions: &BTreeSet<Condition>) {
        self.inner.conditions.send_if_modified(|c| {
            let changed = c.as_ref() != Some(conditions);
            if changed {
                *c = Some(conditions.clone());
            }
            changed
        });
    }
}

/// The API writes' back-off: 200 ms, doubling, at most 30 s.
fn backoff() -> Backoff {
    Backoff::new(Duration::from_millis(200), Duration::from_secs(30))
}

/// A request with [`REQUEST_TIMEOUT`]; a timeout reads as an error.
async fn bounded<T>(
    f: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, String> {
    match tokio::time::timeout(REQUEST_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(describe(&e)),
        Err(_) => Err(format!("no answer within {REQUEST_TIMEOUT:?}")),
    }
}

/// The HTTP status of an API error answer, if it was one.
fn code_of(e: &str) -> Option<u16> {
    e.strip_prefix("HTTP ")?.get(..3)?.parse().ok()
}

fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("HTTP {} {}: {}", s.code, s.reason, s.message),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_thirty_seconds() {
        let mut b = backoff();
        let waits: Vec<u64> = (0..10).map(|_| b.next_wait().as_millis() as u64).collect();
        assert_eq!(
            waits,
            [200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000, 30000]
        );
        assert_eq!(b.attempts(), 10);
    }

    #[test]
    fn the_user_agent_is_shaped_as_the_kubernetes_components_own() {
        assert_eq!(
            user_agent_of("0.1.0", "linux", "x86_64", ""),
            "criguard/v0.1.0 (linux/amd64) criguard/unknown"
        );
        assert_eq!(
            user_agent_of("0.1.0", "linux", "aarch64", "ce64404"),
            "criguard/v0.1.0 (linux/arm64) criguard/ce64404"
        );
        assert!(http::HeaderValue::from_str(&user_agent()).is_ok());
    }

    #[test]
    fn api_error_codes_are_read_back_from_their_description() {
        assert_eq!(code_of("HTTP 409 Conflict: uid"), Some(409));
        assert_eq!(code_of("HTTP 403 Forbidden: no"), Some(403));
        assert_eq!(code_of("error trying to connect: refused"), None);
    }
}
