//! Keeping the kernel's OOM choice in line with criguard's ranking.
//!
//! A round ranks the running pods by working set
//! ([`crate::eviction::rank::order::rank_memory`]), computes target scores
//! ([`crate::oom::scores::dynamic_scores`]) and writes them to
//! `/proc/<pid>/oom_score_adj` of the processes in each container's cgroup.
//! Containers it changed earlier and no longer needs to change get the
//! kubelet's value back.
//!
//! Rounds run every second, so a round in which nothing changed must cost
//! next to nothing, whatever the number of pods:
//! - **the cheap check** ([`View::check`]): the model's generation, the
//!   pods' scope limit and each running pod's usage counter, read with one
//!   `pread(2)` on a file held open. When none moved
//!   ([`crate::oom::scores::decide`]: no pod started or stopped, the scope
//!   the same, no usage moved by more than one step of the formula, the
//!   last decision younger than [`REFRESH`]) the round stops there: the
//!   last decision stands, nothing else is read, nothing is written;
//! - **a decision** reads each pod's `memory.stat` for its working set,
//!   ranks, and reads a container's own usage only where its pod's usage
//!   says it could need a bound ([`crate::oom::scores::may_need_bound`]);
//! - **writes** go only to containers whose wanted score differs from what
//!   criguard last set ([`crate::oom::scores::plan_writes`]); their
//!   processes are listed then, fresh, and only processes whose score
//!   differs are written. Every [`VERIFY`] a decision lists and checks every
//!   container with a target anyway, which finds processes that joined a
//!   container since (an exec) with the kubelet's score.
//!
//! A write that fails (a value below what this host lets criguard set) is
//! logged once and tried again at the next decision; a process that exited
//! meanwhile is no failure. Nothing here ever affects the CRI path.
//!
//! Each round's first-ranked pod is also recorded in a [`RankHistory`], so
//! that a kernel OOM kill can be matched against the ranking of its moment
//! (`oom::kills`). With the dynamic rule off the adjuster still
//! ranks (and writes nothing), so the kills are matched either way.

mod view;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::cgroup::fs::CgroupFs;
use crate::eviction::rank::memory_input;
use crate::eviction::rank::order::rank_memory;
use crate::lock::{Locked, RwLocked};
use crate::model::{ContainerState, NodeModel};
use crate::oom::history::RankHistory;
use crate::oom::scores::{
    Check, ContainerMemory, Known, Reason, Why, Write, decide, may_need_bound, plan_writes,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use view::View;

/// Metrics of the dynamic `oom_score_adj` adjuster.
#[derive(Clone, Debug, Default)]
pub struct OomMetrics {
    /// Processes whose score criguard wrote.
    pub writes: Counter,
    /// Rounds that ranked the pods for memory (with or without writes).
    pub rounds: Counter,
}

impl OomMetrics {
    /// Registers every metric of the group.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "criguard_oom_score_adj_writes",
            "Processes whose oom_score_adj criguard set to follow its memory ranking",
            self.writes.clone(),
        );
        registry.register(
            "criguard_oom_rank_rounds",
            "Rounds of the oom_score_adj adjuster, each ranking the pods for memory: the ranking kernel OOM kills are matched against",
            self.rounds.clone(),
        );
    }
}

/// The longest a decision stands while no counter moves: working sets can
/// drift while usage stands (file pages going inactive), and the kubelet
/// itself looks every 10 s.
pub const REFRESH: Duration = Duration::from_secs(10);

/// How often a decision lists and checks the processes of every container
/// with a target, not only of those whose target changed.
pub const VERIFY: Duration = Duration::from_secs(60);

/// What one round did, for logs and tests.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Round {
    /// The pod the kernel should pick first, if any.
    pub first_victim: Option<String>,
    /// Why this round decided again; `None`: the last decision stood and
    /// nothing beyond the cheap check was read.
    pub decided: Option<Why>,
    /// Container id → score written this round (a process changed).
    pub written: HashMap<String, i64>,
}

/// Adjusts `oom_score_adj` of running containers; holds what it changed.
#[derive(Debug)]
pub struct OomAdjuster {
    model: Arc<RwLock<NodeModel>>,
    cgroups: CgroupFs,
    proc_root: PathBuf,
    view: View,
    /// The check the last decision was taken on, and when.
    last: Option<(Check, Instant)>,
    /// The last decision's first-ranked pod.
    first_victim: Option<String>,
    /// Container id → the scores criguard set for its processes.
    known: HashMap<String, Known>,
    /// When every container's processes were last checked.
    verified_at: Option<Instant>,
    /// (container, score) writes that failed and were logged, so each is said once.
    failed: HashSet<(String, i64)>,
    metrics: OomMetrics,
    /// Where each round's first-ranked pod is recorded.
    ranks: Arc<Mutex<RankHistory>>,
    /// False: rank and record only (`--dynamic-oom-score-adj=false`).
    write: bool,
}

