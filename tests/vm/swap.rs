//! Scenario 7: a node that swaps. A 256 MiB swap file, and two pods: a
//! BestEffort pod holding 40 MiB with no swap (`memory.swap.max` 0, the
//! kubelet's NoSwap), and a Burstable pod (request 16 MiB, limit 32 MiB)
//! whose swap is unbounded (`memory.swap.max` max, far above its
//! `LimitedSwap` entitlement of some 2 MiB) and that grows 120 MiB past its
//! limit: the kernel swaps it out, `memory.available` stays far above any
//! line, and only criguard's `swap.available<192Mi` sees it.
//!
//! The swap ranking must pick the swapper. The memory ranking would pick the
//! BestEffort pod: both use more than they request, and it by more.
//! Admission then refuses a BestEffort pod (MemoryPressure).

use std::time::{Duration, Instant};

use crate::common::containerd::CriguardProcess;
use crate::common::metrics::{free_port, parse, scrape, value};
use crate::common::pods::{grow, hog, sleeper, wait_holding};
use crate::guest::{self, CONTAINERD, Slice, pod};
use criguard_test_kit::kubelet::ContainerSpec;
use k8s_cri::v1 as cri;

const MI: i64 = 1 << 20;
const SWAP_FILE: &str = "/var/tmp/criguard-vm-swap";

/// A swap file in use while it lives.
struct SwapFile;

impl SwapFile {
    fn on(mib: u32) -> Self {
        guest::sh(&format!(
            "swapoff {SWAP_FILE} 2>/dev/null; rm -f {SWAP_FILE}; \
             dd if=/dev/zero of={SWAP_FILE} bs=1M count={mib} status=none && \
             chmod 600 {SWAP_FILE} && mkswap -q {SWAP_FILE} && swapon {SWAP_FILE}"
        ));
        SwapFile
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        let _ = guest::sh_status(&format!("swapoff {SWAP_FILE}; rm -f {SWAP_FILE}"));
    }
}

/// `SwapTotal − SwapFree` of the guest, MiB.
fn swap_used_mib() -> i64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let (total, free) = criguard::signals::node::swap_total_free(&meminfo).unwrap();
    (total as i64 - free as i64) / MI
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "inside the VM only: hack/vm.sh test"]
async fn v2_swap_pressure_evicts_the_pod_over_its_swap_entitlement() {
    guest::require();
    let _t = guest::Timer::start("v2-swap");
    let _swap = SwapFile::on(256);
    let _kubepods = Slice::create("kubepods.slice", &[]);
    let d = guest::node_containerd().await;
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let guard = CriguardProcess::start(
        &tmp.path().join("criguard.sock"),
        std::path::Path::new(CONTAINERD),
        &[
            "--eviction-hard=swap.available<192Mi",
            "--housekeeping-interval=1s",
            &format!("--metrics-address=127.0.0.1:{port}"),
        ],
    )
    .await;
    let rt = guard.clients().rt;
    let no_swap = [("memory.swap.max".to_owned(), "0".to_owned())].into();
    let steady = pod(
        "steady",
        0,
        ContainerSpec {
            command: hog(40, 0),
            unified: no_swap,
            ..sleeper("app")
        },
    );
    let swapper = pod(
        "swapper",
        0,
        ContainerSpec {
            command: hog(10, 120),
            memory_request: 16 * MI,
            memory_limit: 32 * MI,
            unified: [("memory.swap.max".to_owned(), "max".to_owned())].into(),
            ..sleeper("hog")
        },
    );
    let ran = guest::run_pods(&rt, &[&steady, &swapper]).await;
    let [(steady_sb, steady_c), (swapper_sb, swapper_c)] = <[_; 2]>::try_from(ran).unwrap();
    wait_holding(&d.rt, &steady_c[0], Duration::from_secs(120)).await;
    wait_holding(&d.rt, &swapper_c[0], Duration::from_secs(120)).await;
    let swapped_before = swap_used_mib();
    let samples = parse(&scrape(port));
    let observed = value(
        &samples,
        "criguard_signal_available",
        &[("signal", "swap.available")],
    );
    assert!(
        observed.is_some_and(|v| v > (192 * MI) as f64),
        "swap.available observed above the line before the growth: {observed:?}"
    );
    assert!(guard.evictions().await.is_empty());

    let t0 = Instant::now();
    grow(&d.rt, &swapper_c[0]).await;
    let evictions = guard
        .first_evictions(Duration::from_secs(180), "an eviction for swap")
        .await;
    let took = t0.elapsed();
    let e = &evictions[0];
    assert_eq!(e.sandbox_id, swapper_sb, "{evictions:#?}");
    assert_eq!(e.signal, "swap.available");
    assert!(
        e.message
            .starts_with("The node was low on resource: swap. Threshold quantity: 192Mi"),
        "{}",
        e.message
    );

    // Admission as under memory pressure: no new BestEffort pod.
    let newcomer = pod("newcomer", 0, sleeper("app"));
    let mut rt2 = rt.clone();
    let config = newcomer.sandbox_config();
    std::fs::create_dir_all(&config.log_directory).unwrap();
    let err = rt2
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("MemoryPressure"), "{err:?}");

    // The BestEffort pod, first in the memory ranking, runs on.
    let pods = guard.pods().await;
    let p = pods.iter().find(|p| p.sandbox_id == steady_sb).unwrap();
    assert_eq!(p.state, criguard::model::SandboxState::Ready);
    guest::report(&format!(
        "v2-swap: swap used {swapped_before} MiB before the growth; the swapper evicted {:.1} s after it began \
         ({}), swap used now {} MiB",
        took.as_secs_f64(),
        e.message,
        swap_used_mib()
    ));

    drop(guard);
    guest::remove_all(&d.rt, vec![steady_sb, swapper_sb]).await;
}
