//! Forwarding one call.
//!
//! The handler takes the kubelet's `http::Request`, sends it over the shared
//! raw connection and returns the runtime's `http::Response` with its body
//! still streaming. Nothing is decoded, so the cost per call is one extra
//! HTTP/2 hop over a unix socket. The few lifecycle methods criguard observes
//! ([`super::observe`]) are the exception: their request and answer are held
//! whole (they are single small messages), looked at, and replayed.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;

use super::observe::{self, Method, Observer};
use crate::metrics::{CriMetrics, Metered, Metrics};
use crate::runtime::Upstream;
use crate::runtime::raw::RawUpstream;

/// Response bodies: the runtime's stream, or a body criguard holds (an
/// observed answer replayed, or a trailers-only gRPC status of its own).
pub type ProxyBody = Either<Incoming, Replay>;

/// A body held in memory: optional data, then optional trailers.
#[derive(Debug, Default)]
pub struct Replay {
    data: Option<Bytes>,
    trailers: Option<http::HeaderMap>,
}

impl http_body::Body for Replay {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        if let Some(data) = self.data.take() {
            return std::task::Poll::Ready(Some(Ok(http_body::Frame::data(data))));
        }
        std::task::Poll::Ready(
            self.trailers
                .take()
                .map(|t| Ok(http_body::Frame::trailers(t))),
        )
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }
}

/// Forwards calls to the runtime. Cheap to clone; clones share the connection.
#[derive(Clone, Debug)]
pub struct Proxy {
    upstream: Arc<RawUpstream>,
    endpoint: Arc<str>,
    observer: Option<Observer>,
    metrics: CriMetrics,
}

fn status_response(status: tonic::Status) -> http::Response<ProxyBody> {
    status.into_http::<Replay>().map(Either::Right)
}

/// The gRPC status code of an answer: trailers, else headers (trailers-only).
fn grpc_status(headers: &http::HeaderMap, trailers: Option<&http::HeaderMap>) -> Option<i32> {
    trailers
        .and_then(|t| t.get("grpc-status"))
        .or_else(|| headers.get("grpc-status"))
        .and_then(|v| v.to_str().ok()?.parse().ok())
}

impl Proxy {
    /// A proxy that forwards to `upstream` and observes nothing.
    pub fn new(upstream: &Upstream) -> Self {
        Self {
            upstream: upstream.raw(),
            endpoint: upstream.endpoint().to_string().into(),
            observer: None,
            metrics: Metrics::new().cri,
        }
    }

    /// The same proxy, recording its calls in `metrics`.
    pub fn with_metrics(mut self, metrics: CriMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The same proxy, also feeding `observer`.
    pub fn with_observer(mut self, observer: Observer) -> Self {
        self.observer = Some(observer);
        self
    }

    fn unavailable(
        &self,
        path: &str,
        err: &(dyn std::error::Error + 'static),
    ) -> http::Response<ProxyBody> {
        let msg = format!(
            "criguard: runtime {} unavailable: {}",
            self.endpoint,
            error_chain(err)
        );
        tracing::debug!(%path, %msg, "upstream call failed");
        status_response(tonic::Status::unavailable(msg))
    }

    /// Forwards an observed call: the request and answer are held whole so
    /// that the observer can read them (and patch the request).
    async fn forward_observed(
        &self,
        observer: &Observer,
        method: Method,
        req: http::Request<Incoming>,
    ) -> http::Response<ProxyBody> {
        let path = req.uri().path().to_owned();
        let (mut parts, body) = req.into_parts();
        let body = match body.collect().await {
            Ok(b) => b.to_bytes(),
            Err(err) => {
                return status_response(tonic::Status::cancelled(format!(
                    "criguard: reading the request: {err}"
                )));
            }
        };
        // The message as forwarded (patched where criguard patches it): the
        // model records what the runtime was asked for.
        let mut forwarded = observe::single_message(&body).map(Bytes::copy_from_slice);
        let plan = match &forwarded {
            Some(m) => guarded(method, || observer.on_request(method, m)).unwrap_or_default(),
            None => observe::RequestPlan::default(),
        };
        if let Some(why) = plan.refuse {
            return status_response(tonic::Status::resource_exhausted(format!(
                "criguard: {why}"
            )));
        }
        let outgoing = match (&forwarded, plan.patch) {
            (Some(m), Some(patch)) => {
                // The body grows: a content-length (grpc-go sends none,
                // other clients may) must not promise the old size.
                parts.headers.remove(http::header::CONTENT_LENGTH);
                let framed = observe::frame(m, Some(&patch));
                forwarded = Some(framed.slice(5..));
                framed
            }
            _ => body,
        };
        let req = http::Request::from_parts(parts, Either::Right(Full::new(outgoing)));
        let resp = match self.upstream.send(req).await {
            Ok(resp) => resp,
            Err(err) => return self.unavailable(&path, &err),
        };
        let (parts, body) = resp.into_parts();
        let collected = match body.collect().await {
            Ok(c) => c,
            Err(err) => return self.unavailable(&path, &err),
        };
        let trailers = collected.trailers().cloned();
        let data = collected.to_bytes();
        if grpc_status(&parts.headers, trailers.as_ref()) == Some(0)
            && let (Some(req_msg), Some(resp_msg)) = (&forwarded, observe::single_message(&data))
        {
            guarded(method, || observer.on_response(method, req_msg, resp_msg));
        }
        let data = (!data.is_empty()).then_some(data);
        http::Response::from_parts(parts, Either::Right(Replay { data, trailers }))
    }

    /// Forwards one request and returns the runtime's response unchanged.
    /// When the runtime cannot be reached the answer is a gRPC `UNAVAILABLE`
    /// status naming the endpoint, never an HTTP error, so gRPC clients see
    /// the same code as when the runtime itself is down.
    pub async fn forward(
        &self,
        req: http::Request<Incoming>,
    ) -> Result<http::Response<Metered<ProxyBody>>, Infallible> {
        let started = Instant::now();
        let path = req.uri().path().to_owned();
        let Ok(resp) = self.forward_unmetered(req).await;
        let code = grpc_status(resp.headers(), None);
        let metrics = self.metrics.clone();
        Ok(resp.map(|body| Metered::new(body, metrics, path, started, code)))
    }

    async fn forward_unmetered(
        &self,
        req: http::Request<Incoming>,
    ) -> Result<http::Response<ProxyBody>, Infallible> {
        let path = req.uri().path().to_owned();
        if let Some(observer) = &self.observer
            && let Some(method) = Method::from_path(&path)
        {
            return Ok(self.forward_observed(observer, method, req).await);
        }
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
                    return Ok(status_response(tonic::Status::cancelled(msg)));
                }
            }
        } else {
            req.map(Either::Left)
        };
        match self.upstream.send(req).await {
            Ok(resp) => Ok(resp.map(Either::Left)),
            Err(err) => Ok(self.unavailable(&path, &err)),
        }
    }
}

/// Runs observer code so that a bug in it can never fail the kubelet's
/// call: a panic is logged and the call goes on as plain forwarding.
fn guarded<T>(method: Method, f: impl FnOnce() -> T) -> Option<T> {
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
