//! What the adjuster keeps of the node model between rounds: the running
//! pods as of one model generation, with their usage counters and the
//! pods' scopes' limit files held open, so that a round in which nothing
//! changed costs one `pread(2)` a pod and no path lookup at all.
//!
//! The view is derived again only when the model's generation moves (a pod
//! or container started, stopped, removed); counters of pods still running
//! are kept. A counter that cannot be read (its cgroup gone, or not made
//! yet) is dropped and opened again at the next round's check.

use std::collections::{BTreeSet, HashMap};

use crate::cgroup::fs::{CgroupFile, CgroupFs, limit_of};
use crate::cgroup::path::kubepods_of;
use crate::model::{NodeModel, Pod, SandboxState};
use crate::oom::scores::Check;

/// A running pod and its usage counter.
#[derive(Debug)]
pub(super) struct ViewPod {
    /// The pod as the model derived it.
    pub pod: Pod,
    /// Its cgroup (`None`: no cgroup parent, never read).
    pub cgroup: Option<String>,
    /// Its usage counter, held open (`None`: not readable now).
    usage: Option<CgroupFile>,
}

/// What the view takes of the model, under its lock.
#[derive(Debug)]
pub(super) struct Snapshot {
    generation: u64,
    capacity: i64,
    pods: Vec<Pod>,
}

/// The running pods of one model generation.
#[derive(Debug, Default)]
pub(super) struct View {
    /// The model generation it was derived from (`None`: never derived).
    pub generation: Option<u64>,
    /// The node's memory capacity: the scope when no pods' cgroup limits less.
    capacity: i64,
    /// Running pods, by sandbox id order.
    pub pods: Vec<ViewPod>,
    /// The pods' scopes' (kubepods) limit files, one per scope.
    scopes: Vec<CgroupFile>,
}

impl View {
    /// What the view needs of `model` when it has moved on (`None`: it has
    /// not): taken under the model's lock, with no I/O, so that the lock is
    /// held only while the pods are derived.
    pub fn wanted(&self, model: &NodeModel) -> Option<Snapshot> {
        if self.generation == Some(model.generation()) {
            return None;
        }
        Some(Snapshot {
            generation: model.generation(),
            capacity: model.memory_capacity(),
            pods: model
                .pods()
                .into_iter()
                .filter(|p| p.state == SandboxState::Ready)
                .collect(),
        })
    }

    /// Derives the view again from `snap` (opening the scopes' limit
    /// files: cgroupfs I/O, done with the model's lock released).
    pub fn update(&mut self, snap: Snapshot, cgroups: &CgroupFs) {
        let mut old: HashMap<String, ViewPod> = std::mem::take(&mut self.pods)
            .into_iter()
            .map(|p| (p.pod.sandbox_id.clone(), p))
            .collect();
        self.pods = snap
            .pods
            .into_iter()
            .map(|pod| {
                let cgroup = pod.cgroup();
                let usage = old.remove(&pod.sandbox_id).and_then(|o| o.usage);
                ViewPod { pod, cgroup, usage }
            })
            .collect();
        let scopes: BTreeSet<String> = self
            .pods
            .iter()
            .filter_map(|p| kubepods_of(p.cgroup.as_deref()?))
            .collect();
        // Kept open while the set of scopes stays the same.
        let same = self.scopes.len() == scopes.len()
            && self
                .scopes
                .iter()
                .zip(&scopes)
                .all(|(f, s)| f.path() == cgroups.limit_file_path(s));
        if !same {
            self.scopes = scopes
                .iter()
                .filter_map(|s| cgroups.limit_file(s).ok())
                .collect();
        }
        self.capacity = snap.capacity;
        self.generation = Some(snap.generation);
    }

    /// The cheap check: the scope's size and each pod's usage counter.
    pub fn check(&mut self, cgroups: &CgroupFs) -> Check {
        let mut total = self.capacity;
        for s in &self.scopes {
            if let Ok(Some(limit)) = limit_of(s) {
                total = total.min(limit as i64);
            }
        }
        let usage = self
            .pods
            .iter_mut()
            .map(|p| (p.pod.sandbox_id.clone(), p.read_usage(cgroups)))
            .collect();
        Check {
            generation: self.generation.unwrap_or(0),
            total,
            usage,
        }
    }
}

impl ViewPod {
    /// The pod's usage counter now, opening it when it is not open.
    fn read_usage(&mut self, cgroups: &CgroupFs) -> Option<i64> {
        let cgroup = self.cgroup.as_deref()?;
        if self.usage.is_none() {
            self.usage = cgroups.usage_file(cgroup).ok();
        }
        match self.usage.as_ref()?.number() {
            Ok(n) => n.map(|n| n as i64),
            Err(err) => {
                tracing::debug!(%err, "pod usage not readable; opened again next round");
                self.usage = None;
                None
            }
        }
    }
}
