//! Scenario 3: cgroup v2 memory pressure on a real v2 memory controller.
//! `kubepods.slice` has a 256 MiB limit, a pod holds 100 MiB of page cache
//! and a BestEffort pod grows; at the limit the kernel reclaims the cache
//! and reports it (`memory.events`, PSI), criguard's events wake it (its
//! PSI trigger on kubepods' `memory.pressure` has a 1 s window, which only
//! a root with CAP_SYS_RESOURCE may set), it observes
//! `allocatableMemory.available` under 96Mi and evicts the grower, long
//! before its 5-minute housekeeping tick and before the OOM killer.
//!
//! The latency is measured against witnesses of the test's own: the moment
//! kubepods' `memory.events` changes with less than 100Mi available (read
//! right then), and the death of the victim's pause process (a pidfd).

use std::fs::File;
use std::io::{Read, Seek};
use std::os::fd::AsRawFd;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::common::containerd::CriguardProcess;
use crate::common::metrics::{free_port, parse, scrape, value};
use crate::common::pods::{grow, hog, init_pid, sleeper, wait_holding};
use crate::guest::{self, CONTAINERD, Slice, pod};
use criguard::cgroup::fs::CgroupFs;
use criguard_test_kit::kubelet::ContainerSpec;
use k8s_cri::v1 as cri;

const MI: u64 = 1 << 20;
const LIMIT_MI: u64 = 256;
const THRESHOLD_MI: u64 = 96;

/// Waits up to `limit` for `fd` to poll with `events`; when it did.
fn polled_at(fd: i32, events: i16, limit: Duration) -> Option<Instant> {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd that outlives the call.
    let n = unsafe { libc::poll(&mut p, 1, limit.as_millis() as i32) };
    (n == 1).then(Instant::now)
}

/// The first change of kubepods' `memory.events` at which, read right
/// then, `allocatableMemory.available` is under the threshold.
fn crossing_witness(kubepods: String) -> JoinHandle<Option<Instant>> {
    std::thread::spawn(move || {
        let fs = CgroupFs::detect(std::path::Path::new("/sys/fs/cgroup"));
        let mut events = File::open(format!("/sys/fs/cgroup{kubepods}/memory.events")).unwrap();
        let end = Instant::now() + Duration::from_secs(600);
        while Instant::now() < end {
            // A kernfs file polls as changed until read through the same fd.
            let mut text = String::new();
            events
                .rewind()
                .and_then(|_| events.read_to_string(&mut text))
                .ok()?;
            let at = polled_at(events.as_raw_fd(), libc::POLLPRI, Duration::from_secs(600))?;
            let m = fs.memory(&kubepods).ok()?;
            let available = (LIMIT_MI * MI) as i64 - m.working_set as i64;
            if available < (THRESHOLD_MI * MI) as i64 {
                return Some(at);
            }
        }
        None
    })
}

/// Whether process `pid` has `path` open.
fn holds(pid: u32, path: &str) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.flatten()
                .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == path))
        })
        .unwrap_or(false)
}

