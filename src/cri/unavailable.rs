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
//!
//! The same responder refuses a connection criguard will not relay (at
//! its connection limit, or out of file descriptors, see [`refuse`]): the
//! client's first call is answered `UNAVAILABLE` with the reason, then
//! GOAWAY carries the reason too and the connection ends.
//!
//! Its memory is bounded: header blocks are read only up to
//! [`SMALL_BLOCK`] bytes (past it the call is still answered, its path
//! unknown), a block over [`MAX_HEADER_LIST`] ends the connection with
//! GOAWAY PROTOCOL_ERROR as the runtime's server would, and the client is
//! not read while [`HIGH_WATER`] bytes of answers wait for it.

use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;

use super::budget::SMALL_BLOCK;
use super::conn::MAX_HEADER_LIST;
use super::frame::{self, error, flag, kind};
use super::headers::{self, Reader};
use super::methods;
use super::out::{Out, write_some};
use super::proxy::Proxy;
use super::pump::HIGH_WATER;

/// How often an idle connection answered unavailable checks for the runtime.
pub const PROBE: Duration = Duration::from_millis(250);
/// How long a refused connection waits for its first call.
pub const REFUSE_WAIT: Duration = Duration::from_secs(5);

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
    preface: frame::Preface,
    block: Vec<u8>,
    /// Bytes of the block in progress, kept or not.
    block_len: usize,
    block_stream: u32,
    reader: Reader,
    last_stream: u32,
}

impl Client {
    fn new() -> Self {
        Self {
            preface: frame::Preface::expected(),
            block: Vec::new(),
            block_len: 0,
            block_stream: 0,
            reader: Reader::new(),
            last_stream: 0,
        }
    }
}

impl Client {
    fn parse(&mut self, input: &mut BytesMut, out: &mut Out) -> Parsed {
        let mut parsed = Parsed::default();
        if self.preface.take(input).is_some() && !self.preface.passed() {
            return parsed;
        }
        while let Some((head, f)) = frame::next_frame(input, frame::DEFAULT_MAX_FRAME) {
            let Some(f) = f else {
                out.push(frame::goaway(self.last_stream, error::FRAME_SIZE_ERROR));
                parsed.end = true;
                return parsed;
            };
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
                        self.block = Vec::new();
                        self.block_len = 0;
                        self.block_stream = head.stream;
                    }
                    if let Some(frag) = frame::block_fragment(&head, payload) {
                        self.block_len += frag.len();
                        if self.block_len > MAX_HEADER_LIST {
                            let debug =
                                format!("criguard: header block over {MAX_HEADER_LIST} bytes");
                            out.push(frame::goaway_with(
                                self.last_stream,
                                error::PROTOCOL_ERROR,
                                debug.as_bytes(),
                            ));
                            parsed.end = true;
                            return parsed;
                        }
                        if self.block_len <= SMALL_BLOCK {
                            self.block.extend_from_slice(frag);
                        } else if !self.block.is_empty() {
                            // Not kept: the table is out of step from here.
                            self.block = Vec::new();
                            self.reader.set_broken();
                        }
                    }
                    if head.has(flag::END_HEADERS) {
                        let fields = self.reader.read(&std::mem::take(&mut self.block));
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
    client: UnixStream,
    proxy: Proxy,
    why: std::io::Error,
    drain: CancellationToken,
) {
    let msg = format!("criguard: runtime {} unavailable: {why}", proxy.endpoint());
    tracing::debug!(%msg, "serving a kubelet connection without a runtime");
    respond(client, proxy, msg, Mode::RuntimeDown, drain).await;
}

/// Refuses `client`: its first call is answered `UNAVAILABLE` with `msg`,
/// then GOAWAY (with `msg` as debug data) ends the connection; so does a
/// wait of [`REFUSE_WAIT`] for a call.
pub async fn refuse(client: UnixStream, proxy: Proxy, msg: String, drain: CancellationToken) {
    respond(client, proxy, msg, Mode::Refuse, drain).await;
}

/// Why calls are answered rather than relayed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The runtime is down: every call until it is back.
    RuntimeDown,
    /// criguard will not relay this connection: its first call.
    Refuse,
}

/// How long what is queued for the client may take once the connection
/// is ending.
const FINAL_FLUSH: Duration = Duration::from_secs(1);

/// What the responder says on one connection, and how far it got.
struct Answers {
    proxy: Proxy,
    msg: String,
    mode: Mode,
    /// Frames waiting for the client.
    out: Out,
    /// The last stream answered.
    answered: u32,
    /// A GOAWAY is queued: nothing more is read.
    closing: bool,
}

impl Answers {
    /// Ends the connection: a GOAWAY naming the last call answered (with
    /// the reason when refusing).
    fn close(&mut self) {
        let f = match self.mode {
            Mode::RuntimeDown => frame::goaway(self.answered, error::NO_ERROR),
            Mode::Refuse => frame::goaway_with(self.answered, error::NO_ERROR, self.msg.as_bytes()),
        };
        self.out.push(f);
        self.closing = true;
    }

