//! The cluster tier on the host: a real Kubernetes (etcd, kube-apiserver
//! with Node,RBAC and NodeRestriction, controller-manager, scheduler) and a
//! node whose kubelet reaches containerd 2 through criguard, all started by
//! `hack/cluster.sh up` in a directory of this test's own and stopped by
//! `hack/cluster.sh down` whatever happens (`CRIGUARD_KEEP=1` leaves it up).
//!
//! What an operator would check, through kubectl, the audit log, criguard's
//! admin socket and metrics:
//! - adoption: the node is Ready through criguard, pods of every QoS class
//!   and a node-critical static pod run, and criguard's model, read from
//!   the API, agrees with it on each pod's QoS class, priority and exact
//!   memory request, and each container was created with the kubelet's
//!   `oom_score_adj` for it;
//! - one memory eviction end to end: a Deployment's BestEffort pod grows
//!   until criguard (not the kubelet, whose threshold is lower) evicts it;
//!   the API shows it Failed/Evicted with a DisruptionTarget condition and
//!   one Warning event, criguard's node condition and taint while the
//!   pressure lasts; the replacement waits, unschedulable, until the taint
//!   goes, then runs; the evicted pod never runs again; no kernel OOM kill;
//!   criguard's API requests are all allowed and carry its User-Agent;
//! - criguard SIGKILLed and restarted (`hack/cluster.sh restart-criguard`)
//!   right after the eviction, while the pressure's transition period holds:
//!   the node stays Ready, the condition and taint stay and go only once
//!   the transition period has passed since the last observed pressure,
//!   the restarted criguard still lists the eviction, and the checks above
//!   (the replacement kept off, the evicted pod never running) still hold;
//! - disk pressure on node-a's imagefs (its containerd root on a 320 MiB
//!   ext4, `CRIGUARD_CLUSTER_IMAGEFS_MIB`): three images pulled from the
//!   cluster's registry before node-a's criguard and kubelet start and
//!   never used, a neighbour pod of a fourth (pulled by the kubelet), and a
//!   Deployment's pod filling its writable layer; criguard crosses its
//!   `imagefs.available<128Mi` and first collects images (the unused ones
//!   go, logged and counted, the ones in use stay), then, that not being
//!   enough, evicts the hog (the largest disk user, not the BestEffort
//!   neighbour memory would take first): Failed/Evicted with
//!   DisruptionTarget, one Warning event, criguard's CriguardDiskPressure
//!   condition and `criguard.io/disk-pressure` taint while the pressure
//!   lasts; the kubelet, whose threshold (48Mi) is a backstop below
//!   criguard's, neither reclaims nor evicts nor sets DiskPressure; the
//!   space comes back, the evicted pod never runs again, and once the
//!   transition period is over the taint goes and the replacement runs;
//! - criguard restarted at each step of an eviction ([`restart_points`]).
//!
//! On failure the test prints every component's log and the cluster's
//! state. It needs root and the binaries of `hack/k8s/build.sh`.

use crate::common::cluster as cluster_support;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cluster_support::{
    BUSYBOX, CRIGUARD_USER, Cluster, assert_evicted, assert_one_memory_eviction,
    assert_pressure_marked, condition, criguard_patched, fresh_dir, hog_yaml, phase, pod_yaml,
    poll, poll_every, poll_evicted, tainted, uid,
};
use serde_json::Value;

pub(crate) mod restart_points;

/// Namespace of the test's pods.
const NS: &str = "criguard-test";
/// The pressure transition period, ms: `hack/cluster.sh`'s default
/// `CRIGUARD_CLUSTER_TRANSITION` (30s), which the test leaves as is.
const TRANSITION_MS: i64 = 30_000;
/// How much earlier than [`TRANSITION_MS`] after the eviction the taint and
/// condition may go: the eviction is recorded once the pod is stopped, a
/// little after the pressure observation the period counts from, and the
/// audit log's and criguard's clocks are read at different moments.
const SLACK_MS: i64 = 2_000;

/// `hack/cluster.sh up` with `env`, in `CRIGUARD_CLUSTER_DIR` if set (as
/// `hack/cluster.sh test DIR` does), else in a fresh directory.
fn cluster_up(env: &[(&str, &str)]) -> Cluster {
    let dir = match std::env::var("CRIGUARD_CLUSTER_DIR") {
        Ok(d) if !d.is_empty() => PathBuf::from(d),
        _ => fresh_dir("cgc"),
    };
    Cluster::up(dir, env, "cluster")
}

/// The host nodes of `hack/cluster.sh up`: each one's directory, and its
/// criguard's admin socket and metrics there.
trait HostNodes {
    /// `DIR/node-NAME`.
    fn node_dir(&self, node: &str) -> PathBuf;
    /// `criguard pods --json` of `node`'s criguard.
    fn model(&self, node: &str) -> Vec<criguard::model::Pod>;
    /// `criguard evictions --json` of `node`'s criguard.
    fn evictions(&self, node: &str) -> criguard::admin::EvictionsReport;
    /// `node`'s criguard metrics, as text.
    fn metrics(&self, node: &str) -> String;
    /// Resident memory of each process `up` started, KiB, by name.
    fn rss(&self) -> BTreeMap<String, u64>;
    /// `hack/cluster.sh restart-criguard DIR NODE`: `node`'s criguard
    /// SIGKILLed and started again with the same command line, its sockets
    /// answering; how long that took.
    fn restart_criguard(&self, node: &str) -> Duration;
}

impl HostNodes for Cluster {
    fn restart_criguard(&self, node: &str) -> Duration {
        let t0 = Instant::now();
        let status = Command::new(cluster_support::repo().join("hack/cluster.sh"))
            .arg("restart-criguard")
            .arg(&self.dir)
            .arg(node)
            .env("CRIGUARD_BIN", env!("CARGO_BIN_EXE_criguard"))
            .status()
            .expect("run hack/cluster.sh restart-criguard");
        assert!(
            status.success(),
            "hack/cluster.sh restart-criguard {node} failed: {status}"
        );
        t0.elapsed()
    }

    fn node_dir(&self, node: &str) -> PathBuf {
        self.dir.join(format!("node-{node}"))
    }

    fn model(&self, node: &str) -> Vec<criguard::model::Pod> {
        let out = criguard_cmd(
            &["pods", "--json", "--admin-socket"],
            &self.node_dir(node).join("admin.sock"),
        );
        serde_json::from_str(&out).unwrap()
    }

    fn evictions(&self, node: &str) -> criguard::admin::EvictionsReport {
        let out = criguard_cmd(
            &["evictions", "--json", "--admin-socket"],
            &self.node_dir(node).join("admin.sock"),
        );
        serde_json::from_str(&out).unwrap()
    }

    fn metrics(&self, node: &str) -> String {
        let addr = std::fs::read_to_string(self.node_dir(node).join("metrics-address")).unwrap();
        http_get(addr.trim(), "/metrics")
    }

