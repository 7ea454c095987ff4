//! 1 000 concurrent calls over 10 connections (two of each client kind),
//! the methods criguard observes (RunPodSandbox, CreateContainer,
//! Start/Stop/RemoveContainer, Stop/RemovePodSandbox) mixed with ones it
//! only forwards, against the grpc-go recording upstream; the same 1 000
//! calls are made directly at the same time. Every call must succeed, with
//! the answer the direct twin got, and reach the runtime once with the bytes
//! sent (CreateContainer: the bytes sent, then criguard's merge patch).

use std::collections::HashMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use k8s_cri::v1 as cri;
use prost::Message;

use crate::common::clients::{Answer, Call, Client, Kind};
use crate::common::containerd::CriguardProcess;
use crate::common::echo::EchoUpstream;
use crate::common::rawgrpc::with_unknown_field;
use criguard_test_kit::kubelet::{ContainerSpec, PodSpec};

const CALLS: usize = 1000;
const CONNECTIONS: usize = 10;
const RT: &str = "/runtime.v1.RuntimeService/";

/// A call: method, request and the reply the upstream is told to give.
type Planned = (String, Vec<u8>, Vec<u8>);

/// Call `i` (encoded once: prost writes map fields in a random order).
fn call(i: usize) -> Planned {
    let sb = format!("sb-{}", i / 12);
    let c = format!("c-{}", i / 12);
    let pod = PodSpec::new("p", &format!("uid-{}", i / 12)).container(ContainerSpec {
        name: "app".into(),
        image: "busybox".into(),
        memory_request: 16 << 20,
        memory_limit: 32 << 20,
        ..Default::default()
    });
    let (method, req, reply): (&str, Vec<u8>, Vec<u8>) = match i % 12 {
        0 => (
            "RunPodSandbox",
            cri::RunPodSandboxRequest {
                config: Some(pod.sandbox_config()),
                runtime_handler: String::new(),
            }
            .encode_to_vec(),
            cri::RunPodSandboxResponse {
                pod_sandbox_id: sb.clone(),
            }
            .encode_to_vec(),
        ),
        1 => (
            "CreateContainer",
            cri::CreateContainerRequest {
                pod_sandbox_id: sb.clone(),
                config: Some(pod.container_config(0)),
                sandbox_config: Some(pod.sandbox_config()),
            }
            .encode_to_vec(),
            cri::CreateContainerResponse {
                container_id: c.clone(),
            }
            .encode_to_vec(),
        ),
        2 => ("StartContainer", container_req(&c), vec![]),
        3 => ("StopContainer", container_req(&c), vec![]),
        4 => ("RemoveContainer", container_req(&c), vec![]),
        5 => ("StopPodSandbox", sandbox_req(&sb), vec![]),
        6 => ("RemovePodSandbox", sandbox_req(&sb), vec![]),
        7 => (
            "Version",
            cri::VersionRequest {
                version: "v1".into(),
            }
            .encode_to_vec(),
            cri::VersionResponse {
                runtime_name: "echo".into(),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        8 => (
            "ListContainers",
            vec![],
            cri::ListContainersResponse {
                containers: vec![cri::Container {
                    id: c.clone(),
                    pod_sandbox_id: sb.clone(),
                    ..Default::default()
                }],
            }
            .encode_to_vec(),
        ),
        9 => ("ContainerStatus", container_req(&c), vec![]),
        10 => ("PodSandboxStatus", sandbox_req(&sb), vec![]),
        _ => (
            "ExecSync",
            container_req(&c),
            cri::ExecSyncResponse {
                stdout: b"out".to_vec(),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
    };
    // Unknown fields make every request and reply unique and must survive.
    let tag = (i as u64).to_be_bytes();
    (
        format!("{RT}{method}"),
        with_unknown_field(&req, 9001, &tag),
        with_unknown_field(&reply, 9002, &tag),
    )
}

/// Field 1 (the id) set: the first field of every container/sandbox request.
fn container_req(id: &str) -> Vec<u8> {
    cri::StartContainerRequest {
        container_id: id.into(),
    }
    .encode_to_vec()
}

fn sandbox_req(id: &str) -> Vec<u8> {
    cri::StopPodSandboxRequest {
        pod_sandbox_id: id.into(),
    }
    .encode_to_vec()
}

/// Makes all the calls at once on `clients`, ids prefixed with `path`.
async fn all_at_once(calls: &[Planned], clients: &[Client], path: &str) -> Vec<Answer> {
    let mut pending = Vec::with_capacity(CALLS);
    for (i, (method, req, reply)) in calls.iter().enumerate() {
        let c = Call::unary(method, req.clone())
            .md("x-test-id", &format!("{path}-{i}"))
            .md("x-echo-reply", &B64.encode(reply))
            .md("x-echo-header", &format!("h{i}"));
        pending.push(clients[i % CONNECTIONS].start(c).await);
    }
    let mut answers = Vec::with_capacity(CALLS);
    for mut rx in pending {
        loop {
            match rx.recv().await.expect("client helper died") {
                crate::common::clients::Event::Done(a) => break answers.push(a),
                crate::common::clients::Event::Msg(_) => {}
            }
        }
    }
    answers
}

async fn connect_all(socket: &std::path::Path) -> Vec<Client> {
    let mut out = Vec::new();
    for k in Kind::all().into_iter().cycle().take(CONNECTIONS) {
        out.push(Client::connect(&k, socket).await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_concurrent_calls_over_ten_connections_match_direct() {
    let dir = tempfile::tempdir().unwrap();
    let mut echo = EchoUpstream::start(&dir.path().join("runtime.sock")).await;
    let guard = CriguardProcess::start(&dir.path().join("criguard.sock"), &echo.socket, &[]).await;
    let direct = connect_all(&echo.socket).await;
    let proxied = connect_all(&super::through(&guard, &echo.socket)).await;

    let calls: Vec<Planned> = (0..CALLS).map(call).collect();
    let (d, p) = tokio::join!(
        all_at_once(&calls, &direct, "direct"),
        all_at_once(&calls, &proxied, "criguard")
    );
    let mut failed = Vec::new();
    for (i, (method, _, reply)) in calls.iter().enumerate() {
        let kind = &proxied[i % CONNECTIONS].kind;
        if d[i].code != 0 || d[i].msgs != [reply.clone()] {
            failed.push(format!(
                "{i} {method} direct ({kind:?}): {:?}",
                d[i].message
            ));
        } else if p[i] != d[i] {
            failed.push(format!(
                "{i} {method} through criguard ({kind:?}): code {} {:?}",
                p[i].code, p[i].message
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {CALLS} calls failed or differ, e.g. {:#?}",
        failed.len(),
        &failed[..failed.len().min(10)]
    );

    // What the runtime saw: each call once, the bytes sent.
    let mut seen = HashMap::new();
    for _ in 0..2 * CALLS {
        let s = echo.next_test_call().await;
        let id = s.get("x-test-id").unwrap().to_owned();
        assert!(seen.insert(id.clone(), s).is_none(), "{id} seen twice");
    }
    for (i, (method, req, _)) in calls.iter().enumerate() {
        let (d, p) = (
            &seen[&format!("direct-{i}")],
            &seen[&format!("criguard-{i}")],
        );
        assert_eq!((&d.method, &p.method), (method, method));
        assert_eq!(&d.req(), req);
        if method.ends_with("/CreateContainer") {
            assert!(p.req().starts_with(req), "{i}: original bytes must lead");
        } else {
            assert_eq!(&p.req(), req, "{i} {method}: request bytes changed");
        }
        // A client that dials a bare path sends the path it dialled.
        let dialled = |seen: Option<&str>, socket: &std::path::Path| {
            let raw = socket.to_string_lossy().into_owned();
            let encoded = raw.trim_start_matches('/').replace('/', "%2F");
            match seen {
                Some(v) if v == raw || v == encoded => "<dialled socket>".to_owned(),
                other => other.unwrap_or_default().to_owned(),
            }
        };
        assert_eq!(
            dialled(d.get(":authority"), &echo.socket),
            dialled(p.get(":authority"), &super::through(&guard, &echo.socket)),
            "{i}"
        );
    }
}
