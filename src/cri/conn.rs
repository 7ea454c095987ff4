//! One kubelet connection relayed to one runtime connection, as a state
//! machine over the bytes each side sends (no I/O here: [`super::pump`]
//! moves the bytes).
//!
//! Frames pass as they are, in order, each read whole and forwarded as the
//! slice it was read into. criguard reads the 9-byte header of every frame
//! and the payload of a few: header blocks (decoded by a shadow HPACK
//! decoder per direction, to learn each stream's `:path` and its answer's
//! `grpc-status`), SETTINGS and WINDOW_UPDATE (flow-control accounting),
//! and the DATA of observed streams (see [`super::held`]). It validates
//! nothing the runtime would accept; a frame larger than the receiving
//! peer allows ends the connection with GOAWAY, as the peer itself would.
//!
//! A header block is held until its END_HEADERS, and no longer than
//! [`MAX_HEADER_LIST`] bytes: the header list size containerd's gRPC
//! server accepts (grpc-go's default, which containerd keeps). A client's
//! block past it ends the connection with GOAWAY PROTOCOL_ERROR, as
//! golang.org/x/net/http2 (under grpc-go) ends one whose CONTINUATION
//! frames go past the limit; the runtime would refuse the call too. The
//! bytes of a block beyond [`SMALL_BLOCK`] come from the relay's shared
//! [`super::budget::Budget`]; while it has none to spare, that client is
//! not read. A block reserves its whole cap when it grows past
//! [`SMALL_BLOCK`], so that blocks never wait for each other: at most
//! budget ÷ 16 MiB large blocks are received at once (4 by default).

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use super::budget::{self, BLOCKS_REFUSED, Charge, SMALL_BLOCK};
use super::flow::ToServer;
use super::frame::{self, Head, error, flag, kind, setting};
use super::headers::{Fields, Reader};
use super::held::{Held, Next, Observed, Settle, Verdict};
use super::methods::{self, MethodInfo};
use super::out::Out;
use super::proxy::Proxy;
use crate::lograte::LogRate;

/// The two byte queues of a connection, one per peer.
#[derive(Debug, Default)]
pub struct Io {
    /// Bytes for the runtime.
    pub to_server: Out,
    /// Bytes for the kubelet.
    pub to_client: Out,
}

/// How long criguard's own answer waits for the runtime's next header
/// block after the client shrank its header table (RFC 7541 §4.2 wants
/// the size update at the start of the first block after the change).
const ANSWER_WAIT: Duration = Duration::from_secs(1);
/// The most streams criguard remembers having answered itself.
const ANSWERED_CAP: usize = 1024;
/// The largest header block criguard holds: grpc-go's default server
/// `MaxHeaderListSize` (`defaultServerMaxHeaderListSize`, 16 MiB), which
/// containerd's CRI server does not change. Encoders use Huffman only
/// where it is shorter, so a block's encoded size is at most its header
/// list size: a block over this many bytes is one the runtime refuses.
pub const MAX_HEADER_LIST: usize = 16 << 20;
/// Bytes waiting for the runtime's windows above which the client is not
/// read (the client was credited early for held bytes: it may have more
/// window than the runtime granted).
const QUEUE_HIGH: usize = 64 << 10;
/// How often a client waiting for the hold budget tries again.
const PAUSE_RETRY: Duration = Duration::from_millis(10);
/// Complaints about oversized header blocks.
static BLOCK_LOG: LogRate = budget::complaint();

/// Whether a header block may grow by a frame.
enum Admit {
    Yes,
    /// Not until the budget has room.
    Wait,
    /// Past [`MAX_HEADER_LIST`].
    TooLarge,
}

/// A header block being received (HEADERS or PUSH_PROMISE, then CONTINUATION).
#[derive(Debug)]
struct Block {
    stream: u32,
    end_stream: bool,
    buf: Vec<u8>,
    malformed: bool,
    /// Bytes of `buf` taken from the hold budget.
    charged: usize,
}

/// The parsing state of the bytes one peer sends.
#[derive(Debug)]
struct Side {
    /// The client preface still to pass (client side only).
    preface: frame::Preface,
    block: Option<Block>,
    reader: Reader,
    /// The largest frame accepted from this peer: the largest
    /// SETTINGS_MAX_FRAME_SIZE the other peer announced.
    max_frame: u32,
}