    fn rss(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        let mut files: Vec<(String, PathBuf)> = std::fs::read_dir(self.dir.join("pids"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| {
                let name = e
                    .file_name()
                    .to_string_lossy()
                    .trim_end_matches(".pid")
                    .to_owned();
                (name, e.path())
            })
            .collect();
        for node in self.env["NODES"].split_whitespace() {
            let pid = self.node_dir(node).join("containerd/containerd.pid");
            files.push((format!("containerd-{node}"), pid));
        }
        for (name, path) in files {
            let pid = std::fs::read_to_string(path).unwrap_or_default();
            let status =
                std::fs::read_to_string(format!("/proc/{}/status", pid.trim())).unwrap_or_default();
            if let Some(kb) = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            {
                out.insert(name, kb);
            }
        }
        out
    }
}

fn criguard_cmd(args: &[&str], admin: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_criguard"))
        .args(args)
        .arg(admin)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "criguard {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A plain HTTP/1.0 GET on loopback; the body.
fn http_get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

/// Value of the metric sample whose name and labels are `series` exactly.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// A quantity such as `32Mi` or `134217728`, in bytes (the forms the test
/// itself writes).
fn bytes(q: &str) -> i64 {
    for (suffix, mult) in [("Ki", 1 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30)] {
        if let Some(n) = q.strip_suffix(suffix) {
            return n.parse::<i64>().unwrap() * mult;
        }
    }
    q.parse().unwrap()
}

/// Milliseconds since midnight (UTC) of a time in ms since the epoch.
fn ms_of_day(unix_ms: u64) -> i64 {
    (unix_ms % 86_400_000) as i64
}

/// `a - b` for two times of day in ms, taken as within 12 h of each other
/// (so a pair across midnight still gives the short way round).
fn day_diff(a: i64, b: i64) -> i64 {
    (a - b + 86_400_000 + 43_200_000).rem_euclid(86_400_000) - 43_200_000
}

/// Now, ms since the epoch.
fn unix_ms_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Milliseconds since midnight (UTC) of a klog line ("I1125 16:46:05.204186 …").
fn klog_ms_of_day(line: &str) -> Option<i64> {
    let time = line.split_whitespace().nth(1)?;
    let mut parts = time.split(':');
    let h: i64 = parts.next()?.parse().ok()?;
    let m: i64 = parts.next()?.parse().ok()?;
    let sec: f64 = parts.next()?.parse().ok()?;
    Some((h * 3600 + m * 60) * 1000 + (sec * 1000.0) as i64)
}

/// Milliseconds since midnight (UTC) of an audit timestamp
/// ("2026-11-25T16:51:51.791353Z").
fn audit_ms(ts: &str) -> Option<i64> {
    klog_ms_of_day(&format!(
        "x {}",
        ts.split_once('T')?.1.trim_end_matches('Z')
    ))
}

/// The UID the runtime knows the pod by: a static pod's own (its mirror
/// pod's `kubernetes.io/config.mirror` annotation), else the API's.
fn runtime_uid(p: &Value) -> &str {
    p["metadata"]["annotations"]["kubernetes.io/config.mirror"]
        .as_str()
        .unwrap_or_else(|| uid(p))
}

/// Sum of the containers' memory requests in the API pod, bytes.
fn api_memory_request(p: &Value) -> i64 {
    p["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            c["resources"]["requests"]["memory"]
                .as_str()
                .map(bytes)
                .unwrap_or(0)
        })
        .sum()
}

/// The memory hog on host node `node`: 10 MiB every 0.5 s, its marker in
/// the node's directory.
fn host_hog_yaml(c: &Cluster, node: &str) -> String {
    let state = c.node_dir(node).join("hog-state");
    hog_yaml(NS, node, &state.display().to_string(), "0.5")
}

/// The evicted pod `old` runs nothing: no ready sandbox of its UID in
/// `node`'s criguard, and no container start in the API after `started`
/// (the container's start before the eviction). The kubelet's status
/// manager may write its cached status back, "running" since `started`,
/// until it sees the Failed phase: stale, not a new start.
fn never_runs_again(c: &Cluster, node: &str, old: &Value, started: &Value) {
    let statuses = old["status"]["containerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for st in &statuses {
        let running = &st["state"]["running"];
        assert!(
            running.is_null() || running["startedAt"] == *started,
            "the evicted pod runs again: {old:#}"
        );
    }
    let m = c.model(node);
    assert!(
        !m.iter()
            .any(|p| p.uid == uid(old) && p.state == criguard::model::SandboxState::Ready),
        "criguard's model has the evicted pod's sandbox ready again"
    );
}

/// Adoption on `node`: the node Ready through criguard; a Guaranteed, a
/// Burstable and a BestEffort pod and a node-critical static pod run there;
/// criguard's model agrees with the API on each one's QoS class, priority
/// (criguard.io/priority), memory request, static and critical marks.
fn adopt(c: &Cluster, node: &str) {
    let n = c.json(&["get", "node", node]);
    let runtime = n["status"]["nodeInfo"]["containerRuntimeVersion"]
        .as_str()
        .unwrap();
    assert!(
        runtime.starts_with("containerd://2."),
        "runtime through criguard: {runtime}"
    );
    println!(
        "cluster: {node} Ready, kubelet {}, runtime {runtime}, allocatable memory {}",
        n["status"]["nodeInfo"]["kubeletVersion"], n["status"]["allocatable"]["memory"]
    );

    c.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n"
    ));
    c.apply(
        "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: criguard-test-high}\nvalue: 1000\n",
    );
    let on_node = |p: &Value| p["spec"]["nodeName"] == node;
    // criguard reads the priority from the API's pod (spec.priority), not
    // from this annotation, which it reads only without a kubeconfig.
    c.apply(&pod_yaml(
        NS,
        &format!("guaranteed-{node}"),
        node,
        "{requests: {cpu: 50m, memory: 32Mi}, limits: {cpu: 50m, memory: 32Mi}}",
        "  priorityClassName: criguard-test-high\n",
        "",
    ));
    c.apply(&pod_yaml(
        NS,
        &format!("burstable-{node}"),
        node,
        "{requests: {cpu: 10m, memory: 128Mi}, limits: {memory: 256Mi}}",
        "",
        "",
    ));
    c.apply(&pod_yaml(
        NS,
        &format!("besteffort-{node}"),
        node,
        "{}",
        "",
        "",
    ));
    let static_pod = pod_yaml(
        "kube-system",
        "static-critical",
        node,
        "{}",
        "  priorityClassName: system-node-critical\n",
        "",
    );
    std::fs::write(
        c.node_dir(node).join("manifests/static-critical.yaml"),
        static_pod,
    )
    .unwrap();

    let api_pods = poll(
        Duration::from_secs(120),
        &format!("the four pods on {node} Running"),
        || {
            let mut pods: Vec<Value> = c.pods(NS).into_iter().filter(on_node).collect();
            pods.extend(c.pods("kube-system").into_iter().filter(|p| {
                on_node(p)
                    && p["metadata"]["name"]
                        .as_str()
                        .unwrap_or("")
                        .starts_with("static-critical")
            }));
            (pods.len() == 4 && pods.iter().all(|p| phase(p) == "Running")).then_some(pods)
        },
    );
    let capacity = bytes(n["status"]["capacity"]["memory"].as_str().unwrap());
    let model = poll(
        Duration::from_secs(30),
        &format!("{node}'s criguard model of the four pods"),
        || {
            let m = c.model(node);
            api_pods
                .iter()
                .all(|p| {
                    m.iter().any(|mp| {
                        mp.uid == runtime_uid(p)
                            && mp.containers.len() == 1
                            && mp.source == criguard::model::PodSource::Api
                    })
                })
                .then_some(m)
        },
    );
    for p in &api_pods {
        let name = p["metadata"]["name"].as_str().unwrap();
        let mp = model.iter().find(|mp| mp.uid == runtime_uid(p)).unwrap();
        let qos = format!("{:?}", mp.qos);
        assert_eq!(
            qos,
            p["status"]["qosClass"].as_str().unwrap(),
            "QoS of {name}"
        );
        assert_eq!(
            i64::from(mp.priority),
            p["spec"]["priority"].as_i64().unwrap_or(0),
            "priority of {name}"
        );
        // criguard reads the pods bound to the node from the API: requests
        // exactly as the spec says.
        let want = api_memory_request(p);
        let got = mp.memory_request();
        assert_eq!(got, want, "memory request of {name}");
        let is_static = name.starts_with("static-critical");
        assert_eq!(mp.static_pod, is_static, "static pod {name}");
        assert_eq!(mp.critical, is_static, "critical {name}");
        // The score the container was created with is the kubelet's
        // (`pkg/kubelet/qos/policy.go`), worked out here from the API pod.
        let node_critical = p["spec"]["priorityClassName"] == "system-node-critical";
        let kubelet_score = match p["status"]["qosClass"].as_str().unwrap() {
            _ if node_critical => -997,
            "Guaranteed" => -997,
            "BestEffort" => 1000,
            _ => (1000 - 1000 * want / capacity).clamp(3, 999),
        };
        let c = mp.containers.values().next().unwrap();
        assert_eq!(
            (c.oom_score_adj, c.api_oom_score_adj),
            (kubelet_score, Some(kubelet_score)),
            "OOM-WANT of {name}"
        );
        println!(
            "cluster: {node}: {name}: {qos}, priority {}, request {want} (criguard {got}), static {is_static}",
            mp.priority
        );
    }
}

/// Pods whose requests and scores CRI cannot tell, on `node`: one with
/// pod-level resources only (200Mi requested for the pod) and one with a
/// sidecar (an init container that keeps running, 32Mi, beside the app's
/// 64Mi). criguard reads them from the API: the pod requests the kubelet
/// ranks by (200Mi; 64Mi + 32Mi) and each container created with the
/// kubelet's score, worked out here (`pkg/kubelet/qos/policy.go`): the
/// pod-level request shared by its one container, the sidecar no higher
/// than the app.
fn pod_shapes(c: &Cluster, node: &str) {
    const MI: i64 = 1 << 20;
    let proxy = format!(
        "  initContainers:\n  - {{name: proxy, image: {BUSYBOX}, imagePullPolicy: Never, restartPolicy: Always, \
         command: [sleep, \"3600\"], resources: {{requests: {{memory: 32Mi}}, limits: {{memory: 64Mi}}}}}}\n"
    );
    let shapes = [
        (
            "pod-level",
            "{}".to_owned(),
            "  resources: {requests: {cpu: 10m, memory: 200Mi}, limits: {memory: 400Mi}}\n"
                .to_owned(),
        ),
        (
            "sidecar",
            "{requests: {cpu: 10m, memory: 64Mi}, limits: {memory: 128Mi}}".to_owned(),
            proxy,
        ),
    ];
    for (name, resources, extra) in &shapes {
        c.apply(&pod_yaml(
            NS,
            &format!("{name}-{node}"),
            node,
            resources,
            extra,
            "",
        ));
    }
    let n = c.json(&["get", "node", node]);
    let capacity = bytes(n["status"]["capacity"]["memory"].as_str().unwrap());
    let score = |request: i64| (1000 - 1000 * request / capacity).clamp(3, 999);
    let model = poll(
        Duration::from_secs(120),
        "the pod shapes in criguard's model",
        || {
            let api: Vec<Value> = c
                .pods(NS)
                .into_iter()
                .filter(|p| p["spec"]["nodeName"] == node && phase(p) == "Running")
                .collect();
            let m = c.model(node);
            let wanted = [("pod-level", 1), ("sidecar", 2)];
            wanted
                .iter()
                .all(|(name, containers)| {
                    let name = format!("{name}-{node}");
                    let Some(p) = api.iter().find(|p| p["metadata"]["name"] == name.as_str())
                    else {
                        return false;
                    };
                    m.iter().any(|mp| {
                        mp.uid == uid(p)
                            && mp.containers.len() == *containers
                            && mp.source == criguard::model::PodSource::Api
                    })
                })
                .then_some(m)
        },
    );
    let pod = |name: &str| {
        let name = format!("{name}-{node}");
        model.iter().find(|p| p.name == name).unwrap().clone()
    };
    let container = |p: &criguard::model::Pod, name: &str| {
        p.containers
            .values()
            .find(|c| c.name == name)
            .unwrap()
            .clone()
    };
    let pl = pod("pod-level");
    assert_eq!(pl.qos, criguard::model::qos::QosClass::Burstable);
    assert_eq!(pl.memory_request(), 200 * MI, "the pod-level request");
    assert_eq!(pl.requests.pod_level_memory, Some(200 * MI));
    let app = container(&pl, "app");
    assert_eq!(
        (app.oom_score_adj, app.api_oom_score_adj),
        (score(200 * MI), Some(score(200 * MI)))
    );
    let sc = pod("sidecar");
    assert_eq!(sc.memory_request(), 96 * MI, "app and sidecar");
    for name in ["app", "proxy"] {
        let c = container(&sc, name);
        assert_eq!(
            (c.oom_score_adj, c.api_oom_score_adj),
            (score(64 * MI), Some(score(64 * MI))),
            "{name}"
        );
    }
    println!(
        "cluster: {node}: pod-level pod: request 200Mi, score {}; sidecar pod: request 96Mi, app and sidecar {}",
        score(200 * MI),
        score(64 * MI)
    );

    // An in-place resize, carried out by the kubelet: criguard's request
    // follows the API's allocation, its limit the UpdateContainerResources
    // the kubelet sends through it.
    let burstable = format!("burstable-{node}");
    let resize = r#"{"spec":{"containers":[{"name":"app","resources":{"requests":{"cpu":"10m","memory":"160Mi"},"limits":{"memory":"320Mi"}}}]}}"#;
    c.kubectl(&[
        "-n",
        NS,
        "patch",
        "pod",
        &burstable,
        "--subresource",
        "resize",
        "-p",
        resize,
    ]);
    poll(
        Duration::from_secs(60),
        "the resize in criguard's model",
        || {
            let p = c.model(node).into_iter().find(|p| p.name == burstable)?;
            let limit = p.containers.values().next()?.memory_limit;
            (p.memory_request() == 160 * MI && limit == 320 * MI).then_some(())
        },
    );
    rank_is_the_kubelets(c, node);
}

