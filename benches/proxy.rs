//! Proxy overhead, side by side in one run: the same CRI calls made to a
//! private containerd directly, through socat, through our own byte relay
//! (`examples/byte_relay`) and through criguard, the four paths cycled call
//! by call (the first path rotating) so that all see the same machine noise.
//! Three clients make the calls: tonic (in process), grpc-go (`crigo bench`)
//! and grpcio (`cripy.py bench`), each timing calls inside the client.
//! Prints p50/p99 per path with ratios against direct and against the best
//! byte relay, and the CPU each relay spent per forwarded call.
//!
//! Run with `hack/bench-proxy.sh`. `CRIGUARD_BENCH_CONTAINERS` (default 100)
//! and `CRIGUARD_BENCH_CALLS` (default 2000 per path; ListContainers a
//! quarter) size it; `CRIGUARD_BENCH_CLIENTS` (default `tonic,grpc-go,grpcio`)
//! picks clients. grpc-go dials the bare socket path (`:authority` is the
//! path, as kubelets before 1.31 send it) and grpcio sends its
//! percent-encoded authority; `CRIGUARD_BENCH_DIAL=localhost` makes both
//! send `localhost` instead. `CRIGUARD_BENCH_RELAY_MODE` picks the `relay`
//! path's `byte_relay --mode`; the `loop` path is `byte_relay --mode pump`,
//! criguard's own I/O loop passing bytes untouched.

use criguard_test_kit as common;
#[path = "proxy/floor.rs"]
mod floor;
#[path = "proxy/report.rs"]
mod report;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine;
use common::containerd::{CriguardProcess, PrivateContainerd, remove_cgroup_tree, unique};
use common::pods::{remove_pods, run_pod, sleeper};
use common::tonic_raw::{RawCodec, channel};
use criguard_test_kit::kubelet::PodSpec;
use floor::{Relay, cpu_seconds};
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use prost::Message;
use report::{PATHS, Sample};
use tonic::transport::Channel;

const PER_POD: usize = 10;
const WARMUP: usize = 20;
const RT: &str = "/runtime.v1.RuntimeService/";

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn populate(
    rt: &mut RuntimeServiceClient<Channel>,
    root: &str,
    log_root: &str,
    total: usize,
) -> Vec<String> {
    let mut ids = Vec::new();
    for p in 0..total.div_ceil(PER_POD) {
        let mut pod = PodSpec::new(&format!("bench-{p}"), &unique(&format!("bench{p}")));
        pod.cgroup_root = format!("{root}/kubepods");
        pod.log_root = log_root.to_owned();
        for c in 0..PER_POD.min(total - p * PER_POD) {
            pod = pod.container(sleeper(&format!("c{c}")));
        }
        let (_, created) = run_pod(rt, &pod, None).await;
        ids.extend(created);
    }
    ids
}

/// `n` timed calls per path with tonic, paths cycled call by call.
async fn tonic_bench(
    sockets: &[PathBuf],
    method: &str,
    req: &[u8],
    n: usize,
) -> Vec<Vec<Duration>> {
    let mut clients: Vec<_> = sockets
        .iter()
        .map(|s| tonic::client::Grpc::new(channel(s)).max_decoding_message_size(16 << 20))
        .collect();
    let path: http::uri::PathAndQuery = method.parse().unwrap();
    let mut times = vec![Vec::with_capacity(n); sockets.len()];
    for i in 0..WARMUP + n {
        for k in 0..sockets.len() {
            let t = (i + k) % sockets.len();
            let c = &mut clients[t];
            let start = Instant::now();
            c.ready().await.unwrap();
            c.unary(tonic::Request::new(req.to_vec()), path.clone(), RawCodec)
                .await
                .unwrap_or_else(|e| panic!("tonic via {}: {e}", PATHS[t]));
            if i >= WARMUP {
                times[t].push(start.elapsed());
            }
        }
    }
    times
}

