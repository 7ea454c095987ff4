//! Node scale: what criguard costs with many pods, side by side with
//! containerd and with containerd direct.
//!
//! Creates `CRIGUARD_SCALE_PODS` pods (default 250, two busybox containers
//! each, a third each BestEffort, Burstable and Guaranteed) the kubelet's
//! way through criguard, in a kubepods memcg, then measures:
//! - idle CPU of criguard and of containerd over `CRIGUARD_SCALE_IDLE`
//!   seconds (default 60) with no client activity, and criguard's RSS;
//! - `criguard rank|usage|pods --json` wall time (5 runs each);
//! - ListContainers and ListPodSandbox p50/p99, direct and through
//!   criguard, calls alternated;
//! - restart after SIGKILL: from the new process's start to its first
//!   answered call, and to the model holding every pod again;
//! - pressure → the hog's cgroup killed (`criguard_pressure_to_kill_seconds`)
//!   and → StopPodSandbox (`criguard_pressure_to_action_seconds`)
//!   under real memory pressure with all the other pods present,
//!   `CRIGUARD_SCALE_TRIALS` times (default 5): a BestEffort pod grows
//!   past `allocatableMemory.available<64Mi` and is evicted.
//!
//! Run with `hack/bench-scale.sh` (root).

use criguard_test_kit as common;

use std::time::{Duration, Instant};

use common::containerd::{CriguardProcess, unique};
use common::metrics::{free_port, parse, scrape, value};
use common::pods::{remove_pods, run_pod, sleeper};
use common::pressure::Pressure;
use criguard_test_kit::kubelet::PodSpec;
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

const MI: i64 = 1 << 20;
/// The pressure → kill histogram (evictions at grace 0 kill the pod first).
const KILL: &str = "criguard_pressure_to_kill_seconds";

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// utime + stime of `pid`, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
        return 0.0;
    };
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    f.iter().sum::<u64>() as f64 / hz
}

/// A `/proc/PID/status` field in MiB.
fn status_mib(pid: u32, field: &str) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

/// A pod of `qos` (0 BestEffort, 1 Burstable, 2 Guaranteed).
fn pod(p: &Pressure, i: usize) -> PodSpec {
    let mut c = [sleeper("a"), sleeper("b")];
    for c in &mut c {
        match i % 3 {
            1 => c.memory_request = 16 * MI,
            2 => {
                (c.memory_request, c.memory_limit) = (32 * MI, 32 * MI);
                (c.cpu_request_milli, c.cpu_limit_milli) = (10, 10);
            }
            _ => {}
        }
    }
    let [a, b] = c;
    p.spec(&format!("scale-{i}"), &unique(&format!("s{i}")), a)
        .container(b)
}

/// Creates `n` pods through `rt`, `parallel` at a time.
async fn create(p: &Pressure, rt: &RuntimeServiceClient<Channel>, n: usize) {
    let specs: Vec<PodSpec> = (0..n).map(|i| pod(p, i)).collect();
    for chunk in specs.chunks(8) {
        let runs = chunk.iter().map(|spec| {
            let mut rt = rt.clone();
            async move { run_pod(&mut rt, spec, None).await }
        });
        futures::future::join_all(runs).await;
    }
}

/// Wall time of `criguard <cmd> --json`, `runs` times, sorted.
fn cli_times(guard: &CriguardProcess, cmd: &str, runs: usize) -> Vec<Duration> {
    let mut t: Vec<Duration> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_criguard"))
                .args([cmd, "--json", "--admin-socket"])
                .arg(&guard.admin)
                .output()
                .unwrap();
            assert!(out.status.success(), "criguard {cmd}: {out:?}");
            start.elapsed()
        })
        .collect();
    t.sort();
    t
}

