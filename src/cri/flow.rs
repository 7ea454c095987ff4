//! The client-to-runtime side of a relayed connection: frame order and the
//! runtime's flow-control windows.
//!
//! Frames pass in the order the client sent them. The client respects the
//! windows it was granted, which equal the runtime's as long as criguard
//! changes no body; a patch (bytes added) or a held body (credit granted
//! early) makes them differ for a while. So criguard counts the runtime's
//! connection window itself and, when a DATA frame does not fit, queues it
//! and everything after it until the runtime grants more. Bodies criguard
//! writes itself (released observed requests) are framed here to fit the
//! runtime's connection and stream windows and its maximum frame size.
//!
//! A frame criguard adds (RST_STREAM, a released body) never lands inside a
//! header block the client is still sending: it waits for the block's end.
//!
//! A released body stays charged to the relay's hold budget until it has
//! been framed whole; it is framed as the runtime's socket takes the
//! frames ([`ToServer::resume`]), not as far as the runtime's windows
//! reach (grpc-go grows them to 16 MiB), so a slow runtime does not make
//! criguard hold copies beside the charged buffers. [`ToServer::queued`]
//! tells the pump how much
//! waits here, so that the client is not read while the runtime's windows
//! hold back more than a little (the client was credited early for held
//! bytes, so it may have more window than the runtime gave).

use std::collections::{HashMap, VecDeque};

use bytes::{Bytes, BytesMut};

use super::budget::Charge;
use super::frame::{self, flag, kind};
use super::out::{HIGH_WATER, Out};

/// Something to send to the runtime, in order.
#[derive(Debug)]
enum Queued {
    /// A whole frame as it is; `data` is its flow-controlled length.
    Frame { bytes: Bytes, data: u32 },
    /// A body criguard frames itself to fit the windows.
    Body {
        stream: u32,
        payload: Bytes,
        end_stream: bool,
        /// Its bytes' hold budget charge, given back once it is framed whole.
        charge: Option<Charge>,
    },
}

impl Queued {
    fn len(&self) -> usize {
        match self {
            Queued::Frame { bytes, .. } => bytes.len(),
            Queued::Body { payload, .. } => payload.len(),
        }
    }
}

/// Frames on their way to the runtime.
#[derive(Debug)]
pub struct ToServer {
    queue: VecDeque<Queued>,
    /// The runtime's connection receive window as criguard counts it.
    window: i64,
    /// The runtime's SETTINGS_INITIAL_WINDOW_SIZE.
    initial_stream_window: i64,
    /// The runtime's SETTINGS_MAX_FRAME_SIZE.
    max_frame: u32,
    /// Stream windows of the bodies criguard is still framing.
    stream_windows: HashMap<u32, i64>,
    /// A client header block is open: added frames wait.
    in_block: bool,
    deferred: Vec<Queued>,
    /// Bytes in `queue` (not `deferred`: those wait for the client).
    queued: usize,
}

impl Default for ToServer {
    fn default() -> Self {
        Self::new()
    }
}

impl ToServer {
    /// Frames for the runtime, at the protocol's initial windows.
    pub fn new() -> Self {
        Self {
            queue: VecDeque::new(),
            window: frame::DEFAULT_WINDOW,
            initial_stream_window: frame::DEFAULT_WINDOW,
            max_frame: frame::DEFAULT_MAX_FRAME,
            stream_windows: HashMap::new(),
            in_block: false,
            deferred: Vec::new(),
            queued: 0,
        }
    }

    /// Bytes waiting for the runtime's windows.
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Forwards a frame of the client's; `data` is its DATA length (0 for
    /// other types).
    pub fn forward(&mut self, out: &mut Out, bytes: Bytes, data: u32) {
        if self.queue.is_empty() && i64::from(data) <= self.window {
            self.window -= i64::from(data);
            out.push(bytes);
        } else {
            self.queued += bytes.len();
            self.queue.push_back(Queued::Frame { bytes, data });
        }
    }

    /// Adds a frame of criguard's own (no flow control), after any open
    /// client header block.
    pub fn inject(&mut self, out: &mut Out, bytes: Bytes) {
        if self.in_block {
            self.deferred.push(Queued::Frame { bytes, data: 0 });
        } else {
            self.forward(out, bytes, 0);
        }
    }

