//! The eviction signals and what each one means, in one table.
//!
//! The kubelet keeps one map per fact (signal → node condition, signal →
//! resource, signal → rank function, signal → observation). criguard keeps
//! the same facts as methods of [`Signal`], each a `match` with one arm per
//! signal and no catch-all. Every other module asks these methods instead
//! of matching on signals itself, so a new signal is a compile error here,
//! method by method, and nowhere else: nothing can silently treat it as,
//! say, a disk signal.

/// An eviction signal, by the kubelet's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    /// `memory.available`: node capacity − node working set.
    MemoryAvailable,
    /// `allocatableMemory.available`: pods' allocatable − pods' working set.
    AllocatableMemoryAvailable,
    /// `nodefs.available`: free bytes of the kubelet's filesystem.
    NodefsAvailable,
    /// `nodefs.inodesFree`: free inodes of the kubelet's filesystem.
    NodefsInodesFree,
    /// `imagefs.available`: free bytes of the runtime's filesystem.
    ImagefsAvailable,
    /// `imagefs.inodesFree`: free inodes of the runtime's filesystem.
    ImagefsInodesFree,
    /// `pid.available`: pid limit − processes.
    PidAvailable,
    /// `swap.available`: free swap of the node (`SwapFree`); not a kubelet
    /// signal, which evicts on no swap signal (KEP-2400 left it out).
    SwapAvailable,
    /// `memory.pressure.some`: the node's memory stall, PSI `some avg10`
    /// (the share of the last 10 s in which some task waited on memory);
    /// not a kubelet signal. Its thresholds read `>`: stalled more than.
    MemoryPressureSome,
    /// `memory.pressure.full`: PSI `full avg10`, the share in which every
    /// non-idle task waited on memory at once.
    MemoryPressureFull,
}

/// Which PSI line a stall signal reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stall {
    /// `some`: at least one task stalled.
    Some,
    /// `full`: every non-idle task stalled.
    Full,
}

impl Stall {
    /// The PSI file's line: `some` or `full`.
    pub fn name(self) -> &'static str {
        match self {
            Stall::Some => "some",
            Stall::Full => "full",
        }
    }
}

/// A stall signal's capacity: its amounts are basis points of time, the
/// observation's "available" the share *not* stalled, so that a threshold
/// is met below it as for every other signal.
pub const STALL_CAPACITY: u64 = 10_000;

/// Why a sandbox was refused; its name labels the refusal metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// criguard evicted this pod UID.
    Evicted,
    /// The node has DiskPressure.
    DiskPressure,
    /// The node has MemoryPressure and the pod is BestEffort.
    MemoryPressure,
}

impl Refusal {
    /// The metric label: `Evicted`, `DiskPressure` or `MemoryPressure`.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Evicted => "Evicted",
            Refusal::DiskPressure => "DiskPressure",
            Refusal::MemoryPressure => "MemoryPressure",
        }
    }
}

/// A node condition the kubelet reports under pressure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Condition {
    /// From `memory.available` and `allocatableMemory.available`.
    MemoryPressure,
    /// From the nodefs and imagefs signals.
    DiskPressure,
    /// From `pid.available`.
    PIDPressure,
}

/// The resource a signal is short of, as the kubelet names it in eviction
/// messages (`The node was low on resource: memory.`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    /// `memory`.
    Memory,
    /// `ephemeral-storage`.
    EphemeralStorage,
    /// `inodes`.
    Inodes,
    /// `pids`.
    Pids,
    /// `swap`.
    Swap,
}

impl Resource {
    /// The kubelet's name of the resource.
    pub fn name(self) -> &'static str {
        match self {
            Resource::Memory => "memory",
            Resource::EphemeralStorage => "ephemeral-storage",
            Resource::Inodes => "inodes",
            Resource::Pids => "pids",
            Resource::Swap => "swap",
        }
    }
}

