//! Scenario 8: a node whose page cache thrashes. `kubepods.slice` has a
//! 96 MiB limit and a BestEffort pod reads a 160 MiB file over and over: each
//! pass refaults what the last one evicted, the kernel counts the waits as
//! memory stall, and node-wide PSI (`/proc/pressure/memory`) rises while the
//! pods' working set stays small. criguard's opt-in
//! `memory.pressure.some>5%` sees it and evicts by the memory ranking: the
//! reader, not the Burstable pod within its request.

use std::time::{Duration, Instant};

use crate::common::containerd::CriguardProcess;
use crate::common::pods::sleeper;
use crate::guest::{self, CONTAINERD, Slice, pod};
use criguard::signals::table::Stall;
use criguard_test_kit::kubelet::ContainerSpec;

const MI: i64 = 1 << 20;

/// The node's `some avg10`, percent.
fn node_stall() -> f64 {
    let text = std::fs::read_to_string("/proc/pressure/memory").unwrap();
    criguard::cgroup::fs::psi_avg10(&text, Stall::Some.name()).unwrap() as f64 / 100.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "inside the VM only: hack/vm.sh test"]
async fn v2_memory_stall_evicts_the_thrashing_pod_by_the_memory_ranking() {
    guest::require();
    let _t = guest::Timer::start("v2-stall");
    let _kubepods = Slice::create("kubepods.slice", &["MemoryMax=96M"]);
    let d = guest::node_containerd().await;
    let tmp = tempfile::tempdir().unwrap();
    let guard = CriguardProcess::start(
        &tmp.path().join("criguard.sock"),
        std::path::Path::new(CONTAINERD),
        &[
            "--eviction-hard=memory.pressure.some>5%",
            "--housekeeping-interval=1s",
        ],
    )
    .await;
    let rt = guard.clients().rt;
    let reader = pod(
        "reader",
        0,
        ContainerSpec {
            command: vec![
                "sh".into(),
                "-c".into(),
                "dd if=/dev/urandom of=/data bs=1M count=160 2>/dev/null && sync && \
                 while true; do cat /data > /dev/null; done"
                    .into(),
            ],
            ..sleeper("app")
        },
    );
    let quiet = pod(
        "quiet",
        0,
        ContainerSpec {
            memory_request: 32 * MI,
            ..sleeper("app")
        },
    );
    let before = node_stall();
    let ran = guest::run_pods(&rt, &[&quiet, &reader]).await;
    let [(quiet_sb, _), (reader_sb, _)] = <[_; 2]>::try_from(ran).unwrap();
    let t0 = Instant::now();
    let evictions = guard
        .first_evictions(Duration::from_secs(180), "an eviction for memory stall")
        .await;
    let took = t0.elapsed();
    let e = &evictions[0];
    assert_eq!(e.sandbox_id, reader_sb, "{evictions:#?}");
    assert_eq!(e.signal, "memory.pressure.some");
    assert!(
        e.message.starts_with(
            "The node was low on resource: memory. Threshold quantity: stalled more than 5%"
        ),
        "{}",
        e.message
    );
    let pods = guard.pods().await;
    let q = pods.iter().find(|p| p.sandbox_id == quiet_sb).unwrap();
    assert_eq!(q.state, criguard::model::SandboxState::Ready);
    guest::report(&format!(
        "v2-stall: node stall {before:.2}% before; the reader evicted {:.1} s after the pods started ({}); node stall now {:.2}%",
        took.as_secs_f64(),
        e.message,
        node_stall()
    ));

    drop(guard);
    guest::remove_all(&d.rt, vec![quiet_sb, reader_sb]).await;
}
