//! Byte-level checks with one client kind against the grpc-go recording
//! upstream, each call made directly and through criguard: unknown proto
//! fields both ways, custom metadata both ways, trailers, error codes and
//! messages, a path criguard has never heard of, bodies of many DATA frames
//! (one of them an observed CreateContainer), and a server stream whose messages must arrive one by one while the
//! upstream holds the stream open.

use std::path::Path;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use k8s_cri::v1 as cri;
use prost::Message;

use crate::common::clients::{Answer, Call, Client, Event, Kind};
use crate::common::containerd::CriguardProcess;
use crate::common::echo::{EchoUpstream, Seen};
use crate::common::rawgrpc::with_unknown_field;
use criguard_test_kit::kubelet::{ContainerSpec, PodSpec};

/// A call worth making, what the upstream must answer, and what it must see.
struct Case {
    name: &'static str,
    call: Call,
    expect_code: i32,
    expect_msgs: Vec<Vec<u8>>,
    /// Observed by criguard, which may append its merge patch.
    patched: bool,
}

fn cases() -> Vec<Case> {
    let version_req = with_unknown_field(
        &cri::VersionRequest {
            version: "v1".into(),
        }
        .encode_to_vec(),
        9999,
        b"newer-kubelet",
    );
    let version_reply = with_unknown_field(
        &cri::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "echo".into(),
            runtime_version: "1".into(),
            runtime_api_version: "v1".into(),
        }
        .encode_to_vec(),
        4242,
        b"from-the-future",
    );
    let message = "container \"nope\": not found (100% sure, naïve ✓)";
    // 1 MiB each way: many DATA frames and window updates on both hops.
    let big: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    let big_req = with_unknown_field(&[], 7, &big);
    // A kubelet's CreateContainer that criguard observes (and may patch),
    // carrying 1 MiB of annotation and a field from a newer kubelet.
    let pod = PodSpec::new("big", "uid-big").container(ContainerSpec {
        name: "app".into(),
        image: "busybox".into(),
        ..Default::default()
    });
    let mut config = pod.container_config(0);
    config.annotations.insert("big".into(), "x".repeat(1 << 20));
    let big_create = with_unknown_field(
        &cri::CreateContainerRequest {
            pod_sandbox_id: "sb-big".into(),
            config: Some(config),
            sandbox_config: Some(pod.sandbox_config()),
        }
        .encode_to_vec(),
        5150,
        b"newer-kubelet-field",
    );
    let create_reply = with_unknown_field(
        &cri::CreateContainerResponse {
            container_id: "c-big".into(),
        }
        .encode_to_vec(),
        777,
        b"runtime-extra",
    );
    vec![
        Case {
            name: "unknown-fields-and-metadata",
            call: Call::unary("/runtime.v1.RuntimeService/Version", version_req)
                .md("x-kubelet-meta", "m-value")
                .md("x-echo-reply", &B64.encode(&version_reply))
                .md("x-echo-header", "h-value"),
            expect_code: 0,
            expect_msgs: vec![version_reply],
            patched: false,
        },
        Case {
            name: "error",
            call: Call::unary(
                "/runtime.v1.RuntimeService/ContainerStatus",
                b"\x0a\x04nope",
            )
            .md("x-echo-code", "5")
            .md("x-echo-message", &B64.encode(message)),
            expect_code: 5,
            expect_msgs: vec![],
            patched: false,
        },
        Case {
            name: "unknown-path",
            call: Call::unary("/runtime.v2.FutureService/Anything", b"abc".to_vec()),
            expect_code: 0,
            expect_msgs: vec![b"abc".to_vec()],
            patched: false,
        },
        Case {
            name: "big-bodies",
            call: Call::unary("/runtime.v1.RuntimeService/ExecSync", big_req.clone()),
            expect_code: 0,
            expect_msgs: vec![big_req],
            patched: false,
        },
        Case {
            name: "big-observed-create-container",
            call: Call::unary("/runtime.v1.RuntimeService/CreateContainer", big_create)
                .md("x-echo-reply", &B64.encode(&create_reply)),
            expect_code: 0,
            expect_msgs: vec![create_reply],
            patched: true,
        },
    ]
}

/// The metadata without the test's own call id.
/// The metadata the runtime saw, without the test's id, and with the
/// socket path the client dialled written `<dialled socket>` in
/// `:authority`: a client that dials a bare path sends that path (grpc C-core
/// percent-encoded), which is criguard's socket on one side and the
/// runtime's on the other. criguard forwards it as sent.
fn md_without_id(s: &Seen, dialled: &Path) -> Vec<(String, String)> {
    let raw = dialled.to_string_lossy().into_owned();
    let encoded = raw.trim_start_matches('/').replace('/', "%2F");
    s.md.iter()
        .filter(|(k, _)| k != "x-test-id")
        .map(|(k, v)| {
            if k == ":authority" && (*v == raw || *v == encoded) {
                (k.clone(), "<dialled socket>".to_owned())
            } else {
                (k.clone(), v.clone())
            }
        })
        .collect()
}