impl OomAdjuster {
    /// An adjuster over `model`, reading cgroups at `cgroup_root` and writing
    /// under `proc_root` (normally `/sys/fs/cgroup` and `/proc`).
    pub fn new(model: Arc<RwLock<NodeModel>>, cgroup_root: PathBuf, proc_root: PathBuf) -> Self {
        Self {
            model,
            cgroups: CgroupFs::detect(&cgroup_root),
            proc_root,
            view: View::default(),
            last: None,
            first_victim: None,
            known: HashMap::new(),
            verified_at: None,
            failed: HashSet::new(),
            metrics: OomMetrics::default(),
            ranks: Arc::default(),
            write: true,
        }
    }

    /// The same adjuster, recording each round's first-ranked pod in `ranks`.
    pub fn with_rank_history(mut self, ranks: Arc<Mutex<RankHistory>>) -> Self {
        self.ranks = ranks;
        self
    }

    /// The same adjuster ranking only: scores stay the kubelet's.
    pub fn rank_only(mut self) -> Self {
        self.write = false;
        self
    }

    /// The same adjuster, counting its writes in `metrics`.
    pub fn with_metrics(mut self, metrics: OomMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// One round: the cheap check; when something changed, decide, record
    /// the first-ranked pod and write what differs.
    pub fn round(&mut self) -> Round {
        let at = Instant::now();
        let started_ms = crate::clock::now_ms();
        // The lock is held only to derive the pods; the cgroup files are
        // opened after it is released (the relay thread writes the model).
        let wanted = {
            let m = self.model.read_locked();
            self.view.wanted(&m)
        };
        if let Some(snap) = wanted {
            self.view.update(snap, &self.cgroups);
        }
        let check = self.view.check(&self.cgroups);
        let why = decide(
            self.last.as_ref().map(|(c, t)| (c, *t)),
            &check,
            at,
            REFRESH,
        );
        let mut round = Round {
            decided: why.clone(),
            ..Round::default()
        };
        if let Some(why) = why {
            tracing::trace!(?why, "oom_score_adj: deciding again");
            round.written = self.decide(&check, at);
            self.last = Some((check, at));
        }
        round.first_victim = self.first_victim.clone();
        self.ranks
            .locked()
            .record(started_ms, round.first_victim.clone());
        self.metrics.rounds.inc();
        round
    }

    /// Ranks on fresh working sets and writes what differs; returns the
    /// scores written.
    fn decide(&mut self, check: &Check, at: Instant) -> HashMap<String, i64> {
        let working_sets = self.working_sets(check);
        let inputs: Vec<_> = self
            .view
            .pods
            .iter()
            .map(|p| memory_input(&p.pod, working_sets[p.pod.sandbox_id.as_str()]))
            .collect();
        self.first_victim = rank_memory(&inputs).first().map(|p| p.sandbox_id.clone());
        if !self.write {
            return HashMap::new();
        }
        let first = self.first_victim.clone();
        let (containers, cgroup_of) =
            self.running_containers(first.as_deref(), &working_sets, check.total);
        let verify = verify_due(self.verified_at, at);
        if verify {
            self.verified_at = Some(at);
        }
        let writes = plan_writes(
            first.as_deref(),
            &containers,
            check.total,
            &self.known,
            verify,
        );
        let mut written = HashMap::new();
        for w in writes {
            let c = containers.iter().find(|c| c.id == w.id);
            let (Some(c), Some(cgroup)) = (c, cgroup_of.get(&w.id)) else {
                continue;
            };
            if let Some(score) = self.apply(c, cgroup, &w) {
                written.insert(w.id.clone(), score);
            }
        }
        self.forget_gone();
        written
    }

    /// Each running pod's working set, by sandbox id, from the usage the
    /// check read (`None`: not readable).
    fn working_sets(&self, check: &Check) -> HashMap<String, Option<i64>> {
        let usage = |id: &str| check.usage.get(id).copied().flatten();
        let mut working_sets = HashMap::new();
        for p in &self.view.pods {
            let ws = p.cgroup.as_deref().and_then(|cg| {
                let u = usage(&p.pod.sandbox_id)?;
                self.cgroups.working_set_from(cg, u as u64).ok()
            });
            working_sets.insert(p.pod.sandbox_id.clone(), ws.map(|w| w as i64));
        }
        working_sets
    }

    /// The running containers as the score policy sees them, and their
    /// cgroups by container id. A container's working set is read only
    /// when its score may depend on it: not for the first victim's, nor
    /// for one whose whole pod needs no bound; one not readable is left out.
    fn running_containers(
        &self,
        first: Option<&str>,
        working_sets: &HashMap<String, Option<i64>>,
        total: i64,
    ) -> (Vec<ContainerMemory>, HashMap<String, String>) {
        let mut containers = Vec::new();
        let mut cgroup_of = HashMap::new();
        for p in &self.view.pods {
            let id = p.pod.sandbox_id.as_str();
            let running = p
                .pod
                .containers
                .values()
                .filter(|c| c.state == ContainerState::Running && !c.cgroup_path.is_empty());
            for c in running {
                let usage = if first == Some(id)
                    || !may_need_bound(c.oom_score_adj, working_sets[id], total)
                {
                    0
                } else {
                    match self.cgroups.working_set(&c.cgroup_path) {
                        Ok(ws) => ws as i64,
                        Err(err) => {
                            tracing::debug!(%err, "container usage not readable; skipped");
                            continue;
                        }
                    }
                };
                cgroup_of.insert(c.id.clone(), c.cgroup_path.clone());
                containers.push(ContainerMemory {
                    id: c.id.clone(),
                    sandbox_id: id.to_owned(),
                    kubelet_adj: c.oom_score_adj,
                    usage,
                });
            }
        }
        (containers, cgroup_of)
    }

    /// Forgets what is known of containers no longer in the view.
    fn forget_gone(&mut self) {
        let live: BTreeSet<&str> = self
            .view
            .pods
            .iter()
            .flat_map(|p| p.pod.containers.keys().map(String::as_str))
            .collect();
        self.known.retain(|id, _| live.contains(id.as_str()));
        self.failed.retain(|(id, _)| live.contains(id.as_str()));
    }

    /// Writes `w` to the processes of container `c` at `cgroup`, records
    /// what is now known of them, and logs a change; returns the score when
    /// a process was changed.
    fn apply(&mut self, c: &ContainerMemory, cgroup: &str, w: &Write) -> Option<i64> {
        let (score, exact) = match w.want {
            Known::Exactly(s) => (s, true),
            Known::AtMost(s) => (s, false),
        };
        let outcome = self.write_all(cgroup, score, exact)?;
        if outcome.failed {
            if self.failed.insert((c.id.clone(), score)) {
                tracing::warn!(container = %c.id, to = score, "cannot set oom_score_adj of every process; tried again at the next decision");
            }
        } else if w.reason == Reason::Restored {
            self.known.remove(&c.id);
        } else {
            self.known.insert(c.id.clone(), w.want);
        }
        if outcome.from.is_empty() {
            return None;
        }
        let from: Vec<String> = outcome.from.iter().map(i64::to_string).collect();
        tracing::info!(
            container = %c.id, pod = %c.sandbox_id, kubelet = c.kubelet_adj,
            from = %from.join(","), to = score, why = w.reason.says(),
            "oom_score_adj adjusted"
        );
        Some(score)
    }

    /// Writes `adj` to every process of `cgroup` whose score differs (not
    /// `exact`: only to those above it); `None` when the cgroup cannot be
    /// listed.
    fn write_all(&self, cgroup: &str, adj: i64, exact: bool) -> Option<Outcome> {
        let pids = match self.cgroups.pids(cgroup) {
            Ok(p) => p,
            Err(err) => {
                tracing::debug!(%err, "container cgroup not readable; skipped");
                return None;
            }
        };
        let keep = |current: i64| current == adj || (!exact && current <= adj);
        let out = write_pids(&self.proc_root, cgroup, &pids, adj, keep);
        self.metrics.writes.inc_by(out.written);
        Some(out)
    }
}

/// Raises every process of `cgroup` scored below `to` to it (a container
/// created while criguard was not there to score it); how many it raised.
pub fn raise_processes(cgroups: &CgroupFs, cgroup: &str, to: i64) -> Result<usize, String> {
    let pids = cgroups.pids(cgroup).map_err(|e| e.to_string())?;
    let out = write_pids(std::path::Path::new("/proc"), cgroup, &pids, to, |c| {
        c >= to
    });
    if out.failed {
        return Err(format!(
            "cannot set oom_score_adj {to} on every process of {cgroup}"
        ));
    }
    Ok(out.written as usize)
}

/// Writes `adj` to `pids` (of `cgroup`) under `proc_root`, but for the
/// processes whose current score `keep` says stays.
fn write_pids(
    proc_root: &std::path::Path,
    cgroup: &str,
    pids: &[i32],
    adj: i64,
    keep: impl Fn(i64) -> bool,
) -> Outcome {
    let mut out = Outcome::default();
    for &pid in pids {
        let path = proc_root.join(pid.to_string()).join("oom_score_adj");
        let Some(current) = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
        else {
            continue; // exited since it was listed
        };
        if keep(current) {
            continue;
        }
        match std::fs::write(&path, adj.to_string()) {
            Ok(()) => {
                tracing::debug!(
                    pid,
                    cgroup,
                    from = current,
                    to = adj,
                    "oom_score_adj written"
                );
                out.from.insert(current);
                out.written += 1;
            }
            Err(err) if err.raw_os_error() == Some(nix::libc::ESRCH) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => {
                tracing::debug!(path = %path.display(), adj, %err, "cannot set oom_score_adj");
                out.failed = true;
            }
        }
    }
    out
}

/// What writing one container's processes did.
#[derive(Debug, Default)]
struct Outcome {
    /// The scores of the processes changed, before.
    from: BTreeSet<i64>,
    /// A write failed for a reason other than the process having exited.
    failed: bool,
    /// The processes written.
    written: u64,
}

/// Whether a round checks every score again, not only those it expects
/// to change: at the first, then every [`VERIFY`].
fn verify_due(verified_at: Option<Instant>, at: Instant) -> bool {
    verified_at.is_none_or(|t| at.saturating_duration_since(t) >= VERIFY)
}

#[cfg(test)]
mod tests;
