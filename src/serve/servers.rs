//! The sockets `serve` listens on and what serves them: the CRI socket
//! (bound here, or passed by systemd) relayed by the proxy thread, the
//! admin socket, and the metrics port.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use criguard::config;
use criguard::cri;
use criguard::eviction::NodeStatus;
use criguard::gc::image_uses::ImageUses;
use criguard::listen;
use criguard::metrics::Metrics;
use criguard::model::NodeModel;
use criguard::runtime::Upstream;

/// The bound sockets.
pub struct Listeners {
    /// The CRI socket (`None`: `--mode nri` with no socket given, the
    /// kubelet dialling the runtime).
    pub cri: Option<tokio::net::UnixListener>,
    /// The admin socket.
    pub admin: tokio::net::UnixListener,
    /// The socket files criguard created, removed when this is dropped.
    pub owned: OwnedSockets,
    /// Whether the CRI socket's file is criguard's (not systemd's).
    pub own_cri: bool,
}

/// Where the CRI and admin listeners come from.
pub enum Given {
    /// Nowhere: criguard binds both (the admin socket alone in `--mode
    /// nri`).
    Nothing,
    /// systemd passed the CRI socket; criguard binds the admin socket.
    Systemd(std::os::unix::net::UnixListener),
    /// The previous criguard handed both over; `own_cri`: the CRI socket's
    /// file is criguard's.
    Handoff {
        /// The CRI listener.
        cri: std::os::unix::net::UnixListener,
        /// The admin listener.
        admin: std::os::unix::net::UnixListener,
        /// Whether the CRI socket's file is criguard's.
        own_cri: bool,
    },
}

/// The socket files criguard created (the CRI socket unless systemd passed
/// it, the admin socket): removed when dropped, so that no way out of
/// `serve` (a later startup step failing, an error while stopping, a
/// panic) leaves a socket nobody answers on. [`OwnedSockets::remove`] does
/// it at a clean stop and reports what it could not remove.
#[derive(Debug, Default)]
pub struct OwnedSockets(Vec<PathBuf>);

impl OwnedSockets {
    /// Adds `path`, a socket just bound.
    pub fn push(&mut self, path: &Path) {
        self.0.push(path.to_owned());
    }

    /// Removes every socket; the first error, naming its path (the others
    /// are still tried).
    pub fn remove(mut self) -> anyhow::Result<()> {
        remove_all(std::mem::take(&mut self.0))
    }

    /// Leaves every socket in place: a successor serves on them now.
    pub fn disown(mut self) {
        self.0.clear();
    }
}

impl Drop for OwnedSockets {
    fn drop(&mut self) {
        if let Err(err) = remove_all(std::mem::take(&mut self.0)) {
            tracing::warn!("{err:#}");
        }
    }
}

/// Removes each of `paths` (one already gone is not an error); the first
/// error, naming its path.
fn remove_all(paths: Vec<PathBuf>) -> anyhow::Result<()> {
    let mut first = Ok(());
    for path in paths {
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound && first.is_ok() => {
                first =
                    Err(anyhow::Error::new(e).context(format!("remove socket {}", path.display())));
            }
            _ => tracing::debug!(path = %path.display(), "socket removed"),
        }
    }
    first
}

impl Listeners {
    /// Binds the CRI socket (the one systemd passed or the previous
    /// criguard handed over, else at `listen_path`; none when that is
    /// `None` and nothing was given), then the admin socket (unless handed
    /// over). Both are relay essentials: criguard does not run without
    /// them. When the admin socket cannot be bound, the CRI socket just
    /// bound is removed again.
    pub async fn bind(
        given: Given,
        listen_path: Option<&Path>,
        admin_socket: &Path,
    ) -> anyhow::Result<Self> {
        let mut owned = OwnedSockets::default();
        let from_std = |l: std::os::unix::net::UnixListener, what: &str| {
            l.set_nonblocking(true)
                .and_then(|()| tokio::net::UnixListener::from_std(l))
                .with_context(|| format!("register the {what} socket"))
        };
        let (cri, admin, own_cri) = match given {
            Given::Handoff {
                cri,
                admin,
                own_cri,
            } => {
                tracing::info!("listening on the sockets handed over by the previous criguard");
                (
                    Some(from_std(cri, "CRI")?),
                    Some(from_std(admin, "admin")?),
                    own_cri,
                )
            }
            Given::Systemd(l) => {
                tracing::info!("listening on the socket passed by systemd");
                (Some(from_std(l, "CRI")?), None, false)
            }
            Given::Nothing => match listen_path {
                Some(path) => {
                    let l = listen::bind(path)?;
                    tracing::info!(path = %path.display(), "listening");
                    (Some(l), None, true)
                }
                None => (None, None, false),
            },
        };
        if let (true, Some(path)) = (own_cri, listen_path) {
            owned.push(path);
        }
        let admin = match admin {
            Some(a) => a,
            None => listen::bind(admin_socket)?,
        };
        owned.push(admin_socket);
        Ok(Self {
            cri,
            admin,
            owned,
            own_cri,
        })
    }
}

