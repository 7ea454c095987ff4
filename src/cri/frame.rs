//! HTTP/2 frames as the relay sees them (RFC 9113 §4 and §6).
//!
//! The relay parses only the 9-byte frame header of most frames. The few
//! payloads it reads (HEADERS, CONTINUATION, SETTINGS, WINDOW_UPDATE,
//! RST_STREAM, and DATA of observed streams) are read here, and the few
//! frames criguard writes itself are built here. Nothing in this module
//! does I/O.

use bytes::{BufMut, Bytes, BytesMut};

/// The client connection preface that precedes the client's first frame.
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Length of a frame header.
pub const HEADER_LEN: usize = 9;
/// The prefix of every gRPC message in DATA frames: a compressed flag and
/// the message length (4 bytes, big-endian).
pub const GRPC_PREFIX: usize = 5;
/// The largest frame payload HTTP/2 can express (2^24 − 1).
pub const MAX_FRAME_LIMIT: u32 = (1 << 24) - 1;
/// SETTINGS_MAX_FRAME_SIZE and SETTINGS_INITIAL_WINDOW_SIZE defaults, and
/// the initial connection window.
pub const DEFAULT_MAX_FRAME: u32 = 16_384;
/// The initial flow-control window of the connection and of each stream.
pub const DEFAULT_WINDOW: i64 = 65_535;
/// The largest flow-control window (2^31 − 1).
pub const MAX_WINDOW: i64 = (1 << 31) - 1;

/// Frame types the relay distinguishes.
pub mod kind {
    /// DATA.
    pub const DATA: u8 = 0x0;
    /// HEADERS.
    pub const HEADERS: u8 = 0x1;
    /// RST_STREAM.
    pub const RST_STREAM: u8 = 0x3;
    /// SETTINGS.
    pub const SETTINGS: u8 = 0x4;
    /// PUSH_PROMISE.
    pub const PUSH_PROMISE: u8 = 0x5;
    /// PING.
    pub const PING: u8 = 0x6;
    /// GOAWAY.
    pub const GOAWAY: u8 = 0x7;
    /// WINDOW_UPDATE.
    pub const WINDOW_UPDATE: u8 = 0x8;
    /// CONTINUATION.
    pub const CONTINUATION: u8 = 0x9;
}

/// Frame flags.
pub mod flag {
    /// END_STREAM (DATA, HEADERS).
    pub const END_STREAM: u8 = 0x1;
    /// ACK (SETTINGS, PING).
    pub const ACK: u8 = 0x1;
    /// END_HEADERS (HEADERS, PUSH_PROMISE, CONTINUATION).
    pub const END_HEADERS: u8 = 0x4;
    /// PADDED (DATA, HEADERS, PUSH_PROMISE).
    pub const PADDED: u8 = 0x8;
    /// PRIORITY (HEADERS).
    pub const PRIORITY: u8 = 0x20;
}

/// HTTP/2 error codes criguard sends.
pub mod error {
    /// NO_ERROR: graceful shutdown.
    pub const NO_ERROR: u32 = 0x0;
    /// PROTOCOL_ERROR.
    pub const PROTOCOL_ERROR: u32 = 0x1;
    /// FRAME_SIZE_ERROR.
    pub const FRAME_SIZE_ERROR: u32 = 0x6;
    /// REFUSED_STREAM: not processed, safe to retry.
    pub const REFUSED_STREAM: u32 = 0x7;
    /// CANCEL.
    pub const CANCEL: u32 = 0x8;
    /// ENHANCE_YOUR_CALM.
    pub const ENHANCE_YOUR_CALM: u32 = 0xb;
}

/// SETTINGS identifiers the relay reads.
pub mod setting {
    /// SETTINGS_HEADER_TABLE_SIZE.
    pub const HEADER_TABLE_SIZE: u16 = 0x1;
    /// SETTINGS_INITIAL_WINDOW_SIZE.
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
    /// SETTINGS_MAX_FRAME_SIZE.
    pub const MAX_FRAME_SIZE: u16 = 0x5;
}

/// A parsed 9-byte frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    /// Payload length.
    pub len: u32,
    /// Frame type.
    pub kind: u8,
    /// Flags.
    pub flags: u8,
    /// Stream identifier (reserved bit cleared).
    pub stream: u32,
}

