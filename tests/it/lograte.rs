//! A flood of refused RunPodSandbox calls (an evicted pod asked for again
//! and again) costs the journal a bounded number of lines: the refusal line
//! is rate-limited per call site, and a summary line carries the count of
//! the lines suppressed. Every refusal is still answered and counted.

use crate::common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::rawgrpc::{self, RecordingUpstream, Reply};
use k8s_cri::v1 as cri;
use prost::Message;

fn ok(msg: impl Message) -> Reply {
    Reply::Unary {
        headers: vec![],
        body: rawgrpc::frame(&msg.encode_to_vec()),
        trailers: vec![("grpc-status", "0".into())],
    }
}

/// Kills and reaps the child when dropped.
struct Reaped(std::process::Child);
impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_flood_logs_a_bounded_number_of_lines_with_the_count() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = dir.path().join("runtime.sock");
    let _upstream = RecordingUpstream::start(&runtime, |r| match r.path.as_str() {
        "/runtime.v1.RuntimeService/ListPodSandbox" => ok(cri::ListPodSandboxResponse::default()),
        "/runtime.v1.RuntimeService/ListContainers" => ok(cri::ListContainersResponse::default()),
        _ => ok(cri::VersionResponse::default()),
    });
    // The pod was evicted by an earlier run.
    let state = dir.path().join("state");
    let mut evicted = criguard::eviction::records::EvictedPods::default();
    let now = criguard::clock::now_ms();
    evicted.insert(
        "uid-evicted",
        "default/hog",
        "The node was low on resource: memory.",
        now,
    );
    criguard::eviction::store::EvictedStore::new(&state)
        .save(&evicted)
        .unwrap();

    let listen = dir.path().join("criguard.sock");
    let log = dir.path().join("criguard.log");
    let child = Command::new(env!("CARGO_BIN_EXE_criguard"))
        .arg("serve")
        .arg("--listen")
        .arg(&listen)
        .arg("--admin-socket")
        .arg(dir.path().join("admin.sock"))
        .arg("--state-dir")
        .arg(&state)
        .args(["--metrics-address", "none", "--dynamic-oom-score-adj=false"])
        .arg("--runtime-endpoint")
        .arg(format!("unix://{}", runtime.display()))
        .env("CRIGUARD_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _child = Reaped(child);
    common::poll_until(Duration::from_secs(20), "criguard's socket", || async {
        tokio::net::UnixStream::connect(&listen)
            .await
            .ok()
            .map(|_| ())
    })
    .await;

    let mut rt = common::containerd::Clients::new(&listen).rt;
    let req = cri::RunPodSandboxRequest {
        config: Some(cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: "hog".into(),
                uid: "uid-evicted".into(),
                namespace: "default".into(),
                attempt: 1,
            }),
            ..Default::default()
        }),
        runtime_handler: String::new(),
    };
    const CALLS: usize = 2000;
    let started = std::time::Instant::now();
    for i in 0..CALLS {
        let err = rt
            .run_pod_sandbox(req.clone())
            .await
            .expect_err("the evicted pod admitted");
        assert_eq!(
            err.code(),
            tonic::Code::ResourceExhausted,
            "call {i}: {err:?}"
        );
    }
    let took = started.elapsed();
    // One more after the period: the summary of what was suppressed.
    tokio::time::sleep(criguard::lograte::PERIOD).await;
    rt.run_pod_sandbox(req.clone()).await.unwrap_err();

    let text = std::fs::read_to_string(&log).unwrap();
    let refused = text.matches("RunPodSandbox refused").count();
    let summaries: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("similar lines suppressed"))
        .collect();
    eprintln!(
        "{} refusals in {took:?}: {refused} refusal lines, summaries {summaries:?}",
        CALLS + 1
    );
    // At most BURST a period; the flood spans a few periods at most.
    let periods = 1 + took.as_secs() / criguard::lograte::PERIOD.as_secs() + 1;
    let bound = periods as usize * criguard::lograte::BURST as usize;
    assert!(
        (1..=bound).contains(&refused),
        "{refused} refusal lines for {} refusals (bound {bound})",
        CALLS + 1
    );
    let suppressed: usize = summaries
        .iter()
        .filter_map(|l| {
            let at = l.find("suppressed=")? + "suppressed=".len();
            l[at..]
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<usize>()
                .ok()
        })
        .sum();
    assert_eq!(
        suppressed + refused,
        CALLS + 1,
        "every refusal logged or counted: {summaries:?}"
    );
}
