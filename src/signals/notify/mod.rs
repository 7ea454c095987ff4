//! Memory events: the kernel telling criguard "look now" between
//! housekeeping ticks, so that eviction starts as soon as a memory threshold
//! is crossed instead of up to a tick later.
//!
//! One interface over both cgroup versions: [`MemoryEvents`] is re-armed
//! after every observation ([`MemoryEvents::rearm`], from the pure plan of
//! [`plan`]) and awaited ([`MemoryEvents::next`]).
//! - cgroup v1 ([`v1`]): a memcg usage threshold per memory threshold, hard
//!   and soft, placed where the kubelet's memory threshold notifier places
//!   them: `memory.available` on the root memcg, `allocatableMemory.available`
//!   on the pods' cgroup. `inactive_file` moves, so the lines move with it.
//!   A line that fires is read back (the kernel signals the way down too),
//!   and a hard one gets a second line [`crate::eviction::ready::BAND`]
//!   before it, so that a ranking is ready when usage reaches the first.
//! - cgroup v2 ([`v2`]): a PSI trigger on the `memory.pressure` of each
//!   memory signal's cgroup (the system-wide `/proc/pressure/memory` for the
//!   root when the root has none), and change notification of the pods'
//!   `memory.events` (`max` and `oom` going up).
//!
//! Events are an accelerator, never a single point of failure: a watch
//! that cannot be armed, or that fails while armed, is logged and left to
//! the next re-arm, and the housekeeping tick keeps working regardless. An
//! event decides nothing: it only makes the eviction loop observe fresh.

pub mod plan;
pub mod v1;
pub mod v2;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::time::Instant;

use futures::FutureExt;

use super::node::NodeSources;
use crate::cgroup::fs::Layout;
use crate::config::{EvictionConfig, Threshold};
use crate::eviction::ready;
use crate::eviction::thresholds::{Observation, Observations, deficit};
use crate::signals::table::Signal;
pub use plan::{
    MemcgReading, PollFrom, Watch, plan_polls, plan_v1, plan_v2, poll_interval, signal_cgroup,
};
use v1::UsageThreshold;
use v2::{FileModified, PsiSettings, PsiTrigger};

/// An event source that could not be set up or read, with its file.
#[derive(Debug, thiserror::Error)]
#[error("{action} {path}: {source}")]
pub struct EventError {
    /// What was being done.
    pub action: &'static str,
    /// The file or cgroup.
    pub path: PathBuf,
    /// The error.
    pub source: std::io::Error,
}

impl EventError {
    fn new(action: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self {
            action,
            path: path.to_owned(),
            source,
        }
    }
}

/// Registers `file` with the tokio reactor for `interest`; needs a runtime.
fn register(
    file: std::fs::File,
    interest: tokio::io::Interest,
    path: &Path,
) -> Result<tokio::io::unix::AsyncFd<std::fs::File>, EventError> {
    // SAFETY: the File owns its fd and is only ever borrowed afterwards, so
    // the fd stays open and the same for the AsyncFd's whole life.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(file, interest) }
        .map_err(|e| EventError::new("poll", path, e.into()))
}

/// An armed watch.
#[derive(Debug)]
enum Source {
    /// A v1 usage line, with the signal to read once it is crossed (none
    /// for a band line, which only says the signal came near).
    Usage(UsageThreshold, Option<MemoryPoll>),
    Pressure(PsiTrigger),
    Modified(FileModified),
    Poll(MemoryPoll),
}

/// A memory or swap signal read again and again ([`Watch::Poll`]), sooner
/// the nearer it is to its threshold ([`poll_interval`]).
#[derive(Debug)]
struct MemoryPoll {
    sources: NodeSources,
    from: PollFrom,
    signal: Signal,
    capacity: u64,
    below: u64,
    near: bool,
}

impl MemoryPoll {
    /// Reads until the signal's available memory is below the threshold,
    /// and says so with the reading, or until it first comes within
    /// [`ready::BAND`] of it (unless `near` already), and says that. The
    /// first read comes after [`plan::POLL_MIN`], never at once: a signal
    /// still below its line when the eviction loop asks again (before its
    /// observation re-plans the watches) wakes it at most that often, and
    /// [`MemoryEvents::drain`] never finds a poll ready. A read that fails
    /// ends the poll (re-armed after the next observation).
    async fn fired(&self) -> Result<(String, Option<Crossing>), EventError> {
        let mut wait = plan::POLL_MIN;
        loop {
            tokio::time::sleep(wait).await;
            let available = self.read()?;
            let headroom = available - self.below as i64;
            if let Some(crossing) = self.crossing(available) {
                let detail = format!("available {available} below {}", self.below);
                return Ok((detail, Some(crossing)));
            }
            if !self.near && headroom < ready::BAND as i64 {
                return Ok((format!("available {available} near {}", self.below), None));
            }
            wait = poll_interval(headroom as u64);
        }
    }
}

