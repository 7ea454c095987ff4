//! Recording every kernel OOM kill in a pod: which container, its pod's
//! QoS class, and whether that pod was the one criguard ranked first.
//!
//! This is the measure of the dynamic `oom_score_adj` rule in production
//! (`reclaim::oom_adjust`): when the kernel has to kill, it should kill in
//! criguard's first-ranked pod. The watcher is driven by containerd's task
//! events (`model::events`): a `/tasks/oom` makes the task a suspect and its
//! memory cgroup's `oom_kill` counter is read at once, again when the task
//! exits by SIGKILL and once more a second later; a counter that went up is
//! a kill (see [`crate::policy::oom_kill`]). The ranking at the time comes
//! from the adjuster's rounds ([`RankHistory`]), not from a second ranking.
//! Each kill is counted in `criguard_kernel_oom_kills_total{matched_rank}`,
//! logged once, and kept for `criguard evictions`.
//!
//! Kills the events cannot reveal are missed: one while criguard was down,
//! or one on cgroup v1 of a process other than the container's init in a
//! global (not memcg) OOM, which raises no notification; the counters read
//! after each re-subscription catch the rest.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::metrics::OomKillLabels;
use crate::model::{NodeModel, QosClass, container_cgroup};
use crate::policy::oom_kill::{RankHistory, new_kills};
use crate::runtime::events::TaskExit;
use crate::signals::memory::CgroupFs;
use crate::signals::usage::pod_cgroup;

/// The name recorded for a sandbox's own (pause) task.
pub const SANDBOX_TASK: &str = "(sandbox)";

/// How long after an OOM notification a suspect's counter is read once more.
pub const RECHECK_AFTER: Duration = Duration::from_secs(1);

/// How many kills are kept for `criguard evictions` (oldest dropped first).
pub const KEEP: usize = 1024;

/// One kernel OOM kill (or several at once) in a container.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OomKill {
    /// When: the OOM notification's time, else the exit's or the reading's;
    /// ms since the epoch.
    pub at_unix_ms: u64,
    /// `namespace/name` of the pod.
    pub pod: String,
    /// Pod UID.
    pub uid: String,
    /// Sandbox id.
    pub sandbox_id: String,
    /// Container name ([`SANDBOX_TASK`] for the pause task).
    pub container: String,
    /// Container id (the sandbox id for the pause task).
    pub container_id: String,
    /// The pod's QoS class.
    pub qos: QosClass,
    /// Processes killed (the counter's increase).
    pub kills: u64,
    /// `namespace/name` of the pod criguard ranked first then, if any.
    pub first_ranked: Option<String>,
    /// True when the killed container's pod was criguard's first.
    pub matched_rank: bool,
    /// True when containerd's `/tasks/oom` for this task came first.
    pub notified: bool,
}

/// The kills recorded since start; clones share them.
#[derive(Clone, Debug, Default)]
pub struct OomKills {
    list: Arc<RwLock<Vec<OomKill>>>,
}

impl OomKills {
    /// Every kill kept, oldest first.
    pub fn list(&self) -> Vec<OomKill> {
        self.list.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn push(&self, kill: OomKill) {
        let mut l = self.list.write().unwrap_or_else(|e| e.into_inner());
        if l.len() == KEEP {
            l.remove(0);
        }
        l.push(kill);
    }
}

/// What the watcher needs of a task, read from the model.
struct Target {
    sandbox_id: String,
    pod: String,
    uid: String,
    container: String,
    qos: QosClass,
    cgroup: String,
}

fn target(model: &NodeModel, task_id: &str) -> Option<Target> {
    let (pod, container) = match model.pod_of_container(task_id) {
        Some(p) => {
            let name = p.containers.get(task_id)?.name.clone();
            (p, name)
        }
        None => (model.pod(task_id)?, SANDBOX_TASK.to_owned()),
    };
    Some(Target {
        cgroup: container_cgroup(&pod_cgroup(&pod.cgroup_parent), task_id),
        sandbox_id: pod.sandbox_id,
        pod: format!("{}/{}", pod.namespace, pod.name),
        uid: pod.uid,
        container,
        qos: pod.qos,
    })
}

/// A task notified of an OOM, awaiting its recheck.
#[derive(Debug)]
struct Suspect {
    notified_at_ms: u64,
    recheck_at: Instant,
}

/// Turns task events into recorded OOM kills; owned by the events loop.
#[derive(Debug)]
pub struct OomKillWatcher {
    cgroups: CgroupFs,
    seen: HashMap<String, u64>,
    suspects: HashMap<String, Suspect>,
    ranks: Arc<Mutex<RankHistory>>,
    store: OomKills,
    counter: Family<OomKillLabels, Counter>,
}

impl OomKillWatcher {
    /// A watcher reading cgroups under `cgroup_root`, matching kills against
    /// `ranks` and keeping them in `store`.
    pub fn new(cgroup_root: &Path, ranks: Arc<Mutex<RankHistory>>, store: OomKills) -> Self {
        Self {
            cgroups: CgroupFs::detect(cgroup_root),
            seen: HashMap::new(),
            suspects: HashMap::new(),
            ranks,
            store,
            counter: Family::default(),
        }
    }

