//! What to watch, planned from the eviction configuration and fresh
//! readings: pure functions over plain data (v2 also looks at which
//! pressure files exist), tested against fixture trees.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use super::v1::usage_threshold;
use crate::cgroup::fs::Layout;
use crate::config::Threshold;
use crate::eviction::ready;
use crate::eviction::thresholds::Observations;
use crate::signals::node::NodeSources;
use crate::signals::table::{MemoryScope, Signal, Source};

/// One thing to watch, as planned from the configuration and the readings.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Watch {
    /// cgroup v1: the usage of the memcg at `dir` crossing `bytes`.
    Usage {
        /// The signal whose threshold this is.
        signal: Signal,
        /// Whether the threshold is soft.
        soft: bool,
        /// The memcg directory.
        dir: PathBuf,
        /// The usage line, bytes ([`usage_threshold`]).
        bytes: u64,
        /// The memcg as a cgroup path, read when the line is crossed.
        cgroup: String,
        /// The signal's capacity, bytes.
        capacity: u64,
        /// The threshold: met when available falls below this, bytes.
        below: u64,
        /// Whether this line stands [`crate::eviction::ready::BAND`] above
        /// the threshold's, to tell the eviction loop that the signal came
        /// near (it then keeps a ranking ready), rather than at it.
        band: bool,
    },
    /// A PSI trigger on a pressure file.
    Pressure {
        /// `memory.pressure` of a cgroup, or `/proc/pressure/memory`.
        path: PathBuf,
    },
    /// Changes of a cgroup's `memory.events`.
    Modified {
        /// The file.
        path: PathBuf,
    },
    /// The signal read every few milliseconds to a second, sooner the
    /// nearer its threshold: memory on cgroup v2 (the kernel has no usage
    /// threshold there), swap on both (the kernel signals none).
    Poll {
        /// The signal whose threshold this is.
        signal: Signal,
        /// Whether the threshold is soft.
        soft: bool,
        /// Where it is read.
        from: PollFrom,
        /// The signal's capacity, bytes.
        capacity: u64,
        /// The threshold: it fires when available falls below this, bytes.
        below: u64,
        /// Whether the eviction loop needs no word when the signal comes
        /// within [`crate::eviction::ready::BAND`] of the line: it was
        /// there already, or the threshold keeps no ranking ready.
        near: bool,
    },
}

impl Watch {
    /// A short label for metrics: `memcg_threshold`, `psi`, `memory_events`
    /// or `poll`.
    pub fn kind(&self) -> &'static str {
        match self {
            Watch::Usage { .. } => "memcg_threshold",
            Watch::Pressure { .. } => "psi",
            Watch::Modified { .. } => "memory_events",
            Watch::Poll { .. } => "poll",
        }
    }

    /// What is watched, without the line (which moves): names log entries.
    pub(super) fn place(&self) -> String {
        match self {
            Watch::Usage {
                signal,
                soft,
                dir,
                band,
                ..
            } => {
                let kind = if *soft { "soft" } else { "hard" };
                let what = if *band { "band" } else { "threshold" };
                format!("{kind} {signal} {what} on {}", dir.display())
            }
            Watch::Pressure { path } => format!("PSI trigger on {}", path.display()),
            Watch::Modified { path } => format!("changes of {}", path.display()),
            Watch::Poll {
                signal, soft, from, ..
            } => {
                let kind = if *soft { "soft" } else { "hard" };
                match from {
                    PollFrom::Memcg(cgroup) => {
                        format!("{kind} {signal} threshold polled on {cgroup}")
                    }
                    PollFrom::Swap => format!("{kind} {signal} threshold polled in /proc/meminfo"),
                }
            }
        }
    }
}

impl std::fmt::Display for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Watch::Usage { bytes, .. } => write!(f, "{} (usage {bytes})", self.place()),
            Watch::Poll { below, .. } => write!(f, "{} (available below {below})", self.place()),
            _ => f.write_str(&self.place()),
        }
    }
}

