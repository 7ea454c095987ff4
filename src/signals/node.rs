//! Node-level eviction signals, read directly and fresh, as the kubelet
//! defines them (`pkg/kubelet/eviction/helpers.go`, makeSignalObservations):
//!
//! - `memory.available` = node capacity − working set of the root memory cgroup;
//! - `allocatableMemory.available` = the pods cgroup's limit (node
//!   allocatable) − its working set;
//! - `nodefs.*` / `imagefs.*` = free bytes / free inodes of the filesystems
//!   holding the kubelet's root and the runtime's root (`statvfs`);
//! - `pid.available` = the kernel's pid limit − processes now, or, when the
//!   pods' cgroup has a pids limit that leaves less, that limit − its tasks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use super::probe::{FsStats, fs_stats, fs_stats_id};
use super::{ReadError, probe, read};
use crate::cgroup::fs::{CgroupFs, psi_avg10};
use crate::eviction::thresholds::{Observation, Observations};
use crate::signals::table::{Filesystem, MemoryScope, STALL_CAPACITY, Signal, Source, Stall, Unit};

/// Where the node's signals come from.
#[derive(Clone, Debug)]
pub struct NodeSources {
    /// The cgroup hierarchy.
    pub cgroups: CgroupFs,
    /// procfs root (normally `/proc`).
    pub proc_root: PathBuf,
    /// Node memory capacity in bytes.
    pub memory_capacity: u64,
    /// The pods' cgroup as configured (`--kubepods-cgroup`: a path or a
    /// slice name); read through [`NodeSources::kubepods`].
    pub pods_cgroup: String,
    /// The kubelet's root directory (nodefs).
    pub nodefs: PathBuf,
    /// The runtime's root directory (imagefs).
    pub imagefs: PathBuf,
}

/// Whether a signal's source is a filesystem.
fn is_disk(s: Source) -> bool {
    matches!(s, Source::Statfs(_))
}

/// The kernel's pid limit: the smaller of `pid_max` and `threads-max`.
pub fn pid_limit(proc_root: &Path) -> Result<u64, ReadError> {
    let num = |p: PathBuf| -> Result<u64, ReadError> {
        let t = read(&p)?;
        t.trim().parse().map_err(|_| ReadError {
            path: p,
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, t.trim().to_owned()),
        })
    };
    Ok(num(proc_root.join("sys/kernel/pid_max"))?
        .min(num(proc_root.join("sys/kernel/threads-max"))?))
}

/// Processes (threads included, as the kernel counts pids) now: the
/// "running/total" field of `/proc/loadavg`.
pub fn pids_in_use(proc_root: &Path) -> Result<u64, ReadError> {
    let p = proc_root.join("loadavg");
    let t = read(&p)?;
    t.split_whitespace()
        .nth(3)
        .and_then(|f| f.split_once('/'))
        .and_then(|(_, total)| total.parse().ok())
        .ok_or_else(|| ReadError {
            path: p,
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, t.clone()),
        })
}

impl NodeSources {
    /// The pods' cgroup from the hierarchy root, resolved now
    /// ([`CgroupFs::kubepods_in`]: the default `/kubepods` is
    /// `/kubepods.slice` on a systemd-driver node).
    pub fn kubepods(&self) -> String {
        self.cgroups.kubepods_in(&self.pods_cgroup)
    }

    /// Reads every signal it can, stamped with the time the reading started;
    /// a signal whose source cannot be read is left out (and logged), never
    /// guessed. Each signal is read as [`Signal::source`] says; a filesystem
    /// is read once for its bytes and inodes signals. Blocking, and
    /// unbounded on a hung filesystem: criguard's loops call
    /// [`NodeSources::observe_bounded`].
    pub fn observe(&self) -> Observations {
        let at = std::time::Instant::now();
        let mut statfs: BTreeMap<Filesystem, Result<FsStats, String>> = BTreeMap::new();
        self.observe_from(
            at,
            |_| true,
            |fs| {
                statfs
                    .entry(fs)
                    .or_insert_with(|| fs_stats(self.root(fs)).map_err(|e| e.to_string()))
                    .clone()
            },
        )
    }

    /// The filesystem root a disk signal reads.
    fn root(&self, fs: Filesystem) -> &Path {
        match fs {
            Filesystem::Nodefs => &self.nodefs,
            Filesystem::Imagefs => &self.imagefs,
        }
    }

