//! Scripted exchanges with one [`Conn`]: exact frames in, exact frames out.
//! The observer is a stand-in ([`Scripted`]) with the two answers the relay
//! must carry out, a patch and a refusal: the relay knows no pods, and
//! criguard's own observer is tested in `crate::intercept` and, through the
//! relay, by the integration tests.

use bytes::{Bytes, BytesMut};
use k8s_cri::v1 as cri;
use prost::Message;

use super::conn::{Conn, Io};
use super::frame::{self, Head, error, flag, kind, setting};
use super::observe::{self, Method, Observe, RequestPlan};
use super::proxy::Proxy;
use crate::model::fixtures;
use crate::runtime::RuntimeEndpoint;

/// The cgroup of the test pod's sandbox, under the cgroupfs driver.
const SANDBOX_CGROUP: &str = "/kubepods/besteffort/poduid-1";

const CREATE: &str = "/runtime.v1.RuntimeService/CreateContainer";
const RUN: &str = "/runtime.v1.RuntimeService/RunPodSandbox";

/// The bytes [`Scripted`] appends to each CreateContainer: an empty
/// `config` field (2, length-delimited), which a decoder merges as nothing.
const PATCH: &[u8] = &[0x12, 0x00];

/// A stand-in observer: it patches every CreateContainer with [`PATCH`]
/// and, with `refuse`, refuses every RunPodSandbox, as criguard's admission
/// refuses a pod under node pressure.
#[derive(Debug)]
struct Scripted {
    refuse: bool,
}

impl Observe for Scripted {
    fn on_request(&self, method: Method, _msg: &[u8]) -> RequestPlan {
        match method {
            Method::CreateContainer => RequestPlan {
                patch: Some(PATCH.to_vec()),
                refuse: None,
            },
            Method::RunPodSandbox if self.refuse => RequestPlan {
                patch: None,
                refuse: Some("the node has pressure".into()),
            },
            _ => RequestPlan::default(),
        }
    }

    fn on_response(&self, _method: Method, _req: &[u8], _resp: &[u8]) {}
}

struct Harness {
    conn: Conn,
    io: Io,
    client_enc: loona_hpack::Encoder<'static>,
    server_enc: loona_hpack::Encoder<'static>,
}

fn create_body(padding: usize) -> Bytes {
    let mut config = fixtures::container_config();
    config.annotations.insert("pad".into(), "x".repeat(padding));
    let msg = cri::CreateContainerRequest {
        pod_sandbox_id: "sb1".into(),
        config: Some(config),
        sandbox_config: Some(fixtures::sandbox_config(SANDBOX_CGROUP)),
    }
    .encode_to_vec();
    observe::frame(&msg, None)
}

fn run_body() -> Bytes {
    let msg = cri::RunPodSandboxRequest {
        config: Some(fixtures::sandbox_config(SANDBOX_CGROUP)),
        runtime_handler: String::new(),
    }
    .encode_to_vec();
    observe::frame(&msg, None)
}

/// Frames and their payloads.
type Frames = Vec<(Head, Vec<u8>)>;

fn frames(mut b: &[u8]) -> Frames {
    if b.starts_with(frame::PREFACE) {
        b = &b[frame::PREFACE.len()..];
    }
    let mut v = Vec::new();
    while !b.is_empty() {
        let h = Head::parse(b);
        let end = frame::HEADER_LEN + h.len as usize;
        v.push((h, b[frame::HEADER_LEN..end].to_vec()));
        b = &b[end..];
    }
    v
}

fn window_updates(fs: &[(Head, Vec<u8>)]) -> Vec<(u32, u32)> {
    fs.iter()
        .filter(|(h, _)| h.kind == kind::WINDOW_UPDATE)
        .map(|(h, p)| (h.stream, frame::increment(p).unwrap()))
        .collect()
}