/// p50 and p99 (ms) of `calls` alternated List calls, direct then criguard.
async fn lists(
    direct: &RuntimeServiceClient<Channel>,
    proxied: &RuntimeServiceClient<Channel>,
    calls: usize,
) -> [[f64; 2]; 4] {
    let mut t: [Vec<Duration>; 4] = Default::default();
    for _ in 0..calls {
        for (k, rt) in [direct, proxied].into_iter().enumerate() {
            let mut rt = rt.clone();
            let s = Instant::now();
            rt.list_containers(cri::ListContainersRequest { filter: None })
                .await
                .unwrap();
            t[k].push(s.elapsed());
            let s = Instant::now();
            rt.list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
                .await
                .unwrap();
            t[2 + k].push(s.elapsed());
        }
    }
    t.map(|mut v| {
        v.sort();
        [pct(&v, 0.5), pct(&v, 0.99)]
    })
}

fn row(measure: &str, value: &str, goal: &str) {
    println!("{measure:<46} {value:<52} {goal}");
}

fn args(p: &Pressure, port: u16) -> Vec<String> {
    let dir = p.ctrd.dir.to_str().unwrap().to_owned();
    vec![
        format!("--kubepods-cgroup={}", p.kubepods),
        format!("--nodefs={dir}"),
        format!("--imagefs={dir}"),
        format!("--state-dir={dir}/criguard-state"),
        format!("--metrics-address=127.0.0.1:{port}"),
        "--eviction-hard=allocatableMemory.available<64Mi".into(),
        "--eviction-pressure-transition-period=2s".into(),
    ]
}

async fn start(p: &Pressure, port: u16) -> CriguardProcess {
    let a = args(p, port);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    CriguardProcess::start(&p.ctrd.dir.join("criguard.sock"), &p.ctrd.socket, &a).await
}

/// Sum and count of the pressure → action histogram.
fn pressure_hist(port: u16) -> (f64, f64) {
    hist(port, "criguard_pressure_to_action_seconds")
}

/// Sum and count of histogram `name`.
fn hist(port: u16, name: &str) -> (f64, f64) {
    let s = parse(&scrape(port));
    (
        value(&s, &format!("{name}_sum"), &[]).unwrap_or(0.0),
        value(&s, &format!("{name}_count"), &[]).unwrap_or(0.0),
    )
}