    /// Answers `calls` UNAVAILABLE, in order, until the runtime is back
    /// (the rest unprocessed: the client retries them on a new
    /// connection), or, when refusing, after the first.
    async fn answer(&mut self, calls: Vec<(u32, String)>) {
        for (stream, path) in calls {
            if self.mode == Mode::RuntimeDown && runtime_up(&self.proxy).await {
                self.close();
                break;
            }
            let code = tonic::Code::Unavailable as i32;
            self.out.push(headers::trailers_only(
                stream,
                code,
                &self.msg,
                frame::DEFAULT_MAX_FRAME,
            ));
            self.proxy
                .record(methods::lookup(&path), code, Instant::now());
            self.answered = stream;
            if self.mode == Mode::Refuse {
                self.close();
                break;
            }
        }
    }
}

async fn respond(
    mut client: UnixStream,
    proxy: Proxy,
    msg: String,
    mode: Mode,
    drain: CancellationToken,
) {
    let (mut r, mut w) = client.split();
    let mut a = Answers {
        proxy,
        msg,
        mode,
        out: Out::default(),
        answered: 0,
        closing: false,
    };
    a.out.push(frame::build(kind::SETTINGS, 0, 0, &[]));
    let mut state = Client::new();
    let mut input = BytesMut::with_capacity(16 << 10);
    let mut probe = tokio::time::interval(PROBE);
    let give_up = tokio::time::sleep(REFUSE_WAIT);
    tokio::pin!(give_up);
    if drain.is_cancelled() {
        a.close();
    }
    let flushed = tokio::time::sleep(Duration::MAX);
    tokio::pin!(flushed);
    let mut flush_armed = false;
    loop {
        if a.closing && a.out.is_empty() {
            return;
        }
        if a.closing && !flush_armed {
            flush_armed = true;
            flushed
                .as_mut()
                .reset(tokio::time::Instant::now() + FINAL_FLUSH);
        }
        tokio::select! {
            biased;
            read = r.read_buf(&mut input), if !a.closing && a.out.len() < HIGH_WATER => {
                if !matches!(read, Ok(n) if n > 0) {
                    return;
                }
                let parsed = state.parse(&mut input, &mut a.out);
                a.answer(parsed.calls).await;
                a.closing |= parsed.end;
            }
            written = write_some(&mut w, &mut a.out), if !a.out.is_empty() => {
                if written.is_err() {
                    return;
                }
            }
            () = &mut flushed, if flush_armed => return,
            _ = probe.tick(), if !a.closing && a.mode == Mode::RuntimeDown => {
                if runtime_up(&a.proxy).await {
                    a.close();
                }
            }
            () = &mut give_up, if !a.closing && a.mode == Mode::Refuse => a.close(),
            () = drain.cancelled(), if !a.closing => a.close(),
        }
    }
}