fn data_len(fs: &[(Head, Vec<u8>)], stream: u32) -> usize {
    fs.iter()
        .filter(|(h, _)| h.kind == kind::DATA && h.stream == stream)
        .map(|(_, p)| p.len())
        .sum()
}

impl Harness {
    /// A connection whose observer refuses RunPodSandbox when `refuse`.
    fn new(refuse: bool) -> Self {
        let mut h = Self::before_runtime_settings(refuse);
        h.server(&frame::build(kind::SETTINGS, 0, 0, &[]));
        h.take();
        h
    }

    /// [`Harness::new`] before the runtime's SETTINGS: the client's preface
    /// and SETTINGS are in, nothing from the runtime yet.
    fn before_runtime_settings(refuse: bool) -> Self {
        let observer = Scripted { refuse };
        let proxy =
            Proxy::to(RuntimeEndpoint::parse("/nonexistent.sock").unwrap()).with_observer(observer);
        let mut h = Self {
            conn: Conn::new(proxy),
            io: Io::default(),
            client_enc: loona_hpack::Encoder::new(),
            server_enc: loona_hpack::Encoder::new(),
        };
        let mut hello = BytesMut::from(&frame::PREFACE[..]);
        hello.extend_from_slice(&frame::build(kind::SETTINGS, 0, 0, &[]));
        h.client(&hello);
        h.take();
        h
    }

    fn client(&mut self, b: &[u8]) {
        let mut input = BytesMut::from(b);
        self.conn.on_client(&mut input, &mut self.io);
        assert!(input.is_empty(), "a whole frame was left unread");
    }

    fn server(&mut self, b: &[u8]) {
        let mut input = BytesMut::from(b);
        self.conn.on_server(&mut input, &mut self.io);
        assert!(input.is_empty(), "a whole frame was left unread");
    }

    /// What the conn sent (to the server, to the client) since the last take.
    fn take(&mut self) -> (Frames, Frames) {
        (
            frames(&self.io.to_server.take_all()),
            frames(&self.io.to_client.take_all()),
        )
    }

    fn request(&mut self, stream: u32, path: &str) -> Bytes {
        let block = self.client_enc.encode([
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", path.as_bytes()),
            (b":authority", b"/run/criguard/criguard.sock"),
            (b"content-type", b"application/grpc"),
        ]);
        frame::build(kind::HEADERS, flag::END_HEADERS, stream, &block)
    }

    fn response_headers(&mut self, stream: u32) -> Bytes {
        let block = self.server_enc.encode([
            (&b":status"[..], &b"200"[..]),
            (b"content-type", b"application/grpc"),
        ]);
        frame::build(kind::HEADERS, flag::END_HEADERS, stream, &block)
    }
}

fn data(stream: u32, payload: &[u8], end: bool) -> Bytes {
    let flags = if end { flag::END_STREAM } else { 0 };
    frame::build(kind::DATA, flags, stream, payload)
}

#[test]
fn credit_for_a_held_body_is_returned_exactly_once() {
    let mut h = Harness::new(false);
    let body = create_body(1_000);
    let (first, rest) = body.split_at(1_000);
    let req = h.request(1, CREATE);
    h.client(&req);
    h.client(&data(1, first, false));
    let (to_server, to_client) = h.take();
    assert_eq!(data_len(&to_server, 1), 0, "held until END_STREAM");
    assert_eq!(
        window_updates(&to_client),
        [(1, 1_000), (0, 1_000)],
        "held bytes credited at once"
    );

    h.client(&data(1, rest, true));
    let (to_server, to_client) = h.take();
    let sent = data_len(&to_server, 1);
    let k = sent - body.len();
    assert!(k > 0, "the patch adds bytes");
    assert!(to_server.last().unwrap().0.has(flag::END_STREAM));
    assert!(window_updates(&to_client).is_empty());

    // The runtime credits what it received; the client gets exactly what it
    // is still owed (the final frame), on the connection and the stream.
    h.server(&frame::window_update(0, sent as u32));
    h.server(&frame::window_update(1, sent as u32));
    let (_, to_client) = h.take();
    let owed = (body.len() - 1_000) as u32;
    assert_eq!(window_updates(&to_client), [(0, owed), (1, owed)]);
    // Debt paid: later credit passes as it is.
    h.server(&frame::window_update(0, 77));
    assert_eq!(window_updates(&h.take().1), [(0, 77)]);
}

