//! criguard as an NRI plugin (`criguard::nri`, `criguard::intercept::nri`)
//! against containerd 2's own NRI, the Go trunk and ttRPC it ships: it
//! registers on a private containerd 2 with NRI on, is configured and
//! synchronised, refuses a BestEffort pod under MemoryPressure with the
//! proxy's message, raises a container's `oom_score_adj` to the kubelet's
//! rule in its CreateContainer answer, and keeps the node model.
//! containerd 1.6 has no NRI: `hack/test.sh` tests this module in its
//! containerd 2 and NRI groups; on 1.6 each test says it is skipped and
//! passes.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::containerd::{ContainerdVersion, PrivateContainerd, unique};
use common::kubelet::PodSpec;
use common::pods::{proc_oom_score_adj, remove_pods, run_pod, sleeper};
use criguard::eviction::NodeStatus;
use criguard::intercept::Observer;
use criguard::intercept::nri::NriObserver;
use criguard::lock::RwLocked;
use criguard::model::{ContainerState, NodeModel};
use criguard::nri::api;
use criguard::nri::attach::{AttachError, Registration, attach, stay_attached};
use criguard::nri::conn::{Handler, serve};
use criguard::nri::ttrpc::Response;
use criguard::signals::table::Condition;
use k8s_cri::v1 as cri;
use std::sync::RwLock;
use tokio::sync::{mpsc, oneshot};

/// criguard's NRI plugin over a fresh node model, the node under
/// MemoryPressure (so BestEffort pods are refused, as the proxy refuses
/// them), each call it answers reported on `calls`.
struct Plugin {
    inner: NriObserver,
    calls: mpsc::UnboundedSender<String>,
}

impl Handler for Plugin {
    async fn call(&self, service: &str, method: &str, payload: &[u8]) -> Response {
        let _ = self.calls.send(method.to_owned());
        self.inner.call(service, method, payload).await
    }
}

/// A private containerd 2 with NRI on: hack/containerd.sh disables it
/// (its default socket would be shared); here its socket is under the
/// instance's own directory. `None`, said, on containerd 1.6 (no NRI).
fn with_nri() -> Option<PrivateContainerd> {
    if ContainerdVersion::selected() != ContainerdVersion::V2 {
        eprintln!("NRI is tested on containerd 2 (CRIGUARD_CONTAINERD=2): skipped here");
        return None;
    }
    Some(PrivateContainerd::start_with_toml(
        common::containerd::NRI_ON,
    ))
}

