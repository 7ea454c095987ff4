//! Restarts without failed calls: criguard restarted the way systemd does
//! it under socket activation (the listening socket kept, passed as fd 3;
//! SIGTERM, wait, start again) under a kubelet-like load through the
//! kubelet's own client stack (k8s.io/cri-client over grpc-go, built by
//! `hack/restart-load/build.sh`): no call fails. The same restarts of a
//! plain byte relay, side by side against the same containerd, are the
//! baseline; its failures are printed (a byte relay cannot drain: the calls
//! in flight at its SIGTERM fail with Unavailable). `hack/bench-restart.sh`
//! runs the same for 100 restarts.
//!
//! Handoffs (SIGUSR2: the new process takes the sockets while the old one
//! finishes its calls, what `systemctl reload` does after an upgrade)
//! under the same load with 2 s ExecSync calls always in flight: no call
//! fails, and a fresh connection is answered throughout.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::containerd::PrivateContainerd;

/// The restart-load binary, built if missing; `None` without Go 1.26.
fn restart_load() -> Option<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/restart-load/build.sh");
    let out = Command::new(script)
        .stderr(Stdio::inherit())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Starts `restart-load bench` named `name` on `socket` with `restarts`
/// restarts of `cmd` (`extra`: more of bench's flags).
fn bench(
    rl: &str,
    dir: &Path,
    (name, extra): (&str, &[&str]),
    restarts: u32,
    cmd: &[&str],
) -> std::process::Child {
    Command::new(rl)
        .arg("bench")
        .args(extra)
        .arg("-socket")
        .arg(dir.join(format!("{name}.sock")))
        .args(["-restarts", &restarts.to_string(), "-period", "1s"])
        .args(["-timeout", "60s", "-name", name])
        .arg("-logs")
        .arg(dir.join("logs"))
        .arg("--")
        .args(cmd)
        .env("CRIGUARD_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run restart-load")
}

