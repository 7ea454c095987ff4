//! Forwarding one call.
//!
//! The handler takes the kubelet's `http::Request`, sends it over the shared
//! raw connection and returns the runtime's `http::Response` with its body
//! still streaming. No message is decoded and nothing is buffered, so the
//! cost per call is one extra HTTP/2 hop over a unix socket.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Either, Empty, Full};
use hyper::body::Incoming;

use crate::runtime::Upstream;
use crate::runtime::raw::RawUpstream;

/// Response bodies: the runtime's stream, or nothing for an answer criguard
/// makes itself (a trailers-only gRPC status).
pub type ProxyBody = Either<Incoming, Empty<Bytes>>;

/// Forwards calls to the runtime. Cheap to clone; clones share the connection.
#[derive(Clone, Debug)]
pub struct Proxy {
    upstream: Arc<RawUpstream>,
    endpoint: Arc<str>,
}

impl Proxy {
    /// A proxy that forwards to `upstream`.
    pub fn new(upstream: &Upstream) -> Self {
        Self {
            upstream: upstream.raw(),
            endpoint: upstream.endpoint().to_string().into(),
        }
    }

    /// Forwards one request and returns the runtime's response unchanged.
    /// When the runtime cannot be reached the answer is a gRPC `UNAVAILABLE`
    /// status naming the endpoint, never an HTTP error, so gRPC clients see
    /// the same code as when the runtime itself is down.
    pub async fn forward(
        &self,
        req: http::Request<Incoming>,
    ) -> Result<http::Response<ProxyBody>, Infallible> {
        let path = req.uri().path().to_owned();
        let req = if has_unary_request(&path) {
            // Collected, the request goes out as HEADERS and DATA in one
            // write instead of a second wake-up to pump the body.
            let (parts, body) = req.into_parts();
            match body.collect().await {
                Ok(body) => {
                    http::Request::from_parts(parts, Either::Right(Full::new(body.to_bytes())))
                }
                Err(err) => {
                    let msg = format!("criguard: reading the request body: {err}");
                    let resp: http::Response<Empty<Bytes>> =
                        tonic::Status::cancelled(msg).into_http();
                    return Ok(resp.map(Either::Right));
                }
            }
        } else {
            req.map(Either::Left)
        };
        match self.upstream.send(req).await {
            Ok(resp) => Ok(resp.map(Either::Left)),
            Err(err) => {
                let msg = format!(
                    "criguard: runtime {} unavailable: {}",
                    self.endpoint,
                    error_chain(&err)
                );
                tracing::debug!(%path, %msg, "upstream call failed");
                let resp: http::Response<Empty<Bytes>> =
                    tonic::Status::unavailable(msg).into_http();
                Ok(resp.map(Either::Right))
            }
        }
    }
}

/// Whether every method under `path`'s service takes a single request
/// message: true for the CRI services (no CRI method streams its request),
/// false for paths criguard does not know, which may stream.
pub fn has_unary_request(path: &str) -> bool {
    [
        "/runtime.v1.RuntimeService/",
        "/runtime.v1.ImageService/",
        "/runtime.v1alpha2.RuntimeService/",
        "/runtime.v1alpha2.ImageService/",
    ]
    .iter()
    .any(|service| path.starts_with(service))
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
