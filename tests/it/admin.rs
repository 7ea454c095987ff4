//! criguard's admin API (gRPC on the admin socket) and its CLI clients,
//! served in-process from a model and a status this test controls: what
//! `Pods`, `Evictions` and `Conditions` answer, and that `WatchEvictions`
//! delivers an eviction the moment it is recorded.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use criguard::admin::{self, AdminState};
use criguard::eviction::thresholds::{Observation, Observations};
use criguard::eviction::{Eviction, NodeStatus};
use criguard::model::{ContainerInfo, ContainerState, NodeModel, SandboxInfo, SandboxState};
use criguard::runtime::{RuntimeEndpoint, Upstream};
use criguard::signals::table::Condition;
use futures::StreamExt;
use tokio::sync::oneshot;

/// The admin API served on a temp socket; no runtime behind it (syncs
/// fail and the model is answered as it is).
struct Served {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    model: Arc<RwLock<NodeModel>>,
    status: Arc<RwLock<NodeStatus>>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Served {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("run/admin.sock");
        let listener = criguard::listen::bind(&socket).unwrap();
        let upstream = Upstream::new(
            RuntimeEndpoint::parse(dir.path().join("none.sock").to_str().unwrap()).unwrap(),
        );
        let model = Arc::new(RwLock::new(NodeModel::new(8 << 30)));
        let status = Arc::new(RwLock::new(NodeStatus::default()));
        let sources = criguard::signals::node::NodeSources {
            cgroups: criguard::cgroup::fs::CgroupFs::detect(dir.path()),
            proc_root: dir.path().join("proc"),
            memory_capacity: 8 << 30,
            pods_cgroup: "/kubepods".into(),
            nodefs: dir.path().to_owned(),
            imagefs: dir.path().to_owned(),
        };
        let usage = criguard::signals::usage::UsageReader::new(
            upstream.snapshots("overlayfs"),
            criguard::signals::usage::UsageSources {
                nodefs: dir.path().to_owned(),
                imagefs: dir.path().to_owned(),
                cgroups: sources.cgroups.clone(),
            },
        );
        let state = AdminState {
            kube: Default::default(),
            model: model.clone(),
            upstream,
            status: status.clone(),
            usage: usage.clone(),
            ranker: criguard::eviction::rank::Ranker::new(model.clone(), sources, Some(usage)),
            oom_kills: Default::default(),
            config: tokio::sync::watch::channel(admin::ConfigStatus::default()).1,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(admin::serve(listener, state, async {
            let _ = stopped.await;
        }));
        Self {
            _dir: dir,
            socket,
            model,
            status,
            stop: Some(stop),
            task,
        }
    }

    fn record(&self, e: Eviction) {
        self.status.write().unwrap().record_eviction(e);
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the admin server stops")
            .unwrap();
    }
}

fn eviction(pod: &str, at: u64) -> Eviction {
    Eviction {
        at_unix_ms: at,
        pod: format!("default/{pod}"),
        uid: format!("uid-{pod}"),
        sandbox_id: format!("sb-{pod}"),
        signal: "memory.available".into(),
        threshold: "memory.available<100Mi".into(),
        available: 41 << 20,
        usage: 180 << 20,
        request: 0,
        grace_s: 0,
        message: format!(
            "The node was low on resource: memory. Container {pod} was using 180Mi, request is 0. "
        ),
        dry_run: false,
    }
}

fn add_pod(model: &RwLock<NodeModel>) {
    let mut m = model.write().unwrap();
    m.upsert_sandbox(SandboxInfo {
        id: "sb-web".into(),
        name: "web".into(),
        namespace: "default".into(),
        uid: "uid-web".into(),
        cgroup_parent: "/kubepods/besteffort/poduid-web".into(),
        state: Some(SandboxState::Ready),
        ..Default::default()
    });
    m.upsert_container(ContainerInfo {
        id: "c-app".into(),
        sandbox_id: "sb-web".into(),
        name: "app".into(),
        image: "busybox".into(),
        oom_score_adj: 1000,
        state: Some(ContainerState::Running),
        ..Default::default()
    });
}

#[tokio::test]
async fn pods_evictions_and_conditions_answer_from_criguards_state() {
    let s = Served::start().await;
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&s.socket).unwrap().permissions().mode();
    assert_eq!(
        mode & 0o777,
        0o660,
        "the admin socket is owner and group only"
    );
    add_pod(&s.model);
    let want = s.model.read().unwrap().pods();
    assert_eq!(admin::get_pods(&s.socket).await.unwrap(), want);

    assert!(admin::get_evictions(&s.socket).await.unwrap().is_empty());
    s.record(eviction("a", 1));
    s.record(eviction("b", 2));
    let got = admin::get_evictions(&s.socket).await.unwrap();
    assert_eq!(got, vec![eviction("a", 1), eviction("b", 2)]);

