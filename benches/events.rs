//! Memory event latency, measured against witnesses of the bench's own (it
//! never takes criguard's word for when things happened):
//!
//! 1. Crossing → criguard's observation, in process: a shell in a test
//!    memcg grows past a threshold armed by criguard's `MemoryEvents`; the
//!    crossing is when the bench's own eventfd on the same line wakes a
//!    thread blocked in poll(2); criguard's side is when its event arrives on
//!    a current-thread runtime (as `criguard serve` runs) and when the
//!    observation that follows is stamped and done.
//! 2. Pressure → the evicted pod dead, end to end: a private containerd, a
//!    `criguard serve` process, a pod created the kubelet's way whose shell
//!    grows past `allocatableMemory.available<48Mi`. The crossing is again
//!    the bench's eventfd; the actions are the deaths of the container's
//!    process and of the sandbox's pause process, seen through pidfds
//!    (criguard's grace-0 kill through the pod's cgroup ends both; without
//!    it, StopContainer and StopPodSandbox did). Events on and tick only run
//!    in the same bench, with the same housekeeping interval.
//!
//! Run as root: `cargo bench --bench events`. `CRIGUARD_BENCH_TRIALS`
//! (default 20) and `CRIGUARD_BENCH_HOUSEKEEPING` (default 1s) size it.

use criguard_test_kit as common;

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::containerd::{CriguardProcess, PrivateContainerd, unique};
use common::memcg::{Filler, MEMORY, TestCgroup};
use common::pods::{CgroupRoot, hog, init_pid, mem_total, remove_pods, run_pod, sleeper};
use criguard::cgroup::fs::{CgroupFs, stat_value};
use criguard::config::{Amount, EvictionConfig, Threshold};
use criguard::signals::node::NodeSources;
use criguard::signals::notify::{MemoryEvents, Watch};
use criguard::signals::table::Signal;
use criguard_test_kit::kubelet::{ContainerSpec, PodSpec};
use k8s_cri::v1 as cri;

const MI: u64 = 1 << 20;

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Waits up to `limit` for `fd` to poll readable; when it did.
fn readable_at(fd: OwnedFd, limit: Duration) -> Option<Instant> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    let timeout = PollTimeout::try_from(limit).unwrap_or(PollTimeout::MAX);
    (poll(&mut fds, timeout) == Ok(1)).then(Instant::now)
}

/// The bench's own memcg threshold at `bytes` on `dir`, written by hand: a
/// thread notes when the kernel signals it.
fn threshold_witness(dir: &Path, bytes: u64) -> JoinHandle<Option<Instant>> {
    let efd = nix::sys::eventfd::EventFd::from_flags(nix::sys::eventfd::EfdFlags::EFD_CLOEXEC)
        .map(OwnedFd::from)
        .expect("eventfd");
    let usage = File::open(dir.join("memory.usage_in_bytes")).unwrap();
    let line = format!("{} {} {bytes}", efd.as_raw_fd(), usage.as_raw_fd());
    std::fs::write(dir.join("cgroup.event_control"), line).unwrap();
    std::thread::spawn(move || readable_at(efd, Duration::from_secs(60)))
}

/// A pidfd on `pid`: a thread notes when the process exits.
fn death_witness(pid: i64) -> JoinHandle<Option<Instant>> {
    // SAFETY: pidfd_open(2) (no wrapper in nix) takes a pid and flags, no
    // pointers; a non-negative result is a new fd, owned at once below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    assert!(
        fd >= 0,
        "pidfd_open {pid}: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: `fd` is the fresh descriptor pidfd_open returned; nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    std::thread::spawn(move || readable_at(fd, Duration::from_secs(60)))
}

/// `b − a` in milliseconds, negative when `b` came first.
fn ms(a: Instant, b: Instant) -> f64 {
    match b.checked_duration_since(a) {
        Some(d) => d.as_secs_f64() * 1e3,
        None => -(a - b).as_secs_f64() * 1e3,
    }
}

