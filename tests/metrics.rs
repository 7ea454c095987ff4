//! The metrics endpoint, scraped and parsed the way Prometheus would.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::time::Duration;

use bytes::Bytes;
use common::containerd::CriguardProcess;
use common::rawgrpc::{self, RecordingUpstream, Reply};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One sample: metric name, labels, value.
type Sample = (String, HashMap<String, String>, f64);

fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (head, value) = l.rsplit_once(' ').unwrap();
            let (name, labels) = match head.split_once('{') {
                Some((n, rest)) => {
                    let labels = rest
                        .trim_end_matches('}')
                        .split(',')
                        .filter_map(|kv| kv.split_once('='))
                        .map(|(k, v)| (k.to_owned(), v.trim_matches('"').to_owned()))
                        .collect();
                    (n.to_owned(), labels)
                }
                None => (head.to_owned(), HashMap::new()),
            };
            (name, labels, value.parse().unwrap())
        })
        .collect()
}

fn scrape(port: u16) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(
        out.starts_with("HTTP/1.0 200") || out.starts_with("HTTP/1.1 200"),
        "{out}"
    );
    out.split_once("\r\n\r\n").unwrap().1.to_owned()
}

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
            rawgrpc::request(
                "/runtime.v1.RuntimeService/Version",
                rawgrpc::frame(b""),
                &[],
            ),
        )
        .await;
    }
    rawgrpc::call(
        &mut client,
        rawgrpc::request(
            "/runtime.v1.RuntimeService/ContainerStatus",
            rawgrpc::frame(b""),
            &[],
        ),
    )
    .await;
    rawgrpc::call(
        &mut client,
        rawgrpc::request("/some.other.Service/Call", rawgrpc::frame(b""), &[]),
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
