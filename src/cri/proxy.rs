//! What every relayed connection shares: the runtime's address, the
//! observer, the call metrics, whether the node model is ready, the
//! memory budget for held bytes and the connection limit.

use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::{CancellationToken, DropGuard};

use super::budget::Budget;
use super::methods::MethodInfo;
use super::metrics::CriMetrics;
use super::observe::{Method, Observe};
use crate::runtime::{RuntimeEndpoint, Upstream};

/// The node model is ready: set once, when the model is rebuilt from the
/// runtime, and never unset. Cheap to clone; every clone sees the same flag.
#[derive(Clone, Debug, Default)]
pub struct Ready(CancellationToken);

impl Ready {
    /// Sets the flag.
    pub fn set(&self) {
        self.0.cancel();
    }

    /// Whether the flag is set.
    pub fn is_set(&self) -> bool {
        self.0.is_cancelled()
    }

    /// Resolves once the flag is set.
    pub async fn wait(&self) {
        self.0.cancelled().await
    }

    /// Sets the flag when the returned guard is dropped: held by the
    /// rebuild, so that calls are released (fail open) if it ends early.
    pub fn set_on_drop(&self) -> DropGuard {
        self.0.clone().drop_guard()
    }
}

/// The proxy's shared settings. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Proxy {
    pub(super) endpoint: RuntimeEndpoint,
    pub(super) observer: Option<Arc<dyn Observe>>,
    metrics: CriMetrics,
    ready: Option<Ready>,
    pub(super) budget: Arc<Budget>,
    pub(super) max_connections: usize,
}

/// Relay connections served at once by default. A kubelet keeps one or
/// two, crictl and node agents one each while they run, but clients that
/// never close theirs exist: critest v1.37 opened more than 256 in one run
/// (each spec dials anew), and containerd alone would have served them all.
/// 4096 (about 3 descriptors and one mostly idle thread each, within the
/// unit's `LimitNOFILE=65536`) bounds a runaway client without refusing
/// what a node really sees.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

impl Proxy {
    /// A proxy to `upstream`'s runtime that observes nothing.
    pub fn new(upstream: &Upstream) -> Self {
        Self::to(upstream.endpoint().clone())
    }

    /// A proxy to the runtime at `endpoint` that observes nothing.
    pub fn to(endpoint: RuntimeEndpoint) -> Self {
        Self {
            endpoint,
            observer: None,
            metrics: CriMetrics::default(),
            ready: None,
            budget: Arc::new(Budget::default()),
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }

    /// The same proxy, holding at most `bytes` for inspection across its
    /// connections (see [`super::budget`]).
    pub fn with_hold_budget(mut self, bytes: usize) -> Self {
        self.budget = Arc::new(Budget::new(bytes));
        self
    }

    /// The same proxy, serving at most `n` connections at once; a client
    /// past it is refused with `UNAVAILABLE`.
    pub fn with_max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// The connection limit.
    pub fn max_connections(&self) -> usize {
        self.max_connections
    }

    /// The same proxy, recording its calls in `metrics`.
    pub fn with_metrics(mut self, metrics: CriMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The same proxy, also feeding `observer`.
    pub fn with_observer(mut self, observer: impl Observe) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// The same proxy, holding observed calls until `ready` is set (the
    /// node model rebuilt); every other call is forwarded meanwhile.
    pub fn with_ready(mut self, ready: Ready) -> Self {
        self.ready = Some(ready);
        self
    }

    /// The runtime's endpoint.
    pub fn endpoint(&self) -> &RuntimeEndpoint {
        &self.endpoint
    }

    /// Whether observed calls can be handled now.
    pub(super) fn is_ready(&self) -> bool {
        self.ready.as_ref().is_none_or(Ready::is_set)
    }

    /// The readiness flag, if there is one.
    pub(super) fn ready(&self) -> Option<Ready> {
        self.ready.clone()
    }

    /// Records one finished call.
    pub(super) fn record(&self, info: &MethodInfo, code: i32, started: Instant) {
        self.metrics.observe(info.label, code, started);
    }
}

/// Runs observer code so that a bug in it can never fail the kubelet's
/// call: a panic is logged and the call goes on as plain forwarding.
pub(super) fn guarded<T>(method: Method, f: impl FnOnce() -> T) -> Option<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => Some(v),
        Err(_) => {
            tracing::error!(
                ?method,
                "criguard's observer panicked; the call is forwarded as is"
            );
            None
        }
    }
}