    /// [`NodeSources::observe`] that never stalls: the filesystems through
    /// [`probe::statvfs`] (a hung mount is reported stuck and its signals
    /// left out after at most [`probe::DEADLINE`]), memory and pids read on
    /// the blocking pool within the same deadline. Memory and pid signals
    /// are observed whatever the filesystems do.
    pub async fn observe_bounded(&self) -> Observations {
        let at = std::time::Instant::now();
        let me = self.clone();
        let memory_and_pids = tokio::task::spawn_blocking(move || {
            me.observe_from(at, |s| !is_disk(s), |_| Err("not read here".to_owned()))
        });
        let (nodefs, imagefs, rest) = tokio::join!(
            probe::statvfs(&self.nodefs),
            probe::statvfs(&self.imagefs),
            tokio::time::timeout(probe::DEADLINE, memory_and_pids)
        );
        let fs = |f: Filesystem| {
            match f {
                Filesystem::Nodefs => &nodefs,
                Filesystem::Imagefs => &imagefs,
            }
            .clone()
            .map_err(|e| e.to_string())
        };
        let mut obs = match rest {
            Ok(Ok(o)) => o,
            Ok(Err(err)) => {
                tracing::error!(%err, "memory and pid observation failed");
                Observations::new(at)
            }
            Err(_) => {
                tracing::warn!(
                    deadline = ?probe::DEADLINE,
                    "memory and pid signals not read within the deadline; not observed this round"
                );
                Observations::new(at)
            }
        };
        let disk = self.observe_from(at, is_disk, fs);
        obs.signals.extend(disk.signals);
        obs
    }

    /// Reads the signals whose source `wanted` accepts, the filesystems'
    /// through `statfs`.
    fn observe_from(
        &self,
        at: std::time::Instant,
        wanted: impl Fn(Source) -> bool,
        mut statfs: impl FnMut(Filesystem) -> Result<FsStats, String>,
    ) -> Observations {
        let mut obs = Observations::new(at);
        for sig in Signal::ALL.into_iter().filter(|s| wanted(s.source())) {
            let read = match sig.source() {
                Source::Memcg(scope) => self.memory(scope),
                Source::Statfs(fs) => match statfs(fs) {
                    Ok(s) if sig.unit() == Unit::Inodes => Ok(Observation {
                        available: s.inodes_free as i64,
                        capacity: s.inodes,
                    }),
                    Ok(s) => Ok(Observation {
                        available: s.available as i64,
                        capacity: s.capacity,
                    }),
                    Err(err) => {
                        tracing::debug!(signal = %sig, %err, "signal not observed");
                        continue;
                    }
                },
                Source::Pids => self.pids(),
                Source::Psi(line) => self.stall(line),
                Source::Swap => match self.swap() {
                    Ok(Some(o)) => Ok(o),
                    // No swap: the signal is absent, not zero.
                    Ok(None) => continue,
                    Err(err) => Err(err),
                },
            };
            match read {
                Ok(o) => {
                    obs.signals.insert(sig, o);
                }
                Err(err) => tracing::debug!(signal = %sig, %err, "signal not observed"),
            }
        }
        obs
    }

    /// A memory signal: the capacity it counts against minus the cgroup's
    /// working set (the node's capacity for the root; for the pods' cgroup
    /// its limit, node allocatable, capped at capacity).
    fn memory(&self, scope: MemoryScope) -> Result<Observation, ReadError> {
        match scope {
            MemoryScope::Node => self.cgroups.memory("/").map(|m| Observation {
                available: self.memory_capacity as i64 - m.working_set as i64,
                capacity: self.memory_capacity,
            }),
            MemoryScope::Pods => self.cgroups.memory(&self.kubepods()).map(|m| {
                let allocatable = m
                    .limit
                    .unwrap_or(self.memory_capacity)
                    .min(self.memory_capacity);
                Observation {
                    available: allocatable as i64 - m.working_set as i64,
                    capacity: allocatable,
                }
            }),
        }
    }

    /// `pid.available`: the kernel's limit minus tasks, or the pods' own
    /// pids limit when it leaves less.
    fn pids(&self) -> Result<Observation, ReadError> {
        let limit = pid_limit(&self.proc_root)?;
        let used = pids_in_use(&self.proc_root)?;
        let node = Observation {
            available: limit as i64 - used as i64,
            capacity: limit,
        };
        // Beyond the kubelet: a pids limit on the pods' cgroup
        // (system-reserved pids) is the tighter bound for pods.
        Ok(match self.cgroups.pids_counter(&self.kubepods()) {
            Ok((current, Some(max))) if (max as i64 - current as i64) < node.available => {
                Observation {
                    available: max as i64 - current as i64,
                    capacity: max,
                }
            }
            _ => node,
        })
    }

