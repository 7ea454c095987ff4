//! cgroup v2 memory events: PSI triggers and `memory.events` changes.
//!
//! cgroup v2 has no usage thresholds. What it has:
//! - PSI triggers (`Documentation/accounting/psi.rst`): writing
//!   `"some <stall µs> <window µs>"` to a `memory.pressure` file (or to
//!   `/proc/pressure/memory`, the same interface for the whole system)
//!   makes the kernel raise POLLPRI on that open file whenever tasks were
//!   stalled on memory for at least the stall time within a window. Windows
//!   run from 500 ms to 10 s, and without CAP_SYS_RESOURCE they must be
//!   multiples of 2 s. The trigger lives as long as the file stays open.
//! - kernfs change notification: `memory.events` (and `cgroup.events`) raise
//!   POLLPRI and POLLERR when a counter changes (`high`, `max`, `oom`, …);
//!   reading the file again re-arms it.
//!
//! Neither says how much memory is available; both say "look now", which
//! is all criguard asks of an event.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::EventError;
use crate::config::ConfigError;

/// The kernel's bounds on a PSI window.
const WINDOW_MIN: Duration = Duration::from_millis(500);
const WINDOW_MAX: Duration = Duration::from_secs(10);

/// A validated PSI trigger: "some task stalled on memory for `stall` within
/// `window`".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PsiSettings {
    /// Stall time that fires the trigger.
    pub stall: Duration,
    /// The window it is measured over.
    pub window: Duration,
}

impl Default for PsiSettings {
    /// 150 ms of stall in 2 s (7.5 %): a window every kernel accepts.
    fn default() -> Self {
        Self {
            stall: Duration::from_millis(150),
            window: Duration::from_secs(2),
        }
    }
}

impl PsiSettings {
    /// Checks the kernel's rules; errors name the flag (`stall_key`,
    /// `window_key`) and its value.
    pub fn new(
        stall: Duration,
        window: Duration,
        stall_key: &str,
        window_key: &str,
    ) -> Result<Self, ConfigError> {
        let show = |d: Duration| crate::quantity::format_duration(d);
        if !(WINDOW_MIN..=WINDOW_MAX).contains(&window) {
            return Err(ConfigError {
                key: window_key.into(),
                value: show(window),
                rule: "a PSI window must be from 500ms to 10s".into(),
            });
        }
        if stall.as_micros() == 0 || stall > window {
            return Err(ConfigError {
                key: stall_key.into(),
                value: show(stall),
                rule: format!(
                    "must be more than 0 and at most the window ({})",
                    show(window)
                ),
            });
        }
        Ok(Self { stall, window })
    }

    /// The line written to a pressure file, e.g. `"some 150000 2000000"`.
    pub fn trigger(&self) -> String {
        format!(
            "some {} {}",
            self.stall.as_micros(),
            self.window.as_micros()
        )
    }
}

/// A PSI trigger armed on one pressure file.
#[derive(Debug)]
pub struct PsiTrigger {
    file: AsyncFd<File>,
    path: PathBuf,
}

impl PsiTrigger {
    /// Arms `settings` on `path` (a `memory.pressure` or
    /// `/proc/pressure/memory`); needs a tokio runtime.
    pub fn arm(path: &Path, settings: &PsiSettings) -> Result<Self, EventError> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
            .open(path)
            .map_err(|e| EventError::new("open", path, e))?;
        // The kernel takes the last byte written as the string's end: send the NUL.
        let mut line = settings.trigger().into_bytes();
        line.push(0);
        file.write_all(&line).map_err(|e| {
            let hint = if e.raw_os_error() == Some(nix::errno::Errno::EINVAL as i32)
                && !settings.window.as_millis().is_multiple_of(2000)
            {
                " (without CAP_SYS_RESOURCE the window must be a multiple of 2s)"
            } else {
                ""
            };
            EventError::new(
                "arm a PSI trigger",
                path,
                std::io::Error::new(e.kind(), format!("{:?}: {e}{hint}", settings.trigger())),
            )
        })?;
        let file = super::register(file, Interest::PRIORITY, path)?;
        Ok(Self {
            file,
            path: path.to_owned(),
        })
    }

    /// The pressure file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the cgroup is gone, or is another one under the same path.
    pub fn is_stale(&self) -> bool {
        super::v1::is_stale(self.file.get_ref(), &self.path)
    }

    /// Waits until the trigger fires. Cancel-safe.
    pub async fn fired(&self) -> Result<(), EventError> {
        next_edge(&self.file, &self.path).await
    }
}

/// Waits for the next POLLPRI edge of `file` (at `path`). Cancel-safe.
async fn next_edge(file: &AsyncFd<File>, path: &Path) -> Result<(), EventError> {
    let mut guard = file
        .ready(Interest::PRIORITY)
        .await
        .map_err(|e| EventError::new("poll", path, e))?;
    // Polling reset the kernel's flag; the next edge is the next event.
    guard.clear_ready();
    Ok(())
}