    /// The same watcher, counting kills in `counter` (by `matched_rank`).
    pub fn with_metrics(mut self, counter: Family<OomKillLabels, Counter>) -> Self {
        self.counter = counter;
        self
    }

    /// Reads every known task's counter as the starting point, so kills
    /// from before criguard started are not recorded as new.
    pub fn baseline(&mut self, model: &NodeModel) {
        let (sandboxes, containers) = model.ids();
        self.seen.clear();
        for id in sandboxes.into_iter().chain(containers) {
            if let Some(t) = target(model, &id)
                && let Ok(n) = self.cgroups.oom_kills(&t.cgroup)
            {
                self.seen.insert(id, n);
            }
        }
    }

    /// `/tasks/oom` for `task_id` at `at_ms`: reads its counter now and
    /// schedules a recheck.
    pub fn on_oom(
        &mut self,
        model: &NodeModel,
        task_id: &str,
        at_ms: u64,
        now: Instant,
    ) -> Vec<OomKill> {
        let s = self.suspects.entry(task_id.to_owned()).or_insert(Suspect {
            notified_at_ms: at_ms,
            recheck_at: now + RECHECK_AFTER,
        });
        s.recheck_at = now + RECHECK_AFTER;
        self.check(model, task_id, at_ms).into_iter().collect()
    }

    /// `/tasks/exit`: a process killed by SIGKILL may be the OOM killer's
    /// victim; a task whose init exited is forgotten afterwards.
    pub fn on_exit(&mut self, model: &NodeModel, exit: &TaskExit) -> Vec<OomKill> {
        let id = exit.container_id.as_str();
        let found = if exit.sigkilled() {
            self.check(model, id, exit.exited_at_unix_ms)
        } else {
            None
        };
        if exit.is_init() {
            self.suspects.remove(id);
            self.seen.remove(id);
        }
        found.into_iter().collect()
    }

    /// When the next recheck is due.
    pub fn deadline(&self) -> Option<Instant> {
        self.suspects.values().map(|s| s.recheck_at).min()
    }

    /// Rechecks the suspects due at `now`, then forgets them.
    pub fn on_deadline(&mut self, model: &NodeModel, now: Instant) -> Vec<OomKill> {
        let due: Vec<String> = self
            .suspects
            .iter()
            .filter(|(_, s)| s.recheck_at <= now)
            .map(|(id, _)| id.clone())
            .collect();
        let mut out = Vec::new();
        for id in due {
            let at = self.suspects[&id].notified_at_ms;
            out.extend(self.check(model, &id, at));
            self.suspects.remove(&id);
        }
        out
    }

    /// Reads every known task's counter (after events may have been
    /// missed: a re-subscription) and records what went up since the last
    /// reading; a task read for the first time only sets its starting point.
    pub fn sweep(&mut self, model: &NodeModel, at_ms: u64) -> Vec<OomKill> {
        let (sandboxes, containers) = model.ids();
        let live: Vec<String> = sandboxes.into_iter().chain(containers).collect();
        self.seen.retain(|id, _| live.contains(id));
        let mut out = Vec::new();
        for id in &live {
            if self.seen.contains_key(id) {
                out.extend(self.check(model, id, at_ms));
            } else if let Some(t) = target(model, id)
                && let Ok(n) = self.cgroups.oom_kills(&t.cgroup)
            {
                // First read of a task learned meanwhile: its past kills
                // cannot be dated, so they are its starting point.
                self.seen.insert(id.clone(), n);
            }
        }
        out
    }

