//! Exit → model updated: containerd's task events against the 10 s sync,
//! side by side in one run on one private containerd.
//!
//! N containers (sleepers in pods of 10, made the kubelet's way) are
//! SIGKILLed from the host one at a time, evenly over W seconds, so that
//! their deaths fall at every phase of the sync period. Two node models
//! watch the same runtime:
//! - **events**: criguard's wiring, `runtime::track::TaskEvents` plus the
//!   periodic sync (every 10 s);
//! - **sync**: the periodic sync alone (criguard before containerd events).
//!
//! The exit time is the bench's own witness: a pidfd per container process,
//! polled by a thread, readable when the process is dead. A poller thread
//! reads both models every 200 µs and notes when each container first shows
//! Exited. The latency is the difference. Both models' loops run on one
//! current-thread runtime, as `criguard serve` runs its loops.
//!
//! Run as root: `cargo bench --bench task_events`. `CRIGUARD_BENCH_EXITS`
//! (default 60) and `CRIGUARD_BENCH_SPREAD_S` (default 30) size it.

use criguard_test_kit as common;

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::containerd::{PrivateContainerd, unique};
use common::pods::{CgroupRoot, init_pid, mem_total, remove_pods, run_pod, sleeper};
use criguard::model::{ContainerState, NodeModel};
use criguard::runtime::sync;
use criguard::runtime::track::TaskEventMetrics;
use criguard::runtime::track::TaskEvents;
use criguard::runtime::{RuntimeEndpoint, Upstream};
use criguard_test_kit::kubelet::PodSpec;

const SYNC_EVERY: Duration = Duration::from_secs(10);
const PER_POD: usize = 10;

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A pidfd on `pid`: a thread notes when the process is dead.
fn death_witness(pid: i64) -> JoinHandle<Option<Instant>> {
    // SAFETY: pidfd_open(2) takes a pid and flags; the fd is owned at once.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    assert!(
        fd >= 0,
        "pidfd_open {pid}: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a fresh fd from pidfd_open, owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    std::thread::spawn(move || {
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd that outlives the call.
        let n = unsafe { libc::poll(&mut p, 1, 300_000) };
        (n == 1).then(Instant::now)
    })
}

/// The `q` quantile of `v` (sorted in place), nearest rank.
fn quantile(v: &mut [Duration], q: f64) -> Duration {
    v.sort();
    let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

fn show(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

/// Both models' loops on one current-thread runtime in a thread of their
/// own, as `criguard serve` runs them; stopped by `stop`.
fn spawn_loops(
    events_model: Arc<RwLock<NodeModel>>,
    sync_model: Arc<RwLock<NodeModel>>,
    upstream_socket: std::path::PathBuf,
    metrics: TaskEventMetrics,
    stop: tokio::sync::watch::Receiver<bool>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let up =
                Upstream::new(RuntimeEndpoint::parse(upstream_socket.to_str().unwrap()).unwrap());
            let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
                let _ = rx.wait_for(|s| *s).await;
            };
            let periodic = |model: Arc<RwLock<NodeModel>>, rx| {
                let up = up.clone();
                async move {
                    let stop = stopped(rx);
                    tokio::pin!(stop);
                    let mut tick = tokio::time::interval(SYNC_EVERY);
                    loop {
                        tokio::select! {
                            _ = tick.tick() => { let _ = sync::sync(&model, &up).await; }
                            () = &mut stop => return,
                        }
                    }
                }
            };
            let events = TaskEvents::new(events_model.clone(), up.clone()).with_metrics(metrics);
            tokio::join!(
                events.run(stopped(stop.clone())),
                periodic(events_model, stop.clone()),
                periodic(sync_model, stop),
            );
        });
    })
}

