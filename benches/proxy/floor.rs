//! The byte relays that make the floor (socat from Debian and our own
//! `examples/byte_relay`), run in front of the same containerd as criguard,
//! and the CPU time a process (with its reaped and live children) has used.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A relay process, killed on drop.
pub struct Relay {
    /// The socket clients dial.
    pub socket: PathBuf,
    child: Child,
}

impl Relay {
    /// `socat UNIX-LISTEN:<listen>,fork UNIX-CONNECT:<upstream>`: one forked
    /// process per connection, a select(2) loop with 8 KiB reads.
    pub fn socat(listen: &Path, upstream: &Path) -> Self {
        let child = Command::new("socat")
            .arg(format!("UNIX-LISTEN:{},fork", listen.display()))
            .arg(format!("UNIX-CONNECT:{}", upstream.display()))
            .stdin(Stdio::null())
            // It reports every connection closed under it (the readiness probe).
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn socat (hack/install-deps.sh installs it)");
        Self {
            socket: listen.to_owned(),
            child,
        }
    }

    /// Our own relay (`examples/byte_relay`, built by hack/bench-proxy.sh),
    /// in `mode` (default: `CRIGUARD_BENCH_RELAY_MODE`, else its own default).
    pub fn ours(listen: &Path, upstream: &Path, mode: Option<&str>) -> Self {
        let bin = std::env::var_os("CRIGUARD_BYTE_RELAY")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/release/examples/byte_relay")
            });
        assert!(
            bin.exists(),
            "{} missing: run hack/bench-proxy.sh (it builds the example)",
            bin.display()
        );
        let mut cmd = Command::new(&bin);
        cmd.arg("--listen")
            .arg(listen)
            .arg("--upstream")
            .arg(upstream);
        let mode = mode
            .map(str::to_owned)
            .or_else(|| std::env::var("CRIGUARD_BENCH_RELAY_MODE").ok());
        if let Some(mode) = mode {
            cmd.args(["--mode", &mode]);
        }
        Self {
            socket: listen.to_owned(),
            child: cmd.stdin(Stdio::null()).spawn().expect("spawn byte_relay"),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Fields 14..17 of /proc/PID/stat: utime, stime, cutime, cstime (ticks).
fn ticks(pid: u32) -> Option<[u64; 4]> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse().ok());
    Some([n(11)?, n(12)?, n(13)?, n(14)?])
}

fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// User plus system CPU seconds of `pid`, its reaped children and its live
/// children (socat forks one per connection).
pub fn cpu_seconds(pid: u32) -> f64 {
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let own = ticks(pid).map(|t| t.iter().sum::<u64>()).unwrap_or(0);
    let live: u64 = children(pid)
        .into_iter()
        .filter_map(ticks)
        .map(|t| t.iter().sum::<u64>())
        .sum();
    (own + live) as f64 / hz
}
