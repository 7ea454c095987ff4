//! Reading the peers' header blocks, and writing criguard's own.
//!
//! Each direction of a connection has one HPACK context shared by its two
//! peers. criguard forwards every header block byte for byte, so the peers'
//! tables stay in step by themselves; criguard keeps a shadow decoder per
//! direction, fed the same blocks in the same order, only to read `:path`
//! and `grpc-status`. Its own answers are encoded with literals that never
//! touch the dynamic table, so they change neither peer's state.

use bytes::{BufMut, Bytes, BytesMut};

use super::frame::{self, flag, kind};
use super::hpack::encode_integer;

/// What criguard reads from one header block.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Fields {
    /// `:path` (requests).
    pub path: Option<String>,
    /// `grpc-status` (answers: trailers, or headers of a trailers-only answer).
    pub grpc_status: Option<i32>,
    /// `grpc-message`, as sent (percent-encoded).
    pub grpc_message: Option<String>,
    /// Whether the block carries `content-length` (gRPC clients send none).
    pub content_length: bool,
}

/// A shadow HPACK decoder for one direction of a connection.
pub struct Reader {
    decoder: super::hpack::Decoder,
    broken: bool,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("broken", &self.broken)
            .finish()
    }
}

impl Default for Reader {
    fn default() -> Self {
        Self::new()
    }
}

impl Reader {
    /// A decoder with the protocol's initial table.
    pub fn new() -> Self {
        // No table size limit of criguard's own: the receiving peer
        // enforces its SETTINGS_HEADER_TABLE_SIZE, and a block it refuses
        // ends the connection there.
        Self {
            decoder: super::hpack::Decoder::new(),
            broken: false,
        }
    }