/// Binds the metrics port (`None`: no metrics). `Ok(Err(_))`: an address
/// that is not this machine's, a configuration error (criguard then fails
/// open without metrics); `Err(_)`: any other failure.
pub async fn bind_metrics(
    address: Option<std::net::SocketAddr>,
) -> anyhow::Result<Result<Option<tokio::net::TcpListener>, config::ConfigError>> {
    let Some(sock) = address else {
        return Ok(Ok(None));
    };
    match tokio::net::TcpListener::bind(sock).await {
        Ok(l) => {
            tracing::info!(address = %l.local_addr()?, "serving metrics");
            Ok(Ok(Some(l)))
        }
        // Not an address of this machine: configuration.
        Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => {
            Ok(Err(config::ConfigError {
                key: "--metrics-address".into(),
                value: sock.to_string(),
                rule: format!("cannot bind: {e}"),
            }))
        }
        Err(e) => Err(anyhow::anyhow!("--metrics-address {sock}: bind: {e}")),
    }
}

/// Serves `metrics` on `listener` (if any) until `stopped` resolves.
pub async fn metrics(
    listener: Option<tokio::net::TcpListener>,
    metrics: Metrics,
    stopped: impl Future<Output = ()>,
) {
    if let Some(l) = listener {
        criguard::metrics::serve(l, metrics, stopped).await;
    }
}

/// The relay's part: what it observes into and what it needs to serve.
pub struct Relay {
    /// The runtime it forwards to.
    pub upstream: Upstream,
    /// The node model the observed calls are applied to.
    pub node: Arc<RwLock<NodeModel>>,
    /// Set once the model is rebuilt: observed calls wait for it, every
    /// other call is relayed at once.
    pub ready: cri::proxy::Ready,
    /// What RunPodSandbox admission is decided against.
    pub status: Arc<RwLock<NodeStatus>>,
    /// Requests are changed (patched, refused) only while this is true.
    pub guarding: Arc<std::sync::atomic::AtomicBool>,
    /// Where the image uses the relay sees are recorded.
    pub image_uses: ImageUses,
    /// How long calls in flight may finish when the relay stops.
    pub drain: Duration,
    /// Connections relayed at once.
    pub max_connections: usize,
}

impl Relay {
    /// What decides on and learns from the lifecycle: the relayed calls'
    /// observer, and the NRI plugin's (`--mode nri`).
    pub fn observer(&self, metrics: &Metrics) -> criguard::intercept::Observer {
        criguard::intercept::Observer::new(self.node.clone())
            .with_admission(
                self.status.clone(),
                metrics.eviction.admission_refusals.clone(),
            )
            .with_image_uses(self.image_uses.clone())
            .with_guarding(self.guarding.clone())
    }

    /// Starts relaying CRI calls from `listener` to the runtime on the
    /// proxy's own thread, counting them in `metrics`.
    pub fn spawn(
        self,
        listener: tokio::net::UnixListener,
        metrics: &Metrics,
    ) -> anyhow::Result<cri::server::ProxyThread> {
        let observer = self.observer(metrics);
        let proxy = cri::Proxy::new(&self.upstream)
            .with_observer(observer)
            .with_metrics(metrics.cri.clone())
            .with_ready(self.ready)
            .with_max_connections(self.max_connections);
        cri::server::ProxyThread::spawn(listener.into_std()?, proxy, self.drain)
            .context("start the proxy thread")
    }
}
