//! A raw gRPC peer for byte-level checks: a client that sends exact bytes and
//! a recording upstream that answers with exact bytes, both over HTTP/2 on
//! unix sockets, neither using criguard's proto types.

use std::path::Path;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Mutex, mpsc};

/// Wraps a message in the 5-byte gRPC length prefix.
pub fn frame(msg: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(msg.len() + 5);
    out.extend_from_slice(&[0]);
    out.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    out.extend_from_slice(msg);
    out.freeze()
}

/// Appends a length-delimited field with a number no CRI message uses.
pub fn with_unknown_field(msg: &[u8], field: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = msg.to_vec();
    prost::encoding::encode_key(field, prost::encoding::WireType::LengthDelimited, &mut out);
    prost::encoding::encode_varint(payload.len() as u64, &mut out);
    out.extend_from_slice(payload);
    out
}

/// What a raw client got back.
#[derive(Debug)]
pub struct RawResponse {
    /// Response headers.
    pub headers: http::HeaderMap,
    /// The body bytes, frames included.
    pub body: Bytes,
    /// Trailers (grpc-status, grpc-message, custom trailing metadata).
    pub trailers: http::HeaderMap,
}

impl RawResponse {
    /// The grpc-status, from trailers or (trailers-only answers) headers.
    pub fn grpc_status(&self) -> Option<String> {
        self.trailers
            .get("grpc-status")
            .or_else(|| self.headers.get("grpc-status"))
            .map(|v| v.to_str().unwrap().to_owned())
    }

    /// The grpc-message, from trailers or headers.
    pub fn grpc_message(&self) -> Option<String> {
        self.trailers
            .get("grpc-message")
            .or_else(|| self.headers.get("grpc-message"))
            .map(|v| v.to_str().unwrap().to_owned())
    }
}

/// An HTTP/2 connection to a unix socket.
pub async fn connect(path: &Path) -> hyper::client::conn::http2::SendRequest<ReqBody> {
    connect_stream(UnixStream::connect(path).await.expect("connect")).await
}

/// An HTTP/2 connection over an already connected stream.
pub async fn connect_stream(
    stream: UnixStream,
) -> hyper::client::conn::http2::SendRequest<ReqBody> {
    let io = TokioIo::new(stream);
    let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
        .await
        .expect("h2 handshake");
    tokio::spawn(conn);
    send
}

/// A gRPC request with the given extra headers.
pub fn request(path: &str, body: Bytes, headers: &[(&str, &str)]) -> http::Request<ReqBody> {
    let mut req = http::Request::post(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(ReqBody {
        data: Some(body),
        exact: false,
    })
    .unwrap()
}

/// The same request with a `content-length` header, which hyper adds for
/// a body of known size (gRPC clients send none).
pub fn with_content_length(req: http::Request<ReqBody>) -> http::Request<ReqBody> {
    req.map(|b| ReqBody { exact: true, ..b })
}

/// A request body of one chunk; its size is announced only when `exact`.
#[derive(Debug)]
pub struct ReqBody {
    data: Option<Bytes>,
    exact: bool,
}

impl http_body::Body for ReqBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.data.take().map(|d| Ok(Frame::data(d))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match (&self.data, self.exact) {
            (Some(d), true) => http_body::SizeHint::with_exact(d.len() as u64),
            (None, _) => http_body::SizeHint::with_exact(0),
            (Some(_), false) => http_body::SizeHint::default(),
        }
    }
}

/// A gRPC request to `path` carrying one empty message and no extra headers.
pub fn empty_request(path: &str) -> http::Request<ReqBody> {
    request(path, frame(b""), &[])
}

/// Sends one request and collects the whole answer.
pub async fn call(
    send: &mut hyper::client::conn::http2::SendRequest<ReqBody>,
    req: http::Request<ReqBody>,
) -> RawResponse {
    send.ready().await.expect("ready");
    let resp = send.send_request(req).await.expect("send");
    let (parts, body) = resp.into_parts();
    let collected = body.collect().await.expect("collect");
    let trailers = collected.trailers().cloned().unwrap_or_default();
    RawResponse {
        headers: parts.headers,
        body: collected.to_bytes(),
        trailers,
    }
}

/// A request as the recording upstream saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The `:path`.
    pub path: String,
    /// All request headers.
    pub headers: http::HeaderMap,
    /// The request body, frames included.
    pub body: Bytes,
}

