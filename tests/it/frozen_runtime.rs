//! A hung or dead runtime under real memory pressure (cgroup v1 host,
//! private containerd).
//!
//! - **frozen** (containerd SIGSTOPped for 20 s): the hog crosses the
//!   threshold while containerd is frozen; criguard kills it through its
//!   cgroup, and the eviction is in `criguard evictions` and
//!   `criguard_evictions_total` *before* containerd is thawed; `criguard
//!   pods` answers (from the model); a CRI call through criguard times out
//!   exactly as it does straight to containerd; after SIGCONT the
//!   StopPodSandbox criguard could not complete is retried and the sandbox
//!   is NotReady in containerd.
//! - **killed** (containerd SIGKILLed, started again 10 s later): the same,
//!   with calls failing at once instead of timing out.
//! - **killed across a criguard restart**: as killed, and criguard itself is
//!   SIGKILLed and started again while containerd is down, so the stop it
//!   was retrying dies with it: the new process finds the evicted pod's
//!   sandbox once containerd is back and stops it.
//!
//! In each, containerd's own log shows the StopPodSandbox of the evicted
//! pod's sandbox after the runtime came back.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::containerd::PrivateContainerd;
use common::metrics::{free_port, scraped};
use common::poll_until;
use common::pressure::Pressure;
use k8s_cri::v1 as cri;

