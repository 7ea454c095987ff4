//! Disk usage read by criguard against containerd's own numbers, in one run
//! on one private containerd (overlayfs).
//!
//! 1. Freshness: N MiB are written into a running container's writable
//!    layer (ExecSync `dd`); from the moment the write returns, how long
//!    until a running criguard's `GET /v1/usage` reports them, and how long
//!    until containerd's CRI `ContainerStats` (`writable_layer.used_bytes`,
//!    from its snapshot cache refreshed every `stats_collect_period`, 10 s)
//!    does. Target: criguard under 1 s.
//! 2. Cost: 50 writable layers of 1 000 files each, page cache warm: wall
//!    and CPU time of criguard's walks of the 50 layers, of criguard's whole
//!    read of those pods (layers, logs, emptyDirs, processes; upperdirs
//!    cached, and cold with 50 `Mounts` calls), of containerd's snapshots
//!    `Usage` for the 50, and of one `du -s` over them. Target: criguard's
//!    cost no higher than containerd's own walk.
//!
//! Run as root with `cargo bench --bench disk`. `CRIGUARD_BENCH_MIB`
//! (default 32) sizes the freshness write, `CRIGUARD_BENCH_ROUNDS`
//! (default 10) the cost rounds.

use criguard_test_kit as common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::resource::{UsageWho, getrusage};

use common::containerd::{CriguardProcess, PrivateContainerd, remove_cgroup_tree, unique};
use common::pods::{BUSYBOX, mem_total, remove_pods, run_pod, sleeper};
use criguard::cgroup::fs::CgroupFs;
use criguard::eviction::rank::usage_pods;
use criguard::model::Pod;
use criguard::runtime::snapshots::Snapshots;
use criguard::runtime::{RuntimeEndpoint, Upstream};
use criguard::signals::disk;
use criguard::signals::usage::{UsageReader, UsageSources};
use criguard_test_kit::kubelet::{ContainerSpec, PodSpec};
use k8s_cri::v1 as cri;

const LAYERS: usize = 50;
const PER_POD: usize = 10;
const FILES: usize = 1000;
const MI: u64 = 1 << 20;

