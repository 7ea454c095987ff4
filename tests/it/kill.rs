//! Killing a pod's processes through its cgroup, on this host's real
//! hierarchies: the v1 memory controller (one pidfd per process) and the
//! unified hierarchy (`cgroup.kill`). Processes outside the cgroup, one of
//! them in a cgroup whose name extends the pod's, must live on.

use crate::common;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::memcg::{MEMORY, Proc, TestCgroup, UNIFIED, in_cgroups};
use criguard::cgroup::fs::CgroupFs;
use criguard::cgroup::kill::{Killed, kill_cgroup};

/// A `sleep` and its `sh` in each of `cgroups` (`; true` keeps the shell
/// from exec-ing the sleep).
fn sleeper(cgroups: &[&TestCgroup]) -> Proc {
    let child = in_cgroups(cgroups, "sleep 600; true")
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn sh");
    Proc(child)
}

/// Waits until `cg` holds `n` processes (the shells have moved in and
/// forked their sleep).
fn holding(cg: &TestCgroup, n: usize) {
    let end = Instant::now() + Duration::from_secs(10);
    while cg.pids().len() < n {
        assert!(
            Instant::now() < end,
            "{} never held {n} processes",
            cg.dir.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How `p` ended, waiting at most 10 s; `None` while it still runs.
fn ended(p: &mut Proc) -> Option<i32> {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = p.0.try_wait().unwrap() {
            return status.signal();
        }
        if Instant::now() > end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Kills a pod cgroup with a container cgroup below it; a neighbour whose
/// name starts with the pod's and an unconfined process survive.
fn kill_case(hierarchy: &str, want_subtree: bool) {
    let pod = TestCgroup::create(hierarchy, "criguard-kill");
    let container = pod.dir.join("c1");
    std::fs::create_dir(&container).unwrap();
    let container_cg = TestCgroup {
        dir: container.clone(),
    };
    let neighbour = TestCgroup {
        dir: Path::new(hierarchy).join(format!("{}-x", pod.name().trim_start_matches('/'))),
    };
    std::fs::create_dir(&neighbour.dir).unwrap();

    let mut in_pod = sleeper(&[&pod]);
    let mut in_container = sleeper(&[&container_cg]);
    let mut next_door = sleeper(&[&neighbour]);
    let mut outside = Proc(
        std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap(),
    );
    holding(&pod, 2);
    holding(&container_cg, 2);
    holding(&neighbour, 2);

    // v1: the root holding one directory per controller; v2: the unified
    // hierarchy itself.
    let root = if hierarchy == MEMORY {
        "/sys/fs/cgroup"
    } else {
        hierarchy
    };
    let fs = CgroupFs::detect(Path::new(root));
    let killed = kill_cgroup(&fs, &pod.name()).unwrap();
    if want_subtree {
        assert_eq!(killed, Killed::Subtree);
    } else {
        // Both shells and both sleeps.
        assert_eq!(killed, Killed::Processes(4), "{killed:?}");
    }
    assert_eq!(ended(&mut in_pod), Some(libc::SIGKILL));
    assert_eq!(ended(&mut in_container), Some(libc::SIGKILL));
    assert_eq!(next_door.0.try_wait().unwrap(), None, "the neighbour lives");
    assert_eq!(outside.0.try_wait().unwrap(), None, "the outsider lives");

    // A cgroup that is gone has nothing to kill.
    let name = pod.name();
    drop(container_cg);
    drop(pod);
    assert_eq!(kill_cgroup(&fs, &name).unwrap(), Killed::Processes(0));
}

#[test]
fn a_v1_pods_processes_are_killed_one_by_one() {
    kill_case(MEMORY, false);
}

#[test]
fn a_v2_pods_processes_are_killed_with_cgroup_kill() {
    kill_case(UNIFIED, true);
}
