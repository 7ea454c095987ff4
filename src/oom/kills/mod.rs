//! Recording every kernel OOM kill in a pod: which container, its pod's
//! QoS class, and whether that pod was the one criguard ranked first.
//!
//! This is the measure of the dynamic `oom_score_adj` rule in production
//! (`oom::adjust`): when the kernel has to kill, it should kill in
//! criguard's first-ranked pod. The watcher is driven by containerd's task
//! events (`runtime::track`, whose [`TaskWatcher`] it is): a `/tasks/oom`
//! makes the task a suspect and its memory cgroup's `oom_kill` counter is read at once, again when the task
//! exits by SIGKILL and once more a second later; a counter that went up is
//! a kill (see [`crate::oom::history`]). The ranking at the time comes
//! from the adjuster's rounds ([`RankHistory`]), not from a second ranking.
//! Each kill is counted in `criguard_kernel_oom_kills_total{matched_rank}`,
//! logged once, and kept for `criguard evictions`.
//!
//! A SIGKILL exit alone is no evidence: on cgroup v1 an OOM notifies every
//! pod below the cgroup that ran out, and the kubelet stopping one of them
//! a moment later must not read as a kill. Those notifications reach
//! criguard one by one, the victim's possibly after containerd removed its
//! cgroup, so on v1 the first makes every live task a suspect and reads
//! it. The kernel counts the kill right after it notifies, well before the
//! notification has crossed the shim and containerd. On cgroup v2 with the
//! systemd driver the victim's scope can be gone before anyone reads it
//! (systemd removes an emptied scope at once; containerd then misses the
//! OOM too and reports the exit as `Error`). v2 counters are hierarchical, so the pod's cgroup still counts
//! the kill: what no readable container of the pod accounts for is the
//! gone task's, when its own `/tasks/oom` or its SIGKILL exit says it died.
//!
//! On cgroup v1 the kernel's log ([`kmsg`]) names each victim's cgroup too:
//! a named kill that no counter reading recorded, its cgroup gone, is
//! recorded from the log ([`OomKillWatcher::on_kernel_kill`]).
//!
//! Kills the events cannot reveal are missed: one while criguard was down,
//! or one on cgroup v1 of a process other than the container's init in a
//! global (not memcg) OOM, which raises no notification; the counters read
//! after each re-subscription catch the rest.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::lock::Locked;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use crate::cgroup::fs::{CgroupFs, Layout};
use crate::cgroup::path as cgroup_path;
use crate::model::NodeModel;
use crate::model::qos::QosClass;
use crate::oom::history::{RankHistory, kills_from_notification, new_kills};
use crate::runtime::events::TaskExit;
use crate::runtime::track::TaskWatcher;

pub mod kmsg;
mod record;

pub use record::{KEEP, OomKill, OomKills};

/// Labels of a kernel OOM kill.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OomKillLabels {
    /// True when the killed container's pod was criguard's first-ranked pod.
    pub matched_rank: bool,
}

/// Metrics of the kernel OOM kills the watcher records.
#[derive(Clone, Debug, Default)]
pub struct OomKillMetrics {
    /// Kernel OOM kills in pods, by whether the pod was criguard's first.
    pub kills: Family<OomKillLabels, Counter>,
}

impl OomKillMetrics {
    /// Registers every metric of the group.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "criguard_kernel_oom_kills",
            "Processes the kernel's OOM killer took from pods' containers, by whether the pod was the one criguard ranked first for memory at the time",
            self.kills.clone(),
        );
    }
}

/// The name recorded for a sandbox's own (pause) task.
pub const SANDBOX_TASK: &str = "(sandbox)";

/// When, after an OOM notification, a suspect's counter is read again
/// until it rises. The kernel notifies before it picks and kills its
/// victim, and on a loaded machine the notification can cross the shim and
/// containerd before the kill is counted; by the time the victim's exit
/// arrives its cgroup (and counter) may be gone (containerd 2 on cgroup
/// v1). Reads soon after the notification catch the count in between.
pub const RECHECKS: [Duration; 4] = [
    Duration::from_millis(5),
    Duration::from_millis(20),
    Duration::from_millis(100),
    RECHECK_AFTER,
];

