//! Dynamic `oom_score_adj`: make the kernel's OOM victim criguard's first.
//!
//! The kernel kills the task with the highest badness,
//! `rss + swap + page tables + oom_score_adj · T / 1000`, where `T` is the
//! memory of the OOM's scope (the memcg limit, or all RAM and swap). With
//! the kubelet's static scores a big Burstable pod can outscore a small
//! BestEffort one although the kubelet's ranking would evict by priority
//! first (seed: guaranteed-pod-eviction-article.md). criguard closes the gap
//! with a bound that holds whatever the tasks' exact sizes:
//!
//! - every container of the first-ranked pod gets 1000, so its largest task
//!   scores at least `T`;
//! - every other container whose score could reach `T` is lowered to
//!   `999 − ⌈1000 · usage / T⌉`, so its tasks score at most `0.999 · T`
//!   (`usage`, the container's working set, bounds each task's rss).
//!
//! Containers already below their bound keep the kubelet's value; scores are
//! never raised except for the first victim. Using the smallest scope for
//! `T` (the pods' memcg limit) makes the bound hold in larger scopes too.
//!
//! What to redo, and when, is decided here too, so that a node with many
//! pods costs little while nothing changes: [`decide`] says whether a round
//! must rank again (the model changed, the scope `T` changed, a pod's usage
//! moved by more than one [`step`], or the last decision is older than a
//! refresh period); [`plan_writes`] says which containers' processes must be
//! written, from what criguard already set ([`Known`]); and
//! [`may_need_bound`] says which containers' own usage need not be read.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What the OOM ordering needs to know of a container.
#[derive(Clone, Debug, PartialEq)]
pub struct ContainerMemory {
    /// Container id.
    pub id: String,
    /// Its pod's sandbox id.
    pub sandbox_id: String,
    /// The kubelet's static `oom_score_adj` for it.
    pub kubelet_adj: i64,
    /// Working set, bytes.
    pub usage: i64,
}

/// Target scores for containers whose score should differ from the
/// kubelet's, given the first victim's sandbox and the OOM scope `total` in
/// bytes. With no first victim (nothing ranks: every pod critical, or no
/// pod running) nothing needs bounding, so the map is empty and every
/// score goes back to the kubelet's.
pub fn dynamic_scores(
    first_victim: Option<&str>,
    containers: &[ContainerMemory],
    total: i64,
) -> HashMap<String, i64> {
    let Some(first_victim) = first_victim else {
        return HashMap::new();
    };
    containers
        .iter()
        .filter_map(|c| {
            let target = if c.sandbox_id == first_victim {
                1000
            } else {
                bound(c.kubelet_adj, c.usage, total)
            };
            (target != c.kubelet_adj).then(|| (c.id.clone(), target))
        })
        .collect()
}

/// The bound of a container that is not the first victim, given its
/// working set `usage` and the scope `total`: `999 − ⌈1000 · usage / T⌉`,
/// never above the kubelet's score.
pub fn bound(kubelet_adj: i64, usage: i64, total: i64) -> i64 {
    let total = total.max(1);
    let share = (1000 * usage.max(0) as u128).div_ceil(total as u128) as i64;
    kubelet_adj.min(999 - share).max(-1000)
}

/// One step of the formula in bytes: how far a usage must move to move a
/// bound by one point (`T / 1000`).
pub fn step(total: i64) -> i64 {
    (total / 1000).max(1)
}

/// Whether a container of a pod whose working set is `pod_usage` can need
/// a bound below the kubelet's score. A container's working set is part of
/// its pod's and the bound only falls as usage grows, so when the pod's
/// whole usage leaves the kubelet's score standing, the container's own
/// usage need not be read. `None` (the pod's usage unknown): it may.
pub fn may_need_bound(kubelet_adj: i64, pod_usage: Option<i64>, total: i64) -> bool {
    pod_usage.is_none_or(|u| bound(kubelet_adj, u, total) < kubelet_adj)
}

/// What one round's cheap check reads: the model's generation, the OOM
/// scope `T` and each running pod's usage counter (bytes; `None` when its
/// cgroup could not be read), by sandbox id.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    /// [`crate::model::NodeModel::generation`].
    pub generation: u64,
    /// The OOM scope, bytes.
    pub total: i64,
    /// Usage counter of each running pod (not the working set: reading
    /// that costs `memory.stat`).
    pub usage: HashMap<String, Option<i64>>,
}

