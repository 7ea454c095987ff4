//! A raw HTTP/2 connection to the runtime, for forwarding.
//!
//! The proxy does not go through tonic's channel: its layers rewrite
//! `user-agent` and add a buffer task per call. This is a bare hyper client
//! over one multiplexed connection, re-dialled when it closes. The mutex only
//! guards swapping the connection handle; calls never hold it.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixStream;

/// Request bodies the proxy forwards: the kubelet's stream as it arrives, or
/// bytes criguard holds (an observed or patched message).
pub type ForwardBody = Either<Incoming, Full<Bytes>>;

/// Why a call could not be forwarded.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// Dialling the runtime's socket failed.
    #[error("dial {path}: {source}")]
    Dial {
        /// Socket path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The HTTP/2 handshake or the call failed.
    #[error("{0}")]
    Http(#[from] hyper::Error),
}

/// One shared HTTP/2 connection to the runtime, dialled on demand.
#[derive(Debug)]
pub struct RawUpstream {
    path: PathBuf,
    conn: Mutex<Option<SendRequest<ForwardBody>>>,
    dialling: tokio::sync::Mutex<()>,
}

impl RawUpstream {
    /// A connection to `path`, not dialled yet.
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
            conn: Mutex::new(None),
            dialling: tokio::sync::Mutex::new(()),
        }
    }

    fn current(&self) -> Option<SendRequest<ForwardBody>> {
        let guard = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        guard.as_ref().filter(|s| !s.is_closed()).cloned()
    }

    async fn sender(&self) -> Result<SendRequest<ForwardBody>, ForwardError> {
        if let Some(s) = self.current() {
            return Ok(s);
        }
        // One dial at a time; callers that waited reuse its connection.
        let _dial = self.dialling.lock().await;
        if let Some(s) = self.current() {
            return Ok(s);
        }
        let stream =
            UnixStream::connect(&self.path)
                .await
                .map_err(|source| ForwardError::Dial {
                    path: self.path.clone(),
                    source,
                })?;
        let (send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await?;
        tokio::spawn(async move {
            if let Err(err) = conn.await {
                tracing::debug!(%err, "runtime connection closed");
            }
        });
        *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(send.clone());
        Ok(send)
    }

    /// Sends one request. A request the old connection refused before sending
    /// it (the runtime restarted) is sent again once on a fresh connection.
    pub async fn send(
        &self,
        req: http::Request<ForwardBody>,
    ) -> Result<http::Response<Incoming>, ForwardError> {
        let mut send = self.sender().await?;
        send.ready().await?;
        match send.try_send_request(req).await {
            Ok(resp) => Ok(resp),
            Err(mut err) => match err.take_message() {
                Some(req) => {
                    self.conn.lock().unwrap_or_else(|e| e.into_inner()).take();
                    let mut send = self.sender().await?;
                    send.ready().await?;
                    Ok(send.send_request(req).await?)
                }
                None => Err(ForwardError::Http(err.into_error())),
            },
        }
    }
}