/// Runs the cases and the stream with `kind`, directly and through criguard.
pub async fn matches_direct(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    let mut echo = EchoUpstream::start(&dir.path().join("runtime.sock")).await;
    let guard = CriguardProcess::start(&dir.path().join("criguard.sock"), &echo.socket, &[]).await;
    let direct = Client::connect(&kind, &echo.socket).await;
    let proxied = Client::connect(&kind, &super::through(&guard, &echo.socket)).await;

    let mut md_diff = Vec::new();
    for case in cases() {
        let mut got: Vec<(Answer, Seen)> = Vec::new();
        for (path, client) in [("direct", &direct), ("criguard", &proxied)] {
            let id = format!("{path}-{}", case.name);
            let a = client.call(case.call.clone().md("x-test-id", &id)).await;
            assert_eq!(
                (a.code, &a.msgs),
                (case.expect_code, &case.expect_msgs),
                "{kind:?} {path} {}: {}",
                case.name,
                a.message
            );
            let seen = echo.seen(&id).await;
            assert_eq!(seen.method, case.call.method);
            if case.patched && path == "criguard" {
                assert!(
                    seen.req().starts_with(&case.call.req),
                    "{path}: the request's own bytes must lead"
                );
            } else {
                assert_eq!(seen.req(), case.call.req, "{path}: request bytes changed");
            }
            for (k, v) in &case.call.md {
                assert_eq!(seen.get(k), Some(v.as_str()), "{path}: metadata {k}");
            }
            got.push((a, seen));
        }
        let ((d, d_seen), (p, p_seen)) = (&got[0], &got[1]);
        assert_eq!(
            d, p,
            "{kind:?} {}: answer through criguard differs",
            case.name
        );
        // Nothing added, dropped or rewritten on the way: :authority and
        // user-agent included. Collected, so one run lists every difference.
        let dialled_proxy = super::through(&guard, &echo.socket);
        let (dm, pm) = (
            md_without_id(d_seen, &echo.socket),
            md_without_id(p_seen, &dialled_proxy),
        );
        for kv in pm.iter().filter(|kv| !dm.contains(kv)) {
            md_diff.push(format!("{}: criguard added or changed {kv:?}", case.name));
        }
        for kv in dm.iter().filter(|kv| !pm.contains(kv)) {
            md_diff.push(format!("{}: criguard dropped or changed {kv:?}", case.name));
        }
        if case.name == "error" {
            assert!(d.message.contains("100% sure, naïve ✓"), "{d:?}");
        }
        if case.name == "unknown-fields-and-metadata" {
            let has =
                |l: &[(String, String)], k: &str, v: &str| l.iter().any(|(a, b)| a == k && b == v);
            assert!(has(&d.header, "x-echo-header", "h-value"), "{d:?}");
            assert!(has(&d.trailer, "x-echo-trailer", "h-value"), "{d:?}");
        }
    }

    let d = stream(&direct, &mut echo, "direct").await;
    let p = stream(&proxied, &mut echo, "criguard").await;
    assert_eq!(d, p, "{kind:?}: stream answer through criguard differs");
    assert!(
        md_diff.is_empty(),
        "{kind:?}: what the runtime saw differs: {md_diff:#?}"
    );
}

/// A gated server stream: each message must reach the client before the
/// upstream is allowed to send the next one.
async fn stream(client: &Client, echo: &mut EchoUpstream, path: &str) -> Answer {
    let reply = cri::GetEventsRequest {}.encode_to_vec();
    let mut call = Call::unary(
        "/runtime.v1.RuntimeService/GetContainerEvents",
        reply.clone(),
    )
    .md("x-echo-stream", "3")
    .md("x-echo-gate", path)
    .md("x-test-id", &format!("{path}-stream"));
    call.stream = true;
    let mut rx = client.start(call).await;
    echo.seen(&format!("{path}-stream")).await;
    for i in 0..3u8 {
        echo.release(path).await;
        let ev = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("{path}: stream message {i} not delivered while open"));
        match ev {
            Some(Event::Msg(m)) => assert_eq!(m, [&reply[..], &[0x78, i]].concat()),
            other => panic!("{path}: expected message {i}, got {other:?}"),
        }
    }
    match rx.recv().await {
        Some(Event::Done(a)) => {
            assert_eq!((a.code, a.msgs.len()), (0, 3), "{path}: {a:?}");
            a
        }
        other => panic!("{path}: expected the end of the stream, got {other:?}"),
    }
}
