//! The `criguard serve` process as an operator runs it: socket activation,
//! SIGTERM, and what it leaves behind.

mod common;

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
        rawgrpc::request(
            "/runtime.v1.RuntimeService/Version",
            rawgrpc::frame(b""),
            &[],
        ),
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
        rawgrpc::request(
            "/runtime.v1.RuntimeService/Version",
            rawgrpc::frame(b""),
            &[],
        ),
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
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(path.to_str().unwrap()) && stderr.contains("not a socket"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "keep me");
}
