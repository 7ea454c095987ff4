//! A hung filesystem as nodefs and imagefs, for real.
//!
//! The issue asks for an NFS export mounted `hard`, its server then
//! frozen; this host's kernel has no nfsd (and no device-mapper), so the
//! nearest real hang is used: a FUSE filesystem (`bindfs`, installed by
//! hack/install-deps.sh) whose daemon is SIGSTOPped. Every `statvfs`, `stat`
//! and read on the mount then blocks in the kernel until the daemon is
//! continued, as on a `hard` NFS mount whose server stopped answering.
//!
//! With criguard's nodefs and imagefs on that mount and the daemon frozen:
//! - CRI calls through criguard keep their latency (p99 during vs before,
//!   printed; asserted loosely);
//! - the stuck observation is reported: `criguard_observation_stuck{path}` 1;
//! - the admin API answers (`criguard pods`);
//! - memory eviction still acts: a hog that grows is evicted;
//! - once the daemon continues, the gauge goes back to 0 and the disk
//!   signals are observed again.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::containerd::CriguardProcess;
use common::metrics::{free_port, scraped};
use common::poll_until;
use common::pressure::Pressure;
use k8s_cri::v1 as cri;

/// A bindfs mount of `src` on `mnt`, its daemon in the foreground as our child.
struct Fuse {
    mnt: PathBuf,
    child: Child,
    _dirs: tempfile::TempDir,
}

impl Fuse {
    fn mount() -> Self {
        let dirs = tempfile::tempdir().unwrap();
        let (src, mnt) = (dirs.path().join("src"), dirs.path().join("mnt"));
        std::fs::create_dir_all(&src).unwrap();
        std::fs::create_dir_all(&mnt).unwrap();
        let child = Command::new("bindfs")
            .args(["-f", "--no-allow-other"])
            .arg(&src)
            .arg(&mnt)
            .spawn()
            .expect("bindfs (hack/install-deps.sh installs it)");
        let me = Self {
            mnt,
            child,
            _dirs: dirs,
        };
        let end = Instant::now() + Duration::from_secs(10);
        while !is_fuse(&me.mnt) {
            assert!(Instant::now() < end, "bindfs did not mount");
            std::thread::sleep(Duration::from_millis(20));
        }
        me
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }
}

impl Drop for Fuse {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `p` is a FUSE mount now (from /proc/self/mountinfo: no syscall on the mount).
fn is_fuse(p: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let p = p.to_str().unwrap();
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(p) && l.contains(" - fuse"))
}

/// The p50 and p99 of `n` rounds of ListPodSandbox, ListContainers and
/// ContainerStatus through `guard`, in milliseconds.
async fn cri_latency(guard: &CriguardProcess, container: &str, n: usize) -> (f64, f64) {
    let mut rt = guard.clients().rt;
    let mut ms = Vec::with_capacity(3 * n);
    for _ in 0..n {
        let at = Instant::now();
        rt.list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
            .await
            .unwrap();
        ms.push(at.elapsed().as_secs_f64() * 1e3);
        let at = Instant::now();
        rt.list_containers(cri::ListContainersRequest { filter: None })
            .await
            .unwrap();
        ms.push(at.elapsed().as_secs_f64() * 1e3);
        let at = Instant::now();
        rt.container_status(cri::ContainerStatusRequest {
            container_id: container.to_owned(),
            verbose: false,
        })
        .await
        .unwrap();
        ms.push(at.elapsed().as_secs_f64() * 1e3);
        // Spread over the housekeeping rounds (1 s): ~3 s per measurement.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() as f64 * q) as usize).min(ms.len() - 1)];
    (at(0.50), at(0.99))
}

fn stuck(port: u16, path: &str) -> Option<f64> {
    scraped(port, "criguard_observation_stuck", &[("path", path)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_nodefs_stalls_neither_the_relay_nor_memory_eviction() {
    let sc = Pressure::new(320);
    let fuse = Fuse::mount();
    let fs = fuse.mnt.to_str().unwrap().to_owned();
    let state = tempfile::tempdir().unwrap();
    let port = free_port();
    let metrics = format!("--metrics-address=127.0.0.1:{port}");
    let state_arg = format!("--state-dir={}", state.path().display());
    let args = [
        "--kubepods-cgroup",
        &sc.kubepods,
        "--nodefs",
        &fs,
        "--imagefs",
        &fs,
        "--dynamic-oom-score-adj=false",
        "--housekeeping-interval=1s",
        "--eviction-hard=allocatableMemory.available<64Mi,nodefs.available<1Mi",
        "--eviction-pressure-transition-period=3s",
        &state_arg,
        &metrics,
    ];
    let guard =
        CriguardProcess::start(&sc.ctrd.dir.join("criguard.sock"), &sc.ctrd.socket, &args).await;
    let hog = sc.hog("hog", 60, 200);
    let (_sandbox, container) = sc.run(&guard, &hog).await;
    poll_until(Duration::from_secs(10), "nodefs observed", || async {
        scraped(
            port,
            "criguard_signal_available",
            &[("signal", "nodefs.available")],
        )
    })
    .await;
    let (p50_before, p99_before) = cri_latency(&guard, &container, 300).await;

    // Freeze the filesystem's daemon: statvfs on it blocks from now on.
    fuse.signal(libc::SIGSTOP);
    let frozen = Instant::now();
    poll_until(
        Duration::from_secs(15),
        "criguard_observation_stuck 1",
        || async { (stuck(port, &fs) == Some(1.0)).then_some(()) },
    )
    .await;
    eprintln!("stuck reported {:?} after the freeze", frozen.elapsed());
    let (p50_during, p99_during) = cri_latency(&guard, &container, 300).await;
    eprintln!(
        "CRI latency through criguard (ms): before p50 {p50_before:.2} p99 {p99_before:.2}; \
         nodefs hung p50 {p50_during:.2} p99 {p99_during:.2}"
    );
    assert!(
        p99_during < (10.0 * p99_before).max(200.0),
        "p99 {p99_during:.1} ms with nodefs hung vs {p99_before:.1} ms before"
    );
    // The admin API answers.
    let at = Instant::now();
    let pods = tokio::time::timeout(Duration::from_secs(10), guard.pods())
        .await
        .expect("criguard pods answers with nodefs hung");
    assert!(!pods.is_empty());
    eprintln!("criguard pods answered in {:?}", at.elapsed());

    // Memory eviction still acts.
    sc.grow(&container).await;
    let grown = Instant::now();
    let evictions = guard
        .first_evictions(
            Duration::from_secs(30),
            "a memory eviction with nodefs hung",
        )
        .await;
    assert_eq!(evictions[0].uid, hog.uid);
    assert_eq!(evictions[0].signal, "allocatableMemory.available");
    let kill = scraped(port, "criguard_pressure_to_kill_seconds_sum", &[]);
    eprintln!(
        "evicted {:?} after the grow; pressure->kill {kill:?} s; still stuck: {:?}",
        grown.elapsed(),
        stuck(port, &fs)
    );
    assert_eq!(stuck(port, &fs), Some(1.0), "the mount is still hung");

    // Thaw: observed again.
    fuse.signal(libc::SIGCONT);
    let thawed = Instant::now();
    poll_until(
        Duration::from_secs(15),
        "criguard_observation_stuck 0",
        || async { (stuck(port, &fs) == Some(0.0)).then_some(()) },
    )
    .await;
    eprintln!("observed again {:?} after the thaw", thawed.elapsed());
    drop(guard);
}