/// p50 and p99 (nearest rank; of 20 samples, p99 is the slowest).
fn p50_p99(xs: &[f64]) -> (f64, f64) {
    let mut s = xs.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = |p: f64| s[((p * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1];
    (rank(0.50), rank(0.99))
}

fn allocatable_below(bytes: u64) -> EvictionConfig {
    EvictionConfig {
        hard: vec![Threshold {
            signal: Signal::AllocatableMemoryAvailable,
            amount: Amount::Quantity(bytes),
            grace_period: None,
            min_reclaim: None,
        }],
        soft: vec![],
        max_pod_grace_period: None,
        pressure_transition_period: Duration::from_secs(1),
        housekeeping_interval: Duration::from_secs(10),
    }
}

/// Part 1: per trial, (event seen, observation stamped, observation done),
/// ms after the crossing.
fn crossing_to_observation(trials: usize) -> Vec<[f64; 3]> {
    let limit = 256 * MI;
    let cg = TestCgroup::create(MEMORY, "criguard-bench-ev");
    cg.write("memory.limit_in_bytes", &limit.to_string());
    let src = NodeSources {
        cgroups: CgroupFs::detect(Path::new("/sys/fs/cgroup")),
        proc_root: "/proc".into(),
        memory_capacity: mem_total() as u64,
        pods_cgroup: cg.name(),
        nodefs: "/".into(),
        imagefs: "/".into(),
    };
    // One thread, as `criguard serve` runs.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _in_rt = rt.enter();
    let mut out = Vec::new();
    for _ in 0..trials {
        let mut filler = Filler::start(&[&cg]);
        let amount = limit - cg.read_u64("memory.usage_in_bytes") - 8 * MI;
        let mut events =
            MemoryEvents::new(src.clone(), &allocatable_below(amount), Default::default());
        events.rearm(&src.observe());
        let [Watch::Usage { bytes: line, .. }] = events.armed()[..] else {
            panic!("one usage threshold expected: {:?}", events.armed());
        };
        let witness = threshold_witness(&cg.dir, line);
        let grower = std::thread::spawn(move || {
            filler.grow_to(16);
            filler
        });
        let (ev, obs, done) = rt.block_on(async {
            let ev = tokio::time::timeout(Duration::from_secs(30), events.next())
                .await
                .expect("criguard's event within 30 s");
            let obs = src.observe();
            (ev, obs, Instant::now())
        });
        let crossed = witness.join().unwrap().expect("the witness fired");
        drop(grower.join().unwrap());
        out.push([ms(crossed, ev.at), ms(crossed, obs.at), ms(crossed, done)]);
    }
    out
}

/// Part 2: per trial, (container process killed, pause process killed), ms
/// after the crossing, with criguard's memory events on or off.
async fn pressure_to_stop(
    ctrd: &PrivateContainerd,
    events_on: bool,
    trials: usize,
    housekeeping: &str,
) -> Vec<[f64; 2]> {
    let (limit, amount) = (96 * MI, 48 * MI);
    let root = format!("/{}", unique("criguard-bench"));
    let _cg = CgroupRoot(root.clone());
    let kubepods = format!("{root}/kubepods");
    let memcg = Path::new(MEMORY).join(kubepods.trim_start_matches('/'));
    std::fs::create_dir_all(&memcg).unwrap();
    std::fs::write(memcg.join("memory.limit_in_bytes"), limit.to_string()).unwrap();
    let dir = ctrd.dir.to_str().unwrap().to_owned();
    let mode = if events_on { "events" } else { "tick" };
    let guard = CriguardProcess::start(
        &ctrd.dir.join(format!("criguard-{mode}.sock")),
        &ctrd.socket,
        &[
            "--kubepods-cgroup",
            &kubepods,
            "--nodefs",
            &dir,
            "--imagefs",
            &dir,
            &format!("--housekeeping-interval={housekeeping}"),
            "--eviction-hard=allocatableMemory.available<48Mi",
            "--eviction-pressure-transition-period=1s",
            "--dynamic-oom-score-adj=false",
            &format!("--memory-events={events_on}"),
        ],
    )
    .await;
    let mut rt = guard.clients().rt;
    let mut direct = ctrd.direct();
    let read = |name: &str| std::fs::read_to_string(memcg.join(name)).unwrap();
    let period = criguard::quantity::parse_duration(housekeeping).unwrap();
    let mut out = Vec::new();
    // Trial 0 warms containerd and criguard up and is not counted.
    for i in 0..=trials {
        // Burstable (admitted under MemoryPressure); grows 60 MiB on /tmp/go,
        // past the line (48 MiB used) and short of the limit.
        let mut pod = PodSpec::new(&format!("hog-{i}"), &unique("hog")).container(ContainerSpec {
            command: hog(0, 60),
            memory_request: MI as i64,
            ..sleeper("app")
        });
        pod.cgroup_root = kubepods.clone();
        pod.log_root = ctrd.dir.join("pods").to_str().unwrap().into();
        pod.node_memory = mem_total();
        let (sandbox, containers) = run_pod(&mut rt, &pod, None).await;
        let exec = |cmd: &[&str]| cri::ExecSyncRequest {
            container_id: containers[0].clone(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout: 5,
        };
        common::poll_until(Duration::from_secs(30), "the hog to start", || {
            let mut d = direct.rt.clone();
            let req = exec(&["test", "-e", "/tmp/ready"]);
            async move { (d.exec_sync(req).await.ok()?.into_inner().exit_code == 0).then_some(()) }
        })
        .await;
        let pause = init_pid(&mut direct, None, Some(&sandbox)).await;
        let app = init_pid(&mut direct, Some(&containers[0]), None).await;
        let usage: u64 = read("memory.usage_in_bytes").trim().parse().unwrap();
        let inactive = stat_value(&read("memory.stat"), "total_inactive_file").unwrap();
        // available = limit − (usage − inactive) falls below `amount` past this usage.
        let line = limit - amount + inactive;
        assert!(usage < line, "already past the line before the trial");
        let crossing = threshold_witness(&memcg, line);
        let (app_dead, pause_dead) = (death_witness(app), death_witness(pause));
        // Trials run back to back, so without this each crossing would fall
        // at the same phase of the housekeeping tick: sweep the phase evenly.
        tokio::time::sleep(period.mul_f64(i as f64 / (trials + 1) as f64)).await;
        direct
            .rt
            .exec_sync(exec(&["touch", "/tmp/go"]))
            .await
            .unwrap();
        let crossed = crossing.join().unwrap().expect("usage crossed the line");
        let app_dead = app_dead
            .join()
            .unwrap()
            .expect("criguard stopped the container");
        let pause_dead = pause_dead
            .join()
            .unwrap()
            .expect("criguard stopped the sandbox");
        let row = [ms(crossed, app_dead), ms(crossed, pause_dead)];
        eprintln!(
            "{mode} trial {i}: StopContainer {:.1} ms, StopPodSandbox {:.1} ms",
            row[0], row[1]
        );
        if i > 0 {
            out.push(row);
        }
        // criguard records the eviction once its StopPodSandbox has returned.
        common::poll_until(
            Duration::from_secs(30),
            "criguard's eviction record",
            || async { (guard.evictions().await.len() > i).then_some(()) },
        )
        .await;
        remove_pods(&mut rt, [sandbox]).await;
    }
    let evicted = guard.evictions().await.len();
    assert_eq!(evicted, trials + 1, "one eviction per trial");
    out
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` probes bench binaries this way.
    }
    if std::env::var_os("CRIGUARD_LOG").is_none() {
        // SAFETY: no other thread exists yet.
        unsafe { std::env::set_var("CRIGUARD_LOG", "error") };
    }
    let trials: usize = env_or("CRIGUARD_BENCH_TRIALS", 20);
    let housekeeping: String = env_or("CRIGUARD_BENCH_HOUSEKEEPING", "1s".to_owned());
    let started = Instant::now();

    let part1 = crossing_to_observation(trials);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (on, off) = rt.block_on(async {
        let ctrd = PrivateContainerd::start();
        let on = pressure_to_stop(&ctrd, true, trials, &housekeeping).await;
        let off = pressure_to_stop(&ctrd, false, trials, &housekeeping).await;
        (on, off)
    });

    let col = |rows: &[[f64; 3]], i: usize| rows.iter().map(|r| r[i]).collect::<Vec<_>>();
    println!(
        "\ncriguard memory events: {trials} trials each, ms after the crossing (bench's own eventfd)"
    );
    println!("p99 is the nearest rank: of 20 samples, the slowest\n");
    println!(
        "1. crossing -> criguard observes (in process, memcg usage threshold, one-thread runtime)"
    );
    println!("{:<40} {:>9} {:>9}", "step", "p50", "p99");
    for (i, name) in [
        "event received",
        "observation stamped (Observations.at)",
        "observation read",
    ]
    .into_iter()
    .enumerate()
    {
        let (p50, p99) = p50_p99(&col(&part1, i));
        println!("{name:<40} {p50:>9.3} {p99:>9.3}");
    }

    let col2 = |rows: &[[f64; 2]], i: usize| rows.iter().map(|r| r[i]).collect::<Vec<_>>();
    println!(
        "\n2. pressure -> action (private containerd, criguard process, housekeeping {housekeeping}; pidfd witnesses)"
    );
    println!(
        "{:<12} {:>18} {:>18} {:>18} {:>18}",
        "mode", "container dead p50", "container dead p99", "pause dead p50", "pause dead p99"
    );
    let mut figures = Vec::new();
    for (mode, rows) in [("events on", &on), ("tick only", &off)] {
        let (k50, k99) = p50_p99(&col2(rows, 0));
        let (s50, s99) = p50_p99(&col2(rows, 1));
        println!("{mode:<12} {k50:>18.1} {k99:>18.1} {s50:>18.1} {s99:>18.1}");
        figures.push([k50, k99, s50, s99]);
    }
    let gap: Vec<f64> = on.iter().map(|r| r[1] - r[0]).collect();
    let (g50, g99) = p50_p99(&gap);
    let ratio = |i: usize| figures[1][i] / figures[0][i];
    println!(
        "tick only / events on: container dead p50 x{:.1}, p99 x{:.1}; pause dead p50 x{:.1}, p99 x{:.1}",
        ratio(0),
        ratio(1),
        ratio(2),
        ratio(3)
    );
    println!(
        "container dead -> pause dead (one cgroup kill: both at once; by the runtime: StopContainer, then StopPodSandbox): p50 {g50:.1}, p99 {g99:.1}"
    );
    println!(
        "target: pause dead p99 <= 100 ms with events on (one warm-up trial per mode not counted)"
    );
    println!("bench took {:.0} s", started.elapsed().as_secs_f64());
}