/// `criguard rank`'s memory order on `node` is the kubelet's
/// (`rankMemoryPressure`), worked out here from the API's pods and the
/// usage criguard read: over the request first, then lower priority, then
/// the larger usage above the request; critical pods left out. The request
/// is `GetResourceRequestQuantity`'s for these pods: the pod-level one
/// where set, else the containers' and sidecars' summed.
fn rank_is_the_kubelets(c: &Cluster, node: &str) {
    let request = |p: &Value| -> i64 {
        let mem = |r: &Value| r["requests"]["memory"].as_str().map_or(0, bytes);
        let pod_level = &p["spec"]["resources"];
        if pod_level.is_object() {
            return mem(pod_level);
        }
        let containers = p["spec"]["containers"].as_array().unwrap().iter();
        let sidecars = p["spec"]["initContainers"].as_array().into_iter().flatten();
        containers
            .chain(sidecars.filter(|c| c["restartPolicy"] == "Always"))
            .map(|c| mem(&c["resources"]))
            .sum()
    };
    let out = criguard_cmd(
        &["rank", "--json", "--admin-socket"],
        &c.node_dir(node).join("admin.sock"),
    );
    let rank: Vec<criguard::eviction::rank::RankEntry> = serde_json::from_str(&out).unwrap();
    let memory: Vec<_> = rank
        .iter()
        .filter(|e| e.signal.ends_with("emory.available"))
        .collect();
    let api = c.pods(NS);
    let want = crate::common::pods::kubelet_memory_order(
        memory
            .iter()
            .map(|e| {
                let name = e.pod.rsplit('/').next().unwrap();
                let p = api.iter().find(|p| p["metadata"]["name"] == name).unwrap();
                crate::common::pods::Ranked {
                    pod: e.pod.clone(),
                    priority: p["spec"]["priority"].as_i64().unwrap_or(0),
                    request: request(p),
                    usage: e.usage.unwrap(),
                }
            })
            .collect(),
    );
    let got: Vec<&str> = memory.iter().map(|e| e.pod.as_str()).collect();
    assert_eq!(got, want, "criguard rank on {node}: {memory:#?}");
    assert_eq!(
        got.len(),
        5,
        "every pod on {node} but the static one: {got:?}"
    );
    println!("cluster: {node}: criguard's memory rank is the kubelet's: {got:?}");
}

/// The pods of every QoS class, a static node-critical pod, then a memory
/// hog that criguard evicts, as described in the module documentation.
#[test]
fn host_node_adopts_pods_and_criguard_evicts_the_memory_hog() {
    let t_test = Instant::now();
    let mut env = disk_env(KUBELET_IMAGEFS_BACKSTOP_MIB);
    env.push(("CRIGUARD_CLUSTER_OLD_NODE", "1".into()));
    let c = cluster_up(&env_refs(&env));
    for node in c.env["NODES"].clone().split_whitespace() {
        adopt(&c, node);
        pod_shapes(&c, node);
    }
    let node = "node-a";
    let hog = evict_the_hog(&c, node);
    let ready_before = restart_while_the_transition_holds(&c, node, &hog);
    one_evicted_event_from_criguard(&c, &hog);
    the_replacement_waits_for_the_taint(&c, node, &hog);
    the_node_settles(&c, node, &hog, &ready_before);
    let (audit, ours) = criguards_requests_are_allowed(&c);
    criguards_writes_come_in_order(node, &hog, &audit, &ours);
    the_pressure_marks_outlive_the_restart(&c, node, &hog, &ours);
    the_evicting_criguards_figures(&c, node, &hog);

    // --- disk pressure: image GC, then one eviction ------------------------
    let t_disk = Instant::now();
    disk_pressure_criguard(&c, node);
    println!(
        "cluster: the disk scenario ran {:.1} s",
        t_disk.elapsed().as_secs_f64()
    );

    // --- local-storage limits, on node-b (kubelet v1.34) -------------------
    let t_storage = Instant::now();
    local_storage_limits(&c, "node-b", true);
    println!(
        "cluster: the local-storage scenario ran {:.1} s",
        t_storage.elapsed().as_secs_f64()
    );
    println!("cluster: test ran {:.1} s", t_test.elapsed().as_secs_f64());
}

/// The memory hog of the host node's scenario, once criguard evicted it.
struct Hog {
    uid: String,
    name: String,
    /// Its container's `startedAt`, which must never change.
    started: Value,
    /// When criguard recorded the eviction.
    eviction_ms: u64,
    /// The metrics of the criguard that evicted it, read before its restart.
    evicting_metrics: String,
}

/// A BestEffort Deployment pod that grows 10 MiB every 0.5 s once (its
/// replacement finds the marker on the node and only sleeps): criguard
/// evicts it, marks the node and records exactly this eviction.
fn evict_the_hog(c: &Cluster, node: &str) -> Hog {
    let hog = host_hog_yaml(c, node);
    let t_hog = Instant::now();
    c.apply(&hog);
    let first = poll(Duration::from_secs(60), "the hog Running", || {
        c.pods(NS)
            .into_iter()
            .find(|p| p["metadata"]["labels"]["app"] == "hog" && phase(p) == "Running")
    });
    let hog_uid = uid(&first).to_owned();
    let started = first["status"]["containerStatuses"][0]["state"]["running"]["startedAt"].clone();
    let hog_name = first["metadata"]["name"].as_str().unwrap().to_owned();
    println!(
        "cluster: hog {hog_name} Running after {:.1} s",
        t_hog.elapsed().as_secs_f64()
    );

    let (evicted, blank) = poll_evicted(Duration::from_secs(120), "the hog Failed/Evicted", || {
        c.pods(NS).into_iter().find(|p| uid(p) == hog_uid)
    });
    println!(
        "cluster: hog evicted {:.1} s after it was applied (Failed without a reason in {blank} polls before)",
        t_hog.elapsed().as_secs_f64()
    );
    assert_evicted(&evicted);

    // criguard's node condition and taint while the pressure lasts.
    let n = c.json(&["get", "node", node]);
    assert_pressure_marked(
        &n,
        "CriguardMemoryPressure",
        "criguard.io/memory-pressure",
        "while the pressure lasts",
    );

    // criguard made exactly this eviction, of the hog, and the kernel none
    // (criguard records it once the pod is stopped, after the API write).
    let report = poll(
        Duration::from_secs(20),
        "criguard's eviction record",
        || {
            let r = c.evictions(node);
            (!r.evictions.is_empty()).then_some(r)
        },
    );
    assert_one_memory_eviction("cluster", &report, &hog_uid);
    let eviction_ms = report.evictions[0].at_unix_ms;
    Hog {
        uid: hog_uid,
        name: hog_name,
        started,
        eviction_ms,
        evicting_metrics: c.metrics(node),
    }
}

/// criguard SIGKILLed and started again while the transition period holds,
/// with the same command line and state dir (the kubelet keeps running):
/// the condition, the taint, the admission refusals and the eviction record
/// carry on from pressure.json. The node's Ready condition before it.
fn restart_while_the_transition_holds(c: &Cluster, node: &str, hog: &Hog) -> Value {
    let Hog {
        uid: hog_uid,
        eviction_ms,
        ..
    } = hog;
    let hog_uid = hog_uid.as_str();
    let eviction_ms = *eviction_ms;
    let ready_before = condition(&c.json(&["get", "node", node]), "Ready")
        .cloned()
        .expect("Ready condition");
    assert_eq!(ready_before["status"], "True", "{ready_before:#}");
    let pid_file = c.dir.join(format!("pids/criguard-{node}.pid"));
    let old_pid = std::fs::read_to_string(&pid_file).unwrap();
    let restart = c.restart_criguard(node);
    let new_pid = std::fs::read_to_string(&pid_file).unwrap();
    assert_ne!(
        old_pid.trim(),
        new_pid.trim(),
        "criguard's pid after the restart"
    );
    // Gone, or a zombie its new parent has not reaped yet.
    let stat =
        std::fs::read_to_string(format!("/proc/{}/stat", old_pid.trim())).unwrap_or_default();
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, r)| r.split(' ').next());
    assert!(
        matches!(state, None | Some("Z" | "X")),
        "the killed criguard (pid {}) is still there: {stat}",
        old_pid.trim()
    );
    println!(
        "cluster: {node}'s criguard SIGKILLed and restarted in {:.2} s, {:.1} s after the eviction",
        restart.as_secs_f64(),
        (unix_ms_now() - eviction_ms as i64) as f64 / 1000.0
    );
    let n = c.json(&["get", "node", node]);
    assert_pressure_marked(
        &n,
        "CriguardMemoryPressure",
        "criguard.io/memory-pressure",
        "after the restart",
    );
    let ready = condition(&n, "Ready").expect("Ready condition");
    assert_eq!(ready["status"], "True", "after the restart: {ready:#}");
    // The restarted criguard still lists the eviction, and only it.
    assert_one_memory_eviction("cluster (restarted criguard)", &c.evictions(node), hog_uid);
    ready_before
}

/// One Warning Evicted event on the pod, from criguard.
fn one_evicted_event_from_criguard(c: &Cluster, hog: &Hog) {
    let hog_uid = hog.uid.as_str();
    let events = poll(Duration::from_secs(20), "the Evicted event", || {
        let list = c.json(&[
            "-n",
            NS,
            "get",
            "events",
            &format!("--field-selector=involvedObject.uid={hog_uid},reason=Evicted"),
        ]);
        let items = list["items"].as_array().cloned().unwrap_or_default();
        (!items.is_empty()).then_some(items)
    });
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0]["type"], "Warning");
    assert_eq!(
        events[0]["source"]["component"], "criguard",
        "{:#}",
        events[0]
    );
}