#[tokio::test]
async fn a_plugin_of_ours_registers_with_containerd_2_and_is_obeyed() {
    let Some(ctrd) = with_nri() else {
        return;
    };
    let socket = ctrd.dir.join("nri/nri.sock");
    // No connection just to probe: containerd takes plugins one at a time,
    // and one that does not register holds the next for 5 s.
    common::poll_until(Duration::from_secs(10), "containerd's NRI socket", || {
        let there = socket.exists();
        async move { there.then_some(()) }
    })
    .await;
    // A registration the runtime refuses (an index must be two digits)
    // says so, naming the socket and what was registered.
    let bad = Registration {
        socket: socket.clone(),
        name: "criguard-test".into(),
        index: "1".into(),
    };
    let err = attach(
        &bad,
        Arc::new(NriObserver::new(Observer::new(Default::default()))),
    )
    .await
    .err()
    .expect("refused");
    assert!(matches!(err, AttachError::Register { .. }), "{err}");
    let stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
    let (calls_tx, mut calls) = mpsc::unbounded_channel();
    let model = Arc::new(RwLock::new(NodeModel::new(common::pods::mem_total())));
    let status = NodeStatus {
        conditions: [Condition::MemoryPressure].into(),
        ..Default::default()
    };
    let status = Arc::new(RwLock::new(status));
    let observer = Observer::new(model.clone()).with_admission(status.clone(), Default::default());
    let plugin = Plugin {
        inner: NriObserver::new(observer),
        calls: calls_tx,
    };
    let (ready, client) = oneshot::channel();
    let served = tokio::spawn(serve(stream, Arc::new(plugin), ready));
    let client = client.await.unwrap();
    let register = api::RegisterPluginRequest {
        plugin_name: "criguard-test".into(),
        plugin_idx: "10".into(),
        nri_version: String::new(),
    };
    let service = "nri.pkg.api.v1alpha1.Runtime";
    let t = Duration::from_secs(5);
    client
        .call(service, "RegisterPlugin", &register, t)
        .await
        .expect("registered");
    let next = |calls: &mut mpsc::UnboundedReceiver<String>| {
        let got = calls.try_recv();
        got.ok()
    };
    let first = tokio::time::timeout(t, calls.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first, "Configure");
    let second = tokio::time::timeout(t, calls.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second, "Synchronize");
    assert_eq!(next(&mut calls), None, "nothing else before a pod");

    // A BestEffort pod under MemoryPressure: containerd fails the CRI call
    // with criguard's refusal, the proxy's words.
    let mut c = ctrd.direct();
    let refused = PodSpec::new("refused", &unique("nri")).container(sleeper("app"));
    std::fs::create_dir_all(refused.log_directory()).unwrap();
    let err =
        c.rt.run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(refused.sandbox_config()),
            runtime_handler: String::new(),
        })
        .await
        .expect_err("RunPodSandbox refused by the plugin");
    let why = "the node has condition MemoryPressure: no new BestEffort pods are admitted";
    assert!(err.message().contains(why), "{err:?}");
    // containerd then tears the refused sandbox down, telling criguard.
    let seen: Vec<String> = std::iter::from_fn(|| next(&mut calls)).collect();
    assert_eq!(
        seen,
        ["RunPodSandbox", "StopPodSandbox", "RemovePodSandbox"]
    );
    assert_eq!(
        model.read_locked().ids(),
        (vec![], vec![]),
        "nothing kept of it"
    );

    // Once the pressure is over, the same BestEffort pod is admitted; its
    // container runs with the kubelet's score for its class, 1000, which
    // criguard sets in the CreateContainer answer though the kubelet (here:
    // the test) asked for 500.
    status.write_locked().conditions.clear();
    let pod = PodSpec::new("admitted", &unique("nri")).container(sleeper("app"));
    let (sandbox, ids) = run_pod(&mut c.rt, &pod, Some(500)).await;
    let want = 1000;
    assert_eq!(proc_oom_score_adj(&mut c, Some(&ids[0]), None).await, want);
    let seen: Vec<String> = std::iter::from_fn(|| next(&mut calls)).collect();
    assert_eq!(seen, ["RunPodSandbox", "CreateContainer", "StartContainer"]);
    // The model knows the pod, its container running with that score.
    let known = model
        .read_locked()
        .pod(&sandbox)
        .expect("the pod in the model");
    let container = &known.containers[&ids[0]];
    assert_eq!(
        (known.name.as_str(), container.oom_score_adj),
        ("admitted", want)
    );
    assert_eq!(container.state, ContainerState::Running);

    remove_pods(&mut c.rt, [sandbox]).await;
    drop(client);
    served.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_attaches_again_after_containerd_restarts_and_loses_no_pod() {
    let Some(ctrd) = with_nri() else {
        return;
    };
    let mut c = ctrd.direct();
    // A pod from before criguard attaches: learnt from the synchronisation.
    let early = PodSpec::new("early", &unique("nri")).container(sleeper("app"));
    let (early_sb, _) = run_pod(&mut c.rt, &early, None).await;

    let model = Arc::new(RwLock::new(NodeModel::new(common::pods::mem_total())));
    let plugin = Arc::new(NriObserver::new(Observer::new(model.clone())));
    let reg = Registration {
        socket: ctrd.dir.join("nri/nri.sock"),
        name: "criguard-test".into(),
        index: "10".into(),
    };
    let (up_tx, mut up) = mpsc::unbounded_channel();
    let (stop_tx, stop) = oneshot::channel::<()>();
    let attached = tokio::spawn(stay_attached(
        reg,
        plugin,
        None,
        move |on| {
            let _ = up_tx.send(on);
        },
        async move {
            let _ = stop.await;
        },
    ));
    let t = Duration::from_secs(20);
    let when = |on| async move { on };
    assert!(tokio::time::timeout(t, up.recv()).await.unwrap().unwrap());
    let knows = |sb: String| {
        let model = model.clone();
        move || {
            let found = model.read_locked().pod(&sb).is_some();
            when(found.then_some(()))
        }
    };
    common::poll_until(t, "the early pod in the model", knows(early_sb.clone())).await;

    // containerd crashes and comes back: criguard attaches again and is
    // synchronised; the model still holds the pod.
    ctrd.kill_daemon();
    assert!(
        !tokio::time::timeout(t, up.recv()).await.unwrap().unwrap(),
        "loss seen"
    );
    ctrd.restart_daemon();
    assert!(
        tokio::time::timeout(t, up.recv()).await.unwrap().unwrap(),
        "attached again"
    );
    assert!(model.read_locked().pod(&early_sb).is_some(), "no pod lost");

    // And it is obeyed again: a pod created now is scored by criguard.
    let mut c = ctrd.direct();
    let late = PodSpec::new("late", &unique("nri")).container(sleeper("app"));
    let (late_sb, ids) = run_pod(&mut c.rt, &late, Some(500)).await;
    assert_eq!(proc_oom_score_adj(&mut c, Some(&ids[0]), None).await, 1000);
    common::poll_until(t, "the late pod in the model", knows(late_sb.clone())).await;

    let _ = stop_tx.send(());
    attached.await.unwrap();
    remove_pods(&mut c.rt, [early_sb, late_sb]).await;
}

