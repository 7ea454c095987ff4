//! Scenario: a hung runtime under cgroup v2 memory pressure (the v2 half of
//! `tests/it/frozen_runtime.rs`). The setup is the pressure scenario's
//! (`kubepods.slice` limited to 256 MiB, a pod holding 100 MiB of page
//! cache, a BestEffort grower), but the machine's containerd is stopped
//! (SIGSTOP) for 20 s as soon as the grower is told to grow. While it is
//! frozen, criguard kills the grower through its slice's `cgroup.kill`
//! (its processes die, its cgroup is empty), and the eviction is in its
//! admin socket (`criguard evictions`) and in `criguard_evictions_total`;
//! after SIGCONT the StopPodSandbox it could not complete goes through and
//! containerd has the sandbox NotReady.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::containerd::CriguardProcess;
use crate::common::metrics::{free_port, parse, scrape, value};
use crate::common::pods::{grow, hog, init_pid, sleeper, wait_holding};
use crate::guest::{self, CONTAINERD, Slice, pod};
use criguard_test_kit::kubelet::ContainerSpec;
use k8s_cri::v1 as cri;

const MI: u64 = 1 << 20;
const LIMIT_MI: u64 = 256;
const THRESHOLD_MI: u64 = 96;
/// How long containerd stays stopped at least, from the grower's go (longer
/// if criguard has not acted by then: it is thawed only after the checks).
const FROZEN: Duration = Duration::from_secs(20);

/// SIGCONT on drop, so a failing assertion never leaves containerd stopped.
struct Thaw(i32);