/// The same with a helper's bench mode (`crigo bench`, `cripy.py bench`).
fn helper_bench(
    program: &Path,
    pre: &[&str],
    extra: &[&str],
    targets: &[String],
    method: &str,
    req: &[u8],
    n: usize,
) -> Vec<Vec<Duration>> {
    let out = std::process::Command::new(program)
        .args(pre)
        .args([
            "bench",
            "--n",
            &n.to_string(),
            "--warmup",
            &WARMUP.to_string(),
        ])
        .args(extra)
        .args(["--method", method, "--req"])
        .arg(base64::engine::general_purpose::STANDARD.encode(req))
        .args(targets)
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run the bench helper");
    assert!(out.status.success(), "{} bench failed", program.display());
    let mut times = vec![Vec::with_capacity(n); targets.len()];
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let (t, ns) = line.split_once(' ').unwrap();
        times[t.parse::<usize>().unwrap()].push(Duration::from_nanos(ns.parse().unwrap()));
    }
    times
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` probes bench binaries this way.
    }
    let total = env_usize("CRIGUARD_BENCH_CONTAINERS", 100);
    let calls = env_usize("CRIGUARD_BENCH_CALLS", 2000);
    let clients = std::env::var("CRIGUARD_BENCH_CLIENTS").unwrap_or("tonic,grpc-go,grpcio".into());
    let raw_dial = std::env::var("CRIGUARD_BENCH_DIAL").is_ok_and(|v| v != "localhost");
    let built = common::clients::built();
    let ctrd = PrivateContainerd::start();
    let guard = CriguardProcess::start(&ctrd.dir.join("criguard.sock"), &ctrd.socket, &[]).await;
    let socat = Relay::socat(&ctrd.dir.join("socat.sock"), &ctrd.socket);
    let relay = Relay::ours(&ctrd.dir.join("relay.sock"), &ctrd.socket, None);
    let pump = Relay::ours(&ctrd.dir.join("loop.sock"), &ctrd.socket, Some("pump"));
    let sockets = vec![
        ctrd.socket.clone(),
        socat.socket.clone(),
        relay.socket.clone(),
        pump.socket.clone(),
        guard.socket.clone(),
    ];
    for s in &sockets {
        common::poll_until(Duration::from_secs(10), "a relay's socket", || async {
            tokio::net::UnixStream::connect(s).await.ok().map(|_| ())
        })
        .await;
    }
    let root = format!("/{}", unique("criguard-bench"));
    let direct = ctrd.direct();
    let t = Instant::now();
    let ids = populate(
        &mut direct.rt.clone(),
        &root,
        ctrd.dir.join("pods").to_str().unwrap(),
        total,
    )
    .await;
    eprintln!(
        "{} running containers in {:.1} s",
        ids.len(),
        t.elapsed().as_secs_f64()
    );
    for s in &sockets {
        let listed = RuntimeServiceClient::new(channel(s))
            .list_containers(cri::ListContainersRequest { filter: None })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            listed.containers.len(),
            total,
            "ListContainers via {}",
            s.display()
        );
    }

    // What criguard spends with no call to forward (its own rounds), over 3 s.
    let idle_from = (cpu_seconds(guard.pid()), Instant::now());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle_rate = (cpu_seconds(guard.pid()) - idle_from.0) / idle_from.1.elapsed().as_secs_f64();

    let status = cri::ContainerStatusRequest {
        container_id: ids[0].clone(),
        verbose: false,
    }
    .encode_to_vec();
    let methods: [(&str, Vec<u8>, usize); 3] = [
        (
            "ListContainers",
            cri::ListContainersRequest { filter: None }.encode_to_vec(),
            calls / 4,
        ),
        ("ContainerStatus", status, calls),
        (
            "Version",
            cri::VersionRequest {
                version: "v1".into(),
            }
            .encode_to_vec(),
            calls,
        ),
    ];
    let go_targets: Vec<String> = sockets
        .iter()
        .map(|s| {
            if raw_dial {
                s.display().to_string()
            } else {
                format!("unix://{}", s.display())
            }
        })
        .collect();
    let py_targets: Vec<String> = sockets
        .iter()
        .map(|s| format!("unix:{}", s.display()))
        .collect();
    let cripy = built.cripy.to_str().unwrap();
    let pids = [guard.pid(), relay.pid(), socat.pid(), pump.pid()];
    let cpu_before = pids.map(cpu_seconds);
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut forwarded = 0usize;
    for client in clients.split(',') {
        for (name, req, n) in &methods {
            let method = format!("{RT}{name}");
            let times = match client {
                "tonic" => tonic_bench(&sockets, &method, req, *n).await,
                "grpc-go" => helper_bench(&built.crigo, &[], &[], &go_targets, &method, req, *n),
                "grpcio" => {
                    let extra: &[&str] = if raw_dial {
                        &[]
                    } else {
                        &["--authority", "localhost"]
                    };
                    helper_bench(
                        &built.python,
                        &[cripy],
                        extra,
                        &py_targets,
                        &method,
                        req,
                        *n,
                    )
                }
                other => panic!("CRIGUARD_BENCH_CLIENTS: unknown client {other:?}"),
            };
            forwarded += n + WARMUP;
            samples.push(Sample::new(
                match client {
                    "tonic" => "tonic",
                    "grpc-go" => "grpc-go",
                    _ => "grpcio",
                },
                name,
                times,
            ));
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu_after = pids.map(cpu_seconds);
    let per_call = |i: usize| (cpu_after[i] - cpu_before[i]) / forwarded as f64 * 1e6;

    println!(
        "\nproxy overhead, one run: {total} containers; paths cycled call by call; latencies in µs, timed inside each client"
    );
    println!(
        "paths: direct = containerd's socket; socat = socat UNIX-LISTEN,fork; relay = examples/byte_relay (poll); \
         loop = criguard's relay loop passing bytes (byte_relay --mode pump); criguard"
    );
    println!("floor = the best of socat, relay and loop in the same row\n");
    report::header();
    for s in &samples {
        report::rows(s);
    }
    println!();
    report::summary(&samples);
    let idle_per_call = idle_rate * elapsed / forwarded as f64 * 1e6;
    println!(
        "CPU per forwarded call (user+sys from /proc/PID/stat over {forwarded} calls per path, {elapsed:.1} s): \
         criguard {:.1} µs ({:.1} µs net of its idle {:.1} ms/s), byte_relay {:.1} µs, loop {:.1} µs, socat {:.1} µs \
         (target for criguard ≤ 25 µs)",
        per_call(0),
        per_call(0) - idle_per_call,
        idle_rate * 1e3,
        per_call(1),
        per_call(3),
        per_call(2),
    );

    // Tear down through the runtime so the cgroups can go.
    let mut rt = direct.rt.clone();
    let sandboxes = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .items;
    remove_pods(&mut rt, sandboxes.into_iter().map(|s| s.id)).await;
    drop((socat, relay, pump, guard));
    drop(ctrd);
    remove_cgroup_tree(&root);
}