impl Side {
    fn new(preface: frame::Preface) -> Self {
        Self {
            preface,
            block: None,
            reader: Reader::new(),
            max_frame: frame::DEFAULT_MAX_FRAME,
        }
    }
}

/// A call in flight.
#[derive(Debug)]
struct Stream {
    info: &'static MethodInfo,
    started: Instant,
    /// The client ended its side (END_STREAM).
    client_done: bool,
    /// The answer's grpc-status, once seen.
    code: Option<i32>,
    /// Credit the runtime will grant on this stream that the client must
    /// not see (bytes criguard added or credited early).
    debt: u64,
    /// Present for the calls criguard observes.
    observed: Option<Box<Observed>>,
}

/// A relayed connection.
#[derive(Debug)]
pub struct Conn {
    pub(super) proxy: Proxy,
    client: Side,
    server: Side,
    streams: HashMap<u32, Stream>,
    /// Streams criguard answered itself; the runtime's frames on them are
    /// not the client's to see (header blocks excepted: HPACK state).
    answered: BTreeSet<u32>,
    to_server: ToServer,
    /// A runtime header block is open toward the client: criguard's own
    /// frames wait in `deferred`.
    client_block_open: bool,
    /// The runtime's first SETTINGS went to the client. Until then
    /// criguard's own frames wait in `deferred` too: a server's first
    /// frame must be SETTINGS, and a gRPC client drops a connection whose
    /// first frame is anything else (a GOAWAY from a drain that began as
    /// the connection was accepted, a WINDOW_UPDATE, an answer).
    server_started: bool,
    deferred: Vec<Bytes>,
    /// criguard's answers waiting for the runtime's next header block.
    answers_waiting: Vec<Bytes>,
    answers_since: Option<Instant>,
    size_update_pending: bool,
    client_table_size: u32,
    /// The client's SETTINGS_MAX_FRAME_SIZE.
    client_max_frame: u32,
    /// Credit the runtime will grant on the connection that the client
    /// must not see.
    conn_debt: u64,
    /// The request bodies held on this connection.
    held: Held,
    last_client_stream: u32,
    goaway_sent: Option<u32>,
    closing: bool,
    /// Budget bytes the client's next block frame waits for.
    paused_need: Option<usize>,
    /// Budget bytes taken for the client's next block frame.
    charge_next: usize,
}

/// The held body of `stream`, if it is observed. A function over the map,
/// not a method, so that the caller may use the connection's other fields
/// (its `held` ledger) while it holds the body.
fn observed(streams: &mut HashMap<u32, Stream>, stream: u32) -> Option<&mut Observed> {
    streams.get_mut(&stream)?.observed.as_deref_mut()
}

impl Conn {
    /// A connection relayed by `proxy`.
    pub fn new(proxy: Proxy) -> Self {
        let to_server = ToServer::new();
        Self {
            proxy,
            client: Side::new(frame::Preface::expected()),
            server: Side::new(frame::Preface::none()),
            streams: HashMap::new(),
            answered: BTreeSet::new(),
            to_server,
            client_block_open: false,
            server_started: false,
            deferred: Vec::new(),
            answers_waiting: Vec::new(),
            answers_since: None,
            size_update_pending: false,
            client_table_size: 4096,
            client_max_frame: frame::DEFAULT_MAX_FRAME,
            conn_debt: 0,
            held: Held::default(),
            last_client_stream: 0,
            goaway_sent: None,
            closing: false,
            paused_need: None,
            charge_next: 0,
        }
    }

    /// Whether the client is not read: its header block waits for room
    /// in the hold budget.
    pub fn client_paused(&self) -> bool {
        self.to_server.queued() > QUEUE_HIGH
            || self.paused_need.is_some_and(|n| !self.proxy.budget.fits(n))
    }

    /// Whether the connection should end once its queues are written: a
    /// peer broke the protocol, or a drain finished.
    pub fn done(&self) -> bool {
        self.closing
            || (self.goaway_sent.is_some()
                && self.deferred.is_empty()
                && self.streams.is_empty()
                && self.answers_waiting.is_empty()
                && !self.to_server.is_blocked())
    }