impl Drop for Thaw {
    fn drop(&mut self) {
        // SAFETY: kill(2) on containerd.service's main pid.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// The state letter of process `pid` (`T`: stopped); `None` once it is gone.
fn proc_state(pid: i64) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ...": the state follows the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// A pidfd on `pid`, readable once the process has exited.
fn pidfd(pid: i64) -> OwnedFd {
    criguard::pidfd::open(pid as i32)
        .expect("pidfd_open")
        .expect("the process exists")
}

/// When the process behind `fd` exits (a thread polling it; `None` after 120 s).
fn exit_witness(fd: OwnedFd) -> std::thread::JoinHandle<Option<Instant>> {
    std::thread::spawn(move || {
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd that outlives the call.
        let n = unsafe { libc::poll(&mut p, 1, 120_000) };
        (n == 1).then(Instant::now)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "inside the VM only: hack/vm.sh test"]
async fn v2_containerd_frozen_the_grower_is_killed_and_the_eviction_published_before_it_thaws() {
    guest::require();
    let _t = guest::Timer::start("v2-frozen-runtime");
    let start = Instant::now();
    let _kubepods = Slice::create("kubepods.slice", &[&format!("MemoryMax={LIMIT_MI}M")]);
    let mut d = guest::node_containerd().await;
    let node = start.elapsed();
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let guard = CriguardProcess::start(
        &tmp.path().join("criguard.sock"),
        Path::new(CONTAINERD),
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
    // The pressure scenario's cache (see pressure.rs): 100 MiB of page cache.
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
    // The grower: the pressure scenario's too (10 MiB, then 230 MiB more).
    // It grows while containerd is stopped, the crossing some 150 MiB in
    // (several seconds under TCG, inside the freeze, which lasts until the
    // checks below are done however long criguard takes).
    let grower = pod(
        "grower",
        0,
        ContainerSpec {
            command: hog(10, 230),
            ..sleeper("hog")
        },
    );
    let ran = guest::run_pods(&rt, &[&cache, &grower]).await;
    let [(cache_sb, cache_c), (grower_sb, grower_c)] = <[_; 2]>::try_from(ran).unwrap();
    wait_holding(&d.rt, &cache_c[0], Duration::from_secs(120)).await;
    wait_holding(&d.rt, &grower_c[0], Duration::from_secs(120)).await;
    assert!(guard.evictions().await.is_empty());

    // Everything asked of containerd is asked before it stops.
    let pod_dir = Path::new("/sys/fs/cgroup")
        .join(criguard::cgroup::path::kubepods(&grower.cgroup_parent()).trim_start_matches('/'));
    assert!(
        crate::common::memcg::procs_below(&pod_dir) >= 2,
        "{} holds the pod",
        pod_dir.display()
    );
    let pause = init_pid(&mut d, None, Some(&grower_sb)).await;
    let awk = init_pid(&mut d, Some(&grower_c[0]), None).await;
    let (pause_exit, awk_exit) = (exit_witness(pidfd(pause)), exit_witness(pidfd(awk)));
    let ctrd = guest::main_pid("containerd.service") as i32;
    assert!(ctrd > 0);

    let setup = start.elapsed();
    grow(&d.rt, &grower_c[0]).await;
    // SAFETY: kill(2) on containerd.service's main pid.
    assert_eq!(unsafe { libc::kill(ctrd, libc::SIGSTOP) }, 0);
    let frozen_at = Instant::now();
    let thaw = Thaw(ctrd);
    guest::wait_for(Duration::from_secs(5), "containerd stopped", || {
        (proc_state(ctrd.into()) == Some('T')).then_some(())
    });

    // The eviction, published and counted with containerd still stopped.
    let evictions = guard
        .first_evictions(
            Duration::from_secs(60),
            "the eviction while containerd is stopped",
        )
        .await;
    let published = frozen_at.elapsed();
    assert_eq!(evictions.len(), 1, "{evictions:#?}");
    assert_eq!(evictions[0].sandbox_id, grower_sb, "{evictions:#?}");
    assert_eq!(evictions[0].signal, "allocatableMemory.available");
    let samples = parse(&scrape(port));
    assert_eq!(
        value(
            &samples,
            "criguard_evictions_total",
            &[("signal", "allocatableMemory.available")]
        ),
        Some(1.0),
        "counted before containerd is back: {samples:?}"
    );
    // A hard threshold: killed through the pod's cgroup.kill, not by the runtime.
    assert_eq!(
        value(&samples, "criguard_pressure_to_kill_seconds_count", &[]),
        Some(1.0),
        "{samples:?}"
    );
    let kill = value(&samples, "criguard_pressure_to_kill_seconds_sum", &[]);
    // The grower's processes are dead and its cgroup is empty.
    let died = [pause_exit, awk_exit].map(|w| {
        w.join()
            .unwrap()
            .expect("the grower's processes exit")
            .saturating_duration_since(frozen_at)
    });
    let died = died[0].max(died[1]);
    guest::wait_for(Duration::from_secs(5), "the pod's cgroup empty", || {
        (crate::common::memcg::procs_below(&pod_dir) == 0).then_some(())
    });
    let still = proc_state(ctrd.into());
    assert_eq!(still, Some('T'), "containerd still stopped after the kill");
    // criguard's model answers with the pod NotReady.
    let pods = tokio::time::timeout(Duration::from_secs(10), guard.pods())
        .await
        .expect("criguard pods answers while containerd is stopped");
    let p = pods.iter().find(|p| p.sandbox_id == grower_sb).unwrap();
    assert_eq!(p.state, criguard::model::SandboxState::NotReady);
    assert_eq!(
        proc_state(ctrd.into()),
        Some('T'),
        "all seen before the thaw"
    );

    // Thawed: the stop criguard could not complete goes through.
    tokio::time::sleep(FROZEN.saturating_sub(frozen_at.elapsed())).await;
    let thawed_at = Instant::now();
    drop(thaw);
    let ready = cri::PodSandboxState::SandboxReady as i32;
    let status = |id: String| {
        let mut rt = d.rt.clone();
        async move {
            let req = cri::PodSandboxStatusRequest {
                pod_sandbox_id: id,
                verbose: false,
            };
            let s = tokio::time::timeout(Duration::from_secs(5), rt.pod_sandbox_status(req))
                .await
                .ok()?
                .ok()?;
            s.into_inner().status.map(|s| s.state)
        }
    };
    crate::common::poll_until(
        Duration::from_secs(60),
        "StopPodSandbox completed after SIGCONT",
        || {
            let s = status(grower_sb.clone());
            async move { s.await.filter(|s| *s != ready) }
        },
    )
    .await;
    let not_ready = thawed_at.elapsed();
    assert_eq!(
        status(cache_sb.clone()).await,
        Some(ready),
        "the cache runs on"
    );
    assert_eq!(guard.evictions().await.len(), 1, "evicted once");
    let teardown = Instant::now();
    drop(guard);
    guest::remove_all(&d.rt, vec![cache_sb, grower_sb]).await;
    guest::report(&format!(
        "v2-frozen-runtime: setup {:.1} s (containerd and images {:.1} s); containerd stopped {:.1} s; after SIGSTOP: grower's processes \
         dead (cgroup.kill) {:.2} s, eviction listed and counted {:.2} s; criguard's pressure_to_kill {:.1} ms; \
         sandbox NotReady in containerd {:.2} s after SIGCONT; teardown {:.1} s",
        setup.as_secs_f64(),
        node.as_secs_f64(),
        (thawed_at - frozen_at).as_secs_f64(),
        died.as_secs_f64(),
        published.as_secs_f64(),
        kill.unwrap_or(f64::NAN) * 1e3,
        not_ready.as_secs_f64(),
        teardown.elapsed().as_secs_f64()
    ));
}
