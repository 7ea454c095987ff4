//! Byte-level transparency of the proxy, against a recording upstream: what
//! the kubelet sends reaches the runtime byte for byte, and what the runtime
//! answers reaches the kubelet byte for byte, metadata, trailers, status,
//! unknown proto fields and streams included.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::rawgrpc::{self, RecordingUpstream, Reply};
use common::{InProcessProxy, poll_until};
use prost::Message;
use tokio::sync::mpsc;

const VERSION: &str = "/runtime.v1.RuntimeService/Version";

fn version_response_bytes() -> Vec<u8> {
    let resp = k8s_cri::v1::VersionResponse {
        version: "0.1.0".into(),
        runtime_name: "recorder".into(),
        runtime_version: "1".into(),
        runtime_api_version: "v1".into(),
    };
    // Field 4242 is unknown to every CRI version criguard was built with.
    rawgrpc::with_unknown_field(&resp.encode_to_vec(), 4242, b"from-the-future")
}

fn ok_reply(body: Bytes) -> Reply {
    Reply::Unary {
        headers: vec![("x-runtime-header", "h-value".into())],
        body,
        trailers: vec![
            ("grpc-status", "0".into()),
            ("x-runtime-trailer", "t-value".into()),
        ],
    }
}

#[tokio::test]
async fn unknown_fields_metadata_and_trailers_pass_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let upstream_sock = dir.path().join("runtime.sock");
    let resp_msg = rawgrpc::frame(&version_response_bytes());
    let reply_body = resp_msg.clone();
    let mut upstream =
        RecordingUpstream::start(&upstream_sock, move |_| ok_reply(reply_body.clone()));
    let proxy = InProcessProxy::start(&dir.path().join("criguard/criguard.sock"), &upstream_sock);

    let req_msg = k8s_cri::v1::VersionRequest {
        version: "v1".into(),
    }
    .encode_to_vec();
    let req_body = rawgrpc::frame(&rawgrpc::with_unknown_field(
        &req_msg,
        9999,
        b"newer-kubelet",
    ));
    let mut client = rawgrpc::connect(&proxy.socket).await;
    let resp = rawgrpc::call(
        &mut client,
        rawgrpc::request(
            VERSION,
            req_body.clone(),
            &[
                ("grpc-timeout", "5S"),
                ("x-kubelet-meta", "m-value"),
                ("user-agent", "kubelet/test"),
            ],
        ),
    )
    .await;

    let seen = upstream.seen.recv().await.unwrap();
    assert_eq!(seen.path, VERSION);
    assert_eq!(seen.body, req_body, "request bytes changed on the way");
    assert_eq!(seen.headers["x-kubelet-meta"], "m-value");
    assert_eq!(seen.headers["grpc-timeout"], "5S");
    assert_eq!(seen.headers["user-agent"], "kubelet/test");

    assert_eq!(resp.body, resp_msg, "response bytes changed on the way");
    assert_eq!(resp.headers["x-runtime-header"], "h-value");
    let mut names: Vec<&str> = resp.headers.keys().map(|k| k.as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        ["content-type", "x-runtime-header"],
        "headers added or lost"
    );
    assert_eq!(resp.trailers["x-runtime-trailer"], "t-value");
    assert_eq!(resp.grpc_status().as_deref(), Some("0"));
    proxy.stop().await;
}

#[tokio::test]
async fn error_status_and_message_pass_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let upstream_sock = dir.path().join("runtime.sock");
    let message = "an error occurred when try to find container \"nope\": not found";
    let _upstream = RecordingUpstream::start(&upstream_sock, move |_| Reply::Unary {
        headers: vec![],
        body: Bytes::new(),
        trailers: vec![
            ("grpc-status", "5".into()),
            ("grpc-message", message.replace(' ', "%20")),
        ],
    });
    let proxy = InProcessProxy::start(&dir.path().join("c.sock"), &upstream_sock);
    let mut client = rawgrpc::connect(&proxy.socket).await;
    let resp = rawgrpc::call(
        &mut client,
        rawgrpc::empty_request("/runtime.v1.RuntimeService/ContainerStatus"),
    )
    .await;
    assert_eq!(resp.grpc_status().as_deref(), Some("5"));
    assert_eq!(resp.grpc_message().unwrap(), message.replace(' ', "%20"));
}