    /// When [`Conn::on_deadline`] wants to run.
    pub fn deadline(&self) -> Option<Instant> {
        let answers = self.answers_since.map(|t| t + ANSWER_WAIT);
        if self.paused_need.is_some() {
            let retry = Instant::now() + PAUSE_RETRY;
            return Some(answers.map_or(retry, |a| a.min(retry)));
        }
        answers
    }

    /// The runtime sent no header block in time: criguard's answers go now.
    pub fn on_deadline(&mut self, io: &mut Io) {
        self.size_update_pending = false;
        self.release_answers(io);
    }

    /// Stops new calls: GOAWAY to the client naming the last stream it
    /// opened; calls in flight finish.
    pub fn drain(&mut self, io: &mut Io) {
        if self.goaway_sent.is_none() {
            self.goaway_sent = Some(self.last_client_stream);
            let f = frame::goaway(self.last_client_stream, error::NO_ERROR);
            self.inject_client(io, f);
        }
    }

    /// Bytes from the client. Whole frames are consumed from `input`; a
    /// partial frame stays for the next read.
    pub fn on_client(&mut self, input: &mut BytesMut, io: &mut Io) {
        if self.closing {
            input.clear();
            return;
        }
        if let Some(preface) = self.client.preface.take(input) {
            self.to_server
                .forward(&mut io.to_server, preface.freeze(), 0);
            if !self.client.preface.passed() {
                return;
            }
        }
        while input.len() >= frame::HEADER_LEN {
            let head = Head::parse(input);
            let whole = input.len() >= frame::HEADER_LEN + head.len as usize;
            if whole && head.len <= self.client.max_frame && is_block(head.kind) {
                match self.admit_block(&head) {
                    Admit::Yes => self.paused_need = None,
                    Admit::Wait => return,
                    Admit::TooLarge => {
                        input.clear();
                        return self.refuse_block(io);
                    }
                }
            }
            let Some((head, f)) = frame::next_frame(input, self.client.max_frame) else {
                return;
            };
            let Some(f) = f else {
                return self.fail(io, error::FRAME_SIZE_ERROR);
            };
            match head.kind {
                kind::DATA => self.client_data(head, f, io),
                kind::HEADERS | kind::CONTINUATION | kind::PUSH_PROMISE => {
                    self.client_block(head, f, io)
                }
                kind::RST_STREAM => self.client_rst(head, f, io),
                kind::SETTINGS => {
                    if !head.has(flag::ACK) {
                        self.client_settings(&f[frame::HEADER_LEN..]);
                    }
                    self.to_server.forward(&mut io.to_server, f.freeze(), 0);
                }
                _ => self.to_server.forward(&mut io.to_server, f.freeze(), 0),
            }
        }
    }

    /// Bytes from the runtime, consumed as in [`Conn::on_client`].
    pub fn on_server(&mut self, input: &mut BytesMut, io: &mut Io) {
        if self.closing {
            input.clear();
            return;
        }
        while let Some((head, f)) = frame::next_frame(input, self.server.max_frame) {
            let Some(f) = f else {
                tracing::warn!(
                    len = head.len,
                    "runtime sent a frame larger than the kubelet accepts; closing"
                );
                self.closing = true;
                return;
            };
            match head.kind {
                kind::DATA => self.server_data(head, f, io),
                kind::HEADERS | kind::CONTINUATION | kind::PUSH_PROMISE => {
                    self.server_block(head, f, io)
                }
                kind::RST_STREAM => self.server_rst(head, f, io),
                kind::WINDOW_UPDATE => self.server_window_update(head, f, io),
                kind::SETTINGS => {
                    let first = !head.has(flag::ACK) && !self.server_started;
                    if !head.has(flag::ACK) {
                        self.server_settings(&f[frame::HEADER_LEN..], io);
                    }
                    io.to_client.push(f.freeze());
                    if first {
                        self.server_started = true;
                        self.flush_deferred(io);
                    }
                }
                _ => io.to_client.push(f.freeze()),
            }
        }
    }