impl MemoryPoll {
    /// `available` as a crossing of the threshold, if it is below it.
    fn crossing(&self, available: i64) -> Option<Crossing> {
        (available < self.below as i64).then_some(Crossing {
            signal: self.signal,
            reading: Observation {
                available,
                capacity: self.capacity,
            },
        })
    }

    /// The signal's available bytes now (a node without swap any more has
    /// none left).
    fn read(&self) -> Result<i64, EventError> {
        let failed = |e: crate::cgroup::ReadError| EventError::new("read", &e.path, e.source);
        Ok(match &self.from {
            PollFrom::Memcg(cgroup) => {
                let m = self.sources.cgroups.memory(cgroup).map_err(failed)?;
                self.capacity as i64 - m.working_set as i64
            }
            PollFrom::Swap => (self.sources.swap().map_err(failed)?).map_or(0, |o| o.available),
        })
    }
}

/// A memory signal read past its line: what the eviction loop may act on at
/// once ([`crate::eviction::ready`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Crossing {
    /// The signal read.
    pub signal: Signal,
    /// What was read.
    pub reading: Observation,
}

impl Source {
    fn arm(w: &Watch, psi: &PsiSettings, sources: &NodeSources) -> Result<Self, EventError> {
        Ok(match w {
            Watch::Poll {
                signal,
                from,
                capacity,
                below,
                near,
                ..
            } => Source::Poll(MemoryPoll {
                sources: sources.clone(),
                from: from.clone(),
                signal: *signal,
                capacity: *capacity,
                below: *below,
                near: *near,
            }),
            Watch::Usage {
                signal,
                dir,
                bytes,
                cgroup,
                capacity,
                below,
                band,
                ..
            } => {
                let read = (!band).then(|| MemoryPoll {
                    sources: sources.clone(),
                    from: PollFrom::Memcg(cgroup.clone()),
                    signal: *signal,
                    capacity: *capacity,
                    below: *below,
                    near: true,
                });
                Source::Usage(UsageThreshold::register(dir, *bytes)?, read)
            }
            Watch::Pressure { path } => Source::Pressure(PsiTrigger::arm(path, psi)?),
            Watch::Modified { path } => Source::Modified(FileModified::watch(path)?),
        })
    }

    fn is_stale(&self) -> bool {
        match self {
            Source::Usage(s, _) => s.is_stale(),
            Source::Pressure(s) => s.is_stale(),
            Source::Modified(s) => s.is_stale(),
            Source::Poll(_) => false,
        }
    }

    /// Waits for the source to fire; says what it saw, and the reading
    /// when a poll or a usage line saw the threshold crossed.
    async fn fired(&mut self) -> Result<(String, Option<Crossing>), EventError> {
        let detail = match self {
            Source::Poll(s) => return s.fired().await,
            Source::Usage(s, read) => {
                let detail = format!("{} crossing(s)", s.fired().await?);
                // The kernel signals the way down too, and the line was
                // drawn with the page cache of the last observation: the
                // signal read now says whether it is below its threshold.
                let Some(read) = read else {
                    return Ok((detail, None));
                };
                return Ok(match read.read() {
                    Ok(available) => (
                        format!("{detail}, available {available}"),
                        read.crossing(available),
                    ),
                    Err(err) => (format!("{detail} ({err})"), None),
                });
            }
            Source::Pressure(s) => {
                s.fired().await?;
                "stall".to_owned()
            }
            Source::Modified(s) => {
                let up: Vec<String> = s
                    .changed()
                    .await?
                    .into_iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect();
                up.join(", ")
            }
        };
        Ok((detail, None))
    }
}

/// What woke the eviction loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryEvent {
    /// The watch that fired.
    pub watch: Watch,
    /// What it reported (crossings, counters that went up).
    pub detail: String,
    /// When criguard saw it.
    pub at: Instant,
    /// The signal read past its threshold by a poll or after a usage line
    /// fired.
    pub crossed: Option<Crossing>,
}

/// The node's memory events, armed from the eviction configuration.
#[derive(Debug)]
pub struct MemoryEvents {
    sources: NodeSources,
    thresholds: Vec<Threshold>,
    psi: PsiSettings,
    armed: Vec<(Watch, Source)>,
    /// Crossings found while arming, reported before waiting.
    pending: VecDeque<MemoryEvent>,
    /// Places whose last arming failed, so a failure is warned about once.
    failing: BTreeSet<String>,
}

