//! The gRPC clients people point at a CRI socket, driven from tests: tonic
//! in process, grpc-go (`crigo`, Debian's grpc-go 1.33, the kubelet's and
//! crictl's library) and grpcio (`cripy.py`, gRPC C-core from PyPI) as
//! long-lived helper processes speaking JSON lines (`hack/clients.sh` builds
//! them; see the programs' headers for the protocol). Every client sends raw
//! message bytes and reports raw bytes, status, headers and trailers, so
//! answers can be compared byte for byte.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

/// Where `hack/clients.sh` put the client programs.
pub struct Built {
    /// The grpc-go helper binary.
    pub crigo: PathBuf,
    /// The grpcio helper's interpreter (in the venv).
    pub python: PathBuf,
    /// The grpcio helper script.
    pub cripy: PathBuf,
}

/// Builds the clients once per test binary (a no-op when up to date).
pub fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let repo = crate::repo();
        let out = std::process::Command::new(repo.join("hack/clients.sh"))
            .stderr(Stdio::inherit())
            .output()
            .expect("run hack/clients.sh");
        assert!(
            out.status.success(),
            "hack/clients.sh failed (run hack/install-deps.sh first)"
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let mut lines = text.lines();
        let crigo = PathBuf::from(lines.next().expect("crigo path"));
        let venv = PathBuf::from(lines.next().expect("venv path"));
        Built {
            crigo,
            python: venv.join("bin/python"),
            cripy: repo.join("tests/clients/python/cripy.py"),
        }
    })
}

/// A client library and the way it dials the socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// tonic over a unix connector, `:authority` "localhost".
    Tonic,
    /// grpc-go given the bare socket path (kubelets before 2024): `:authority` is the path.
    GoPassthrough,
    /// grpc-go given `unix://PATH`: `:authority` "localhost".
    GoUnix,
    /// grpcio given `unix:PATH`: `:authority` is the path percent-encoded.
    PyUnix,
    /// grpcio given `unix:PATH` with `grpc.default_authority` set to this.
    PyAuthority(String),
}

impl Kind {
    /// One of each, the odd authority containing a space, '%' and '/'.
    pub fn all() -> Vec<Kind> {
        vec![
            Kind::Tonic,
            Kind::GoPassthrough,
            Kind::GoUnix,
            Kind::PyUnix,
            Kind::PyAuthority("odd authority %41/x".into()),
        ]
    }
}

/// One call to make.
#[derive(Clone, Debug, Default)]
pub struct Call {
    /// The full method path, `/package.Service/Method`.
    pub method: String,
    /// The request message (unframed).
    pub req: Vec<u8>,
    /// Request metadata, in order.
    pub md: Vec<(String, String)>,
    /// The call's deadline (sent as grpc-timeout).
    pub timeout: Option<Duration>,
    /// Server streaming instead of unary.
    pub stream: bool,
}

impl Call {
    /// A unary call with no metadata and a 30 s deadline.
    pub fn unary(method: &str, req: impl Into<Vec<u8>>) -> Self {
        Self {
            method: method.into(),
            req: req.into(),
            timeout: Some(Duration::from_secs(30)),
            ..Default::default()
        }
    }

    /// Adds one metadata pair.
    pub fn md(mut self, k: &str, v: &str) -> Self {
        self.md.push((k.into(), v.into()));
        self
    }
}

/// What a client reported for one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The gRPC status code (0 = OK).
    pub code: i32,
    /// The status message.
    pub message: String,
    /// The reply messages (one for a successful unary call).
    pub msgs: Vec<Vec<u8>>,
    /// Response header metadata as the client library shows it, sorted.
    pub header: Vec<(String, String)>,
    /// Trailer metadata as the client library shows it, sorted.
    pub trailer: Vec<(String, String)>,
}

impl Answer {
    /// The only reply message of a successful unary call; panics otherwise.
    pub fn ok(&self) -> &[u8] {
        assert_eq!((self.code, self.msgs.len()), (0, 1), "{self:?}");
        &self.msgs[0]
    }
}

/// A connected client of some [`Kind`].
pub struct Client {
    /// What it is.
    pub kind: Kind,
    inner: Inner,
}

enum Inner {
    Tonic(super::tonic_raw::RawTonic),
    Process(Box<Helper>),
}

impl Client {
    /// Starts a client of `kind` that dials `socket`.
    pub async fn connect(kind: &Kind, socket: &Path) -> Client {
        let path = socket.to_str().unwrap();
        let b = built();
        let inner = match kind {
            Kind::Tonic => Inner::Tonic(super::tonic_raw::RawTonic::new(socket)),
            Kind::GoPassthrough => Inner::Process(Helper::spawn_boxed(&b.crigo, &["client", path])),
            Kind::GoUnix => Inner::Process(Helper::spawn_boxed(
                &b.crigo,
                &["client", &format!("unix://{path}")],
            )),
            Kind::PyUnix => Inner::Process(Helper::spawn_boxed(
                &b.python,
                &[b.cripy.to_str().unwrap(), "client", &format!("unix:{path}")],
            )),
            Kind::PyAuthority(a) => Inner::Process(Helper::spawn_boxed(
                &b.python,
                &[
                    b.cripy.to_str().unwrap(),
                    "client",
                    "--authority",
                    a,
                    &format!("unix:{path}"),
                ],
            )),
        };
        Client {
            kind: kind.clone(),
            inner,
        }
    }