    /// Whether the client's block may grow by the frame `head`, taking
    /// what it needs from the hold budget.
    fn admit_block(&mut self, head: &Head) -> Admit {
        let fresh = matches!(head.kind, kind::HEADERS | kind::PUSH_PROMISE);
        let (held, charged) = match (&self.client.block, fresh) {
            (Some(b), false) => (b.buf.len(), b.charged),
            _ => (0, 0),
        };
        let len = held + head.len as usize;
        if len > MAX_HEADER_LIST {
            return Admit::TooLarge;
        }
        if len <= SMALL_BLOCK || charged > 0 || self.charge_next > 0 {
            return Admit::Yes;
        }
        // A block growing past SMALL_BLOCK reserves all it may become at
        // once: blocks that each waited for a little more would wait for
        // each other.
        let reserve = MAX_HEADER_LIST.min(self.proxy.budget.limit());
        if self.proxy.budget.try_take(reserve) {
            self.charge_next = reserve;
            Admit::Yes
        } else {
            self.paused_need = Some(reserve);
            Admit::Wait
        }
    }

    /// A client header block past [`MAX_HEADER_LIST`]: the connection ends
    /// with GOAWAY PROTOCOL_ERROR and the block's bytes are dropped.
    fn refuse_block(&mut self, io: &mut Io) {
        BLOCK_LOG.allow(Instant::now()).inspect(|skipped| {
            tracing::warn!(
                limit = MAX_HEADER_LIST,
                not_logged = skipped,
                "a client's header block exceeds the runtime's header list size; connection ended"
            );
        });
        BLOCKS_REFUSED.inc();
        self.drop_block();
        let msg = format!("criguard: header block over {MAX_HEADER_LIST} bytes");
        io.to_client.push(frame::goaway_with(
            self.last_client_stream,
            error::PROTOCOL_ERROR,
            msg.as_bytes(),
        ));
        self.closing = true;
    }

    /// Drops the client's block in progress and gives back its budget.
    fn drop_block(&mut self) {
        let charged = self.client.block.take().map_or(0, |b| b.charged);
        self.proxy
            .budget
            .give(charged + std::mem::take(&mut self.charge_next));
    }

    /// Ends the connection the way the runtime would: GOAWAY with `code`.
    fn fail(&mut self, io: &mut Io, code: u32) {
        tracing::info!(code, "kubelet connection broke the protocol; closing it");
        io.to_client
            .push(frame::goaway(self.last_client_stream, code));
        self.closing = true;
    }

    /// Adds a frame of criguard's own for the client, after any open
    /// runtime header block.
    fn inject_client(&mut self, io: &mut Io, f: Bytes) {
        if self.client_block_open || !self.server_started {
            self.deferred.push(f);
        } else {
            io.to_client.push(f);
        }
    }

    /// Sends criguard's frames that waited, unless they must wait on.
    fn flush_deferred(&mut self, io: &mut Io) {
        if self.client_block_open || !self.server_started {
            return;
        }
        for d in std::mem::take(&mut self.deferred) {
            io.to_client.push(d);
        }
    }

    /// Answers `stream` on the runtime's behalf (trailers-only) and records
    /// the call.
    fn answer(&mut self, io: &mut Io, stream: u32, st: &Stream, code: i32, msg: &str) {
        let f = super::headers::trailers_only(stream, code, msg, self.client_max_frame);
        if self.size_update_pending {
            self.answers_waiting.push(f);
            self.answers_since.get_or_insert_with(Instant::now);
        } else {
            self.inject_client(io, f);
        }
        self.proxy.record(st.info, code, st.started);
        self.answered.insert(stream);
        if self.answered.len() > ANSWERED_CAP {
            self.answered.pop_first();
        }
    }

    fn release_answers(&mut self, io: &mut Io) {
        self.answers_since = None;
        for f in std::mem::take(&mut self.answers_waiting) {
            self.inject_client(io, f);
        }
    }

    fn client_settings(&mut self, payload: &[u8]) {
        for (id, v) in frame::settings(payload) {
            match id {
                setting::MAX_FRAME_SIZE => {
                    self.client_max_frame =
                        v.clamp(frame::DEFAULT_MAX_FRAME, frame::MAX_FRAME_LIMIT);
                    self.server.max_frame = self.server.max_frame.max(self.client_max_frame);
                }
                setting::HEADER_TABLE_SIZE => {
                    if v < self.client_table_size {
                        self.size_update_pending = true;
                    }
                    self.client_table_size = v;
                }
                _ => {}
            }
        }
    }