impl Head {
    /// Parses the first 9 bytes of `b`, which must hold at least that many.
    pub fn parse(b: &[u8]) -> Self {
        Self {
            len: u32::from_be_bytes([0, b[0], b[1], b[2]]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }

    /// Whether `f` is set.
    pub fn has(&self, f: u8) -> bool {
        self.flags & f != 0
    }

    /// Writes this header to `out`.
    pub fn write(&self, out: &mut BytesMut) {
        out.put_slice(&self.len.to_be_bytes()[1..]);
        out.put_u8(self.kind);
        out.put_u8(self.flags);
        out.put_u32(self.stream);
    }
}

/// A frame with `payload`, as bytes.
pub fn build(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(HEADER_LEN + payload.len());
    Head {
        len: payload.len() as u32,
        kind,
        flags,
        stream,
    }
    .write(&mut out);
    out.put_slice(payload);
    out.freeze()
}

/// WINDOW_UPDATE granting `increment` (1 ..= 2^31 − 1) on `stream` (0: connection).
pub fn window_update(stream: u32, increment: u32) -> Bytes {
    build(kind::WINDOW_UPDATE, 0, stream, &increment.to_be_bytes())
}

/// RST_STREAM with `code`.
pub fn rst_stream(stream: u32, code: u32) -> Bytes {
    build(kind::RST_STREAM, 0, stream, &code.to_be_bytes())
}

/// The client connection preface still to come on a connection (the
/// client's side only: the server sends none).
#[derive(Debug)]
pub struct Preface(usize);

impl Preface {
    /// The whole preface still to come.
    pub fn expected() -> Self {
        Self(PREFACE.len())
    }

    /// None to come (the server's side).
    pub fn none() -> Self {
        Self(0)
    }

    /// Takes off `input` what it holds of the preface still to come (`None`
    /// once the preface has passed); frames follow once [`Self::passed`].
    pub fn take(&mut self, input: &mut BytesMut) -> Option<BytesMut> {
        if self.0 == 0 {
            return None;
        }
        let n = self.0.min(input.len());
        self.0 -= n;
        Some(input.split_to(n))
    }

    /// Whether the preface has passed.
    pub fn passed(&self) -> bool {
        self.0 == 0
    }
}

/// Takes the next whole frame off `input`: `None` when none is complete,
/// `Some((head, None))` when it is larger than `max` allows (`input` is
/// cleared then: the connection cannot go on).
pub fn next_frame(input: &mut BytesMut, max: u32) -> Option<(Head, Option<BytesMut>)> {
    if input.len() < HEADER_LEN {
        return None;
    }
    let head = Head::parse(input);
    if head.len > max {
        input.clear();
        return Some((head, None));
    }
    let total = HEADER_LEN + head.len as usize;
    if input.len() < total {
        input.reserve(total - input.len());
        return None;
    }
    Some((head, Some(input.split_to(total))))
}

/// GOAWAY naming the last stream processed, with `code`.
pub fn goaway(last_stream: u32, code: u32) -> Bytes {
    let mut p = [0u8; 8];
    p[..4].copy_from_slice(&last_stream.to_be_bytes());
    p[4..].copy_from_slice(&code.to_be_bytes());
    build(kind::GOAWAY, 0, 0, &p)
}

/// GOAWAY naming the last stream processed, with `code` and `debug` data.
pub fn goaway_with(last_stream: u32, code: u32, debug: &[u8]) -> Bytes {
    let mut p = Vec::with_capacity(8 + debug.len());
    p.extend_from_slice(&last_stream.to_be_bytes());
    p.extend_from_slice(&code.to_be_bytes());
    p.extend_from_slice(debug);
    build(kind::GOAWAY, 0, 0, &p)
}

/// The payload of a DATA frame without its padding; `None` when the
/// padding length does not fit the frame (a malformed frame).
pub fn data_payload(head: &Head, payload: &[u8]) -> Option<usize> {
    let (start, end) = unpadded(head, payload)?;
    Some(end - start)
}

/// The `[start, end)` range of the payload between the pad length octet
/// and the padding; `None` when malformed.
pub fn unpadded(head: &Head, payload: &[u8]) -> Option<(usize, usize)> {
    if !head.has(flag::PADDED) {
        return Some((0, payload.len()));
    }
    let pad = *payload.first()? as usize;
    let end = payload.len().checked_sub(pad)?;
    (end >= 1).then_some((1, end))
}

/// The header block fragment of a HEADERS, PUSH_PROMISE or CONTINUATION
/// frame: padding, priority fields and the promised stream id removed.
pub fn block_fragment<'a>(head: &Head, payload: &'a [u8]) -> Option<&'a [u8]> {
    match head.kind {
        kind::CONTINUATION => Some(payload),
        kind::HEADERS => {
            let (start, end) = unpadded(head, payload)?;
            let start = start + if head.has(flag::PRIORITY) { 5 } else { 0 };
            payload.get(start..end)
        }
        kind::PUSH_PROMISE => {
            let (start, end) = unpadded(head, payload)?;
            payload.get(start + 4..end)
        }
        _ => None,
    }
}

/// The settings carried by a SETTINGS frame payload, in order.
pub fn settings(payload: &[u8]) -> impl Iterator<Item = (u16, u32)> + '_ {
    payload.chunks_exact(6).map(|c| {
        (
            u16::from_be_bytes([c[0], c[1]]),
            u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
        )
    })
}

/// The increment of a WINDOW_UPDATE payload; `None` when malformed.
pub fn increment(payload: &[u8]) -> Option<u32> {
    let b: [u8; 4] = payload.try_into().ok()?;
    Some(u32::from_be_bytes(b) & 0x7fff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_round_trips_and_clears_the_reserved_bit() {
        let h = Head {
            len: 0x01_02_03,
            kind: kind::HEADERS,
            flags: flag::END_HEADERS | flag::END_STREAM,
            stream: 7,
        };
        let mut b = BytesMut::new();
        h.write(&mut b);
        assert_eq!(b.len(), HEADER_LEN);
        assert_eq!(Head::parse(&b), h);
        b[5] |= 0x80;
        assert_eq!(Head::parse(&b).stream, 7);
    }

    #[test]
    fn block_fragment_strips_padding_and_priority() {
        let head = Head {
            len: 0,
            kind: kind::HEADERS,
            flags: flag::PADDED | flag::PRIORITY,
            stream: 1,
        };
        // pad length 2, 5 priority octets, block "ab", 2 padding octets.
        let payload = [2, 0, 0, 0, 3, 16, b'a', b'b', 0, 0];
        assert_eq!(block_fragment(&head, &payload), Some(&b"ab"[..]));
        let too_much_padding = [9, b'a'];
        assert_eq!(block_fragment(&head, &too_much_padding), None);
    }

    #[test]
    fn data_payload_without_padding() {
        let head = Head {
            len: 5,
            kind: kind::DATA,
            flags: flag::PADDED,
            stream: 1,
        };
        assert_eq!(data_payload(&head, &[1, b'x', b'y', b'z', 0]), Some(3));
        assert_eq!(data_payload(&head, &[]), None);
    }
}
