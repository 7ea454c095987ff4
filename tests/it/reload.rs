//! Failing open and reloading, against a private containerd and the real
//! `criguard serve` process:
//! - a configuration criguard cannot accept leaves it relaying every call
//!   unchanged (a kubelet-shaped CreateContainer is not patched), with
//!   `criguard_config_valid 0`, `criguard status` naming the key and the
//!   value, and the complaint repeated in the log;
//! - SIGHUP with the file fixed leaves fail-open mode: the guardian starts
//!   in the same process (thresholds in `criguard status`, the patch back);
//! - SIGHUP with a bad file is refused and counted, the running
//!   configuration stays, and a CRI connection opened before it still
//!   serves calls after it;
//! - a valid changed threshold takes effect without a restart.

use crate::common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::containerd::{PrivateContainerd, unique};
use common::pods::{CgroupRoot, proc_oom_score_adj, remove_pods, run_pod, sleeper};
use common::served::Served;
use criguard::signals::table::Condition;
use criguard_test_kit::kubelet::PodSpec;
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;

/// A bad value for a key criguard knows.
const BAD: &str = "evictionHard = { \"memory.available\" = \"lots\" }\n";
/// criguard's log level, and its fail-open complaint every 100 ms.
const LOG_ENV: &[(&str, &str)] = &[
    ("CRIGUARD_LOG", "info"),
    ("CRIGUARD_CONFIG_COMPLAINT_PERIOD", "100ms"),
];
/// A valid configuration no node here is near: memory only (no disk
/// threshold, so the host's disk never matters), image GC never.
const GOOD: &str =
    "evictionHard = { \"memory.available\" = \"1Mi\" }\nimageGCHighThresholdPercent = 100\n";

/// A BestEffort pod the kubelet's way, asking for `oom_score_adj` 500
/// (criguard's patch would make it the kubelet's 1000).
fn kubelet_pod(name: &str, root: &str, ctrd: &PrivateContainerd) -> PodSpec {
    let mut p = PodSpec::new(name, &unique(name)).container(sleeper("sleep"));
    p.cgroup_root = format!("{root}/kubepods");
    p.log_root = ctrd.dir.join("pods").to_str().unwrap().into();
    p
}

