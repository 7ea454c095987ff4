//! A restart on a full node: criguard relays calls at once while it
//! rebuilds its node model from the runtime, and holds only the calls it
//! observes (which need the model) until the rebuild is done.

use crate::common;

use std::time::Duration;

use common::containerd::CriguardProcess;
use common::rawgrpc::{self, RecordingUpstream, Reply};
use k8s_cri::v1 as cri;
use prost::Message;

const LIST_SANDBOXES: &str = "/runtime.v1.RuntimeService/ListPodSandbox";
const RUN_SANDBOX: &str = "/runtime.v1.RuntimeService/RunPodSandbox";

fn ok(msg: impl Message) -> Reply {
    Reply::Unary {
        headers: vec![],
        body: rawgrpc::frame(&msg.encode_to_vec()),
        trailers: vec![("grpc-status", "0".into())],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_pass_during_the_rebuild_and_only_observed_ones_wait_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = dir.path().join("runtime.sock");
    // The runtime holds every ListPodSandbox (the rebuild's first call)
    // until the test releases it; everything else it answers at once.
    let (release, released) = tokio::sync::watch::channel(false);
    let mut upstream = RecordingUpstream::start(&runtime, move |r| match r.path.as_str() {
        LIST_SANDBOXES => Reply::AfterRelease(
            released.clone(),
            Box::new(ok(cri::ListPodSandboxResponse::default())),
        ),
        RUN_SANDBOX => ok(cri::RunPodSandboxResponse {
            pod_sandbox_id: "sb-1".into(),
        }),
        _ => ok(cri::VersionResponse {
            runtime_name: "recording".into(),
            ..Default::default()
        }),
    });
    let guard = CriguardProcess::start(
        &dir.path().join("criguard.sock"),
        &runtime,
        &["--dynamic-oom-score-adj=false"],
    )
    .await;
    let mut rt = guard.clients().rt;
    let version = || {
        let mut rt = rt.clone();
        async move {
            let call = rt.version(cri::VersionRequest::default());
            tokio::time::timeout(Duration::from_secs(5), call)
                .await
                .expect("Version answered during the rebuild")
                .unwrap()
                .into_inner()
        }
    };
    let rebuilding = async {
        while let Some(r) = upstream.seen.recv().await {
            if r.path == LIST_SANDBOXES {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), rebuilding)
        .await
        .expect("the rebuild to start");
    assert_eq!(version().await.runtime_name, "recording");

    // An observed call waits for the model; a plain one on the same
    // connection passes it.
    let mut run = tokio::spawn({
        let mut rt = rt.clone();
        async move {
            rt.run_pod_sandbox(cri::RunPodSandboxRequest::default())
                .await
                .map(|r| r.into_inner().pod_sandbox_id)
        }
    });
    assert_eq!(version().await.runtime_name, "recording");
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut run)
            .await
            .is_err(),
        "RunPodSandbox must wait for the rebuild"
    );
    let forwarded: Vec<String> = std::iter::from_fn(|| upstream.seen.try_recv().ok())
        .map(|r| r.path)
        .collect();
    assert!(
        !forwarded.iter().any(|p| p == RUN_SANDBOX),
        "held by criguard, not forwarded: {forwarded:?}"
    );

    // The rebuild ends: the held call goes through.
    release.send_replace(true);
    let id = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("RunPodSandbox answered once the model is rebuilt")
        .unwrap()
        .unwrap();
    assert_eq!(id, "sb-1");
    rt.version(cri::VersionRequest::default()).await.unwrap();
}
