//! The guest's side of the VM tier: the guard that keeps these tests out of
//! any other machine, shell and systemd helpers, runtime slices, the
//! machine's containerd set up as a systemd-driver node's, pods run the
//! kubelet's way (several at once), and timing lines.

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use criguard_test_kit::kubelet::{CgroupDriver, ContainerSpec, PodSpec};
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

use crate::common::containerd::{Clients, unique};
use crate::common::pods::{mem_total, remove_pods, run_pod};

/// Set by the guest's runner (hack/vm/guest.sh).
pub fn inside() -> bool {
    std::env::var_os("CRIGUARD_VM_GUEST").is_some()
}

/// Panics unless this runs inside the VM: the scenarios reconfigure the
/// machine's containerd and systemd.
pub fn require() {
    assert!(
        inside(),
        "this scenario reconfigures the machine's containerd and systemd: it runs only \
         inside the VM (hack/vm.sh test, or the host-side test of tests/vm)"
    );
}

/// A line on stderr that the host-side test passes on (not captured by
/// the test harness, so it shows for passing tests too).
pub fn report(line: &str) {
    let _ = writeln!(std::io::stderr(), "vm-tier: {line}");
}

/// A scenario that has not ended after this is stuck (they take 40 to 100 s
/// here under TCG): the watchdog reports the machine's state and ends the
/// test process, so the host sees why in minutes, not at the VM's timeout.
const SCENARIO_LIMIT: Duration = Duration::from_secs(300);

/// Reports how long a scenario took when dropped; until then a watchdog
/// ends the process if the scenario runs past [`SCENARIO_LIMIT`].
pub struct Timer(&'static str, Instant, Option<std::sync::mpsc::Sender<()>>);

impl Timer {
    /// Starts timing `name` and its watchdog.
    pub fn start(name: &'static str) -> Self {
        let (done, wait) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                wait.recv_timeout(SCENARIO_LIMIT)
            {
                report(&format!(
                    "scenario {name} still running after {SCENARIO_LIMIT:?}; the machine's state:"
                ));
                let (_, out, err) = sh_status(STUCK_REPORT);
                for line in out.lines().chain(err.lines()) {
                    report(&format!("  {line}"));
                }
                report(&format!("scenario {name} failed: timed out"));
                std::process::exit(3);
            }
        });
        Self(name, Instant::now(), Some(done))
    }
}

/// What the watchdog prints of a stuck machine (the image has no procps).
const STUCK_REPORT: &str = r#"
    echo "load $(cat /proc/loadavg)"; grep -E '^(MemTotal|MemAvailable|Dirty|Writeback):' /proc/meminfo
    df -m /
    echo '# memory pressure'; cat /proc/pressure/memory
    for f in /sys/fs/cgroup/kubepods.slice/memory.{current,max,events}; do
        [ -r $f ] && echo "$f: $(tr '\n' ' ' <$f)"; done
    echo '# processes: pid state wchan cmdline'
    for p in /proc/[0-9]*; do
        [ "$p" = /proc/$$ ] && continue
        cmd=$(tr '\0' ' ' <$p/cmdline 2>/dev/null | cut -c1-120)
        [ -n "$cmd" ] && echo "${p#/proc/} $(awk '{print $3}' $p/stat 2>/dev/null) $(cat $p/wchan 2>/dev/null) $cmd"
    done
    echo '# kernel'; dmesg --level=emerg,alert,crit,err,warn | tail -n 20
    echo '# units'; journalctl -b --no-pager -n 25 -u containerd -u 'criguard*'
"#;

impl Drop for Timer {
    fn drop(&mut self) {
        drop(self.2.take());
        let verdict = if std::thread::panicking() {
            "failed"
        } else {
            "passed"
        };
        report(&format!(
            "scenario {} {verdict} in {:.1} s",
            self.0,
            self.1.elapsed().as_secs_f64()
        ));
    }
}

