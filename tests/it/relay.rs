//! The frame relay under stress: observed bodies spanning many frames and
//! windows, refusals, large header blocks, protocol errors and memory, with
//! strict HTTP/2 peers (`h2`) on both sides.

use crate::common;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use common::h2peer::{self, Settings};
use common::rawgrpc;
use criguard::cri;
use criguard::eviction::NodeStatus;
use criguard::intercept::Observer;
use criguard::model::NodeModel;
use criguard::signals::table::Condition;
use k8s_cri::v1 as cri_api;
use prost::Message;
use tokio::io::AsyncWriteExt;

const CREATE: &str = "/runtime.v1.RuntimeService/CreateContainer";
const RUN: &str = "/runtime.v1.RuntimeService/RunPodSandbox";
const VERSION: &str = "/runtime.v1.RuntimeService/Version";

/// A CreateContainer request about `padding` bytes long (an annotation).
fn create_request(padding: usize) -> Vec<u8> {
    let pod = common::pods::besteffort_pod("uid-1");
    let mut config = pod.container_config(0);
    config
        .annotations
        .insert("padding".into(), "x".repeat(padding));
    cri_api::CreateContainerRequest {
        pod_sandbox_id: "sb1".into(),
        config: Some(config),
        sandbox_config: Some(pod.sandbox_config()),
    }
    .encode_to_vec()
}

fn create_answer(_: &h2peer::Seen) -> Bytes {
    cri_api::CreateContainerResponse {
        container_id: "c1".into(),
    }
    .encode_to_vec()
    .into()
}

/// criguard in process, observing into a fresh model, admitting against `status`.
struct Relay {
    socket: std::path::PathBuf,
    _proxy: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

fn start(
    upstream: impl FnOnce(&std::path::Path) -> h2peer::Upstream,
    status: Option<NodeStatus>,
) -> (Relay, h2peer::Upstream) {
    let dir = tempfile::tempdir().unwrap();
    let up_sock = dir.path().join("runtime.sock");
    let upstream = upstream(&up_sock);
    let socket = dir.path().join("criguard.sock");
    let listener = criguard::listen::bind(&socket).unwrap();
    let model = Arc::new(RwLock::new(NodeModel::new(8 << 30)));
    let mut observer = Observer::new(model);
    if let Some(status) = status {
        observer = observer.with_admission(Arc::new(RwLock::new(status)), Default::default());
    }
    let endpoint = criguard::runtime::RuntimeEndpoint::parse(up_sock.to_str().unwrap()).unwrap();
    let proxy = cri::Proxy::to(endpoint).with_observer(observer);
    let task = tokio::spawn(cri::serve(
        listener,
        proxy,
        std::future::pending(),
        Duration::from_secs(1),
    ));
    (
        Relay {
            socket,
            _proxy: task,
            _dir: dir,
        },
        upstream,
    )
}

fn oom_score_adj(msg: &[u8]) -> i64 {
    cri_api::CreateContainerRequest::decode(msg)
        .unwrap()
        .config
        .unwrap()
        .linux
        .unwrap()
        .resources
        .unwrap()
        .oom_score_adj
}

/// Sizes from a fixed xorshift sequence: the same run every time.
fn sizes(n: usize, max: usize) -> Vec<usize> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % max as u64) as usize + 1
        })
        .collect()
}

