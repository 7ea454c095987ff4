//! Filesystem observations that cannot stall criguard.
//!
//! `statvfs(2)` of a filesystem whose server stopped answering (an NFS
//! mount `hard`, a FUSE daemon stopped, a device whose I/O is suspended)
//! never returns, and the thread that called it cannot be interrupted.
//! So every `statvfs` criguard makes goes through [`statvfs`]: it runs on
//! a thread of its own and is waited for at most [`DEADLINE`]. A call that
//! does not return in time is left parked on its thread, the mount is
//! *stuck*: until that call returns, no other is started for the same path
//! (no pile-up of threads), every caller is answered
//! [`ProbeError::Stuck`] at once, a warning is logged once (with the count
//! of observations skipped when it recovers), and
//! `criguard_observation_stuck{path}` is 1. When the parked call returns,
//! the next observation starts a fresh one and the gauge goes back to 0.
//!
//! Threads are plain `std::thread`s, not tokio's blocking pool: a runtime
//! waits for its blocking tasks when it shuts down, and a stuck `statvfs`
//! would then keep criguard from exiting.
//!
//! The state is process-wide (one entry per path): whoever observes a
//! mount, the eviction manager, the collectors or the usage reader, shares
//! the one call in flight and the one verdict.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use crate::lock::Locked;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use super::ReadError;

/// Space and inodes of a filesystem.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FsStats {
    /// Bytes available to unprivileged users.
    pub available: u64,
    /// Total bytes.
    pub capacity: u64,
    /// Free inodes.
    pub inodes_free: u64,
    /// Total inodes.
    pub inodes: u64,
}

/// `statvfs(2)` of the filesystem holding `path`.
pub fn fs_stats(path: &Path) -> Result<FsStats, ReadError> {
    fs_stats_id(path).map(|(s, _)| s)
}

/// `statvfs(2)` of the filesystem holding `path`, with its id (`f_fsid`:
/// equal for two paths on one filesystem).
pub fn fs_stats_id(path: &Path) -> Result<(FsStats, u64), ReadError> {
    let s = nix::sys::statvfs::statvfs(path).map_err(|e| ReadError {
        path: path.to_owned(),
        source: e.into(),
    })?;
    let id = s.filesystem_id() as u64;
    let frsize = s.fragment_size() as u64;
    Ok(FsStats {
        available: s.blocks_available() as u64 * frsize,
        capacity: s.blocks() as u64 * frsize,
        inodes_free: s.files_free() as u64,
        inodes: s.files() as u64,
    })
    .map(|f| (f, id))
}

/// How long one `statvfs` is waited for. A local filesystem answers in
/// microseconds; an NFS server under load in milliseconds.
pub const DEADLINE: Duration = Duration::from_secs(2);

/// Why a filesystem was not observed.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ProbeError {
    /// The call failed.
    #[error("{0}")]
    Read(Arc<ReadError>),
    /// A call on this path has not returned for `for_s` seconds.
    #[error("{path}: statvfs stuck for {for_s:.1} s; not observed")]
    Stuck {
        /// The path.
        path: PathBuf,
        /// How long the parked call has been waiting, in seconds.
        for_s: f64,
    },
}

/// The label of `criguard_observation_stuck` (see [`register`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PathLabels {
    /// The path observed.
    pub path: String,
}

type Outcome = Option<Result<(FsStats, u64), ProbeError>>;

/// One path's call in flight (or last returned).
struct Slot {
    started: Instant,
    done: watch::Receiver<Outcome>,
    /// Observations answered "stuck" since the call was found stuck.
    skipped: u64,
    /// The stuck warning was logged.
    warned: bool,
}

static SLOTS: LazyLock<Mutex<HashMap<PathBuf, Slot>>> = LazyLock::new(Mutex::default);
static STUCK: LazyLock<Family<PathLabels, Gauge<i64, AtomicI64>>> = LazyLock::new(Family::default);

/// Registers `criguard_observation_stuck{path}`, process-wide: 1 while a
/// `statvfs` of the path has not returned within [`DEADLINE`].
pub fn register(registry: &mut Registry) {
    registry.register(
        "criguard_observation_stuck",
        "1 while a statvfs of the path has not returned within its deadline (a hung filesystem): its disk signals are not observed",
        STUCK.clone(),
    );
}

/// What to do for a path, given the call in flight (pure).
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    /// Start a new call.
    Start,
    /// Wait for the call in flight, at most this long.
    Wait(Duration),
    /// The call in flight is past its deadline: answer stuck at once.
    Stuck(Duration),
}

/// The plan for a path whose last call started `started` ago (`None`:
/// never) and has returned or not (`returned`).
pub fn plan(started: Option<Duration>, returned: bool, deadline: Duration) -> Plan {
    match started {
        None => Plan::Start,
        Some(_) if returned => Plan::Start,
        Some(age) if age < deadline => Plan::Wait(deadline - age),
        Some(age) => Plan::Stuck(age),
    }
}