#[tokio::test]
async fn paths_criguard_does_not_know_are_forwarded() {
    let dir = tempfile::tempdir().unwrap();
    let upstream_sock = dir.path().join("runtime.sock");
    let mut upstream =
        RecordingUpstream::start(&upstream_sock, |_| ok_reply(rawgrpc::frame(b"\x0a\x01x")));
    let proxy = InProcessProxy::start(&dir.path().join("c.sock"), &upstream_sock);
    let mut client = rawgrpc::connect(&proxy.socket).await;
    for path in [
        "/runtime.v1alpha2.RuntimeService/Version",
        "/containerd.services.version.v1.Version/Version",
        "/runtime.v2.FutureService/Anything",
    ] {
        let resp = rawgrpc::call(
            &mut client,
            rawgrpc::request(path, rawgrpc::frame(b"abc"), &[]),
        )
        .await;
        assert_eq!(resp.body, rawgrpc::frame(b"\x0a\x01x"));
        assert_eq!(upstream.seen.recv().await.unwrap().path, path);
    }
}

#[tokio::test]
async fn server_streams_are_streamed_not_buffered() {
    let dir = tempfile::tempdir().unwrap();
    let upstream_sock = dir.path().join("runtime.sock");
    let (events_tx, events_rx) = mpsc::channel::<Bytes>(1);
    let events_rx = std::sync::Mutex::new(Some(events_rx));
    let _upstream = RecordingUpstream::start(&upstream_sock, move |_| {
        Reply::Stream(events_rx.lock().unwrap().take().expect("one stream"))
    });
    let proxy = InProcessProxy::start(&dir.path().join("c.sock"), &upstream_sock);
    let mut client = rawgrpc::connect(&proxy.socket).await;
    client.ready().await.unwrap();
    let resp = client
        .send_request(rawgrpc::empty_request(
            "/runtime.v1.RuntimeService/GetContainerEvents",
        ))
        .await
        .unwrap();
    let mut body = resp.into_body();
    use http_body_util::BodyExt;
    // Each event must reach the client while the upstream still holds the
    // stream open; a buffering proxy would never deliver the first one.
    for i in 0..3u8 {
        let event = rawgrpc::frame(&[0x0a, 1, b'a' + i]);
        events_tx.send(event.clone()).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("event not delivered while the stream is open")
            .unwrap()
            .unwrap();
        assert_eq!(got.into_data().unwrap(), event);
    }
    drop(events_tx);
    let last = body.frame().await.unwrap().unwrap();
    assert_eq!(last.into_trailers().unwrap()["grpc-status"], "0");
}

