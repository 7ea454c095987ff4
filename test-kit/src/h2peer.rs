//! HTTP/2 peers from the `h2` crate, with the flow-control settings a test
//! chooses. `h2` checks flow control strictly on both ends: a peer that
//! sends past a window gets FLOW_CONTROL_ERROR, and one that never gets its
//! credit back stalls, so a test that finishes shows the relay's
//! accounting exact.

use std::path::Path;

use bytes::{Bytes, BytesMut};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;

/// Flow-control settings of a peer.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// SETTINGS_INITIAL_WINDOW_SIZE.
    pub stream_window: u32,
    /// The connection window it grants (at least 65 535).
    pub conn_window: u32,
    /// SETTINGS_MAX_FRAME_SIZE.
    pub max_frame: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            stream_window: 65_535,
            conn_window: 65_535,
            max_frame: 16_384,
        }
    }
}

/// A request as the upstream received it.
#[derive(Debug)]
pub struct Seen {
    /// `:path`.
    pub path: String,
    /// Request headers.
    pub headers: http::HeaderMap,
    /// The body, or how reading it failed (e.g. the stream was reset).
    pub body: Result<Bytes, String>,
}

/// Reads a whole body, returning the credit as it goes.
async fn read_body(mut body: h2::RecvStream) -> Result<Bytes, h2::Error> {
    let mut all = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        all.extend_from_slice(&chunk);
    }
    Ok(all.freeze())
}

/// A fake runtime answering every call with one message and status 0, and
/// reporting what it received.
pub struct Upstream {
    /// Requests, in the order they completed.
    pub seen: mpsc::UnboundedReceiver<Seen>,
}

impl Upstream {
    /// The next request to `path` (others, e.g. criguard's own calls, are skipped).
    pub async fn next(&mut self, path: &str) -> Seen {
        loop {
            let seen = self.seen.recv().await.expect("upstream stopped");
            if seen.path == path {
                return seen;
            }
        }
    }

    /// Serves on `path`; each answer's message is `answer(&seen)`.
    pub fn start(path: &Path, settings: Settings, answer: fn(&Seen) -> Bytes) -> Self {
        let listener = UnixListener::bind(path).expect("bind upstream");
        let (tx, seen) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::Builder::new()
                        .initial_window_size(settings.stream_window)
                        .initial_connection_window_size(settings.conn_window)
                        .max_frame_size(settings.max_frame)
                        .max_header_list_size(1 << 20)
                        .handshake::<_, Bytes>(sock)
                        .await
                    else {
                        return; // a peer that went away at once
                    };
                    while let Some(accepted) = conn.accept().await {
                        let Ok((req, mut respond)) = accepted else {
                            return;
                        };
                        let tx = tx.clone();
                        tokio::spawn(async move {
                            let (parts, body) = req.into_parts();
                            let seen = Seen {
                                path: parts.uri.path().to_owned(),
                                headers: parts.headers,
                                body: read_body(body).await.map_err(|e| e.to_string()),
                            };
                            if seen.body.is_ok() {
                                let resp = http::Response::builder()
                                    .header("content-type", "application/grpc")
                                    .body(())
                                    .unwrap();
                                if let Ok(mut send) = respond.send_response(resp, false) {
                                    let _ = send
                                        .send_data(super::rawgrpc::frame(&answer(&seen)), false);
                                    let mut t = http::HeaderMap::new();
                                    t.insert("grpc-status", "0".parse().unwrap());
                                    let _ = send.send_trailers(t);
                                }
                            }
                            let _ = tx.send(seen);
                        });
                    }
                });
            }
        });
        Self { seen }
    }
}

/// A client connection to `path`.
pub async fn connect(path: &Path, settings: Settings) -> h2::client::SendRequest<Bytes> {
    let sock = UnixStream::connect(path).await.expect("connect");
    let (send, conn) = h2::client::Builder::new()
        .initial_window_size(settings.stream_window)
        .initial_connection_window_size(settings.conn_window)
        .max_frame_size(settings.max_frame)
        .handshake(sock)
        .await
        .expect("client handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    send
}

/// What a call returned.
#[derive(Debug)]
pub struct Answer {
    /// Response headers.
    pub headers: http::HeaderMap,
    /// Body bytes.
    pub body: Bytes,
    /// Trailers (empty for a trailers-only answer).
    pub trailers: http::HeaderMap,
}

impl Answer {
    /// grpc-status from the trailers, or the headers of a trailers-only answer.
    pub fn grpc_status(&self) -> Option<&str> {
        self.trailers
            .get("grpc-status")
            .or_else(|| self.headers.get("grpc-status"))
            .and_then(|v| v.to_str().ok())
    }
}

/// Calls `path` with `body` sent in DATA chunks of `chunk` bytes, and
/// `headers` as metadata; a call that stalls for 20 s fails (lost credit
/// stalls a stream forever).
pub async fn call(
    send: &mut h2::client::SendRequest<Bytes>,
    path: &str,
    headers: &[(&str, String)],
    body: Bytes,
    chunk: usize,
) -> Result<Answer, String> {
    tokio::time::timeout(
        std::time::Duration::from_secs(20),
        call_unbounded(send, path, headers, body, chunk),
    )
    .await
    .map_err(|_| format!("{path}: stalled for 20 s"))?
    .map_err(|e| format!("{path}: {e}"))
}

async fn call_unbounded(
    send: &mut h2::client::SendRequest<Bytes>,
    path: &str,
    headers: &[(&str, String)],
    body: Bytes,
    chunk: usize,
) -> Result<Answer, h2::Error> {
    let mut req = http::Request::post(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let mut ready = send.clone().ready().await?;
    let (resp, mut stream) = ready.send_request(req.body(()).unwrap(), false)?;
    let mut rest = body;
    loop {
        let piece = rest.split_to(rest.len().min(chunk));
        let last = rest.is_empty();
        stream.send_data(piece, last)?;
        if last {
            break;
        }
    }
    let (parts, mut recv) = resp.await?.into_parts();
    let mut all = BytesMut::new();
    while let Some(chunk) = recv.data().await {
        let chunk = chunk?;
        let _ = recv.flow_control().release_capacity(chunk.len());
        all.extend_from_slice(&chunk);
    }
    let trailers = recv.trailers().await?.unwrap_or_default();
    Ok(Answer {
        headers: parts.headers,
        body: all.freeze(),
        trailers,
    })
}