#[tokio::test]
async fn patched_bodies_spanning_many_frames_keep_flow_control_exact() {
    // A runtime with a 1 000-byte stream window and the protocol's minimum
    // connection window: a 40 KB CreateContainer crosses dozens of
    // WINDOW_UPDATEs, and the patch's extra bytes often meet a nearly
    // exhausted connection window.
    let tight = Settings {
        stream_window: 1_000,
        ..Settings::default()
    };
    let (relay, mut upstream) = start(|p| h2peer::Upstream::start(p, tight, create_answer), None);
    let mut client = h2peer::connect(&relay.socket, tight).await;
    for (i, size) in sizes(24, 40_000).into_iter().enumerate() {
        let original = create_request(size);
        let framed = rawgrpc::frame(&original);
        if i % 3 == 2 {
            // An unobserved call of the same size in between.
            let ans = h2peer::call(&mut client, VERSION, &[], framed.clone(), 700)
                .await
                .unwrap();
            assert_eq!(ans.grpc_status(), Some("0"));
            let seen = upstream.seen.recv().await.unwrap();
            assert_eq!(
                seen.body.unwrap(),
                framed,
                "unobserved bodies pass as they are"
            );
        }
        let ans = h2peer::call(&mut client, CREATE, &[], framed, 1_024)
            .await
            .unwrap_or_else(|e| panic!("call {i} ({size} bytes): {e}"));
        assert_eq!(ans.grpc_status(), Some("0"));
        assert_eq!(
            ans.body,
            rawgrpc::frame(&create_answer(&upstream_placeholder()))
        );
        let seen = upstream.seen.recv().await.unwrap();
        let body = seen.body.unwrap();
        let msg = &body[5..];
        assert_eq!(
            u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize,
            msg.len(),
            "the length prefix counts the patch"
        );
        assert!(
            msg.starts_with(&original),
            "the client's bytes lead, unchanged"
        );
        assert_eq!(
            oom_score_adj(msg),
            1000,
            "BestEffort gets the kubelet's 1000"
        );
    }
    // If any credit had been over- or under-counted, h2 would by now have
    // failed a peer with FLOW_CONTROL_ERROR or this transfer would stall.
    let big = Bytes::from(vec![7u8; 3 << 20]);
    let ans = h2peer::call(&mut client, VERSION, &[], big.clone(), 16_384)
        .await
        .unwrap();
    assert_eq!(ans.grpc_status(), Some("0"));
    assert_eq!(upstream.seen.recv().await.unwrap().body.unwrap(), big);
}

fn upstream_placeholder() -> h2peer::Seen {
    h2peer::Seen {
        path: String::new(),
        headers: http::HeaderMap::new(),
        body: Ok(Bytes::new()),
    }
}

#[tokio::test]
async fn a_refusal_is_answered_by_criguard_and_the_connection_stays_in_step() {
    let status = NodeStatus {
        conditions: [Condition::MemoryPressure].into(),
        ..Default::default()
    };
    let (relay, mut upstream) = start(
        |p| h2peer::Upstream::start(p, Settings::default(), create_answer),
        Some(status),
    );
    let mut client = h2peer::connect(&relay.socket, Settings::default()).await;
    for round in 0..5 {
        // Metadata that changes each round exercises both HPACK tables.
        let meta = [("x-round", format!("round-{round}"))];
        let pod = common::pods::besteffort_pod(&format!("uid-{round}"));
        let run = cri_api::RunPodSandboxRequest {
            config: Some(pod.sandbox_config()),
            runtime_handler: String::new(),
        };
        let ans = h2peer::call(
            &mut client,
            RUN,
            &meta,
            rawgrpc::frame(&run.encode_to_vec()),
            100,
        )
        .await
        .unwrap();
        assert_eq!(ans.grpc_status(), Some("8"), "{ans:?}");
        let msg = ans.headers["grpc-message"].to_str().unwrap();
        assert!(msg.contains("MemoryPressure"), "{msg}");
        let seen = upstream.seen.recv().await.unwrap();
        assert_eq!(seen.path, RUN);
        assert!(
            seen.body.is_err(),
            "the runtime's copy must be cancelled: {seen:?}"
        );

        let ans = h2peer::call(&mut client, VERSION, &meta, rawgrpc::frame(b"v"), 100)
            .await
            .unwrap();
        assert_eq!(ans.grpc_status(), Some("0"));
        let seen = upstream.seen.recv().await.unwrap();
        assert_eq!(seen.headers["x-round"], meta[0].1.as_str());
    }
}