    fn server_settings(&mut self, payload: &[u8], io: &mut Io) {
        for (id, v) in frame::settings(payload) {
            match id {
                setting::INITIAL_WINDOW_SIZE => {
                    self.to_server.set_initial_window(&mut io.to_server, v)
                }
                setting::MAX_FRAME_SIZE => {
                    self.to_server.set_max_frame(v);
                    let v = v.clamp(frame::DEFAULT_MAX_FRAME, frame::MAX_FRAME_LIMIT);
                    self.client.max_frame = self.client.max_frame.max(v);
                }
                _ => {}
            }
        }
    }

    fn client_data(&mut self, head: Head, f: BytesMut, io: &mut Io) {
        let held = match self.streams.get_mut(&head.stream) {
            Some(st) => {
                st.client_done |= head.has(flag::END_STREAM);
                st.observed.as_ref().is_some_and(|o| o.is_holding())
            }
            None => false,
        };
        if held {
            self.hold(head, f, io);
        } else {
            self.to_server
                .forward(&mut io.to_server, f.freeze(), head.len);
        }
    }

    fn client_rst(&mut self, head: Head, f: BytesMut, io: &mut Io) {
        if self.answered.remove(&head.stream) {
            return; // the runtime has its RST_STREAM from criguard already
        }
        if let Some(st) = self.streams.remove(&head.stream) {
            self.drop_held(&st, io);
            self.proxy.record(st.info, 1, st.started);
        }
        self.to_server.forward(&mut io.to_server, f.freeze(), 0);
    }

    fn client_block(&mut self, head: Head, f: BytesMut, io: &mut Io) {
        let fragment = frame::block_fragment(&head, &f[frame::HEADER_LEN..]);
        if head.kind == kind::HEADERS
            && self
                .streams
                .get(&head.stream)
                .and_then(|s| s.observed.as_ref())
                .is_some_and(|o| o.is_holding())
        {
            // Trailers end a held body: the body must reach the runtime first.
            self.release(head.stream, io, false);
        }
        if matches!(head.kind, kind::HEADERS | kind::PUSH_PROMISE)
            && let Some(old) = self.client.block.take()
        {
            // A new block while one was open: the peer refuses it anyway.
            self.proxy.budget.give(old.charged);
        }
        let end = collect_block(&mut self.client.block, head, fragment);
        if let Some(b) = self.client.block.as_mut() {
            b.charged += std::mem::take(&mut self.charge_next);
        }
        self.to_server.forward(&mut io.to_server, f.freeze(), 0);
        if !end {
            self.to_server.set_in_block(&mut io.to_server, true);
            return;
        }
        self.to_server.set_in_block(&mut io.to_server, false);
        let Some(block) = self.client.block.take() else {
            return;
        };
        let fields = read_block(&mut self.client.reader, &block);
        let (stream, end_stream) = (block.stream, block.end_stream);
        self.proxy.budget.give(block.charged);
        drop(block);
        self.client_headers(stream, end_stream, fields, io);
    }

    fn client_headers(
        &mut self,
        stream: u32,
        end_stream: bool,
        fields: Option<Fields>,
        io: &mut Io,
    ) {
        if let Some(st) = self.streams.get_mut(&stream) {
            st.client_done |= end_stream; // the client's trailers
            return;
        }
        if stream <= self.last_client_stream {
            return; // not a new stream: the runtime judges it
        }
        self.last_client_stream = stream;
        if self.goaway_sent.is_some_and(|last| stream > last) {
            // Opened after criguard's GOAWAY: the client retries it
            // elsewhere. The runtime saw the HEADERS (HPACK state) and
            // must not run it.
            let rst = frame::rst_stream(stream, error::REFUSED_STREAM);
            self.to_server.inject(&mut io.to_server, rst);
            return;
        }
        let path = fields.as_ref().and_then(|f| f.path.as_deref());
        let info = methods::lookup(path.unwrap_or(""));
        // A body whose length the client announced cannot grow: such a
        // call is observed but never patched.
        let may_patch = !fields.as_ref().is_some_and(|f| f.content_length);
        let observed = match (info.observed, &self.proxy.observer) {
            (Some(method), Some(_)) if !end_stream => {
                Some(Box::new(Observed::new(method, may_patch)))
            }
            _ => None,
        };
        self.streams.insert(
            stream,
            Stream {
                info,
                started: Instant::now(),
                client_done: end_stream,
                code: None,
                debt: 0,
                observed,
            },
        );
    }