/// The replacement: the ReplicaSet makes it as soon as the hog is Failed.
/// It must not run while the taint holds: criguard writes the taint
/// before the Failed status, so the scheduler leaves it Pending,
/// unschedulable, and never binds it to the tainted node.
/// When the kubelet writes the evicted pod's old Running status back,
/// the ReplicaSet sees two pods and deletes the replacement, then makes
/// another once criguard writes Failed again: any of them counts.
fn the_replacement_waits_for_the_taint(c: &Cluster, node: &str, hog: &Hog) {
    let Hog {
        uid: hog_uid,
        started,
        ..
    } = hog;
    let hog_uid = hog_uid.as_str();
    poll(Duration::from_secs(30), "the replacement pod", || {
        c.pods(NS)
            .into_iter()
            .find(|p| p["metadata"]["labels"]["app"] == "hog" && uid(p) != hog_uid)
    });
    let t_replacement = Instant::now();
    let (mut unschedulable, mut bound_while_tainted) = (false, false);
    let mut replacements = std::collections::BTreeSet::new();
    // Polls that found the evicted pod's phase other than Failed: the
    // kubelet's status manager writing its own phase back, which criguard
    // overwrites again.
    let mut not_failed_seen = 0usize;
    poll(
        Duration::from_secs(150),
        "a replacement Running after the taint goes",
        || {
            let pods = c.pods(NS);
            if let Some(old) = pods.iter().find(|p| uid(p) == hog_uid) {
                never_runs_again(c, node, old, started);
                not_failed_seen += usize::from(phase(old) != "Failed");
            }
            let tainted = tainted(
                &c.json(&["get", "node", node]),
                "criguard.io/memory-pressure",
            );
            let news = pods
                .iter()
                .filter(|p| p["metadata"]["labels"]["app"] == "hog" && uid(p) != hog_uid);
            let mut running = false;
            for p in news {
                replacements.insert(uid(p).to_owned());
                if phase(p) == "Running" {
                    assert!(!tainted, "a replacement runs on a tainted node: {p:#}");
                    running = true;
                } else if tainted {
                    let sched = condition(p, "PodScheduled");
                    unschedulable |= sched.is_some_and(|s| s["reason"] == "Unschedulable");
                    bound_while_tainted |= !p["spec"]["nodeName"].is_null();
                }
            }
            running.then_some(())
        },
    );
    let refusals = metric(
        &c.metrics(node),
        r#"criguard_admission_refusals_total{condition="MemoryPressure"}"#,
    )
    .unwrap_or(0.0);
    // In the end the evicted pod is Failed in the API (or deleted by
    // criguard so that its controller replaced it).
    poll(
        Duration::from_secs(60),
        "the evicted pod Failed or gone",
        || {
            let pods = c.pods(NS);
            let old = pods.iter().find(|p| uid(p) == hog_uid);
            if let Some(old) = old {
                never_runs_again(c, node, old, started);
            }
            old.is_none_or(|p| phase(p) == "Failed").then_some(())
        },
    );
    println!(
        "cluster: the evicted pod's phase was seen other than Failed in {not_failed_seen} polls (the kubelet's status manager)"
    );
    println!(
        "cluster: replacement Running {:.1} s after the first appeared ({} replacement pods made); while tainted: unschedulable {unschedulable}, bound {bound_while_tainted}; sandboxes refused under MemoryPressure by the restarted criguard: {refusals}",
        t_replacement.elapsed().as_secs_f64(),
        replacements.len()
    );
    assert!(
        unschedulable,
        "the replacement was never seen unschedulable while the taint held"
    );
    assert!(
        !bound_while_tainted,
        "a replacement was bound to the node while criguard's taint held"
    );
}

/// The node stayed Ready across criguard's restart, criguard's condition
/// went with the pressure, and the evicted pod is gone from the model; one
/// eviction, no kernel OOM kill in the kubepods cgroup, none by the kubelet.
fn the_node_settles(c: &Cluster, node: &str, hog: &Hog, ready_before: &Value) {
    let Hog { uid: hog_uid, .. } = hog;
    let hog_uid = hog_uid.as_str();
    let n = c.json(&["get", "node", node]);
    // The node stayed Ready across criguard's restart: Ready never changed
    // since before it (the kubelet's runtime check did not fail long enough).
    let ready = condition(&n, "Ready").expect("Ready condition");
    assert_eq!(ready["status"], "True", "{ready:#}");
    assert_eq!(
        ready["lastTransitionTime"], ready_before["lastTransitionTime"],
        "the node's Ready changed across criguard's restart: before {ready_before:#}, now {ready:#}"
    );
    // criguard's condition is gone (or False) with the pressure.
    if let Some(cond) = condition(&n, "CriguardMemoryPressure") {
        assert_eq!(cond["status"], "False", "{cond:#}");
    }
    let m = c.model(node);
    assert!(
        !m.iter()
            .any(|p| p.uid == hog_uid && p.state == criguard::model::SandboxState::Ready),
        "criguard's model has the evicted pod's sandbox ready again"
    );

    // Still one eviction, no kernel OOM kill in the kubepods cgroup.
    let report = c.evictions(node);
    assert_eq!(report.evictions.len(), 1, "{report:#?}");
    assert!(report.kernel_oom_kills.is_empty(), "{report:#?}");
    let kubepods = std::fs::read_to_string(c.node_dir(node).join("kubepods")).unwrap();
    let oom = std::fs::read_to_string(format!(
        "/sys/fs/cgroup/memory{}/memory.oom_control",
        kubepods.trim()
    ));
    if let Ok(oom) = oom {
        let kills = oom
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .unwrap_or("0");
        assert_eq!(
            kills.trim(),
            "0",
            "kernel OOM kills in the kubepods cgroup:\n{oom}"
        );
    }

    // The kubelet evicted nothing itself.
    let kubelet_log = std::fs::read_to_string(c.node_dir(node).join("kubelet.log")).unwrap();
    for line in kubelet_log.lines() {
        assert!(
            !line.contains("Eviction manager: attempting to reclaim")
                && !line.contains("Eviction manager: pod is evicted"),
            "the kubelet evicted: {line}"
        );
    }
}

/// criguard's requests in the audit log are allowed and carry its
/// User-Agent; the audit log and criguard's entries in it.
fn criguards_requests_are_allowed(c: &Cluster) -> (String, Vec<Value>) {
    let audit = std::fs::read_to_string(c.dir.join("audit.log")).unwrap();
    let ours: Vec<Value> = audit
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["user"]["username"] == CRIGUARD_USER)
        .collect();
    let verbs = |verb: &str, sub: &str| {
        ours.iter()
            .filter(|e| {
                e["verb"] == verb && e["objectRef"]["subresource"].as_str().unwrap_or("") == sub
            })
            .count()
    };
    assert!(
        verbs("patch", "status") >= 1,
        "no status patch by criguard in the audit log"
    );
    assert!(
        verbs("create", "") >= 1,
        "no create (event) by criguard in the audit log"
    );
    for e in &ours {
        let code = e["responseStatus"]["code"].as_i64().unwrap_or(0);
        assert_ne!(code, 403, "criguard was refused: {e:#}");
        let agent = e["userAgent"].as_str().unwrap_or("");
        assert!(
            agent.starts_with("criguard/v"),
            "criguard's User-Agent: {agent:?}"
        );
    }
    println!(
        "cluster: {} audited requests by criguard, none refused, User-Agent {}",
        ours.len(),
        ours[0]["userAgent"]
    );
    (audit, ours)
}

/// The order of criguard's writes (taint and condition before the pod's
/// Failed status), and the kubelet's status writes on the evicted pod
/// after criguard's first (its status manager's cached status written back).
fn criguards_writes_come_in_order(node: &str, hog: &Hog, audit: &str, ours: &[Value]) {
    let hog_name = hog.name.as_str();
    let first_at = |pred: &dyn Fn(&Value) -> bool| {
        ours.iter()
            .find(|e| pred(e))
            .and_then(|e| audit_ms(e["stageTimestamp"].as_str()?))
    };
    let status_at = first_at(&|e| {
        e["verb"] == "patch"
            && e["objectRef"]["resource"] == "pods"
            && e["objectRef"]["name"] == hog_name
    });
    let taint_at = first_at(&|e| {
        e["verb"] == "patch"
            && e["objectRef"]["resource"] == "nodes"
            && e["objectRef"]["subresource"].is_null()
    });
    let condition_at = first_at(&|e| {
        e["verb"] == "patch"
            && e["objectRef"]["resource"] == "nodes"
            && e["objectRef"]["subresource"] == "status"
    });
    let (Some(s), Some(t), Some(n)) = (status_at, taint_at, condition_at) else {
        panic!("criguard's status, taint or condition write missing from the audit log");
    };
    println!(
        "cluster: criguard's writes relative to the pod's Failed status: node condition {:+} ms, taint {:+} ms",
        n - s,
        t - s
    );
    assert!(
        t <= s && n <= s,
        "criguard's taint ({:+} ms) and condition ({:+} ms) must reach the API before the pod's Failed status",
        t - s,
        n - s
    );
    let kubelet_user = format!("system:node:{node}");
    let reverts = audit
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| {
            e["user"]["username"] == kubelet_user.as_str()
                && e["objectRef"]["name"] == hog_name
                && e["objectRef"]["subresource"] == "status"
                && e["stageTimestamp"].as_str().and_then(audit_ms) > status_at
        })
        .count();
    println!("cluster: the kubelet's status writes on the evicted pod after criguard's: {reverts}");
}

/// The taint and the condition outlived the restart and went only once
/// the transition period had passed since the last observed pressure
/// (pressure.json, the restarted criguard's memory), so not before
/// TRANSITION_MS - SLACK_MS after the eviction. criguard's successful
/// node writes in the audit log: the taint set once and removed once
/// (never removed and set again across the restart); the condition's
/// last write is its end.
fn the_pressure_marks_outlive_the_restart(c: &Cluster, node: &str, hog: &Hog, ours: &[Value]) {
    let eviction_ms = hog.eviction_ms;
    let node_writes = |sub: Option<&str>| -> Vec<i64> {
        ours.iter()
            .filter(|e| {
                criguard_patched(e)
                    && e["objectRef"]["resource"] == "nodes"
                    && e["objectRef"]["subresource"].as_str() == sub
            })
            .filter_map(|e| audit_ms(e["stageTimestamp"].as_str()?))
            .collect()
    };
    let taint_writes = node_writes(None);
    assert_eq!(
        taint_writes.len(),
        2,
        "criguard's taint writes (set, removed): {taint_writes:?}"
    );
    let condition_writes = node_writes(Some("status"));
    assert!(
        condition_writes.len() >= 2,
        "criguard's condition writes (True, then False or removed): {condition_writes:?}"
    );
    let evicted_at = ms_of_day(eviction_ms);
    let taint_gone = day_diff(taint_writes[1], evicted_at);
    let condition_gone = day_diff(*condition_writes.last().unwrap(), evicted_at);
    let pressure: Value = serde_json::from_str(
        &std::fs::read_to_string(c.node_dir(node).join("criguard-state/pressure.json")).unwrap(),
    )
    .unwrap();
    let last_pressure = pressure["last_observed"]["MemoryPressure"]
        .as_u64()
        .map(|ms| day_diff(ms_of_day(ms), evicted_at))
        .expect("MemoryPressure in pressure.json");
    println!(
        "cluster: after the eviction: last pressure observed {:+.3} s, taint removed {:+.3} s, condition ended {:+.3} s (transition {} s, slack {} s)",
        last_pressure as f64 / 1000.0,
        taint_gone as f64 / 1000.0,
        condition_gone as f64 / 1000.0,
        TRANSITION_MS / 1000,
        SLACK_MS / 1000
    );
    for (what, gone) in [("taint", taint_gone), ("condition", condition_gone)] {
        assert!(
            gone >= TRANSITION_MS - SLACK_MS && gone >= last_pressure + TRANSITION_MS - SLACK_MS,
            "criguard's {what} went {gone} ms after the eviction (last pressure {last_pressure:+} ms): before the {TRANSITION_MS} ms transition period"
        );
    }
}

