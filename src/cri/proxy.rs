//! Forwarding one call.
//!
//! The handler takes the kubelet's `http::Request`, points it at the shared
//! upstream channel and returns the runtime's `http::Response` with its body
//! still streaming. No message is decoded and nothing is buffered, so the
//! cost per call is one extra HTTP/2 hop over a unix socket.

use std::convert::Infallible;

use tonic::body::Body;
use tonic::transport::Channel;
use tower::ServiceExt;

use crate::runtime::Upstream;

/// Forwards calls to the runtime. Cheap to clone; clones share the channel.
#[derive(Clone, Debug)]
pub struct Proxy {
    channel: Channel,
    endpoint: String,
}

impl Proxy {
    /// A proxy that forwards to `upstream`.
    pub fn new(upstream: &Upstream) -> Self {
        Self {
            channel: upstream.channel(),
            endpoint: upstream.endpoint().to_string(),
        }
    }

    /// Forwards one request and returns the runtime's response unchanged.
    /// When the runtime cannot be reached the answer is a gRPC `UNAVAILABLE`
    /// status naming the endpoint, never an HTTP error, so gRPC clients see
    /// the same code as when the runtime itself is down.
    pub async fn forward<B>(&self, req: http::Request<B>) -> Result<http::Response<Body>, Infallible>
    where
        B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<tonic::codegen::StdError>,
    {
        let path = req.uri().path().to_owned();
        let req = req.map(Body::new);
        match self.channel.clone().oneshot(req).await {
            Ok(resp) => Ok(resp),
            Err(err) => {
                let msg = format!(
                    "criguard: runtime {} unavailable: {}",
                    self.endpoint,
                    error_chain(&err)
                );
                tracing::debug!(%path, %msg, "upstream call failed");
                Ok(tonic::Status::unavailable(msg).into_http())
            }
        }
    }
}

/// An error and its sources joined by `: `.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}