    fn server_block(&mut self, head: Head, f: BytesMut, io: &mut Io) {
        let fragment = frame::block_fragment(&head, &f[frame::HEADER_LEN..]);
        let end = collect_block(&mut self.server.block, head, fragment);
        if let Some(b) = self.server.block.as_mut()
            && b.buf.len() > MAX_HEADER_LIST
        {
            // More than the kubelet takes: not kept, not read.
            b.buf = Vec::new();
            b.malformed = true;
            self.server.reader.set_broken();
        }
        io.to_client.push(f.freeze());
        if !end {
            self.client_block_open = true;
            return;
        }
        self.client_block_open = false;
        self.flush_deferred(io);
        if self.size_update_pending {
            // The runtime's block carried any size update the client asked
            // for; criguard's own blocks may follow now.
            self.size_update_pending = false;
            self.release_answers(io);
        }
        let Some(block) = self.server.block.take() else {
            return;
        };
        let fields = read_block(&mut self.server.reader, &block);
        if self.answered.contains(&block.stream) {
            if block.end_stream {
                self.answered.remove(&block.stream);
            }
            return;
        }
        let Some(st) = self.streams.get_mut(&block.stream) else {
            return;
        };
        if let Some(code) = fields.and_then(|f| f.grpc_status) {
            st.code = Some(code);
        }
        if block.end_stream {
            self.server_done(block.stream, io);
        }
    }

    fn server_data(&mut self, head: Head, f: BytesMut, io: &mut Io) {
        let end = head.has(flag::END_STREAM);
        if self.answered.contains(&head.stream) {
            // Not the client's: drop it, and give the runtime its credit back.
            if head.len > 0 {
                let wu = frame::window_update(0, head.len);
                self.to_server.inject(&mut io.to_server, wu);
            }
            if end {
                self.answered.remove(&head.stream);
            }
            return;
        }
        if let Some(obs) = self
            .streams
            .get_mut(&head.stream)
            .and_then(|s| s.observed.as_mut())
        {
            obs.copy_response(&head, &f[frame::HEADER_LEN..]);
        }
        io.to_client.push(f.freeze());
        if end {
            self.server_done(head.stream, io);
        }
    }

    fn server_rst(&mut self, head: Head, f: BytesMut, io: &mut Io) {
        if self.answered.remove(&head.stream) {
            return;
        }
        io.to_client.push(f.clone().freeze());
        if let Some(st) = self.streams.remove(&head.stream) {
            self.drop_held(&st, io);
            let code = frame::increment(&f[frame::HEADER_LEN..]).map_or(13, rst_to_grpc);
            self.proxy.record(st.info, code, st.started);
        }
    }

    fn server_window_update(&mut self, head: Head, f: BytesMut, io: &mut Io) {
        let Some(inc) = frame::increment(&f[frame::HEADER_LEN..]) else {
            io.to_client.push(f.freeze());
            return;
        };
        self.to_server.granted(&mut io.to_server, head.stream, inc);
        let debt = if head.stream == 0 {
            Some(&mut self.conn_debt)
        } else {
            self.streams.get_mut(&head.stream).map(|s| &mut s.debt)
        };
        match debt {
            Some(d) if *d > 0 => {
                let kept = (*d).min(u64::from(inc));
                *d -= kept;
                let pass = u64::from(inc) - kept;
                if pass > 0 {
                    io.to_client
                        .push(frame::window_update(head.stream, pass as u32));
                }
            }
            _ => io.to_client.push(f.freeze()),
        }
    }

