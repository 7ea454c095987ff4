//! The relay's bounds, each probe re-run against a real
//! containerd with criguard as its own process: header blocks, held
//! bodies, criguard's own answers to a client that never reads, floods
//! passed to the runtime, the connection limit and fd exhaustion. Each
//! asserts a generous bound on criguard's peak RSS (VmHWM) where the
//! unbounded relay went to hundreds of MiB, and prints the figure.
//!
//! A binary of its own, not a module of `tests/it/`: these tests exhaust
//! connections, descriptors and memory on purpose, and beside the other
//! modules (admin and cli tests, in a run of the one binary) the
//! connection-limit test's extra call was relayed with 256 connections
//! held. The cause, found later: the start-up probe's connection still
//! held a relay slot while the test's connections arrived (slow teardown
//! on a loaded machine); the test now waits for criguard's connection
//! gauge to read 0 first. They still run by themselves: cargo runs test
//! binaries one after another.

use criguard_test_kit as common;

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use common::containerd::PrivateContainerd;
use criguard::cri::frame::{self, Head, flag, kind};
use criguard::cri::headers::Reader;
use k8s_cri::v1 as cri_api;
use prost::Message;

const VERSION: &str = "/runtime.v1.RuntimeService/Version";
const RUN: &str = "/runtime.v1.RuntimeService/RunPodSandbox";
const MIB: u64 = 1 << 20;

