//! cgroup v1 memory thresholds: the kernel signals an eventfd when a memcg's
//! `memory.usage_in_bytes` crosses a value, upwards or downwards
//! (`Documentation/admin-guide/cgroup-v1/memory.rst`, "Memory thresholds").
//!
//! Registration writes `"<eventfd> <fd of memory.usage_in_bytes> <bytes>"`
//! to the memcg's `cgroup.event_control`; closing the eventfd unregisters it,
//! and removing the cgroup signals it one last time. The kernel checks
//! thresholds as pages are charged, in batches of a few hundred KiB per CPU,
//! so an event follows the crossing by at most that much allocation.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use tokio::io::unix::AsyncFd;

use super::EventError;

/// The memcg usage at which a memory signal's available amount falls to its
/// threshold, as the kubelet's memory threshold notifier computes it
/// (`pkg/kubelet/eviction/memory_threshold_notifier.go`):
/// `capacity − threshold + inactive_file`.
///
/// `available = capacity − working_set` and `working_set = usage −
/// inactive_file`, so `available < threshold` exactly when `usage >
/// capacity − threshold + inactive_file`. `inactive_file` moves with the page
/// cache, so the line is recomputed after every observation.
pub fn usage_threshold(capacity: u64, threshold: u64, inactive_file: u64) -> u64 {
    capacity
        .saturating_sub(threshold)
        .saturating_add(inactive_file)
}

/// A usage threshold registered on one memcg, signalled through an eventfd.
#[derive(Debug)]
pub struct UsageThreshold {
    eventfd: AsyncFd<File>,
    /// `memory.usage_in_bytes`, kept open so that a cgroup removed and
    /// re-created under the same name is noticed ([`UsageThreshold::is_stale`]).
    usage_file: File,
    dir: PathBuf,
    bytes: u64,
    past_when_registered: bool,
}

impl UsageThreshold {
    /// Registers `bytes` on the memcg directory `dir`; needs a tokio runtime.
    pub fn register(dir: &Path, bytes: u64) -> Result<Self, EventError> {
        let usage_path = dir.join("memory.usage_in_bytes");
        let usage_file =
            File::open(&usage_path).map_err(|e| EventError::new("open", &usage_path, e))?;
        use nix::sys::eventfd::{EfdFlags, EventFd};
        let eventfd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
            .map_err(|e| EventError::new("eventfd for", dir, e.into()))?;
        let eventfd = File::from(OwnedFd::from(eventfd));
        let control = dir.join("cgroup.event_control");
        // The kernel signals usage reaching its value; the policy is
        // available strictly below the threshold, usage strictly above
        // `bytes`. Registered at `bytes` itself, usage resting exactly on
        // the line (memory grown in whole MiB steps) would be signalled,
        // read back as not past, and never signalled again as it went on.
        let line = format!(
            "{} {} {}",
            eventfd.as_raw_fd(),
            usage_file.as_raw_fd(),
            bytes.saturating_add(1)
        );
        OpenOptions::new()
            .write(true)
            .open(&control)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .map_err(|e| EventError::new("register a threshold in", &control, e))?;
        let eventfd = super::register(eventfd, tokio::io::Interest::READABLE, dir)?;
        // The kernel signals crossings only: usage already past the line
        // when it was registered is never signalled. Past means above, as
        // for the policy (`available < threshold`), so that usage resting
        // exactly on the line is not reported again and again.
        let mut text = String::new();
        (&usage_file)
            .read_to_string(&mut text)
            .map_err(|e| EventError::new("read", &usage_path, e))?;
        let past_when_registered = text.trim().parse::<u64>().is_ok_and(|u| u > bytes);
        Ok(Self {
            eventfd,
            usage_file,
            dir: dir.to_owned(),
            bytes,
            past_when_registered,
        })
    }

    /// Whether usage was already above the line once it was registered
    /// (a crossing the eventfd will never report).
    pub fn past_when_registered(&self) -> bool {
        self.past_when_registered
    }

    /// The usage line, bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The memcg directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the memcg is gone, or is another one under the same path.
    pub fn is_stale(&self) -> bool {
        is_stale(&self.usage_file, &self.dir.join("memory.usage_in_bytes"))
    }

    /// Waits for the next crossing; returns how many crossings (or the
    /// removal of the cgroup) were signalled since the last call.
    /// Cancel-safe: a crossing is never lost by dropping the future.
    pub async fn fired(&self) -> Result<u64, EventError> {
        loop {
            let mut guard = self
                .eventfd
                .readable()
                .await
                .map_err(|e| EventError::new("poll", &self.dir, e))?;
            let read = guard.try_io(|fd| {
                let mut buf = [0u8; 8];
                fd.get_ref().read_exact(&mut buf)?;
                Ok(u64::from_ne_bytes(buf))
            });
            match read {
                Ok(r) => {
                    return r.map_err(|e| EventError::new("read the eventfd of", &self.dir, e));
                }
                Err(_would_block) => continue,
            }
        }
    }
}

/// Whether the open `file` is no longer what `path` names (gone or replaced).
pub(super) fn is_stale(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(open), Ok(now)) => open.ino() != now.ino() || open.dev() != now.dev(),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_threshold_is_capacity_minus_threshold_plus_inactive_file() {
        // 10Gi node, memory.available<100Mi, 1Gi of inactive page cache:
        // working set reaches 10Gi − 100Mi when usage reaches that plus 1Gi.
        let (gi, mi) = (1u64 << 30, 1u64 << 20);
        assert_eq!(usage_threshold(10 * gi, 100 * mi, gi), 11 * gi - 100 * mi);
        // A threshold above capacity: any usage meets it.
        assert_eq!(usage_threshold(100 * mi, gi, 0), 0);
        assert_eq!(usage_threshold(100 * mi, gi, 5), 5);
        assert_eq!(usage_threshold(u64::MAX, 0, 1), u64::MAX);
    }

    #[test]
    fn the_line_agrees_with_the_signal_definition() {
        // available = capacity − (usage − inactive); met when available < threshold.
        let (capacity, threshold, inactive) = (1000u64, 100u64, 30u64);
        let line = usage_threshold(capacity, threshold, inactive);
        let available = |usage: u64| capacity as i64 - (usage - inactive) as i64;
        assert_eq!(available(line), threshold as i64);
        assert!(available(line + 1) < threshold as i64);
        assert!(available(line - 1) > threshold as i64);
    }
}