    /// The runtime ended its side of `stream`: the call is over.
    fn server_done(&mut self, stream: u32, io: &mut Io) {
        let holding = self
            .streams
            .get(&stream)
            .and_then(|s| s.observed.as_ref())
            .is_some_and(|o| o.is_holding());
        if holding {
            // Answered before its body arrived (e.g. Unimplemented): the
            // body goes on unobserved, as a plain relay would send it.
            self.pass_held(stream, io);
        }
        let Some(st) = self.streams.remove(&stream) else {
            return;
        };
        let code = st.code.unwrap_or(2);
        if code == 0
            && let Some(obs) = &st.observed
        {
            obs.observe_answer(&self.proxy);
        }
        self.proxy.record(st.info, code, st.started);
    }
    /// Holds a DATA frame of an observed request.
    fn hold(&mut self, head: Head, f: BytesMut, io: &mut Io) {
        let stream = head.stream;
        let Some((a, b)) = frame::unpadded(&head, &f[frame::HEADER_LEN..]) else {
            // Malformed padding: the runtime will refuse the frame itself.
            self.pass_held(stream, io);
            self.to_server
                .forward(&mut io.to_server, f.freeze(), head.len);
            return;
        };
        let payload = &f[frame::HEADER_LEN + a..frame::HEADER_LEN + b];
        let Some(obs) = observed(&mut self.streams, stream) else {
            return;
        };
        match self.held.hold(obs, &head, payload, &self.proxy.budget) {
            Next::Pass => self.pass_held(stream, io),
            Next::Release => self.release(stream, io, true),
            Next::Advance(n) => self.advance(stream, n, io),
        }
    }

    /// Credits `n` held bytes of `stream` to the client.
    fn advance(&mut self, stream: u32, n: u64, io: &mut Io) {
        let Some(st) = self.streams.get_mut(&stream) else {
            return;
        };
        let open = !st.client_done;
        let Some(obs) = st.observed.as_deref_mut() else {
            return;
        };
        if n == 0 {
            return;
        }
        obs.advance(n);
        self.credit_client(io, stream, n as u32, open);
    }

    /// WINDOW_UPDATEs of `n` for the client: on `stream` while it is
    /// `open`, and on the connection.
    fn credit_client(&mut self, io: &mut Io, stream: u32, n: u32, open: bool) {
        if open {
            self.inject_client(io, frame::window_update(stream, n));
        }
        self.inject_client(io, frame::window_update(0, n));
    }

    /// The body of `stream` is complete: observe it and forward, patch or
    /// refuse it. With `may_park`, a body that needs the node model waits
    /// for it to be rebuilt ([`Conn::on_ready`]).
    fn release(&mut self, stream: u32, io: &mut Io, may_park: bool) {
        if may_park && !self.proxy.is_ready() {
            let Some(obs) = observed(&mut self.streams, stream) else {
                return;
            };
            let owed = self.held.park(obs);
            // The client's connection window is not tied up meanwhile.
            self.advance(stream, owed, io);
            return;
        }
        let Some(observer) = self.proxy.observer.clone() else {
            return self.pass_held(stream, io);
        };
        let Some(obs) = observed(&mut self.streams, stream) else {
            return;
        };
        let Some(work) = Held::reserve_work(obs, &self.proxy.budget) else {
            return self.pass_held(stream, io);
        };
        let body = self.held.take_body(obs);
        // Charged to the budget until it has left for the runtime, or, when
        // the request is kept for the answer (its bytes, or the patched
        // copy's, stay resident), until the call ends.
        let charge = Charge::new(self.proxy.budget.clone(), body.len());
        let verdict = obs.verdict(&*observer, body);
        self.proxy.budget.give(work);
        match verdict {
            Verdict::Refuse(why) => {
                drop(charge);
                self.refuse(stream, &why, io)
            }
            Verdict::Send {
                payload,
                request: Some(request),
            } => {
                obs.sent(Some((request, charge)));
                self.send_body(stream, payload, None, io);
            }
            Verdict::Send {
                payload,
                request: None,
            } => {
                obs.sent(None);
                self.send_body(stream, payload, Some(charge), io);
            }
        }
    }

    /// Forwards what is held of `stream` unobserved; later frames pass as they come.
    fn pass_held(&mut self, stream: u32, io: &mut Io) {
        let Some(obs) = observed(&mut self.streams, stream) else {
            return;
        };
        let body = self.held.pass(obs);
        let charge = Charge::new(self.proxy.budget.clone(), body.len());
        self.send_body(stream, body, Some(charge), io);
    }