/// The receiver to wait on for `path` and how long, or the stuck answer.
fn begin(
    path: &Path,
    deadline: Duration,
) -> Result<(watch::Receiver<Outcome>, Duration), ProbeError> {
    let mut slots = SLOTS.locked();
    let slot = slots.get_mut(path);
    let p = plan(
        slot.as_ref().map(|s| s.started.elapsed()),
        slot.as_ref().is_some_and(|s| s.done.borrow().is_some()),
        deadline,
    );
    match (p, slot) {
        (Plan::Wait(left), Some(s)) => Ok((s.done.clone(), left)),
        (Plan::Stuck(age), Some(s)) => {
            s.skipped += 1;
            if !s.warned {
                s.warned = true;
                tracing::warn!(
                    path = %path.display(), stuck_s = age.as_secs_f64(),
                    "filesystem observation stuck (statvfs has not returned): its signals are not observed and no other call is started until it returns; memory and pid signals go on"
                );
            }
            STUCK.get_or_create(&label(path)).set(1);
            Err(ProbeError::Stuck {
                path: path.to_owned(),
                for_s: age.as_secs_f64(),
            })
        }
        (_, old) => {
            if let Some(s) = old.filter(|s| s.warned) {
                tracing::warn!(
                    path = %path.display(), skipped = s.skipped,
                    stuck_s = s.started.elapsed().as_secs_f64(),
                    "filesystem observation returned: observing it again"
                );
            }
            STUCK.get_or_create(&label(path)).set(0);
            let (tx, rx) = watch::channel(None);
            let owned = path.to_owned();
            let spawned = std::thread::Builder::new()
                .name("criguard-statvfs".into())
                .spawn(move || {
                    let r = fs_stats_id(&owned).map_err(|e| ProbeError::Read(Arc::new(e)));
                    let _ = tx.send(Some(r));
                });
            if let Err(err) = spawned {
                return Err(ProbeError::Read(Arc::new(ReadError {
                    path: path.to_owned(),
                    source: err,
                })));
            }
            slots.insert(
                path.to_owned(),
                Slot {
                    started: Instant::now(),
                    done: rx.clone(),
                    skipped: 0,
                    warned: false,
                },
            );
            Ok((rx, deadline))
        }
    }
}

fn label(path: &Path) -> PathLabels {
    PathLabels {
        path: path.display().to_string(),
    }
}

fn timed_out(path: &Path, started: Instant) -> ProbeError {
    ProbeError::Stuck {
        path: path.to_owned(),
        for_s: started.elapsed().as_secs_f64(),
    }
}

/// `statvfs(2)` of `path`, waited for at most [`DEADLINE`] (see the module docs).
pub async fn statvfs(path: &Path) -> Result<FsStats, ProbeError> {
    statvfs_within(path, DEADLINE).await.map(|(s, _)| s)
}

/// [`statvfs`] with the filesystem's id (`f_fsid`).
pub async fn statvfs_id(path: &Path) -> Result<(FsStats, u64), ProbeError> {
    statvfs_within(path, DEADLINE).await
}

/// `statvfs(2)` of `path` and its filesystem id, waited for at most `deadline`.
pub async fn statvfs_within(path: &Path, deadline: Duration) -> Result<(FsStats, u64), ProbeError> {
    let at = Instant::now();
    let (mut rx, left) = begin(path, deadline)?;
    match tokio::time::timeout(left, rx.wait_for(Option::is_some)).await {
        Ok(Ok(v)) => v.clone().unwrap_or_else(|| Err(timed_out(path, at))),
        _ => Err(timed_out(path, at)),
    }
}

/// The same for a caller on a blocking thread (no async context needed).
pub fn statvfs_blocking(path: &Path) -> Result<FsStats, ProbeError> {
    let at = Instant::now();
    let (rx, left) = begin(path, DEADLINE)?;
    let until = at + left;
    loop {
        if let Some(v) = rx.borrow().clone() {
            return v.map(|(s, _)| s);
        }
        if Instant::now() >= until {
            return Err(timed_out(path, at));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_call_is_started_when_none_is_in_flight() {
        assert_eq!(plan(None, false, 2 * S), Plan::Start);
        assert_eq!(plan(Some(10 * S), true, 2 * S), Plan::Start);
    }

    #[test]
    fn a_call_in_flight_is_waited_for_until_its_deadline_then_reported_stuck() {
        assert_eq!(plan(Some(S / 2), false, 2 * S), Plan::Wait(3 * S / 2));
        assert_eq!(plan(Some(2 * S), false, 2 * S), Plan::Stuck(2 * S));
        assert_eq!(plan(Some(60 * S), false, 2 * S), Plan::Stuck(60 * S));
    }

    #[tokio::test]
    async fn a_local_filesystem_is_observed() {
        let t = tempfile::tempdir().unwrap();
        let s = statvfs(t.path()).await.unwrap();
        assert!(s.capacity > 0 && s.capacity >= s.available);
        let b = tokio::task::spawn_blocking({
            let p = t.path().to_owned();
            move || statvfs_blocking(&p)
        })
        .await
        .unwrap()
        .unwrap();
        assert_eq!(b.capacity, s.capacity);
    }

    #[tokio::test]
    async fn a_missing_path_is_a_read_error_not_stuck() {
        let err = statvfs(Path::new("/nonexistent/criguard-probe"))
            .await
            .unwrap_err();
        assert!(matches!(err, ProbeError::Read(_)), "{err}");
    }
}
