//! Clients to the container runtime that criguard stands in front of.
//!
//! One [`Upstream`] holds a lazily dialled tonic channel to the runtime's
//! unix socket for criguard's own CRI calls ([`Upstream::runtime`]) and
//! containerd's native services, through `containerd-client`: snapshots
//! ([`Upstream::snapshots`]), events ([`Upstream::events`]) and content
//! ([`Upstream::content`]); containerd serves them all on one socket. It
//! reconnects by itself: while the runtime is down every call fails at
//! once, and the first call after it is back opens a new connection. The
//! kubelet's calls do not use it: the proxy relays each kubelet connection
//! on a runtime connection of its own (`crate::cri`).
//!
//! Beside the client, what keeps the node model (`crate::model`, plain
//! data) equal to the runtime: [`sync`] reads the runtime's lists into it,
//! and [`track`] applies containerd's task events ([`events`]) to it as they
//! arrive, handing them on to a [`track::TaskWatcher`] (the kernel OOM kill
//! recorder, wired in by `serve`).

pub mod content;
pub mod events;
pub mod remove;
pub mod snapshots;
pub mod sync;
pub mod track;

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

/// The containerd namespace the CRI plugin keeps Kubernetes' objects in.
pub const CRI_NAMESPACE: &str = "k8s.io";

/// `message` as a request to containerd's native API in `namespace` (the
/// `containerd-namespace` header every namespaced service reads).
pub fn namespaced<T>(message: T, namespace: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    match tonic::metadata::MetadataValue::try_from(namespace) {
        Ok(ns) => {
            req.metadata_mut().insert("containerd-namespace", ns);
        }
        // Only criguard's own constants get here; containerd would answer
        // "namespace is required", naming the call.
        Err(_) => tracing::error!(namespace, "namespace is not a valid header value"),
    }
    req
}

/// Errors from naming or reaching the runtime.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The endpoint is not `unix:///path` or an absolute path.
    #[error("runtime endpoint {endpoint:?}: expected unix:///absolute/path or an absolute path")]
    BadEndpoint {
        /// The endpoint as given.
        endpoint: String,
    },
}

/// Where the runtime listens: a unix socket path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeEndpoint {
    path: PathBuf,
}

impl RuntimeEndpoint {
    /// Parses `unix:///run/containerd/containerd.sock` or a bare absolute path,
    /// the two spellings the kubelet accepts for `--container-runtime-endpoint`.
    pub fn parse(endpoint: &str) -> Result<Self, RuntimeError> {
        let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
        if !path.starts_with('/') {
            return Err(RuntimeError::BadEndpoint {
                endpoint: endpoint.to_owned(),
            });
        }
        Ok(Self {
            path: PathBuf::from(path),
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl std::fmt::Display for RuntimeEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unix://{}", self.path.display())
    }
}

/// The deadline of each of criguard's own calls to the runtime (a stop
/// adds the grace period it asks for): containerd answers every one of
/// them in milliseconds; a runtime that has not answered in this long is
/// hung (frozen, deadlocked) and the call is abandoned with a warning.
pub const CALL_DEADLINE: Duration = Duration::from_secs(15);

/// The deadline the channel itself puts on every unary call, whatever its
/// caller does: the kubelet's own `--runtime-request-timeout` default.
pub const CHANNEL_DEADLINE: Duration = Duration::from_secs(120);

/// Awaits `call`, a call to the runtime named `what`, at most `deadline`:
/// past it the call is abandoned, a warning logged, and
/// `DEADLINE_EXCEEDED` returned, as the kubelet's own calls end when their
/// context's deadline passes.
pub async fn bounded<T>(
    what: &'static str,
    deadline: Duration,
    call: impl std::future::Future<Output = Result<T, tonic::Status>>,
) -> Result<T, tonic::Status> {
    match tokio::time::timeout(deadline, call).await {
        Ok(r) => r,
        Err(_) => {
            tracing::warn!(
                call = what,
                ?deadline,
                "runtime call past its deadline: abandoned (is the runtime hung?)"
            );
            Err(tonic::Status::deadline_exceeded(format!(
                "{what}: no answer from the runtime within {deadline:?}"
            )))
        }
    }
}

/// A shared, lazily connected channel to the runtime.
#[derive(Clone, Debug)]
pub struct Upstream {
    endpoint: RuntimeEndpoint,
    channel: Channel,
    /// The same socket without the channel's deadline, for event
    /// subscriptions (a stream that may stay silent for hours).
    streams: Channel,
}

impl Upstream {
    /// Makes the channel without connecting; the first call connects.
    /// Must be called inside a tokio runtime.
    pub fn new(endpoint: RuntimeEndpoint) -> Self {
        let dial = |deadline: Option<Duration>| {
            let path = endpoint.path.clone();
            // The URI is a placeholder: the connector below ignores it, and the
            // channel uses only its authority for the `:authority` header.
            let mut e = Endpoint::from_static("http://localhost");
            if let Some(d) = deadline {
                e = e.timeout(d);
            }
            e.connect_with_connector_lazy(tower::service_fn(move |_| {
                let path = path.clone();
                async move { UnixStream::connect(path).await.map(TokioIo::new) }
            }))
        };
        let channel = dial(Some(CHANNEL_DEADLINE));
        let streams = dial(None);
        Self {
            endpoint,
            channel,
            streams,
        }
    }

    /// The endpoint this channel dials.
    pub fn endpoint(&self) -> &RuntimeEndpoint {
        &self.endpoint
    }

    /// A CRI v1 runtime client over the shared channel.
    pub fn runtime(&self) -> RuntimeServiceClient<Channel> {
        RuntimeServiceClient::new(self.channel.clone()).max_decoding_message_size(MAX_MESSAGE)
    }

    /// A client of containerd's native snapshots service for `snapshotter`,
    /// over the shared channel (containerd serves it on the CRI socket).
    pub fn snapshots(&self, snapshotter: &str) -> snapshots::Snapshots {
        snapshots::Snapshots::new(self.channel.clone(), snapshotter)
    }

    /// containerd's events service (task exits and OOMs in namespace
    /// `k8s.io`), over the shared channel.
    pub fn events(&self) -> events::Events {
        events::Events::new(self.streams.clone())
    }

    /// containerd's content service in namespace `k8s.io`, over the shared channel.
    pub fn content(&self) -> content::Content {
        content::Content::new(self.channel.clone(), CRI_NAMESPACE)
    }

    /// A CRI v1 image client over the shared channel.
    pub fn images(&self) -> ImageServiceClient<Channel> {
        ImageServiceClient::new(self.channel.clone()).max_decoding_message_size(MAX_MESSAGE)
    }
}

/// The largest message criguard's own clients decode: the kubelet's limit (16 MiB).
pub const MAX_MESSAGE: usize = 16 * 1024 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_accepts_both_kubelet_spellings() {
        let a = RuntimeEndpoint::parse("unix:///run/containerd/containerd.sock").unwrap();
        let b = RuntimeEndpoint::parse("/run/containerd/containerd.sock").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "unix:///run/containerd/containerd.sock");
    }

    #[test]
    fn endpoint_refuses_tcp_and_relative_paths() {
        for bad in ["tcp://127.0.0.1:1234", "relative.sock", "unix://relative"] {
            let err = RuntimeEndpoint::parse(bad).unwrap_err();
            assert!(err.to_string().contains(bad), "{err}");
        }
    }
}