    fn check(&mut self, model: &NodeModel, task_id: &str, at_ms: u64) -> Option<OomKill> {
        let Some(t) = target(model, task_id) else {
            tracing::debug!(task = task_id, "OOM check: task not in the model");
            return None;
        };
        let suspect = self.suspects.get(task_id);
        let notified = suspect.is_some();
        let at_ms = suspect.map_or(at_ms, |s| s.notified_at_ms);
        let kills = match self.cgroups.oom_kills(&t.cgroup) {
            Ok(now) => {
                let n = new_kills(self.seen.get(task_id).copied(), now);
                self.seen.insert(task_id.to_owned(), now);
                n
            }
            Err(e) => {
                tracing::debug!(err = %e, "OOM check: counter not read");
                0
            }
        };
        if kills == 0 {
            return None;
        }
        let first = self
            .ranks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .first_at(at_ms)
            .map(str::to_owned);
        let kill = OomKill {
            at_unix_ms: at_ms,
            matched_rank: first.as_deref() == Some(t.sandbox_id.as_str()),
            first_ranked: first.map(|sb| {
                model
                    .sandbox_info(&sb)
                    .map_or(sb, |s| format!("{}/{}", s.namespace, s.name))
            }),
            pod: t.pod,
            uid: t.uid,
            sandbox_id: t.sandbox_id,
            container: t.container,
            container_id: task_id.to_owned(),
            qos: t.qos,
            kills,
            notified,
        };
        self.counter
            .get_or_create(&OomKillLabels {
                matched_rank: kill.matched_rank,
            })
            .inc_by(kills);
        tracing::warn!(
            pod = %kill.pod,
            container = %kill.container,
            container_id = %kill.container_id,
            qos = ?kill.qos,
            kills,
            matched_rank = kill.matched_rank,
            first_ranked = kill.first_ranked.as_deref().unwrap_or("none"),
            notified,
            "kernel OOM kill in a pod"
        );
        self.store.push(kill.clone());
        Some(kill)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ContainerInfo, ContainerState, SandboxInfo, SandboxState};
    use crate::signals::write_fixture as write;

    /// A v1 fixture: pods "x" (BestEffort, container cx) and "y"
    /// (Burstable, container cy), every counter at 0.
    fn fixture() -> (tempfile::TempDir, NodeModel) {
        let t = tempfile::tempdir().unwrap();
        let mut m = NodeModel::new(1 << 30);
        for (sb, c, qos) in [("sx", "cx", "besteffort"), ("sy", "cy", "burstable")] {
            let parent = format!("/kubepods/{qos}/pod{sb}");
            m.upsert_sandbox(SandboxInfo {
                id: sb.into(),
                name: sb.trim_start_matches('s').into(),
                namespace: "ns".into(),
                uid: format!("uid-{sb}"),
                cgroup_parent: parent.clone(),
                state: Some(SandboxState::Ready),
                ..Default::default()
            });
            m.upsert_container(ContainerInfo {
                id: c.into(),
                sandbox_id: sb.into(),
                name: "app".into(),
                oom_score_adj: if qos == "besteffort" { 1000 } else { 900 },
                state: Some(ContainerState::Running),
                ..Default::default()
            });
            for task in [sb, c] {
                set(t.path(), &format!("{parent}/{task}"), 0);
            }
        }
        (t, m)
    }

    fn set(root: &Path, cgroup: &str, kills: u64) {
        write(
            root,
            &format!("memory{cgroup}/memory.oom_control"),
            &format!("oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n"),
        );
    }

    fn watcher(root: &Path, first: &str) -> OomKillWatcher {
        let mut ranks = RankHistory::default();
        ranks.record(1_000, Some(first.into()));
        OomKillWatcher::new(root, Arc::new(Mutex::new(ranks)), OomKills::default())
    }

    fn exit(id: &str, status: u32) -> TaskExit {
        TaskExit {
            container_id: id.into(),
            process_id: id.into(),
            pid: 1,
            exit_status: status,
            exited_at_unix_ms: 3_000,
        }
    }