/// How the recording upstream answers one call.
pub enum Reply {
    /// Headers, body bytes, then trailers.
    Unary {
        /// Extra response headers.
        headers: Vec<(&'static str, String)>,
        /// Body bytes (already framed).
        body: Bytes,
        /// Trailers, grpc-status included.
        trailers: Vec<(&'static str, String)>,
    },
    /// Frames sent one by one as the receiver yields them, then status 0.
    Stream(mpsc::Receiver<Bytes>),
    /// The inner reply, once `barrier` has been reached by enough calls.
    AfterBarrier(Arc<tokio::sync::Barrier>, Box<Reply>),
    /// The inner reply, once the watched value is true (every call so
    /// answered waits for the one release).
    AfterRelease(tokio::sync::watch::Receiver<bool>, Box<Reply>),
}

type Responder = dyn Fn(&Recorded) -> Reply + Send + Sync;

/// A fake runtime that records every request and answers as told.
pub struct RecordingUpstream {
    /// Requests seen, in arrival order.
    pub seen: mpsc::UnboundedReceiver<Recorded>,
}

impl RecordingUpstream {
    /// Serves on `path` with `respond` deciding each answer.
    pub fn start(
        path: &Path,
        respond: impl Fn(&Recorded) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let listener = UnixListener::bind(path).expect("bind upstream");
        let (tx, seen) = mpsc::unbounded_channel();
        let respond: Arc<Responder> = Arc::new(respond);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let tx = tx.clone();
                let respond = respond.clone();
                let service =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let tx = tx.clone();
                        let respond = respond.clone();
                        async move {
                            let (parts, body) = req.into_parts();
                            // A broken request body is answered, not panicked
                            // on, so that a test fails instead of hanging.
                            let body = match body.collect().await {
                                Ok(b) => b.to_bytes(),
                                Err(err) => Bytes::from(format!("BROKEN REQUEST BODY: {err}")),
                            };
                            let rec = Recorded {
                                path: parts.uri.path().to_owned(),
                                headers: parts.headers,
                                body,
                            };
                            let mut reply = respond(&rec);
                            let _ = tx.send(rec);
                            let reply = loop {
                                reply = match reply {
                                    Reply::AfterBarrier(barrier, inner) => {
                                        barrier.wait().await;
                                        *inner
                                    }
                                    Reply::AfterRelease(mut released, inner) => {
                                        let _ = released.wait_for(|r| *r).await;
                                        *inner
                                    }
                                    other => break other,
                                };
                            };
                            Ok::<_, std::convert::Infallible>(reply_to_response(reply))
                        }
                    });
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .auto_date_header(false)
                        // Each call criguard refuses reaches the runtime as
                        // HEADERS then RST_STREAM; h2's rapid-reset guard (20
                        // reset before accepted, then GOAWAY) trips on a
                        // refusal flood when this server lags under load.
                        // (tests/bounds.rs floods a real containerd alike.)
                        .max_pending_accept_reset_streams(usize::MAX)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { seen }
    }
}

type BoxBody = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

fn reply_to_response(reply: Reply) -> http::Response<BoxBody> {
    match reply {
        Reply::AfterBarrier(..) | Reply::AfterRelease(..) => unreachable!("awaited before"),
        Reply::Unary {
            headers,
            body,
            trailers,
        } => {
            let mut b = http::Response::builder().header("content-type", "application/grpc");
            for (k, v) in headers {
                b = b.header(k, v);
            }
            let mut t = http::HeaderMap::new();
            for (k, v) in trailers {
                t.insert(k, v.parse().unwrap());
            }
            let frames = futures::stream::iter(vec![
                Ok::<_, std::convert::Infallible>(Frame::data(body)),
                Ok(Frame::trailers(t)),
            ]);
            b.body(BodyExt::boxed(StreamBody::new(frames))).unwrap()
        }
        Reply::Stream(rx) => {
            let state = Arc::new(Mutex::new(Some(rx)));
            let frames = futures::stream::unfold(state, |state| async move {
                let mut guard = state.lock().await;
                let rx = guard.as_mut()?;
                match rx.recv().await {
                    Some(bytes) => {
                        drop(guard);
                        Some((Ok(Frame::data(bytes)), state))
                    }
                    None => {
                        *guard = None;
                        drop(guard);
                        let mut t = http::HeaderMap::new();
                        t.insert("grpc-status", "0".parse().unwrap());
                        Some((Ok(Frame::trailers(t)), state))
                    }
                }
            });
            http::Response::builder()
                .header("content-type", "application/grpc")
                .body(BodyExt::boxed(StreamBody::new(frames)))
                .unwrap()
        }
    }
}
