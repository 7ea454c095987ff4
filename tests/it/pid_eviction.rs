//! PID pressure, for real: the pods' cgroup gets a pids limit (the
//! kubelet's system-reserved pids), a pod forks until `pid.available` is
//! under its threshold, and criguard evicts that pod, the one with the most
//! tasks, while a quiet pod of the same priority stays.

use crate::common;

use std::time::Duration;

use common::containerd::{CriguardProcess, PrivateContainerd, unique};
use common::pods::{CgroupRoot, forker, remove_pods, run_pod, sleeper};
use criguard::kubelet::{ContainerSpec, PodSpec};

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
    let root = format!("/{}", unique("criguard-pid"));
    let _cg = CgroupRoot(root.clone());
    let kubepods = format!("{root}/kubepods");
    common::memcg::limited(&kubepods, None, Some(PIDS_MAX as i64));
    let ctrd = PrivateContainerd::start();

    let args = [
        "--eviction-hard=pid.available<30".to_owned(),
        format!("--kubepods-cgroup={kubepods}"),
        "--housekeeping-interval=1s".into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let guard = CriguardProcess::start(&ctrd.dir.join("criguard.sock"), &ctrd.socket, &args).await;
    let mut rt = guard.clients().rt;
    let pod = |name: &str, c: ContainerSpec| {
        let mut p = PodSpec::new(name, &unique(name)).container(c);
        p.cgroup_root = kubepods.clone();
        p.log_root = ctrd.dir.join("pods").to_str().unwrap().into();
        p
    };
    let quiet = pod("quiet", sleeper("sleep"));
    let (quiet_sb, _) = run_pod(&mut rt, &quiet, None).await;
    assert!(guard.evictions().await.is_empty());

    // 80 sleeping children: with the pause processes and shells the pods'
    // cgroup passes 70 of its 100 tasks.
    let forker = pod("forker", forker(80));
    let (forker_sb, _) = run_pod(&mut rt, &forker, None).await;

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
        || async { (pids_current(&kubepods) < PIDS_MAX - 30).then_some(()) },
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
            .contains(&criguard::policy::thresholds::Condition::PIDPressure)
    );

    drop(guard);
    remove_pods(&mut ctrd.direct().rt, [quiet_sb, forker_sb]).await;
}
