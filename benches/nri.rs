//! What criguard costs the kubelet's calls in each mode, side by side in
//! one run on one private containerd 2 with NRI on: ListContainers and
//! CreateContainer p50/p99
//! - **direct**: containerd alone;
//! - **nri**: containerd with `criguard serve --mode nri` attached (the
//!   kubelet still calls containerd; CreateContainer now waits for
//!   criguard's adjustment);
//! - **proxy**: through `criguard serve` (the default mode).
//!
//! The rounds alternate the three (criguard attached only for the nri
//! rounds), so that the machine's drift falls on each alike.
//!
//! Run as root: `CRIGUARD_CONTAINERD=2 cargo bench --bench nri`.
//! `CRIGUARD_BENCH_ROUNDS` (default 5), `CRIGUARD_BENCH_CREATES` (per round,
//! default 10) and `CRIGUARD_BENCH_LISTS` (per round, default 200) size it.

use criguard_test_kit as common;

use std::time::{Duration, Instant};

use common::containerd::{ContainerdVersion, CriguardProcess, PrivateContainerd, unique};
use common::kubelet::PodSpec;
use common::pods::{remove_pods, sleeper};
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pct(xs: &mut [Duration], p: f64) -> f64 {
    xs.sort();
    let i = ((xs.len() as f64 - 1.0) * p).round() as usize;
    xs[i].as_secs_f64() * 1e3
}

/// `n` CreateContainer calls in `sandbox`, each timed; each container is
/// removed (untimed) before the next.
async fn creates(
    rt: &mut RuntimeServiceClient<Channel>,
    sandbox: &str,
    pod: &PodSpec,
    n: usize,
) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let mut config = pod.container_config(0);
        if let Some(m) = config.metadata.as_mut() {
            m.attempt = i as u32 + 1;
        }
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox.to_owned(),
            config: Some(config),
            sandbox_config: Some(pod.sandbox_config()),
        };
        let t = Instant::now();
        let id = rt
            .create_container(req)
            .await
            .unwrap()
            .into_inner()
            .container_id;
        out.push(t.elapsed());
        let rm = cri::RemoveContainerRequest { container_id: id };
        rt.remove_container(rm).await.unwrap();
    }
    out
}

/// `n` ListContainers calls, each timed.
async fn lists(rt: &mut RuntimeServiceClient<Channel>, n: usize) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        rt.list_containers(cri::ListContainersRequest::default())
            .await
            .unwrap();
        out.push(t.elapsed());
    }
    out
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    assert_eq!(
        ContainerdVersion::selected(),
        ContainerdVersion::V2,
        "NRI needs containerd 2: run with CRIGUARD_CONTAINERD=2"
    );
    let (rounds, n_create, n_list) = (
        env_or("CRIGUARD_BENCH_ROUNDS", 5usize),
        env_or("CRIGUARD_BENCH_CREATES", 10usize),
        env_or("CRIGUARD_BENCH_LISTS", 200usize),
    );
    let on = "disabled_plugins = [\"io.containerd.snapshotter.v1.aufs\"]\n\
              [plugins.\"io.containerd.nri.v1.nri\"]\ndisable = false\n";
    let ctrd = PrivateContainerd::start_with_toml(on);
    let nri_socket = ctrd.dir.join("nri/nri.sock");
    let work = tempfile::tempdir().unwrap();
    let proxy = CriguardProcess::start(&work.path().join("p.sock"), &ctrd.socket, &[]).await;
    let mut direct = ctrd.direct();
    let mut through = proxy.clients();
    let pod = PodSpec::new("bench", &unique("nri")).container(sleeper("app"));
    std::fs::create_dir_all(pod.log_directory()).unwrap();
    let sandbox = direct
        .rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(pod.sandbox_config()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    let names = ["direct", "nri", "proxy"];
    let mut create: [Vec<Duration>; 3] = Default::default();
    let mut list: [Vec<Duration>; 3] = Default::default();
    for round in 0..rounds {
        for (k, name) in names.iter().enumerate() {
            let plugin = if *name == "nri" {
                let args = [
                    "--mode",
                    "nri",
                    "--nri-socket",
                    nri_socket.to_str().unwrap(),
                ];
                let listen = work.path().join(format!("n{round}.sock"));
                let p = CriguardProcess::start(&listen, &ctrd.socket, &args).await;
                attached(&ctrd, round + 1).await;
                Some(p)
            } else {
                None
            };
            let rt = if *name == "proxy" {
                &mut through.rt
            } else {
                &mut direct.rt
            };
            create[k].extend(creates(rt, &sandbox, &pod, n_create).await);
            list[k].extend(lists(rt, n_list).await);
            drop(plugin);
        }
    }
    print_table(&names, &mut create, &mut list);
    remove_pods(&mut direct.rt, [sandbox]).await;
}

/// Waits until containerd has synchronised criguard's `n`th registration.
async fn attached(ctrd: &PrivateContainerd, n: usize) {
    let log = ctrd.dir.join("containerd.log");
    common::poll_until(Duration::from_secs(20), "criguard attached", || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let count = text
            .lines()
            .filter(|l| l.contains("connected and synchronized") && l.contains("criguard"))
            .count();
        async move { (count >= n).then_some(()) }
    })
    .await;
}

fn print_table(names: &[&str], create: &mut [Vec<Duration>; 3], list: &mut [Vec<Duration>; 3]) {
    let (c0, l0) = (pct(&mut create[0], 0.5), pct(&mut list[0], 0.5));
    println!(
        "\nkubelet's calls, containerd 2 with NRI on ({} creates, {} lists each)",
        create[0].len(),
        list[0].len()
    );
    println!(
        "{:<8} {:>26} {:>26}",
        "mode", "CreateContainer p50 / p99", "ListContainers p50 / p99"
    );
    for (k, name) in names.iter().enumerate() {
        let (cp50, cp99) = (pct(&mut create[k], 0.5), pct(&mut create[k], 0.99));
        let (lp50, lp99) = (pct(&mut list[k], 0.5), pct(&mut list[k], 0.99));
        println!(
            "{name:<8} {:>26} {:>26}",
            format!("{cp50:.2} / {cp99:.2} ms (×{:.2})", cp50 / c0),
            format!("{lp50:.3} / {lp99:.3} ms (×{:.2})", lp50 / l0),
        );
    }
}