/// The run's summary, or a panic with its process log.
fn result(child: std::process::Child, dir: &Path, name: &str) -> serde_json::Value {
    let out = child.wait_with_output().unwrap();
    let log = std::fs::read_to_string(dir.join(format!("logs/{name}.log"))).unwrap_or_default();
    assert!(
        out.status.success(),
        "{name} run failed; its log:\n{}",
        &log[log.len().saturating_sub(4000)..]
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn restarts_under_a_kubelet_like_load_fail_no_call() {
    let Some(rl) = restart_load() else {
        eprintln!("SKIPPED: restart-load not built (hack/restart-load/build.sh needs Go 1.26)");
        return;
    };
    let ctrd = PrivateContainerd::start();
    let dir = tempfile::tempdir().unwrap();
    let runtime = ctrd.socket.to_str().unwrap();
    let endpoint = format!("unix://{runtime}");
    let (admin, state, unused) = (
        dir.path().join("admin.sock"),
        dir.path().join("state"),
        dir.path().join("unused.sock"),
    );
    const RESTARTS: u32 = 10;
    let serve = serve_args(&admin, &state, &unused, &endpoint);
    let criguard = bench(
        &rl,
        dir.path(),
        ("criguard", &[]),
        RESTARTS,
        &as_strs(&serve),
    );
    let relay = bench(
        &rl,
        dir.path(),
        ("relay", &[]),
        RESTARTS,
        &[&rl, "relay", "-upstream", runtime],
    );
    let (c, r) = (
        result(criguard, dir.path(), "criguard"),
        result(relay, dir.path(), "relay"),
    );
    for run in [&c, &r] {
        print_run(run);
    }
    assert!(
        c["calls"].as_u64().unwrap() > 10 * RESTARTS as u64,
        "the load ran: {c}"
    );
    assert_eq!(
        c["failed"].as_u64(),
        Some(0),
        "calls failed across criguard's restarts: {}",
        c["by_method"]["messages"]
    );
    assert!(c["failed"].as_u64() <= r["failed"].as_u64());
}

/// `criguard serve`'s command line for a bench run.
fn serve_args(admin: &Path, state: &Path, unused: &Path, endpoint: &str) -> Vec<String> {
    let p = |p: &Path| p.to_str().unwrap().to_owned();
    [
        env!("CARGO_BIN_EXE_criguard").to_owned(),
        "serve".into(),
        "--listen".into(),
        p(unused),
        "--admin-socket".into(),
        p(admin),
        "--state-dir".into(),
        p(state),
        "--metrics-address".into(),
        "none".into(),
        "--dynamic-oom-score-adj=false".into(),
        "--runtime-endpoint".into(),
        endpoint.to_owned(),
    ]
    .into()
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// One line per run: calls, failures, drain and gap.
fn print_run(run: &serde_json::Value) {
    eprintln!(
        "{}: {} restarts, {} calls, {} failed, drain {} ms, gap {} ms; {}",
        run["name"],
        run["restarts"],
        run["calls"],
        run["failed"],
        run["drain_ms"],
        run["gap_ms"],
        run["by_method"]["messages"]
    );
}

#[test]
fn handoffs_under_a_kubelet_like_load_with_long_calls_fail_no_call() {
    let Some(rl) = restart_load() else {
        eprintln!("SKIPPED: restart-load not built (hack/restart-load/build.sh needs Go 1.26)");
        return;
    };
    let ctrd = PrivateContainerd::start();
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("unix://{}", ctrd.socket.to_str().unwrap());
    const HANDOFFS: u32 = 10;
    let serve = serve_args(
        &dir.path().join("admin.sock"),
        &dir.path().join("state"),
        &dir.path().join("unused.sock"),
        &endpoint,
    );
    let run = bench(
        &rl,
        dir.path(),
        ("handoff", &["-handoff", "-exec"]),
        HANDOFFS,
        &as_strs(&serve),
    );
    let h = result(run, dir.path(), "handoff");
    print_run(&h);
    let execs = h["by_method"]["calls"]["ExecSync"].as_u64().unwrap_or(0);
    assert!(
        execs >= HANDOFFS as u64,
        "2 s ExecSync calls ran throughout: {execs}"
    );
    assert_eq!(
        h["failed"].as_u64(),
        Some(0),
        "calls failed across criguard's handoffs: {}",
        h["by_method"]["messages"]
    );
    // Each predecessor finished the ExecSync it held (up to 2 s) before it
    // exited, while its successor answered fresh connections at once.
    let (gap, drain) = (
        h["gap_ms"]["max"].as_f64().unwrap(),
        h["drain_ms"]["p50"].as_f64().unwrap(),
    );
    assert!(
        gap < 1000.0,
        "a fresh connection waited {gap} ms in a handoff"
    );
    assert!(drain > gap, "drain p50 {drain} ms, gap max {gap} ms");
}

/// The running criguard's pid as its admin socket says.
fn serving_pid(admin: &Path) -> u32 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(criguard::admin::client::serving_pid(admin))
        .unwrap()
}

#[test]
fn a_restart_hands_over_and_the_next_start_adopts_the_new_process() {
    use std::os::unix::net::UnixDatagram;
    let ctrd = PrivateContainerd::start();
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("unix://{}", ctrd.socket.to_str().unwrap());
    let (admin, socket) = (dir.path().join("admin.sock"), dir.path().join("cri.sock"));
    let mut serve = serve_args(&admin, &dir.path().join("state"), &socket, &endpoint);
    let bin = serve.remove(0);
    // systemd's notify socket, as a Type=notify unit gets it.
    let notify_path = dir.path().join("notify");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let recv = || {
        let mut buf = [0u8; 256];
        let n = notify.recv(&mut buf).expect("a notify message");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let mut first = Command::new(&bin)
        .args(&serve)
        .env("NOTIFY_SOCKET", &notify_path)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert_eq!(
        recv(),
        "READY=1",
        "criguard says it is ready once it accepts"
    );
    let old = first.id();
    assert_eq!(serving_pid(&admin), old);

    // ExecStop during `systemctl restart`: hand over, systemd not told.
    let out = Command::new(&bin)
        .args([
            "handoff",
            "--for-restart",
            "--pid",
            &old.to_string(),
            "--admin-socket",
        ])
        .arg(&admin)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let succ = serving_pid(&admin);
    assert_ne!(succ, old);
    // Not a child of this test's: ended by its pid however the test ends.
    let _end = EndPid(succ);
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("to pid {succ}")));
    // The old process drains and exits 0 (systemd's SIGTERM finds it
    // draining); the CRI socket answers throughout.
    assert!(first.wait().unwrap().success());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = common::containerd::Clients::new(&socket);
        c.rt.version(k8s_cri::v1::VersionRequest::default())
            .await
            .expect("the new process answers");
    });

    // The start after the stop: it finds the new process in its own
    // cgroup, tells systemd it is the main process and ready, and ends.
    let next = Command::new(&bin)
        .args(&serve)
        .env("NOTIFY_SOCKET", &notify_path)
        .env("CRIGUARD_LOG", "info")
        .output()
        .unwrap();
    assert!(
        next.status.success(),
        "{}",
        String::from_utf8_lossy(&next.stderr)
    );
    assert_eq!(recv(), format!("MAINPID={succ}\nREADY=1"));
    assert_eq!(serving_pid(&admin), succ, "still the same process serving");
    // containerd restarted under the new process (`systemctl restart
    // containerd` restarts criguard first, through its BindsTo=): calls
    // through it are served again once containerd is back.
    ctrd.kill_daemon();
    ctrd.restart_daemon();
    rt.block_on(async {
        let mut c = common::containerd::Clients::new(&socket);
        let call =
            c.rt.list_pod_sandbox(k8s_cri::v1::ListPodSandboxRequest::default());
        tokio::time::timeout(std::time::Duration::from_secs(30), call)
            .await
            .expect("ListPodSandbox answered within 30 s after containerd's restart")
            .expect("ListPodSandbox through the new process");
    });
    drop(_end);
    let gone = || {
        std::fs::read_to_string(format!("/proc/{succ}/stat")).map_or(true, |s| s.contains(") Z "))
    };
    let end = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !gone() {
        assert!(
            std::time::Instant::now() < end,
            "pid {succ} still runs 60 s after SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Sends SIGTERM to a process by its pid when dropped.
struct EndPid(u32);

impl Drop for EndPid {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0 as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
}