    /// Makes one call and waits for its whole answer.
    /// Panics if no answer comes within the call's deadline plus 15 s.
    pub async fn call(&self, call: Call) -> Answer {
        let limit = call.timeout.unwrap_or(Duration::from_secs(30)) + Duration::from_secs(15);
        let what = format!("{:?} {}", self.kind, call.method);
        let mut rx = self.start(call).await;
        let answer = async {
            loop {
                match rx.recv().await.expect("client helper died") {
                    Event::Msg(_) => {}
                    Event::Done(a) => return a,
                }
            }
        };
        tokio::time::timeout(limit, answer)
            .await
            .unwrap_or_else(|_| panic!("{what}: no answer within {limit:?}"))
    }

    /// Starts one call; its stream messages then its answer come on the receiver.
    pub async fn start(&self, call: Call) -> mpsc::UnboundedReceiver<Event> {
        match &self.inner {
            Inner::Tonic(t) => t.start(call),
            Inner::Process(h) => h.start(call).await,
        }
    }

    /// A prost-typed unary call: the decoded reply, or (code, message).
    pub async fn unary<Resp: prost::Message + Default>(
        &self,
        method: &str,
        req: &impl prost::Message,
    ) -> Result<Resp, (i32, String)> {
        let a = self.call(Call::unary(method, req.encode_to_vec())).await;
        if a.code != 0 {
            return Err((a.code, a.message));
        }
        Ok(Resp::decode(a.ok()).expect("decode reply"))
    }
}

/// What arrives for a started call.
#[derive(Debug)]
pub enum Event {
    /// One stream message, as it arrived.
    Msg(Vec<u8>),
    /// The final answer (all messages included).
    Done(Answer),
}

/// One line from a helper.
#[derive(Deserialize)]
struct Line {
    id: u64,
    #[serde(default)]
    done: bool,
    #[serde(default)]
    msg: Option<String>,
    #[serde(default)]
    code: i32,
    #[serde(default)]
    message: String,
    #[serde(default)]
    msgs: Option<Vec<Option<String>>>,
    #[serde(default)]
    header: Option<Vec<(String, String)>>,
    #[serde(default)]
    trailer: Option<Vec<(String, String)>>,
}

type Waiters = Arc<Mutex<HashMap<u64, mpsc::UnboundedSender<Event>>>>;

/// A helper process (crigo or cripy) in `client` mode, killed on drop.
struct Helper {
    _child: Child,
    stdin: tokio::sync::Mutex<ChildStdin>,
    waiters: Waiters,
    next: AtomicU64,
}

impl Helper {
    fn spawn_boxed(program: &Path, args: &[&str]) -> Box<Helper> {
        Box::new(Self::spawn(program, args))
    }

    fn spawn(program: &Path, args: &[&str]) -> Helper {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", program.display()));
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let waiters: Waiters = Arc::default();
        let w = waiters.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let l: Line = match serde_json::from_str(&line) {
                    Ok(l) => l,
                    Err(e) => {
                        eprintln!("bad client helper line {line:?}: {e}");
                        break;
                    }
                };
                let mut w = w.lock().unwrap();
                let event = if l.done {
                    let tx = w.remove(&l.id);
                    let dec = |v: Option<Vec<Option<String>>>| -> Vec<Vec<u8>> {
                        v.unwrap_or_default()
                            .iter()
                            .map(|m| B64.decode(m.as_deref().unwrap_or_default()).unwrap())
                            .collect()
                    };
                    let answer = Answer {
                        code: l.code,
                        message: l.message,
                        msgs: dec(l.msgs),
                        header: l.header.unwrap_or_default(),
                        trailer: l.trailer.unwrap_or_default(),
                    };
                    tx.map(|tx| (tx, Event::Done(answer)))
                } else {
                    let msg = B64.decode(l.msg.unwrap_or_default()).unwrap();
                    w.get(&l.id).cloned().map(|tx| (tx, Event::Msg(msg)))
                };
                if let Some((tx, ev)) = event {
                    let _ = tx.send(ev);
                }
            }
            // The helper is gone: fail every call still waiting.
            w.lock().unwrap().clear();
        });
        Helper {
            _child: child,
            stdin: tokio::sync::Mutex::new(stdin),
            waiters,
            next: AtomicU64::new(1),
        }
    }

    async fn start(&self, call: Call) -> mpsc::UnboundedReceiver<Event> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        self.waiters.lock().unwrap().insert(id, tx);
        let line = serde_json::json!({
            "id": id,
            "method": call.method,
            "req": B64.encode(&call.req),
            "md": call.md,
            "timeout_ms": call.timeout.map(|t| t.as_millis() as u64).unwrap_or(0),
            "stream": call.stream,
        });
        let mut stdin = self.stdin.lock().await;
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("write to client helper");
        stdin.flush().await.unwrap();
        rx
    }
}