/// What a signal's amounts count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// Bytes (memory, filesystem space).
    Bytes,
    /// Filesystem inodes.
    Inodes,
    /// Processes (pids).
    Processes,
    /// Basis points of time not stalled (out of [`STALL_CAPACITY`]).
    Stall,
}

/// A filesystem the disk signals watch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Filesystem {
    /// The kubelet's root directory's filesystem (logs, emptyDirs).
    Nodefs,
    /// The runtime's root directory's filesystem (images, writable layers).
    Imagefs,
}

/// A memory cgroup a memory signal reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryScope {
    /// The root cgroup: the whole node.
    Node,
    /// The pods' cgroup (`kubepods`): node allocatable.
    Pods,
}

/// How a signal is observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// The working set of a memory cgroup (with usage-threshold events on
    /// cgroup v1 and PSI on v2 between readings).
    Memcg(MemoryScope),
    /// `statvfs` of a filesystem.
    Statfs(Filesystem),
    /// The kernel's pid limit and task count (and a pids limit on the pods'
    /// cgroup).
    Pids,
    /// The node's swap (`SwapTotal`, `SwapFree` of `/proc/meminfo`).
    Swap,
    /// The node's memory pressure (`/proc/pressure/memory`).
    Psi(Stall),
}

/// How pods are ranked for a signal. The order of the variants is the order
/// an eviction round acts in: memory first, then pids, then disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ranking {
    /// Over request first, then lower priority, then usage above request.
    Memory,
    /// Over the `LimitedSwap` entitlement first, then lower priority, then
    /// more swap used.
    Swap,
    /// Lower priority, then more tasks.
    Pids,
    /// Lower priority, then the disk usage the signal counts
    /// ([`Signal::pod_parts`]).
    Disk,
}

/// The parts of a pod's disk usage a disk signal counts (the kubelet's
/// `fsStatsType`s in `buildSignalToRankFunc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PodParts {
    /// Its containers' writable layers (`fsStatsRoot`).
    pub rootfs: bool,
    /// Its log directory (`fsStatsLogs`).
    pub logs: bool,
    /// Its emptyDir volumes (`fsStatsLocalVolumeSource`).
    pub volumes: bool,
}