/// Runs `script` with bash; its stdout. Panics with both outputs on failure.
pub fn sh(script: &str) -> String {
    let out = Command::new("bash")
        .args(["-c", script])
        .output()
        .expect("run bash");
    assert!(
        out.status.success(),
        "`{script}` failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs `script`; its exit code, stdout and stderr, whatever they are.
pub fn sh_status(script: &str) -> (i32, String, String) {
    let out = Command::new("bash")
        .args(["-c", script])
        .output()
        .expect("run bash");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `systemctl show -p PROP --value UNIT`.
pub fn show(unit: &str, prop: &str) -> String {
    sh(&format!("systemctl show -p {prop} --value {unit}"))
        .trim()
        .to_owned()
}

/// The unit's main process (0: none).
pub fn main_pid(unit: &str) -> u32 {
    show(unit, "MainPID").parse().unwrap()
}

/// The cgroup v2 path of a process (`0::/path` in `/proc/<pid>/cgroup`).
pub fn cgroup_of(pid: i64) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or_else(|| panic!("no v2 line in /proc/{pid}/cgroup: {text}"))
        .to_owned()
}

/// Polls `check` every 50 ms until it returns `Some`, or panics after
/// `deadline` (for checks that block, off the async runtime's threads).
pub fn wait_for<T>(deadline: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < end,
            "timed out after {deadline:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A slice made the way the kubelet makes `kubepods.slice` (a unit with
/// resource limits, here a runtime unit file); stopped and removed on drop.
pub struct Slice(String);

impl Slice {
    /// Creates and starts slice `name` with `properties` (`MemoryMax=320M`).
    pub fn create(name: &str, properties: &[&str]) -> Self {
        let path = format!("/run/systemd/system/{name}");
        let mut unit = String::from("[Unit]\nDescription=criguard VM tier pods\n\n[Slice]\n");
        for p in properties {
            unit.push_str(p);
            unit.push('\n');
        }
        std::fs::create_dir_all("/run/systemd/system").unwrap();
        std::fs::write(&path, unit).unwrap();
        sh(&format!(
            "systemctl daemon-reload && systemctl start {name}"
        ));
        Self(name.to_owned())
    }

    /// Its directory in the unified hierarchy.
    pub fn dir(&self) -> String {
        let rel = criguard::cgroup::path::kubepods(&self.0);
        format!("/sys/fs/cgroup{rel}")
    }
}

impl Drop for Slice {
    fn drop(&mut self) {
        let _ = sh_status(&format!(
            "systemctl stop {0}; rm -f /run/systemd/system/{0}; systemctl daemon-reload",
            self.0
        ));
    }
}

/// The machine's containerd as a systemd-driver node runs it (the image
/// ships it): the test images' pause, runc under systemd's cgroups, the
/// kubelet's negative scores let through.
const NODE_CONTAINERD_CONFIG: &str = include_str!("../../hack/vm/image/containerd-config.toml");

/// containerd.service's socket.
pub const CONTAINERD: &str = "/run/containerd/containerd.sock";

/// Where the node's pods log, as the kubelet has it.
pub const LOG_ROOT: &str = "/var/log/pods";

/// containerd.service as a systemd-driver node's: its configuration (the
/// image's; put back and restarted only if something changed it), the test
/// images (imported when missing), its CRI answering.
pub async fn node_containerd() -> Clients {
    let path = "/etc/containerd/config.toml";
    if std::fs::read_to_string(path).ok().as_deref() != Some(NODE_CONTAINERD_CONFIG) {
        std::fs::write(path, NODE_CONTAINERD_CONFIG).unwrap();
        sh("systemctl restart containerd.service");
    }
    let have = sh("ctr -n k8s.io images ls -q");
    if !have.lines().any(|l| l == "registry.k8s.io/pause:3.9")
        || !have.lines().any(|l| l == crate::common::pods::BUSYBOX)
    {
        let tars = sh(&format!(
            "{}/hack/images.sh \"$CRIGUARD_IMAGE_CACHE\"",
            env!("CARGO_MANIFEST_DIR")
        ));
        for tar in tars.lines() {
            sh(&format!(
                "ctr -n k8s.io images import --snapshotter overlayfs {tar} >/dev/null"
            ));
        }
    }
    let clients = Clients::new(Path::new(CONTAINERD));
    crate::common::poll_until(Duration::from_secs(60), "containerd's CRI", || {
        let mut rt = clients.rt.clone();
        async move {
            rt.version(cri::VersionRequest::default()).await.ok()?;
            Some(())
        }
    })
    .await;
    clients
}

/// A pod as the kubelet sends it on this node: the systemd driver, logs
/// under [`LOG_ROOT`], the node's memory, priority in its annotation.
pub fn pod(name: &str, priority: i32, c: ContainerSpec) -> PodSpec {
    let mut p = PodSpec::new(name, &unique(name)).container(c);
    p.driver = CgroupDriver::Systemd;
    p.log_root = LOG_ROOT.into();
    p.node_memory = mem_total();
    p.annotations
        .insert("criguard.io/priority".into(), priority.to_string());
    p
}

/// Runs `pods` through `rt` at once, as the kubelet's pod workers do (the
/// emulated CPU makes each one slow); their sandbox and container ids.
pub async fn run_pods(
    rt: &RuntimeServiceClient<Channel>,
    pods: &[&PodSpec],
) -> Vec<(String, Vec<String>)> {
    let runs = pods.iter().map(|p| {
        let mut rt = rt.clone();
        async move { run_pod(&mut rt, p, None).await }
    });
    futures::future::join_all(runs).await
}

/// Stops and removes `sandboxes` through `rt` at once.
pub async fn remove_all(rt: &RuntimeServiceClient<Channel>, sandboxes: Vec<String>) {
    let runs = sandboxes.into_iter().map(|id| {
        let mut rt = rt.clone();
        async move { remove_pods(&mut rt, [id]).await }
    });
    futures::future::join_all(runs).await;
}

/// The PIDs of the processes named `comm`, from /proc (the guest has no
/// procps), space-separated; empty when there is none.
pub fn processes(comm: &str) -> String {
    sh(&format!(
        "for f in /proc/[0-9]*/comm; do [ \"$(cat $f 2>/dev/null)\" = {comm} ] && basename $(dirname $f); done; true"
    ))
    .split_whitespace()
    .collect::<Vec<_>>()
    .join(" ")
}

/// A CRI client calling through `socket` in the background while a test
/// restarts or upgrades criguard: ListPodSandbox on one long connection
/// and Version on a new connection per call, every 20 ms.
///
/// A call refused by the server's GOAWAY (NO_ERROR) before it was taken
/// up, one whose request could not be written because the old process had
/// closed that connection (a broken pipe), or one hyper cancelled unsent
/// because the connection closed first (its Canceled, "connection
/// closed") never reached criguard: grpc-go, the kubelet's client,
/// retries such a call transparently on a new connection; so does this
/// client, once, and counts it. Any other error, or a failed retry, is a
/// failed call.
pub struct Calling {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    calls: std::sync::Arc<std::sync::atomic::AtomicU64>,
    retried: std::sync::Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<Vec<String>>,
}

impl Calling {
    /// Starts calling through `socket`.
    pub fn start(socket: &'static str) -> Self {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let stop = Arc::new(AtomicBool::new(false));
        let (calls, retried) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (s, c, r) = (stop.clone(), calls.clone(), retried.clone());
        let task = tokio::spawn(async move {
            let refused = |e: &tonic::Status| {
                let t = format!("{e:?}");
                (t.contains("GoAway") && t.contains("NO_ERROR"))
                    || t.contains("BrokenPipe")
                    || t.contains("Error(Canceled, \"connection closed\")")
            };
            let list = |c: &Clients| {
                let mut rt = c.rt.clone();
                async move {
                    rt.list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
                        .await
                        .map(|_| ())
                }
            };
            let version = |c: &Clients| {
                let mut rt = c.rt.clone();
                async move { rt.version(cri::VersionRequest::default()).await.map(|_| ()) }
            };
            let mut long = Clients::new(Path::new(socket));
            let mut errors = Vec::new();
            while !s.load(Ordering::SeqCst) {
                let mut a = list(&long).await;
                if a.as_ref().is_err_and(refused) {
                    r.fetch_add(1, Ordering::SeqCst);
                    long = Clients::new(Path::new(socket));
                    a = list(&long).await;
                }
                let fresh = Clients::new(Path::new(socket));
                let mut b = version(&fresh).await;
                if b.as_ref().is_err_and(refused) {
                    r.fetch_add(1, Ordering::SeqCst);
                    b = version(&Clients::new(Path::new(socket))).await;
                }
                for res in [a, b] {
                    c.fetch_add(1, Ordering::SeqCst);
                    if let Err(e) = res {
                        errors.push(e.to_string());
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            errors
        });
        Self {
            stop,
            calls,
            retried,
            task,
        }
    }

    /// Waits (at most 30 s) until `n` more calls were made.
    pub async fn until_more(&self, n: u64, what: &str) {
        let at = self.calls.load(std::sync::atomic::Ordering::SeqCst);
        crate::common::poll_until(Duration::from_secs(30), what, || {
            let now = self.calls.load(std::sync::atomic::Ordering::SeqCst);
            async move { (now >= at + n).then_some(()) }
        })
        .await;
    }

    /// Stops calling: the calls made, those retried once, the failures.
    pub async fn stop(self) -> (u64, u64, Vec<String>) {
        use std::sync::atomic::Ordering;
        self.stop.store(true, Ordering::SeqCst);
        let errors = self.task.await.unwrap();
        (
            self.calls.load(Ordering::SeqCst),
            self.retried.load(Ordering::SeqCst),
            errors,
        )
    }
}