/// `criguard serve` started by this test, quiet (warnings only, to a file).
struct Guard {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// These tests exhaust connections, descriptors and memory on purpose and
/// measure threads, descriptors and RSS, so they take turns. Run side by
/// side, the limit test's extra call was relayed and the fd test logged past
/// its bound, in 2 of 2 runs; alone each passed every time. Why they
/// disturb each other is not found yet (each has its own criguard and
/// containerd).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl Guard {
    async fn start(runtime: &Path, wrapper: &[&str], extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("c.sock");
        let log = dir.path().join("criguard.log");
        let bin = env!("CARGO_BIN_EXE_criguard");
        let mut cmd = match wrapper.split_first() {
            Some((p, args)) => {
                let mut c = Command::new(p);
                c.args(args).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        let out = std::fs::File::create(&log).unwrap();
        let child = cmd
            .arg("serve")
            .arg("--listen")
            .arg(&socket)
            .arg("--admin-socket")
            .arg(dir.path().join("a.sock"))
            .args(if extra.contains(&"--metrics-address") {
                &[][..]
            } else {
                &["--metrics-address", "none"][..]
            })
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--runtime-endpoint")
            .arg(format!("unix://{}", runtime.display()))
            .args(extra)
            .env(
                "CRIGUARD_LOG",
                std::env::var("BOUNDS_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("spawn criguard");
        let g = Self {
            child,
            socket,
            log,
            _dir: dir,
        };
        common::poll_until(Duration::from_secs(20), "criguard's socket", || async {
            UnixStream::connect(&g.socket).ok().map(|_| ())
        })
        .await;
        g
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A field of /proc/PID/status in KiB (VmHWM, VmRSS) or as a count.
    fn status(&self, key: &str) -> u64 {
        status_of(self.pid(), key)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn status_of(pid: u32, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// An HPACK integer with an `n`-bit prefix under `high`.
fn integer(out: &mut BytesMut, n: u8, high: u8, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.put_u8(high | v as u8);
        return;
    }
    out.put_u8(high | max as u8);
    v -= max;
    while v >= 128 {
        out.put_u8((v % 128 + 128) as u8);
        v /= 128;
    }
    out.put_u8(v as u8);
}

/// A literal field without indexing (leaves both tables as they are).
fn literal(out: &mut BytesMut, name: &[u8], value: &[u8]) {
    out.put_u8(0);
    integer(out, 7, 0, name.len());
    out.put_slice(name);
    integer(out, 7, 0, value.len());
    out.put_slice(value);
}

/// A gRPC request's header block for `path`.
fn request_block(path: &str) -> BytesMut {
    let mut b = BytesMut::new();
    literal(&mut b, b":method", b"POST");
    literal(&mut b, b":scheme", b"http");
    literal(&mut b, b":path", path.as_bytes());
    literal(&mut b, b":authority", b"localhost");
    literal(&mut b, b"content-type", b"application/grpc");
    literal(&mut b, b"te", b"trailers");
    b
}

/// The block cut into HEADERS and CONTINUATION frames of 16 KiB.
fn block_frames(stream: u32, block: &[u8], end_stream: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(block.len() + block.len() / 1000 + 64);
    let chunks: Vec<&[u8]> = block.chunks(16_384).collect();
    for (i, c) in chunks.iter().enumerate() {
        let last = i + 1 == chunks.len();
        let (k, mut f) = if i == 0 {
            (kind::HEADERS, if end_stream { flag::END_STREAM } else { 0 })
        } else {
            (kind::CONTINUATION, 0)
        };
        if last {
            f |= flag::END_HEADERS;
        }
        out.extend_from_slice(&frame::build(k, f, stream, c));
    }
    out
}

/// A gRPC message frame.
fn grpc(msg: &[u8]) -> Vec<u8> {
    let mut v = vec![0u8];
    v.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    v.extend_from_slice(msg);
    v
}

/// Preface and an empty SETTINGS.
fn hello() -> Vec<u8> {
    let mut v = frame::PREFACE.to_vec();
    v.extend_from_slice(&frame::build(kind::SETTINGS, 0, 0, &[]));
    v
}

/// Frames read from `s` until `stop` says so, the peer closes or `wait` passes.
fn read_frames(
    s: &mut UnixStream,
    wait: Duration,
    mut stop: impl FnMut(&Head, &[u8]) -> bool,
) -> Vec<(Head, Vec<u8>)> {
    let end = Instant::now() + wait;
    let mut buf = Vec::new();
    let mut got = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        while buf.len() >= frame::HEADER_LEN {
            let h = Head::parse(&buf);
            let total = frame::HEADER_LEN + h.len as usize;
            if buf.len() < total {
                break;
            }
            let payload = buf[frame::HEADER_LEN..total].to_vec();
            buf.drain(..total);
            let done = stop(&h, &payload);
            got.push((h, payload));
            if done {
                return got;
            }
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return got;
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return got,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn goaway(frames: &[(Head, Vec<u8>)]) -> Option<(u32, String)> {
    frames
        .iter()
        .find(|(h, _)| h.kind == kind::GOAWAY)
        .map(|(_, p)| {
            (
                u32::from_be_bytes(p[4..8].try_into().unwrap()),
                String::from_utf8_lossy(&p[8..]).into_owned(),
            )
        })
}

/// The grpc-status and grpc-message of `stream` in the frames read.
fn grpc_status(frames: &[(Head, Vec<u8>)], stream: u32) -> Option<(i32, String)> {
    let mut reader = Reader::new();
    let mut block = Vec::new();
    let mut found = None;
    for (h, p) in frames {
        if matches!(h.kind, kind::HEADERS | kind::CONTINUATION) {
            if h.kind == kind::HEADERS {
                block.clear();
            }
            block.extend_from_slice(frame::block_fragment(h, p).unwrap_or_default());
            if h.has(flag::END_HEADERS) {
                let f = reader.read(&block);
                if h.stream == stream
                    && let Some(code) = f.as_ref().and_then(|f| f.grpc_status)
                {
                    let msg = f.and_then(|f| f.grpc_message).unwrap_or_default();
                    found = Some((code, msg));
                }
            }
        }
    }
    found
}

/// Writes `frames` until the peer stops taking bytes for `stall` (or
/// `total` bytes went); the bytes written.
fn write_until_stalled(s: &mut UnixStream, unit: &[u8], total: usize, stall: Duration) -> usize {
    s.set_nonblocking(true).unwrap();
    let mut written = 0;
    let mut at = 0;
    let mut since = Instant::now();
    while written < total {
        match s.write(&unit[at..]) {
            Ok(n) => {
                written += n;
                at = (at + n) % unit.len();
                since = Instant::now();
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if since.elapsed() >= stall {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(_) => break,
        }
    }
    s.set_nonblocking(false).unwrap();
    written
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_blocks_are_capped_at_the_runtimes_header_list_size() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let ctrd = PrivateContainerd::start();
    let g = Guard::start(&ctrd.socket, &[], &[]).await;
    let base = g.status("VmHWM");
    let socket = g.socket.clone();

    // The CONTINUATION flood: one block of 64 MiB, never ended.
    let flood = tokio::task::spawn_blocking(move || {
        let mut s = UnixStream::connect(&socket).unwrap();
        s.write_all(&hello()).unwrap();
        let mut block = request_block(VERSION);
        block.resize(64 << 20, 0x40);
        let frames = block_frames(1, &block, false);
        // Without END_HEADERS on the last frame: the flood never ends.
        let frames = &frames[..frames.len() - 16_393];
        let written = write_until_stalled(&mut s, frames, frames.len(), Duration::from_secs(3));
        let got = read_frames(&mut s, Duration::from_secs(5), |h, _| {
            h.kind == kind::GOAWAY
        });
        (written, goaway(&got))
    });
    let (written, refused) = flood.await.unwrap();
    let flood_peak = g.status("VmHWM");
    eprintln!(
        "CONTINUATION flood: {:.1} MiB written, criguard VmHWM {:.1} → {:.1} MiB, answer {refused:?}",
        written as f64 / MIB as f64,
        mib(base),
        mib(flood_peak)
    );
    let (code, debug) = refused.expect("a GOAWAY for the oversized block");
    assert_eq!(
        code, 0x1,
        "PROTOCOL_ERROR, as x/net/http2 ends such a block"
    );
    assert!(
        debug.contains("header block over 16777216 bytes"),
        "{debug}"
    );
    assert!(
        written < 40 << 20,
        "criguard read {written} bytes of one header block"
    );
    assert!(
        flood_peak < base + 40 * 1024,
        "a 64 MiB CONTINUATION flood took criguard from {base} to {flood_peak} KiB (103 MiB before the cap)"
    );

    // Eight concurrent 15 MiB header blocks the runtime accepts: they
    // pass, within the hold budget, and the memory goes back.
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let socket = g.socket.clone();
            tokio::task::spawn_blocking(move || {
                let mut s = UnixStream::connect(&socket).unwrap();
                let mut block = request_block(VERSION);
                literal(&mut block, b"x-pad", &vec![b'p'; 15 << 20]);
                let mut out = hello();
                out.extend_from_slice(&block_frames(1, &block, false));
                out.extend_from_slice(&frame::build(
                    kind::DATA,
                    flag::END_STREAM,
                    1,
                    &grpc(&cri_api::VersionRequest::default().encode_to_vec()),
                ));
                let writer = {
                    let mut s = s.try_clone().unwrap();
                    std::thread::spawn(move || s.write_all(&out))
                };
                let got = read_frames(&mut s, Duration::from_secs(60), |h, _| {
                    h.stream == 1 && h.has(flag::END_STREAM)
                });
                let _ = writer.join();
                grpc_status(&got, 1)
            })
        })
        .collect();
    for c in calls {
        let status = c.await.unwrap();
        assert_eq!(
            status.as_ref().map(|s| s.0),
            Some(0),
            "a 15 MiB header block the runtime accepts passes: {status:?}"
        );
    }
    let peak = g.status("VmHWM");
    let after = g.status("VmRSS");
    eprintln!(
        "8 × 15 MiB header blocks: criguard VmHWM {:.1} MiB, VmRSS after {:.1} MiB",
        mib(peak),
        mib(after)
    );
    assert!(
        peak < base + 110 * 1024,
        "eight 15 MiB blocks took criguard to {peak} KiB (154 MiB before the budget)"
    );
    assert!(
        after < base + 24 * 1024,
        "criguard kept {after} KiB after the blocks were gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_bodies_stay_within_the_shared_budget_and_are_given_back() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let ctrd = PrivateContainerd::start();
    let g = Guard::start(&ctrd.socket, &[], &[]).await;
    let base = g.status("VmHWM");
    let pod = common::pods::besteffort_pod("uid-big");
    let mut config = pod.container_config(0);
    config
        .annotations
        .insert("padding".into(), "x".repeat(15 << 20));
    let request = cri_api::CreateContainerRequest {
        pod_sandbox_id: "no-such-sandbox".into(),
        config: Some(config),
        sandbox_config: Some(pod.sandbox_config()),
    };
    let direct = common::containerd::Clients::new(&ctrd.socket)
        .rt
        .create_container(request.clone())
        .await
        .expect_err("no such sandbox")
        .code();
    let calls: Vec<_> = (0..16)
        .map(|_| {
            let mut rt = common::containerd::Clients::new(&g.socket).rt;
            let req = request.clone();
            tokio::spawn(async move { rt.create_container(req).await })
        })
        .collect();
    for c in calls {
        let err = c.await.unwrap().expect_err("no such sandbox");
        assert_eq!(err.code(), direct, "as direct: {err}");
    }
    let peak = g.status("VmHWM");
    let after = g.status("VmRSS");
    eprintln!(
        "16 × 15 MiB CreateContainer: criguard VmHWM {:.1} → {:.1} MiB, VmRSS after {:.1} MiB",
        mib(base),
        mib(peak),
        mib(after)
    );
    // The 64 MiB budget covers the held bodies, the observer's work on
    // them and the requests kept for their answers; 32 MiB for the rest.
    // 71 MiB above the base on a loaded machine; 154 MiB when a taken body
    // still shared its buffer with the call until the answer came.
    assert!(
        peak < base + 96 * 1024,
        "sixteen 15 MiB bodies took criguard to {peak} KiB from {base} KiB (285 MiB before the budget)"
    );
    assert!(
        after < base + 24 * 1024,
        "criguard kept {after} KiB after the calls"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_refusals_to_a_client_that_never_reads_stay_bounded() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let ctrd = PrivateContainerd::start();
    // Under MemoryPressure from the start: BestEffort pods are refused.
    let g = Guard::start(
        &ctrd.socket,
        &[],
        &["--eviction-hard=memory.available<100000Gi"],
    )
    .await;
    let base = g.status("VmHWM");
    let body = cri_api::RunPodSandboxRequest {
        config: Some(common::pods::besteffort_pod("uid-refused").sandbox_config()),
        runtime_handler: String::new(),
    }
    .encode_to_vec();
    // Once criguard has observed the pressure, it refuses this pod.
    let socket = g.socket.clone();
    let body2 = body.clone();
    let first = tokio::task::spawn_blocking(move || {
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let mut s = UnixStream::connect(&socket).unwrap();
            let mut out = hello();
            out.extend_from_slice(&block_frames(1, &request_block(RUN), false));
            let data = grpc(&body2);
            out.extend_from_slice(&frame::build(kind::DATA, flag::END_STREAM, 1, &data));
            s.write_all(&out).unwrap();
            let got = read_frames(&mut s, Duration::from_secs(30), |h, _| {
                h.stream == 1 && h.has(flag::END_STREAM)
            });
            let status = grpc_status(&got, 1);
            if status.as_ref().is_some_and(|s| s.0 == 8) || Instant::now() >= end {
                return status;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    })
    .await
    .unwrap();
    assert_eq!(
        first.as_ref().map(|s| s.0),
        Some(8),
        "RESOURCE_EXHAUSTED from criguard: {first:?}"
    );
    // Then 400 000 of them on a connection that never reads.
    let socket = g.socket.clone();
    let flood = tokio::task::spawn_blocking(move || {
        let mut s = UnixStream::connect(&socket).unwrap();
        s.write_all(&hello()).unwrap();
        let block = request_block(RUN);
        let data = grpc(&body);
        let mut unit = Vec::new();
        let mut sent = 0usize;
        let per_call = block_frames(1, &block, false).len() + frame::HEADER_LEN + data.len();
        let end = Instant::now() + Duration::from_secs(60);
        let mut stream = 3u32;
        while sent < 400_000 && Instant::now() < end {
            unit.clear();
            for _ in 0..1000 {
                unit.extend_from_slice(&block_frames(stream, &block, false));
                unit.extend_from_slice(&frame::build(kind::DATA, flag::END_STREAM, stream, &data));
                stream += 2;
            }
            let n = write_until_stalled(&mut s, &unit, unit.len(), Duration::from_secs(3));
            sent += n / per_call;
            if n < unit.len() {
                break;
            }
        }
        (sent, s)
    });
    let (sent, _conn) = flood.await.unwrap();
    let peak = g.status("VmHWM");
    eprintln!(
        "refusal flood, never read: {sent} calls taken, criguard VmHWM {:.1} → {:.1} MiB",
        mib(base),
        mib(peak)
    );
    assert!(
        sent < 100_000,
        "criguard kept reading a client that never reads its answers ({sent} calls)"
    );
    assert!(
        peak < base + 32 * 1024,
        "the refusal flood took criguard to {peak} KiB (196 MiB at 400 000 before)"
    );
}

/// SETTINGS frames a client that never reads can push at `socket`
/// before it stops taking them.
fn settings_flood(socket: &Path) -> usize {
    let mut s = UnixStream::connect(socket).unwrap();
    s.write_all(frame::PREFACE).unwrap();
    let one = frame::build(kind::SETTINGS, 0, 0, &[0, 4, 0, 1, 0, 0]);
    let unit: Vec<u8> = one.iter().copied().cycle().take(one.len() * 4096).collect();
    let n = write_until_stalled(&mut s, &unit, one.len() * 2_000_000, Duration::from_secs(3));
    n / one.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_reach_the_runtime_no_harder_than_direct_and_its_goaway_comes_back() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let ctrd = PrivateContainerd::start();
    let g = Guard::start(&ctrd.socket, &[], &[]).await;
    let base = g.status("VmHWM");
    let (direct_sock, via_sock) = (ctrd.socket.clone(), g.socket.clone());
    let (direct, via) = tokio::task::spawn_blocking(move || {
        (settings_flood(&direct_sock), settings_flood(&via_sock))
    })
    .await
    .unwrap();
    let peak = g.status("VmHWM");
    eprintln!(
        "SETTINGS flood, never read: {direct} taken direct, {via} through criguard; criguard VmHWM {:.1} → {:.1} MiB",
        mib(base),
        mib(peak)
    );
    assert!(
        via <= 4 * direct.max(10_000),
        "through criguard {via} SETTINGS got in, {direct} direct (14× before)"
    );
    assert!(peak < base + 32 * 1024, "criguard went to {peak} KiB");

    // A PING flood: containerd ends it with GOAWAY ENHANCE_YOUR_CALM, and
    // the client sees that GOAWAY through criguard as it does direct.
    for (name, socket) in [
        ("direct", ctrd.socket.clone()),
        ("criguard", g.socket.clone()),
    ] {
        let answer = tokio::task::spawn_blocking(move || {
            let mut s = UnixStream::connect(&socket).unwrap();
            s.write_all(&hello()).unwrap();
            let mut w = s.try_clone().unwrap();
            let pinger = std::thread::spawn(move || {
                let ping = frame::build(kind::PING, 0, 0, &[7; 8]);
                for _ in 0..100_000 {
                    if w.write_all(&ping).is_err() {
                        return;
                    }
                }
            });
            let got = read_frames(&mut s, Duration::from_secs(20), |h, _| {
                h.kind == kind::GOAWAY
            });
            drop(s);
            let _ = pinger.join();
            goaway(&got)
        })
        .await
        .unwrap();
        eprintln!("PING flood {name}: {answer:?}");
        let (code, debug) = answer.unwrap_or_else(|| panic!("{name}: no GOAWAY"));
        assert_eq!(code, 0xb, "{name}: ENHANCE_YOUR_CALM");
        assert!(debug.contains("too_many_pings"), "{name}: {debug}");
    }
}

/// Threads of process `pid`.
fn threads(pid: u32) -> u64 {
    status_of(pid, "Threads")
}

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// A Version call on a new connection: its grpc-status and message.
fn version_call(socket: &Path) -> Option<(i32, String)> {
    call_on(&mut UnixStream::connect(socket).ok()?)
}

/// A Version call on `s`, a fresh connection.
fn call_on(s: &mut UnixStream) -> Option<(i32, String)> {
    let mut out = hello();
    out.extend_from_slice(&block_frames(1, &request_block(VERSION), false));
    out.extend_from_slice(&frame::build(
        kind::DATA,
        flag::END_STREAM,
        1,
        &grpc(&cri_api::VersionRequest::default().encode_to_vec()),
    ));
    s.write_all(&out).ok()?;
    let got = read_frames(s, Duration::from_secs(10), |h, _| {
        h.stream == 1 && h.has(flag::END_STREAM)
    });
    grpc_status(&got, 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_are_refused_clearly() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let ctrd = PrivateContainerd::start();
    // The default limit (256) with the flag set as an operator would.
    let port = common::metrics::free_port();
    let metrics = format!("127.0.0.1:{port}");
    let g = Guard::start(
        &ctrd.socket,
        &[],
        &["--max-connections", "256", "--metrics-address", &metrics],
    )
    .await;
    // Guard::start's probe connection holds a slot until its relay has
    // torn down (slow on a loaded machine): counted in, the 256th of the
    // connections below was refused and the extra call then relayed.
    common::poll_until(
        Duration::from_secs(20),
        "the probe connection gone",
        || async {
            (common::metrics::scraped(port, "criguard_cri_connections", &[]) == Some(0.0))
                .then_some(())
        },
    )
    .await;
    let (pid, socket) = (g.pid(), g.socket.clone());
    let base = threads(pid);
    let (held, refused, t, f) = tokio::task::spawn_blocking(move || {
        // 300 idle connections: the first 256 are relayed.
        let held: Vec<UnixStream> = (0..300)
            .filter_map(|_| UnixStream::connect(&socket).ok())
            .collect();
        let end = Instant::now() + Duration::from_secs(10);
        while threads(pid) < base + 256 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(50));
        }
        let refused = version_call(&socket);
        (held.len(), refused, threads(pid), fds(pid))
    })
    .await
    .unwrap();
    eprintln!("{held} connections held: {t} threads, {f} fds; one more: {refused:?}");
    let (code, msg) = refused.expect("an answer past the limit, not a hang");
    assert_eq!(code, 14, "UNAVAILABLE");
    assert_eq!(msg, "criguard: connection limit 256 reached");
    assert!(t < 256 + 40, "{t} threads for 256 relayed connections");
    assert!(f < 256 * 3 + 150, "{f} descriptors");
    assert!(
        g.log().contains("connection limit 256 reached"),
        "logged: {}",
        g.log()
    );
    let lines = g.log().matches("connection limit").count();
    assert!(lines <= 2, "{lines} log lines for the refusals");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fd_exhaustion_is_answered_and_logged_as_what_it_is() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let ctrd = PrivateContainerd::start();
    let g = Guard::start(&ctrd.socket, &["prlimit", "--nofile=512:512"], &[]).await;
    // 300 clients at once, each keeping its connection once answered
    // until every client has its answer.
    let (tx, rx) = std::sync::mpsc::channel();
    let gate = std::sync::Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let clients: Vec<_> = (0..300)
        .map(|_| {
            let (socket, tx, gate) = (g.socket.clone(), tx.clone(), gate.clone());
            std::thread::spawn(move || {
                let mut s = UnixStream::connect(&socket).ok();
                let answer = s.as_mut().and_then(call_on);
                let _ = tx.send(answer);
                let (open, opened) = &*gate;
                let _open = opened
                    .wait_while(open.lock().unwrap(), |open| !*open)
                    .unwrap();
                drop(s);
            })
        })
        .collect();
    drop(tx);
    let answers: Vec<_> = tokio::task::spawn_blocking(move || {
        let end = Instant::now() + Duration::from_secs(60);
        let mut answers = Vec::new();
        while answers.len() < 300 {
            match rx.recv_timeout(end.saturating_duration_since(Instant::now())) {
                Ok(a) => answers.push(a),
                Err(_) => break,
            }
        }
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        answers
    })
    .await
    .unwrap();
    assert_eq!(answers.len(), 300, "every client answered within 60 s");
    for c in clients {
        c.join().unwrap();
    }
    let ok = answers.iter().filter(|a| matches!(a, Some((0, _)))).count();
    let fds = answers
        .iter()
        .filter(|a| matches!(a, Some((14, m)) if m.contains("out of file descriptors")))
        .count();
    // Connections answered for fd exhaustion count against the limit too.
    let limit = answers
        .iter()
        .filter(|a| matches!(a, Some((14, m)) if m.contains("connection limit")))
        .count();
    let other: Vec<_> = answers
        .iter()
        .filter(|a| !matches!(a, Some((0, _))))
        .filter(|a| {
            !matches!(a, Some((14, m)) if m.contains("out of file descriptors") || m.contains("connection limit"))
        })
        .collect();
    eprintln!(
        "300 clients under 512 fds: {ok} relayed, {fds} refused naming fd exhaustion, {limit} at the connection limit, others {other:?}"
    );
    assert!(fds > 0, "some clients met the fd limit");
    assert!(
        other.is_empty(),
        "every client is relayed or told criguard is out of descriptors: {other:?}"
    );
    let log = g.log();
    assert!(log.contains("out of file descriptors"), "logged: {log}");
    assert!(
        log.matches("out of file descriptors").count() <= 3,
        "rate-limited: {log}"
    );
    // Once the connections are gone, calls are relayed again.
    let socket = g.socket.clone();
    common::poll_until(Duration::from_secs(10), "relaying again", || {
        let socket = socket.clone();
        async move {
            tokio::task::spawn_blocking(move || version_call(&socket))
                .await
                .unwrap()
                .filter(|(c, _)| *c == 0)
        }
    })
    .await;
}