fn main() {
    let n: usize = env_or("CRIGUARD_BENCH_EXITS", 60);
    let spread = Duration::from_secs(env_or("CRIGUARD_BENCH_SPREAD_S", 30));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let root = format!("/{}", unique("criguard-bench-exit"));
    let _cg = CgroupRoot(root.clone());
    let ctrd = PrivateContainerd::start();
    rt.block_on(async {
        let mut direct = ctrd.direct();
        let up = Upstream::new(RuntimeEndpoint::parse(ctrd.socket.to_str().unwrap()).unwrap());
        let mut sandboxes = Vec::new();
        let mut containers = Vec::new();
        let started = Instant::now();
        for p in 0..n.div_ceil(PER_POD) {
            let mut pod = PodSpec::new(&format!("exits-{p}"), &unique("exits"));
            pod.cgroup_root = format!("{root}/kubepods");
            pod.log_root = ctrd.dir.join("pods").to_str().unwrap().into();
            pod.node_memory = mem_total();
            let k = PER_POD.min(n - p * PER_POD);
            pod.containers = (0..k).map(|i| sleeper(&format!("c{i}"))).collect();
            let (sb, ids) = run_pod(&mut direct.rt, &pod, None).await;
            sandboxes.push(sb);
            containers.extend(ids);
        }
        eprintln!(
            "{n} containers in {} pods running after {:.1} s",
            sandboxes.len(),
            started.elapsed().as_secs_f64()
        );
        let mut pids = Vec::new();
        for c in &containers {
            pids.push(init_pid(&mut direct, Some(c), None).await);
        }

        let capacity = mem_total();
        let events_model = Arc::new(RwLock::new(sync::rebuild(&up, capacity).await.unwrap()));
        let sync_model = Arc::new(RwLock::new(sync::rebuild(&up, capacity).await.unwrap()));
        let metrics = TaskEventMetrics::default();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let loops = spawn_loops(
            events_model.clone(),
            sync_model.clone(),
            ctrd.socket.clone(),
            metrics.clone(),
            stop_rx,
        );
        common::poll_until(Duration::from_secs(10), "the events subscription", || async {
            (metrics.catch_ups.get() >= 1).then_some(())
        })
        .await;

        // The poller: when each container first shows Exited in each model.
        let done = Arc::new(AtomicBool::new(false));
        let poller = {
            let (em, sm, done) = (events_model.clone(), sync_model.clone(), done.clone());
            let ids = containers.clone();
            std::thread::spawn(move || {
                let mut seen: [HashMap<String, Instant>; 2] = Default::default();
                while !done.load(Ordering::Relaxed) {
                    for (i, m) in [&em, &sm].into_iter().enumerate() {
                        let m = m.read().unwrap();
                        for id in &ids {
                            if !seen[i].contains_key(id)
                                && m.container_state(id) == Some(ContainerState::Exited)
                            {
                                seen[i].insert(id.clone(), Instant::now());
                            }
                        }
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
                seen
            })
        };

        // The kills, evenly over the spread; each death witnessed by a pidfd.
        let step = spread / n as u32;
        let t0 = tokio::time::Instant::now();
        let mut deaths = Vec::new();
        for (i, pid) in pids.iter().enumerate() {
            tokio::time::sleep_until(t0 + step * i as u32).await;
            deaths.push(death_witness(*pid));
            // SAFETY: plain kill(2) of this bench's own container process.
            assert_eq!(unsafe { libc::kill(*pid as i32, libc::SIGKILL) }, 0);
        }
        let deaths: Vec<Instant> = deaths
            .into_iter()
            .map(|d| d.join().unwrap().expect("a container process never died"))
            .collect();
        // Every exit in both models (the sync one within a period).
        common::poll_until(SYNC_EVERY * 3, "both models to see every exit", || async {
            let all = |m: &RwLock<NodeModel>| {
                let m = m.read().unwrap();
                containers
                    .iter()
                    .all(|c| m.container_state(c) == Some(ContainerState::Exited))
            };
            (all(&events_model) && all(&sync_model)).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        done.store(true, Ordering::Relaxed);
        let seen = poller.join().unwrap();
        let _ = stop_tx.send(true);
        loops.join().unwrap();

        let mut rows = Vec::new();
        for (name, seen) in ["events (+ sync 10 s)", "sync every 10 s"].iter().zip(&seen) {
            let mut lat: Vec<Duration> = containers
                .iter()
                .zip(&deaths)
                .map(|(c, died)| seen[c].saturating_duration_since(*died))
                .collect();
            let p50 = quantile(&mut lat, 0.50);
            let p99 = quantile(&mut lat, 0.99);
            let max = *lat.last().unwrap();
            rows.push((name, p50, p99, max));
        }
        println!(
            "\nexit -> model updated: {n} containers SIGKILLed over {} s, death seen by pidfd, models polled every 200 us",
            spread.as_secs()
        );
        println!("{:<22} {:>10} {:>10} {:>10}", "", "p50", "p99", "max");
        for (name, p50, p99, max) in &rows {
            println!("{name:<22} {:>10} {:>10} {:>10}", show(*p50), show(*p99), show(*max));
        }
        println!(
            "sync / events: p50 {:.0}x, p99 {:.0}x",
            rows[1].1.as_secs_f64() / rows[0].1.as_secs_f64(),
            rows[1].2.as_secs_f64() / rows[0].2.as_secs_f64()
        );
        println!(
            "events received: {} exits over {} subscription(s)",
            metrics
                .events
                .get_or_create(&criguard::runtime::track::TopicLabels {
                    topic: criguard::runtime::events::TOPIC_EXIT
                })
                .get(),
            metrics.subscriptions.get()
        );
        remove_pods(&mut direct.rt, sandboxes).await;
    });
}
