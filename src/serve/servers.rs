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
use criguard::listen;
use criguard::metrics::Metrics;
use criguard::model::NodeModel;
use criguard::node_state::{ImageUses, NodeStatus};
use criguard::runtime::Upstream;

/// The bound sockets.
pub struct Listeners {
    /// The CRI socket.
    pub cri: tokio::net::UnixListener,
    /// The CRI socket's path when criguard created it (removed at the end;
    /// `None` under socket activation).
    pub owned_path: Option<PathBuf>,
    /// The admin socket.
    pub admin: tokio::net::UnixListener,
}

impl Listeners {
    /// Binds the CRI socket (`activated`: the one systemd passed; else
    /// `listen_path`), then the admin socket. Both are relay essentials:
    /// criguard does not run without them.
    pub async fn bind(
        activated: Option<std::os::unix::net::UnixListener>,
        listen_path: &Path,
        admin_socket: &Path,
    ) -> anyhow::Result<Self> {
        let (cri, owned_path) = match activated {
            Some(l) => {
                tracing::info!("listening on the socket passed by systemd");
                let l = tokio::net::UnixListener::from_std(l)
                    .context("socket activation: register fd 3")?;
                (l, None)
            }
            None => {
                let l = listen::bind(listen_path)?;
                tracing::info!(path = %listen_path.display(), "listening");
                (l, Some(listen_path.to_owned()))
            }
        };
        let admin = listen::bind(admin_socket)?;
        Ok(Self {
            cri,
            owned_path,
            admin,
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

/// Starts relaying CRI calls from `listener` to the runtime on the proxy's
/// own thread, observing them into the node model (admission against
/// `status`, image uses into `image_uses`); observed calls wait for the
/// model's readiness (rebuilt), every other call is relayed at once.
/// Requests are changed (patched, refused) only while `guarding` is true.
pub fn start_proxy(
    listener: tokio::net::UnixListener,
    upstream: &Upstream,
    (node, ready): (Arc<RwLock<NodeModel>>, tokio::sync::watch::Receiver<bool>),
    (status, guarding): (Arc<RwLock<NodeStatus>>, Arc<std::sync::atomic::AtomicBool>),
    image_uses: ImageUses,
    metrics: &Metrics,
    drain: Duration,
) -> anyhow::Result<cri::server::ProxyThread> {
    let proxy = cri::Proxy::new(upstream)
        .with_observer(
            cri::observe::Observer::new(node)
                .with_admission(status, metrics.eviction.admission_refusals.clone())
                .with_image_uses(image_uses)
                .with_guarding(guarding),
        )
        .with_metrics(metrics.cri.clone())
        .with_ready(ready);
    cri::server::ProxyThread::spawn(listener.into_std()?, proxy, drain)
        .context("start the proxy thread")
}

/// Removes the sockets criguard created.
pub fn remove_sockets(owned_path: Option<&Path>, admin_socket: &Path) -> anyhow::Result<()> {
    for path in owned_path.into_iter().chain([admin_socket]) {
        std::fs::remove_file(path).with_context(|| format!("remove socket {}", path.display()))?;
    }
    Ok(())
}