/// The last read of a suspect's counter after its OOM notification.
pub const RECHECK_AFTER: Duration = Duration::from_secs(1);

/// Exited tasks whose last counter reading is kept (the most recent ones):
/// containerd 2 on a loaded machine can publish a task's `/tasks/oom`
/// after its exit, and that late notification must find the reading the
/// exit took, not count the kill again.
pub const GONE_KEEP: usize = 256;

/// What the watcher needs of a task, read from the model.
struct Target {
    sandbox_id: String,
    pod: String,
    uid: String,
    container: String,
    qos: QosClass,
    cgroup: String,
    /// The pod's own cgroup.
    pod_cgroup: Option<String>,
    /// Every task of the pod: its sandbox and its containers.
    tasks: Vec<String>,
    /// The task's creation time, ms since the epoch (0: not known yet).
    created_at_ms: u64,
}

/// Why a task's counter is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Look {
    /// Its own `/tasks/oom`, or on cgroup v1 one for any task (the
    /// notification may have reached its cgroup too).
    Notification,
    /// Its process ended by SIGKILL.
    Killed,
    /// A recheck, a sweep, or a sibling's look.
    Recheck,
}

fn target(model: &NodeModel, task_id: &str) -> Option<Target> {
    let (pod, container, created_at_ns) = match model.pod_of_container(task_id) {
        Some(p) => {
            let c = p.containers.get(task_id)?;
            let (name, at) = (c.name.clone(), c.created_at_ns);
            (p, name, at)
        }
        None => {
            let p = model.pod(task_id)?;
            let at = p.created_at_ns;
            (p, SANDBOX_TASK.to_owned(), at)
        }
    };
    Some(Target {
        // The pause task's cgroup sits where a container's would.
        cgroup: cgroup_path::container(&pod.cgroup_parent, task_id)?,
        pod_cgroup: cgroup_path::pod(&pod.cgroup_parent),
        tasks: std::iter::once(pod.sandbox_id.clone())
            .chain(pod.containers.keys().cloned())
            .collect(),
        sandbox_id: pod.sandbox_id,
        pod: format!("{}/{}", pod.namespace, pod.name),
        uid: pod.uid,
        container,
        qos: pod.qos,
        created_at_ms: u64::try_from(created_at_ns / 1_000_000).unwrap_or(0),
    })
}

/// A task notified of an OOM, awaiting its recheck.
#[derive(Debug)]
struct Suspect {
    notified_at_ms: u64,
    /// When the notification arrived: [`RECHECKS`] count from here.
    since: Instant,
    recheck_at: Instant,
}

/// Turns task events into recorded OOM kills; owned by the events loop.
#[derive(Debug)]
pub struct OomKillWatcher {
    cgroups: CgroupFs,
    seen: HashMap<String, u64>,
    /// Per pod (sandbox id), the kills its counter held at the baseline
    /// plus those recorded since: what its tasks account for (cgroup v2).
    accounted: HashMap<String, u64>,
    suspects: HashMap<String, Suspect>,
    /// Tasks whose init exited, oldest first; their `seen` readings are
    /// kept until [`GONE_KEEP`] newer ones exited.
    gone: VecDeque<String>,
    ranks: Arc<Mutex<RankHistory>>,
    store: OomKills,
    metrics: OomKillMetrics,
    /// When the baseline was read, ms since the epoch: a task created
    /// later has had every kill of its counter while criguard watched.
    baseline_ms: u64,
    /// Per task, the kills the kernel's log named (cgroup v1).
    logged: HashMap<String, u64>,
    /// Per task, the kills recorded.
    recorded: HashMap<String, u64>,
}

