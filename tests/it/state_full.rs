//! The state directory full (ENOSPC) never stops an eviction, nor lets the
//! evicted pod back in: the state directory is a real 256 KiB tmpfs, filled
//! to ENOSPC before criguard evicts a pod under real memory pressure. The
//! pod is evicted and refused from memory, the failed writes are counted in
//! `criguard_state_write_failures_total`, and once space frees the retry
//! writes the record, so a criguard restarted after that still refuses the
//! pod.

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::metrics::{free_port, parse, scrape, value};
use common::poll_until;
use common::pressure::Pressure;

/// A tmpfs mounted on a fresh directory, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, opts: &str) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", opts, "criguard-state-full"])
            .arg(dir)
            .status()
            .expect("run mount");
        assert!(ok.success(), "mount tmpfs on {}", dir.display());
        Self(dir.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Fills the filesystem of `dir` with `dir/filler` until ENOSPC.
fn fill(dir: &Path) {
    let mut f = std::fs::File::create(dir.join("filler")).unwrap();
    let chunk = vec![7u8; 4096];
    loop {
        match f.write_all(&chunk) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling {}: {e}", dir.display()),
        }
    }
    let _ = f.sync_all();
}

fn failures(port: u16, file: &str) -> f64 {
    let samples = parse(&scrape(port));
    value(
        &samples,
        "criguard_state_write_failures_total",
        &[("file", file)],
    )
    .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_state_directory_never_lets_an_evicted_pod_back_in() {
    let sc = Pressure::new(320);
    let top = tempfile::tempdir().unwrap();
    let state = top.path().join("state");
    let _fs = Tmpfs::mount(&state, "size=256k,mode=0700");
    fill(&state);
    let port = free_port();
    let metrics = format!("--metrics-address=127.0.0.1:{port}");
    let args = [
        "--eviction-hard=allocatableMemory.available<64Mi",
        "--eviction-pressure-transition-period=3s",
        metrics.as_str(),
    ];
    let guard = sc.criguard(&state, &args).await;
    let hog = sc.hog("hog", 60, 200);
    let (sandbox, container) = sc.run(&guard, &hog).await;
    sc.grow(&container).await;
    let evictions = guard
        .first_evictions(Duration::from_secs(60), "the eviction")
        .await;
    assert_eq!(evictions[0].uid, hog.uid, "the eviction happened");
    sc.exited_at_ms(&container).await;

    // Nothing could be written, and that was counted.
    let saved = state.join("evicted-pods.json");
    poll_until(Duration::from_secs(10), "a counted failure", || async {
        (failures(port, "evicted-pods.json") >= 1.0).then_some(())
    })
    .await;
    assert!(
        !std::fs::read_to_string(&saved).is_ok_and(|s| s.contains(&hog.uid)),
        "written on a full filesystem?"
    );
    // The pod stays refused from memory meanwhile.
    let refused = guard
        .clients()
        .rt
        .run_pod_sandbox(Pressure::retry_request(&hog, 1))
        .await
        .expect_err("the evicted pod admitted again");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    // Retried while the directory stays full: the count keeps growing.
    let before = failures(port, "evicted-pods.json");
    poll_until(Duration::from_secs(10), "a retry", || async {
        // At least one attempt of the retry thread's, whatever direct
        // writes the count already held.
        (failures(port, "evicted-pods.json") >= before + 2.0).then_some(())
    })
    .await;

    // Space frees: the retry writes the record without any new eviction.
    std::fs::remove_file(state.join("filler")).unwrap();
    poll_until(Duration::from_secs(10), "the record written", || async {
        std::fs::read_to_string(&saved)
            .is_ok_and(|s| s.contains(&hog.uid))
            .then_some(())
    })
    .await;
    eprintln!(
        "failed writes counted: {} (evicted-pods.json), {} (pressure.json)",
        failures(port, "evicted-pods.json"),
        failures(port, "pressure.json")
    );

    // A restart (SIGKILL: nothing written at the exit) still refuses it.
    guard.signal_and_wait(libc::SIGKILL);
    let again = sc.criguard(&state, &args).await;
    let refused = again
        .clients()
        .rt
        .run_pod_sandbox(Pressure::retry_request(&hog, 2))
        .await
        .expect_err("the evicted pod admitted after the restart");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    common::pods::remove_pods(&mut again.clients().rt, [sandbox]).await;
}