#[tokio::test]
async fn criguard_serve_in_nri_mode_scores_pods_the_kubelet_creates_on_containerd_directly() {
    let Some(ctrd) = with_nri() else {
        return;
    };
    let nri_socket = ctrd.dir.join("nri/nri.sock");
    let work = tempfile::tempdir().unwrap();

    // No runtime on the socket: one line naming it and the setting, and a
    // failure exit, before anything is served.
    let missing = work.path().join("missing/nri.sock");
    let out = std::process::Command::new(common::criguard_bin())
        .args(["serve", "--mode", "nri", "--metrics-address", "none"])
        .arg("--nri-socket")
        .arg(&missing)
        .arg("--listen")
        .arg(work.path().join("m.sock"))
        .arg("--admin-socket")
        .arg(work.path().join("m.admin.sock"))
        .arg("--state-dir")
        .arg(work.path().join("m.state"))
        .arg("--runtime-endpoint")
        .arg(format!("unix://{}", ctrd.socket.display()))
        .env("CRIGUARD_LOG", "off")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr.lines().last().unwrap_or_default();
    assert!(line.contains(&missing.display().to_string()), "{stderr}");
    assert!(line.contains("disable = false"), "{stderr}");

    // Attached: the kubelet's calls go to containerd, and criguard still
    // scores the containers and knows the pods.
    let listen = work.path().join("g.sock");
    let nri = [
        "--mode",
        "nri",
        "--nri-socket",
        nri_socket.to_str().unwrap(),
    ];
    let guard = common::containerd::CriguardProcess::start(&listen, &ctrd.socket, &nri).await;
    let log = ctrd.dir.join("containerd.log");
    common::poll_until(Duration::from_secs(20), "criguard registered", || {
        let done = common::containerd::nri_registrations(&ctrd.dir) > 0;
        async move { done.then_some(()) }
    })
    .await;
    let mut c = ctrd.direct();
    let pod = PodSpec::new("direct", &unique("nri")).container(sleeper("app"));
    let (sandbox, ids) = run_pod(&mut c.rt, &pod, Some(500)).await;
    // containerd's word on the plugin (a timed-out or closed plugin is
    // skipped, its container created unadjusted), for the failure message.
    let plugin_lines = || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| l.contains("criguard")).collect();
        lines.join("\n")
    };
    assert_eq!(
        proc_oom_score_adj(&mut c, Some(&ids[0]), None).await,
        1000,
        "containerd's log on the plugin:\n{}",
        plugin_lines()
    );
    let known = guard.pods().await;
    let p = known
        .iter()
        .find(|p| p.sandbox_id == sandbox)
        .expect("the pod in criguard's model");
    assert_eq!(p.containers[&ids[0]].oom_score_adj, 1000);
    remove_pods(&mut c.rt, [sandbox]).await;
}