#[tokio::test]
async fn concurrent_calls_do_not_wait_for_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let upstream_sock = dir.path().join("runtime.sock");
    // The upstream answers the first call only after the second has arrived:
    // a proxy that serialises calls would deadlock here.
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(2));
    let _upstream = RecordingUpstream::start(&upstream_sock, move |_| {
        Reply::AfterBarrier(barrier.clone(), Box::new(ok_reply(rawgrpc::frame(b""))))
    });
    let proxy = InProcessProxy::start(&dir.path().join("c.sock"), &upstream_sock);
    let socket = proxy.socket.clone();
    let one = |socket: std::path::PathBuf| async move {
        let mut client = rawgrpc::connect(&socket).await;
        rawgrpc::call(&mut client, rawgrpc::empty_request(VERSION)).await
    };
    let (a, b) = tokio::time::timeout(
        Duration::from_secs(20),
        futures::future::join(
            tokio::spawn(one(socket.clone())),
            tokio::spawn(one(socket.clone())),
        ),
    )
    .await
    .expect("calls were serialised");
    assert_eq!(a.unwrap().grpc_status().as_deref(), Some("0"));
    assert_eq!(b.unwrap().grpc_status().as_deref(), Some("0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_down_fails_fast_unavailable_then_reconnects() {
    let dir = tempfile::tempdir().unwrap();
    let upstream_sock = dir.path().join("runtime.sock");
    let proxy = InProcessProxy::start(&dir.path().join("c.sock"), &upstream_sock);
    let mut client = rawgrpc::connect(&proxy.socket).await;

    let resp = tokio::time::timeout(
        Duration::from_secs(5),
        rawgrpc::call(&mut client, rawgrpc::empty_request(VERSION)),
    )
    .await
    .expect("a call to a missing runtime must fail fast, not hang");
    assert_eq!(resp.grpc_status().as_deref(), Some("14"), "{resp:?}");
    assert!(
        resp.grpc_message().unwrap().contains("runtime.sock"),
        "{resp:?}"
    );

    // The runtime comes up. criguard cannot splice the connection it served
    // alone onto the runtime, so it ends it with GOAWAY; the kubelet's next
    // connection reaches the runtime.
    let _upstream = RecordingUpstream::start(&upstream_sock, |_| ok_reply(rawgrpc::frame(b"up")));
    poll_until(
        Duration::from_secs(10),
        "criguard to end the connection it answered unavailable",
        || {
            let mut client = client.clone();
            async move { client.ready().await.is_err().then_some(()) }
        },
    )
    .await;
    let mut client = rawgrpc::connect(&proxy.socket).await;
    let resp = rawgrpc::call(&mut client, rawgrpc::empty_request(VERSION)).await;
    assert_eq!(resp.grpc_status().as_deref(), Some("0"), "{resp:?}");
    assert_eq!(resp.body, rawgrpc::frame(b"up"));
}

#[tokio::test]
async fn patched_create_container_keeps_unknown_fields_and_replays_the_answer() {
    use k8s_cri::v1 as cri;
    let dir = tempfile::tempdir().unwrap();
    let upstream_sock = dir.path().join("runtime.sock");
    let resp_msg = rawgrpc::with_unknown_field(
        &cri::CreateContainerResponse {
            container_id: "c1".into(),
        }
        .encode_to_vec(),
        777,
        b"runtime-extra",
    );
    let reply = rawgrpc::frame(&resp_msg);
    let reply_body = reply.clone();
    let mut upstream =
        RecordingUpstream::start(&upstream_sock, move |_| ok_reply(reply_body.clone()));
    let proxy = InProcessProxy::start(&dir.path().join("c.sock"), &upstream_sock);

    // A BestEffort pod whose kubelet sent 500: criguard patches it to 1000.
    let pod = criguard_test_kit::kubelet::PodSpec::new("p", "u1").container(
        criguard_test_kit::kubelet::ContainerSpec {
            name: "app".into(),
            image: "busybox".into(),
            ..Default::default()
        },
    );
    let mut config = pod.container_config(0);
    config
        .linux
        .as_mut()
        .unwrap()
        .resources
        .as_mut()
        .unwrap()
        .oom_score_adj = 500;
    let req = cri::CreateContainerRequest {
        pod_sandbox_id: "sb1".into(),
        config: Some(config),
        sandbox_config: Some(pod.sandbox_config()),
    };
    let original = rawgrpc::with_unknown_field(&req.encode_to_vec(), 5150, b"newer-kubelet-field");
    let mut client = rawgrpc::connect(&proxy.socket).await;
    let resp = rawgrpc::call(
        &mut client,
        rawgrpc::request(
            "/runtime.v1.RuntimeService/CreateContainer",
            rawgrpc::frame(&original),
            &[],
        ),
    )
    .await;

    let seen = upstream.seen.recv().await.unwrap();
    let seen_msg = &seen.body[5..];
    assert!(
        seen_msg.starts_with(&original),
        "the original bytes, unknown field included, must lead"
    );
    assert!(seen_msg.len() > original.len(), "no patch appended");
    let merged = cri::CreateContainerRequest::decode(seen_msg).unwrap();
    let adj = merged
        .config
        .unwrap()
        .linux
        .unwrap()
        .resources
        .unwrap()
        .oom_score_adj;
    assert_eq!(adj, 1000);
    assert_eq!(
        resp.body, reply,
        "observed answers are replayed byte for byte"
    );
    assert_eq!(resp.trailers["x-runtime-trailer"], "t-value");
}
