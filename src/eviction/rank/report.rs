//! What `criguard rank` prints: each signal's order as lines, and the disk
//! signals it leaves out because they are far from their thresholds (a walk
//! of every pod's layers, logs and volumes is the costliest reading there
//! is, and no eviction can come of such a signal soon).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::Ranker;
use crate::config::Threshold;
use crate::eviction::rank::order::near;
use crate::eviction::thresholds::Observation;
use crate::signals::table::{Ranking, Signal};

/// One line of `criguard rank`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankEntry {
    /// The signal ranked for.
    pub signal: String,
    /// 1 for the first victim.
    pub rank: usize,
    /// `namespace/name`.
    pub pod: String,
    /// QoS class.
    pub qos: String,
    /// Priority.
    pub priority: i32,
    /// What the signal counts of it (`None`: could not be read).
    pub usage: Option<i64>,
    /// Its request for that resource (memory only).
    pub request: i64,
    /// Its memory stall, PSI `some avg10` of its cgroup in basis points of
    /// time (cgroup v2 only).
    #[serde(default)]
    pub stall: Option<u64>,
}

impl Ranker {
    /// The order for each of `signals` (one memory, pid and disk signal
    /// each at most), as `criguard rank` prints it, and the disk signals
    /// left unranked because they are far from their thresholds (walking
    /// every pod's layers, logs and volumes costs the most of any reading).
    pub async fn report(&self, signals: &[Signal]) -> (Vec<RankEntry>, Vec<NotRanked>) {
        let none = BTreeSet::new();
        let mut out = Vec::new();
        let mut not_ranked = Vec::new();
        // Each entry's pod cgroup: its stall is read once per pod, after
        // every signal is ranked.
        let mut cgroups = Vec::new();
        let observed = match signals.iter().any(|s| s.ranking() == Ranking::Disk) {
            true => Some(self.sources.observe_bounded().await),
            false => None,
        };
        for &s in signals {
            let ranked = match s.ranking() {
                Ranking::Memory => self.memory(&none).await,
                Ranking::Swap => self.swap(&none).await,
                Ranking::Pids => self.pids(&none).await,
                Ranking::Disk => {
                    let obs = observed.as_ref().and_then(|o| o.get(&s));
                    let thresholds: Vec<&Threshold> =
                        self.thresholds.iter().filter(|t| t.signal == s).collect();
                    if let Err(skip) = disk_ranking_wanted(s, &thresholds, obs) {
                        not_ranked.push(skip);
                        continue;
                    }
                    self.disk(s, &none).await
                }
            };
            for (i, v) in ranked.into_iter().enumerate() {
                cgroups.push(v.pod.cgroup());
                out.push(RankEntry {
                    signal: s.to_string(),
                    rank: i + 1,
                    pod: format!("{}/{}", v.pod.namespace, v.pod.name),
                    qos: format!("{:?}", v.pod.qos),
                    priority: v.pod.priority,
                    usage: v.usage,
                    request: v.request,
                    stall: None,
                });
            }
        }
        for (e, stall) in out.iter_mut().zip(self.stalls(cgroups).await) {
            e.stall = stall;
        }
        (out, not_ranked)
    }
}

impl Ranker {
    /// The memory stall of each of `cgroups` (PSI `some avg10`), each
    /// cgroup read once however often it is listed, on the blocking pool.
    async fn stalls(&self, cgroups: Vec<Option<String>>) -> Vec<Option<u64>> {
        let fs = self.sources.cgroups.clone();
        super::blocking(move || {
            let mut read: std::collections::HashMap<String, Option<u64>> = Default::default();
            cgroups
                .into_iter()
                .map(|c| {
                    let c = c?;
                    *read
                        .entry(c)
                        .or_insert_with_key(|c| fs.memory_stall(c).ok())
                })
                .collect()
        })
        .await
    }
}

/// A disk signal `criguard rank` did not order pods for: it is far from
/// its thresholds ([`disk_ranking_wanted`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NotRanked {
    /// The signal.
    pub signal: String,
    /// Its available amount now.
    pub available: i64,
    /// Its nearest threshold, as configured.
    pub threshold: String,
}

impl std::fmt::Display for NotRanked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bytes = Signal::parse(&self.signal).is_some_and(|s| s.is_bytes());
        let available = if bytes {
            crate::quantity::format_bytes(self.available.max(0) as u64)
        } else {
            self.available.to_string()
        };
        write!(
            f,
            "{}: not ranked, {available} available against a threshold of {} \
             (disk usage is walked only within twice a threshold)",
            self.signal, self.threshold
        )
    }
}

/// Whether `criguard rank` orders pods for disk signal `signal` whose
/// `thresholds` are configured and whose observation is `obs`: yes when it
/// is near one of them ([`near`]: less than twice the threshold left), or
/// when it cannot tell (no threshold known, nothing observed); else why
/// not. Under pressure the eviction manager ranks whatever this says.
pub fn disk_ranking_wanted(
    signal: Signal,
    thresholds: &[&Threshold],
    obs: Option<&Observation>,
) -> Result<(), NotRanked> {
    let Some(o) = obs else {
        return Ok(());
    };
    let lines = thresholds.iter().map(|t| (t.amount.resolve(o.capacity), t));
    match lines.max_by_key(|(line, _)| *line) {
        None => Ok(()),
        Some((line, _)) if near(o.available, line) => Ok(()),
        Some((_, t)) => Err(NotRanked {
            signal: signal.to_string(),
            available: o.available,
            threshold: t.amount_display(),
        }),
    }
}
