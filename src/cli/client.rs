//! The commands that read a running criguard through its admin socket
//! (`status`, `pods`, `evictions`, `rank`, `usage`), and `signals`, which reads the
//! node itself. Each prints a table, or JSON with `--json`; errors go to
//! stderr with exit 1.

use std::path::PathBuf;
use std::process::ExitCode;

use criguard::admin;

use super::args::NodeArgs;
use super::{display, tables};

/// When `at_ms` was, for people: local time and age.
fn when(at_ms: u64) -> String {
    display::when(at_ms, criguard::clock::now_ms(), display::local_time)
}

/// Runs a client command to completion; errors go to stderr.
pub fn run(f: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("criguard: start tokio runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(f) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("criguard: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Sends the running criguard `pid` SIGUSR2 (`for_restart`: SIGUSR1) and
/// waits, at most `wait`, until another process serves `admin_socket`.
pub async fn handoff(
    admin_socket: PathBuf,
    pid: u32,
    for_restart: bool,
    wait: std::time::Duration,
) -> anyhow::Result<()> {
    use nix::sys::signal::{Signal, kill};
    let signal = if for_restart {
        Signal::SIGUSR1
    } else {
        Signal::SIGUSR2
    };
    let target = i32::try_from(pid)
        .ok()
        .filter(|p| *p > 1)
        .ok_or_else(|| anyhow::anyhow!("--pid {pid}: not a process criguard can signal"))?;
    kill(nix::unistd::Pid::from_raw(target), signal)
        .map_err(|e| anyhow::anyhow!("--pid {pid}: {signal}: {e}"))?;
    let end = tokio::time::Instant::now() + wait;
    loop {
        if let Ok(now) = admin::client::serving_pid(&admin_socket).await
            && now != 0
            && now != pid
        {
            println!("criguard: pid {pid} handed over to pid {now}");
            return Ok(());
        }
        if tokio::time::Instant::now() >= end {
            anyhow::bail!("pid {pid} did not hand over within {wait:?} (its log says why)");
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// What `criguard status` checks besides the admin socket: the runtime
/// and criguard's CRI socket, a CRI Version call on each; by default the
/// ones the running criguard says it forwards to and serves.
#[derive(clap::Args, Debug, Clone)]
pub struct StatusChecks {
    /// The runtime to check [default: the one criguard forwards to].
    #[arg(long)]
    pub runtime_endpoint: Option<String>,
    /// criguard's CRI socket to check [default: the one criguard serves].
    #[arg(long)]
    pub cri_socket: Option<String>,
}

/// How many evictions and kernel OOM kills `criguard status` shows.
const STATUS_LAST: usize = 5;
/// How long `criguard status` waits for each connection it checks.
const CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// A CRI Version call on `endpoint`, within [`CHECK_TIMEOUT`].
async fn version_check(endpoint: &str) -> display::Reach {
    use display::Reach;
    let ep = match criguard::runtime::RuntimeEndpoint::parse(endpoint) {
        Ok(ep) => ep,
        Err(e) => return Reach::Failed(e.to_string()),
    };
    let mut rt = criguard::runtime::Upstream::new(ep).runtime();
    let t0 = std::time::Instant::now();
    let call = rt.version(k8s_cri::v1::VersionRequest::default());
    match tokio::time::timeout(CHECK_TIMEOUT, call).await {
        Ok(Ok(v)) => {
            let v = v.into_inner();
            Reach::Answered {
                what: format!("{} {}", v.runtime_name, v.runtime_version),
                ms: t0.elapsed().as_millis() as u64,
            }
        }
        Ok(Err(e)) => Reach::Failed(format!("{:?}: {}", e.code(), e.message())),
        Err(_) => Reach::Failed(format!("no answer within {CHECK_TIMEOUT:?}")),
    }
}

/// The Kubernetes API report's state, as criguard counts its writes.
fn api_reach(s: &admin::ConfigStatus) -> display::Reach {
    use display::Reach;
    match &s.api_report {
        None => Reach::Off("off (no kubeconfig)".into()),
        Some(w) if w.ok == 0 && w.failed.is_empty() => {
            Reach::Off("configured; no write yet".into())
        }
        Some(w) if w.failed.is_empty() => Reach::Answered {
            what: format!("{} writes, none failed", w.ok),
            ms: 0,
        },
        Some(w) => {
            let kinds: Vec<String> = w.failed.iter().map(|(k, n)| format!("{k} {n}")).collect();
            Reach::Failed(format!("{} writes ok, failed: {}", w.ok, kinds.join(", ")))
        }
    }
}

/// `criguard status`: one screen: the configuration a running criguard
/// runs with (or why it fails open), each signal against its threshold,
/// the conditions, the last evictions, the runtime and API connections,
/// then the settings. Exit 2 (as `check-config`) while it fails open.
pub fn status(admin_socket: PathBuf, json: bool, checks: StatusChecks) -> ExitCode {
    let mut failing_open = false;
    let code = run(async {
        let s = admin::get_status(&admin_socket).await?;
        failing_open = !s.valid();
        if json {
            println!("{}", serde_json::to_string_pretty(&s)?);
            return Ok(());
        }
        print!("{}", s.head());
        let conditions = admin::get_conditions(&admin_socket).await;
        let evictions = admin::get_evictions_report(&admin_socket).await;
        let runtime =
            (checks.runtime_endpoint.clone()).unwrap_or_else(|| s.serving.runtime_endpoint.clone());
        let cri = (checks.cri_socket.clone()).unwrap_or_else(|| s.serving.cri_socket.clone());
        let connections = display::Connections {
            runtime: (runtime.clone(), version_check(&runtime).await),
            cri: if cri.is_empty() {
                let off = "no CRI socket: --mode nri, the kubelet dials the runtime";
                ("(none)".into(), display::Reach::Off(off.into()))
            } else {
                (cri.clone(), version_check(&cri).await)
            },
            api: api_reach(&s),
        };
        match (conditions, evictions) {
            (Ok(c), Ok(e)) => print!(
                "{}",
                display::status_overview(&s.thresholds, &c, &e, STATUS_LAST, &connections, when)
            ),
            (Err(e), _) | (_, Err(e)) => println!("\nconditions and evictions not read: {e}"),
        }
        println!("\nsettings:");
        print!("{}", s.settings);
        Ok(())
    });
    if failing_open {
        ExitCode::from(super::EXIT_CONFIG)
    } else {
        code
    }
}

/// `criguard status --ready`: one line; 0 when criguard guards the node,
/// 1 (the reason on stderr) when it does not or does not answer.
pub fn ready(admin_socket: PathBuf) -> ExitCode {
    run(async move {
        match admin::get_status(&admin_socket).await?.ready() {
            Ok(()) => {
                println!("ready");
                Ok(())
            }
            Err(why) => anyhow::bail!("not ready: {why}"),
        }
    })
}

/// `criguard evictions`.
pub async fn evictions(admin_socket: PathBuf, json: bool, watch: bool) -> anyhow::Result<()> {
    use futures::StreamExt;
    if !watch {
        let report = admin::get_evictions_report(&admin_socket).await?;
        if json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", display::evictions_text(&report, when));
        }
        return Ok(());
    }
    let mut stream = std::pin::pin!(admin::watch_evictions(&admin_socket, true).await?);
    while let Some(e) = stream.next().await {
        let e = e?;
        if json {
            println!("{}", serde_json::to_string(&e)?);
        } else {
            println!("{}", display::eviction_line(&e, &when(e.at_unix_ms)));
        }
    }
    Ok(())
}

/// `criguard rank`.
pub async fn rank(admin_socket: PathBuf, json: bool) -> anyhow::Result<()> {
    let (r, not_ranked) = admin::get_rank_report(&admin_socket).await?;
    for n in not_ranked {
        eprintln!("criguard: {n}");
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", tables::rank_table(&r));
    }
    Ok(())
}

/// `criguard usage`.
pub async fn usage(admin_socket: PathBuf, json: bool) -> anyhow::Result<()> {
    let u = admin::get_usage(&admin_socket).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&u)?);
    } else {
        print!("{}", tables::usage_table(&u));
    }
    Ok(())
}

/// `criguard pods`.
pub async fn pods(admin_socket: PathBuf, json: bool) -> anyhow::Result<()> {
    let pods = admin::get_pods(&admin_socket).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&pods)?);
    } else {
        let pids = effective_scores(&pods);
        print!("{}", display::pods_table(&pods, |id| pids.get(id).cloned()));
    }
    Ok(())
}