impl OomKillWatcher {
    /// A watcher reading cgroups under `cgroup_root`, matching kills against
    /// `ranks` and keeping them in `store`.
    pub fn new(cgroup_root: &Path, ranks: Arc<Mutex<RankHistory>>, store: OomKills) -> Self {
        Self {
            cgroups: CgroupFs::detect(cgroup_root),
            seen: HashMap::new(),
            accounted: HashMap::new(),
            suspects: HashMap::new(),
            gone: VecDeque::new(),
            ranks,
            store,
            metrics: OomKillMetrics::default(),
            baseline_ms: u64::MAX,
            logged: HashMap::new(),
            recorded: HashMap::new(),
        }
    }

    /// The same watcher, counting kills in `metrics` (by `matched_rank`).
    pub fn with_metrics(mut self, metrics: OomKillMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Reads every known task's counter as the starting point, so kills
    /// from before criguard started are not recorded as new.
    pub fn baseline(&mut self, model: &NodeModel) {
        self.baseline_ms = crate::clock::now_ms();
        let (sandboxes, containers) = model.ids();
        self.seen.clear();
        self.gone.clear();
        self.accounted.clear();
        for id in sandboxes.into_iter().chain(containers) {
            self.start_from_now(model, &id);
        }
    }

    /// Takes `id`'s counter (and, for a sandbox, its pod's) as read now as
    /// the starting point.
    fn start_from_now(&mut self, model: &NodeModel, id: &str) {
        let Some(t) = target(model, id) else { return };
        if let Ok(n) = self.cgroups.oom_kills(&t.cgroup) {
            self.seen.insert(id.to_owned(), n);
        }
        if t.sandbox_id == id
            && self.unified()
            && let Some(Ok(n)) = t.pod_cgroup.as_deref().map(|p| self.cgroups.oom_kills(p))
        {
            self.accounted.insert(t.sandbox_id, n);
        }
    }

    fn unified(&self) -> bool {
        self.cgroups.layout() == Layout::V2
    }

    /// Whether the kernel's log is needed ([`kmsg`]): on cgroup v1, whose
    /// counters are not hierarchical, so a removed cgroup takes its kill
    /// with it.
    pub fn wants_kernel_log(&self) -> bool {
        !self.unified()
    }

    /// The kernel's log named `memcg` as the cgroup of a process its OOM
    /// killer took: read like a notification of that task, and recorded
    /// from the log if the cgroup is gone before its counter recorded it.
    pub fn on_kernel_kill(&mut self, model: &NodeModel, memcg: &str, now: Instant) -> Vec<OomKill> {
        let id = kmsg::task_of(memcg);
        if target(model, id).is_none() {
            tracing::debug!(%memcg, "kernel OOM kill outside the model's tasks");
            return Vec::new();
        }
        *self.logged.entry(id.to_owned()).or_insert(0) += 1;
        let at_ms = crate::clock::now_ms();
        self.suspect(id, at_ms, now);
        self.check(model, id, at_ms, Look::Notification)
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
        if self.exited(task_id) && self.store.mark_notified(task_id) {
            // Published after the exit that recorded the kill.
            tracing::debug!(task = task_id, "OOM notification after the recorded kill");
            return Vec::new();
        }
        self.suspect(task_id, at_ms, now);
        let mut out = self.check(model, task_id, at_ms, Look::Notification);
        if !self.unified() {
            // v1 notifies every cgroup below the one that ran out, but
            // containerd passes the notifications on one at a time: the
            // victim's own can come after its exit has removed its cgroup,
            // the kill unread. Which cgroup ran out is not said (the pods'
            // own, e.g., notifies every pod), so every live task is read at
            // the first notification and rechecked like the notified one.
            let (sandboxes, containers) = model.ids();
            for id in sandboxes.into_iter().chain(containers) {
                if !self.suspects.contains_key(&id) && !self.exited(&id) {
                    self.suspect(&id, at_ms, now);
                    out.extend(self.check(model, &id, at_ms, Look::Notification));
                }
            }
        }
        out
    }

    /// Makes `task_id` a suspect notified at `at_ms`, its rechecks
    /// ([`RECHECKS`]) counted from `now`.
    fn suspect(&mut self, task_id: &str, at_ms: u64, now: Instant) {
        let s = self.suspects.entry(task_id.to_owned()).or_insert(Suspect {
            notified_at_ms: at_ms,
            since: now,
            recheck_at: now + RECHECKS[0],
        });
        s.since = now;
        s.recheck_at = now + RECHECKS[0];
    }

    /// `/tasks/exit`: a process killed by SIGKILL may be the OOM killer's
    /// victim; a task whose init exited is forgotten afterwards.
    pub fn on_exit(&mut self, model: &NodeModel, exit: &TaskExit) -> Vec<OomKill> {
        let id = exit.container_id.as_str();
        let found = if exit.sigkilled() {
            self.check(model, id, exit.exited_at_unix_ms, Look::Killed)
        } else {
            Vec::new()
        };
        if exit.is_init() {
            self.suspects.remove(id);
            self.forget_later(id);
        }
        found
    }

    /// Keeps `id`'s reading for a late notification, and forgets the
    /// readings of the tasks that exited [`GONE_KEEP`] exits ago.
    fn forget_later(&mut self, id: &str) {
        if !self.exited(id) {
            self.gone.push_back(id.to_owned());
        }
        while self.gone.len() > GONE_KEEP {
            if let Some(old) = self.gone.pop_front() {
                self.seen.remove(&old);
                self.logged.remove(&old);
                self.recorded.remove(&old);
            }
        }
    }

    /// Whether `id`'s init exited among the last [`GONE_KEEP`] exits.
    fn exited(&self, id: &str) -> bool {
        self.gone.iter().any(|g| g == id)
    }

    /// When the next recheck is due.
    pub fn deadline(&self) -> Option<Instant> {
        self.suspects.values().map(|s| s.recheck_at).min()
    }

    /// Rechecks the suspects due at `now`; one whose counter rose, or
    /// whose last recheck this was, is forgotten, the others wait for
    /// their next one ([`RECHECKS`]).
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
            let found = self.check(model, &id, at, Look::Recheck);
            let since = self.suspects[&id].since;
            let next = RECHECKS.iter().map(|d| since + *d).find(|t| *t > now);
            match next {
                Some(t) if found.is_empty() => {
                    if let Some(s) = self.suspects.get_mut(&id) {
                        s.recheck_at = t;
                    }
                }
                _ => {
                    self.suspects.remove(&id);
                }
            }
            out.extend(found);
        }
        out
    }

    /// Reads every known task's counter (after events may have been
    /// missed: a re-subscription) and records what went up since the last
    /// reading; a task read for the first time only sets its starting point.
    pub fn sweep(&mut self, model: &NodeModel, at_ms: u64) -> Vec<OomKill> {
        let (sandboxes, containers) = model.ids();
        self.accounted.retain(|id, _| sandboxes.contains(id));
        let live: Vec<String> = sandboxes.into_iter().chain(containers).collect();
        self.seen.retain(|id, _| live.contains(id));
        let gone = &self.gone;
        let kept = |id: &String| live.contains(id) || gone.contains(id);
        self.logged.retain(|id, _| kept(id));
        self.recorded.retain(|id, _| kept(id));
        let mut out = Vec::new();
        for id in &live {
            if self.seen.contains_key(id) || self.created_since_baseline(model, id) {
                // Read before, or created while criguard watched (its
                // counter started at 0 then): what it holds is new.
                out.extend(self.check(model, id, at_ms, Look::Recheck));
            } else {
                // First read of a task from before the baseline: its past
                // kills cannot be dated, so they are its starting point.
                self.start_from_now(model, id);
            }
        }
        out
    }

    /// Whether `id` was created after the baseline (its creation time known).
    fn created_since_baseline(&self, model: &NodeModel, id: &str) -> bool {
        target(model, id).is_some_and(|t| t.created_at_ms > self.baseline_ms)
    }

    /// Reads `task_id`'s counter and records what is new, with what its
    /// pod's counter says when its own cgroup is gone (see the module docs).
    fn check(&mut self, model: &NodeModel, task_id: &str, at_ms: u64, why: Look) -> Vec<OomKill> {
        let Some(t) = target(model, task_id) else {
            tracing::debug!(task = task_id, "OOM check: task not in the model");
            return Vec::new();
        };
        let suspect = self.suspects.get(task_id);
        let notified = suspect.is_some() || why == Look::Notification;
        let at_ms = suspect.map_or(at_ms, |s| s.notified_at_ms);
        let mut out = Vec::new();
        let kills = match self.cgroups.oom_kills(&t.cgroup) {
            Ok(now) => {
                let n = new_kills(self.seen.get(task_id).copied(), now);
                self.seen.insert(task_id.to_owned(), now);
                n
            }
            Err(e)
                if e.source.kind() == std::io::ErrorKind::NotFound
                    && why != Look::Recheck
                    && self.unified() =>
            {
                // The pod's readable tasks first: their kills are theirs.
                for sibling in t.tasks.iter().filter(|id| *id != task_id) {
                    out.extend(self.check(model, sibling, at_ms, Look::Recheck));
                }
                match t.pod_cgroup.as_deref().map(|p| self.cgroups.oom_kills(p)) {
                    Some(Ok(now)) => new_kills(self.accounted.get(&t.sandbox_id).copied(), now),
                    _ => kills_from_notification(why == Look::Notification),
                }
            }
            Err(e) if e.source.kind() == std::io::ErrorKind::NotFound => {
                // v1: gone, and its counter with it. What the kernel's log
                // named beyond what was recorded is the gone task's.
                let logged = self.logged.get(task_id).copied().unwrap_or(0);
                let recorded = self.recorded.get(task_id).copied().unwrap_or(0);
                if logged == 0 {
                    tracing::debug!(err = %e, "OOM check: counter not read");
                }
                logged.saturating_sub(recorded)
            }
            Err(e) => {
                tracing::debug!(err = %e, "OOM check: counter not read");
                0
            }
        };
        if kills > 0 {
            out.push(self.record(model, t, task_id, kills, at_ms, notified));
        }
        out
    }

    /// Counts, logs and keeps one record.
    fn record(
        &mut self,
        model: &NodeModel,
        t: Target,
        task_id: &str,
        kills: u64,
        at_ms: u64,
        notified: bool,
    ) -> OomKill {
        *self.accounted.entry(t.sandbox_id.clone()).or_insert(0) += kills;
        *self.recorded.entry(task_id.to_owned()).or_insert(0) += kills;
        let first = self.ranks.locked().first_at(at_ms).map(str::to_owned);
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
        self.metrics
            .kills
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
        kill
    }
}

/// The events loop's calls, the kills found each time recorded (counted,
/// logged, kept) by the calls themselves.
impl TaskWatcher for OomKillWatcher {
    fn baseline(&mut self, model: &NodeModel) {
        OomKillWatcher::baseline(self, model);
    }

    fn on_exit(&mut self, model: &NodeModel, exit: &TaskExit) {
        OomKillWatcher::on_exit(self, model, exit);
    }

    fn on_oom(&mut self, model: &NodeModel, task: &str, at_unix_ms: u64, now: Instant) {
        OomKillWatcher::on_oom(self, model, task, at_unix_ms, now);
    }

    fn on_kernel_kill(&mut self, model: &NodeModel, memcg: &str, now: Instant) {
        OomKillWatcher::on_kernel_kill(self, model, memcg, now);
    }

    fn deadline(&self) -> Option<Instant> {
        OomKillWatcher::deadline(self)
    }

    fn on_deadline(&mut self, model: &NodeModel, now: Instant) {
        OomKillWatcher::on_deadline(self, model, now);
    }

    fn sweep(&mut self, model: &NodeModel, now_ms: u64) {
        OomKillWatcher::sweep(self, model, now_ms);
    }
}

#[cfg(test)]
mod tests;