#[test]
fn a_patch_waits_for_the_runtime_window() {
    let mut h = Harness::new(false);
    // An unobserved call leaves 35 bytes of the runtime's connection window.
    let req = h.request(1, "/runtime.v1.RuntimeService/Version");
    h.client(&req);
    for last in [false, false, false, true] {
        h.client(&data(1, &vec![0u8; 16_375], last));
    }
    assert_eq!(data_len(&h.take().0, 1), 65_500);

    let body = create_body(100);
    let req = h.request(3, CREATE);
    h.client(&req);
    h.client(&data(3, &body, true));
    let (to_server, _) = h.take();
    assert_eq!(
        data_len(&to_server, 3),
        35,
        "no more than the window allows"
    );
    h.server(&frame::window_update(0, 65_500));
    let (to_server, _) = h.take();
    let rest = data_len(&to_server, 3);
    assert!(35 + rest > body.len(), "the patched body follows");
    assert!(to_server.last().unwrap().0.has(flag::END_STREAM));
}

#[test]
fn a_refused_call_is_answered_and_the_runtime_copy_reset() {
    let mut h = Harness::new(true);
    let body = run_body();
    let req = h.request(1, RUN);
    h.client(&req);
    h.client(&data(1, &body, true));
    let (to_server, to_client) = h.take();
    let kinds: Vec<u8> = to_server.iter().map(|(h, _)| h.kind).collect();
    assert_eq!(
        kinds,
        [kind::HEADERS, kind::RST_STREAM],
        "HEADERS for HPACK, then cancelled"
    );
    assert_eq!(frame::increment(&to_server[1].1), Some(error::CANCEL));
    assert_eq!(window_updates(&to_client), [(0, body.len() as u32)]);
    let (answer, block) = to_client
        .iter()
        .find(|(h, _)| h.kind == kind::HEADERS)
        .unwrap();
    assert!(answer.has(flag::END_STREAM));
    let fields = loona_hpack::Decoder::new().decode(block).unwrap();
    assert!(fields.contains(&(b"grpc-status".to_vec(), b"8".to_vec())));

    // Anything the runtime still sends on it is not the client's; its
    // connection credit goes back to the runtime.
    h.server(&data(1, b"late", true));
    let (to_server, to_client) = h.take();
    assert!(to_client.is_empty());
    assert_eq!(window_updates(&to_server), [(0, 4)]);
}

#[test]
fn criguard_answers_wait_for_the_runtime_block_after_a_table_shrink() {
    let mut h = Harness::new(true);
    let mut shrink = Vec::new();
    shrink.extend_from_slice(&setting::HEADER_TABLE_SIZE.to_be_bytes());
    shrink.extend_from_slice(&0u32.to_be_bytes());
    h.client(&frame::build(kind::SETTINGS, 0, 0, &shrink));
    let req = h.request(1, "/runtime.v1.RuntimeService/Version");
    h.client(&req);
    let req = h.request(3, RUN);
    h.client(&req);
    h.client(&data(3, &run_body(), true));
    let (_, to_client) = h.take();
    assert!(to_client.iter().all(|(h, _)| h.kind != kind::HEADERS));
    assert!(h.conn.deadline().is_some(), "and not forever");

    let resp = h.response_headers(1);
    h.server(&resp);
    let (_, to_client) = h.take();
    let streams: Vec<u32> = to_client
        .iter()
        .filter(|(h, _)| h.kind == kind::HEADERS)
        .map(|(h, _)| h.stream)
        .collect();
    assert_eq!(
        streams,
        [1, 3],
        "the runtime's block first, then criguard's"
    );
    assert!(h.conn.deadline().is_none());
}