/// Where a poll reads its signal.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PollFrom {
    /// A memcg, from the hierarchy root: capacity − its working set.
    Memcg(String),
    /// The node's swap: `SwapFree` of `/proc/meminfo`.
    Swap,
}

/// The cgroup a memory signal is read from, or `None` for other signals.
pub fn signal_cgroup(signal: Signal, pods_cgroup: &str) -> Option<&str> {
    match signal.source() {
        Source::Memcg(MemoryScope::Node) => Some("/"),
        Source::Memcg(MemoryScope::Pods) => Some(pods_cgroup),
        Source::Statfs(_) | Source::Pids | Source::Swap | Source::Psi(_) => None,
    }
}

/// A memory signal's memcg as re-read for arming: its directory and
/// `inactive_file` (usage − working set).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemcgReading {
    /// The memcg directory.
    pub dir: PathBuf,
    /// Inactive page cache, bytes.
    pub inactive_file: u64,
}

/// How far from a hard line (v1) its band line is armed: a node farther
/// away registers no second line (two descriptors and a registration on
/// the memcg fewer while idle); the observation that finds it within this
/// arms it.
pub const BAND_ARMED: u64 = 8 * ready::BAND;

/// cgroup v1: one usage line per memory threshold (hard and soft) whose
/// signal was observed and whose memcg was read, and, for a threshold that
/// kills at its crossing ([`ready::fast`]) and is not yet near but within
/// [`BAND_ARMED`], a second line [`ready::BAND`] before it, so that the
/// ranking is ready by the time usage reaches the first.
pub fn plan_v1(
    thresholds: &[Threshold],
    obs: &Observations,
    memcgs: &BTreeMap<Signal, MemcgReading>,
    pods_cgroup: &str,
) -> Vec<Watch> {
    let mut out = Vec::new();
    for t in thresholds {
        let (Some(o), Some(m), Some(cgroup)) = (
            obs.get(&t.signal),
            memcgs.get(&t.signal),
            signal_cgroup(t.signal, pods_cgroup),
        ) else {
            continue;
        };
        let below = t.amount.resolve(o.capacity);
        let line = |band: bool| Watch::Usage {
            signal: t.signal,
            soft: t.grace_period.is_some(),
            dir: m.dir.clone(),
            bytes: usage_threshold(
                o.capacity,
                below + if band { ready::BAND } else { 0 },
                m.inactive_file,
            ),
            cgroup: cgroup.to_owned(),
            capacity: o.capacity,
            below,
            band,
        };
        out.push(line(false));
        let headroom = o.available - below as i64;
        if ready::fast(t) && (ready::BAND as i64..BAND_ARMED as i64).contains(&headroom) {
            out.push(line(true));
        }
    }
    out
}

/// A poll of each memory and swap threshold not met in `obs` (one that is
/// met needs no wake-up: the eviction loop is acting on it).
///
/// The kernel tells a v2 memcg's usage crossing a line only at its limits,
/// and PSI only once the node stalls, which on a node without swap comes
/// late; it tells nothing of swap on either version: reading the signal
/// itself near its threshold is what v1's usage threshold does in the
/// kernel. On v1 (`layout`) a memory threshold is polled only once it is
/// within [`ready::BAND`] of a line that kills at its crossing: the kernel
/// checks usage lines every 128 pages charged per CPU, which memory growing
/// slowly takes tens of milliseconds to charge; elsewhere the usage lines
/// ([`plan_v1`]) are enough.
pub fn plan_polls(
    thresholds: &[Threshold],
    obs: &Observations,
    pods_cgroup: &str,
    layout: Layout,
) -> Vec<Watch> {
    thresholds
        .iter()
        .filter_map(|t| {
            let o = obs.get(&t.signal)?;
            let below = t.amount.resolve(o.capacity);
            let headroom = o.available - below as i64;
            let near = headroom < ready::BAND as i64;
            let from = match (t.signal.source(), signal_cgroup(t.signal, pods_cgroup)) {
                (_, Some(cgroup)) if layout == Layout::V2 || (near && ready::fast(t)) => {
                    PollFrom::Memcg(cgroup.to_owned())
                }
                (Source::Swap, _) => PollFrom::Swap,
                _ => return None,
            };
            (headroom >= 0).then(|| Watch::Poll {
                signal: t.signal,
                soft: t.grace_period.is_some(),
                from,
                capacity: o.capacity,
                below,
                near: !ready::fast(t) || near,
            })
        })
        .collect()
}