/// Figures from the criguard that evicted (read before its restart): one
/// grace-0 kill, and none by the restarted one.
fn the_evicting_criguards_figures(c: &Cluster, node: &str, hog: &Hog) {
    let metrics = &hog.evicting_metrics;
    let kill_sum = metric(metrics, "criguard_pressure_to_kill_seconds_sum").unwrap_or(f64::NAN);
    let kill_count = metric(metrics, "criguard_pressure_to_kill_seconds_count").unwrap_or(0.0);
    let action_sum = metric(metrics, "criguard_pressure_to_action_seconds_sum").unwrap_or(f64::NAN);
    println!(
        "cluster: pressure → kill {:.3} s over {kill_count} kill(s); pressure → StopPodSandbox {:.3} s",
        kill_sum, action_sum
    );
    assert_eq!(kill_count, 1.0, "one grace-0 kill");
    let kills_after_restart =
        metric(&c.metrics(node), "criguard_pressure_to_kill_seconds_count").unwrap_or(0.0);
    assert_eq!(kills_after_restart, 0.0, "the restarted criguard killed");
    println!("cluster: RSS KiB {:?}", c.rss());
}

/// A pod on `node` with two containers of 32Mi of ephemeral storage each
/// and an emptyDir `cache` of 16Mi, whose container `app` writes `mib` MiB
/// to files `<target>.N`, 2 MiB a second after 3 s (as a cache or a log
/// fills), touching `<state>/<name>-crossed` just before the write that
/// takes it to `limit_mib` (over the limit, with the directories' own
/// blocks).
fn storage_pod_yaml(
    name: &str,
    node: &str,
    state: &Path,
    target: &str,
    (mib, limit_mib): (u32, u32),
) -> String {
    let marker = format!("/state/{name}-crossed");
    let script = format!(
        "sleep 3; i=0; while [ $i -lt {steps} ]; do \
         if [ $((i*2+2)) -ge {limit_mib} ] && [ ! -e {marker} ]; then touch {marker}; fi; \
         dd if=/dev/zero of={target}.$i bs=1048576 count=2 2>/dev/null; i=$((i+1)); sleep 1; done; \
         exec sleep 3600",
        steps = mib / 2
    );
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {NS}}}
spec:
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  hostNetwork: true
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 2
  restartPolicy: Never
  volumes:
  - {{name: cache, emptyDir: {{sizeLimit: 16Mi}}}}
  - {{name: state, hostPath: {{path: {state}, type: DirectoryOrCreate}}}}
  containers:
  - name: app
    image: {BUSYBOX}
    imagePullPolicy: Never
    resources: {{limits: {{ephemeral-storage: 32Mi}}}}
    volumeMounts: [{{name: cache, mountPath: /cache}}, {{name: state, mountPath: /state}}]
    command: ["sh", "-c", "{script}"]
  - name: side
    image: {BUSYBOX}
    imagePullPolicy: Never
    resources: {{limits: {{ephemeral-storage: 32Mi}}}}
    command: ["sleep", "3600"]
"#,
        state = state.display()
    )
}

/// Local-storage limits on `node`, by criguard (`criguard_acts`) or, with
/// criguard in dry run, by the kubelet alone: `cache` fills its 16Mi
/// emptyDir towards 24 MiB, `layer`'s container writes towards 40 MiB over
/// its 32Mi (its pod may use 64Mi). Each is evicted with the kubelet's message and
/// reason; the time from the write (its marker's mtime) to the eviction is
/// printed.
fn local_storage_limits(c: &Cluster, node: &str, criguard_acts: bool) {
    let state = c.node_dir(node).join("storage-state");
    let pods = [
        (
            "cache",
            "/cache/fill",
            (24, 16),
            "Usage of EmptyDir volume \"cache\" exceeds the limit \"16Mi\". ",
        ),
        (
            "layer",
            "/fill",
            (40, 32),
            "Container app exceeded its local ephemeral storage limit \"32Mi\". ",
        ),
    ];
    for (name, target, sizes, _) in pods {
        c.apply(&storage_pod_yaml(name, node, &state, target, sizes));
    }
    let who = if criguard_acts {
        "criguard"
    } else {
        "kubelet alone"
    };
    for (name, _, _, message) in pods {
        let evicted = poll(
            Duration::from_secs(180),
            &format!("{name} Failed/Evicted"),
            || {
                c.pods(NS)
                    .into_iter()
                    .find(|p| p["metadata"]["name"] == name && p["status"]["reason"] == "Evicted")
            },
        );
        assert_eq!(evicted["status"]["message"], message, "{name}: {evicted:#}");
        let crossed = std::fs::metadata(state.join(format!("{name}-crossed")))
            .and_then(|m| m.modified())
            .expect("the writer's marker");
        let crossed_ms = crossed
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let decided = c
            .evictions(node)
            .evictions
            .into_iter()
            .find(|e| e.uid == uid(&evicted));
        match (&decided, criguard_acts) {
            (Some(e), true) => {
                assert!(!e.dry_run);
                assert_eq!(e.message, message);
                println!(
                    "cluster ({who}): {name}: limit crossed -> evicted {:.3} s",
                    (e.at_unix_ms as i64 - crossed_ms) as f64 / 1000.0
                );
            }
            (None, true) => panic!("criguard did not evict {name}: {evicted:#}"),
            (_, false) => {
                let kubelet_log =
                    std::fs::read_to_string(c.node_dir(node).join("kubelet.log")).unwrap();
                // Logged once the pod is stopped (its grace of 1 s included).
                let pod = format!("pod=\"{NS}/{name}\"");
                let line = kubelet_log
                    .lines()
                    .find(|l| l.contains("pod is evicted successfully") && l.contains(&pod));
                let at = line.and_then(klog_ms_of_day);
                println!(
                    "cluster ({who}): {name}: limit crossed -> the kubelet's eviction {:?} s ({line:?})",
                    at.map(|ms| day_diff(ms, ms_of_day(crossed_ms as u64)) as f64 / 1000.0)
                );
            }
        }
    }
    c.kubectl(&["-n", NS, "delete", "pod", "cache", "layer", "--wait=false"]);
}

/// Local-storage limits enforced by the kubelet alone (criguard in dry
/// run): the README's comparison figures
/// (`cargo test --test it -- --ignored --nocapture cluster::`).
#[test]
#[ignore]
fn kubelet_alone_enforces_local_storage_limits_when_criguard_dry_runs() {
    let c = cluster_up(&[("CRIGUARD_CLUSTER_DRY_RUN", "1")]);
    let node = "node-a";
    adopt(&c, node);
    local_storage_limits(&c, node, false);
}

/// The same hog with criguard in dry run and the kubelet's threshold at
/// criguard's (`allocatableMemory.available<250Mi`): the kubelet's own
/// eviction manager acts, criguard only records what it would have done.
/// A measurement for the README's comparison table rather than a CI check
/// (`cargo test --test it -- --ignored --nocapture cluster::`).
#[test]
#[ignore]
fn kubelet_alone_evicts_the_memory_hog_when_criguard_dry_runs() {
    let t_test = Instant::now();
    let c = cluster_up(&[
        ("CRIGUARD_CLUSTER_DRY_RUN", "1"),
        ("CRIGUARD_CLUSTER_KUBELET_EVICTION", "250Mi"),
    ]);
    let node = "node-a";
    adopt(&c, node);
    let t_hog = Instant::now();
    c.apply(&host_hog_yaml(&c, node));
    let first = poll(Duration::from_secs(60), "the hog Running", || {
        c.pods(NS)
            .into_iter()
            .find(|p| p["metadata"]["labels"]["app"] == "hog" && phase(p) == "Running")
    });
    let hog_uid = uid(&first).to_owned();
    // criguard decides (dry run) when the threshold is crossed.
    let decided = poll(
        Duration::from_secs(120),
        "criguard's dry-run decision",
        || {
            let r = c.evictions(node);
            r.evictions.into_iter().find(|e| e.uid == hog_uid)
        },
    );
    assert!(decided.dry_run);
    // Then the kubelet, or the kernel, stops the hog.
    let ended = poll(Duration::from_secs(120), "the hog stopped", || {
        let p = c.pods(NS).into_iter().find(|p| uid(p) == hog_uid)?;
        let st = p["status"]["containerStatuses"][0]["state"]["terminated"].clone();
        (!st.is_null()).then_some(p)
    });
    println!(
        "cluster (kubelet alone): hog stopped {:.1} s after it was applied; phase {}, reason {}, container {}",
        t_hog.elapsed().as_secs_f64(),
        phase(&ended),
        ended["status"]["reason"],
        ended["status"]["containerStatuses"][0]["state"]["terminated"]
    );
    // The kubelet's eviction time from its log (klog: "I1125 16:37:11.412783").
    let kubelet_log = std::fs::read_to_string(c.node_dir(node).join("kubelet.log")).unwrap();
    let evicted_line = kubelet_log
        .lines()
        .find(|l| {
            l.contains("Eviction manager: pod is evicted successfully")
                || l.contains("Evicting pod")
        })
        .map(str::to_owned);
    println!(
        "cluster (kubelet alone): criguard's dry-run decision at {} ms (available {} MiB); kubelet: {evicted_line:?}",
        decided.at_unix_ms,
        decided.available >> 20
    );
    if let Some(ms) = evicted_line.as_deref().and_then(klog_ms_of_day) {
        let crossed = (decided.at_unix_ms % 86_400_000) as i64;
        println!(
            "cluster (kubelet alone): threshold crossed (criguard's dry-run decision) → the kubelet's eviction: {:.3} s",
            (ms - crossed) as f64 / 1000.0
        );
    }
    let events = c.json(&["-n", NS, "get", "events", "--field-selector=reason=Evicted"]);
    for e in events["items"].as_array().cloned().unwrap_or_default() {
        println!(
            "cluster (kubelet alone): event {} {} from {}: {}",
            e["involvedObject"]["name"], e["reason"], e["source"]["component"], e["message"]
        );
    }
    // Victims and the pods the kubelet's admission refused meanwhile.
    poll(
        Duration::from_secs(150),
        "a hog replacement Running",
        || {
            c.pods(NS).into_iter().find(|p| {
                p["metadata"]["labels"]["app"] == "hog"
                    && uid(p) != hog_uid
                    && phase(p) == "Running"
            })
        },
    );
    let pods = c.pods(NS);
    let failed: Vec<String> = pods
        .iter()
        .filter(|p| phase(p) == "Failed")
        .map(|p| {
            format!(
                "{} ({}: {})",
                p["metadata"]["name"], p["status"]["reason"], p["status"]["message"]
            )
        })
        .collect();
    println!(
        "cluster (kubelet alone): Failed pods {}: {failed:#?}",
        failed.len()
    );
    let report = c.evictions(node);
    println!(
        "cluster (kubelet alone): criguard dry-run records {}, kernel OOM kills {}",
        report.evictions.len(),
        report.kernel_oom_kills.len()
    );
    assert!(report.evictions.iter().all(|e| e.dry_run));
    let kubepods = std::fs::read_to_string(c.node_dir(node).join("kubepods")).unwrap();
    if let Ok(oom) = std::fs::read_to_string(format!(
        "/sys/fs/cgroup/memory{}/memory.oom_control",
        kubepods.trim()
    )) {
        println!(
            "cluster (kubelet alone): kubepods memory.oom_control {:?}",
            oom.replace('\n', " ")
        );
    }
    println!("cluster (kubelet alone): RSS KiB {:?}", c.rss());
    println!(
        "cluster (kubelet alone): test ran {:.1} s",
        t_test.elapsed().as_secs_f64()
    );
}