#[test]
fn a_drain_refuses_only_streams_opened_after_goaway() {
    let mut h = Harness::new(false);
    let req = h.request(1, "/runtime.v1.RuntimeService/Version");
    h.client(&req);
    h.client(&data(1, b"\0\0\0\0\0", true));
    h.take();
    h.conn.drain(&mut h.io);
    let (_, to_client) = h.take();
    assert_eq!(to_client[0].0.kind, kind::GOAWAY);
    assert_eq!(&to_client[0].1[..4], &1u32.to_be_bytes());
    assert!(!h.conn.done(), "stream 1 is still in flight");

    let req = h.request(3, "/runtime.v1.RuntimeService/Version");
    h.client(&req);
    let (to_server, _) = h.take();
    let kinds: Vec<u8> = to_server.iter().map(|(h, _)| h.kind).collect();
    assert_eq!(kinds, [kind::HEADERS, kind::RST_STREAM]);
    assert_eq!(
        frame::increment(&to_server[1].1),
        Some(error::REFUSED_STREAM)
    );

    let resp = h.response_headers(1);
    h.server(&resp);
    let block = h.server_enc.encode([(&b"grpc-status"[..], &b"0"[..])]);
    h.server(&frame::build(
        kind::HEADERS,
        flag::END_HEADERS | flag::END_STREAM,
        1,
        &block,
    ));
    assert!(h.conn.done(), "nothing left in flight");
}

#[test]
fn bytes_split_anywhere_relay_the_same() {
    let mut whole = Harness::new(false);
    let mut split = Harness::new(false);
    let body = create_body(3_000);
    let mut input = whole.request(1, CREATE).to_vec();
    split.request(1, CREATE);
    input.extend_from_slice(&data(1, &body[..2_000], false));
    input.extend_from_slice(&data(1, &body[2_000..], true));
    whole.client(&input);
    let mut pending = BytesMut::new();
    for b in &input {
        pending.extend_from_slice(&[*b]);
        split.conn.on_client(&mut pending, &mut split.io);
    }
    assert!(pending.is_empty());
    assert_eq!(whole.io.to_server.take_all(), split.io.to_server.take_all());
    assert_eq!(whole.io.to_client.take_all(), split.io.to_client.take_all());
}

impl Harness {
    /// A harness whose proxy holds at most `budget` bytes for inspection.
    fn with_budget(budget: usize) -> Self {
        let mut h = Self::new(false);
        let proxy = h.conn.proxy.clone().with_hold_budget(budget);
        h.conn = Conn::new(proxy);
        let mut hello = BytesMut::from(&frame::PREFACE[..]);
        hello.extend_from_slice(&frame::build(kind::SETTINGS, 0, 0, &[]));
        h.client(&hello);
        h.take();
        h
    }
}

#[test]
fn a_header_block_past_the_header_list_size_ends_the_connection_and_is_not_kept() {
    let mut h = Harness::new(false);
    let budget = h.conn.proxy.budget.clone();
    let chunk = vec![0x40u8; 16_384];
    h.client(&frame::build(kind::HEADERS, 0, 1, &chunk));
    let mut sent = chunk.len();
    while sent + chunk.len() <= super::conn::MAX_HEADER_LIST {
        h.client(&frame::build(kind::CONTINUATION, 0, 1, &chunk));
        sent += chunk.len();
        h.take();
    }
    assert_eq!(
        budget.used(),
        super::conn::MAX_HEADER_LIST,
        "a block past 64 KiB reserves its cap in the shared budget"
    );
    assert!(!h.conn.done());
    h.client(&frame::build(kind::CONTINUATION, 0, 1, &chunk));
    let (to_server, to_client) = h.take();
    assert!(
        to_server.is_empty(),
        "the frame past the limit is not forwarded"
    );
    let (goaway, payload) = &to_client[0];
    assert_eq!(goaway.kind, kind::GOAWAY);
    assert_eq!(
        u32::from_be_bytes(payload[4..8].try_into().unwrap()),
        error::PROTOCOL_ERROR
    );
    assert!(String::from_utf8_lossy(&payload[8..]).contains("header block over"));
    assert!(h.conn.done());
    assert_eq!(budget.used(), 0, "the block's bytes are let go");
}