/// How long a poll waits before it reads again, with `headroom` bytes left
/// above the threshold: the time memory growing at [`POLL_RATE`] takes to
/// use it all, bounded by [`POLL_MIN`] and [`POLL_MAX`], so a node far from
/// its threshold costs one read a second, one 80 MiB from it fifty, and
/// one within 20 MiB of it two hundred (each a read of the signal cgroup's
/// `memory.stat`, and of its `memory.current` below the root).
pub fn poll_interval(headroom: u64) -> std::time::Duration {
    let s = headroom as f64 / POLL_RATE as f64;
    std::time::Duration::from_secs_f64(s).clamp(POLL_MIN, POLL_MAX)
}

/// The fastest growth a poll plans for, bytes per second: faster than a
/// process can touch new pages on the machines criguard runs on.
pub const POLL_RATE: u64 = 4 << 30;
/// The shortest wait between two reads of a poll: near the line, half of
/// it is the mean delay from the crossing to the read that sees it.
pub const POLL_MIN: std::time::Duration = std::time::Duration::from_millis(5);
/// The longest wait between two reads of a poll.
pub const POLL_MAX: std::time::Duration = std::time::Duration::from_secs(1);

/// cgroup v2: a PSI trigger on each signal's cgroup (`/proc/pressure/memory`
/// for the root when the root has no `memory.pressure`) and changes of the
/// pods' `memory.events`.
pub fn plan_v2(sources: &NodeSources, signals: &BTreeSet<Signal>) -> Vec<Watch> {
    let mut out = BTreeSet::new();
    let kubepods = sources.kubepods();
    for s in signals {
        let Some(cgroup) = signal_cgroup(*s, &kubepods) else {
            continue;
        };
        let dir = sources.cgroups.memory_dir(cgroup);
        let pressure = dir.join("memory.pressure");
        let is_root = cgroup.trim_matches('/').is_empty();
        out.insert(Watch::Pressure {
            path: if is_root && !pressure.exists() {
                sources.proc_root.join("pressure/memory")
            } else {
                pressure
            },
        });
        if !is_root {
            out.insert(Watch::Modified {
                path: dir.join("memory.events"),
            });
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
pub(super) mod tests {
    use std::path::Path;
    use std::time::Instant;

    use super::*;
    use crate::cgroup::fs::CgroupFs;
    use crate::config::Amount;
    use crate::eviction::thresholds::Observation;
    use crate::signals::write_fixture as write;

    const MI: u64 = 1 << 20;

    /// Sources over a fixture tree (shared with the events tests).
    pub(in crate::signals::notify) fn sources(cg: &Path, proc_root: &Path) -> NodeSources {
        NodeSources {
            cgroups: CgroupFs::detect(cg),
            proc_root: proc_root.to_owned(),
            memory_capacity: 1 << 30,
            pods_cgroup: "/kubepods".into(),
            nodefs: cg.to_owned(),
            imagefs: cg.to_owned(),
        }
    }

    /// A threshold with no minimum reclaim (shared with the events tests).
    pub(in crate::signals::notify) fn threshold(
        signal: Signal,
        amount: Amount,
        grace_s: Option<u64>,
    ) -> Threshold {
        Threshold {
            signal,
            amount,
            grace_period: grace_s.map(std::time::Duration::from_secs),
            min_reclaim: None,
        }
    }

    #[test]
    fn v2_watches_each_signals_pressure_and_the_pods_memory_events() {
        let t = tempfile::tempdir().unwrap();
        let (cg, proc_root) = (t.path().join("cg"), t.path().join("proc"));
        write(&cg, "cgroup.controllers", "cpu memory pids\n");
        write(&cg, "kubepods/memory.pressure", "some total=0\n");
        write(&cg, "kubepods/memory.events", "max 0\n");
        write(&proc_root, "pressure/memory", "some total=0\n");
        let src = sources(&cg, &proc_root);
        let both = BTreeSet::from([Signal::MemoryAvailable, Signal::AllocatableMemoryAvailable]);
        let pressure = |p: PathBuf| Watch::Pressure { path: p };
        // No memory.pressure at the root: the system-wide file stands in.
        assert_eq!(
            plan_v2(&src, &both),
            [
                pressure(cg.join("kubepods/memory.pressure")),
                pressure(proc_root.join("pressure/memory")),
                Watch::Modified {
                    path: cg.join("kubepods/memory.events")
                },
            ]
        );
        write(&cg, "memory.pressure", "some total=0\n");
        let root_only = BTreeSet::from([Signal::MemoryAvailable]);
        assert_eq!(
            plan_v2(&src, &root_only),
            [pressure(cg.join("memory.pressure"))]
        );
        // Disk and pid signals have no memory events.
        assert!(plan_v2(&src, &BTreeSet::from([Signal::NodefsAvailable])).is_empty());
    }

    /// 600Mi of 1Gi node memory available, 100Mi of 512Mi allocatable.
    fn memory_observations() -> Observations {
        Observations {
            at: Instant::now(),
            signals: BTreeMap::from([
                (
                    Signal::MemoryAvailable,
                    Observation {
                        available: 600 * MI as i64,
                        capacity: 1024 * MI,
                    },
                ),
                (
                    Signal::AllocatableMemoryAvailable,
                    Observation {
                        available: 100 * MI as i64,
                        capacity: 512 * MI,
                    },
                ),
            ]),
        }
    }

    #[test]
    fn v2_polls_each_memory_threshold_not_yet_met_nearer_ones_more_often() {
        let obs = memory_observations();
        let thresholds = [
            threshold(Signal::MemoryAvailable, Amount::Quantity(200 * MI), None),
            threshold(
                Signal::MemoryAvailable,
                Amount::Quantity(300 * MI),
                Some(60),
            ),
            // Met (100Mi < 25 % of 512Mi): the eviction loop acts, no poll.
            threshold(
                Signal::AllocatableMemoryAvailable,
                Amount::Percentage(25.0),
                None,
            ),
            threshold(Signal::PidAvailable, Amount::Quantity(10), None),
        ];
        let poll = |soft, below, near| Watch::Poll {
            signal: Signal::MemoryAvailable,
            soft,
            from: PollFrom::Memcg("/".into()),
            capacity: 1024 * MI,
            below,
            near,
        };
        // 400Mi above the hard line: it says when it comes within the band
        // where a ranking is kept ready; the soft one keeps none.
        assert_eq!(
            plan_polls(&thresholds, &obs, "/kubepods.slice", Layout::V2),
            [poll(false, 200 * MI, false), poll(true, 300 * MI, true)]
        );
        let mut close = obs.clone();
        close
            .signals
            .get_mut(&Signal::MemoryAvailable)
            .unwrap()
            .available = 250 * MI as i64;
        assert_eq!(
            plan_polls(&thresholds[..1], &close, "/kubepods.slice", Layout::V2),
            [poll(false, 200 * MI, true)]
        );
        assert_eq!(poll(false, 200 * MI, false).kind(), "poll");
        // cgroup v1: the usage lines watch memory; a poll only within the
        // band of a hard line, where the kernel's batched checks trail
        // slow growth.
        assert!(plan_polls(&thresholds, &obs, "/kubepods.slice", Layout::V1).is_empty());
        assert_eq!(
            plan_polls(&thresholds, &close, "/kubepods.slice", Layout::V1),
            [poll(false, 200 * MI, true)]
        );
        // 4 GiB/s: a second for 4Gi of headroom, the floor near the line.
        assert_eq!(poll_interval(64 << 30), POLL_MAX);
        assert_eq!(
            poll_interval(1 << 30),
            std::time::Duration::from_millis(250)
        );
        assert_eq!(
            poll_interval(200 * MI),
            std::time::Duration::from_secs_f64(200.0 / 4096.0)
        );
        assert_eq!(poll_interval(20 * MI), POLL_MIN);
        assert_eq!(poll_interval(0), POLL_MIN);
    }

    #[test]
    fn v1_lines_are_the_kubelets_for_each_memory_threshold_hard_and_soft() {
        let t = tempfile::tempdir().unwrap();
        let src = sources(t.path(), t.path());
        assert_eq!(src.cgroups.layout(), Layout::V1);
        let obs = memory_observations();
        let memcgs = BTreeMap::from([
            (
                Signal::MemoryAvailable,
                MemcgReading {
                    dir: t.path().join("memory"),
                    inactive_file: 50 * MI,
                },
            ),
            (
                Signal::AllocatableMemoryAvailable,
                MemcgReading {
                    dir: t.path().join("memory/kubepods"),
                    inactive_file: 8 * MI,
                },
            ),
        ]);
        let thresholds = [
            threshold(Signal::MemoryAvailable, Amount::Quantity(100 * MI), None),
            threshold(
                Signal::AllocatableMemoryAvailable,
                Amount::Percentage(25.0),
                Some(60),
            ),
            threshold(Signal::NodefsAvailable, Amount::Percentage(10.0), None),
        ];
        let usage =
            |signal, soft, dir: &str, bytes, cgroup: &str, capacity, below, band| Watch::Usage {
                signal,
                soft,
                dir: t.path().join(dir),
                bytes,
                cgroup: cgroup.to_owned(),
                capacity,
                below,
                band,
            };
        let node = Signal::MemoryAvailable;
        let pods = Signal::AllocatableMemoryAvailable;
        assert_eq!(
            plan_v1(&thresholds, &obs, &memcgs, "/kubepods"),
            [
                usage(
                    node,
                    false,
                    "memory",
                    (1024 - 100 + 50) * MI,
                    "/",
                    1024 * MI,
                    100 * MI,
                    false
                ),
                // 500Mi above a hard line: a second line tells when it
                // comes within the band.
                usage(
                    node,
                    false,
                    "memory",
                    (1024 - 100 - 128 + 50) * MI,
                    "/",
                    1024 * MI,
                    100 * MI,
                    true
                ),
                // 25 % of 512Mi allocatable is 128Mi; soft, so no band.
                usage(
                    pods,
                    true,
                    "memory/kubepods",
                    (512 - 128 + 8) * MI,
                    "/kubepods",
                    512 * MI,
                    128 * MI,
                    false
                ),
            ]
        );
        // Farther than BAND_ARMED: the threshold's line alone.
        let mut far = obs.clone();
        far.signals.get_mut(&node).unwrap().available = (1024 + 100 + 1) * MI as i64;
        assert_eq!(
            plan_v1(&thresholds[..1], &far, &memcgs, "/kubepods").len(),
            1
        );
        // Within the band already: the threshold's line alone.
        let mut close = obs.clone();
        close.signals.get_mut(&node).unwrap().available = 200 * MI as i64;
        assert_eq!(
            plan_v1(&thresholds[..1], &close, &memcgs, "/kubepods").len(),
            1
        );
        assert_eq!(
            usage(node, false, "memory", 0, "/", 0, 0, true).to_string(),
            format!(
                "hard memory.available band on {}/memory (usage 0)",
                t.path().display()
            )
        );
        // A signal that was not observed gets no line.
        let none = Observations::new(obs.at);
        assert!(plan_v1(&thresholds, &none, &memcgs, "/kubepods").is_empty());
    }
}
