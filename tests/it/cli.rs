//! The `criguard serve` process as an operator runs it: socket activation,
//! SIGTERM, and what it leaves behind.

use crate::common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::poll_until;
use common::rawgrpc::{self, RecordingUpstream, Reply};

fn ok(body: &'static [u8]) -> Reply {
    Reply::Unary {
        headers: vec![],
        body: rawgrpc::frame(body),
        trailers: vec![("grpc-status", "0".into())],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_activation_serves_on_the_passed_socket() {
    let dir = tempfile::tempdir().unwrap();
    let upstream_sock = dir.path().join("runtime.sock");
    let _upstream = RecordingUpstream::start(&upstream_sock, |_| ok(b"pong"));
    let listen = dir.path().join("activated.sock");
    // systemd-socket-activate owns the socket and starts criguard on the
    // first connection, the way a systemd .socket unit does.
    let spawn = || {
        Command::new("systemd-socket-activate")
            .arg("--listen")
            .arg(&listen)
            .arg(env!("CARGO_BIN_EXE_criguard"))
            .arg("serve")
            .arg("--listen")
            .arg(dir.path().join("never-bound.sock"))
            .arg("--admin-socket")
            .arg(dir.path().join("admin.sock"))
            .args(["--metrics-address", "none"])
            .arg("--runtime-endpoint")
            .arg(&upstream_sock)
            .stderr(Stdio::inherit())
            .spawn()
            .expect("systemd-socket-activate (package systemd) must be installed")
    };
    let mut activator = spawn();
    poll_until(Duration::from_secs(10), "the activated socket", || async {
        listen.exists().then_some(())
    })
    .await;
    let mut client = rawgrpc::connect(&listen).await;
    let resp = rawgrpc::call(
        &mut client,
        rawgrpc::empty_request("/runtime.v1.RuntimeService/Version"),
    )
    .await;
    assert_eq!(resp.body, rawgrpc::frame(b"pong"));
    assert!(
        !dir.path().join("never-bound.sock").exists(),
        "with LISTEN_FDS criguard must use the passed socket, not bind --listen"
    );
    activator.kill().unwrap();
    activator.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_and_removes_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let upstream_sock = dir.path().join("runtime.sock");
    let _upstream = RecordingUpstream::start(&upstream_sock, |_| ok(b""));
    let listen = dir.path().join("run/criguard.sock");
    let guard = common::containerd::CriguardProcess::start(&listen, &upstream_sock, &[]).await;
    let mut client = rawgrpc::connect(&listen).await;
    let resp = rawgrpc::call(
        &mut client,
        rawgrpc::empty_request("/runtime.v1.RuntimeService/Version"),
    )
    .await;
    assert_eq!(resp.grpc_status().as_deref(), Some("0"));
    let status = guard.signal_and_wait(libc::SIGTERM);
    assert!(status.success(), "{status:?}");
    assert!(!listen.exists(), "socket left behind after a clean exit");
    assert!(
        !listen.with_extension("admin.sock").exists(),
        "admin socket left behind"
    );
}

#[test]
fn a_listen_path_that_is_not_a_socket_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("criguard.sock");
    std::fs::write(&path, "keep me").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_criguard"))
        .args(["serve", "--listen"])
        .arg(&path)
        .arg("--admin-socket")
        .arg(dir.path().join("admin.sock"))
        .args(["--metrics-address", "none"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(path.to_str().unwrap()) && stderr.contains("not a socket"),
        "{stderr}"
    );
    // stderr is a pipe here, as under systemd: plain text, no colour codes.
    assert!(
        !stderr.contains('\x1b'),
        "colour codes in a log that is not a terminal: {stderr:?}"
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "keep me");
}

/// Spawns `criguard serve` on a listening socket passed as fd 3, the way
/// systemd passes `criguard.socket`.
fn spawn_activated(
    listener: &std::os::unix::net::UnixListener,
    dir: &std::path::Path,
    upstream: &std::path::Path,
) -> std::process::Child {
    use std::os::fd::AsRawFd;
    spawn_with_fd3(listener.as_raw_fd(), dir, upstream, Stdio::inherit())
}

/// Spawns `criguard serve` with `LISTEN_FDS=1` and `fd` as its fd 3 (a
/// negative `fd`: fd 3 closed).
fn spawn_with_fd3(
    fd: std::os::fd::RawFd,
    dir: &std::path::Path,
    upstream: &std::path::Path,
    stderr: Stdio,
) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_criguard"));
    cmd.stderr(stderr)
        .arg("serve")
        .arg("--listen")
        .arg(dir.join("never-bound.sock"))
        .arg("--admin-socket")
        .arg(dir.join("admin.sock"))
        .args(["--metrics-address", "none"])
        .arg("--runtime-endpoint")
        .arg(upstream)
        .env("LISTEN_FDS", "1")
        .env_remove("LISTEN_PID");
    // SAFETY: dup2 and fcntl are async-signal-safe; nothing else runs here.
    unsafe {
        cmd.pre_exec(move || {
            if fd < 0 {
                libc::close(3);
            } else if fd == 3 {
                let flags = libc::fcntl(3, libc::F_GETFD);
                libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
            } else if libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_made_while_criguard_restarts_under_socket_activation_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let upstream_sock = dir.path().join("runtime.sock");
    let _upstream = RecordingUpstream::start(&upstream_sock, |_| ok(b"pong"));
    // This process plays systemd: it owns the socket across the restart.
    let sock = dir.path().join("criguard.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let mut first = spawn_activated(&listener, dir.path(), &upstream_sock);
    let version = || rawgrpc::empty_request("/runtime.v1.RuntimeService/Version");
    let mut client = rawgrpc::connect(&sock).await;
    assert_eq!(
        rawgrpc::call(&mut client, version()).await.body,
        rawgrpc::frame(b"pong")
    );

    first.kill().unwrap();
    first.wait().unwrap();
    // criguard is down: connecting still works (the socket's backlog holds
    // the connection), and the call waits instead of being refused.
    let stream =
        std::os::unix::net::UnixStream::connect(&sock).expect("connect while criguard is down");
    stream.set_nonblocking(true).unwrap();
    let pending = tokio::spawn(async move {
        let mut c =
            rawgrpc::connect_stream(tokio::net::UnixStream::from_std(stream).unwrap()).await;
        rawgrpc::call(
            &mut c,
            rawgrpc::empty_request("/runtime.v1.RuntimeService/Version"),
        )
        .await
    });
    let mut second = spawn_activated(&listener, dir.path(), &upstream_sock);
    let resp = tokio::time::timeout(std::time::Duration::from_secs(20), pending)
        .await
        .expect("the call made during the restart was never served")
        .unwrap();
    assert_eq!(resp.body, rawgrpc::frame(b"pong"));
    second.kill().unwrap();
    second.wait().unwrap();
}

fn check_config(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_criguard"))
        .arg("check-config")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_config_prints_the_kubelet_defaults() {
    let (code, out, err) = check_config(&[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("memory.available<100Mi") && out.contains("nodefs.inodesFree<5%"),
        "{out}"
    );
    assert!(
        out.contains("evictionPressureTransitionPeriod: 5m0s"),
        "{out}"
    );
    assert!(out.contains("kubeconfig: none (no API report)"), "{out}");
}

#[test]
fn every_invalid_form_exits_2_naming_key_and_value() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.toml");
    std::fs::write(
        &file,
        "evictionHard = { \"memory.available\" = \"1Gi\" }\nevictionHardd = {}\n",
    )
    .unwrap();
    let file_arg = format!("--config={}", file.display());
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--eviction-hard=memory.free<1Gi"],
            &["evictionHard", "memory.free", "unknown signal"],
        ),
        (
            &["--eviction-hard=memory.available>1Gi"],
            &["--eviction-hard", "memory.available>1Gi", "operator"],
        ),
        (
            &["--eviction-hard=memory.available<1Gb"],
            &["evictionHard", "memory.available=1Gb"],
        ),
        (
            &["--eviction-hard=nodefs.available<0%"],
            &["nodefs.available=0%"],
        ),
        (
            &["--eviction-hard=nodefs.available<101%"],
            &["nodefs.available=101%"],
        ),
        (
            &["--eviction-soft=memory.available<1Gi"],
            &["evictionSoft", "grace period"],
        ),
        (
            &["--eviction-soft-grace-period=memory.available=1m"],
            &["evictionSoftGracePeriod", "no soft threshold"],
        ),
        (
            &["--eviction-pressure-transition-period=-5m"],
            &["evictionPressureTransitionPeriod", "-5m"],
        ),
        (
            &["--eviction-max-pod-grace-period=-3"],
            &["evictionMaxPodGracePeriod", "-3"],
        ),
        (
            &["--eviction-hard=memory.available<1Gi,memory.available<10%"],
            &["given twice"],
        ),
        (&[file_arg.as_str()], &["config.toml", "evictionHardd"]),
        (
            &["--kubeconfig=/nonexistent/kubeconfig"],
            &["kubeconfig", "/nonexistent/kubeconfig"],
        ),
        (&["--kube-status-timeout=0s"], &["kubeStatusTimeout", "0s"]),
        (&["--kubeconfig=in-cluster"], &["kubeconfig", "in-cluster"]),
    ];
    for (args, needles) in cases {
        let (code, _, err) = check_config(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        for n in *needles {
            assert!(err.contains(n), "{args:?}: {err:?} lacks {n:?}");
        }
    }
}

/// Runs `criguard serve ARGS` (on sockets in `dir`, with no runtime
/// behind it) until `criguard status` answers; its exit code and text,
/// with criguard still running (then stopped).
fn serve_status(dir: &std::path::Path, args: &[&str]) -> (i32, String) {
    let listen = dir.join("criguard.sock");
    let admin = dir.join("admin.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_criguard"))
        .arg("serve")
        .arg("--listen")
        .arg(&listen)
        .arg("--admin-socket")
        .arg(&admin)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--runtime-endpoint")
        .arg(format!("unix://{}", dir.join("no-runtime.sock").display()))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let answer = loop {
        if let Some(s) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
            panic!("{args:?}: criguard exited ({s}) instead of failing open: {err}");
        }
        let out = Command::new(env!("CARGO_BIN_EXE_criguard"))
            .arg("status")
            .arg("--admin-socket")
            .arg(&admin)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !text.is_empty() {
            break (out.status.code().unwrap_or(-1), text);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{args:?}: criguard status never answered"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(listen.exists(), "{args:?}: the CRI socket is served");
    child.kill().unwrap();
    child.wait().unwrap();
    answer
}

#[test]
fn serve_fails_open_on_bad_psi_settings_naming_the_flag() {
    let cases: &[(&str, &[&str])] = &[
        (
            "--memory-psi-window=30s",
            &["--memory-psi-window", "30s", "500ms to 10s"],
        ),
        ("--memory-psi-stall=3s", &["--memory-psi-stall", "3s"]),
        ("--memory-psi-stall=lots", &["--memory-psi-stall", "lots"]),
    ];
    for (arg, needles) in cases {
        let dir = tempfile::tempdir().unwrap();
        let (code, text) = serve_status(dir.path(), &[arg, "--metrics-address", "none"]);
        assert_eq!(code, 2, "{arg}: {text}");
        assert!(text.contains("INVALID"), "{arg}: {text}");
        for n in *needles {
            assert!(text.contains(n), "{arg}: {text:?} lacks {n:?}");
        }
    }
}

#[test]
fn signals_says_when_it_read_them() {
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let out = Command::new(env!("CARGO_BIN_EXE_criguard"))
        .args(["signals", "--node-memory-capacity", "1000000000"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let first = text.lines().next().unwrap_or_default();
    let at: f64 = first
        .strip_prefix("read at ")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no read time in {first:?}"));
    assert!(
        (at - before).abs() < 60.0,
        "read at {at}, started at {before}"
    );
    assert!(text.contains("memory.available"), "{text}");
}

#[test]
fn check_config_reads_the_kubeconfig_setting_from_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n\
         contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: t\n",
    )
    .unwrap();
    let file = dir.path().join("config.toml");
    std::fs::write(
        &file,
        format!(
            "kubeconfig = \"{}\"\nnodeName = \"worker-1\"\nnodeTaints = false\n",
            kubeconfig.display()
        ),
    )
    .unwrap();
    let (code, out, err) = check_config(&[&format!("--config={}", file.display())]);
    assert_eq!(code, 0, "{err}");
    for line in [
        format!("kubeconfig: {}", kubeconfig.display()),
        "nodeName: worker-1".into(),
        "kubeStatusTimeout: 250ms".into(),
        "nodeTaints: false".into(),
    ] {
        assert!(out.contains(&line), "{out:?} lacks {line:?}");
    }
    // A flag overrides the file key by key.
    let (code, out, _) = check_config(&[
        &format!("--config={}", file.display()),
        "--node-name=worker-2",
    ]);
    assert_eq!(code, 0);
    assert!(out.contains("nodeName: worker-2"), "{out}");
}

/// Runs `criguard check-config` with its address space capped at 1 GiB and
/// a 20 s deadline, so that an unbounded read fails fast instead of
/// exhausting the machine's memory.
fn check_config_bounded(args: &[&str]) -> (i32, String) {
    let mut child = Command::new("prlimit")
        .arg(format!("--as={}", 1u64 << 30))
        .arg(env!("CARGO_BIN_EXE_criguard"))
        .arg("check-config")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("prlimit (util-linux) must be installed");
    let what = format!("check-config {args:?}");
    let (status, err) = exit_within(&mut child, Duration::from_secs(20), &what);
    (status.code().unwrap_or(-1), err)
}

/// Waits for `child` to exit within `limit` (killing it and failing the
/// test otherwise); its exit status and what it wrote to stderr.
fn exit_within(
    child: &mut std::process::Child,
    limit: Duration,
    what: &str,
) -> (std::process::ExitStatus, String) {
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("{what} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    (status, err)
}

#[test]
fn a_config_file_that_is_not_a_small_regular_file_is_refused_by_path() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.toml");
    // 2 MiB of comments: valid TOML, but past the 1 MiB bound.
    std::fs::write(&big, "# padding\n".repeat(210_000)).unwrap();
    let fifo = dir.path().join("config.fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let d = dir.path().to_str().unwrap();
    let cases = [
        ("/dev/zero", "not a regular file"),
        (d, "not a regular file"),
        (fifo.to_str().unwrap(), "not a regular file"),
        (big.to_str().unwrap(), "larger than 1 MiB"),
    ];
    for (path, rule) in cases {
        let (code, err) = check_config_bounded(&[&format!("--config={path}")]);
        assert_eq!(code, 2, "{path}: {err}");
        assert!(err.contains(path) && err.contains(rule), "{path}: {err}");
    }
}

#[test]
fn a_toml_syntax_error_names_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.toml");
    std::fs::write(
        &file,
        "dryRun = true\nevictionHard = { \"memory.available\" = \"1Gi\" \nhousekeepingInterval = \"10s\"\n",
    )
    .unwrap();
    let (code, _, err) = check_config(&[&format!("--config={}", file.display())]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!(
            "{}, line 3, column 1: \"housekeepingInterval = \\\"10s\\\"\": missing comma",
            file.display()
        )),
        "{err}"
    );
    assert!(!err.contains(": \"\":"), "no empty key or value: {err}");
}

#[test]
fn an_empty_eviction_hard_is_refused_and_none_says_it_explicitly() {
    for empty in [
        "--eviction-hard=",
        "--eviction-hard=,",
        "--eviction-hard= , ",
    ] {
        let (code, out, err) = check_config(&[empty]);
        assert_eq!(code, 2, "{empty}: {out}{err}");
        assert!(
            err.contains("--eviction-hard") && err.contains("--eviction-hard=none"),
            "{empty}: {err}"
        );
    }
    let (code, out, err) = check_config(&["--eviction-hard=none"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("evictionHard: (none)"), "{out}");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.toml");
    std::fs::write(&file, "evictionHard = {}\n").unwrap();
    let (code, _, err) = check_config(&[&format!("--config={}", file.display())]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("evictionHard = \\\"none\\\"") || err.contains("evictionHard = \"none\""),
        "{err}"
    );
    std::fs::write(&file, "evictionHard = \"none\"\n").unwrap();
    let (code, out, err) = check_config(&[&format!("--config={}", file.display())]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("evictionHard: (none)"), "{out}");
}

#[test]
fn a_quantity_past_the_int64_range_is_refused_naming_key_and_value() {
    for (arg, value) in [
        (
            "--eviction-hard=memory.available<9223372036854775808",
            "memory.available=9223372036854775808",
        ),
        (
            "--eviction-hard=memory.available<8Ei",
            "memory.available=8Ei",
        ),
        (
            "--eviction-minimum-reclaim=memory.available=18446744073709551615",
            "memory.available=18446744073709551615",
        ),
    ] {
        let (code, out, err) = check_config(&[arg]);
        assert_eq!(code, 2, "{arg}: {out}{err}");
        assert!(
            err.contains(value) && err.contains("out of range"),
            "{arg}: {err}"
        );
    }
    // The largest value that fits is taken as given.
    let (code, out, err) = check_config(&["--eviction-hard=memory.available<9223372036854775807"]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("8Ei"), "{out}");
}

#[test]
fn socket_activation_refuses_an_fd_3_that_is_not_a_listening_unix_stream_socket() {
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    let upstream = dir.path().join("runtime.sock");
    let datagram = std::os::unix::net::UnixDatagram::bind(dir.path().join("dgram.sock")).unwrap();
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let file = std::fs::File::create(dir.path().join("plain")).unwrap();
    let (connected, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
    let cases: [(&str, std::os::fd::RawFd, &str); 5] = [
        (
            "a unix datagram socket",
            datagram.as_raw_fd(),
            "not a stream socket",
        ),
        ("a TCP listener", tcp.as_raw_fd(), "not a unix socket"),
        ("a regular file", file.as_raw_fd(), "not a socket"),
        (
            "a connected unix stream",
            connected.as_raw_fd(),
            "not listening",
        ),
        ("nothing", -1, "not a socket"),
    ];
    for (what, fd, needle) in cases {
        let mut child = spawn_with_fd3(fd, dir.path(), &upstream, Stdio::piped());
        let running = format!("fd 3 = {what}: criguard");
        let (status, err) = exit_within(&mut child, Duration::from_secs(10), &running);
        assert_eq!(status.code(), Some(2), "fd 3 = {what}: {err}");
        assert!(
            err.contains("fd 3") && err.contains(needle),
            "fd 3 = {what}: {err}"
        );
    }
}

#[test]
fn serve_fails_open_on_a_flag_value_it_cannot_parse_and_refuses_an_unknown_flag() {
    let dir = tempfile::tempdir().unwrap();
    let (code, text) = serve_status(
        dir.path(),
        &["--metrics-address", "none", "--node-taints=maybe"],
    );
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("INVALID: --node-taints: \"maybe\""), "{text}");
    // An unknown flag may be a misspelt relay essential: clap's exit 2.
    let out = Command::new(env!("CARGO_BIN_EXE_criguard"))
        .args(["serve", "--lisen", "/nowhere.sock"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--lisen"));
}

#[test]
fn serve_refuses_a_bad_runtime_endpoint_with_exit_2_and_fails_open_on_a_bad_metrics_address() {
    // A relay essential: nothing to relay to, exit 2 before anything starts.
    let dir = tempfile::tempdir().unwrap();
    let listen = dir.path().join("criguard.sock");
    let out = Command::new(env!("CARGO_BIN_EXE_criguard"))
        .arg("serve")
        .arg("--listen")
        .arg(&listen)
        .arg("--admin-socket")
        .arg(dir.path().join("admin.sock"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .args(["--runtime-endpoint", "tcp://127.0.0.1:1234"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for n in ["--runtime-endpoint", "tcp://127.0.0.1:1234"] {
        assert!(err.contains(n), "{err:?} lacks {n:?}");
    }
    assert!(!listen.exists(), "the socket is never made");
    // The metrics address is not: criguard relays and says what is wrong.
    for addr in ["localhost:nine", "192.0.2.1:9809"] {
        // TEST-NET-1 (192.0.2.1): never an address of this machine.
        let dir = tempfile::tempdir().unwrap();
        let (code, text) = serve_status(dir.path(), &["--metrics-address", addr]);
        assert_eq!(code, 2, "{addr}: {text}");
        assert!(
            text.contains("INVALID") && text.contains("--metrics-address") && text.contains(addr),
            "{addr}: {text}"
        );
    }
}

/// `criguard serve` on `listen` with admin socket `admin` and state
/// directory `state`, its stderr piped.
fn serve_cmd(
    listen: &std::path::Path,
    admin: &std::path::Path,
    state: &std::path::Path,
) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_criguard"));
    cmd.arg("serve")
        .arg("--listen")
        .arg(listen)
        .arg("--admin-socket")
        .arg(admin)
        .arg("--state-dir")
        .arg(state)
        .args(["--metrics-address", "none"])
        .arg("--runtime-endpoint")
        .arg("unix:///nonexistent/runtime.sock")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

#[test]
fn a_startup_failure_removes_the_sockets_criguard_bound_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let listen = dir.path().join("criguard.sock");
    // An admin socket path under a regular file: it cannot be bound, after
    // the CRI socket was.
    std::fs::write(dir.path().join("file"), b"").unwrap();
    let bad_admin = dir.path().join("file/admin.sock");
    let mut child = serve_cmd(&listen, &bad_admin, &dir.path().join("state"))
        .spawn()
        .unwrap();
    let (status, err) = exit_within(&mut child, Duration::from_secs(20), "serve");
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("admin.sock"), "names the path: {err}");
    assert!(!listen.exists(), "the CRI socket left behind: {err}");

    // An admin socket another process serves on: refused, and that socket
    // (not criguard's) stays.
    let admin = dir.path().join("admin.sock");
    let _other = std::os::unix::net::UnixListener::bind(&admin).unwrap();
    let mut child = serve_cmd(&listen, &admin, &dir.path().join("state"))
        .spawn()
        .unwrap();
    let (status, err) = exit_within(&mut child, Duration::from_secs(20), "serve");
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("another process"), "{err}");
    assert!(!listen.exists(), "the CRI socket left behind: {err}");
    assert!(admin.exists(), "another process's socket removed");
}

#[test]
fn an_open_state_directory_is_made_private_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (code, _) = serve_status(dir.path(), &[]);
    assert_eq!(code, 0);
    let mode = std::fs::metadata(&state).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o700, "state directory left {mode:o}");
}