/// The pid of this instance's containerd daemon, checked against its command line.
fn containerd_pid(ctrd: &PrivateContainerd) -> i32 {
    let pid: i32 = std::fs::read_to_string(ctrd.dir.join("containerd.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    assert!(
        String::from_utf8_lossy(&cmdline).contains(ctrd.dir.join("config.toml").to_str().unwrap()),
        "pid {pid} is not this instance's containerd"
    );
    pid
}

/// Sends `sig` to containerd `pid` (checked to be ours by [`containerd_pid`]).
fn signal(pid: i32, sig: i32) {
    // SAFETY: plain kill(2) on our own containerd's pid.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

/// SIGCONT on drop, so a failing assertion never leaves containerd frozen.
struct Thaw(i32);

impl Drop for Thaw {
    fn drop(&mut self) {
        signal(self.0, libc::SIGCONT);
    }
}

/// True when no process is left in the pod's memory cgroup (cgroup v1) or
/// its cgroup (v2), the pod's directory included.
fn pod_cgroup_empty(cgroup_parent: &str) -> bool {
    let v1 = Path::new("/sys/fs/cgroup/memory").join(cgroup_parent.trim_start_matches('/'));
    let root = if v1.exists() {
        v1
    } else {
        Path::new("/sys/fs/cgroup").join(cgroup_parent.trim_start_matches('/'))
    };
    common::memcg::procs_below(&root) == 0
}

/// A ListPodSandbox with a client deadline of `d`: its gRPC code and how long it took.
async fn list_within(
    rt: &mut cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
    d: Duration,
) -> (tonic::Code, Duration) {
    let at = Instant::now();
    let mut req = tonic::Request::new(cri::ListPodSandboxRequest { filter: None });
    req.set_timeout(d);
    let code = match tokio::time::timeout(d * 3, rt.list_pod_sandbox(req)).await {
        Ok(Ok(_)) => tonic::Code::Ok,
        Ok(Err(s)) => s.code(),
        Err(_) => tonic::Code::Unknown,
    };
    (code, at.elapsed())
}

/// The sandbox's state straight from containerd.
async fn sandbox_state(ctrd: &PrivateContainerd, id: &str) -> Option<i32> {
    let req = cri::PodSandboxStatusRequest {
        pod_sandbox_id: id.to_owned(),
        verbose: false,
    };
    let mut rt = ctrd.direct().rt;
    let s = tokio::time::timeout(Duration::from_secs(2), rt.pod_sandbox_status(req))
        .await
        .ok()?
        .ok()?;
    s.into_inner().status.map(|s| s.state)
}

enum Fault {
    Frozen,
    Killed,
    KilledAcrossRestart,
}

async fn pressure_with_runtime_gone(fault: Fault) {
    let sc = Pressure::new(320);
    let state = tempfile::tempdir().unwrap();
    let port = free_port();
    let metrics = format!("--metrics-address=127.0.0.1:{port}");
    let args = [
        "--eviction-hard=allocatableMemory.available<64Mi",
        "--eviction-pressure-transition-period=3s",
        metrics.as_str(),
    ];
    let mut guard = sc.criguard(state.path(), &args).await;
    let hog = sc.hog("hog", 60, 200);
    let (sandbox, container) = sc.run(&guard, &hog).await;
    let pid = containerd_pid(&sc.ctrd);
    // Told to grow, then the runtime goes: the hog crosses the threshold
    // with containerd frozen or dead (its shim keeps it running).
    sc.grow(&container).await;
    let fault_at = Instant::now();
    let _thaw = match fault {
        Fault::Frozen => {
            signal(pid, libc::SIGSTOP);
            Some(Thaw(pid))
        }
        Fault::Killed | Fault::KilledAcrossRestart => {
            sc.ctrd.kill_daemon();
            None
        }
    };

    // The eviction is published while the runtime is gone.
    let evictions = guard
        .first_evictions(Duration::from_secs(15), "the eviction, runtime gone")
        .await;
    let published = fault_at.elapsed();
    assert_eq!(evictions.len(), 1, "{evictions:#?}");
    assert_eq!(evictions[0].uid, hog.uid);
    let counted = scraped(
        port,
        "criguard_evictions_total",
        &[("signal", "allocatableMemory.available")],
    );
    assert_eq!(counted, Some(1.0), "counted before the runtime is back");
    let kill = scraped(port, "criguard_pressure_to_kill_seconds_sum", &[]);
    eprintln!("eviction published {published:?} after the fault; pressure->kill sum {kill:?} s");
    // Killed through its cgroup: nothing of the pod runs.
    let parent = hog.cgroup_parent();
    poll_until(
        Duration::from_secs(5),
        "the pod's processes killed",
        || async { pod_cgroup_empty(&parent).then_some(()) },
    )
    .await;

    // `criguard pods` answers from the model, the pod NotReady there.
    let at = Instant::now();
    let pods = tokio::time::timeout(Duration::from_secs(10), guard.pods())
        .await
        .expect("criguard pods answers while the runtime is gone");
    eprintln!("criguard pods answered in {:?}", at.elapsed());
    let pod = pods.iter().find(|p| p.sandbox_id == sandbox).unwrap();
    assert_eq!(pod.state, criguard::model::SandboxState::NotReady);
    if let Fault::KilledAcrossRestart = fault {
        // The stop being retried dies with this process.
        guard.signal_and_wait(libc::SIGKILL);
        guard = sc.criguard(state.path(), &args).await;
    }

    // A call through criguard ends as it does straight to containerd.
    let d = Duration::from_secs(2);
    let (via, via_t) = list_within(&mut guard.clients().rt, d).await;
    let (direct, direct_t) = list_within(&mut sc.ctrd.direct().rt, d).await;
    eprintln!(
        "ListPodSandbox, runtime gone: via criguard {via:?} in {via_t:?}, direct {direct:?} in {direct_t:?}"
    );
    assert_eq!(via, direct);
    assert_ne!(via, tonic::Code::Ok);

    // Back: the runtime is told, and the sandbox is stopped.
    let hold = match fault {
        Fault::Frozen => Duration::from_secs(20),
        Fault::Killed | Fault::KilledAcrossRestart => Duration::from_secs(10),
    };
    tokio::time::sleep(hold.saturating_sub(fault_at.elapsed())).await;
    let log = sc.ctrd.dir.join("containerd.log");
    let log_from = std::fs::metadata(&log).map_or(0, |m| m.len() as usize);
    let back = Instant::now();
    match fault {
        Fault::Frozen => drop(_thaw),
        Fault::Killed | Fault::KilledAcrossRestart => sc.ctrd.restart_daemon(),
    }
    let ready = cri::PodSandboxState::SandboxReady as i32;
    poll_until(
        Duration::from_secs(60),
        "StopPodSandbox completed after the runtime came back",
        || async {
            sandbox_state(&sc.ctrd, &sandbox)
                .await
                .filter(|s| *s != ready)
        },
    )
    .await;
    // containerd's own record of the stop, from after it came back.
    poll_until(
        Duration::from_secs(60),
        "containerd logs the evicted pod's StopPodSandbox",
        || async {
            let text = std::fs::read(&log).unwrap_or_default();
            String::from_utf8_lossy(text.get(log_from..).unwrap_or_default())
                .lines()
                .any(|l| l.contains("StopPodSandbox for") && l.contains(&sandbox))
                .then_some(())
        },
    )
    .await;
    eprintln!(
        "sandbox NotReady and stopped in containerd {:?} after it came back",
        back.elapsed()
    );
    assert_eq!(guard.evictions().await.len(), 1, "evicted once");
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_frozen_the_pod_is_killed_and_the_eviction_published_before_it_thaws() {
    pressure_with_runtime_gone(Fault::Frozen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_killed_the_pod_is_killed_and_stopped_once_it_is_back() {
    pressure_with_runtime_gone(Fault::Killed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_left_by_a_killed_criguard_is_taken_up_by_the_next_process() {
    pressure_with_runtime_gone(Fault::KilledAcrossRestart).await;
}