#[test]
fn an_observed_body_past_the_shared_budget_is_relayed_unheld() {
    let mut h = Harness::with_budget(10_000);
    let budget = h.conn.proxy.budget.clone();
    let body = create_body(30_000);
    let req = h.request(1, CREATE);
    h.client(&req);
    h.client(&data(1, &body[..8_000], false));
    let (to_server, _) = h.take();
    assert_eq!(data_len(&to_server, 1), 0, "held while it fits");
    assert_eq!(budget.used(), 8_000);
    h.client(&data(1, &body[8_000..16_000], false));
    let (to_server, _) = h.take();
    assert_eq!(
        data_len(&to_server, 1),
        16_000,
        "past the budget, what was held goes on unheld"
    );
    assert_eq!(budget.used(), 0);
    h.client(&data(1, &body[16_000..], true));
    let (to_server, _) = h.take();
    let rest: Vec<u8> = to_server
        .iter()
        .filter(|(f, _)| f.kind == kind::DATA)
        .flat_map(|(_, p)| p.clone())
        .collect();
    assert_eq!(rest, &body[16_000..], "the rest passes as it is, unpatched");
}

#[test]
fn a_large_header_block_waits_for_room_in_the_budget() {
    let mut h = Harness::with_budget(100_000);
    let budget = h.conn.proxy.budget.clone();
    assert!(
        budget.try_take(90_000),
        "another connection holds most of it"
    );
    let chunk = vec![0x40u8; 16_384];
    let mut input = BytesMut::new();
    input.extend_from_slice(&frame::build(kind::HEADERS, 0, 1, &chunk));
    for _ in 0..5 {
        input.extend_from_slice(&frame::build(kind::CONTINUATION, 0, 1, &chunk));
    }
    h.conn.on_client(&mut input, &mut h.io);
    assert!(
        h.conn.client_paused(),
        "a block past 64 KiB needs a reservation"
    );
    assert!(h.conn.deadline().is_some(), "and it tries again soon");
    let left = input.len();
    assert!(left > 0 && left < 6 * (16_384 + 9));
    budget.give(90_000);
    assert!(!h.conn.client_paused());
    h.conn.on_client(&mut input, &mut h.io);
    assert!(input.is_empty());
    let (to_server, _) = h.take();
    assert!(!to_server.is_empty());
    drop(h);
    assert_eq!(budget.used(), 0, "a connection gives back what it held");
}

#[test]
fn a_drain_before_the_runtimes_settings_waits_for_them() {
    // Accepted just as a drain began: the runtime's SETTINGS has not come.
    let mut h = Harness::before_runtime_settings(false);
    h.conn.drain(&mut h.io);
    let (_, to_client) = h.take();
    assert!(
        to_client.is_empty(),
        "nothing before the runtime's SETTINGS: {to_client:?}"
    );
    assert!(!h.conn.done(), "the GOAWAY is not sent yet");

    h.server(&frame::build(kind::SETTINGS, 0, 0, &[]));
    let (_, to_client) = h.take();
    let kinds: Vec<u8> = to_client.iter().map(|(h, _)| h.kind).collect();
    assert_eq!(kinds, [kind::SETTINGS, kind::GOAWAY]);
    assert!(h.conn.done(), "drained, nothing in flight");
}
