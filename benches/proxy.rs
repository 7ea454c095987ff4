//! Proxy overhead, side by side: the same CRI calls made directly to a
//! private containerd and through criguard, alternated call by call so that
//! both see the same machine noise. Prints p50/p99 and their ratios.
//!
//! Run with `hack/bench-proxy.sh` (or `cargo bench --bench proxy` as root).
//! `CRIGUARD_BENCH_CONTAINERS` (default 100) and `CRIGUARD_BENCH_CALLS`
//! (default 2000) size the run.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::containerd::{Clients, CriguardProcess, PrivateContainerd, remove_cgroup_tree, unique};
use common::pods::{remove_pods, run_pod, sleeper};
use criguard::kubelet::PodSpec;
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

const PER_POD: usize = 10;

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
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

/// Times `calls` alternated calls on both clients; returns (direct, proxied).
async fn measure<F, Fut>(
    calls: usize,
    direct: &Clients,
    proxied: &Clients,
    mut call: F,
) -> (Vec<Duration>, Vec<Duration>)
where
    F: FnMut(RuntimeServiceClient<Channel>, usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (mut d, mut p) = (Vec::with_capacity(calls), Vec::with_capacity(calls));
    // Warm both connections up first.
    for i in 0..20 {
        call(direct.rt.clone(), i).await;
        call(proxied.rt.clone(), i).await;
    }
    for i in 0..calls {
        // Alternate which side goes first so neither always runs warm.
        let order = if i % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for is_direct in order {
            let client = if is_direct {
                direct.rt.clone()
            } else {
                proxied.rt.clone()
            };
            let t = Instant::now();
            call(client, i).await;
            let e = t.elapsed();
            if is_direct { d.push(e) } else { p.push(e) }
        }
    }
    d.sort();
    p.sort();
    (d, p)
}

fn row(name: &str, (d, p): &(Vec<Duration>, Vec<Duration>)) {
    let us = |x: Duration| x.as_secs_f64() * 1e6;
    let (d50, d99, p50, p99) = (
        percentile(d, 0.5),
        percentile(d, 0.99),
        percentile(p, 0.5),
        percentile(p, 0.99),
    );
    println!(
        "{name:<17} {:>7} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>8.3} {:>8.3} {:>10.0}",
        d.len(),
        us(d50),
        us(p50),
        us(d99),
        us(p99),
        us(p50) / us(d50),
        us(p99) / us(d99),
        us(p50) - us(d50),
    );
}

/// User plus system CPU seconds a process has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the parenthesised command name; utime and stime are 14 and 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / hz
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` probes bench binaries this way.
    }
    let total = env_usize("CRIGUARD_BENCH_CONTAINERS", 100);
    let calls = env_usize("CRIGUARD_BENCH_CALLS", 2000);
    let ctrd = PrivateContainerd::start();
    let guard = CriguardProcess::start(&ctrd.dir.join("criguard.sock"), &ctrd.socket, &[]).await;
    let root = format!("/{}", unique("criguard-bench"));
    let direct = ctrd.direct();
    let proxied = guard.clients();
    let log_root = ctrd.dir.join("pods");
    let t = Instant::now();
    let ids = populate(
        &mut direct.rt.clone(),
        &root,
        log_root.to_str().unwrap(),
        total,
    )
    .await;
    eprintln!(
        "{} running containers in {:.1} s",
        ids.len(),
        t.elapsed().as_secs_f64()
    );

    let cpu_before = cpu_seconds(guard.pid());
    let version = measure(calls, &direct, &proxied, |mut c, _| async move {
        c.version(cri::VersionRequest {
            version: "v1".into(),
        })
        .await
        .unwrap();
    })
    .await;
    let list = measure(calls / 4, &direct, &proxied, |mut c, _| async move {
        let n = c
            .list_containers(cri::ListContainersRequest { filter: None })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(n.containers.len(), total);
    })
    .await;
    let ids_ref = &ids;
    let status = measure(calls, &direct, &proxied, |mut c, i| async move {
        let id = ids_ref[i % ids_ref.len()].clone();
        c.container_status(cri::ContainerStatusRequest {
            container_id: id,
            verbose: false,
        })
        .await
        .unwrap();
    })
    .await;
    let proxied_calls = (calls + calls / 4 + calls + 3 * 20) as f64;
    let cpu_per_call = (cpu_seconds(guard.pid()) - cpu_before) / proxied_calls * 1e6;

    println!(
        "\ncriguard proxy overhead: {total} containers, calls alternated direct/criguard, times in µs"
    );
    println!(
        "{:<17} {:>7} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>10}",
        "method",
        "calls",
        "p50 direct",
        "p50 proxy",
        "p99 direct",
        "p99 proxy",
        "p50 ×",
        "p99 ×",
        "added p50"
    );
    row("Version", &version);
    row("ListContainers", &list);
    row("ContainerStatus", &status);
    println!("criguard CPU time per proxied call: {cpu_per_call:.0} µs (user+sys, /proc/PID/stat)");
    println!(
        "targets: p50 × ≤ 1.05 for ListContainers and ContainerStatus; added p50 ≤ 100 µs for Version"
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
    drop(guard);
    drop(ctrd);
    remove_cgroup_tree(&root);
}