/// The disk scenario with criguard in dry run and the kubelet's
/// `imagefs.available` threshold at criguard's (128Mi): the kubelet's own
/// eviction manager collects images and evicts. A measurement for the
/// README's comparison table rather than a CI check
/// (`cargo test --test it -- --ignored --nocapture cluster::`).
#[test]
#[ignore]
fn kubelet_alone_collects_images_and_evicts_the_disk_hog_when_criguard_dry_runs() {
    let t_test = Instant::now();
    let mut env = disk_env(IMAGEFS_THRESHOLD_MIB);
    env.push(("CRIGUARD_CLUSTER_DRY_RUN", "1".into()));
    // The kubelet's image GC on, at its defaults (85/80): at 100 it is
    // off altogether, and so is its image reclaim under disk pressure.
    env.push(("CRIGUARD_CLUSTER_KUBELET_IMAGE_GC_HIGH", "85".into()));
    let c = cluster_up(&env_refs(&env));
    let node = "node-a";
    adopt(&c, node);
    disk_pressure_kubelet_alone(&c, node);
    println!(
        "cluster (disk, kubelet alone): test ran {:.1} s",
        t_test.elapsed().as_secs_f64()
    );
}

/// `(name, value)` pairs as [`cluster_up`] takes them.
fn env_refs<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

#[test]
fn klog_and_audit_times_are_read_as_milliseconds_of_the_day() {
    assert_eq!(
        klog_ms_of_day("I1125 16:46:05.204186   14869 eviction_manager.go:658] x"),
        Some(60_365_204)
    );
    assert_eq!(audit_ms("2026-11-25T16:51:51.791353Z"), Some(60_711_791));
    assert_eq!(klog_ms_of_day("garbage"), None);
    assert_eq!(ms_of_day(1_795_626_205_443), 61_405_443);
    assert_eq!(day_diff(1_000, 86_399_000), 2_000);
    assert_eq!(day_diff(86_399_000, 1_000), -2_000);
    assert_eq!(day_diff(60_000, 30_000), 30_000);
}

// --- disk pressure ---------------------------------------------------------------

/// node-a's imagefs in the disk scenarios: an ext4 of this many MiB
/// (`CRIGUARD_CLUSTER_IMAGEFS_MIB`).
const IMAGEFS_MIB: &str = "320";
/// criguard's `imagefs.available` hard threshold, MiB.
const IMAGEFS_THRESHOLD_MIB: u64 = 128;
/// The kubelet's own `imagefs.available` threshold under criguard, MiB: a
/// backstop below criguard's, as an operator adopting criguard sets it.
const KUBELET_IMAGEFS_BACKSTOP_MIB: u64 = 48;
/// Each filler image's own layer, MiB (about twice that on imagefs: the
/// blob in the content store and the unpacked snapshot).
const FILLER_MIB: u64 = 16;
/// The images pulled onto the node and then not used by any container.
const UNUSED_IMAGES: [&str; 3] = [
    "criguard-disk-unused-1",
    "criguard-disk-unused-2",
    "criguard-disk-unused-3",
];
/// The image of the neighbour pod, in use throughout.
const IN_USE_IMAGE: &str = "criguard-disk-in-use";
/// The disk hog's growth: this many bytes every half second.
const HOG_STEP: u64 = 4 << 20;
const MI: u64 = 1 << 20;

/// The environment of a cluster whose node-a can run the disk scenario:
/// its imagefs on a small ext4, criguard's imagefs threshold, the
/// kubelet's at `kubelet_imagefs_mib`, unused images collectable after a
/// second by both, a private registry holding the filler images, the
/// unused ones pulled onto node-a before its criguard and kubelet start
/// (a node's old images: the kubelet's image manager only collects what it
/// detected at least its minimum age before, and it detects every 5
/// minutes), and criguard's housekeeping every second (the disk signals
/// are read on its tick; memory has its events).
fn disk_env(kubelet_imagefs_mib: u64) -> Vec<(&'static str, String)> {
    let push: Vec<String> = UNUSED_IMAGES
        .iter()
        .chain([&IN_USE_IMAGE])
        .map(|n| format!("{}={n}:latest", filler_archive(n)))
        .collect();
    let prepull: Vec<String> = UNUSED_IMAGES
        .iter()
        .map(|n| format!("{n}:latest"))
        .collect();
    vec![
        ("CRIGUARD_CLUSTER_IMAGEFS_MIB", IMAGEFS_MIB.into()),
        (
            "CRIGUARD_CLUSTER_IMAGEFS_EVICTION",
            format!("{IMAGEFS_THRESHOLD_MIB}Mi"),
        ),
        (
            "CRIGUARD_CLUSTER_KUBELET_IMAGEFS_EVICTION",
            format!("{kubelet_imagefs_mib}Mi"),
        ),
        // Not 0s: the kubelet's configuration takes 0 for unset (2m).
        ("CRIGUARD_CLUSTER_IMAGE_MIN_AGE", "1s".into()),
        ("CRIGUARD_CLUSTER_REGISTRY", "1".into()),
        ("CRIGUARD_CLUSTER_PUSH", push.join(" ")),
        ("CRIGUARD_CLUSTER_PREPULL", prepull.join(" ")),
        (
            "CRIGUARD_CLUSTER_CRIGUARD_ARGS",
            "--housekeeping-interval=1s".into(),
        ),
    ]
}

/// Bytes available to unprivileged users on the filesystem of `path`.
fn fs_available(path: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: statvfs(3) on a NUL-terminated path into a zeroed struct.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut s) };
    assert_eq!(rc, 0, "statvfs {}", path.display());
    s.f_bavail as u64 * s.f_frsize as u64
}

/// Samples of a filesystem's available bytes, (ms since the epoch, bytes),
/// taken every 50 ms by a thread of its own until dropped.
struct FsSampler {
    samples: std::sync::Arc<std::sync::Mutex<Vec<(i64, u64)>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FsSampler {
    fn start(path: PathBuf) -> Self {
        let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (s, st) = (samples.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !st.load(std::sync::atomic::Ordering::Relaxed) {
                let v = fs_available(&path);
                s.lock().unwrap().push((unix_ms_now(), v));
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Self {
            samples,
            stop,
            thread: Some(thread),
        }
    }

    fn samples(&self) -> Vec<(i64, u64)> {
        self.samples.lock().unwrap().clone()
    }
}

impl Drop for FsSampler {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The first sample below `threshold` bytes.
fn first_below(samples: &[(i64, u64)], threshold: u64) -> Option<(i64, u64)> {
    samples.iter().copied().find(|(_, v)| *v < threshold)
}

/// The last sample at or before `at` (ms since the epoch), else the first.
fn sample_at(samples: &[(i64, u64)], at: i64) -> Option<u64> {
    samples
        .iter()
        .take_while(|(t, _)| *t <= at)
        .last()
        .or(samples.first())
        .map(|(_, v)| *v)
}

/// The lowest sample from `from` on.
fn lowest_since(samples: &[(i64, u64)], from: i64) -> Option<u64> {
    samples
        .iter()
        .filter(|(t, _)| *t >= from)
        .map(|(_, v)| *v)
        .min()
}

/// `(time of day in ms, line)` of the lines of a criguard log (RFC 3339
/// UTC timestamps) containing `needle`.
fn criguard_log_lines(log: &str, needle: &str) -> Vec<(i64, String)> {
    log.lines()
        .filter(|l| l.contains(needle))
        .filter_map(|l| Some((audit_ms(l.split_whitespace().next()?)?, l.to_owned())))
        .collect()
}

/// `(time of day in ms, line)` of the lines of a klog log containing
/// `needle`.
fn klog_lines(log: &str, needle: &str) -> Vec<(i64, String)> {
    log.lines()
        .filter(|l| l.contains(needle))
        .filter_map(|l| Some((klog_ms_of_day(l)?, l.to_owned())))
        .collect()
}

/// The repository tags of `crictl images -o json` output.
fn image_tags(crictl_json: &str) -> Vec<String> {
    let v: Value = serde_json::from_str(crictl_json).unwrap();
    v["images"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|i| i["repoTags"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t.as_str().map(str::to_owned))
        .collect()
}

/// crictl of `hack/k8s/build.sh`.
fn crictl_bin() -> PathBuf {
    let out = Command::new(cluster_support::repo().join("hack/k8s/build.sh"))
        .args(["--path", "cri-tools"])
        .output()
        .expect("run hack/k8s/build.sh");
    assert!(out.status.success(), "hack/k8s/build.sh --path cri-tools");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()).join("crictl")
}

/// crictl `args` on `socket`; stdout.
fn crictl(socket: &Path, args: &[&str]) -> String {
    let endpoint = format!("unix://{}", socket.display());
    let out = Command::new(crictl_bin())
        .args([
            "--runtime-endpoint",
            &endpoint,
            "--image-endpoint",
            &endpoint,
        ])
        .args(["--timeout", "30s"])
        .args(args)
        .output()
        .expect("run crictl");
    assert!(
        out.status.success(),
        "crictl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The image tags node `node`'s containerd holds, straight from it.
fn node_images(c: &Cluster, node: &str) -> Vec<String> {
    let sock = c.node_dir(node).join("containerd/containerd.sock");
    image_tags(&crictl(&sock, &["images", "-o", "json"]))
}

/// The archive of filler image `name` (`hack/images.sh --filler`, built
/// once and cached).
fn filler_archive(name: &str) -> String {
    let repo = cluster_support::repo();
    let cache = std::env::var_os("CRIGUARD_IMAGE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("target/criguard-images"));
    let out = Command::new(repo.join("hack/images.sh"))
        .arg(&cache)
        .args(["--filler", name, &FILLER_MIB.to_string()])
        .output()
        .expect("run hack/images.sh");
    assert!(out.status.success(), "hack/images.sh --filler {name}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .last()
        .expect("the filler's archive")
        .to_owned()
}

/// The neighbour: a BestEffort pod of the in-use filler image (pulled by
/// the kubelet from the registry) with 8 MiB in its writable layer.
fn neighbour_yaml(node: &str, image: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: disk-neighbour, namespace: {NS}}}
spec:
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  hostNetwork: true
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: {image}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "fallocate -l {bytes} /data && exec sleep 3600"]
"#,
        bytes = 8 * MI
    )
}

/// The disk hog: a Deployment's Burstable pod (memory ranking would take
/// the BestEffort neighbour first) that puts `first` bytes into its
/// writable layer at once, then [`HOG_STEP`] every half second `steps`
/// times; its replacements find the marker it leaves in `state` (a
/// directory on the node) and only sleep.
fn disk_hog_yaml(node: &str, state: &str, first: u64, steps: u64) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: disk-hog, namespace: {NS}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: disk-hog}}}}
  template:
    metadata: {{labels: {{app: disk-hog}}}}
    spec:
      nodeSelector: {{kubernetes.io/hostname: {node}}}
      hostNetwork: true
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 2
      volumes: [{{name: state, hostPath: {{path: {state}, type: DirectoryOrCreate}}}}]
      containers:
      - name: hog
        image: {BUSYBOX}
        imagePullPolicy: Never
        resources: {{requests: {{cpu: 10m, memory: 16Mi}}}}
        volumeMounts: [{{name: state, mountPath: /state}}]
        command:
        - sh
        - -c
        - |
          if [ -e /state/filled ]; then exec sleep 3600; fi
          touch /state/filled
          fallocate -l {first} /fill0
          i=1
          while [ $i -le {steps} ]; do sleep 0.5; fallocate -l {HOG_STEP} /fill$i; i=$((i+1)); done
          exec sleep 3600
