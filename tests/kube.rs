//! The Kubernetes API report, end to end: real memory pressure on a private
//! containerd, criguard with a kubeconfig pointing at the stand-in API
//! server (`common::apiserver`, which keeps the real API's semantics).
//!
//! The report must match what the kubelet writes for a node-pressure
//! eviction, in the kubelet's order: the pod's status before its container
//! is stopped, then the event; criguard's node condition and taint while the
//! pressure lasts; criguard's status written again when the kubelet writes
//! Running back or blanks reason and message, and the pod deleted only when
//! that keeps being undone. A criguard SIGKILLed and restarted carries on:
//! the condition and taint stay for the transition period from the last
//! pressure, the watch on the evicted pod resumes, the eviction is still
//! listed. Every request carries criguard's User-Agent. And an API that is
//! slow, refuses, or cannot be reached never delays an eviction past the
//! bound.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::apiserver::{ApiServer, json_patch, strategic_merge, write_kubeconfig};
use common::metrics::{free_port, parse, scrape, value};
use common::pressure::Pressure;
use criguard::kubelet::PodSpec;
use k8s_cri::v1 as cri;
use serde_json::{Value, json};

const NODE: &str = "criguard-test-node";

fn api_pod(p: &PodSpec) -> Value {
    let cond = |t: &str| json!({"type": t, "status": "True", "lastTransitionTime": "2024-01-01T00:00:00Z"});
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": p.name, "namespace": p.namespace, "uid": p.uid},
        "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": common::pods::BUSYBOX}]},
        "status": {"phase": "Running", "conditions": [
            cond("Initialized"), cond("Ready"), cond("ContainersReady"), cond("PodScheduled")]},
    })
}

fn api_node() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
        "spec": {"taints": [{"key": "example.com/dedicated", "value": "batch", "effect": "NoSchedule"}]},
        "status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"},
            {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory", "message": "kubelet has sufficient memory available"}]},
    })
}