fn env_u64(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CPU time of every thread of process `pid` (`/proc/PID/task/*/schedstat`,
/// nanoseconds on CPU): precise where `/proc/PID/stat` counts 10 ms ticks.
fn process_cpu(pid: u32) -> Duration {
    let mut ns = 0u64;
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
                ns += s
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    Duration::from_nanos(ns)
}

/// `getrusage(who)` user + system time.
fn rusage(who: UsageWho) -> Duration {
    let r = getrusage(who).expect("getrusage");
    let tv =
        |t: nix::sys::time::TimeVal| Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000);
    tv(r.user_time()) + tv(r.system_time())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Wall and CPU time of one measured step, per round.
#[derive(Default)]
struct Samples {
    wall: Vec<Duration>,
    cpu: Vec<Duration>,
}

impl Samples {
    fn push(&mut self, wall: Duration, cpu: Duration) {
        self.wall.push(wall);
        self.cpu.push(cpu);
    }
    fn medians(&self) -> (Duration, Duration) {
        (median(self.wall.clone()), median(self.cpu.clone()))
    }
}

/// The writable-layer bytes containerd's CRI reports for `id`.
async fn cri_writable_bytes(ctrd: &PrivateContainerd, id: &str) -> u64 {
    let req = cri::ContainerStatsRequest {
        container_id: id.into(),
    };
    let stats = ctrd.direct().rt.container_stats(req).await.unwrap();
    stats
        .into_inner()
        .stats
        .and_then(|s| s.writable_layer)
        .and_then(|w| w.used_bytes)
        .map_or(0, |v| v.value)
}

/// criguard's reading of `id`'s writable layer, through its admin socket.
async fn criguard_writable_bytes(guard: &CriguardProcess, id: &str) -> u64 {
    let u = criguard::admin::get_usage(&guard.admin).await.unwrap();
    u.pods
        .iter()
        .flat_map(|p| &p.containers)
        .find(|c| c.id == id)
        .and_then(|c| c.rootfs)
        .map_or(0, |r| r.bytes)
}

/// Polls `read` every `every` until it reaches `want` or `limit` passes;
/// the time from `since` to the first reading that did.
async fn time_until<F, Fut>(
    since: Instant,
    want: u64,
    every: Duration,
    limit: Duration,
    mut read: F,
) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = u64>,
{
    loop {
        if read().await >= want {
            return Some(since.elapsed());
        }
        if since.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

async fn freshness(ctrd: &PrivateContainerd, guard: &CriguardProcess, id: &str, mib: u64) {
    println!("\n1. freshness: {mib} MiB written into a running container's writable layer");
    println!(
        "{:<6} {:>14} {:>26} {:>16}",
        "round", "criguard (ms)", "containerd CRI stats (ms)", "containerd ÷ crig."
    );
    // From what criguard reports before writing: each round waits for its
    // own write (less 256 KiB, as containerd's count may differ by a block).
    let base = criguard_writable_bytes(guard, id).await;
    for round in 1..=3 {
        let target = base + round * mib * MI - (256 << 10);
        let cmd = format!("dd if=/dev/zero of=/fresh{round} bs=1M count={mib} 2>/dev/null");
        let req = cri::ExecSyncRequest {
            container_id: id.into(),
            cmd: vec!["sh".into(), "-c".into(), cmd],
            timeout: 30,
        };
        let r = ctrd.direct().rt.exec_sync(req).await.unwrap().into_inner();
        assert_eq!(r.exit_code, 0, "dd in the container");
        let written = Instant::now();
        let (crig, ctr) = tokio::join!(
            time_until(
                written,
                target,
                Duration::from_millis(10),
                Duration::from_secs(5),
                || criguard_writable_bytes(guard, id),
            ),
            time_until(
                written,
                target,
                Duration::from_millis(50),
                Duration::from_secs(25),
                || cri_writable_bytes(ctrd, id),
            ),
        );
        let show =
            |d: Option<Duration>| d.map_or("> limit".to_owned(), |d| format!("{:.1}", ms(d)));
        let ratio = match (crig, ctr) {
            (Some(a), Some(b)) => format!("{:.0}×", b.as_secs_f64() / a.as_secs_f64()),
            _ => "-".into(),
        };
        println!(
            "{round:<6} {:>14} {:>26} {:>16}",
            show(crig),
            show(ctr),
            ratio
        );
    }
    println!("target: criguard < 1000 ms (containerd refreshes its cache every 10 s)");
}

/// A container that writes `FILES` small files into its layer, then sleeps.
fn filler(name: &str) -> ContainerSpec {
    let script = format!(
        "mkdir /d && i=0; while [ $i -lt {FILES} ]; do echo $i > /d/f$i; i=$((i+1)); done; \
         touch /ready; exec sleep 3600"
    );
    ContainerSpec {
        name: name.into(),
        image: BUSYBOX.into(),
        command: vec!["sh".into(), "-c".into(), script],
        ..Default::default()
    }
}

async fn cost(ctrd: &PrivateContainerd, pods: Vec<Pod>, sources: UsageSources, rounds: usize) {
    let upstream = Upstream::new(RuntimeEndpoint::parse(ctrd.socket.to_str().unwrap()).unwrap());
    let reader = UsageReader::new(upstream.snapshots("overlayfs"), sources.clone());
    let snapshots: Snapshots = upstream.snapshots("overlayfs");
    let ids: Vec<String> = pods
        .iter()
        .flat_map(|p| p.containers.keys().cloned())
        .collect();
    let mut uppers: Vec<PathBuf> = Vec::new();
    for id in &ids {
        uppers.push(snapshots.upperdir(id).await.unwrap());
    }
    let ctrd_pid: u32 = std::fs::read_to_string(ctrd.dir.join("containerd.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let (me, children) = (UsageWho::RUSAGE_SELF, UsageWho::RUSAGE_CHILDREN);
    // walks, warm read, cold read, containerd Usage, du.
    let mut s: [Samples; 5] = Default::default();
    // Round 0 is not kept: it warms the page cache and connections for all.
    for round in 0..=rounds {
        let mut r = [(Duration::ZERO, Duration::ZERO); 5];

        let (t, c) = (Instant::now(), rusage(me));
        let dirs = uppers.clone();
        let bytes: u64 = tokio::task::spawn_blocking(move || {
            dirs.iter()
                .map(|u| disk::walk(u).unwrap().usage.bytes)
                .sum()
        })
        .await
        .unwrap();
        r[0] = (t.elapsed(), rusage(me) - c);
        assert!(bytes > 0);

        let (t, c) = (Instant::now(), rusage(me));
        let u = reader.read(usage_pods(&pods)).await;
        r[1] = (t.elapsed(), rusage(me) - c);
        let full = |p: &criguard::signals::usage::PodUsage| {
            p.errors.is_empty() && p.rootfs.inodes > (PER_POD * FILES) as u64
        };
        assert!(u.pods.iter().all(full), "{:?}", u.pods);

        let cold_reader = UsageReader::new(upstream.snapshots("overlayfs"), sources.clone());
        let (t, c) = (Instant::now(), rusage(me));
        cold_reader.read(usage_pods(&pods)).await;
        r[2] = (t.elapsed(), rusage(me) - c);

        let (t, c) = (Instant::now(), process_cpu(ctrd_pid));
        for id in &ids {
            let u = snapshots.usage(id).await.unwrap();
            assert!(u.inodes > FILES as i64);
        }
        r[3] = (t.elapsed(), process_cpu(ctrd_pid).saturating_sub(c));

        let (t, c) = (Instant::now(), rusage(children));
        let out = Command::new("du")
            .arg("-s")
            .arg("-B1")
            .args(&uppers)
            .output()
            .unwrap();
        r[4] = (t.elapsed(), rusage(children) - c);
        assert!(out.status.success());

        if round > 0 {
            for (samples, (wall, cpu)) in s.iter_mut().zip(r) {
                samples.push(wall, cpu);
            }
        }
    }
    let [walks, warm, cold, usage, du] = s;
    let (uw, uc) = usage.medians();
    println!(
        "\n2. cost: {LAYERS} writable layers × {FILES} files, page cache warm, median of {rounds} rounds"
    );
    println!(
        "{:<52} {:>9} {:>9} {:>12} {:>12}",
        "reader", "wall ms", "CPU ms", "wall ÷ ctrd", "CPU ÷ ctrd"
    );
    let row = |name: &str, s: &Samples| {
        let (w, c) = s.medians();
        println!(
            "{name:<52} {:>9.1} {:>9.1} {:>12.2} {:>12.2}",
            ms(w),
            ms(c),
            w.as_secs_f64() / uw.as_secs_f64(),
            c.as_secs_f64() / uc.as_secs_f64()
        );
    };
    row("criguard: walk the 50 layers", &walks);
    row(
        "criguard: whole read of the 5 pods (upperdirs cached)",
        &warm,
    );
    row("criguard: whole read, cold (+50 snapshots Mounts)", &cold);
    row("containerd: snapshots Usage × 50 (containerd CPU)", &usage);
    row("du -s -B1 over the 50 upperdirs (one process)", &du);
    println!("target: criguard's cost ≤ containerd's own walk (ratios ≤ 1)");
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` probes bench binaries this way.
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("bench disk: needs root (it starts a private containerd); skipped");
        return;
    }
    let mib = env_u64("CRIGUARD_BENCH_MIB", 32);
    let rounds = env_u64("CRIGUARD_BENCH_ROUNDS", 10) as usize;
    let started = Instant::now();
    let ctrd = PrivateContainerd::start();
    let root = format!("/{}", unique("criguard-bench-disk"));
    let kubelet_root = ctrd.dir.join("kubelet");
    let log_root = kubelet_root.join("logs");
    let args = [
        "--kubepods-cgroup".to_owned(),
        format!("{root}/kubepods"),
        "--nodefs".to_owned(),
        kubelet_root.display().to_string(),
        "--imagefs".to_owned(),
        ctrd.root().display().to_string(),
        "--eviction-hard=memory.available<1Mi".to_owned(),
        "--dynamic-oom-score-adj=false".to_owned(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let guard = CriguardProcess::start(&ctrd.dir.join("criguard.sock"), &ctrd.socket, &args).await;
    let place = |mut pod: PodSpec| {
        pod.cgroup_root = format!("{root}/kubepods");
        pod.log_root = log_root.display().to_string();
        pod
    };
    let mut rt = ctrd.direct().rt;

    let fresh = place(PodSpec::new("fresh", &unique("fresh")).container(sleeper("app")));
    let (_, fresh_ids) = run_pod(&mut rt, &fresh, None).await;
    let t = Instant::now();
    freshness(&ctrd, &guard, &fresh_ids[0], mib).await;
    eprintln!("freshness rounds in {:.1} s", t.elapsed().as_secs_f64());

    let t = Instant::now();
    let mut uids = Vec::new();
    for p in 0..LAYERS / PER_POD {
        let uid = unique(&format!("cost{p}"));
        let mut pod = place(PodSpec::new(&format!("cost-{p}"), &uid));
        for c in 0..PER_POD {
            pod = pod.container(filler(&format!("c{c}")));
        }
        run_pod(&mut rt, &pod, None).await;
        uids.push(uid);
    }
    let upstream = Upstream::new(RuntimeEndpoint::parse(ctrd.socket.to_str().unwrap()).unwrap());
    let model = criguard::runtime::sync::rebuild(&upstream, mem_total())
        .await
        .unwrap();
    let pods: Vec<Pod> = model
        .pods()
        .into_iter()
        .filter(|p| uids.contains(&p.uid))
        .collect();
    let snapshots = upstream.snapshots("overlayfs");
    let ready = |dir: &Path| dir.join("ready").exists();
    for p in &pods {
        for id in p.containers.keys() {
            let dir = snapshots.upperdir(id).await.unwrap();
            common::poll_until(Duration::from_secs(120), "the layers filled", || async {
                ready(&dir).then_some(())
            })
            .await;
        }
    }
    eprintln!(
        "{LAYERS} layers of {FILES} files ready in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let sources = UsageSources {
        nodefs: kubelet_root.clone(),
        imagefs: ctrd.root(),
        cgroups: CgroupFs::detect(Path::new("/sys/fs/cgroup")),
    };
    let t = Instant::now();
    cost(&ctrd, pods, sources, rounds).await;
    eprintln!("cost rounds in {:.1} s", t.elapsed().as_secs_f64());
    let t = Instant::now();

    let sandboxes = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .items;
    remove_pods(&mut rt, sandboxes.into_iter().map(|s| s.id)).await;
    eprintln!("pods removed in {:.1} s", t.elapsed().as_secs_f64());
    drop(guard);
    drop(ctrd);
    remove_cgroup_tree(&root);
    eprintln!(
        "bench disk: {:.0} s in all",
        started.elapsed().as_secs_f64()
    );
}