    /// `swap.available`: `SwapFree` of `SwapTotal`; `None` on a node
    /// without swap.
    pub fn swap(&self) -> Result<Option<Observation>, ReadError> {
        let p = self.proc_root.join("meminfo");
        let text = read(&p)?;
        let (total, free) = swap_total_free(&text).ok_or_else(|| ReadError {
            path: p,
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "no SwapTotal or SwapFree line",
            ),
        })?;
        Ok((total > 0).then_some(Observation {
            available: free as i64,
            capacity: total,
        }))
    }

    /// A stall signal from `/proc/pressure/memory`: `avg10` of `line`, as
    /// basis points of time not stalled out of [`STALL_CAPACITY`]. A kernel
    /// without PSI has no such file: the signal is absent.
    pub fn stall(&self, line: Stall) -> Result<Observation, ReadError> {
        let p = self.proc_root.join("pressure/memory");
        let text = read(&p)?;
        let stalled = psi_avg10(&text, line.name()).ok_or_else(|| ReadError {
            path: p,
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, text.clone()),
        })?;
        Ok(Observation {
            available: STALL_CAPACITY as i64 - stalled as i64,
            capacity: STALL_CAPACITY,
        })
    }
}

/// A `/proc/meminfo` field in bytes (its lines are in KiB).
fn meminfo_bytes(meminfo: &str, field: &str) -> Option<u64> {
    let line = meminfo
        .lines()
        .find(|l| l.split(':').next() == Some(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `SwapTotal` and `SwapFree` from `/proc/meminfo` text, in bytes.
pub fn swap_total_free(meminfo: &str) -> Option<(u64, u64)> {
    Some((
        meminfo_bytes(meminfo, "SwapTotal")?,
        meminfo_bytes(meminfo, "SwapFree")?,
    ))
}

/// `MemTotal` from `/proc/meminfo` text, in bytes: the capacity the kubelet
/// (through cAdvisor) uses in its `oom_score_adj` formula.
pub fn mem_total(meminfo: &str) -> Option<i64> {
    meminfo_bytes(meminfo, "MemTotal").map(|b| b as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::signals::write_fixture as write;

    /// A procfs fixture: a pid limit of 1000 (threads-max) and 250 tasks.
    fn proc_fixture(dir: &Path) -> PathBuf {
        let proc = dir.join("proc");
        write(&proc, "sys/kernel/pid_max", "32768\n");
        write(&proc, "sys/kernel/threads-max", "1000\n");
        write(&proc, "loadavg", "0.10 0.20 0.30 2/250 12345\n");
        proc
    }

    /// Sources over cgroup root `cg`, with `fs` as nodefs and imagefs,
    /// procfs `proc` and 10 000 bytes of memory.
    fn sources(cg: &Path, fs: &Path, proc: &Path) -> NodeSources {
        NodeSources {
            cgroups: CgroupFs::detect(cg),
            proc_root: proc.to_owned(),
            memory_capacity: 10_000,
            pods_cgroup: "/kubepods".into(),
            nodefs: fs.to_owned(),
            imagefs: fs.to_owned(),
        }
    }

    #[test]
    fn memory_and_pid_signals_from_a_v2_fixture_tree() {
        let t = tempfile::tempdir().unwrap();
        let cg = t.path().join("cg");
        write(&cg, "cgroup.controllers", "memory pids\n");
        write(&cg, "memory.current", "3000\n");
        write(&cg, "memory.stat", "inactive_file 1000\n");
        write(&cg, "memory.max", "max\n");
        write(&cg, "kubepods/memory.current", "1500\n");
        write(&cg, "kubepods/memory.stat", "inactive_file 500\n");
        write(&cg, "kubepods/memory.max", "4000\n");
        let proc = proc_fixture(t.path());
        let src = sources(&cg, t.path(), &proc);
        let before = std::time::Instant::now();
        let o = src.observe();
        assert!(
            before <= o.at && o.at <= std::time::Instant::now(),
            "stamped when read"
        );
        assert_eq!(
            o.signals[&Signal::MemoryAvailable],
            Observation {
                available: 8000,
                capacity: 10_000
            }
        );
        assert_eq!(
            o.signals[&Signal::AllocatableMemoryAvailable],
            Observation {
                available: 3000,
                capacity: 4000
            }
        );
        assert_eq!(
            o.signals[&Signal::PidAvailable],
            Observation {
                available: 750,
                capacity: 1000
            }
        );
        assert!(
            o.signals.contains_key(&Signal::NodefsAvailable)
                && o.signals.contains_key(&Signal::ImagefsInodesFree)
        );
    }

    #[test]
    fn a_pids_limit_on_the_pods_cgroup_bounds_pid_available() {
        let t = tempfile::tempdir().unwrap();
        let cg = t.path().join("cg");
        write(&cg, "cgroup.controllers", "memory pids\n");
        write(&cg, "kubepods/pids.current", "90\n");
        write(&cg, "kubepods/pids.max", "100\n");
        write(&cg, "unlimited/pids.current", "90\n");
        write(&cg, "unlimited/pids.max", "max\n");
        let proc = proc_fixture(t.path());
        let mut src = sources(&cg, t.path(), &proc);
        let pid = |src: &NodeSources| *src.observe().get(&Signal::PidAvailable).unwrap();
        let bounded = Observation {
            available: 10,
            capacity: 100,
        };
        assert_eq!(pid(&src), bounded);
        src.pods_cgroup = "/unlimited".into();
        let node = Observation {
            available: 750,
            capacity: 1000,
        };
        assert_eq!(pid(&src), node);
    }

    #[test]
    fn statvfs_agrees_with_an_independent_reading() {
        // `stat -f` reads the same kernel numbers through coreutils.
        let out = std::process::Command::new("stat")
            .args(["-f", "-c", "%S %b %a %c %d", "/"])
            .output()
            .unwrap();
        let f: Vec<u64> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        let s = fs_stats(Path::new("/")).unwrap();
        assert_eq!(s.capacity, f[0] * f[1]);
        assert_eq!(s.inodes, f[3]);
        // Free space and inodes move while other tests run; allow a little.
        assert!((s.available as i64 - (f[0] * f[2]) as i64).unsigned_abs() < 256 << 20);
        assert!((s.inodes_free as i64 - f[4] as i64).unsigned_abs() < 100_000);
    }

    #[test]
    fn swap_is_observed_from_meminfo_and_absent_without_swap() {
        let t = tempfile::tempdir().unwrap();
        let proc = proc_fixture(t.path());
        let src = sources(t.path(), t.path(), &proc);
        assert!(src.swap().is_err(), "no meminfo: an error, not a guess");
        write(
            &proc,
            "meminfo",
            "MemTotal: 8 kB\nSwapTotal:  0 kB\nSwapFree:  0 kB\n",
        );
        assert_eq!(src.swap().unwrap(), None);
        assert!(!src.observe().signals.contains_key(&Signal::SwapAvailable));
        write(
            &proc,
            "meminfo",
            "SwapCached: 4 kB\nSwapTotal: 2048 kB\nSwapFree:  512 kB\n",
        );
        let want = Observation {
            available: 512 * 1024,
            capacity: 2048 * 1024,
        };
        assert_eq!(src.swap().unwrap(), Some(want));
        assert_eq!(src.observe().signals[&Signal::SwapAvailable], want);
    }

    #[test]
    fn stall_is_read_from_proc_pressure_memory_as_the_share_not_stalled() {
        let text = "some avg10=12.34 avg60=5.00 avg300=1.00 total=123\nfull avg10=2.50 avg60=1.00 avg300=0.00 total=45\n";
        assert_eq!(psi_avg10(text, Stall::Some.name()), Some(1234));
        assert_eq!(psi_avg10(text, Stall::Full.name()), Some(250));
        assert_eq!(psi_avg10("some avg60=1.00\n", "some"), None);
        let t = tempfile::tempdir().unwrap();
        let proc = proc_fixture(t.path());
        let src = sources(t.path(), t.path(), &proc);
        // A kernel without PSI: absent.
        assert!(
            !src.observe()
                .signals
                .contains_key(&Signal::MemoryPressureSome)
        );
        write(&proc, "pressure/memory", text);
        let o = src.observe();
        assert_eq!(
            o.signals[&Signal::MemoryPressureSome].available,
            10_000 - 1234
        );
        assert_eq!(
            o.signals[&Signal::MemoryPressureFull].capacity,
            STALL_CAPACITY
        );
    }

    #[test]
    fn mem_total_reads_kib() {
        let text = "MemTotal:       24567892 kB\nMemFree:         1000 kB\n";
        assert_eq!(super::mem_total(text), Some(24567892 * 1024));
        assert_eq!(super::mem_total("MemFree: 1 kB"), None);
    }
}
