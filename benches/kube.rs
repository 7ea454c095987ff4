//! What the Kubernetes API report costs an eviction: from criguard's
//! decision to the evicted container's exit (containerd's own `finished_at`),
//! with no API, with the stand-in API answering, answering after 3 s,
//! refusing (403), and unreachable (nothing listening), side by side. The
//! report waits at most `kubeStatusTimeout` (250 ms) for the pod status;
//! only the slow API should come near that bound, and none past it.
//!
//! Real memory pressure on a private containerd: per trial a BestEffort pod
//! holds 30 MiB of a 320 MiB kubepods memcg and then grows by 250 MiB past
//! `allocatableMemory.available<64Mi`. One criguard per mode, same
//! containerd and memcg.
//!
//! Run as root: `cargo bench --bench kube`; `CRIGUARD_BENCH_TRIALS`
//! (default 5) sizes it.

use criguard_test_kit as common;

use std::time::Duration;

use common::apiserver::{ApiServer, write_kubeconfig};
use common::pressure::Pressure;
use serde_json::json;

const NODE: &str = "criguard-bench-node";

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    NoApi,
    Answering,
    Slow,
    Refusing,
    Unreachable,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::NoApi => "no API",
            Mode::Answering => "API answering",
            Mode::Slow => "API answering after 3 s",
            Mode::Refusing => "API refusing (403)",
            Mode::Unreachable => "API unreachable",
        }
    }
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn run_mode(sc: &Pressure, api: &ApiServer, mode: Mode, trials: usize) -> Vec<u64> {
    let state = tempfile::tempdir().unwrap();
    let kubeconfig = match mode {
        Mode::NoApi => None,
        Mode::Unreachable => {
            let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = closed.local_addr().unwrap();
            drop(closed);
            Some(write_kubeconfig(state.path(), &format!("http://{addr}")))
        }
        _ => Some(api.kubeconfig(state.path())),
    };
    api.set_delay(if mode == Mode::Slow {
        Duration::from_secs(3)
    } else {
        Duration::ZERO
    });
    if mode == Mode::Refusing {
        api.deny("patch", "pods/status");
    }
    let kc = kubeconfig.map(|k| format!("--kubeconfig={}", k.display()));
    let node = format!("--node-name={NODE}");
    let mut args = vec![
        "--eviction-hard=allocatableMemory.available<64Mi",
        "--eviction-pressure-transition-period=1s",
        node.as_str(),
    ];
    args.extend(kc.as_deref());
    let guard = sc.criguard(state.path(), &args).await;
    let mut out = Vec::new();
    for i in 0..trials {
        let pod = sc.hog(&format!("hog-{i}"), 30, 250);
        api.put(
            "pods",
            "default",
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod.name, "namespace": "default", "uid": pod.uid},
                "spec": {"containers": [{"name": "app", "image": "busybox"}]},
                "status": {"phase": "Running"}}),
        );
        // New BestEffort pods wait until MemoryPressure is over.
        common::poll_until(
            Duration::from_secs(60),
            "MemoryPressure to clear",
            || async {
                let c = guard.conditions().await;
                let pressure = criguard::signals::table::Condition::MemoryPressure;
                (!c.conditions.contains(&pressure)).then_some(())
            },
        )
        .await;
        let (_, container) = sc.run(&guard, &pod).await;
        sc.grow(&container).await;
        let e = common::poll_until(Duration::from_secs(60), "the eviction", || async {
            guard
                .evictions()
                .await
                .into_iter()
                .find(|e| e.uid == pod.uid)
        })
        .await;
        let ms = sc
            .exited_at_ms(&container)
            .await
            .saturating_sub(e.at_unix_ms);
        println!("  {:<26} trial {i}: {ms} ms", mode.name());
        out.push(ms);
    }
    common::pods::remove_pods(
        &mut guard.clients().rt,
        guard.pods().await.into_iter().map(|p| p.sandbox_id),
    )
    .await;
    out
}

fn main() {
    let trials: usize = std::env::var("CRIGUARD_BENCH_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let sc = Pressure::new(320);
        let modes = [
            Mode::NoApi,
            Mode::Answering,
            Mode::Slow,
            Mode::Refusing,
            Mode::Unreachable,
        ];
        let mut rows = Vec::new();
        for mode in modes {
            // A fresh stand-in per mode: no delay or denial carries over.
            let api = ApiServer::start().await;
            api.put(
                "nodes",
                "",
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}),
            );
            let mut ms = run_mode(&sc, &api, mode, trials).await;
            ms.sort_unstable();
            rows.push((mode, ms));
        }
        let base = percentile(&rows[0].1, 0.5).max(1) as f64;
        println!("\ndecision -> container exited, {trials} trials per mode, bound 250 ms");
        println!("| mode | p50 | max | p50 ÷ no API |");
        println!("| --- | --- | --- | --- |");
        for (mode, ms) in &rows {
            let p50 = percentile(ms, 0.5);
            println!(
                "| {} | {p50} ms | {} ms | ×{:.1} |",
                mode.name(),
                ms[ms.len() - 1],
                p50 as f64 / base
            );
        }
    });
}