    /// Sends `payload` as the DATA of `stream`, framed to fit; `charge`
    /// is given back once it is framed whole.
    pub fn body(
        &mut self,
        out: &mut Out,
        stream: u32,
        payload: Bytes,
        end_stream: bool,
        charge: Option<Charge>,
    ) {
        let q = Queued::Body {
            stream,
            payload,
            end_stream,
            charge,
        };
        if self.in_block {
            self.deferred.push(q);
        } else {
            self.stream_windows
                .entry(stream)
                .or_insert(self.initial_stream_window);
            self.queued += q.len();
            self.queue.push_back(q);
            self.flush(out);
        }
    }

    /// Marks a client header block open (HEADERS without END_HEADERS) or
    /// closed; closing sends what waited for it.
    pub fn set_in_block(&mut self, out: &mut Out, open: bool) {
        self.in_block = open;
        if !open {
            for q in std::mem::take(&mut self.deferred) {
                match q {
                    Queued::Frame { bytes, .. } => self.forward(out, bytes, 0),
                    Queued::Body {
                        stream,
                        payload,
                        end_stream,
                        charge,
                    } => self.body(out, stream, payload, end_stream, charge),
                }
            }
        }
    }

    /// The runtime granted `increment` on the connection (`stream` 0) or a stream.
    pub fn granted(&mut self, out: &mut Out, stream: u32, increment: u32) {
        if stream == 0 {
            self.window += i64::from(increment);
        } else if let Some(w) = self.stream_windows.get_mut(&stream) {
            *w += i64::from(increment);
        } else {
            return;
        }
        self.flush(out);
    }

    /// The runtime's SETTINGS_INITIAL_WINDOW_SIZE changed: every stream
    /// window moves by the difference (RFC 9113 §6.9.2).
    pub fn set_initial_window(&mut self, out: &mut Out, size: u32) {
        let delta = i64::from(size) - self.initial_stream_window;
        self.initial_stream_window = i64::from(size);
        for w in self.stream_windows.values_mut() {
            *w += delta;
        }
        self.flush(out);
    }

    /// The runtime's SETTINGS_MAX_FRAME_SIZE changed.
    pub fn set_max_frame(&mut self, size: u32) {
        self.max_frame = size.clamp(frame::DEFAULT_MAX_FRAME, frame::MAX_FRAME_LIMIT);
    }

    /// `out` took bytes: frames more of the bodies waiting for room in it.
    pub fn resume(&mut self, out: &mut Out) {
        if !self.queue.is_empty() {
            self.flush(out);
        }
    }