fn condition_types(obj: &Value) -> Vec<String> {
    obj["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c["type"].as_str().unwrap().to_owned())
        .collect()
}

fn taint_keys(node: &Value) -> Vec<String> {
    node["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| t["key"].as_str().unwrap().to_owned())
        .collect()
}

/// Every request criguard made carried its own User-Agent.
fn assert_user_agent(api: &ApiServer) {
    let want = criguard::kube::user_agent();
    assert!(want.starts_with("criguard/v0.1.0 (linux/"), "{want}");
    let requests = api.requests();
    assert!(!requests.is_empty());
    for r in &requests {
        assert_eq!(r.user_agent, want, "{} {}", r.method, r.path);
    }
}

/// Polls until pod `name` shows criguard's status again: Failed, Evicted,
/// `message`.
async fn reasserted(api: &ApiServer, name: &str, message: &str, what: &str) -> Value {
    common::poll_until(Duration::from_secs(10), what, || async {
        api.get("pods", "default", name).filter(|p| {
            let s = &p["status"];
            s["phase"] == "Failed" && s["reason"] == "Evicted" && s["message"] == message
        })
    })
    .await
}

/// Whether a pod status patch for `name` arrived.
fn status_patches(api: &ApiServer, name: &str) -> Vec<common::apiserver::Request> {
    let path = format!("/api/v1/namespaces/default/pods/{name}/status");
    api.requests()
        .into_iter()
        .filter(|r| r.method == "PATCH" && r.path == path)
        .collect()
}

#[test]
fn the_stand_in_merges_conditions_by_type_and_replaces_taints() {
    let mut pod = json!({"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]}});
    let patch = json!({"status": {"phase": "Failed", "conditions": [
        {"type": "DisruptionTarget", "status": "True"}, {"type": "Ready", "status": "False"}],
        "$setElementOrder/conditions": [{"type": "Ready"}]}});
    strategic_merge(&mut pod, &patch, "");
    assert_eq!(pod["status"]["phase"], "Failed");
    assert_eq!(
        condition_types(&pod),
        ["Ready", "PodScheduled", "DisruptionTarget"]
    );
    assert_eq!(pod["status"]["conditions"][0]["status"], "False");
    let delete = json!({"status": {"conditions": [{"type": "Ready", "$patch": "delete"}]}});
    strategic_merge(&mut pod, &delete, "");
    assert_eq!(condition_types(&pod), ["PodScheduled", "DisruptionTarget"]);
    let ops = json!([{"op": "test", "path": "/status/phase", "value": "Failed"},
        {"op": "replace", "path": "/status/phase", "value": "Running"},
        {"op": "remove", "path": "/status/conditions/0"}]);
    json_patch(&mut pod, &ops).unwrap();
    assert_eq!(pod["status"]["phase"], "Running");
    assert_eq!(condition_types(&pod), ["DisruptionTarget"]);
    let stale = json!([{"op": "test", "path": "/status/phase", "value": "Failed"}]);
    assert!(json_patch(&mut pod, &stale).is_err());
    let mut node = json!({"spec": {"taints": [{"key": "a"}, {"key": "b"}]}});
    strategic_merge(&mut node, &json!({"spec": {"taints": [{"key": "c"}]}}), "");
    assert_eq!(node["spec"]["taints"], json!([{"key": "c"}]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_is_reported_like_the_kubelet_before_the_pod_stops_and_the_node_settles() {
    let api = ApiServer::start().await;
    api.put("nodes", "", api_node());
    let sc = Pressure::new(320);
    let state = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(state.path());
    let hog = sc.hog("hog", 60, 200);
    api.put("pods", "default", api_pod(&hog));
    let (port, args) = report_args(&kubeconfig, "10s");
    let guard = sc.criguard(state.path(), &as_strs(&args)).await;
    let (_, container) = sc.run(&guard, &hog).await;

    // When the status patch arrives, is the container still running?
    let running_at_patch = Arc::new(Mutex::new(Vec::new()));
    let (seen, socket, id) = (
        running_at_patch.clone(),
        sc.ctrd.socket.clone(),
        container.clone(),
    );
    api.on_pod_status_patch(Arc::new(move |_| {
        let (seen, socket, id) = (seen.clone(), socket.clone(), id.clone());
        Box::pin(async move {
            let mut rt = common::containerd::Clients::new(&socket).rt;
            let req = cri::ContainerStatusRequest {
                container_id: id,
                verbose: false,
            };
            let s = rt
                .container_status(req)
                .await
                .unwrap()
                .into_inner()
                .status
                .unwrap();
            seen.lock()
                .unwrap()
                .push(s.state == cri::ContainerState::ContainerRunning as i32);
        })
    }));
    // The first taint patch meets a concurrent writer: 409, read again, retry.
    api.interfere_with_next_node_patch();
    sc.grow(&container).await;
    let e = guard
        .first_evictions(Duration::from_secs(60), "the eviction")
        .await
        .remove(0);
    assert_eq!(e.uid, hog.uid);
    let exited = sc.exited_at_ms(&container).await;
    eprintln!(
        "eviction decided -> container exited, API answering: {} ms",
        exited.saturating_sub(e.at_unix_ms)
    );

    // 1. The status, before the stop, exactly the kubelet's.
    let pod = common::poll_until(Duration::from_secs(10), "the Failed phase", || async {
        api.get("pods", "default", "hog")
            .filter(|p| p["status"]["phase"] == "Failed")
    })
    .await;
    assert_eq!(
        *running_at_patch.lock().unwrap(),
        [true],
        "status written while the container still ran"
    );
    let patch = &status_patches(&api, "hog")[0];
    assert_eq!(patch.content_type, "application/strategic-merge-patch+json");
    assert_eq!(
        patch.body["metadata"]["uid"],
        hog.uid.as_str(),
        "UID precondition"
    );
    let patch_ms = patch
        .at
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(
        patch_ms <= exited,
        "status patch at {patch_ms}, container exited at {exited}"
    );
    let s = &pod["status"];
    assert_eq!(
        (s["phase"].as_str(), s["reason"].as_str()),
        (Some("Failed"), Some("Evicted"))
    );
    assert_eq!(s["message"], e.message.as_str());
    assert!(
        e.message.starts_with(
            "The node was low on resource: memory. Threshold quantity: 64Mi, available: "
        ),
        "{}",
        e.message
    );
    assert_eq!(
        condition_types(&pod),
        [
            "Initialized",
            "Ready",
            "ContainersReady",
            "PodScheduled",
            "DisruptionTarget"
        ],
        "merged by type, not replaced"
    );
    let dt = &s["conditions"][4];
    assert_eq!(
        (dt["status"].as_str(), dt["reason"].as_str()),
        (Some("True"), Some("TerminationByKubelet"))
    );
    assert_eq!(dt["message"], e.message.as_str());
    assert!(dt["lastTransitionTime"].as_str().unwrap().ends_with('Z'));

    // 2. The event.
    let ev = common::poll_until(Duration::from_secs(10), "the Evicted event", || async {
        api.list("events", "default")
            .into_iter()
            .find(|e| e["reason"] == "Evicted")
    })
    .await;
    assert_eq!(ev["type"], "Warning");
    assert_eq!(ev["message"], e.message.as_str());
    assert_eq!(ev["involvedObject"]["uid"], hog.uid.as_str());
    assert_eq!(ev["involvedObject"]["kind"], "Pod");
    assert_eq!(ev["source"], json!({"component": "criguard", "host": NODE}));
    assert_eq!(ev["metadata"]["annotations"]["starved_resource"], "memory");
    assert_eq!(ev["metadata"]["annotations"]["offending_containers"], "app");
    let event_at = api
        .requests()
        .into_iter()
        .find(|r| r.method == "POST")
        .unwrap()
        .at;
    assert!(event_at >= patch.at, "event after the status");

    // Node: criguard's condition and taint while the pressure lasts, the
    // kubelet's condition and the other taint untouched.
    let node = common::poll_until(Duration::from_secs(15), "criguard's taint", || async {
        api.get("nodes", "", NODE)
            .filter(|n| taint_keys(n).contains(&"criguard.io/memory-pressure".to_owned()))
    })
    .await;
    assert_eq!(
        condition_types(&node),
        ["Ready", "MemoryPressure", "CriguardMemoryPressure"]
    );
    assert_eq!(
        node["status"]["conditions"][2]["reason"],
        "CriguardHasInsufficientMemory"
    );
    assert_eq!(
        taint_keys(&node),
        ["example.com/dedicated", "criguard.io/memory-pressure"]
    );
    assert_eq!(
        node["metadata"]["annotations"]["example.com/touched"], "yes",
        "the other writer's change kept"
    );
    let node_patches: Vec<u16> = api
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path == format!("/api/v1/nodes/{NODE}"))
        .map(|r| r.status)
        .collect();
    assert_eq!(node_patches, [409, 200], "conflict, read again, retried");
    // The taint is in place before the pod reads Failed (even through the
    // conflict above): the replacement its ReplicaSet makes on seeing
    // Failed must find the node tainted.
    let taint_at = api
        .requests()
        .into_iter()
        .find(|r| {
            r.method == "PATCH" && r.path == format!("/api/v1/nodes/{NODE}") && r.status == 200
        })
        .unwrap()
        .at;
    assert!(
        taint_at <= patch.at,
        "taint written {:?} after the pod's Failed status",
        taint_at.duration_since(patch.at).unwrap_or_default()
    );

    // 3. The kubelet's status manager writes its cached Running back:
    // criguard writes its status again (the pod stays, as with the kubelet
    // alone); then the kubelet's own first Failed blanks reason and
    // message: written again too.
    assert_eq!(
        api.patch_pod_status("default", "hog", json!({"status": {"phase": "Running"}})),
        200
    );
    let pod = reasserted(&api, "hog", &e.message, "criguard's status after Running").await;
    assert_eq!(condition_types(&pod).last().unwrap(), "DisruptionTarget");
    assert_eq!(
        api.patch_pod_status(
            "default",
            "hog",
            json!({"status": {"phase": "Failed", "reason": null, "message": null}})
        ),
        200
    );
    reasserted(
        &api,
        "hog",
        &e.message,
        "criguard's status after a blank reason",
    )
    .await;
    let patches = status_patches(&api, "hog");
    assert_eq!(patches.len(), 3, "the first write and two again");
    assert!(
        patches
            .iter()
            .all(|p| p.body["metadata"]["uid"] == hog.uid.as_str()),
        "each with the UID precondition"
    );
    assert_eq!(
        patches[2].body["status"]["conditions"][0]["lastTransitionTime"],
        patches[0].body["status"]["conditions"][0]["lastTransitionTime"],
        "the condition's transition time is the eviction's"
    );
    assert!(api.requests().iter().all(|r| r.method != "DELETE"));

    // Pressure over: the condition and the taint go, everything else stays.
    common::poll_until(
        Duration::from_secs(30),
        "criguard's taint removed",
        || async {
            api.get("nodes", "", NODE)
                .filter(|n| taint_keys(n) == ["example.com/dedicated"])
        },
    )
    .await;
    let node = common::poll_until(
        Duration::from_secs(10),
        "criguard's condition removed",
        || async {
            api.get("nodes", "", NODE)
                .filter(|n| condition_types(n) == ["Ready", "MemoryPressure"])
        },
    )
    .await;
    assert_eq!(node["status"]["conditions"][0]["reason"], "KubeletReady");

    let m = parse(&scrape(port));
    let pods = |o| value(&m, "criguard_kube_evicted_pods_total", &[("outcome", o)]);
    assert_eq!(
        (
            pods("written"),
            pods("reverted"),
            pods("reasserted"),
            pods("deleted")
        ),
        (Some(1.0), Some(2.0), Some(2.0), None)
    );
    let writes = |w, o| {
        value(
            &m,
            "criguard_kube_writes_total",
            &[("write", w), ("outcome", o)],
        )
    };
    assert_eq!(writes("pod_status", "ok"), Some(3.0));
    assert_eq!(writes("event", "ok"), Some(1.0));
    assert_eq!(writes("node_taints", "failed"), Some(1.0));
    assert!(
        writes("node_taints", "ok") >= Some(2.0),
        "set, then removed"
    );
    assert_user_agent(&api);
    common::pods::remove_pods(
        &mut guard.clients().rt,
        guard.pods().await.into_iter().map(|p| p.sandbox_id),
    )
    .await;
}

/// How long after criguard decided the eviction the pod's container exited.
async fn stop_latency(
    sc: &Pressure,
    guard: &common::containerd::CriguardProcess,
    uid: &str,
    container: &str,
) -> u64 {
    let e = common::poll_until(Duration::from_secs(60), "the eviction", || async {
        guard.evictions().await.into_iter().find(|e| e.uid == uid)
    })
    .await;
    sc.exited_at_ms(container)
        .await
        .saturating_sub(e.at_unix_ms)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_refusing_or_unreachable_api_delays_no_eviction_past_the_bound() {
    let api = ApiServer::start().await;
    api.put("nodes", "", api_node());
    let sc = Pressure::new(320);
    let state = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(state.path());
    // Each grows into pressure in turn; the last grows alone, so more.
    let hogs: Vec<PodSpec> = [("slow", 200), ("refusing", 200), ("unreachable", 250)]
        .iter()
        .map(|(n, grow)| sc.hog(n, 30, *grow))
        .collect();
    for h in &hogs {
        api.put("pods", "default", api_pod(h));
    }
    let port = free_port();
    let metrics = format!("--metrics-address=127.0.0.1:{port}");
    let node = format!("--node-name={NODE}");
    let base = [
        "--eviction-hard=allocatableMemory.available<64Mi",
        "--eviction-pressure-transition-period=2s",
        &node,
    ];
    let kc = format!("--kubeconfig={}", kubeconfig.display());
    let mut args = base.to_vec();
    args.extend([kc.as_str(), metrics.as_str()]);
    let guard = sc.criguard(state.path(), &args).await;
    let mut containers = Vec::new();
    for h in &hogs {
        containers.push(sc.run(&guard, h).await.1);
    }

    // Slow: every answer takes 3 s. The pod is stopped after the 250 ms
    // bound, long before the status answer; the status still lands.
    api.set_delay(Duration::from_secs(3));
    sc.grow(&containers[0]).await;
    let slow = stop_latency(&sc, &guard, &hogs[0].uid, &containers[0]).await;
    let first_patch =
        common::poll_until(Duration::from_secs(10), "the slow status patch", || async {
            status_patches(&api, "slow").first().cloned()
        })
        .await;
    let exited = sc.exited_at_ms(&containers[0]).await;
    let answered_ms = first_patch
        .at
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(
        exited < answered_ms,
        "the container exited ({exited}) before the API answered ({answered_ms})"
    );
    common::poll_until(
        Duration::from_secs(20),
        "the slow status to land",
        || async {
            api.get("pods", "default", "slow")
                .filter(|p| p["status"]["reason"] == "Evicted")
        },
    )
    .await;
    api.set_delay(Duration::ZERO);
    // Its controller's garbage collection deletes it: it stayed Failed.
    assert_eq!(api.delete_now("pods", "default", "slow"), 200);
    common::poll_until(
        Duration::from_secs(10),
        "the slow pod counted settled",
        || async {
            let m = parse(&scrape(port));
            (value(
                &m,
                "criguard_kube_evicted_pods_total",
                &[("outcome", "settled")],
            ) == Some(1.0))
            .then_some(())
        },
    )
    .await;

    // Refusing: the role lacks pods/status patch (403); retried in the background.
    api.deny("patch", "pods/status");
    sc.grow(&containers[1]).await;
    let refusing = stop_latency(&sc, &guard, &hogs[1].uid, &containers[1]).await;
    common::poll_until(
        Duration::from_secs(10),
        "a retried status patch",
        || async {
            let p = status_patches(&api, "refusing");
            (p.len() >= 2 && p.iter().all(|r| r.status == 403)).then_some(())
        },
    )
    .await;
    let m = parse(&scrape(port));
    assert!(
        value(
            &m,
            "criguard_kube_writes_total",
            &[("write", "pod_status"), ("outcome", "failed")]
        ) >= Some(2.0)
    );
    drop(guard);

    // Unreachable: nothing listens at the API's address.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let dir = tempfile::tempdir().unwrap();
    let kc = format!(
        "--kubeconfig={}",
        write_kubeconfig(dir.path(), &nowhere).display()
    );
    let mut args = base.to_vec();
    args.push(kc.as_str());
    let guard = sc.criguard(state.path(), &args).await;
    sc.grow(&containers[2]).await;
    let unreachable = stop_latency(&sc, &guard, &hogs[2].uid, &containers[2]).await;

    eprintln!(
        "eviction decided -> container exited, bound 250 ms: slow API (3 s answers) {slow} ms, refusing API (403) {refusing} ms, unreachable API {unreachable} ms"
    );
    for (what, ms) in [
        ("slow", slow),
        ("refusing", refusing),
        ("unreachable", unreachable),
    ] {
        assert!(
            ms < 3000,
            "{what}: {ms} ms: the eviction waited for the API"
        );
    }
    common::pods::remove_pods(
        &mut guard.clients().rt,
        guard.pods().await.into_iter().map(|p| p.sandbox_id),
    )
    .await;
}

/// Now, ms since the epoch.
/// criguard's flags for a report test: the memory threshold, the pressure
/// transition period `transition`, metrics on a free port (returned) and
/// the API report to the stand-in through `kubeconfig`.
fn report_args(kubeconfig: &std::path::Path, transition: &str) -> (u16, Vec<String>) {
    let port = free_port();
    let args = vec![
        "--eviction-hard=allocatableMemory.available<64Mi".to_owned(),
        format!("--eviction-pressure-transition-period={transition}"),
        format!("--metrics-address=127.0.0.1:{port}"),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--node-name={NODE}"),
    ];
    (port, args)
}

fn as_strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_undone_past_the_bound_gets_the_pod_deleted_as_the_last_resort() {
    use criguard::kube::reassert::MAX_REASSERTS;
    let api = ApiServer::start().await;
    api.put("nodes", "", api_node());
    let sc = Pressure::new(320);
    let state = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(state.path());
    let hog = sc.hog("stubborn", 60, 200);
    api.put("pods", "default", api_pod(&hog));
    // Something writes Running back 200 ms after each of criguard's status
    // writes, however often criguard writes.
    api.keep_undoing(
        "default",
        "stubborn",
        json!({"status": {"phase": "Running"}}),
        Duration::from_millis(200),
    );
    let (port, args) = report_args(&kubeconfig, "2s");
    let guard = sc.criguard(state.path(), &as_strs(&args)).await;
    let (_, container) = sc.run(&guard, &hog).await;
    sc.grow(&container).await;
    let e = guard
        .first_evictions(Duration::from_secs(60), "the eviction")
        .await
        .remove(0);
    assert_eq!(e.uid, hog.uid);
    common::poll_until(
        Duration::from_secs(60),
        "the pod deleted as the last resort",
        || async {
            api.get("pods", "default", "stubborn")
                .is_none()
                .then_some(())
        },
    )
    .await;
    let patches = status_patches(&api, "stubborn");
    assert_eq!(
        patches.len() as u32,
        1 + MAX_REASSERTS,
        "the first write and every write again"
    );
    let delete = api
        .requests()
        .into_iter()
        .find(|r| r.method == "DELETE")
        .unwrap();
    assert_eq!(delete.path, "/api/v1/namespaces/default/pods/stubborn");
    assert_eq!(delete.body["gracePeriodSeconds"], 0);
    assert_eq!(delete.body["preconditions"]["uid"], hog.uid.as_str());
    let took = delete.at.duration_since(patches[0].at).unwrap();
    eprintln!(
        "status undone after each write: {} writes again, then deleted {took:?} after the first write",
        MAX_REASSERTS
    );
    assert!(took < Duration::from_secs(40), "{took:?}");
    let m = parse(&scrape(port));
    let pods = |o| value(&m, "criguard_kube_evicted_pods_total", &[("outcome", o)]);
    let max = f64::from(MAX_REASSERTS);
    assert_eq!(
        (
            pods("written"),
            pods("reverted"),
            pods("reasserted"),
            pods("deleted"),
            pods("settled")
        ),
        (Some(1.0), Some(max + 1.0), Some(max), Some(1.0), None)
    );
    assert_user_agent(&api);
    common::pods::remove_pods(
        &mut guard.clients().rt,
        guard.pods().await.into_iter().map(|p| p.sandbox_id),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_criguard_keeps_the_pressure_the_watch_and_the_evictions() {
    const PERIOD_S: u64 = 20;
    let api = ApiServer::start().await;
    api.put("nodes", "", api_node());
    let sc = Pressure::new(320);
    let state = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(state.path());
    let hog = sc.hog("kept", 60, 200);
    api.put("pods", "default", api_pod(&hog));
    let kc = format!("--kubeconfig={}", kubeconfig.display());
    let node = format!("--node-name={NODE}");
    let period = format!("--eviction-pressure-transition-period={PERIOD_S}s");
    let start = || async {
        let args = [
            "--eviction-hard=allocatableMemory.available<64Mi",
            period.as_str(),
            kc.as_str(),
            node.as_str(),
        ];
        sc.criguard(state.path(), &args).await
    };
    let has_taint = |n: &Value| taint_keys(n).contains(&"criguard.io/memory-pressure".to_owned());
    let guard = start().await;
    let (_, container) = sc.run(&guard, &hog).await;
    sc.grow(&container).await;
    let e = guard
        .first_evictions(Duration::from_secs(60), "the eviction")
        .await
        .remove(0);
    assert_eq!(e.uid, hog.uid);
    common::poll_until(Duration::from_secs(15), "criguard's taint", || async {
        api.get("nodes", "", NODE).filter(has_taint)
    })
    .await;
    reasserted(&api, "kept", &e.message, "criguard's status").await;

    // SIGKILL within the transition period, restarted at once.
    let killed = now_ms();
    guard.signal_and_wait(libc::SIGKILL);
    let guard = start().await;
    let listed = guard.evictions().await;
    assert_eq!(listed.len(), 1, "{listed:#?}");
    assert_eq!(
        (listed[0].uid.as_str(), listed[0].at_unix_ms),
        (hog.uid.as_str(), e.at_unix_ms),
        "the same eviction, still listed"
    );
    // The watch on the evicted pod resumed: the kubelet's status manager
    // writes Running back and the new criguard writes its status again.
    assert_eq!(
        api.patch_pod_status("default", "kept", json!({"status": {"phase": "Running"}})),
        200
    );
    reasserted(
        &api,
        "kept",
        &e.message,
        "criguard's status after the restart",
    )
    .await;

    // A second SIGKILL and restart, well inside the period.
    tokio::time::sleep_until(
        (std::time::Instant::now()
            + Duration::from_millis((e.at_unix_ms + PERIOD_S * 1000 / 2).saturating_sub(now_ms())))
        .into(),
    )
    .await;
    let second_kill = now_ms();
    guard.signal_and_wait(libc::SIGKILL);
    let guard = start().await;
    assert_eq!(guard.evictions().await.len(), 1);

    // The condition and the taint stay until the period has passed since
    // the last pressure (the eviction ended it), then go.
    let gone_at = common::poll_until(
        Duration::from_secs(PERIOD_S + 20),
        "criguard's taint removed",
        || async {
            let n = api.get("nodes", "", NODE)?;
            (!has_taint(&n)).then(now_ms)
        },
    )
    .await;
    common::poll_until(
        Duration::from_secs(10),
        "criguard's condition removed",
        || async {
            api.get("nodes", "", NODE)
                .filter(|n| condition_types(n) == ["Ready", "MemoryPressure"])
        },
    )
    .await;
    let since = |t: u64| t as i64 - e.at_unix_ms as i64;
    eprintln!(
        "after the eviction: SIGKILLs at {} and {} ms, taint removed at {} ms (transition period {PERIOD_S} s)",
        since(killed),
        since(second_kill),
        since(gone_at)
    );
    let end = e.at_unix_ms + PERIOD_S * 1000;
    assert!(
        gone_at + 500 >= end,
        "taint removed {} ms before the period ended",
        end - gone_at
    );
    assert!(
        gone_at <= end + 8000,
        "taint removed {} ms after the period ended",
        gone_at - end
    );
    assert_user_agent(&api);
    common::pods::remove_pods(
        &mut guard.clients().rt,
        guard.pods().await.into_iter().map(|p| p.sandbox_id),
    )
    .await;
}
