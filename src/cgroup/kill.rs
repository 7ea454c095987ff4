//! Killing an evicted pod's processes through its cgroup, before the
//! runtime is asked to stop it.
//!
//! Under a hard threshold (grace period 0) the kubelet's StopContainer ends
//! in the same SIGKILL, but only after containerd and each container's shim
//! have handled the call: 80 to 170 ms per pod on a node with 250 pods
//! (`hack/bench-scale.sh`), while the node stays short of memory. criguard
//! sends the SIGKILL itself first, so the memory comes back at once, and
//! then stops the pod through the runtime as before (which finds it exited
//! and only cleans up).
//!
//! cgroup v2 has `cgroup.kill`, which kills the whole subtree atomically,
//! new forks included. Elsewhere (cgroup v1) each process listed in the
//! pod's cgroups is opened as a pidfd, checked to still be in the pod's
//! cgroup (a pid read from `cgroup.procs` may have exited and been reused
//! since), and signalled through that pidfd, so no other process can ever
//! be hit.

use std::io;

use super::fs::{CgroupFs, Layout};
use super::path::Controller;

/// How a pod's processes were killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Killed {
    /// `cgroup.kill` was written: the whole subtree, atomically.
    Subtree,
    /// This many processes (distinct pids) were signalled one by one.
    Processes(usize),
}

/// Kills every process in `cgroup` (a path from the hierarchy root) and its
/// descendants with SIGKILL.
/// A cgroup that no longer exists has nothing left to kill.
pub fn kill_cgroup(fs: &CgroupFs, cgroup: &str) -> io::Result<Killed> {
    let dir = fs.dir(Controller::Memory, cgroup);
    if !dir.exists() {
        return Ok(Killed::Processes(0));
    }
    if fs.layout() == Layout::V2 {
        let file = dir.join("cgroup.kill");
        match std::fs::write(&file, "1") {
            Ok(()) => return Ok(Killed::Subtree),
            // Kernels before 5.14 have no cgroup.kill: one by one.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", file.display()))),
        }
    }
    // Twice: a process forked while the first pass ran is caught by the
    // second (v1 has no atomic kill; a container's processes rarely fork
    // that fast, and the runtime's SIGKILL follows anyway).
    let mut killed = std::collections::BTreeSet::new();
    for _ in 0..2 {
        let pids = match fs.pids(cgroup) {
            Ok(pids) => pids,
            // The pod ended by itself meanwhile and its cgroup went.
            Err(e) if e.source.kind() == io::ErrorKind::NotFound => break,
            Err(e) => return Err(io::Error::new(e.source.kind(), e.to_string())),
        };
        for pid in pids {
            if !killed.contains(&pid) && kill_if_in(pid, fs.layout(), cgroup)? {
                killed.insert(pid);
            }
        }
    }
    Ok(Killed::Processes(killed.len()))
}

/// Whether `cgroup` is the kubelet's cgroup for the pod with `uid`: its
/// last component is `pod<uid>` (cgroupfs driver) or
/// `kubepods[-<qos>]-pod<uid with '_' for '-'>.slice` (systemd driver).
/// Anything else (a sandbox made by another client with, say, `/kubepods`
/// as its parent) is never killed through its cgroup: the subtree could
/// hold other pods.
pub fn is_pod_cgroup_of(cgroup: &str, uid: &str) -> bool {
    let leaf = cgroup
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or("");
    if uid.is_empty() {
        return false;
    }
    let systemd = format!("pod{}.slice", uid.replace('-', "_"));
    leaf == format!("pod{uid}")
        || (leaf.starts_with("kubepods-") && leaf.ends_with(&systemd) && {
            let qos = &leaf["kubepods-".len()..leaf.len() - systemd.len()];
            matches!(qos, "" | "burstable-" | "besteffort-")
        })
}

/// Sends SIGKILL to `pid` if it is (still) in `cgroup` or below; whether it
/// was sent. A process that is already gone is not an error.
fn kill_if_in(pid: i32, layout: Layout, cgroup: &str) -> io::Result<bool> {
    let Some(pidfd) = crate::pidfd::open(pid)? else {
        return Ok(false);
    };
    // The pidfd pins the process: if /proc/<pid> shows it in the pod's
    // cgroup now, the signal through the pidfd reaches that process.
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
        return Ok(false);
    };
    if !in_cgroup(&text, layout, cgroup) {
        return Ok(false);
    }
    crate::pidfd::send_signal(&pidfd, libc::SIGKILL)
}

/// Whether `/proc/<pid>/cgroup` text puts the process in `cgroup` or below
/// (the memory hierarchy's line on v1, the unified line on v2).
fn in_cgroup(text: &str, layout: Layout, cgroup: &str) -> bool {
    let cgroup = cgroup.trim_end_matches('/');
    text.lines().any(|line| {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            return false;
        };
        let right_line = match layout {
            Layout::V2 => controllers.is_empty(),
            Layout::V1 => controllers.split(',').any(|c| c == "memory"),
        };
        right_line
            && (path == cgroup
                || path
                    .strip_prefix(cgroup)
                    .is_some_and(|rest| rest.starts_with('/')))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: &str = "12:pids:/kubepods/besteffort/podA/c1\n\
                      9:memory:/kubepods/besteffort/podA/c1\n\
                      0::/user.slice\n";
    const V2: &str = "0::/kubepods.slice/kubepods-podA.slice/cri-containerd-c1.scope\n";

    #[test]
    fn only_a_cgroup_named_for_the_pods_uid_is_its_own() {
        let uid = "0f1e-2d3c";
        for yes in [
            "/kubepods/besteffort/pod0f1e-2d3c",
            "/kubepods/pod0f1e-2d3c/",
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f1e_2d3c.slice",
            "/kubepods.slice/kubepods-pod0f1e_2d3c.slice",
        ] {
            assert!(is_pod_cgroup_of(yes, uid), "{yes}");
        }
        for no in [
            "/kubepods",
            "/kubepods/besteffort",
            "/kubepods.slice",
            "/kubepods/besteffort/pod0f1e-2d3c-other",
            "/kubepods/besteffort/pod0f1e",
            "/kubepods.slice/kubepods-burstable-pod0f1e-2d3c.slice",
            "/kubepods.slice/kubepods-guaranteed-pod0f1e_2d3c.slice",
            "/system.slice/other-pod0f1e_2d3c.slice",
        ] {
            assert!(!is_pod_cgroup_of(no, uid), "{no}");
        }
        assert!(!is_pod_cgroup_of("/kubepods/pod", ""));
    }

    #[test]
    fn a_process_is_in_its_pods_cgroup_by_the_right_line() {
        assert!(in_cgroup(V1, Layout::V1, "/kubepods/besteffort/podA"));
        assert!(in_cgroup(V1, Layout::V1, "/kubepods/besteffort/podA/"));
        assert!(!in_cgroup(V1, Layout::V1, "/kubepods/besteffort/podAB"));
        assert!(!in_cgroup(V1, Layout::V1, "/kubepods/besteffort/podB"));
        // v1 reads the memory line, not the unified one.
        assert!(!in_cgroup(V1, Layout::V1, "/user.slice"));
        assert!(in_cgroup(V1, Layout::V2, "/user.slice"));
        assert!(in_cgroup(
            V2,
            Layout::V2,
            "/kubepods.slice/kubepods-podA.slice"
        ));
        assert!(!in_cgroup(
            V2,
            Layout::V2,
            "/kubepods.slice/kubepods-podB.slice"
        ));
        assert!(!in_cgroup(
            V2,
            Layout::V1,
            "/kubepods.slice/kubepods-podA.slice"
        ));
    }
}
