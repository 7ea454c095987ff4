//! Scenario 2: the systemd cgroup driver (kubeadm's default) on cgroup v2.
//! containerd runs runc with `SystemdCgroup = true`, pods come with the
//! kubelet's slice names (`kubepods-burstable-pod<uid>.slice`) under a
//! `kubepods.slice` with the node's allocatable limits, and every part of
//! criguard that reads a pod's cgroup finds it: the model (checked against
//! the kernel's own `/proc/<pid>/cgroup`), per-pod processes, the memory and
//! pid rankings, the `oom_score_adj` adjuster, pid eviction and the pods'
//! cgroup signal under both spellings of `--kubepods-cgroup`.

use std::path::Path;
use std::time::Duration;

use crate::common::containerd::CriguardProcess;
use crate::common::pods::{
    forker, hog, init_pid, oom_score_adj_of, run_pod, sleeper, wait_holding,
};
use crate::guest::{self, CONTAINERD, Slice, cgroup_of, pod, sh};
use criguard_test_kit::kubelet::ContainerSpec;

const MI: i64 = 1 << 20;
/// kubepods.slice's limits: the node's allocatable memory and pids.
const MEMORY_MAX_MI: i64 = 600;
const TASKS_MAX: u64 = 120;

/// The `allocatableMemory.available` line of `criguard signals` with `args`:
/// its capacity column.
fn allocatable_capacity(args: &str) -> Option<String> {
    let out = sh(&format!(
        "{} signals --nodefs /tmp --imagefs /tmp {args}",
        env!("CARGO_BIN_EXE_criguard")
    ));
    out.lines()
        .find(|l| l.starts_with("allocatableMemory.available"))
        .and_then(|l| l.split_whitespace().nth(2))
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "inside the VM only: hack/vm.sh test"]
async fn systemd_driver_pods_are_found_by_every_reader() {
    guest::require();
    let _t = guest::Timer::start("systemd-driver");
    let kubepods = Slice::create(
        "kubepods.slice",
        &[
            &format!("MemoryMax={MEMORY_MAX_MI}M"),
            &format!("TasksMax={TASKS_MAX}"),
        ],
    );
    // The pods' cgroup under both spellings: the default (/kubepods) finds
    // kubepods.slice on this node, and the slice name is taken as such.
    let want = criguard::quantity::format_bytes((MEMORY_MAX_MI * MI) as u64);
    assert_eq!(allocatable_capacity("").as_deref(), Some(want.as_str()));
    assert_eq!(
        allocatable_capacity("--kubepods-cgroup kubepods.slice").as_deref(),
        Some(want.as_str())
    );

    let mut d = guest::node_containerd().await;
    let tmp = tempfile::tempdir().unwrap();
    let guard = CriguardProcess::start(
        &tmp.path().join("criguard.sock"),
        Path::new(CONTAINERD),
        &[
            "--eviction-hard=pid.available<40",
            "--housekeeping-interval=1s",
            "--oom-adjust-interval=1s",
        ],
    )
    .await;
    let mut rt = guard.clients().rt;
    // over: Burstable, 40 MiB over an 8 MiB request, priority 0: first in
    // the memory ranking. best: BestEffort but priority 1000. gu: Guaranteed.
    let over = pod(
        "over",
        0,
        ContainerSpec {
            memory_request: 8 * MI,
            command: hog(40, 0),
            ..sleeper("hog")
        },
    );
    let best = pod("best", 1000, sleeper("app"));
    let gu = pod(
        "gu",
        0,
        ContainerSpec {
            memory_limit: 64 * MI,
            cpu_limit_milli: 100,
            ..sleeper("app")
        },
    );
    let ran = guest::run_pods(&rt, &[&over, &best, &gu]).await;
    let [(over_sb, over_c), (best_sb, best_c), (gu_sb, gu_c)] = <[_; 3]>::try_from(ran).unwrap();
    wait_holding(&d.rt, &over_c[0], Duration::from_secs(120)).await;

    // The model's cgroups are where the kernel put the processes.
    let pods = guard.pods().await;
    for (sb, c) in [
        (&over_sb, &over_c[0]),
        (&best_sb, &best_c[0]),
        (&gu_sb, &gu_c[0]),
    ] {
        let pod = pods.iter().find(|p| &p.sandbox_id == sb).unwrap();
        let actual = cgroup_of(init_pid(&mut d, Some(c), None).await);
        assert_eq!(pod.containers[c].cgroup_path, actual, "{}", pod.name);
        let pause = cgroup_of(init_pid(&mut d, None, Some(sb)).await);
        let pod_cg = pod.cgroup().unwrap();
        assert_eq!(
            Path::new(&pause).parent(),
            Some(Path::new(&pod_cg)),
            "the sandbox's scope is in the pod's slice"
        );
        assert!(pod_cg.starts_with("/kubepods.slice/"), "{pod_cg}");
    }

    // Per-pod processes: the pause process and the container's.
    let usage = criguard::admin::get_usage(&guard.admin).await.unwrap();
    for sb in [&best_sb, &gu_sb] {
        let u = usage.pods.iter().find(|u| &u.sandbox_id == sb).unwrap();
        assert_eq!(u.processes, Some(2), "{}: {:?}", u.name, u.errors);
    }

    // Rankings read every pod's cgroup: memory puts `over` first, pids
    // counts every pod's tasks.
    let rank = criguard::admin::get_rank(&guard.admin).await.unwrap();
    let memory: Vec<_> = rank
        .iter()
        .filter(|e| e.signal.starts_with("memory"))
        .collect();
    assert_eq!(memory.len(), 3, "{rank:#?}");
    assert_eq!(
        memory[0].pod,
        format!("default/{}", over.name),
        "{memory:#?}"
    );
    assert!(
        memory.iter().all(|e| e.usage.is_some_and(|u| u > 0)),
        "{memory:#?}"
    );
    assert!(memory[0].usage.unwrap() >= 40 * MI, "{memory:#?}");
    let pids: Vec<_> = rank
        .iter()
        .filter(|e| e.signal == "pid.available")
        .collect();
    assert_eq!(pids.len(), 3, "{rank:#?}");
    assert!(
        pids.iter().all(|e| e.usage.is_some_and(|u| u >= 2)),
        "{pids:#?}"
    );

    // The adjuster finds the first-ranked pod's processes: 1000 for them,
    // from the kubelet's Burstable score.
    let over_pid = init_pid(&mut d, Some(&over_c[0]), None).await;
    let kubelet = over.oom_score_adj(&over.containers[0]);
    assert!(kubelet < 1000, "{kubelet}");
    crate::common::poll_until(Duration::from_secs(30), "the adjuster's 1000", || async {
        (oom_score_adj_of(over_pid) == 1000).then_some(())
    })
    .await;

    // Pid eviction ranks by each pod's tasks: the forker goes.
    let forker = pod("forker", 0, forker(90));
    let (forker_sb, _) = run_pod(&mut rt, &forker, None).await;
    let evictions = guard
        .first_evictions(Duration::from_secs(90), "a pid eviction")
        .await;
    assert_eq!(evictions[0].sandbox_id, forker_sb, "{evictions:#?}");
    assert_eq!(evictions[0].signal, "pid.available");
    // Chosen mid-fork (the tick may come before all 90): the threshold is
    // crossed near 70 tasks in its slice, the other pods have under 5 each.
    assert!(evictions[0].usage >= 40, "{evictions:#?}");
    guest::report(&format!(
        "systemd-driver: model, usage, rankings, adjuster and pid eviction found the pods in {}",
        kubepods.dir()
    ));

    drop(guard);
    guest::remove_all(&d.rt, vec![over_sb, best_sb, gu_sb, forker_sb]).await;
}