"#
    )
}

/// The disk scenario set up on a node: unused images pulled, the
/// neighbour running, the hog started, node-a's imagefs sampled.
struct DiskScenario {
    /// The filesystem of node-a's containerd root.
    imagefs: PathBuf,
    /// Full references of the unused images.
    unused: Vec<String>,
    /// Full reference of the neighbour's image.
    in_use: String,
    neighbour_uid: String,
    hog_uid: String,
    hog_name: String,
    /// The hog container's start, as the API had it.
    started: Value,
    /// When the hog was applied.
    t_hog: Instant,
    sampler: FsSampler,
}

/// Runs the neighbour (the kubelet pulls its image from the registry)
/// next to the unused images node-a holds from the start, and starts the
/// hog sized from what is available now: it crosses `threshold_mib` within
/// about 2 s and stops growing 112 MiB past it (at least 16 MiB stay free
/// if nothing acts).
fn disk_setup(c: &Cluster, node: &str, threshold_mib: u64) -> DiskScenario {
    let t0 = Instant::now();
    let nd = c.node_dir(node);
    let imagefs = nd.join("containerd/root");
    let registry = &c.env["REGISTRY"];
    let unused: Vec<String> = UNUSED_IMAGES
        .iter()
        .map(|n| format!("{registry}/{n}:latest"))
        .collect();
    let in_use = format!("{registry}/{IN_USE_IMAGE}:latest");
    let tags = node_images(c, node);
    for image in &unused {
        assert!(tags.contains(image), "{image} on the node: {tags:?}");
    }
    c.apply(&neighbour_yaml(node, &in_use));
    let neighbour = poll(Duration::from_secs(60), "the neighbour Running", || {
        c.pods(NS)
            .into_iter()
            .find(|p| p["metadata"]["name"] == "disk-neighbour" && phase(p) == "Running")
    });
    assert!(node_images(c, node).contains(&in_use), "{in_use} pulled");
    // The neighbour's 8 MiB written: available steady over 0.5 s.
    let mut last = 0;
    let before_hog = poll_every(
        Duration::from_millis(500),
        Duration::from_secs(20),
        "imagefs steady",
        || {
            let a = fs_available(&imagefs);
            let steady = a == last;
            last = a;
            steady.then_some(a)
        },
    );
    println!(
        "cluster (disk): {} MiB available of {IMAGEFS_MIB} on {node}'s imagefs with {} unused images and the neighbour; set up in {:.1} s",
        before_hog / MI,
        unused.len(),
        t0.elapsed().as_secs_f64()
    );
    let threshold = threshold_mib * MI;
    assert!(
        before_hog > threshold + 32 * MI,
        "imagefs too small for the scenario: {} MiB available",
        before_hog / MI
    );
    let first = before_hog - threshold - 16 * MI;
    let steps = (16 + 112) * MI / HOG_STEP;
    let state = nd.join("disk-hog-state");
    let sampler = FsSampler::start(imagefs.clone());
    let t_hog = Instant::now();
    c.apply(&disk_hog_yaml(
        node,
        &state.display().to_string(),
        first,
        steps,
    ));
    let hog = poll(Duration::from_secs(60), "the disk hog Running", || {
        c.pods(NS)
            .into_iter()
            .find(|p| p["metadata"]["labels"]["app"] == "disk-hog" && phase(p) == "Running")
    });
    DiskScenario {
        imagefs,
        unused,
        in_use,
        neighbour_uid: uid(&neighbour).to_owned(),
        hog_uid: uid(&hog).to_owned(),
        hog_name: hog["metadata"]["name"].as_str().unwrap().to_owned(),
        started: hog["status"]["containerStatuses"][0]["state"]["running"]["startedAt"].clone(),
        t_hog,
        sampler,
    }
}

/// The disk scenario with criguard acting (see the module documentation);
/// prints the figures of the comparison.
fn disk_pressure_criguard(c: &Cluster, node: &str) {
    let d = disk_setup(c, node, IMAGEFS_THRESHOLD_MIB);
    let threshold = IMAGEFS_THRESHOLD_MIB * MI;
    let hog_uid = d.hog_uid.as_str();

    let (evicted, blank) = poll_evicted(
        Duration::from_secs(90),
        "the disk hog Failed/Evicted",
        || c.pods(NS).into_iter().find(|p| uid(p) == hog_uid),
    );
    println!("cluster (disk): Failed without a reason in {blank} polls before Evicted");
    let t_evicted = d.t_hog.elapsed();
    let t_seen = Instant::now();
    assert_evicted(&evicted);
    let message = evicted["status"]["message"].as_str().unwrap_or("");
    assert!(
        message.starts_with("The node was low on resource: ephemeral-storage."),
        "{message}"
    );

    // criguard's condition and taint while the pressure lasts; the kubelet's
    // own DiskPressure never set (its threshold is lower).
    let n = c.json(&["get", "node", node]);
    assert_pressure_marked(
        &n,
        "CriguardDiskPressure",
        "criguard.io/disk-pressure",
        "while the pressure lasts",
    );

    // criguard's record: the hog, on imagefs.available, and no other pod.
    let report = poll(
        Duration::from_secs(20),
        "criguard's disk eviction record",
        || {
            let r = c.evictions(node);
            r.evictions
                .iter()
                .any(|e| e.signal == "imagefs.available")
                .then_some(r)
        },
    );
    let disk: Vec<_> = report
        .evictions
        .iter()
        .filter(|e| e.signal == "imagefs.available")
        .collect();
    assert_eq!(disk.len(), 1, "{report:#?}");
    let e = disk[0];
    assert_eq!(e.uid, hog_uid, "the largest disk user goes: {e:#?}");
    assert!(!e.dry_run);

    // Image GC first: the three unused images went, each removal logged
    // before the eviction; the images in use stayed.
    let log = std::fs::read_to_string(c.node_dir(node).join("criguard.log")).unwrap();
    let removed = criguard_log_lines(&log, "image GC: removed an unused image");
    let evicting = criguard_log_lines(&log, "evicting pod:")
        .into_iter()
        .find(|(_, l)| l.contains(&d.hog_name))
        .expect("criguard's log of the hog's eviction");
    for image in &d.unused {
        let (at, _) = removed
            .iter()
            .find(|(_, l)| l.contains(image.as_str()))
            .unwrap_or_else(|| panic!("no removal of {image} in criguard's log"));
        assert!(
            day_diff(*at, evicting.0) <= 0,
            "{image} removed after the eviction"
        );
    }
    let tags = node_images(c, node);
    for image in &d.unused {
        assert!(!tags.contains(image), "{image} still on the node: {tags:?}");
    }
    for image in [d.in_use.as_str(), BUSYBOX, "registry.k8s.io/pause:3.9"] {
        assert!(
            tags.iter().any(|t| t == image),
            "{image} must stay: {tags:?}"
        );
    }
    let metrics = c.metrics(node);
    let gc_removals = metric(
        &metrics,
        r#"criguard_reclaim_removals_total{action="image_gc"}"#,
    )
    .unwrap_or(0.0);
    let gc_bytes = metric(
        &metrics,
        r#"criguard_reclaimed_bytes_total{action="image_gc"}"#,
    )
    .unwrap_or(0.0);
    assert_eq!(gc_removals, 3.0, "image GC removals:\n{metrics}");
    // Measured with statvfs while the hog keeps writing (8 MiB/s): a
    // slow collection reads somewhat less than the images it removed.
    assert!(
        gc_bytes >= (3 * FILLER_MIB * MI) as f64 * 0.75,
        "image GC freed {gc_bytes} bytes"
    );

    // The neighbour and the adopted pods still run.
    let pods = c.pods(NS);
    let neighbour = pods.iter().find(|p| uid(p) == d.neighbour_uid).unwrap();
    assert_eq!(phase(neighbour), "Running", "{neighbour:#}");
    for p in &pods {
        let name = p["metadata"]["name"].as_str().unwrap_or("");
        if ["guaranteed", "burstable", "besteffort"]
            .iter()
            .any(|k| name.starts_with(k))
            && p["spec"]["nodeName"] == node
        {
            assert_eq!(phase(p), "Running", "{name} after the disk eviction");
        }
    }

    // One Warning Evicted event on the hog, from criguard.
    let events = poll(Duration::from_secs(20), "the disk Evicted event", || {
        let list = c.json(&[
            "-n",
            NS,
            "get",
            "events",
            &format!("--field-selector=involvedObject.uid={hog_uid},reason=Evicted"),
        ]);
        let items = list["items"].as_array().cloned().unwrap_or_default();
        (!items.is_empty()).then_some(items)
    });
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0]["type"], "Warning");
    assert_eq!(events[0]["source"]["component"], "criguard");

    // The space came back: the hog's writable layer went with it.
    poll(
        Duration::from_secs(20),
        "imagefs back above the threshold",
        || (fs_available(&d.imagefs) > threshold).then_some(()),
    );

    // The figures: crossing (the sampler's first sample under the
    // threshold) to criguard's first image removal and to the eviction.
    let samples = d.sampler.samples();
    let (crossed, _) = first_below(&samples, threshold).expect("the hog crossed the threshold");
    let crossed_day = ms_of_day(crossed as u64);
    let first_gc = removed
        .iter()
        .map(|(t, _)| *t)
        .find(|t| day_diff(*t, crossed_day) >= -1_000)
        .expect("an image removal after the crossing");
    let evicted_at = e.at_unix_ms as i64;
    let action_sum =
        metric(&metrics, "criguard_pressure_to_action_seconds_sum").unwrap_or(f64::NAN);
    println!(
        "cluster (disk, criguard): crossing → first image removal {:.3} s, → eviction {:.3} s (criguard_pressure_to_action {:.3} s); available at the eviction {} MiB (criguard's observation {} MiB), lowest {} MiB; hog usage {} MiB; image GC removed {gc_removals} images, {} MiB; evicted {:.1} s after the hog was applied",
        day_diff(first_gc, crossed_day) as f64 / 1000.0,
        (evicted_at - crossed) as f64 / 1000.0,
        action_sum,
        sample_at(&samples, evicted_at).unwrap_or(0) / MI,
        e.available.max(0) as u64 / MI,
        lowest_since(&samples, crossed).unwrap_or(0) / MI,
        e.usage.max(0) as u64 / MI,
        gc_bytes as u64 / MI,
        t_evicted.as_secs_f64()
    );

    // The kubelet evicted nothing and reclaimed nothing itself.
    let kubelet_log = std::fs::read_to_string(c.node_dir(node).join("kubelet.log")).unwrap();
    for line in kubelet_log.lines() {
        assert!(
            !line.contains("Eviction manager: attempting to reclaim")
                && !line.contains("Eviction manager: pod is evicted"),
            "the kubelet evicted: {line}"
        );
    }
    let n = c.json(&["get", "node", node]);
    if let Some(kc) = condition(&n, "DiskPressure") {
        assert_eq!(kc["status"], "False", "the kubelet's DiskPressure: {kc:#}");
    }

    // The pressure clears: criguard's taint and condition go once the
    // transition period has passed, the replacement (which only sleeps)
    // then runs; the evicted pod never runs again.
    poll(
        Duration::from_secs(90),
        "criguard's disk taint gone and the replacement Running",
        || {
            let pods = c.pods(NS);
            if let Some(old) = pods.iter().find(|p| uid(p) == hog_uid) {
                never_runs_again(c, node, old, &d.started);
            }
            let n = c.json(&["get", "node", node]);
            let tainted = tainted(&n, "criguard.io/disk-pressure");
            let running = pods.iter().any(|p| {
                p["metadata"]["labels"]["app"] == "disk-hog"
                    && uid(p) != hog_uid
                    && phase(p) == "Running"
            });
            if running {
                assert!(!tainted, "a replacement runs on a disk-tainted node");
            }
            (!tainted && running).then_some(())
        },
    );
    let n = c.json(&["get", "node", node]);
    if let Some(cond) = condition(&n, "CriguardDiskPressure") {
        assert_eq!(cond["status"], "False", "{cond:#}");
    }
    let report = c.evictions(node);
    assert_eq!(
        report
            .evictions
            .iter()
            .filter(|e| e.signal == "imagefs.available")
            .count(),
        1,
        "{report:#?}"
    );
    assert!(fs_available(&d.imagefs) > threshold);
    println!(
        "cluster (disk, criguard): pressure cleared, the replacement Running {:.1} s after the eviction was seen",
        t_seen.elapsed().as_secs_f64()
    );
}

