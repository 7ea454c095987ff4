//! PID pressure, for real: the pods' cgroup gets a pids limit (the
//! kubelet's system-reserved pids), a pod forks until `pid.available` is
//! under its threshold, and criguard evicts that pod, the one with the most
//! tasks, while a quiet pod of the same priority stays.

use crate::common;

use std::time::Duration;

use common::pods::{forker, remove_pods, sleeper};
use common::pressure::Pressure;

const PIDS_MAX: u64 = 100;

fn pids_current(cgroup: &str) -> u64 {
    let p = format!("/sys/fs/cgroup/pids{cgroup}/pids.current");
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{p}: {e}"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_with_most_tasks_goes_under_pid_pressure() {
    let p = Pressure::build("criguard-pid")
        .pids(PIDS_MAX as i64)
        .start();
    let kubepods = &p.kubepods;
    let guard = p
        .guard()
        .arg("--eviction-hard=pid.available<30")
        .arg("--dynamic-oom-score-adj=true")
        .start()
        .await;
    let quiet = p.pod("quiet", sleeper("sleep"));
    let (quiet_sb, _) = p.start_pod(&guard, &quiet).await;
    assert!(guard.evictions().await.is_empty());

    // 80 sleeping children: with the pause processes and shells the pods'
    // cgroup passes 70 of its 100 tasks.
    let forker = p.pod("forker", forker(80));
    let (forker_sb, _) = p.start_pod(&guard, &forker).await;

    let evictions = guard
        .first_evictions(Duration::from_secs(30), "a pid eviction")
        .await;
    let e = &evictions[0];
    assert_eq!(e.sandbox_id, forker_sb, "{e:?}");
    assert_eq!(e.signal, "pid.available");
    assert!(e.usage >= 80, "the forker's tasks: {e:?}");
    assert!(
        e.message.starts_with("The node was low on resource: pids.")
            && e.message.contains("Container forker was using"),
        "{}",
        e.message
    );
    // The forker's tasks are gone, the quiet pod still runs.
    common::poll_until(
        Duration::from_secs(20),
        "the forker's tasks to end",
        || async { (pids_current(kubepods) < PIDS_MAX - 30).then_some(()) },
    )
    .await;
    let pods = guard.pods().await;
    let q = pods.iter().find(|p| p.sandbox_id == quiet_sb).unwrap();
    assert_eq!(q.state, criguard::model::SandboxState::Ready);
    assert_eq!(guard.evictions().await.len(), 1, "one pod was enough");
    assert!(
        guard
            .conditions()
            .await
            .conditions
            .contains(&criguard::signals::table::Condition::PIDPressure)
    );

    drop(guard);
    remove_pods(&mut p.ctrd.direct().rt, [quiet_sb, forker_sb]).await;
}