    #[test]
    fn a_notification_to_every_cgroup_records_only_the_one_that_lost_a_process() {
        let (t, m) = fixture();
        let mut w = watcher(t.path(), "sx");
        w.baseline(&m);
        set(t.path(), "/kubepods/besteffort/podsx/cx", 1);
        let now = Instant::now();
        // cgroup v1: every task below the OOMing cgroup is notified.
        let mut kills = Vec::new();
        for task in ["sx", "cx", "sy", "cy"] {
            kills.extend(w.on_oom(&m, task, 2_000, now));
        }
        assert_eq!(kills.len(), 1, "{kills:#?}");
        let k = &kills[0];
        assert_eq!((k.pod.as_str(), k.container.as_str()), ("ns/x", "app"));
        assert_eq!(
            (k.qos, k.kills, k.at_unix_ms),
            (QosClass::BestEffort, 1, 2_000)
        );
        assert!(k.matched_rank && k.notified);
        assert_eq!(k.first_ranked.as_deref(), Some("ns/x"));
        // The recheck a second later finds nothing new, and ends.
        assert_eq!(w.deadline(), Some(now + RECHECK_AFTER));
        assert!(w.on_deadline(&m, now + RECHECK_AFTER).is_empty());
        assert_eq!(w.deadline(), None);
        assert_eq!(w.store.list(), kills);
    }

    #[test]
    fn a_kill_in_another_pod_than_the_first_ranked_does_not_match() {
        let (t, m) = fixture();
        let mut w = watcher(t.path(), "sx");
        w.baseline(&m);
        let now = Instant::now();
        // Counted only after the notification was read: the recheck finds it.
        assert!(w.on_oom(&m, "cy", 2_000, now).is_empty());
        set(t.path(), "/kubepods/burstable/podsy/cy", 1);
        let kills = w.on_deadline(&m, now + RECHECK_AFTER);
        assert_eq!(kills.len(), 1);
        assert_eq!(
            (kills[0].qos, kills[0].matched_rank),
            (QosClass::Burstable, false)
        );
        assert_eq!(kills[0].first_ranked.as_deref(), Some("ns/x"));
    }

    #[test]
    fn a_notified_task_stopped_by_sigkill_is_no_kill_without_its_counter() {
        // cgroup v1: the OOM notified x too; the kubelet then stops x
        // (SIGKILL) and its cgroup is removed. Not the OOM killer's doing.
        let (t, m) = fixture();
        let mut w = watcher(t.path(), "sx");
        w.baseline(&m);
        let now = Instant::now();
        assert!(w.on_oom(&m, "cx", 2_000, now).is_empty());
        std::fs::remove_dir_all(t.path().join("memory/kubepods/besteffort/podsx/cx")).unwrap();
        assert!(w.on_exit(&m, &exit("cx", 137)).is_empty());
        assert_eq!(w.deadline(), None, "the task is gone");
        // The victim's own exit, counter up: the kill is recorded there.
        assert!(w.on_oom(&m, "cy", 2_000, now).is_empty());
        set(t.path(), "/kubepods/burstable/podsy/cy", 1);
        let kills = w.on_exit(&m, &exit("cy", 137));
        assert_eq!(
            (kills.len(), kills[0].matched_rank, kills[0].notified),
            (1, false, true)
        );
    }

    #[test]
    fn kills_from_before_the_baseline_are_not_new_and_a_sweep_finds_missed_ones() {
        let (t, m) = fixture();
        set(t.path(), "/kubepods/besteffort/podsx/cx", 4);
        let mut w = watcher(t.path(), "sx");
        w.baseline(&m);
        assert!(w.sweep(&m, 5_000).is_empty());
        set(t.path(), "/kubepods/besteffort/podsx/cx", 6);
        let kills = w.sweep(&m, 5_000);
        assert_eq!(
            (kills.len(), kills[0].kills, kills[0].notified),
            (1, 2, false)
        );
        // An exec killed by SIGKILL leaves its container known.
        let mut exec = exit("cx", 137);
        exec.process_id = "exec-1".into();
        set(t.path(), "/kubepods/besteffort/podsx/cx", 7);
        assert_eq!(w.on_exit(&m, &exec).len(), 1);
        assert_eq!(w.seen.get("cx"), Some(&7));
    }
}
