//! The eviction manager's collaborators, as the kubelet's
//! `pkg/kubelet/eviction/types.go` draws them (a summary provider,
//! `ImageGC`, `ContainerGC`, `KillPodFunc`, a clock): the manager decides,
//! these observe and act. Each is a trait object, so that the manager's
//! decisions are tested with fakes (`super::manager`'s tests) and criguard
//! wires the real ones (`src/serve/guard.rs`):
//!
//! | seam | real implementation |
//! |---|---|
//! | [`Signals`] | [`NodeSources`] (cgroupfs, `/proc`, statvfs; bounded, blocking reads on the blocking pool) |
//! | [`Rank`] | [`Ranker`] (the model, cgroups and per-pod usage, read on the blocking pool) |
//! | [`NodeReclaim`] | [`super::collectors::Collectors`] (dead-container GC, image GC) |
//! | [`PodKiller`] | [`super::killer::RuntimeKiller`] (the cgroup kill, CRI stops, container removal) |
//! | [`Reporter`] | [`KubeReport`] (pod status, events, node conditions and taints) |
//! | [`Clock`] | [`SystemClock`] |
//!
//! Futures are boxed ([`BoxFuture`]) so that the traits stay object-safe
//! and the manager's round stays `Send` for `tokio::spawn`.

use std::collections::BTreeSet;
use std::time::Instant;

use futures::FutureExt;
use futures::future::BoxFuture;

use crate::eviction::rank::{Ranker, StorageReading, Victim};
use crate::eviction::thresholds::Observations;
use crate::kube::{KubeReport, PodEviction};
use crate::model::Pod;
use crate::signals::node::NodeSources;
use crate::signals::table::{Condition, Signal};

/// Observes the node's signals.
pub trait Signals: Send + Sync {
    /// Fresh observations of every signal that could be read, stamped with
    /// when the reading started; never stalls on a hung source (a signal
    /// that could not be read in time is left out).
    fn observe(&self) -> BoxFuture<'_, Observations>;
}

/// Ranks the pods for each kind of signal, first victim first, leaving out
/// the sandboxes in `tried` and pods that may not be evicted.
pub trait Rank: Send + Sync {
    /// The memory ranking.
    fn memory<'a>(&'a self, tried: &'a BTreeSet<String>) -> BoxFuture<'a, Vec<Victim>>;
    /// The pid ranking.
    fn pids<'a>(&'a self, tried: &'a BTreeSet<String>) -> BoxFuture<'a, Vec<Victim>>;
    /// The swap ranking.
    fn swap<'a>(&'a self, tried: &'a BTreeSet<String>) -> BoxFuture<'a, Vec<Victim>>;
    /// The ranking for disk signal `signal`.
    fn disk<'a>(
        &'a self,
        signal: Signal,
        tried: &'a BTreeSet<String>,
    ) -> BoxFuture<'a, Vec<Victim>>;
    /// The pods with a local-storage limit, but those in `skip`, read: those
    /// over a limit (`localStorageEviction`) and how full each is; nothing
    /// without the API's pods.
    fn local_storage<'a>(&'a self, skip: &'a BTreeSet<String>) -> BoxFuture<'a, StorageReading> {
        let _ = skip;
        futures::future::ready(StorageReading::default()).boxed()
    }
}

/// Node-level reclaim, tried before a pod is evicted for a disk signal.
pub trait NodeReclaim: Send + Sync {
    /// Whether the images live on a filesystem of their own.
    fn dedicated_imagefs(&self) -> bool;
    /// Removes dead containers and sandboxes; returns the bytes freed.
    fn collect_containers(&self) -> BoxFuture<'_, u64>;
    /// Removes unused images until `bytes` are freed (every unused one for
    /// `u64::MAX`); returns the bytes freed.
    fn free_images(&self, bytes: u64) -> BoxFuture<'_, u64>;
}

/// Stops an evicted pod.
pub trait PodKiller: Send + Sync {
    /// Kills `pod`'s processes at once (a grace period of 0), before the
    /// runtime hears of the stop; true when they were killed.
    fn kill_now(&self, pod: &Pod) -> bool;
    /// Stops `pod` through the runtime, giving its containers `grace_s`;
    /// true when the stop completed, false when the runtime did not answer
    /// or failed (the caller then hands it to [`PodKiller::retry_stop`]).
    fn stop<'a>(&'a self, pod: &'a Pod, grace_s: i64) -> BoxFuture<'a, bool>;
    /// Retries the sandbox's stop in the background until the runtime
    /// answers, calling `stopped` once it completed.
    fn retry_stop(&self, sandbox_id: &str, stopped: Box<dyn FnOnce() + Send>);
    /// Removes `pod`'s containers with their writable layers and logs.
    fn remove_containers<'a>(&'a self, pod: &'a Pod) -> BoxFuture<'a, ()>;
}

/// Reports evictions and pressure to the Kubernetes API.
pub trait Reporter: Send + Sync {
    /// The node's pressure conditions now (written in the background).
    fn node_conditions(&self, conditions: &BTreeSet<Condition>);
    /// An evicted pod's status and event; returns once the status write
    /// answered or the report's bound passed.
    fn pod_evicted(&self, e: PodEviction) -> BoxFuture<'_, ()>;
}

/// The time: monotonic for durations, wall-clock for records.
pub trait Clock: Send + Sync {
    /// Now, on the monotonic clock.
    fn now(&self) -> Instant;
    /// Now, ms since the epoch (0 before it).
    fn unix_ms(&self) -> u64;
}

/// The system's clocks.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn unix_ms(&self) -> u64 {
        crate::clock::now_ms()
    }
}

impl Signals for NodeSources {
    fn observe(&self) -> BoxFuture<'_, Observations> {
        self.observe_bounded().boxed()
    }
}

impl Rank for Ranker {
    fn memory<'a>(&'a self, tried: &'a BTreeSet<String>) -> BoxFuture<'a, Vec<Victim>> {
        Ranker::memory(self, tried).boxed()
    }

    fn pids<'a>(&'a self, tried: &'a BTreeSet<String>) -> BoxFuture<'a, Vec<Victim>> {
        Ranker::pids(self, tried).boxed()
    }

    fn swap<'a>(&'a self, tried: &'a BTreeSet<String>) -> BoxFuture<'a, Vec<Victim>> {
        Ranker::swap(self, tried).boxed()
    }

    fn disk<'a>(
        &'a self,
        signal: Signal,
        tried: &'a BTreeSet<String>,
    ) -> BoxFuture<'a, Vec<Victim>> {
        Ranker::disk(self, signal, tried).boxed()
    }

    fn local_storage<'a>(&'a self, skip: &'a BTreeSet<String>) -> BoxFuture<'a, StorageReading> {
        Ranker::local_storage(self, skip).boxed()
    }
}

impl Reporter for KubeReport {
    fn node_conditions(&self, conditions: &BTreeSet<Condition>) {
        KubeReport::node_conditions(self, conditions);
    }

    fn pod_evicted(&self, e: PodEviction) -> BoxFuture<'_, ()> {
        KubeReport::pod_evicted(self, e).boxed()
    }
}