/// Change notification of a kernfs file such as `memory.events`.
#[derive(Debug)]
pub struct FileModified {
    file: AsyncFd<File>,
    path: PathBuf,
    last: String,
}

impl FileModified {
    /// Watches `path`; needs a tokio runtime.
    pub fn watch(path: &Path) -> Result<Self, EventError> {
        let file = File::open(path).map_err(|e| EventError::new("open", path, e))?;
        let file = super::register(file, Interest::PRIORITY, path)?;
        let mut me = Self {
            file,
            path: path.to_owned(),
            last: String::new(),
        };
        // A file not read since it was opened polls as changed: read it once.
        me.last = me.reread()?;
        Ok(me)
    }

    /// The watched file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file is gone, or is another one under the same path.
    pub fn is_stale(&self) -> bool {
        super::v1::is_stale(self.file.get_ref(), &self.path)
    }

    fn reread(&self) -> Result<String, EventError> {
        let mut f = self.file.get_ref();
        let mut text = String::new();
        f.rewind()
            .and_then(|_| f.read_to_string(&mut text))
            .map_err(|e| EventError::new("read", &self.path, e))?;
        Ok(text)
    }

    /// Waits until the file changes; returns the counters that went up
    /// (empty when the change was something else, such as the cgroup going
    /// away). Cancel-safe.
    pub async fn changed(&mut self) -> Result<Vec<(String, u64)>, EventError> {
        next_edge(&self.file, &self.path).await?;
        let now = self.reread()?;
        let up = increased(&self.last, &now);
        self.last = now;
        Ok(up)
    }
}

/// The `total=` stall time, µs, of the `kind` line (`some` or `full`) of a
/// pressure file.
pub fn psi_total(text: &str, kind: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(kind))?
        .split_whitespace()
        .find_map(|f| f.strip_prefix("total="))?
        .parse()
        .ok()
}

/// The `key value` counters of `after` that are higher than in `before`
/// (a flat-keyed file such as `memory.events`), with their new values.
pub fn increased(before: &str, after: &str) -> Vec<(String, u64)> {
    let parse = |t: &str| -> Vec<(String, u64)> {
        t.lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_owned(), v.trim().parse().ok()?))
            })
            .collect()
    };
    let old = parse(before);
    let was = |k: &str| old.iter().find(|(ok, _)| ok == k).map_or(0, |(_, v)| *v);
    parse(after)
        .into_iter()
        .filter(|(k, v)| *v > was(k))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trigger_line_is_some_stall_and_window_in_microseconds() {
        assert_eq!(PsiSettings::default().trigger(), "some 150000 2000000");
        let s = PsiSettings::new(
            Duration::from_millis(100),
            Duration::from_secs(4),
            "--stall",
            "--window",
        )
        .unwrap();
        assert_eq!(s.trigger(), "some 100000 4000000");
    }

    #[test]
    fn settings_outside_the_kernels_bounds_are_refused_by_name() {
        let ms = Duration::from_millis;
        let cases = [
            (ms(100), ms(400), "--window", "400ms"),
            (ms(100), ms(10_001), "--window", "10.001s"),
            (ms(0), ms(2000), "--stall", "0s"),
            (ms(2500), ms(2000), "--stall", "2.5s"),
        ];
        for (stall, window, key, value) in cases {
            let e = PsiSettings::new(stall, window, "--stall", "--window").unwrap_err();
            assert_eq!((e.key.as_str(), e.value.as_str()), (key, value), "{e}");
        }
    }

    #[test]
    fn psi_total_reads_the_named_line() {
        let text = "some avg10=0.09 avg60=0.10 avg300=0.17 total=1879634\n\
                    full avg10=0.09 avg60=0.10 avg300=0.15 total=1272774\n";
        assert_eq!(psi_total(text, "some"), Some(1879634));
        assert_eq!(psi_total(text, "full"), Some(1272774));
        assert_eq!(psi_total(text, "none"), None);
        assert_eq!(psi_total("some avg10=0.00\n", "some"), None);
    }

    #[test]
    fn increased_lists_the_counters_that_went_up() {
        let before = "low 0\nhigh 4\nmax 10\noom 0\noom_kill 0\n";
        let after = "low 0\nhigh 4\nmax 12\noom 1\noom_kill 0\noom_group_kill 2\n";
        assert_eq!(
            increased(before, after),
            [
                ("max".to_owned(), 12),
                ("oom".to_owned(), 1),
                ("oom_group_kill".to_owned(), 2)
            ]
        );
        assert!(increased(after, after).is_empty());
    }
}
