//! The trunk NRI runs over one unix socket connection
//! (`containerd/nri`, `pkg/net/multiplex`): two byte streams, each a ttRPC
//! connection, cut into frames of an 8-byte header (connection id, payload
//! length, big-endian u32) and the payload. On [`PLUGIN_CONN`] the runtime
//! calls the plugin; on [`RUNTIME_CONN`] the plugin calls the runtime.
//!
//! The Go side reads each trunk frame whole into the buffer its caller
//! reads with, and ttRPC reads through a 4096-byte buffer: a frame longer
//! than what is read fails the connection. So a message goes out as Go's
//! own buffered writer sends it: its first [`FIRST_FRAME`] bytes, then the
//! rest in one frame (the reader then reads straight into a buffer of the
//! rest's size), and never two messages in one frame.

/// Where the runtime calls the plugin (the plugin serves).
pub const PLUGIN_CONN: u32 = 1;
/// Where the plugin calls the runtime (`RegisterPlugin`).
pub const RUNTIME_CONN: u32 = 2;
/// The trunk frame header: connection id and payload length.
pub const HEADER_LEN: usize = 8;
/// The most a message's first trunk frame carries.
pub const FIRST_FRAME: usize = 4096;
/// The largest payload the Go side accepts in one trunk frame: a whole
/// ttRPC frame.
pub const MAX_PAYLOAD: usize = super::ttrpc::HEADER_LEN + super::ttrpc::MAX_DATA;

/// The trunk bytes carrying `message` (one encoded ttRPC frame) on `conn`.
pub fn encode(conn: u32, message: &[u8]) -> Vec<u8> {
    let (first, rest) = message.split_at(message.len().min(FIRST_FRAME));
    let mut out = Vec::with_capacity(message.len() + 2 * HEADER_LEN);
    for part in [first, rest] {
        if part.is_empty() {
            continue;
        }
        out.extend_from_slice(&conn.to_be_bytes());
        out.extend_from_slice(&(part.len() as u32).to_be_bytes());
        out.extend_from_slice(part);
    }
    out
}

/// A trunk that cannot be read on.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MuxError {
    /// A frame longer than the Go side ever sends.
    #[error("NRI trunk frame of {len} bytes on connection {conn}, over the {MAX_PAYLOAD} allowed")]
    TooLarge {
        /// Its connection id.
        conn: u32,
        /// Its payload length.
        len: usize,
    },
}

/// Cuts the trunk's bytes into (connection, payload) frames.
#[derive(Debug, Default)]
pub struct Demux {
    buf: Vec<u8>,
}

impl Demux {
    /// Adds bytes read from the socket.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame, if one has arrived. An oversized frame leaves
    /// the trunk unreadable (its framing can no longer be trusted).
    pub fn next_frame(&mut self) -> Result<Option<(u32, Vec<u8>)>, MuxError> {
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let h = &self.buf[..HEADER_LEN];
        let conn = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
        let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
        if len > MAX_PAYLOAD {
            return Err(MuxError::TooLarge { conn, len });
        }
        if self.buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let rest = self.buf.split_off(HEADER_LEN + len);
        let mut payload = std::mem::replace(&mut self.buf, rest);
        payload.drain(..HEADER_LEN);
        Ok(Some((conn, payload)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(wire: &[u8]) -> Vec<(u32, Vec<u8>)> {
        let mut d = Demux::default();
        d.push(wire);
        std::iter::from_fn(|| d.next_frame().unwrap()).collect()
    }

    #[test]
    fn a_small_message_is_one_frame() {
        let wire = encode(RUNTIME_CONN, b"hello");
        assert_eq!(wire[..HEADER_LEN], [0, 0, 0, 2, 0, 0, 0, 5]);
        assert_eq!(frames(&wire), [(RUNTIME_CONN, b"hello".to_vec())]);
    }

    #[test]
    fn a_large_message_is_its_first_4096_bytes_then_the_rest() {
        let msg: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let got = frames(&encode(PLUGIN_CONN, &msg));
        let lens: Vec<usize> = got.iter().map(|(_, p)| p.len()).collect();
        assert_eq!(lens, [FIRST_FRAME, 10_000 - FIRST_FRAME]);
        let joined: Vec<u8> = got.into_iter().flat_map(|(_, p)| p).collect();
        assert_eq!(joined, msg);
        assert!(frames(&encode(PLUGIN_CONN, b"")).is_empty(), "nothing sent");
    }

    #[test]
    fn frames_of_both_connections_interleave_in_any_pieces() {
        let mut wire = encode(PLUGIN_CONN, b"one");
        wire.extend(encode(RUNTIME_CONN, &[9; 5000]));
        wire.extend(encode(PLUGIN_CONN, b"two"));
        let whole = frames(&wire);
        assert_eq!(whole.len(), 4);
        let mut d = Demux::default();
        let mut got = Vec::new();
        for chunk in wire.chunks(7) {
            d.push(chunk);
            while let Some(f) = d.next_frame().unwrap() {
                got.push(f);
            }
        }
        assert_eq!(got, whole);
    }

    proptest::proptest! {
        #[test]
        fn ttrpc_frames_cross_the_trunk_intact_in_any_pieces(
            messages in proptest::collection::vec(
                (1u32..=2, 1u32..1000, proptest::collection::vec(proptest::num::u8::ANY, 0..9000)),
                1..6,
            ),
            piece in 1usize..5000,
        ) {
            use super::super::ttrpc::{Decoder, Frame, Kind};
            let sent: Vec<(u32, Frame)> = messages
                .into_iter()
                .map(|(conn, stream, data)| (conn, Frame { stream, kind: Kind::Request, flags: 0, data }))
                .collect();
            let wire: Vec<u8> = sent
                .iter()
                .flat_map(|(conn, f)| encode(*conn, &f.encode().unwrap()))
                .collect();
            let mut demux = Demux::default();
            let mut streams = [Decoder::default(), Decoder::default()];
            let mut got = Vec::new();
            for chunk in wire.chunks(piece) {
                demux.push(chunk);
                while let Some((conn, payload)) = demux.next_frame().unwrap() {
                    proptest::prop_assert!(!payload.is_empty(), "no empty frame is sent");
                    let d = &mut streams[conn as usize - 1];
                    d.push(&payload);
                    while let Some(f) = d.next_frame().unwrap() {
                        got.push((conn, f));
                    }
                }
            }
            proptest::prop_assert_eq!(got, sent);
        }

        #[test]
        fn any_bytes_are_read_without_panic(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..4000),
        ) {
            let mut demux = Demux::default();
            demux.push(&bytes);
            while let Ok(Some(_)) = demux.next_frame() {}
            let mut d = super::super::ttrpc::Decoder::default();
            d.push(&bytes);
            for _ in 0..bytes.len() + 1 {
                if let Ok(None) = d.next_frame() {
                    break;
                }
            }
        }
    }

    #[test]
    fn an_oversized_frame_stops_the_trunk() {
        let mut wire = 1u32.to_be_bytes().to_vec();
        wire.extend_from_slice(&((MAX_PAYLOAD + 1) as u32).to_be_bytes());
        let mut d = Demux::default();
        d.push(&wire);
        assert_eq!(
            d.next_frame(),
            Err(MuxError::TooLarge {
                conn: 1,
                len: MAX_PAYLOAD + 1
            })
        );
    }
}