    /// Whether a block failed to decode. The peer that received it fails
    /// too (a decoding error is fatal to an HTTP/2 connection), so nothing
    /// later on this connection is read.
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Marks this direction unreadable: a block was not decoded (too large
    /// to hold), so the dynamic table is out of step from here on.
    pub fn set_broken(&mut self) {
        self.broken = true;
    }

    /// Decodes a whole header block (all its fragments joined); `None` once
    /// this direction is broken.
    pub fn read(&mut self, block: &[u8]) -> Option<Fields> {
        if self.broken {
            return None;
        }
        let mut fields = Fields::default();
        let decoded = self.decoder.decode(block, |name, value| {
            match name {
                b":path" => fields.path = Some(String::from_utf8_lossy(value).into_owned()),
                b"grpc-status" => {
                    fields.grpc_status =
                        std::str::from_utf8(value).ok().and_then(|v| v.parse().ok())
                }
                b"content-length" => fields.content_length = true,
                b"grpc-message" => {
                    fields.grpc_message = Some(String::from_utf8_lossy(value).into_owned())
                }
                _ => {}
            };
        });
        match decoded {
            Ok(()) => Some(fields),
            Err(err) => {
                tracing::debug!(
                    ?err,
                    "header block not decodable; the peer will refuse it too"
                );
                self.broken = true;
                None
            }
        }
    }
}

/// Appends a literal header field without indexing, new name (RFC 7541
/// §6.2.2, no Huffman): it leaves the decoder's dynamic table as it was.
fn literal(out: &mut BytesMut, name: &str, value: &[u8]) {
    out.put_u8(0x00);
    string(out, name.as_bytes());
    string(out, value);
}

fn string(out: &mut BytesMut, s: &[u8]) {
    encode_integer(out, 7, 0x00, s.len());
    out.put_slice(s);
}

/// Percent-encodes a grpc-message value as the gRPC spec asks.
pub fn percent_encode(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    for b in msg.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A trailers-only gRPC answer on `stream` (HEADERS with END_STREAM):
/// `:status 200`, `content-type application/grpc`, `grpc-status` and
/// `grpc-message`, none of them touching either HPACK table. The message
/// is cut to fit in one frame of `max_frame` bytes.
pub fn trailers_only(stream: u32, code: i32, message: &str, max_frame: u32) -> Bytes {
    let mut block = BytesMut::with_capacity(64 + message.len());
    block.put_u8(0x88); // indexed static entry 8, `:status: 200`
    literal(&mut block, "content-type", b"application/grpc");
    literal(&mut block, "grpc-status", code.to_string().as_bytes());
    let room = (max_frame as usize)
        .saturating_sub(block.len() + 32)
        .min(4096);
    let mut msg = percent_encode(message);
    if msg.len() > room {
        let mut cut = room;
        while !msg.is_char_boundary(cut) {
            cut -= 1;
        }
        msg.truncate(cut);
    }
    literal(&mut block, "grpc-message", msg.as_bytes());
    frame::build(
        kind::HEADERS,
        flag::END_HEADERS | flag::END_STREAM,
        stream,
        &block,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(headers: &[(&[u8], &[u8])], enc: &mut loona_hpack::Encoder) -> Vec<u8> {
        enc.encode(headers.iter().copied())
    }

    #[test]
    fn reads_path_and_status_across_blocks_that_use_the_dynamic_table() {
        let mut enc = loona_hpack::Encoder::new();
        let mut reader = Reader::new();
        let req: &[(&[u8], &[u8])] = &[
            (b":method", b"POST"),
            (b":path", b"/runtime.v1.RuntimeService/Version"),
            (b":authority", b"/run/criguard/criguard.sock"),
        ];
        for _ in 0..3 {
            let fields = reader.read(&encode(req, &mut enc)).unwrap();
            assert_eq!(
                fields.path.as_deref(),
                Some("/runtime.v1.RuntimeService/Version")
            );
        }
        let trailers: &[(&[u8], &[u8])] = &[(b"grpc-status", b"5"), (b"grpc-message", b"x%20y")];
        let fields = reader.read(&encode(trailers, &mut enc)).unwrap();
        assert_eq!(fields.grpc_status, Some(5));
        assert_eq!(fields.grpc_message.as_deref(), Some("x%20y"));
    }

    #[test]
    fn a_corrupt_block_breaks_the_reader_for_good() {
        let mut reader = Reader::new();
        assert!(reader.read(&[0xff, 0xff, 0xff, 0xff, 0x7f]).is_none());
        assert!(reader.is_broken());
        assert!(reader.read(&[0x88]).is_none());
    }

    #[test]
    fn trailers_only_decodes_and_leaves_the_table_unchanged() {
        let f = trailers_only(3, 8, "criguard: node has MemoryPressure; 100% sure", 16_384);
        let head = frame::Head::parse(&f);
        assert_eq!(head.kind, kind::HEADERS);
        assert_eq!(head.stream, 3);
        assert!(head.has(flag::END_STREAM) && head.has(flag::END_HEADERS));
        let block = &f[frame::HEADER_LEN..];
        // A peer's decoder reads it, and its next indexed reference to the
        // first dynamic entry still fails: nothing was inserted.
        let mut dec = loona_hpack::Decoder::new();
        let got = dec.decode(block).unwrap();
        assert_eq!(got[0], (b":status".to_vec(), b"200".to_vec()));
        assert_eq!(got[2], (b"grpc-status".to_vec(), b"8".to_vec()));
        assert_eq!(
            got[3].1,
            b"criguard: node has MemoryPressure; 100%25 sure".to_vec()
        );
        assert!(
            dec.decode(&[0xbe]).is_err(),
            "dynamic index 62 must not exist"
        );
    }

    #[test]
    fn long_messages_are_cut_to_one_frame() {
        let f = trailers_only(1, 14, &"é".repeat(10_000), 16_384);
        assert!(f.len() <= frame::HEADER_LEN + 16_384);
        let mut dec = loona_hpack::Decoder::new();
        assert!(dec.decode(&f[frame::HEADER_LEN..]).is_ok());
    }

    #[test]
    fn integers_with_continuation_octets() {
        let mut b = BytesMut::new();
        encode_integer(&mut b, 7, 0, 1337 + 127 - 127);
        let mut dec = loona_hpack::Decoder::new();
        // A literal with a 1337-byte name parses only if the length is right.
        let mut block = BytesMut::new();
        block.put_u8(0);
        block.extend_from_slice(&b);
        block.extend_from_slice(&vec![b'a'; 1337]);
        block.put_u8(1);
        block.put_u8(b'v');
        assert_eq!(dec.decode(&block).unwrap()[0].0.len(), 1337);
    }
}