/// The disk scenario with criguard in dry run and the kubelet's
/// `imagefs.available` threshold at criguard's: the kubelet's eviction
/// manager reclaims and evicts; prints the same figures.
fn disk_pressure_kubelet_alone(c: &Cluster, node: &str) {
    let d = disk_setup(c, node, IMAGEFS_THRESHOLD_MIB);
    let threshold = IMAGEFS_THRESHOLD_MIB * MI;
    let hog_uid = d.hog_uid.as_str();
    // Its first decision: criguard's dry run records it when the threshold
    // is crossed.
    let decided = poll(
        Duration::from_secs(60),
        "criguard's dry-run decision",
        || {
            let r = c.evictions(node);
            r.evictions
                .into_iter()
                .find(|e| e.signal == "imagefs.available")
        },
    );
    assert!(decided.dry_run);
    let ended = poll(Duration::from_secs(120), "the disk hog stopped", || {
        let p = c.pods(NS).into_iter().find(|p| uid(p) == hog_uid)?;
        let st = &p["status"]["containerStatuses"][0]["state"]["terminated"];
        (!st.is_null() || phase(&p) == "Failed").then_some(p)
    });
    println!(
        "cluster (disk, kubelet alone): hog stopped {:.1} s after it was applied; phase {}, reason {}, message {}",
        d.t_hog.elapsed().as_secs_f64(),
        phase(&ended),
        ended["status"]["reason"],
        ended["status"]["message"]
    );
    let n = poll(
        Duration::from_secs(30),
        "the kubelet's DiskPressure",
        || {
            let n = c.json(&["get", "node", node]);
            condition(&n, "DiskPressure")
                .is_some_and(|k| k["status"] == "True")
                .then_some(n)
        },
    );
    let taints = n["spec"]["taints"].clone();
    let kubelet_log = std::fs::read_to_string(c.node_dir(node).join("kubelet.log")).unwrap();
    let reclaim = klog_lines(&kubelet_log, "Eviction manager: attempting to reclaim");
    let removed = klog_lines(&kubelet_log, "Removing image to free bytes");
    let must_evict = klog_lines(&kubelet_log, "Eviction manager: must evict pod(s)");
    let evicted = klog_lines(
        &kubelet_log,
        "Eviction manager: pod is evicted successfully",
    );
    let samples = d.sampler.samples();
    let (crossed, _) = first_below(&samples, threshold).expect("the hog crossed the threshold");
    let crossed_day = ms_of_day(crossed as u64);
    let at = |t: i64| {
        let unix = crossed + day_diff(t, crossed_day);
        (
            day_diff(t, crossed_day) as f64 / 1000.0,
            sample_at(&samples, unix).unwrap_or(0) / MI,
        )
    };
    for (what, lines) in [
        ("attempting to reclaim", &reclaim),
        ("image removed", &removed),
        ("must evict", &must_evict),
        ("pod evicted (killed)", &evicted),
    ] {
        for (t, line) in lines {
            let (s, avail) = at(*t);
            println!(
                "cluster (disk, kubelet alone): crossing → {what} {s:.3} s, available then {avail} MiB: {}",
                line.split_once("] ").map_or(line.as_str(), |(_, r)| r)
            );
        }
    }
    println!(
        "cluster (disk, kubelet alone): criguard's dry-run decision {:.3} s after the crossing (available {} MiB); lowest available {} MiB",
        (decided.at_unix_ms as i64 - crossed) as f64 / 1000.0,
        decided.available.max(0) as u64 / MI,
        lowest_since(&samples, crossed).unwrap_or(0) / MI
    );
    let tags = node_images(c, node);
    let gone: Vec<&String> = d.unused.iter().filter(|i| !tags.contains(i)).collect();
    println!(
        "cluster (disk, kubelet alone): unused images removed {}/{}; in use kept: {}; node taints {taints}",
        gone.len(),
        d.unused.len(),
        tags.contains(&d.in_use)
    );
    let events = c.json(&["-n", NS, "get", "events", "--field-selector=reason=Evicted"]);
    for e in events["items"].as_array().cloned().unwrap_or_default() {
        println!(
            "cluster (disk, kubelet alone): event {} {} {} from {}: {}",
            e["involvedObject"]["name"],
            e["type"],
            e["reason"],
            e["source"]["component"],
            e["message"]
        );
    }
    let pods = c.pods(NS);
    let failed: Vec<String> = pods
        .iter()
        .filter(|p| phase(p) == "Failed")
        .map(|p| {
            format!(
                "{} ({}: {})",
                p["metadata"]["name"], p["status"]["reason"], p["status"]["message"]
            )
        })
        .collect();
    println!("cluster (disk, kubelet alone): Failed pods {failed:#?}");
    if let Some(hog) = pods.iter().find(|p| uid(p) == hog_uid) {
        println!(
            "cluster (disk, kubelet alone): the hog's DisruptionTarget {}; node conditions DiskPressure {}, CriguardDiskPressure (dry run) {}",
            condition(hog, "DisruptionTarget").map_or(Value::Null, |c| c["reason"].clone()),
            condition(&n, "DiskPressure").map_or(Value::Null, |c| c["status"].clone()),
            condition(&n, "CriguardDiskPressure").map_or(Value::Null, |c| c["status"].clone())
        );
    }
    let report = c.evictions(node);
    assert!(report.evictions.iter().all(|e| e.dry_run));
    // The pressure clears: the kubelet's condition goes after its
    // transition period, the replacement runs.
    let t0 = Instant::now();
    poll(
        Duration::from_secs(120),
        "the kubelet's DiskPressure gone and a replacement Running",
        || {
            let n = c.json(&["get", "node", node]);
            let pressure = condition(&n, "DiskPressure").is_some_and(|k| k["status"] == "True");
            let running = c.pods(NS).iter().any(|p| {
                p["metadata"]["labels"]["app"] == "disk-hog"
                    && uid(p) != hog_uid
                    && phase(p) == "Running"
            });
            (!pressure && running).then_some(())
        },
    );
    println!(
        "cluster (disk, kubelet alone): pressure cleared and the replacement Running {:.1} s later; imagefs available {} MiB",
        t0.elapsed().as_secs_f64(),
        fs_available(&d.imagefs) / MI
    );
}

#[test]
fn imagefs_samples_give_the_crossing_and_the_level_at_a_time() {
    let s = [
        (1_000, 300),
        (1_050, 200),
        (1_100, 120),
        (1_150, 90),
        (1_200, 150),
    ];
    assert_eq!(first_below(&s, 128), Some((1_100, 120)));
    assert_eq!(first_below(&s, 50), None);
    assert_eq!(sample_at(&s, 1_149), Some(120));
    assert_eq!(sample_at(&s, 1_150), Some(90));
    assert_eq!(sample_at(&s, 900), Some(300));
    assert_eq!(sample_at(&s, 5_000), Some(150));
    assert_eq!(lowest_since(&s, 1_100), Some(90));
    assert_eq!(lowest_since(&s, 1_160), Some(150));
    assert_eq!(sample_at(&[], 1), None);
}

#[test]
fn log_lines_and_image_tags_are_read() {
    let log = "2026-11-25T18:41:28.596971Z  INFO criguard::gc::images: image GC: removed an unused image (16.0MiB)\n2026-11-25T18:41:29.000000Z  WARN x: evicting pod: y\n";
    let removed = criguard_log_lines(log, "image GC: removed");
    assert_eq!(removed.len(), 1);
    assert_eq!(removed[0].0, 67_288_596);
    let klog = "I1125 18:41:30.500000   12888 image_gc_manager.go:1] \"Removing image to free bytes\"\nW1125 x";
    assert_eq!(klog_lines(klog, "Removing image")[0].0, 67_290_500);
    let tags =
        image_tags(r#"{"images": [{"repoTags": ["a:1", "b:2"]}, {"repoTags": []}, {"id": "x"}]}"#);
    assert_eq!(tags, ["a:1", "b:2"]);
}
