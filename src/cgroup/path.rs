//! One resolver from what the kubelet tells the runtime to the cgroup
//! directories criguard reads: a pod's `cgroup_parent`, a container id and
//! the pods' cgroup (`--kubepods-cgroup`), for both cgroup drivers and both
//! cgroup versions. Everything that reads a pod's or a container's cgroup
//! goes through here.
//!
//! - **Drivers.** With the cgroupfs driver the kubelet sends a path
//!   (`/kubepods/burstable/pod<uid>`) and containerd puts each container at
//!   `<parent>/<id>`. With the systemd driver it sends a slice name
//!   (`kubepods-burstable-pod<uid>.slice`); containerd passes runc
//!   `<slice>:cri-containerd:<id>` (`pkg/cri` getCgroupsPath, which keeps
//!   only the last path component), and runc expands the slice the way
//!   systemd does (`a-b-c.slice` → `/a.slice/a-b.slice/a-b-c.slice`) and puts
//!   the container in the scope `cri-containerd-<id>.scope` below it.
//! - **Versions.** The relative path is the same in both; only the
//!   directory differs: v1 has one hierarchy per controller
//!   (`<root>/memory/<path>`, `<root>/pids/<path>`), v2 one unified tree
//!   (`<root>/<path>`) ([`dir`]).
//!
//! The functions here are pure: they look at no tree (finding which
//! spelling of the default pods' cgroup a node uses is
//! `CgroupFs::kubepods_in`, in [`super::fs`], which reads through here).

use std::path::{Path, PathBuf};

/// Which cgroup layout a root uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// cgroup v1: `<root>/memory/<cgroup>/memory.*`.
    V1,
    /// cgroup v2: `<root>/<cgroup>/memory.*`.
    V2,
}

/// The cgroup driver a name is spelled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driver {
    /// A cgroupfs path.
    Cgroupfs,
    /// A systemd slice.
    Systemd,
}

/// A controller criguard reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Controller {
    /// `memory.*`, `cgroup.procs` (the tree criguard walks for processes).
    Memory,
    /// `pids.*`.
    Pids,
}

impl Controller {
    /// The v1 hierarchy's directory name.
    fn v1_name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
        }
    }
}

/// The driver of a pod's cgroup parent, by containerd's rule: systemd when
/// its last component is a slice.
pub fn driver_of(parent: &str) -> Driver {
    let base = parent
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or("");
    if base.ends_with(".slice") {
        Driver::Systemd
    } else {
        Driver::Cgroupfs
    }
}

/// A systemd slice name as a path from the root, as systemd and runc expand
/// it: `a-b-c.slice` → `/a.slice/a-b.slice/a-b-c.slice`, `-.slice` → `/`.
/// `None` for a name systemd would refuse (no `.slice` suffix, a `/`, an
/// empty part: `a--b.slice`, `-a.slice`, `a-.slice`).
pub fn expand_slice(name: &str) -> Option<String> {
    if name == "-.slice" {
        return Some("/".to_owned());
    }
    let stem = name.strip_suffix(".slice")?;
    if stem.is_empty() || stem.contains('/') || stem.split('-').any(str::is_empty) {
        return None;
    }
    let mut path = String::new();
    let mut prefix = String::new();
    for part in stem.split('-') {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        path.push('/');
        path.push_str(&prefix);
        path.push_str(".slice");
    }
    Some(path)
}

/// A cgroupfs path normalised: one leading `/`, no trailing or doubled ones.
fn normalise(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    format!("/{}", parts.join("/"))
}

/// The pod's cgroup below the hierarchy root (leading `/`), from its
/// `cgroup_parent`; `None` when the parent is empty (the kubelet always
/// sends one; without it the runtime picks a place criguard cannot know)
/// or an invalid slice name.
pub fn pod(parent: &str) -> Option<String> {
    if parent.trim_matches('/').is_empty() {
        return None;
    }
    match driver_of(parent) {
        Driver::Cgroupfs => Some(normalise(parent)),
        Driver::Systemd => {
            let base = parent.trim_end_matches('/').rsplit('/').next()?;
            expand_slice(base)
        }
    }
}

/// A container's cgroup, from its pod's `cgroup_parent` and its id:
/// `<pod>/<id>` (cgroupfs) or `<pod>/cri-containerd-<id>.scope` (systemd).
pub fn container(parent: &str, id: &str) -> Option<String> {
    let pod = pod(parent)?;
    let pod = pod.trim_end_matches('/');
    Some(match driver_of(parent) {
        Driver::Cgroupfs => format!("{pod}/{id}"),
        Driver::Systemd => format!("{pod}/cri-containerd-{id}.scope"),
    })
}

/// The pods' cgroup as `--kubepods-cgroup` names it: a path (anything with
/// a `/`) as given, a slice name (`kubepods.slice`) expanded, a bare name
/// (`kubepods`) from the root.
pub fn kubepods(name: &str) -> String {
    match expand_slice(name) {
        Some(p) if !name.contains('/') => p,
        _ => normalise(name),
    }
}

/// Where to look for the pods' cgroup named `name`, best first: the
/// kubelet's default name (`/kubepods`, `kubepods`) is `/kubepods` under
/// the cgroupfs driver and `/kubepods.slice` under the systemd driver; any
/// other name is only itself.
pub fn kubepods_candidates(name: &str) -> Vec<String> {
    let first = kubepods(name);
    if first == "/kubepods" {
        vec![first, "/kubepods.slice".to_owned()]
    } else {
        vec![first]
    }
}

/// The cgroup named `kubepods` (cgroupfs: `…/kubepods`) or `*kubepods.slice`
/// (systemd, any cgroup root: `/kubepods.slice`, `/a.slice/a-kubepods.slice`)
/// above or at the pod cgroup `pod` (a path from [`pod`]).
pub fn kubepods_of(pod: &str) -> Option<String> {
    let mut out = String::new();
    for part in pod.split('/').filter(|p| !p.is_empty()) {
        out.push('/');
        out.push_str(part);
        if part == "kubepods" || part == "kubepods.slice" || part.ends_with("-kubepods.slice") {
            return Some(out);
        }
    }
    None
}

/// The directory of the cgroup `rel` (a path from the root) for
/// `controller`: `<root>/<controller>/<rel>` on v1, `<root>/<rel>` on v2.
pub fn dir(root: &Path, layout: Layout, controller: Controller, rel: &str) -> PathBuf {
    let rel = rel.trim_start_matches('/');
    match layout {
        Layout::V1 => root.join(controller.v1_name()).join(rel),
        Layout::V2 => root.join(rel),
    }
}

#[cfg(test)]
mod tests;