/// A pidfd on `pid`: when the process exits.
fn death_witness(pid: i64) -> JoinHandle<Option<Instant>> {
    let fd = criguard::pidfd::open(pid as i32)
        .expect("pidfd_open")
        .expect("the process exists");
    std::thread::spawn(move || polled_at(fd.as_raw_fd(), libc::POLLIN, Duration::from_secs(600)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "inside the VM only: hack/vm.sh test"]
async fn v2_memory_pressure_evicts_through_memory_events() {
    guest::require();
    let _t = guest::Timer::start("v2-pressure");
    let kubepods = Slice::create("kubepods.slice", &[&format!("MemoryMax={LIMIT_MI}M")]);
    let mut d = guest::node_containerd().await;
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let guard = CriguardProcess::start(
        &tmp.path().join("criguard.sock"),
        std::path::Path::new(CONTAINERD),
        &[
            &format!("--eviction-hard=allocatableMemory.available<{THRESHOLD_MI}Mi"),
            "--housekeeping-interval=5m",
            "--memory-psi-window=1s",
            "--memory-psi-stall=100ms",
            &format!("--metrics-address=127.0.0.1:{port}"),
        ],
    )
    .await;
    let rt = guard.clients().rt;
    // cache: Burstable under its request, 100 MiB of page cache.
    let cache = pod(
        "cache",
        0,
        ContainerSpec {
            memory_request: 160 * MI as i64,
            command: vec![
                "sh".into(),
                "-c".into(),
                "dd if=/dev/zero of=/data bs=1M count=100 2>/dev/null && sync && \
                 touch /tmp/ready && sleep 3600"
                    .into(),
            ],
            ..sleeper("cache")
        },
    );
    let gu = pod(
        "gu",
        0,
        ContainerSpec {
            memory_limit: 32 * MI as i64,
            cpu_limit_milli: 100,
            ..sleeper("app")
        },
    );
    // grower: BestEffort, 10 MiB, then 230 MiB more in 10 MiB steps: it
    // fits with the others once the cache is gone, so only an eviction
    // (not the OOM killer) ends it. The threshold is crossed near 150 MiB,
    // leaving the emulated machine some 90 MiB of growth to act in.
    let grower = pod(
        "grower",
        0,
        ContainerSpec {
            command: hog(10, 230),
            ..sleeper("hog")
        },
    );
    let ran = guest::run_pods(&rt, &[&cache, &gu, &grower]).await;
    let [(cache_sb, cache_c), (gu_sb, _), (grower_sb, grower_c)] = <[_; 3]>::try_from(ran).unwrap();
    wait_holding(&d.rt, &cache_c[0], Duration::from_secs(120)).await;
    wait_holding(&d.rt, &grower_c[0], Duration::from_secs(120)).await;

    // criguard holds a PSI trigger with a 1 s window on kubepods (it closes
    // a file whose trigger the kernel refused) and watches its memory.events.
    let kp = kubepods.dir();
    for file in ["memory.pressure", "memory.events"] {
        let path = format!("{kp}/{file}");
        guest::wait_for(
            Duration::from_secs(30),
            &format!("criguard to watch {path}"),
            || holds(guard.pid(), &path).then_some(()),
        );
    }
    let samples = parse(&scrape(port));
    let ticks = value(
        &samples,
        "criguard_eviction_rounds_total",
        &[("trigger", "tick")],
    );
    assert!(guard.evictions().await.is_empty());

    let pause = init_pid(&mut d, None, Some(&grower_sb)).await;
    let crossing = crossing_witness("/kubepods.slice".into());
    let death = death_witness(pause);
    let t0 = Instant::now();
    grow(&d.rt, &grower_c[0]).await;

    let evictions = guard
        .first_evictions(
            Duration::from_secs(120),
            "an eviction under v2 memory pressure",
        )
        .await;
    let took = t0.elapsed();
    let e = &evictions[0];
    assert_eq!(e.sandbox_id, grower_sb, "{evictions:#?}");
    assert_eq!(e.signal, "allocatableMemory.available");
    assert!(took < Duration::from_secs(120), "{took:?}");
    let (crossed, died) = (
        crossing.join().unwrap().expect("no crossing seen"),
        death
            .join()
            .unwrap()
            .expect("the grower's sandbox did not stop"),
    );
    let latency = died.saturating_duration_since(crossed);

    // Woken by the kernel, not by the tick.
    let samples = parse(&scrape(port));
    let round = |t: &str| {
        value(
            &samples,
            "criguard_eviction_rounds_total",
            &[("trigger", t)],
        )
        .unwrap_or(0.0)
    };
    assert_eq!(
        value(
            &samples,
            "criguard_eviction_rounds_total",
            &[("trigger", "tick")]
        ),
        ticks,
        "no tick ran meanwhile"
    );
    let (psi, events) = (round("psi"), round("memory_events"));
    assert!(psi + events >= 1.0, "{samples:?}");
    let internal = value(&samples, "criguard_pressure_to_action_seconds_sum", &[]);
    // A hard threshold: the pod was killed through its slice's cgroup.kill
    // (the systemd driver's path, expanded) before the runtime stopped it.
    assert_eq!(
        value(&samples, "criguard_pressure_to_kill_seconds_count", &[]),
        Some(1.0),
        "{samples:?}"
    );
    let kill = value(&samples, "criguard_pressure_to_kill_seconds_sum", &[]);

    // The grower was stopped, not OOM-killed; the others run on.
    let status =
        d.rt.container_status(cri::ContainerStatusRequest {
            container_id: grower_c[0].clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    assert_ne!(status.reason, "OOMKilled", "{status:?}");
    let pods = guard.pods().await;
    for sb in [&cache_sb, &gu_sb] {
        let p = pods.iter().find(|p| &p.sandbox_id == sb).unwrap();
        assert_eq!(p.state, criguard::model::SandboxState::Ready, "{}", p.name);
    }
    let events_text = std::fs::read_to_string(format!("{kp}/memory.events")).unwrap();
    guest::report(&format!(
        "v2-pressure: crossing -> pause exit {:.1} ms; criguard's pressure_to_kill {:.1} ms, pressure_to_action {:.1} ms; \
         rounds woken by psi {psi}, memory.events {events}; eviction {:.1} s after growth began; \
         kubepods memory.events: {}",
        latency.as_secs_f64() * 1e3,
        kill.unwrap_or(f64::NAN) * 1e3,
        internal.unwrap_or(f64::NAN) * 1e3,
        took.as_secs_f64(),
        events_text.split_whitespace().collect::<Vec<_>>().join(" ")
    ));

    drop(guard);
    guest::remove_all(&d.rt, vec![cache_sb, gu_sb, grower_sb]).await;
}