    {
        let mut st = s.status.write().unwrap();
        st.conditions = [Condition::MemoryPressure].into();
        let mut obs = Observations::new(std::time::Instant::now());
        let signal = criguard::signals::table::Signal::MemoryAvailable;
        obs.signals.insert(
            signal,
            Observation {
                available: 41 << 20,
                capacity: 8 << 30,
            },
        );
        st.observations = Some(obs);
    }
    let c = admin::get_conditions(&s.socket).await.unwrap();
    assert_eq!(c.conditions, [Condition::MemoryPressure].into());
    assert_eq!(c.observations.len(), 1);
    assert!(c.observed_at_unix_ms.is_some());
    s.stop().await;
}

/// The next eviction of a watch, within 5 s.
async fn next<S>(stream: &mut S) -> Eviction
where
    S: futures::Stream<Item = Result<Eviction, admin::ClientError>> + Unpin,
{
    tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("an eviction within 5 s")
        .expect("the stream is open")
        .expect("no error")
}

#[tokio::test]
async fn watch_evictions_delivers_each_eviction_as_it_is_recorded() {
    let s = Served::start().await;
    s.record(eviction("before", 1));
    let mut fresh = Box::pin(admin::watch_evictions(&s.socket, false).await.unwrap());
    let mut replayed = Box::pin(admin::watch_evictions(&s.socket, true).await.unwrap());
    assert_eq!(next(&mut replayed).await, eviction("before", 1));
    s.record(eviction("after", 2));
    let e = next(&mut fresh).await;
    assert_eq!(
        e,
        eviction("after", 2),
        "a new watcher gets only new evictions"
    );
    assert_eq!(next(&mut replayed).await, eviction("after", 2));
    // Stopping criguard ends every watch.
    s.stop().await;
    let end = tokio::time::timeout(Duration::from_secs(5), StreamExt::next(&mut fresh)).await;
    assert!(matches!(end, Ok(None) | Ok(Some(Err(_)))), "{end:?}");
}

/// Runs `criguard ARGS --admin-socket SOCKET`; its stdout.
fn cli(socket: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_criguard"))
        .args(args)
        .arg("--admin-socket")
        .arg(socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_prints_tables_and_json_of_the_same_fields() {
    let s = Served::start().await;
    add_pod(&s.model);
    s.record(eviction("a", 1));
    let socket = s.socket.clone();
    let (pods_json, pods_table, ev_json, ev_lines) = tokio::task::spawn_blocking(move || {
        (
            cli(&socket, &["pods", "--json"]),
            cli(&socket, &["pods"]),
            cli(&socket, &["evictions", "--json"]),
            cli(&socket, &["evictions"]),
        )
    })
    .await
    .unwrap();
    let pods: serde_json::Value = serde_json::from_str(&pods_json).unwrap();
    let pod = &pods[0];
    for field in [
        "uid",
        "name",
        "namespace",
        "sandbox_id",
        "qos",
        "priority",
        "critical",
        "state",
        "containers",
        "source",
        "requests",
    ] {
        assert!(pod.get(field).is_some(), "pods --json lacks {field}: {pod}");
    }
    assert_eq!(pod["qos"], "BestEffort");
    assert_eq!(pod["containers"]["c-app"]["oom_score_adj"], 1000);
    assert!(
        pods_table.contains("default/web") && pods_table.contains("BestEffort"),
        "{pods_table}"
    );
    assert_eq!(pod["source"], "Inferred", "no API pod: inferred");
    let header = pods_table.lines().next().unwrap();
    assert!(
        header.contains(" SOURCE ") && header.contains(" POD-REQ "),
        "{header}"
    );
    assert!(
        pods_table.lines().nth(1).unwrap().contains(" inferred "),
        "{pods_table}"
    );
    let ev: criguard::admin::EvictionsReport = serde_json::from_str(&ev_json).unwrap();
    assert_eq!(ev.evictions, vec![eviction("a", 1)]);
    assert!(ev.kernel_oom_kills.is_empty(), "{ev_json}");
    assert!(
        ev_lines.contains("default/a [memory.available<100Mi]: The node was low"),
        "{ev_lines}"
    );
    s.stop().await;
}

/// The next line the CLI printed, as an eviction, within 10 s.
async fn line(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> Eviction {
    let l = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a line within 10 s")
        .expect("the CLI is still printing");
    serde_json::from_str(&l).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evictions_watch_prints_each_eviction_as_a_json_line() {
    use std::io::BufRead;
    let s = Served::start().await;
    s.record(eviction("a", 1));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_criguard"))
        .args(["evictions", "--watch", "--json", "--admin-socket"])
        .arg(&s.socket)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let _ = tx.send(line.unwrap());
        }
    });
    assert_eq!(
        line(&mut rx).await,
        eviction("a", 1),
        "the earlier eviction first"
    );
    s.record(eviction("b", 2));
    assert_eq!(line(&mut rx).await, eviction("b", 2));
    s.stop().await;
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(
        status.success(),
        "the watch ends cleanly when criguard stops: {status:?}"
    );
}

#[tokio::test]
async fn a_missing_socket_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.sock");
    let err = admin::get_pods(&path).await.unwrap_err().to_string();
    assert!(
        err.contains(path.to_str().unwrap()) && err.contains("criguard serve"),
        "{err}"
    );
}