/// The thresholds of `config` that memory events watch: memory's and swap's.
fn memory_thresholds(config: &EvictionConfig) -> Vec<Threshold> {
    config
        .hard
        .iter()
        .chain(&config.soft)
        .filter(|t| signal_cgroup(t.signal, "").is_some() || t.signal == Signal::SwapAvailable)
        .cloned()
        .collect()
}

impl MemoryEvents {
    /// Events for the memory thresholds of `config` (nothing is armed until
    /// the first [`MemoryEvents::rearm`]); `psi` is used on cgroup v2.
    pub fn new(sources: NodeSources, config: &EvictionConfig, psi: PsiSettings) -> Self {
        Self {
            sources,
            thresholds: memory_thresholds(config),
            psi,
            armed: Vec::new(),
            pending: VecDeque::new(),
            failing: BTreeSet::new(),
        }
    }

    /// Follows a reloaded `config`: the next [`MemoryEvents::rearm`] arms
    /// its memory thresholds in place of the old ones.
    pub fn retarget(&mut self, config: &EvictionConfig) {
        self.thresholds = memory_thresholds(config);
    }

    /// The watches armed now.
    pub fn armed(&self) -> Vec<Watch> {
        self.armed.iter().map(|(w, _)| w.clone()).collect()
    }

    /// What should be armed after `obs` (v1 re-reads each memcg's inactive page cache).
    fn plan(&self, obs: &Observations) -> Vec<Watch> {
        match self.sources.cgroups.layout() {
            Layout::V1 => {
                let mut memcgs = BTreeMap::new();
                let kubepods = self.sources.kubepods();
                for t in &self.thresholds {
                    let Some(cg) = signal_cgroup(t.signal, &kubepods) else {
                        continue;
                    };
                    match self.sources.cgroups.memory(cg) {
                        Ok(m) => {
                            let reading = MemcgReading {
                                dir: self.sources.cgroups.memory_dir(cg),
                                inactive_file: m.usage.saturating_sub(m.working_set),
                            };
                            memcgs.insert(t.signal, reading);
                        }
                        Err(err) => {
                            tracing::debug!(%err, "memcg not read; no threshold event for it")
                        }
                    }
                }
                let mut watches = plan_v1(&self.thresholds, obs, &memcgs, &kubepods);
                watches.extend(plan_polls(&self.thresholds, obs, &kubepods, Layout::V1));
                watches
            }
            Layout::V2 => {
                let signals = self.thresholds.iter().map(|t| t.signal).collect();
                let mut watches = plan_v2(&self.sources, &signals);
                let kubepods = self.sources.kubepods();
                watches.extend(plan_polls(&self.thresholds, obs, &kubepods, Layout::V2));
                watches
            }
        }
    }

    /// Whether `obs` already meets the threshold a usage watch stands for.
    fn met(&self, w: &Watch, obs: &Observations) -> bool {
        let Watch::Usage { signal, soft, .. } = w else {
            return false;
        };
        self.thresholds
            .iter()
            .filter(|t| t.signal == *signal && t.grace_period.is_some() == *soft)
            .any(|t| deficit(t, obs, false).is_some())
    }

    /// Re-arms after fresh observations: moved usage lines are registered
    /// anew (before the old ones close, so no crossing falls in between),
    /// watches of vanished or re-created cgroups are replaced, and watches
    /// that failed before are tried again. A line that usage passed after
    /// `obs` was read but before it was registered is reported by the next
    /// [`MemoryEvents::next`] at once (the kernel reports crossings only).
    /// Failures are logged, never returned.
    pub fn rearm(&mut self, obs: &Observations) {
        let want = self.plan(obs);
        let mut old = std::mem::take(&mut self.armed);
        for w in want {
            if let Some(i) = old.iter().position(|(a, s)| *a == w && !s.is_stale()) {
                self.armed.push(old.swap_remove(i));
                continue;
            }
            let place = w.place();
            match Source::arm(&w, &self.psi, &self.sources) {
                Ok(s) => {
                    if self.failing.remove(&place) {
                        tracing::info!(watch = %w, "memory event armed again");
                    }
                    tracing::debug!(watch = %w, "memory event armed");
                    let passed = matches!(&s, Source::Usage(u, _) if u.past_when_registered());
                    if passed && !self.met(&w, obs) {
                        let crossed = match &s {
                            Source::Usage(_, Some(r)) => r.read().ok().and_then(|a| r.crossing(a)),
                            _ => None,
                        };
                        self.pending.push_back(MemoryEvent {
                            watch: w.clone(),
                            detail: "crossed while being armed".into(),
                            at: Instant::now(),
                            crossed,
                        });
                    }
                    self.armed.push((w, s));
                }
                Err(err) if self.failing.insert(place) => {
                    tracing::warn!(watch = %w, %err, "memory event not armed; the housekeeping tick still runs");
                }
                Err(err) => tracing::debug!(watch = %w, %err, "memory event still not armed"),
            }
        }
    }

