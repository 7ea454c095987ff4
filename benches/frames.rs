//! The relay's frame handling alone, per call, against an engine that
//! passes bytes untouched: the CPU criguard adds on top of a byte relay's
//! syscalls (`hack/bench-proxy.sh` measures those, end to end).
//!
//! Each call is what grpc-go sends and containerd answers for a Version
//! call: request HEADERS and DATA, response HEADERS, DATA and trailers,
//! with both HPACK tables warm. `cargo bench --bench frames`.

use bytes::BytesMut;
use criguard::cri::conn::{Conn, Io};
use criguard::cri::frame::{self, flag, kind};
use std::time::Instant;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` probes bench binaries this way.
    }
    let n = 200_000usize;
    let mut cenc = loona_hpack::Encoder::new();
    let mut senc = loona_hpack::Encoder::new();
    let mut client = Vec::new();
    let mut server = Vec::new();
    for i in 0..n {
        let stream = (2 * i + 1) as u32;
        let block = cenc.encode([
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", b"/runtime.v1.RuntimeService/Version"),
            (b":authority", b"/run/criguard/criguard.sock"),
            (b"content-type", b"application/grpc"),
            (b"user-agent", b"grpc-go/1.51.0"),
            (b"te", b"trailers"),
            (b"grpc-timeout", b"1999875u"),
        ]);
        let mut c = frame::build(kind::HEADERS, flag::END_HEADERS, stream, &block).to_vec();
        c.extend_from_slice(&frame::build(
            kind::DATA,
            flag::END_STREAM,
            stream,
            &[0, 0, 0, 0, 4, 10, 2, b'v', b'1'],
        ));
        client.push(c);
        let h = senc.encode([
            (&b":status"[..], &b"200"[..]),
            (b"content-type", b"application/grpc"),
        ]);
        let t = senc.encode([(&b"grpc-status"[..], &b"0"[..]), (b"grpc-message", b"")]);
        let mut s = frame::build(kind::HEADERS, flag::END_HEADERS, stream, &h).to_vec();
        s.extend_from_slice(&frame::build(
            kind::DATA,
            0,
            stream,
            &[
                0, 0, 0, 0, 30, 10, 28, b'x', b'x', b'x', b'x', b'x', b'x', b'x', b'x', b'x', b'x',
                b'x', b'x', b'x', b'x', b'x', b'x', b'x', b'x', b'x', b'x', b'x', b'x', b'x', b'x',
                b'x', b'x', b'x', b'x',
            ],
        ));
        s.extend_from_slice(&frame::build(
            kind::HEADERS,
            flag::END_HEADERS | flag::END_STREAM,
            stream,
            &t,
        ));
        server.push(s);
    }
    let endpoint = criguard::runtime::RuntimeEndpoint::parse("/x.sock").unwrap();
    let proxy = criguard::cri::Proxy::to(endpoint);
    let mut conn = Conn::new(proxy);
    let mut io = Io::default();
    let mut b = BytesMut::from(&frame::PREFACE[..]);
    conn.on_client(&mut b, &mut io);
    let mut cin = BytesMut::with_capacity(1 << 16);
    let mut sin = BytesMut::with_capacity(1 << 16);
    let t = Instant::now();
    for i in 0..n {
        cin.extend_from_slice(&client[i]);
        conn.on_client(&mut cin, &mut io);
        io.to_server.consume(io.to_server.len());
        sin.extend_from_slice(&server[i]);
        conn.on_server(&mut sin, &mut io);
        io.to_client.consume(io.to_client.len());
    }
    let conn_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    let t = Instant::now();
    for i in 0..n {
        cin.extend_from_slice(&client[i]);
        io.to_server.push(cin.split().freeze());
        io.to_server.consume(io.to_server.len());
        sin.extend_from_slice(&server[i]);
        io.to_client.push(sin.split().freeze());
        io.to_client.consume(io.to_client.len());
    }
    let bytes_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    println!("frame handling, {n} Version calls (grpc-go's headers), CPU per call:");
    println!("  criguard's Conn (frames, HPACK, streams, metrics): {conn_us:.2} µs");
    println!("  bytes passed untouched (baseline):                 {bytes_us:.2} µs");
    println!(
        "  added by frame handling:                           {:.2} µs",
        conn_us - bytes_us
    );
}
