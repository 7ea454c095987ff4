//! Attaching to the runtime as an NRI plugin: connect to its socket,
//! register, serve its calls; and, when the runtime goes away (a restart),
//! attach again with back-off: the runtime configures and synchronises a
//! plugin on each registration, so nothing is lost across its restart.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixStream;
use tokio::sync::oneshot;

use super::conn::{self, CallError, Handler};
use super::{RUNTIME_SERVICE, api};
use crate::backoff::Backoff;

/// How criguard registers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    /// The runtime's NRI socket.
    pub socket: PathBuf,
    /// The plugin's name (`[a-zA-Z0-9_.+-]+`).
    pub name: String,
    /// Two digits: plugins are called in ascending order of it.
    pub index: String,
}

/// The NRI socket containerd listens on by default.
pub const DEFAULT_SOCKET: &str = "/var/run/nri/nri.sock";
/// How long the runtime waits for a registration: as long for its answer.
pub const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(5);

/// Why criguard could not attach.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// No runtime listens on the socket.
    #[error(
        "NRI socket {}: {source}: is the runtime's NRI on? containerd 2 enables it by default; \
         in containerd's config it is [plugins.\"io.containerd.nri.v1.nri\"] disable = false \
         (containerd 1.7: off by default; 1.6: none)",
        .socket.display()
    )]
    Connect {
        /// The socket.
        socket: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The runtime refused or did not answer the registration.
    #[error("NRI socket {}: registration as {name} (index {index}) failed: {source}", .socket.display())]
    Register {
        /// The socket.
        socket: PathBuf,
        /// The name registered.
        name: String,
        /// The index registered.
        index: String,
        /// Why.
        source: CallError,
    },
}

/// An attached plugin: ends when the runtime closes the connection.
pub struct Attached {
    served: tokio::task::JoinHandle<std::io::Result<()>>,
    /// Calls to the runtime (`UpdateContainers`).
    pub client: conn::Client,
}

impl Attached {
    /// Waits until the runtime closes the connection (or it fails).
    pub async fn closed(&mut self) -> std::io::Result<()> {
        (&mut self.served)
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)))
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.served.abort();
    }
}

/// Connects to `reg.socket`, serves `handler` on it and registers; the
/// runtime then configures and synchronises the plugin through `handler`.
pub async fn attach(
    reg: &Registration,
    handler: Arc<impl Handler>,
) -> Result<Attached, AttachError> {
    let stream = UnixStream::connect(&reg.socket)
        .await
        .map_err(|source| AttachError::Connect {
            socket: reg.socket.clone(),
            source,
        })?;
    let (ready, client) = oneshot::channel();
    let served = tokio::spawn(conn::serve(stream, handler, ready));
    let client = client.await.expect("serve hands its client over first");
    let request = api::RegisterPluginRequest {
        plugin_name: reg.name.clone(),
        plugin_idx: reg.index.clone(),
        nri_version: String::new(),
    };
    let attached = Attached { served, client };
    let registered = attached
        .client
        .call(
            RUNTIME_SERVICE,
            "RegisterPlugin",
            &request,
            REGISTRATION_TIMEOUT,
        )
        .await;
    registered.map_err(|source| AttachError::Register {
        socket: reg.socket.clone(),
        name: reg.name.clone(),
        index: reg.index.clone(),
        source,
    })?;
    Ok(attached)
}

/// Stays attached: serves `first` (when the caller attached already),
/// then attaches again, with back-off from 100 ms to 5 s, each time the
/// runtime goes away or refuses, until `stop` resolves. `attached` is told
/// of each registration (`true`) and each loss (`false`).
pub async fn stay_attached(
    reg: Registration,
    handler: Arc<impl Handler>,
    first: Option<Attached>,
    attached: impl Fn(bool),
    stop: impl Future<Output = ()>,
) {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    let socket = reg.socket.display().to_string();
    let run = async {
        let mut current = first;
        loop {
            if let Some(mut a) = current.take() {
                backoff.reset();
                attached(true);
                tracing::info!(%socket, name = %reg.name, index = %reg.index, "attached to the runtime as an NRI plugin");
                let end = a.closed().await;
                attached(false);
                tracing::warn!(%socket, ?end, "NRI connection closed by the runtime; attaching again");
            }
            tokio::time::sleep(backoff.next_wait()).await;
            match attach(&reg, handler.clone()).await {
                Ok(a) => current = Some(a),
                Err(err) => crate::log_limited!(warn, %err, "NRI attach failed; trying again"),
            }
        }
    };
    tokio::select! {
        () = run => {}
        () = stop => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nri::ttrpc::Response;

    struct Nothing;

    impl Handler for Nothing {
        async fn call(&self, _: &str, method: &str, _: &[u8]) -> Response {
            Response::error(tonic::Code::Unimplemented, format!("method {method}"))
        }
    }

    #[tokio::test]
    async fn no_runtime_on_the_socket_is_one_line_naming_it_and_the_setting() {
        let dir = tempfile::tempdir().unwrap();
        let reg = Registration {
            socket: dir.path().join("nri.sock"),
            name: "criguard".into(),
            index: "10".into(),
        };
        let err = attach(&reg, Arc::new(Nothing))
            .await
            .err()
            .expect("nothing listens");
        let line = err.to_string();
        assert!(!line.contains('\n'), "{line}");
        assert!(line.contains(&reg.socket.display().to_string()), "{line}");
        assert!(
            line.contains("[plugins.\"io.containerd.nri.v1.nri\"] disable = false"),
            "{line}"
        );
    }
}
