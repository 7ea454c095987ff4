//! File descriptors under attack: a local user holding hundreds of idle
//! connections to the metrics port must not take criguard's descriptors
//! from the kubelet's CRI calls, nor make an accept loop spin a core.

use crate::common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::containerd::{CriguardProcess, PrivateContainerd};
use common::metrics::free_port;

/// Open descriptors of process `pid`.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Established TCP connections to local `port` that process `pid` holds
/// a descriptor of.
fn held_connections(pid: u32, port: u16) -> usize {
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    let inodes: std::collections::HashSet<String> = table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local_port = u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok()?;
            // State 01: ESTABLISHED; field 10: the socket's inode.
            (local_port == port && f.get(3) == Some(&"01"))
                .then(|| f.get(9).map(|i| i.to_string()))?
        })
        .collect();
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
                })
                .filter(|i| inodes.contains(i))
                .count()
        })
        .unwrap_or(0)
}

/// User + system CPU time of process `pid` (all its threads).
fn cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let ticks = f[11] + f[12]; // utime, stime (fields 14 and 15)
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .unwrap()
        .unwrap_or(100) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// The `Max open files` soft and hard limits of process `pid`.
fn nofile(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let f: Vec<&str> = line.split_whitespace().collect();
    (f[3].to_owned(), f[4].to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_soft_open_file_limit_is_raised_to_the_hard_limit_at_start() {
    let dir = tempfile::tempdir().unwrap();
    // No runtime: criguard serves anyway, which is all this test needs.
    let guard = CriguardProcess::start_via(
        &["prlimit", "--nofile=256:4096"],
        &dir.path().join("c.sock"),
        &dir.path().join("no-runtime.sock"),
        &[],
    )
    .await;
    assert_eq!(nofile(guard.pid()), ("4096".into(), "4096".into()));
}

/// GET /metrics on a new connection; the status line, or the error.
fn scrape(port: u16) -> std::io::Result<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out.lines().next().unwrap_or_default().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_metrics_connections_starve_neither_cri_calls_nor_metrics_nor_a_core() {
    // 400 client sockets in this process, which every module shares.
    common::raise_nofile();
    let ctrd = PrivateContainerd::start();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    // 128 descriptors, soft and hard: what 2 100 connections did to 1 024.
    let guard = CriguardProcess::start_via(
        &["prlimit", "--nofile=128:128"],
        &dir.path().join("c.sock"),
        &ctrd.socket,
        &["--metrics-address", &address],
    )
    .await;
    let pid = guard.pid();
    let mut rt = guard.clients().rt;
    let version = k8s_cri::v1::VersionRequest::default();
    rt.version(version.clone()).await.expect("Version before");
    let baseline = fds(pid);

    // Connections that never send a byte: three times the limit. (A
    // listener that stops accepting lets its backlog fill: those connects
    // time out, which is not what this test is about.)
    let target = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let idle: Vec<std::net::TcpStream> = (0..400)
        .filter_map(|_| {
            std::net::TcpStream::connect_timeout(&target, Duration::from_millis(200)).ok()
        })
        .collect();
    common::poll_until(
        Duration::from_secs(20),
        "criguard to take the idle connections",
        || async { (held_connections(pid, port) >= 60).then_some(()) },
    )
    .await;

    // No accept loop spins: over a second, criguard is nearly idle.
    let (t0, c0) = (Instant::now(), cpu(pid));
    std::thread::sleep(Duration::from_secs(1));
    let busy = (cpu(pid) - c0).as_secs_f64() / t0.elapsed().as_secs_f64();
    assert!(
        busy < 0.3,
        "criguard used {:.0}% of a core holding idle connections",
        busy * 100.0
    );

    // A kubelet's new connection is still served.
    let mut rt = common::containerd::Clients::new(&guard.socket).rt;
    tokio::time::timeout(Duration::from_secs(10), rt.version(version))
        .await
        .expect("a new CRI connection was not served within 10 s")
        .expect("Version through criguard");
    // And so is a scraper's.
    let status = tokio::task::spawn_blocking(move || scrape(port))
        .await
        .unwrap();
    assert!(
        status.as_ref().is_ok_and(|s| s.contains(" 200")),
        "/metrics on a new connection: {status:?}"
    );
    let held = held_connections(pid, port);
    assert!(held <= 64, "criguard holds {held} metrics connections");
    assert!(
        fds(pid) <= baseline + 70,
        "criguard holds {} descriptors ({baseline} before the idle connections)",
        fds(pid)
    );
    drop(idle);
}