/// Why a round ranks again and plans writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Why {
    /// No decision yet.
    First,
    /// A pod or container started, stopped or changed in the model.
    Model,
    /// The OOM scope `T` changed.
    Scope,
    /// This pod's usage moved by more than one step, or its cgroup became
    /// readable or unreadable.
    Usage(String),
    /// The last decision is older than the refresh period: working sets
    /// can drift while usage stands (pages going inactive), so the
    /// decision is taken again from fresh working sets now and then.
    Refresh,
}

/// Whether a round must decide again, from the check `now` against the
/// check of the last decision `last` made at `decided_at`, `refresh` being
/// the longest a decision stands; `None`: the last decision stands and the
/// round reads and writes nothing more.
pub fn decide(
    last: Option<(&Check, Instant)>,
    now: &Check,
    at: Instant,
    refresh: Duration,
) -> Option<Why> {
    let Some((last, decided_at)) = last else {
        return Some(Why::First);
    };
    if last.generation != now.generation {
        return Some(Why::Model);
    }
    if last.total != now.total {
        return Some(Why::Scope);
    }
    let step = step(now.total);
    for (id, u) in &now.usage {
        let moved = match (last.usage.get(id).copied().flatten(), *u) {
            (Some(a), Some(b)) => (a - b).abs() > step,
            (None, None) => false,
            _ => true,
        };
        if moved {
            return Some(Why::Usage(id.clone()));
        }
    }
    if last.usage.len() != now.usage.len() {
        return Some(Why::Model);
    }
    (at.saturating_duration_since(decided_at) >= refresh).then_some(Why::Refresh)
}

/// What criguard knows of the scores of a container's processes, from its
/// own last write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Known {
    /// Every process has this score (the first victim's 1000, a restore).
    Exactly(i64),
    /// No process scores above this (a bound: processes already below it
    /// were left as they were).
    AtMost(i64),
}

impl Known {
    fn ceiling(self) -> i64 {
        match self {
            Known::Exactly(s) | Known::AtMost(s) => s,
        }
    }
}

/// Whether a container whose processes are `known` to score so must be
/// written to reach `want`; a container criguard never wrote (`None`) is
/// read and written where needed.
pub fn needs_write(known: Option<Known>, want: Known) -> bool {
    match (known, want) {
        (None, _) => true,
        (Some(k), Known::Exactly(_)) => k != want,
        (Some(k), Known::AtMost(w)) => k.ceiling() > w,
    }
}

/// Why a container's score is written, for the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Its pod is first in criguard's ranking.
    FirstVictim,
    /// Bounded below the first-ranked pod's score.
    KeptBelow,
    /// Back to the kubelet's score: no bound is needed any more.
    Restored,
}

impl Reason {
    /// The log's words for it.
    pub fn says(self) -> &'static str {
        match self {
            Reason::FirstVictim => {
                "first in criguard's memory ranking: the kernel's OOM killer should pick it first"
            }
            Reason::KeptBelow => "kept below the first-ranked pod's score",
            Reason::Restored => "restored to the kubelet's score: no bound needed any more",
        }
    }
}

/// One container whose processes a round writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    /// Container id.
    pub id: String,
    /// The score wanted: exactly (every process set to it) or at most
    /// (only processes above it set to it).
    pub want: Known,
    /// Why.
    pub reason: Reason,
}

/// The containers whose processes must be written this round: those whose
/// target ([`dynamic_scores`]) is not what criguard `known`ly set, and
/// those criguard changed before that need the kubelet's score back. A
/// container criguard never changed and that needs no bound is left alone,
/// whatever its processes score. With `verify`, every container with a
/// target or a restore is planned whatever is known, so that processes
/// that joined a container since (an exec) are found.
pub fn plan_writes(
    first_victim: Option<&str>,
    containers: &[ContainerMemory],
    total: i64,
    known: &HashMap<String, Known>,
    verify: bool,
) -> Vec<Write> {
    let targets = dynamic_scores(first_victim, containers, total);
    containers
        .iter()
        .filter_map(|c| {
            let first = first_victim == Some(c.sandbox_id.as_str());
            let (want, reason) = match targets.get(&c.id) {
                Some(&t) if first => (Known::Exactly(t), Reason::FirstVictim),
                Some(&t) => (Known::AtMost(t), Reason::KeptBelow),
                None if known.contains_key(&c.id) => {
                    (Known::Exactly(c.kubelet_adj), Reason::Restored)
                }
                None => return None,
            };
            (verify || needs_write(known.get(&c.id).copied(), want)).then(|| Write {
                id: c.id.clone(),
                want,
                reason,
            })
        })
        .collect()
}

/// The kernel's badness of a task, in bytes, for tests and explanations.
pub fn badness(rss: i64, adj: i64, total: i64) -> i64 {
    rss + adj * total / 1000
}

#[cfg(test)]
mod tests;