    /// Sends `payload` as the body of `stream` and settles the credit.
    fn send_body(&mut self, stream: u32, payload: Bytes, charge: Option<Charge>, io: &mut Io) {
        let Some(st) = self.streams.get_mut(&stream) else {
            return;
        };
        let Some(obs) = st.observed.as_deref_mut() else {
            return;
        };
        let open = !st.client_done;
        match obs.settle(payload.len() as u64) {
            Settle::Debt(d) => {
                self.conn_debt += d;
                st.debt += d;
            }
            Settle::Short(n) => self.credit_client(io, stream, n, open),
        }
        self.to_server
            .body(&mut io.to_server, stream, payload, !open, charge);
    }

    /// Answers `stream` with RESOURCE_EXHAUSTED and cancels the runtime's copy.
    fn refuse(&mut self, stream: u32, why: &str, io: &mut Io) {
        let Some(st) = self.streams.remove(&stream) else {
            return;
        };
        let rst = frame::rst_stream(stream, error::CANCEL);
        self.to_server.inject(&mut io.to_server, rst);
        if let Some(obs) = &st.observed
            && obs.owed() > 0
        {
            self.inject_client(io, frame::window_update(0, obs.owed() as u32));
        }
        self.answer(
            io,
            stream,
            &st,
            tonic::Code::ResourceExhausted as i32,
            &format!("criguard: {why}"),
        );
    }

    /// A held body that will never be forwarded (the call was reset):
    /// the client gets its connection credit back.
    fn drop_held(&mut self, st: &Stream, io: &mut Io) {
        let Some(obs) = st.observed.as_deref() else {
            return;
        };
        let Some(owed) = self.held.drop_body(obs, &self.proxy.budget) else {
            return;
        };
        if owed > 0 {
            self.inject_client(io, frame::window_update(0, owed as u32));
        }
    }

    /// The runtime's socket took bytes: bodies criguard sends are framed on.
    pub fn on_server_room(&mut self, io: &mut Io) {
        self.to_server.resume(&mut io.to_server);
    }

    /// Whether a body waits for the node model.
    pub fn wants_ready(&self) -> bool {
        self.held.wants_ready()
    }

    /// The node model is rebuilt: parked bodies go, in stream order.
    pub fn on_ready(&mut self, io: &mut Io) {
        let mut parked: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| s.observed.as_ref().is_some_and(|o| o.is_parked()))
            .map(|(id, _)| *id)
            .collect();
        parked.sort_unstable();
        for id in parked {
            self.release(id, io, false);
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // What this connection held goes back to the shared budget.
        self.drop_block();
        self.proxy.budget.give(self.held.bytes());
    }
}

/// Whether frames of type `kind` carry a header block.
fn is_block(kind: u8) -> bool {
    matches!(
        kind,
        kind::HEADERS | kind::CONTINUATION | kind::PUSH_PROMISE
    )
}

/// Adds a frame's fragment to the block in progress; true when the block
/// is complete (END_HEADERS).
fn collect_block(block: &mut Option<Block>, head: Head, fragment: Option<&[u8]>) -> bool {
    let fresh = matches!(head.kind, kind::HEADERS | kind::PUSH_PROMISE);
    if fresh || block.is_none() {
        *block = Some(Block {
            stream: head.stream,
            end_stream: head.kind == kind::HEADERS && head.has(flag::END_STREAM),
            buf: Vec::new(),
            malformed: !fresh,
            charged: 0,
        });
    }
    if let Some(b) = block.as_mut() {
        match fragment {
            Some(frag) if !b.malformed => b.buf.extend_from_slice(frag),
            _ => b.malformed = true,
        }
    }
    head.has(flag::END_HEADERS)
}

/// Decodes a complete block; `None` when it is malformed or the direction's
/// decoder broke (the receiving peer fails the connection then).
fn read_block(reader: &mut Reader, block: &Block) -> Option<Fields> {
    if block.malformed {
        return None;
    }
    reader.read(&block.buf)
}

/// The gRPC code a client reports for a stream reset with an HTTP/2
/// error code (as grpc-go maps them).
fn rst_to_grpc(h2: u32) -> i32 {
    use tonic::Code;
    let code = match h2 {
        0x7 => Code::Unavailable,             // REFUSED_STREAM
        0x8 => Code::Cancelled,               // CANCEL
        0x3 | 0xb => Code::ResourceExhausted, // FLOW_CONTROL_ERROR, ENHANCE_YOUR_CALM
        0xc => Code::PermissionDenied,        // INADEQUATE_SECURITY
        _ => Code::Internal,
    };
    code as i32
}