    /// Whether frames wait for the runtime's window.
    pub fn is_blocked(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Sends queued frames while the windows allow.
    fn flush(&mut self, out: &mut Out) {
        while let Some(front) = self.queue.front_mut() {
            match front {
                Queued::Frame { data, .. } => {
                    if i64::from(*data) > self.window {
                        return;
                    }
                    self.window -= i64::from(*data);
                    if let Some(Queued::Frame { bytes, .. }) = self.queue.pop_front() {
                        self.queued -= bytes.len();
                        out.push(bytes);
                    }
                }
                Queued::Body {
                    stream,
                    payload,
                    end_stream,
                    charge,
                } => {
                    if out.len() >= HIGH_WATER {
                        // Framed on as the socket takes the frames: they
                        // are copies, so no more than this waits as copies
                        // however wide the runtime's windows, and the
                        // body's buffer goes once the last one is out.
                        return;
                    }
                    let sw = self.stream_windows.get(stream).copied().unwrap_or(0);
                    let room = self.window.min(sw).min(i64::from(self.max_frame)).max(0);
                    let n = (payload.len() as i64).min(room) as usize;
                    if n == 0 && !payload.is_empty() {
                        return;
                    }
                    let chunk = payload.split_to(n);
                    self.queued -= n;
                    let last = payload.is_empty();
                    if last {
                        // The rest shares the body's buffer, which stays
                        // resident until the last chunk is copied out.
                        drop(charge.take());
                    }
                    let flags = if last && *end_stream {
                        flag::END_STREAM
                    } else {
                        0
                    };
                    let mut f = BytesMut::with_capacity(frame::HEADER_LEN + n);
                    frame::Head {
                        len: n as u32,
                        kind: kind::DATA,
                        flags,
                        stream: *stream,
                    }
                    .write(&mut f);
                    f.extend_from_slice(&chunk);
                    out.push(f.freeze());
                    self.window -= n as i64;
                    let id = *stream;
                    if let Some(w) = self.stream_windows.get_mut(&id) {
                        *w -= n as i64;
                    }
                    if last {
                        self.queue.pop_front();
                        self.stream_windows.remove(&id);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::budget::Budget;
    use std::sync::Arc;

    fn data(stream: u32, len: usize, end: bool) -> Bytes {
        let flags = if end { flag::END_STREAM } else { 0 };
        frame::build(kind::DATA, flags, stream, &vec![7u8; len])
    }

    fn frames(b: &[u8]) -> Vec<frame::Head> {
        let mut v = Vec::new();
        let mut at = 0;
        while at < b.len() {
            let h = frame::Head::parse(&b[at..]);
            at += frame::HEADER_LEN + h.len as usize;
            v.push(h);
        }
        v
    }

    #[test]
    fn frames_that_fit_pass_at_once_and_count_against_the_window() {
        let mut t = ToServer::default();
        let mut out = Out::default();
        t.forward(&mut out, data(1, 65_000, true), 65_000);
        assert_eq!(out.len(), 65_009);
        t.forward(&mut out, data(3, 600, true), 600);
        assert!(t.is_blocked(), "535 bytes of window left, 600 needed");
        t.inject(&mut out, frame::rst_stream(5, 8));
        assert_eq!(out.len(), 65_009, "later frames keep their order");
        t.granted(&mut out, 0, 65);
        assert!(!t.is_blocked());
        let heads = frames(&out.take_all());
        assert_eq!(
            heads.iter().map(|h| h.stream).collect::<Vec<_>>(),
            [1, 3, 5]
        );
    }

    #[test]
    fn own_bodies_are_cut_to_the_stream_window_and_frame_size() {
        let mut t = ToServer::default();
        let mut out = Out::default();
        t.set_initial_window(&mut out, 20_000);
        t.granted(&mut out, 0, 1_000_000);
        t.body(&mut out, 1, Bytes::from(vec![1u8; 30_000]), true, None);
        let heads = frames(&out.take_all());
        assert_eq!(
            heads.iter().map(|h| h.len).collect::<Vec<_>>(),
            [16_384, 3_616]
        );
        assert!(heads.iter().all(|h| !h.has(flag::END_STREAM)));
        t.granted(&mut out, 1, 10_000);
        let heads = frames(&out.take_all());
        assert_eq!(heads.len(), 1);
        assert_eq!(heads[0].len, 10_000);
        assert!(heads[0].has(flag::END_STREAM));
    }

    #[test]
    fn an_empty_body_still_ends_the_stream() {
        let mut t = ToServer::default();
        let mut out = Out::default();
        t.body(&mut out, 7, Bytes::new(), true, None);
        let heads = frames(&out.take_all());
        assert_eq!(heads.len(), 1);
        assert!(heads[0].has(flag::END_STREAM) && heads[0].len == 0);
    }

    #[test]
    fn added_frames_wait_for_an_open_header_block() {
        let mut t = ToServer::default();
        let mut out = Out::default();
        t.set_in_block(&mut out, true);
        t.inject(&mut out, frame::rst_stream(1, 8));
        t.body(&mut out, 3, Bytes::from_static(b"x"), true, None);
        assert!(out.is_empty());
        t.forward(&mut out, frame::build(kind::CONTINUATION, 4, 9, b""), 0);
        t.set_in_block(&mut out, false);
        let heads = frames(&out.take_all());
        assert_eq!(
            heads.iter().map(|h| h.kind).collect::<Vec<_>>(),
            [kind::CONTINUATION, kind::RST_STREAM, kind::DATA]
        );
    }

    #[test]
    fn a_body_is_framed_as_the_socket_takes_it_and_charged_until_framed_whole() {
        let budget = Arc::new(Budget::new(1 << 20));
        let mut t = ToServer::new();
        let mut out = Out::default();
        t.set_initial_window(&mut out, 1 << 20);
        t.granted(&mut out, 0, 1 << 20);
        assert!(budget.try_take(200_000));
        let charge = Charge::new(budget.clone(), 200_000);
        t.body(
            &mut out,
            1,
            Bytes::from(vec![1u8; 200_000]),
            true,
            Some(charge),
        );
        let first = out.len();
        assert!(
            (HIGH_WATER..HIGH_WATER + 16_384 + 9).contains(&first),
            "framed up to the mark, not the 1 MiB of window: {first}"
        );
        assert_eq!(budget.used(), 200_000, "charged while part of it waits");
        let mut sent = out.take_all().len();
        t.resume(&mut out);
        sent += out.take_all().len();
        assert!(sent < 200_000 && t.is_blocked());
        while t.is_blocked() {
            t.resume(&mut out);
            sent += out.take_all().len();
        }
        assert_eq!(sent, 200_000 + 9 * 200_000usize.div_ceil(16_384));
        assert_eq!(budget.used(), 0, "given back with the last frame");
    }
}