const ASKED: i64 = 500;
const KUBELET_BEST_EFFORT: i64 = 1000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_configuration_fails_open_and_a_fixed_one_reloaded_starts_the_guardian() {
    let root = format!("/{}", unique("criguard-reload"));
    let _cg = CgroupRoot(root.clone());
    let ctrd = PrivateContainerd::start();
    let mut served = Served::start(&ctrd, "reload", BAD, LOG_ENV).await;
    let mut through = served.clients();
    let mut direct = ctrd.direct();

    // Relaying: calls answered as containerd answers them.
    let version = through
        .rt
        .version(cri::VersionRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(!version.runtime_name.is_empty());

    // A kubelet-shaped CreateContainer is forwarded unchanged: the same
    // oom_score_adj as the same request made directly.
    let (s1, c1) = run_pod(
        &mut through.rt,
        &kubelet_pod("open", &root, &ctrd),
        Some(ASKED),
    )
    .await;
    let (s2, c2) = run_pod(
        &mut direct.rt,
        &kubelet_pod("direct", &root, &ctrd),
        Some(ASKED),
    )
    .await;
    let unpatched = proc_oom_score_adj(&mut direct, Some(&c1[0]), None).await;
    let direct_adj = proc_oom_score_adj(&mut direct, Some(&c2[0]), None).await;
    assert_eq!(
        (unpatched, direct_adj),
        (ASKED, ASKED),
        "failing open, criguard must not patch"
    );

    // Said loudly: the metric, the status (exit 2, key and value), the log.
    assert_eq!(served.metric("criguard_config_valid", &[]), Some(0.0));
    let (code, text) = served.cli(&["status"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("INVALID")
            && text.contains("evictionHard")
            && text.contains("memory.available=lots"),
        "{text}"
    );
    let complaints = common::poll_until(
        Duration::from_secs(20),
        "the complaint repeated in the log",
        || async {
            let n = served
                .log()
                .lines()
                .filter(|l| {
                    l.contains("invalid configuration")
                        && l.contains("evictionHard")
                        && l.contains("memory.available=lots")
                })
                .count();
            (n >= 3).then_some(n)
        },
    )
    .await;
    assert!(complaints >= 3);
    served.assert_running();

    // The file fixed and reloaded: the guardian starts in this process.
    served.write_config(GOOD);
    served.hangup();
    let s = served
        .status_until("the reload applied", |s| s.reloads_applied == 1)
        .await;
    assert!(s.valid(), "{s:?}");
    let (code, text) = served.cli(&["status"]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("configuration: valid")
            && text.contains("evictionHard: memory.available<1Mi"),
        "{text}"
    );
    assert_eq!(served.metric("criguard_config_valid", &[]), Some(1.0));
    assert_eq!(
        served.metric("criguard_config_reloads_total", &[("outcome", "applied")]),
        Some(1.0)
    );
    // The eviction manager runs: it has observed the node.
    common::poll_until(Duration::from_secs(20), "an eviction round", || async {
        let c = criguard::admin::get_conditions(&served.admin).await.ok()?;
        c.observed_at_unix_ms.map(|_| ())
    })
    .await;
    // And the proxy patches again: the same request gets the kubelet's score.
    let (s3, c3) = run_pod(
        &mut through.rt,
        &kubelet_pod("guarded", &root, &ctrd),
        Some(ASKED),
    )
    .await;
    let patched = proc_oom_score_adj(&mut direct, Some(&c3[0]), None).await;
    assert_eq!(patched, KUBELET_BEST_EFFORT);
    served.assert_running();
    remove_pods(&mut direct.rt, [s1, s2, s3]).await;
}

/// CRI clients over exactly one connection to `socket`: a call after that
/// connection has closed fails instead of dialling again.
async fn one_connection(socket: &Path) -> RuntimeServiceClient<tonic::transport::Channel> {
    let stream = tokio::net::UnixStream::connect(socket).await.unwrap();
    let stream = Arc::new(Mutex::new(Some(stream)));
    let channel = tonic::transport::Endpoint::from_static("http://criguard.test")
        .connect_with_connector(tower::service_fn(move |_| {
            let taken = stream.lock().unwrap().take();
            async move {
                taken
                    .map(hyper_util::rt::TokioIo::new)
                    .ok_or_else(|| std::io::Error::other("this client dials only once"))
            }
        }))
        .await
        .unwrap();
    RuntimeServiceClient::new(channel)
}

/// criguard guarding with [`GOOD`], its status then, and one connection
/// that has made a call; its file then replaced by [`BAD`].
async fn guarding_with_a_bad_file(
    ctrd: &PrivateContainerd,
    name: &str,
) -> (
    Served,
    criguard::admin::ConfigStatus,
    RuntimeServiceClient<tonic::transport::Channel>,
) {
    let served = Served::start(ctrd, name, GOOD, LOG_ENV).await;
    let before = served
        .status_until("the guardian running", |s| s.valid())
        .await;
    let mut rt = one_connection(&served.socket).await;
    rt.version(cri::VersionRequest::default()).await.unwrap();
    served.write_config(BAD);
    (served, before, rt)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_reload_is_refused_and_an_open_connection_keeps_serving() {
    let ctrd = PrivateContainerd::start();
    let (mut served, before, mut rt) = guarding_with_a_bad_file(&ctrd, "reload").await;
    served.hangup();
    let s = served
        .status_until("the reload refused", |s| s.reloads_refused == 1)
        .await;
    // The running configuration stays; the refusal is named and counted.
    assert!(s.valid(), "{s:?}");
    assert_eq!(s.settings, before.settings);
    let e = s.last_reload_error.clone().expect("the refusal's reason");
    assert_eq!(
        (e.key.as_str(), e.value.as_str()),
        ("evictionHard", "memory.available=lots")
    );
    assert_eq!(s.reloads_applied, 0);
    assert_eq!(
        served.metric("criguard_config_reloads_total", &[("outcome", "refused")]),
        Some(1.0)
    );
    assert_eq!(served.metric("criguard_config_valid", &[]), Some(1.0));
    let (code, text) = served.cli(&["status"]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("last reload refused") && text.contains("memory.available=lots"),
        "{text}"
    );
    assert!(
        served
            .log()
            .lines()
            .any(|l| l.contains("refused") && l.contains("memory.available=lots")),
        "{}",
        served.log()
    );
    // The connection opened before the reload serves calls after it.
    rt.version(cri::VersionRequest::default()).await.unwrap();
    rt.list_pod_sandbox(cri::ListPodSandboxRequest::default())
        .await
        .unwrap();
    served.assert_running();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_to_a_process_that_cannot_load_the_configuration_changes_nothing() {
    let ctrd = PrivateContainerd::start();
    let (mut served, before, mut rt) = guarding_with_a_bad_file(&ctrd, "handoff-bad").await;
    served.hand_over();
    common::poll_until(
        std::time::Duration::from_secs(30),
        "the new process's refusal",
        || async {
            let log = served.log();
            log.contains("handoff: the new process refused to take over")
                .then_some(())
        },
    )
    .await;
    let log = served.log();
    assert!(
        log.lines()
            .any(|l| l.contains("handoff: not taking over") && l.contains("memory.available=lots")),
        "the successor names the bad value: {log}"
    );
    assert!(!log.contains("handoff: the new process accepts"), "{log}");
    // The running criguard carries on as it was: guarding with its
    // settings, on its open connections and on new ones.
    served.assert_running();
    let s = served.status_until("still guarding", |s| s.valid()).await;
    assert_eq!(s.settings, before.settings);
    rt.list_pod_sandbox(cri::ListPodSandboxRequest::default())
        .await
        .unwrap();
    one_connection(&served.socket)
        .await
        .version(cri::VersionRequest::default())
        .await
        .unwrap();
    assert_eq!(served.metric("criguard_config_valid", &[]), Some(1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_threshold_takes_effect_at_the_reload_without_a_restart() {
    let ctrd = PrivateContainerd::start();
    let mut served = Served::start(&ctrd, "reload", GOOD, LOG_ENV).await;
    let pid = served.child.id();
    // Below 1Mi available: no pressure on this machine.
    let conditions = common::poll_until(Duration::from_secs(20), "a first round", || async {
        let c = criguard::admin::get_conditions(&served.admin).await.ok()?;
        c.observed_at_unix_ms.map(|_| c)
    })
    .await;
    assert!(
        !conditions.conditions.contains(&Condition::MemoryPressure),
        "{conditions:?}"
    );

    // A threshold every machine is under: memory pressure at the reload,
    // not at the next housekeeping tick (10 s) nor after a restart.
    let mut rt = one_connection(&served.socket).await;
    served.write_config(
        "evictionHard = { \"memory.available\" = \"1Ei\" }\nimageGCHighThresholdPercent = 100\nhousekeepingInterval = \"1h\"\n",
    );
    served.hangup();
    let s = served
        .status_until("the reload applied", |s| s.reloads_applied == 1)
        .await;
    assert!(
        s.settings.contains("evictionHard: memory.available<1Ei"),
        "{}",
        s.settings
    );
    assert!(s.needs_restart.is_empty(), "{:?}", s.needs_restart);
    common::poll_until(
        Duration::from_secs(20),
        "MemoryPressure from the new threshold",
        || async {
            let c = criguard::admin::get_conditions(&served.admin).await.ok()?;
            c.conditions
                .contains(&Condition::MemoryPressure)
                .then_some(())
        },
    )
    .await;
    assert_eq!(served.child.id(), pid);
    served.assert_running();
    // Admission follows the new threshold through the same connection:
    // a BestEffort pod is refused under memory pressure.
    let pod = PodSpec::new("refused", &unique("refused"));
    let err = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(pod.sandbox_config()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap_err();
    assert!(err.message().contains("MemoryPressure"), "{err:?}");
}

/// The node's condition of `ty` in the API, if any.
async fn node_condition(t: &common::kubeapi::Tenant, ty: &str) -> Option<serde_json::Value> {
    let n = t.admin.get(&format!("/api/v1/nodes/{}", t.node)).await?;
    n["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == ty)
        .cloned()
}

/// Against a real kube-apiserver (`common::kubeapi`; skipped without one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_open_sets_the_node_condition_and_a_valid_reload_removes_it() {
    const TYPE: &str = "CriguardConfigInvalid";
    if let Err(why) = common::kubeapi::available() {
        eprintln!("SKIPPED: {why}");
        return;
    }
    let plane = common::kubeapi::shared();
    let ctrd = PrivateContainerd::start();
    let t = plane
        .tenant(
            "reload",
            serde_json::json!({
                "apiVersion": "v1", "kind": "Node", "metadata": {"name": "set-by-the-tenant"},
                "status": {"conditions": [
                    {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ready"}]},
            }),
            &ctrd.dir,
        )
        .await;
    let kubeconfig = t.kubeconfig.clone();
    let api_keys = format!(
        "kubeconfig = \"{}\"\nnodeName = \"{}\"\nnodeTaints = false\n",
        kubeconfig.display(),
        t.node
    );
    let served = Served::start(&ctrd, "reload", &format!("{api_keys}{BAD}"), LOG_ENV).await;
    let c = common::poll_until(Duration::from_secs(20), "the condition set", || async {
        node_condition(&t, TYPE).await
    })
    .await;
    assert_eq!(c["status"], "True", "{c}");
    assert_eq!(c["reason"], "InvalidConfiguration", "{c}");
    let message = c["message"].as_str().unwrap();
    assert!(
        message.contains("evictionHard") && message.contains("memory.available=lots"),
        "{message}"
    );
    // Re-asserted with each complaint, keeping when it was first set.
    let first = c["lastTransitionTime"].clone();
    common::poll_until(
        Duration::from_secs(20),
        "the condition re-asserted",
        || async {
            let c = node_condition(&t, TYPE).await?;
            (c["lastHeartbeatTime"] != first).then_some(())
        },
    )
    .await;
    assert_eq!(
        node_condition(&t, TYPE).await.unwrap()["lastTransitionTime"],
        first
    );
    assert!(
        node_condition(&t, "Ready").await.is_some(),
        "other conditions stay"
    );

    served.write_config(&format!("{api_keys}{GOOD}"));
    served.hangup();
    served
        .status_until("the reload applied", |s| s.reloads_applied == 1)
        .await;
    common::poll_until(Duration::from_secs(20), "the condition removed", || async {
        node_condition(&t, TYPE).await.is_none().then_some(())
    })
    .await;
    assert!(
        node_condition(&t, "Ready").await.is_some(),
        "other conditions stay"
    );
}