/// The `oom_score_adj` each container's processes hold now, by container
/// id, read from its cgroup's `cgroup.procs` (v2 unified or v1 memory
/// hierarchy) and `/proc/PID/oom_score_adj`. A container whose processes
/// cannot be read (exited, another mount namespace) is left out.
fn effective_scores(
    pods: &[criguard::model::Pod],
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<i64>> {
    let root = std::path::Path::new("/sys/fs/cgroup");
    let mut out = std::collections::BTreeMap::new();
    for c in pods.iter().flat_map(|p| p.containers.values()) {
        if c.cgroup_path.is_empty() {
            continue;
        }
        let rel = c.cgroup_path.trim_start_matches('/');
        let procs = [root.join(rel), root.join("memory").join(rel)]
            .into_iter()
            .find_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok());
        let Some(procs) = procs else { continue };
        let scores: std::collections::BTreeSet<i64> = procs
            .lines()
            .filter_map(|pid| {
                std::fs::read_to_string(format!("/proc/{}/oom_score_adj", pid.trim())).ok()
            })
            .filter_map(|v| v.trim().parse().ok())
            .collect();
        if !scores.is_empty() {
            out.insert(c.id.clone(), scores);
        }
    }
    out
}

/// `criguard signals`: the eviction signals, read now, with when.
pub fn signals(node: &NodeArgs) -> ExitCode {
    match node.sources() {
        Ok(src) => {
            let obs = src.observe();
            let ms = criguard::clock::instant_ms(obs.at);
            println!("read at {}.{:03} (Unix time, s)", ms / 1000, ms % 1000);
            println!("{:<28} {:>16} {:>16}", "SIGNAL", "AVAILABLE", "CAPACITY");
            for (sig, o) in obs.signals {
                println!(
                    "{:<28} {:>16} {:>16}",
                    sig.name(),
                    sig.show(o.available),
                    sig.show_capacity(o.capacity)
                );
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("criguard: {err:#}");
            ExitCode::FAILURE
        }
    }
}
