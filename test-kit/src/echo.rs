//! A recording upstream that is a grpc-go server, as containerd's is: it
//! accepts every `:authority` grpc-go accepts (the raw socket path, C-core's
//! percent-encoding, spaces), records each call and answers as the call's
//! `x-echo-*` metadata asks (see `tests/clients/go/crigo/echo.go`). The
//! hyper-based recorder in `rawgrpc` cannot stand in for containerd here:
//! h2 refuses those authorities.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

/// One call as the upstream received it.
#[derive(Clone, Debug, Deserialize)]
pub struct Seen {
    /// The method path.
    pub method: String,
    /// All metadata, `:authority` and `user-agent` included, sorted.
    pub md: Vec<(String, String)>,
    /// The request message, base64 on the wire.
    #[serde(default)]
    req: Option<String>,
}

impl Seen {
    /// The request message bytes.
    pub fn req(&self) -> Vec<u8> {
        B64.decode(self.req.as_deref().unwrap_or_default()).unwrap()
    }

    /// The first value of metadata key `k`.
    pub fn get(&self, k: &str) -> Option<&str> {
        self.md
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    }
}

/// The `crigo echo` process, killed on drop.
pub struct EchoUpstream {
    /// Its socket.
    pub socket: PathBuf,
    seen: mpsc::UnboundedReceiver<Seen>,
    stdin: ChildStdin,
    _child: Child,
}

impl EchoUpstream {
    /// Starts one on `socket` and waits until it listens.
    pub async fn start(socket: &Path) -> Self {
        let mut child = Command::new(&super::clients::built().crigo)
            .args(["echo", "--listen"])
            .arg(socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn crigo echo");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .expect("crigo echo did not start")
            .unwrap();
        assert_eq!(ready.as_deref(), Some(r#"{"ready":true}"#));
        let (tx, seen) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let s: Seen = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("bad echo line {line:?}: {e}"));
                if tx.send(s).is_err() {
                    return;
                }
            }
        });
        Self {
            socket: socket.to_owned(),
            seen,
            stdin: child.stdin.take().unwrap(),
            _child: child,
        }
    }

    /// The next recorded call carrying `x-test-id: id` (others, such as
    /// criguard's own sync calls, are skipped); panics after 10 s.
    pub async fn seen(&mut self, id: &str) -> Seen {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let s = tokio::time::timeout_at(deadline, self.seen.recv())
                .await
                .unwrap_or_else(|_| panic!("upstream never saw call {id}"))
                .expect("crigo echo exited");
            if s.get("x-test-id") == Some(id) {
                return s;
            }
        }
    }

    /// The next recorded call that carries any `x-test-id`; panics after 10 s.
    pub async fn next_test_call(&mut self) -> Seen {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let s = tokio::time::timeout_at(deadline, self.seen.recv())
                .await
                .expect("upstream saw no further test call")
                .expect("crigo echo exited");
            if s.get("x-test-id").is_some() {
                return s;
            }
        }
    }

    /// Lets one message of every stream gated on `tag` go.
    pub async fn release(&mut self, tag: &str) {
        self.stdin
            .write_all(format!("release {tag}\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
    }
}
