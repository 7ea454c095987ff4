//! Entry points for the fuzz targets in `fuzz/` and for the corpus replay
//! test: whatever bytes the peers send, the relay must neither panic nor
//! hold more than its bounds allow.
//!
//! An input is a script of steps. Each step is one tag byte, then (for the
//! byte-carrying steps) a two-byte big-endian length and that many bytes:
//! `0` bytes from the client, `1` bytes from the runtime, `2` the node
//! model becomes ready, `3` a drain starts, `4` the answer deadline
//! passes. The client's preface is sent before the script runs, so the
//! fuzzer spends its time on frames. The caller gives the observer (the
//! fuzz targets and the corpus replay give criguard's own,
//! `criguard::intercept::fuzz_observer`), so the relay's code knows no pods.

use bytes::BytesMut;

use super::conn::{Conn, Io};
use super::frame;
use super::observe::Observe;
use super::proxy::{Proxy, Ready};
use crate::runtime::RuntimeEndpoint;

/// Bytes criguard may queue beyond what the peers sent it: its own
/// frames (credit, answers, resets) are small and few per input byte.
const OWN_FRAMES_PER_INPUT_BYTE: usize = 64;

/// Runs one script through a fresh connection watched by `observer` (see
/// the module docs).
pub fn relay(observer: impl Observe, script: &[u8]) {
    let ready = Ready::default();
    let proxy = Proxy::to(RuntimeEndpoint::parse("/fuzz.sock").expect("a valid path"))
        .with_observer(observer)
        .with_ready(ready.clone());
    let mut conn = Conn::new(proxy);
    let mut io = Io::default();
    let (mut client, mut server) = (BytesMut::new(), BytesMut::new());
    client.extend_from_slice(frame::PREFACE);
    conn.on_client(&mut client, &mut io);
    let mut fed = frame::PREFACE.len();
    let mut rest = script;
    while let Some((&tag, tail)) = rest.split_first() {
        rest = tail;
        match tag % 5 {
            0 | 1 => {
                let Some((len, tail)) = rest.split_first_chunk::<2>() else {
                    break;
                };
                let n = (u16::from_be_bytes(*len) as usize).min(tail.len());
                let (bytes, tail) = tail.split_at(n);
                rest = tail;
                fed += n;
                if tag % 5 == 0 {
                    client.extend_from_slice(bytes);
                    conn.on_client(&mut client, &mut io);
                } else {
                    server.extend_from_slice(bytes);
                    conn.on_server(&mut server, &mut io);
                }
            }
            2 => {
                ready.set();
                if conn.wants_ready() {
                    conn.on_ready(&mut io);
                }
            }
            3 => conn.drain(&mut io),
            _ => conn.on_deadline(&mut io),
        }
        let queued = io.to_client.len() + io.to_server.len() + client.len() + server.len();
        assert!(
            queued <= fed * OWN_FRAMES_PER_INPUT_BYTE + 4096,
            "{queued} bytes queued from {fed} bytes of input"
        );
        // What a peer has not yet taken is dropped, as writes would.
        io.to_client.take_all();
        io.to_server.take_all();
    }
}

/// Decodes `block` as a header block, then as a continuation of the
/// previous ones, and encodes an answer from what it read.
pub fn header_block(block: &[u8]) {
    let mut reader = super::headers::Reader::new();
    let (first, second) = block.split_at(block.len() / 2);
    for part in [first, second, block] {
        if let Some(fields) = reader.read(part) {
            let msg = fields.grpc_message.unwrap_or_default();
            let f = super::headers::trailers_only(1, fields.grpc_status.unwrap_or(2), &msg, 16_384);
            assert!(f.len() <= frame::HEADER_LEN + 16_384);
        }
    }
}
