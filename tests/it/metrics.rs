//! The metrics endpoint, scraped and parsed the way Prometheus would.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::containerd::CriguardProcess;
use common::metrics::{free_port, parse, scrape};
use common::rawgrpc::{self, RecordingUpstream, Reply};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cri_calls_are_counted_by_method_and_code() {
    let dir = tempfile::tempdir().unwrap();
    let upstream_sock = dir.path().join("runtime.sock");
    let _upstream = RecordingUpstream::start(&upstream_sock, |r| {
        let status = if r.path.ends_with("/ContainerStatus") {
            "5"
        } else {
            "0"
        };
        Reply::Unary {
            headers: vec![],
            body: if status == "0" {
                rawgrpc::frame(b"")
            } else {
                Bytes::new()
            },
            trailers: vec![("grpc-status", status.into())],
        }
    });
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let guard = CriguardProcess::start(
        &dir.path().join("c.sock"),
        &upstream_sock,
        &["--metrics-address", &address],
    )
    .await;
    let mut client = rawgrpc::connect(&guard.socket).await;
    for _ in 0..3 {
        rawgrpc::call(
            &mut client,
            rawgrpc::empty_request("/runtime.v1.RuntimeService/Version"),
        )
        .await;
    }
    rawgrpc::call(
        &mut client,
        rawgrpc::empty_request("/runtime.v1.RuntimeService/ContainerStatus"),
    )
    .await;
    rawgrpc::call(
        &mut client,
        rawgrpc::empty_request("/some.other.Service/Call"),
    )
    .await;

    // Calls are recorded when their answer ends, just after the client sees it.
    let samples = common::poll_until(
        Duration::from_secs(10),
        "the calls to be counted",
        || async {
            let samples = parse(&scrape(port));
            let count = |method: &str, code: &str| {
                samples.iter().find_map(|(n, l, v)| {
                    (n == "criguard_cri_request_duration_seconds_count"
                        && l["method"] == method
                        && l["code"] == code)
                        .then_some(*v)
                })
            };
            (count("runtime.v1.RuntimeService/Version", "OK") == Some(3.0)
                && count("runtime.v1.RuntimeService/ContainerStatus", "NotFound") == Some(1.0)
                && count("other", "OK") == Some(1.0))
            .then_some(samples)
        },
    )
    .await;
    let version_sum = samples
        .iter()
        .find(|(n, l, _)| {
            n == "criguard_cri_request_duration_seconds_sum" && l["method"].ends_with("/Version")
        })
        .unwrap()
        .2;
    assert!(
        version_sum > 0.0 && version_sum < 10.0,
        "sum of 3 local calls: {version_sum}"
    );
    assert!(
        samples
            .iter()
            .any(|(n, _, _)| n.starts_with("criguard_oom_score_adj_writes"))
    );
}