    /// Waits for the next event from any armed watch (forever when none is
    /// armed). A watch that fails is logged and dropped until the next
    /// re-arm. Cancel-safe: dropping the future loses no event.
    pub async fn next(&mut self) -> MemoryEvent {
        if let Some(ev) = self.pending.pop_front() {
            return ev;
        }
        loop {
            if self.armed.is_empty() {
                return std::future::pending().await;
            }
            let waits = self.armed.iter_mut().map(|(_, s)| Box::pin(s.fired()));
            let (result, i, rest) = futures::future::select_all(waits).await;
            drop(rest);
            match result {
                Ok((detail, crossed)) => {
                    return MemoryEvent {
                        watch: self.armed[i].0.clone(),
                        detail,
                        at: Instant::now(),
                        crossed,
                    };
                }
                Err(err) => {
                    let (w, _) = self.armed.swap_remove(i);
                    tracing::warn!(watch = %w, %err, "memory event failed; re-armed after the next observation");
                }
            }
        }
    }

    /// Takes the events that are already pending (one episode often fires
    /// several watches), so that one round answers them all; returns them.
    pub fn drain(&mut self) -> Vec<MemoryEvent> {
        // Bounded: a source that is ready each time it is asked (a level,
        // not an edge) must not keep the loop here.
        let most = self.pending.len() + self.armed.len();
        std::iter::from_fn(|| self.next().now_or_never())
            .take(most)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::plan::tests::{sources, threshold};
    use super::*;
    use crate::config::Amount;
    use crate::signals::table::Signal;

    const MI: u64 = 1 << 20;

    #[tokio::test]
    async fn a_poll_fires_once_available_falls_below_its_threshold() {
        // A v2 root: memory.stat only; 1Gi node, threshold 200Mi.
        let t = tempfile::tempdir().unwrap();
        let write = |anon: u64| {
            crate::signals::write_fixture(
                t.path(),
                "memory.stat",
                &format!("anon {anon}\nfile 0\ninactive_file 0\n"),
            )
        };
        write(600 * MI);
        write_fixture_controllers(t.path());
        let poll = |near| Watch::Poll {
            signal: Signal::MemoryAvailable,
            soft: false,
            from: PollFrom::Memcg("/".into()),
            capacity: 1024 * MI,
            below: 200 * MI,
            near,
        };
        let srcs = sources(t.path(), t.path());
        assert_eq!(srcs.cgroups.layout(), Layout::V2);
        let mut src = Source::arm(&poll(false), &PsiSettings::default(), &srcs).unwrap();
        // 424Mi available: still waiting after several reads.
        let early = tokio::time::timeout(plan::POLL_MIN * 4, src.fired()).await;
        assert!(early.is_err(), "fired far from the threshold: {early:?}");
        // 324Mi: within the band, it says so without a reading.
        write(700 * MI);
        let secs = std::time::Duration::from_secs(5);
        let near = tokio::time::timeout(secs, src.fired()).await.unwrap();
        assert_eq!(
            near.unwrap(),
            (format!("available {} near {}", 324 * MI, 200 * MI), None)
        );
        // Armed again as near: quiet until the line.
        let mut src = Source::arm(&poll(true), &PsiSettings::default(), &srcs).unwrap();
        let quiet = tokio::time::timeout(plan::POLL_MIN * 4, src.fired()).await;
        assert!(quiet.is_err(), "fired above the threshold: {quiet:?}");
        write(900 * MI);
        let (detail, crossed) = tokio::time::timeout(secs, src.fired())
            .await
            .expect("a read below the threshold fires")
            .unwrap();
        assert_eq!(detail, format!("available {} below {}", 124 * MI, 200 * MI));
        let reading = crossed.expect("a crossing carries its reading").reading;
        assert_eq!(
            (reading.available, reading.capacity),
            (124 * MI as i64, 1024 * MI)
        );
        // Still below: the next ask waits its first interval (no busy loop
        // while the eviction loop has yet to observe), then fires again.
        let again = src.fired();
        tokio::pin!(again);
        assert!(futures::poll!(again.as_mut()).is_pending());
        assert!(again.await.is_ok());
    }

    #[tokio::test]
    async fn a_swap_poll_reads_swap_free_on_either_cgroup_version() {
        // A v1 hierarchy (no cgroup.controllers) and a node with 384Mi of swap.
        let t = tempfile::tempdir().unwrap();
        let meminfo = |free_kib: u64| {
            crate::signals::write_fixture(
                t.path(),
                "meminfo",
                &format!("MemTotal: 1024000 kB\nSwapTotal: 393216 kB\nSwapFree: {free_kib} kB\n"),
            )
        };
        meminfo(300 * 1024);
        let srcs = sources(t.path(), t.path());
        assert_eq!(srcs.cgroups.layout(), Layout::V1);
        let config = config(
            vec![threshold(
                Signal::SwapAvailable,
                Amount::Quantity(128 * MI),
                None,
            )],
            vec![],
        );
        let mut ev = MemoryEvents::new(srcs, &config, PsiSettings::default());
        let obs = ev.sources.observe();
        ev.rearm(&obs);
        let poll = Watch::Poll {
            signal: Signal::SwapAvailable,
            soft: false,
            from: PollFrom::Swap,
            capacity: 384 * MI,
            below: 128 * MI,
            near: true,
        };
        assert_eq!(ev.armed(), [poll]);
        meminfo(100 * 1024);
        let fired = tokio::time::timeout(std::time::Duration::from_secs(5), ev.next())
            .await
            .expect("swap below its line fires");
        let reading = fired.crossed.expect("with its reading").reading;
        assert_eq!(
            (reading.available, reading.capacity),
            (100 * MI as i64, 384 * MI)
        );
    }

    #[tokio::test]
    async fn draining_with_a_poll_below_its_line_returns() {
        let t = tempfile::tempdir().unwrap();
        write_fixture_controllers(t.path());
        crate::signals::write_fixture(t.path(), "memory.stat", "anon 1000\nfile 0\n");
        let config = config(
            vec![threshold(
                Signal::MemoryAvailable,
                Amount::Quantity(200 * MI),
                None,
            )],
            vec![],
        );
        let mut ev =
            MemoryEvents::new(sources(t.path(), t.path()), &config, PsiSettings::default());
        let w = Watch::Poll {
            signal: Signal::MemoryAvailable,
            soft: false,
            from: PollFrom::Memcg("/".into()),
            capacity: 100 * MI,
            below: 200 * MI,
            near: true,
        };
        let src = Source::arm(&w, &PsiSettings::default(), &ev.sources).unwrap();
        ev.armed.push((w, src));
        // Always below its line: drain must still come back.
        let drained = tokio::time::timeout(std::time::Duration::from_secs(5), async { ev.drain() })
            .await
            .expect("drain returns");
        assert!(drained.len() <= 1, "{drained:?}");
    }

    /// The eviction configuration with `hard` and `soft` thresholds and
    /// the kubelet's other defaults.
    fn config(hard: Vec<Threshold>, soft: Vec<Threshold>) -> EvictionConfig {
        EvictionConfig {
            hard,
            soft,
            max_pod_grace_period: None,
            pressure_transition_period: std::time::Duration::from_secs(300),
            housekeeping_interval: std::time::Duration::from_secs(10),
        }
    }

    fn write_fixture_controllers(root: &std::path::Path) {
        crate::signals::write_fixture(root, "cgroup.controllers", "cpu memory pids\n");
    }

    #[test]
    fn only_memory_and_swap_thresholds_are_watched() {
        let t = tempfile::tempdir().unwrap();
        let config = config(
            vec![
                threshold(Signal::MemoryAvailable, Amount::Quantity(MI), None),
                threshold(Signal::PidAvailable, Amount::Quantity(100), None),
                threshold(Signal::SwapAvailable, Amount::Quantity(MI), None),
            ],
            vec![threshold(
                Signal::AllocatableMemoryAvailable,
                Amount::Quantity(MI),
                Some(30),
            )],
        );
        let ev = MemoryEvents::new(sources(t.path(), t.path()), &config, PsiSettings::default());
        let signals: Vec<Signal> = ev.thresholds.iter().map(|t| t.signal).collect();
        assert_eq!(
            signals,
            [
                Signal::MemoryAvailable,
                Signal::SwapAvailable,
                Signal::AllocatableMemoryAvailable
            ]
        );
        assert!(
            ev.armed().is_empty(),
            "nothing armed before the first observation"
        );
    }
}