#[tokio::test]
async fn a_criguard_killed_and_restarted_in_nri_mode_loses_no_pod_and_names_what_it_did_not_score()
{
    let Some(ctrd) = with_nri() else {
        return;
    };
    let nri_socket = ctrd.dir.join("nri/nri.sock");
    let work = tempfile::tempdir().unwrap();
    let listen = work.path().join("g.sock");
    let port = common::metrics::free_port();
    let metrics = format!("--metrics-address=127.0.0.1:{port}");
    let args = [
        "--mode=nri",
        &format!("--nri-socket={}", nri_socket.display()),
        &metrics,
        "--housekeeping-interval=1s",
        // Scores here come from the plugin alone, not the running round.
        "--dynamic-oom-score-adj=false",
    ];
    let t = Duration::from_secs(30);
    let start = || common::containerd::CriguardProcess::start(&listen, &ctrd.socket, &args);
    let guard = start().await;
    let admin = guard.admin.clone();
    let is_ready = || {
        let (ok, line) = common::containerd::status_ready(&admin);
        async move { ok.then_some(line) }
    };
    let line = common::poll_until(t, "criguard status --ready", is_ready).await;
    assert_eq!(line, "ready");

    let mut c = ctrd.direct();
    let before = PodSpec::new("before", &unique("nri")).container(sleeper("app"));
    let (before_sb, _) = run_pod(&mut c.rt, &before, Some(500)).await;

    // Killed: nothing adjusts a container created now.
    let _ = guard.signal_and_wait(libc::SIGKILL);
    let (ok, line) = common::containerd::status_ready(&admin);
    assert!(!ok, "a killed criguard is not ready: {line}");
    let during = PodSpec::new("during", &unique("nri")).container(sleeper("app"));
    let (during_sb, ids) = run_pod(&mut c.rt, &during, Some(500)).await;
    assert_eq!(proc_oom_score_adj(&mut c, Some(&ids[0]), None).await, 500);

    // Restarted: ready again once attached and reconciled, every pod in its
    // model, the container it missed counted, and its process raised to
    // criguard's score before criguard says it is ready.
    let guard = start().await;
    common::poll_until(t, "criguard ready after its restart", is_ready).await;
    let known = guard.pods().await;
    for sb in [&before_sb, &during_sb] {
        assert!(
            known.iter().any(|p| &p.sandbox_id == sb),
            "{sb} in the model"
        );
    }
    let unscored = common::metrics::scraped(port, "criguard_nri_unscored_containers_total", &[]);
    assert!(unscored >= Some(1.0), "counted: {unscored:?}");
    assert_eq!(proc_oom_score_adj(&mut c, Some(&ids[0]), None).await, 1000);
    let known = guard.pods().await;
    let during = known.iter().find(|p| p.sandbox_id == during_sb).unwrap();
    assert_eq!(
        during.containers[&ids[0]].oom_score_adj, 1000,
        "the model's score, the running round's baseline"
    );
    remove_pods(&mut c.rt, [before_sb, during_sb]).await;
}