impl Signal {
    /// Every signal, in display order.
    pub const ALL: [Signal; 10] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::NodefsAvailable,
        Signal::NodefsInodesFree,
        Signal::ImagefsAvailable,
        Signal::ImagefsInodesFree,
        Signal::PidAvailable,
        Signal::SwapAvailable,
        Signal::MemoryPressureSome,
        Signal::MemoryPressureFull,
    ];

    /// The kubelet's name of the signal.
    pub fn name(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::AllocatableMemoryAvailable => "allocatableMemory.available",
            Signal::NodefsAvailable => "nodefs.available",
            Signal::NodefsInodesFree => "nodefs.inodesFree",
            Signal::ImagefsAvailable => "imagefs.available",
            Signal::ImagefsInodesFree => "imagefs.inodesFree",
            Signal::PidAvailable => "pid.available",
            Signal::SwapAvailable => "swap.available",
            Signal::MemoryPressureSome => "memory.pressure.some",
            Signal::MemoryPressureFull => "memory.pressure.full",
        }
    }

    /// The signal with this name.
    pub fn parse(name: &str) -> Option<Signal> {
        Signal::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The node condition its thresholds raise (the kubelet's
    /// `signalToNodeCondition`; swap is memory: a node out of swap is out of
    /// memory, and admits no BestEffort pod).
    pub fn condition(self) -> Condition {
        match self {
            Signal::MemoryAvailable
            | Signal::AllocatableMemoryAvailable
            | Signal::SwapAvailable
            | Signal::MemoryPressureSome
            | Signal::MemoryPressureFull => Condition::MemoryPressure,
            Signal::NodefsAvailable
            | Signal::NodefsInodesFree
            | Signal::ImagefsAvailable
            | Signal::ImagefsInodesFree => Condition::DiskPressure,
            Signal::PidAvailable => Condition::PIDPressure,
        }
    }

    /// The resource named in its eviction messages (the kubelet's
    /// `signalToResource`).
    pub fn resource(self) -> Resource {
        match self {
            Signal::MemoryAvailable
            | Signal::AllocatableMemoryAvailable
            | Signal::MemoryPressureSome
            | Signal::MemoryPressureFull => Resource::Memory,
            Signal::NodefsAvailable | Signal::ImagefsAvailable => Resource::EphemeralStorage,
            Signal::NodefsInodesFree | Signal::ImagefsInodesFree => Resource::Inodes,
            Signal::PidAvailable => Resource::Pids,
            Signal::SwapAvailable => Resource::Swap,
        }
    }

    /// What its amounts count.
    pub fn unit(self) -> Unit {
        match self {
            Signal::MemoryAvailable
            | Signal::AllocatableMemoryAvailable
            | Signal::NodefsAvailable
            | Signal::ImagefsAvailable
            | Signal::SwapAvailable => Unit::Bytes,
            Signal::NodefsInodesFree | Signal::ImagefsInodesFree => Unit::Inodes,
            Signal::PidAvailable => Unit::Processes,
            Signal::MemoryPressureSome | Signal::MemoryPressureFull => Unit::Stall,
        }
    }

    /// Whether the signal counts bytes (else inodes, pids or stall).
    pub fn is_bytes(self) -> bool {
        self.unit() == Unit::Bytes
    }

    /// Its capacity for people: a stall signal's is all the time (`100%`).
    pub fn show_capacity(self, capacity: u64) -> String {
        match self.unit() {
            Unit::Stall => "100%".to_owned(),
            _ => self.show(capacity as i64),
        }
    }

    /// Whether the usage pods are ranked by for it is bytes: memory for
    /// every memory ranking (the stall signals' too), swap, disk space.
    pub fn ranks_bytes(self) -> bool {
        self.is_bytes() || self.ranking() == Ranking::Memory
    }

    /// Whether it is a stall signal, whose thresholds read `>`.
    pub fn is_stall(self) -> bool {
        self.unit() == Unit::Stall
    }

    /// An amount of it for people: bytes as `100Mi`, a stall as the share
    /// stalled (`12.5% stalled`, from the share not stalled), else the
    /// number.
    pub fn show(self, v: i64) -> String {
        match self.unit() {
            Unit::Bytes if v >= 0 => crate::quantity::format_bytes(v as u64),
            Unit::Stall => {
                let stalled = STALL_CAPACITY as i64 - v;
                format!("{:.2}% stalled", stalled as f64 / 100.0)
            }
            _ => v.to_string(),
        }
    }

    /// Where it is read from.
    pub fn source(self) -> Source {
        match self {
            Signal::MemoryAvailable => Source::Memcg(MemoryScope::Node),
            Signal::AllocatableMemoryAvailable => Source::Memcg(MemoryScope::Pods),
            Signal::NodefsAvailable | Signal::NodefsInodesFree => {
                Source::Statfs(Filesystem::Nodefs)
            }
            Signal::ImagefsAvailable | Signal::ImagefsInodesFree => {
                Source::Statfs(Filesystem::Imagefs)
            }
            Signal::PidAvailable => Source::Pids,
            Signal::SwapAvailable => Source::Swap,
            Signal::MemoryPressureSome => Source::Psi(Stall::Some),
            Signal::MemoryPressureFull => Source::Psi(Stall::Full),
        }
    }

    /// How pods are ranked for it (the kubelet's `signalToRankFunc`).
    pub fn ranking(self) -> Ranking {
        match self {
            Signal::MemoryAvailable
            | Signal::AllocatableMemoryAvailable
            | Signal::MemoryPressureSome
            | Signal::MemoryPressureFull => Ranking::Memory,
            Signal::NodefsAvailable
            | Signal::NodefsInodesFree
            | Signal::ImagefsAvailable
            | Signal::ImagefsInodesFree => Ranking::Disk,
            Signal::PidAvailable => Ranking::Pids,
            Signal::SwapAvailable => Ranking::Swap,
        }
    }

    /// The parts of a pod's disk usage it counts, `None` for signals that
    /// are not about disk. With a dedicated imagefs, nodefs counts logs and
    /// emptyDirs and imagefs the writable layers; without one, both count
    /// all three (the kubelet's `buildSignalToRankFunc`).
    pub fn pod_parts(self, dedicated_imagefs: bool) -> Option<PodParts> {
        let all = PodParts {
            rootfs: true,
            logs: true,
            volumes: true,
        };
        match self.source() {
            Source::Memcg(_) | Source::Pids | Source::Swap | Source::Psi(_) => None,
            Source::Statfs(_) if !dedicated_imagefs => Some(all),
            Source::Statfs(Filesystem::Nodefs) => Some(PodParts {
                rootfs: false,
                ..all
            }),
            Source::Statfs(Filesystem::Imagefs) => Some(PodParts {
                rootfs: true,
                logs: false,
                volumes: false,
            }),
        }
    }
}

impl std::fmt::Display for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Position in [`Signal::ALL`]; a match with no catch-all, so a new
    /// signal fails to compile here until `ALL` is looked at too.
    fn position(s: Signal) -> usize {
        match s {
            Signal::MemoryAvailable => 0,
            Signal::AllocatableMemoryAvailable => 1,
            Signal::NodefsAvailable => 2,
            Signal::NodefsInodesFree => 3,
            Signal::ImagefsAvailable => 4,
            Signal::ImagefsInodesFree => 5,
            Signal::PidAvailable => 6,
            Signal::SwapAvailable => 7,
            Signal::MemoryPressureSome => 8,
            Signal::MemoryPressureFull => 9,
        }
    }

    #[test]
    fn all_lists_every_signal_once_and_names_round_trip() {
        for (i, s) in Signal::ALL.into_iter().enumerate() {
            assert_eq!(position(s), i, "{s}");
            assert_eq!(Signal::parse(s.name()), Some(s));
        }
        assert_eq!(Signal::parse("containerfs.available"), None);
    }

    /// The kubelet's `signalToNodeCondition` and `signalToResource`
    /// (pkg/kubelet/eviction/helpers.go), signal by signal.
    #[test]
    fn condition_and_resource_are_the_kubelets() {
        use Condition::*;
        let kubelet = [
            ("memory.available", MemoryPressure, "memory"),
            ("allocatableMemory.available", MemoryPressure, "memory"),
            ("nodefs.available", DiskPressure, "ephemeral-storage"),
            ("nodefs.inodesFree", DiskPressure, "inodes"),
            ("imagefs.available", DiskPressure, "ephemeral-storage"),
            ("imagefs.inodesFree", DiskPressure, "inodes"),
            ("pid.available", PIDPressure, "pids"),
        ];
        // Every signal but criguard's own swap and stall signals.
        assert_eq!(kubelet.len(), Signal::ALL.len() - 3);
        for (name, condition, resource) in kubelet {
            let s = Signal::parse(name).unwrap();
            assert_eq!(s.condition(), condition, "{name}");
            assert_eq!(s.resource().name(), resource, "{name}");
        }
    }

    /// Each signal's facts agree with one another: its condition, resource,
    /// unit, source and ranking all say the same kind of signal.
    #[test]
    fn every_signals_facts_are_coherent() {
        for s in Signal::ALL {
            let facts = (
                s.condition(),
                s.ranking(),
                s.source(),
                s.resource(),
                s.unit(),
            );
            let coherent = match facts {
                (Condition::MemoryPressure, Ranking::Memory, Source::Memcg(_), r, u) => {
                    r == Resource::Memory && u == Unit::Bytes
                }
                (Condition::DiskPressure, Ranking::Disk, Source::Statfs(_), r, u) => {
                    (r == Resource::EphemeralStorage && u == Unit::Bytes)
                        || (r == Resource::Inodes && u == Unit::Inodes)
                }
                (Condition::PIDPressure, Ranking::Pids, Source::Pids, r, u) => {
                    r == Resource::Pids && u == Unit::Processes
                }
                (Condition::MemoryPressure, Ranking::Swap, Source::Swap, r, u) => {
                    r == Resource::Swap && u == Unit::Bytes
                }
                (Condition::MemoryPressure, Ranking::Memory, Source::Psi(_), r, u) => {
                    r == Resource::Memory && u == Unit::Stall
                }
                _ => false,
            };
            assert!(coherent, "{s}: {facts:?}");
            // Only disk signals count parts of a pod's disk usage, and each
            // counts something.
            for dedicated in [false, true] {
                let parts = s.pod_parts(dedicated);
                assert_eq!(parts.is_some(), s.ranking() == Ranking::Disk, "{s}");
                if let Some(p) = parts {
                    assert!(p.rootfs || p.logs || p.volumes, "{s}");
                }
            }
            // The name says the filesystem and the unit.
            if let Source::Statfs(fs) = s.source() {
                let prefix = match fs {
                    Filesystem::Nodefs => "nodefs.",
                    Filesystem::Imagefs => "imagefs.",
                };
                assert!(s.name().starts_with(prefix), "{s}");
                assert_eq!(s.name().ends_with("inodesFree"), s.unit() == Unit::Inodes);
            }
        }
    }

    /// The kubelet's `buildSignalToRankFunc`: with a dedicated imagefs,
    /// nodefs ranks by logs and local volumes, imagefs by the root
    /// filesystem; without, both rank by all three.
    #[test]
    fn disk_signals_count_the_kubelets_parts() {
        let (t, f) = (true, false);
        let p = |rootfs, logs, volumes| {
            Some(PodParts {
                rootfs,
                logs,
                volumes,
            })
        };
        for s in [Signal::NodefsAvailable, Signal::NodefsInodesFree] {
            assert_eq!(s.pod_parts(true), p(f, t, t), "{s}");
            assert_eq!(s.pod_parts(false), p(t, t, t), "{s}");
        }
        for s in [Signal::ImagefsAvailable, Signal::ImagefsInodesFree] {
            assert_eq!(s.pod_parts(true), p(t, f, f), "{s}");
            assert_eq!(s.pod_parts(false), p(t, t, t), "{s}");
        }
    }

    #[test]
    fn rounds_act_on_memory_then_swap_then_pids_then_disk() {
        assert!(Ranking::Memory < Ranking::Swap);
        assert!(Ranking::Swap < Ranking::Pids && Ranking::Pids < Ranking::Disk);
    }

    #[test]
    fn stall_signals_rank_as_memory_and_show_the_share_stalled() {
        for (name, line) in [
            ("memory.pressure.some", Stall::Some),
            ("memory.pressure.full", Stall::Full),
        ] {
            let s = Signal::parse(name).unwrap();
            assert_eq!(s.source(), Source::Psi(line));
            assert_eq!(
                (s.condition(), s.ranking()),
                (Condition::MemoryPressure, Ranking::Memory)
            );
            assert!(s.is_stall() && !s.is_bytes());
            assert_eq!(s.show(8750), "12.50% stalled");
        }
        assert_eq!(
            Signal::MemoryPressureFull.show_capacity(STALL_CAPACITY),
            "100%"
        );
        assert_eq!(Signal::MemoryAvailable.show(100 << 20), "100Mi");
        assert_eq!(Signal::PidAvailable.show(42), "42");
    }

    #[test]
    fn swap_is_criguards_memory_signal_of_its_own() {
        let s = Signal::parse("swap.available").unwrap();
        assert_eq!(s.condition(), Condition::MemoryPressure);
        assert_eq!(s.resource().name(), "swap");
        assert_eq!((s.source(), s.ranking()), (Source::Swap, Ranking::Swap));
        assert!(s.is_bytes() && s.pod_parts(true).is_none());
    }
}