#[tokio::test]
async fn header_blocks_of_any_size_the_runtime_takes_pass() {
    let (relay, mut upstream) = start(
        |p| h2peer::Upstream::start(p, Settings::default(), create_answer),
        None,
    );
    let mut client = h2peer::connect(&relay.socket, Settings::default()).await;
    for size in [100, 20 << 10, 70 << 10, 500 << 10] {
        let value = "v".repeat(size);
        let ans = h2peer::call(
            &mut client,
            VERSION,
            &[("x-big", value.clone())],
            rawgrpc::frame(b"v"),
            100,
        )
        .await
        .unwrap_or_else(|e| panic!("{size}-byte header: {e}"));
        assert_eq!(ans.grpc_status(), Some("0"));
        assert_eq!(
            upstream.seen.recv().await.unwrap().headers["x-big"],
            value.as_str()
        );
    }
}

#[tokio::test]
async fn a_malformed_frame_ends_that_connection_only() {
    let (relay, _upstream) = start(
        |p| h2peer::Upstream::start(p, Settings::default(), create_answer),
        None,
    );
    let mut raw = tokio::net::UnixStream::connect(&relay.socket)
        .await
        .unwrap();
    raw.write_all(cri::frame::PREFACE).await.unwrap();
    raw.write_all(&cri::frame::build(cri::frame::kind::SETTINGS, 0, 0, &[]))
        .await
        .unwrap();
    // A 1 MiB DATA frame: larger than the runtime's 16 KiB SETTINGS_MAX_FRAME_SIZE.
    let mut head = bytes::BytesMut::new();
    cri::frame::Head {
        len: 1 << 20,
        kind: cri::frame::kind::DATA,
        flags: 0,
        stream: 1,
    }
    .write(&mut head);
    raw.write_all(&head).await.unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::AsyncReadExt::read_to_end(&mut raw, &mut got),
    )
    .await
    .expect("criguard must close the connection");
    assert!(read.is_ok());
    let goaway = got
        .windows(9)
        .position(|w| w[3] == cri::frame::kind::GOAWAY)
        .expect("a GOAWAY frame");
    let code = u32::from_be_bytes(got[goaway + 13..goaway + 17].try_into().unwrap());
    assert_eq!(code, cri::frame::error::FRAME_SIZE_ERROR);

    // Other connections are served as before.
    let mut client = h2peer::connect(&relay.socket, Settings::default()).await;
    let ans = h2peer::call(&mut client, VERSION, &[], rawgrpc::frame(b"v"), 100)
        .await
        .unwrap();
    assert_eq!(ans.grpc_status(), Some("0"));
}

/// Peak resident memory of a process, from /proc (kB → bytes).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_pass_without_being_held() {
    let dir = tempfile::tempdir().unwrap();
    let up_sock = dir.path().join("runtime.sock");
    let mut upstream = h2peer::Upstream::start(&up_sock, Settings::default(), create_answer);
    let guard = common::containerd::CriguardProcess::start(
        &dir.path().join("criguard.sock"),
        &up_sock,
        &[
            "--dynamic-oom-score-adj",
            "false",
            "--memory-events",
            "false",
        ],
    )
    .await;
    let before = peak_rss(guard.pid());
    let mut client = h2peer::connect(&guard.socket, Settings::default()).await;
    // 200 MiB unobserved, then an observed CreateContainer announcing more
    // than containerd's 16 MiB limit: both pass as they are, never whole.
    let big = Bytes::from(vec![1u8; 200 << 20]);
    let ans = h2peer::call(&mut client, VERSION, &[], big.clone(), 1 << 20)
        .await
        .unwrap();
    assert_eq!(ans.grpc_status(), Some("0"));
    assert_eq!(upstream.next(VERSION).await.body.unwrap().len(), big.len());
    let huge = rawgrpc::frame(&create_request(20 << 20));
    let ans = h2peer::call(&mut client, CREATE, &[], huge.clone(), 1 << 20)
        .await
        .unwrap();
    assert_eq!(ans.grpc_status(), Some("0"));
    assert_eq!(
        upstream.next(CREATE).await.body.unwrap(),
        huge,
        "a body too large to observe passes unpatched"
    );
    let grown = peak_rss(guard.pid()).saturating_sub(before);
    eprintln!(
        "criguard peak RSS: {} MiB before, grew by {} KiB",
        before >> 20,
        grown >> 10
    );
    assert!(
        grown < 24 << 20,
        "criguard's peak RSS grew by {} MiB relaying 220 MiB",
        grown >> 20
    );
}
