//! Serving a kubelet connection while the runtime cannot be reached.
//!
//! With no runtime to relay to, criguard is the HTTP/2 server of the
//! connection itself: it sends its SETTINGS, acknowledges the client's
//! SETTINGS and PINGs, returns flow-control credit, and answers every call
//! at once with a trailers-only `UNAVAILABLE` naming the endpoint, as a
//! gRPC client sees when the runtime itself is down. Such a connection
//! cannot be spliced onto a runtime that comes back (HPACK and SETTINGS
//! state differ), so once the runtime answers again criguard ends it with
//! GOAWAY: a call that arrives then is left unprocessed (a gRPC client
//! retries it on a new connection at once), and an idle connection is
//! ended by a probe every [`PROBE`].

use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;
use tokio::sync::watch;

use super::frame::{self, Head, error, flag, kind};
use super::headers::{self, Reader};
use super::methods;
use super::out::{Out, write_some};
use super::proxy::Proxy;

/// How often an idle stand-in connection checks for the runtime.
pub const PROBE: Duration = Duration::from_millis(250);

/// Whether the runtime accepts connections now.
pub async fn runtime_up(proxy: &Proxy) -> bool {
    UnixStream::connect(proxy.endpoint().path()).await.is_ok()
}

/// What the client's bytes asked for.
#[derive(Default)]
struct Parsed {
    /// New calls (stream id and path), in order.
    calls: Vec<(u32, String)>,
    /// The client sent GOAWAY or broke the protocol.
    end: bool,
}

/// The parsing state of the client's bytes.
struct Client {
    preface: usize,
    block: Vec<u8>,
    block_stream: u32,
    reader: Reader,
    last_stream: u32,
}

impl Client {
    fn parse(&mut self, input: &mut BytesMut, out: &mut Out) -> Parsed {
        let mut parsed = Parsed::default();
        if self.preface > 0 {
            let n = self.preface.min(input.len());
            let _ = input.split_to(n);
            self.preface -= n;
            if self.preface > 0 {
                return parsed;
            }
        }
        while input.len() >= frame::HEADER_LEN {
            let head = Head::parse(input);
            if head.len > frame::DEFAULT_MAX_FRAME {
                out.push(frame::goaway(self.last_stream, error::FRAME_SIZE_ERROR));
                parsed.end = true;
                return parsed;
            }
            let total = frame::HEADER_LEN + head.len as usize;
            if input.len() < total {
                return parsed;
            }
            let f = input.split_to(total);
            let payload = &f[frame::HEADER_LEN..];
            match head.kind {
                kind::SETTINGS if !head.has(flag::ACK) => {
                    out.push(frame::build(kind::SETTINGS, flag::ACK, 0, &[]));
                }
                kind::PING if !head.has(flag::ACK) => {
                    out.push(frame::build(kind::PING, flag::ACK, 0, payload));
                }
                kind::DATA if head.len > 0 => out.push(frame::window_update(0, head.len)),
                kind::HEADERS | kind::CONTINUATION => {
                    if head.kind == kind::HEADERS {
                        self.block.clear();
                        self.block_stream = head.stream;
                    }
                    if let Some(frag) = frame::block_fragment(&head, payload) {
                        self.block.extend_from_slice(frag);
                    }
                    if head.has(flag::END_HEADERS) {
                        let fields = self.reader.read(&self.block);
                        if self.block_stream > self.last_stream {
                            self.last_stream = self.block_stream;
                            let path = fields.and_then(|f| f.path).unwrap_or_default();
                            parsed.calls.push((self.block_stream, path));
                        }
                    }
                }
                kind::GOAWAY => parsed.end = true,
                _ => {}
            }
        }
        parsed
    }
}

/// Serves `client` as described in the module docs; `why` is the dial error.
pub async fn serve(
    mut client: UnixStream,
    proxy: Proxy,
    why: std::io::Error,
    mut drain: watch::Receiver<bool>,
) {
    let msg = format!("criguard: runtime {} unavailable: {why}", proxy.endpoint());
    tracing::debug!(%msg, "serving a kubelet connection without a runtime");
    let (mut r, mut w) = client.split();
    let mut out = Out::default();
    out.push(frame::build(kind::SETTINGS, 0, 0, &[]));
    let mut state = Client {
        preface: frame::PREFACE.len(),
        block: Vec::new(),
        block_stream: 0,
        reader: Reader::new(),
        last_stream: 0,
    };
    let mut answered = 0u32;
    let mut input = BytesMut::with_capacity(16 << 10);
    let mut probe = tokio::time::interval(PROBE);
    let mut closing = *drain.borrow_and_update();
    if closing {
        out.push(frame::goaway(0, error::NO_ERROR));
    }
    loop {
        if closing && out.is_empty() {
            return;
        }
        tokio::select! {
            biased;
            read = r.read_buf(&mut input), if !closing => {
                if !matches!(read, Ok(n) if n > 0) {
                    return;
                }
                let parsed = state.parse(&mut input, &mut out);
                for (stream, path) in parsed.calls {
                    if runtime_up(&proxy).await {
                        // Unprocessed: the client retries it on a new connection.
                        out.push(frame::goaway(answered, error::NO_ERROR));
                        closing = true;
                        break;
                    }
                    out.push(headers::trailers_only(stream, 14, &msg, frame::DEFAULT_MAX_FRAME));
                    proxy.record(methods::lookup(&path), 14, Instant::now());
                    answered = stream;
                }
                closing |= parsed.end;
            }
            written = write_some(&mut w, &mut out), if !out.is_empty() => {
                if written.is_err() {
                    return;
                }
            }
            _ = probe.tick(), if !closing => {
                if runtime_up(&proxy).await {
                    out.push(frame::goaway(answered, error::NO_ERROR));
                    closing = true;
                }
            }
            _ = drain.changed(), if !closing => {
                out.push(frame::goaway(answered, error::NO_ERROR));
                closing = true;
            }
        }
    }
}