fn condition_clear(port: u16) -> bool {
    let s = parse(&scrape(port));
    value(
        &s,
        "criguard_node_condition",
        &[("condition", "MemoryPressure")],
    )
    .is_none_or(|v| v == 0.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` probes bench binaries this way.
    }
    let n = env_usize("CRIGUARD_SCALE_PODS", 250);
    let idle = Duration::from_secs(env_usize("CRIGUARD_SCALE_IDLE", 60) as u64);
    let trials = env_usize("CRIGUARD_SCALE_TRIALS", 5);
    // Room for the pods; lowered to their usage plus headroom below.
    let p = Pressure::new(16 << 10);
    let port = free_port();
    let mut guard = start(&p, port).await;
    let direct = p.ctrd.direct().rt;
    let t = Instant::now();
    create(&p, &guard.clients().rt, n).await;
    let created = t.elapsed();
    eprintln!(
        "{n} pods × 2 containers created through criguard in {:.1} s",
        created.as_secs_f64()
    );
    let memcg = format!("/sys/fs/cgroup/memory{}", p.kubepods);
    let used: i64 = std::fs::read_to_string(format!("{memcg}/memory.usage_in_bytes"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let limit = used + 256 * MI;
    std::fs::write(format!("{memcg}/memory.limit_in_bytes"), limit.to_string()).unwrap();
    let ctrd_pid: u32 = std::fs::read_to_string(p.ctrd.dir.join("containerd.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();

    // Idle: no calls at all.
    let before = (cpu_seconds(guard.pid()), cpu_seconds(ctrd_pid));
    let t = Instant::now();
    tokio::time::sleep(idle).await;
    let secs = t.elapsed().as_secs_f64();
    let idle_guard = (cpu_seconds(guard.pid()) - before.0) / secs * 100.0;
    let idle_ctrd = (cpu_seconds(ctrd_pid) - before.1) / secs * 100.0;
    let rss = status_mib(guard.pid(), "VmRSS:");

    let rank = cli_times(&guard, "rank", 5);
    let usage = cli_times(&guard, "usage", 5);
    let pods = cli_times(&guard, "pods", 5);
    let l = lists(&direct, &guard.clients().rt, 200).await;

    // Restart after SIGKILL: the first answer, then the full model.
    guard.signal_and_wait(9);
    let t = Instant::now();
    guard = start(&p, port).await;
    let mut rt = guard.clients().rt;
    let first = loop {
        let ok = rt
            .version(cri::VersionRequest {
                version: "v1".into(),
            })
            .await
            .is_ok();
        if ok {
            break t.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let rebuilt = common::poll_until(Duration::from_secs(60), "the model rebuilt", || async {
        (guard.pods().await.len() >= n).then(|| t.elapsed())
    })
    .await;

    // Pressure → StopPodSandbox with every other pod present.
    let mut actions = Vec::new();
    let mut kills = Vec::new();
    for i in 0..trials {
        common::poll_until(
            Duration::from_secs(60),
            "MemoryPressure to clear",
            || async { condition_clear(port).then_some(()) },
        )
        .await;
        let (sum0, count0) = pressure_hist(port);
        let (ksum0, kcount0) = hist(port, KILL);
        let hog = p.hog(&format!("hog-{i}"), 8, 256);
        let (_, c) = p.run(&guard, &hog).await;
        p.grow(&c).await;
        let (sum, count) =
            common::poll_until(Duration::from_secs(60), "the hog's eviction", || async {
                let (s, c) = pressure_hist(port);
                (c > count0).then_some((s, c))
            })
            .await;
        // The hog, and only the hog, was evicted: a ranking that picked
        // another pod first would show more than one action by its exit.
        p.exited_at_ms(&c).await;
        let (_, after) = pressure_hist(port);
        assert_eq!(
            after - count0,
            1.0,
            "trial {i}: {} pods evicted for one hog",
            after - count0
        );
        actions.push(Duration::from_secs_f64((sum - sum0) / (count - count0)));
        let (ksum, kcount) = hist(port, KILL);
        assert_eq!(
            kcount - kcount0,
            1.0,
            "trial {i}: the hog was not killed first"
        );
        kills.push(Duration::from_secs_f64(ksum - ksum0));
    }
    actions.sort();
    kills.sort();

    let ms = |d: &[Duration]| format!("{:.0} ms p50, {:.0} ms max", pct(d, 0.5), pct(d, 1.0));
    println!(
        "\nnode scale, {n} pods × 2 containers (created through criguard in {:.1} s), kubepods memcg {} MiB",
        created.as_secs_f64(),
        limit / MI
    );
    row("measure", &format!("at {n} pods"), "goal");
    row(
        &format!("idle CPU over {secs:.0} s, no client activity"),
        &format!("criguard {idle_guard:.2} % of a core (containerd {idle_ctrd:.2} %)"),
        "≤ 0.5 %",
    );
    row("criguard rank --json", &ms(&rank), "≤ 50 ms");
    row("criguard usage --json", &ms(&usage), "—");
    row("criguard pods --json", &ms(&pods), "—");
    let list = |name: &str, d: [f64; 2], p: [f64; 2]| {
        row(
            &format!("{name} p50 / p99, direct → criguard"),
            &format!(
                "{:.2} / {:.2} → {:.2} / {:.2} ms (×{:.2} p50)",
                d[0],
                d[1],
                p[0],
                p[1],
                p[0] / d[0]
            ),
            "—",
        )
    };
    list("ListContainers", l[0], l[1]);
    list("ListPodSandbox", l[2], l[3]);
    row(
        &format!("pressure → pod's cgroup killed ({trials} trials)"),
        &ms(&kills),
        "—",
    );
    row(
        &format!("pressure → StopPodSandbox ({trials} trials)"),
        &ms(&actions),
        "p99 ≤ 100 ms",
    );
    row(
        "restart after SIGKILL: first call answered",
        &format!("+{:.0} ms", first.as_secs_f64() * 1e3),
        "≤ 100 ms",
    );
    row(
        "restart after SIGKILL: model holds every pod",
        &format!("+{:.0} ms", rebuilt.as_secs_f64() * 1e3),
        "calls never wait on it",
    );
    row("RSS", &format!("{rss:.1} MiB"), "≤ 30 MiB");

    drop(guard);
    let mut rt = direct.clone();
    let left = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .items;
    remove_pods(&mut rt, left.into_iter().map(|s| s.id)).await;
}
