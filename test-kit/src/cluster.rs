//! The cluster tier's harness, shared by `tests/it/cluster.rs` (host nodes)
//! and `tests/it/cluster_vm.rs` (the VM node): a cluster that
//! `hack/cluster.sh up` starts in a directory of the test's own and that
//! is stopped whatever happens, kubectl on it, and the pod objects and
//! manifests both tests use.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The busybox image `hack/containerd.sh` and the VM node's guest import.
pub const BUSYBOX: &str = "docker.io/library/busybox:criguard";

pub use crate::repo;

/// Polls `check` every `every` until it gives `Some`, or panics after
/// `deadline` naming `what`.
pub fn poll_every<T>(
    every: Duration,
    deadline: Duration,
    what: &str,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < end,
            "timed out after {deadline:?} waiting for {what}"
        );
        std::thread::sleep(every);
    }
}

/// [`poll_every`] 250 ms.
pub fn poll<T>(deadline: Duration, what: &str, check: impl FnMut() -> Option<T>) -> T {
    poll_every(Duration::from_millis(250), deadline, what, check)
}

/// A fresh directory name for a cluster, `/tmp/PREFIX-PID-NANOS`.
pub fn fresh_dir(prefix: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    PathBuf::from(format!("/tmp/{prefix}-{}-{nanos:x}", std::process::id()))
}

/// A cluster brought up by `hack/cluster.sh up`; dropping it prints the
/// cluster's state and logs if the test is failing, then brings it down
/// (`CRIGUARD_KEEP=1` leaves it up).
pub struct Cluster {
    /// The cluster's directory (`hack/cluster.sh up DIR`).
    pub dir: PathBuf,
    /// `DIR/cluster.env`: `NODES`, `API_SERVER`, the `UP_*_MS` timings.
    pub env: BTreeMap<String, String>,
    /// Whether a failing test's drop leaves the directory for a look
    /// (else `down --purge` removes it whatever happens).
    pub keep_files_on_failure: bool,
    kubectl: PathBuf,
}

impl Cluster {
    /// `hack/cluster.sh up DIR` with `env` set and criguard from this
    /// build; `label` starts the line that reports how long it took.
    pub fn up(dir: PathBuf, env: &[(&str, &str)], label: &str) -> Self {
        let mut cluster = Cluster {
            kubectl: dir.join("kubectl"),
            dir,
            env: BTreeMap::new(),
            keep_files_on_failure: true,
        };
        let t0 = Instant::now();
        let status = Command::new(repo().join("hack/cluster.sh"))
            .arg("up")
            .arg(&cluster.dir)
            .env("CRIGUARD_BIN", crate::criguard_bin())
            .envs(env.iter().copied())
            .status()
            .expect("run hack/cluster.sh up");
        assert!(status.success(), "hack/cluster.sh up failed: {status}");
        let text = std::fs::read_to_string(cluster.dir.join("cluster.env")).unwrap();
        for line in text.lines() {
            if let Some((k, v)) = line.split_once('=') {
                cluster.env.insert(k.into(), v.trim_matches('"').into());
            }
        }
        println!(
            "{label}: up in {:.1} s (control plane {} ms, nodes Ready {} ms after)",
            t0.elapsed().as_secs_f64(),
            cluster.env["UP_CONTROL_PLANE_MS"],
            cluster.env["UP_NODES_MS"]
        );
        cluster
    }

    /// kubectl with the admin kubeconfig, `stdin` fed to it; stdout, or the
    /// error.
    pub fn try_kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        let mut child = Command::new(&self.kubectl)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("kubectl: {e}"))?;
        let mut input = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            input.write_all(s.as_bytes()).unwrap();
        }
        drop(input);
        let out = child.wait_with_output().unwrap();
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "kubectl {args:?}: {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// kubectl's stdout; panics when it fails.
    pub fn kubectl(&self, args: &[&str]) -> String {
        self.try_kubectl(args, None)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// `kubectl apply -f -` of `yaml`; panics, showing it, when it fails.
    pub fn apply(&self, yaml: &str) {
        self.try_kubectl(&["apply", "-f", "-"], Some(yaml))
            .unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    }

    /// kubectl `args` with `-o json`, parsed.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl(&a)).unwrap()
    }

    /// The pods of `namespace`.
    pub fn pods(&self, namespace: &str) -> Vec<Value> {
        let list = self.json(&["-n", namespace, "get", "pods"]);
        list["items"].as_array().cloned().unwrap_or_default()
    }

    /// What a failing test shows: the cluster's objects, then the last
    /// lines of every host component's log (`hack/cluster.sh logs`).
    pub fn dump(&self) {
        for args in [
            &["get", "nodes", "-o", "wide"][..],
            &["get", "pods", "-A", "-o", "wide"],
            &["get", "events", "-A", "--sort-by=.lastTimestamp"],
            &["describe", "nodes"],
        ] {
            eprintln!("===== kubectl {}", args.join(" "));
            match self.try_kubectl(args, None) {
                Ok(s) | Err(s) => eprintln!("{s}"),
            }
        }
        let out = Command::new(repo().join("hack/cluster.sh"))
            .args(["logs".as_ref(), self.dir.as_os_str()])
            .env("CRIGUARD_CLUSTER_LOG_LINES", "80")
            .output();
        if let Ok(o) = out {
            eprintln!("{}", String::from_utf8_lossy(&o.stdout));
        }
    }
}

/// Whether `CRIGUARD_KEEP=1` asks to leave the cluster up.
pub fn keep() -> bool {
    std::env::var("CRIGUARD_KEEP").is_ok_and(|v| v == "1")
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let failing = std::thread::panicking();
        if failing {
            self.dump();
        }
        if keep() {
            eprintln!(
                "CRIGUARD_KEEP=1: the cluster stays up in {0}; {0}/kubectl; hack/cluster.sh down {0} --purge",
                self.dir.display()
            );
            return;
        }
        let mut cmd = Command::new(repo().join("hack/cluster.sh"));
        cmd.arg("down").arg(&self.dir);
        if failing && self.keep_files_on_failure {
            eprintln!(
                "the cluster's files stay in {} (hack/cluster.sh down --purge removes them)",
                self.dir.display()
            );
        } else {
            cmd.arg("--purge");
        }
        let _ = cmd.status();
    }
}

/// criguard's ServiceAccount, as the audit log names it.
pub const CRIGUARD_USER: &str = "system:serviceaccount:kube-system:criguard";

/// Whether audit log entry `e` is a patch of criguard's that the API
/// server completed with 200.
pub fn criguard_patched(e: &Value) -> bool {
    e["user"]["username"] == CRIGUARD_USER
        && e["verb"] == "patch"
        && e["stage"] == "ResponseComplete"
        && e["responseStatus"]["code"] == 200
}

/// The API's view of an evicted pod `p`: reason Evicted and a True
/// DisruptionTarget condition.
pub fn assert_evicted(p: &Value) {
    assert_eq!(p["status"]["reason"], "Evicted", "{p:#}");
    let dt = condition(p, "DisruptionTarget").expect("DisruptionTarget condition");
    assert_eq!(dt["status"], "True", "{dt:#}");
}

/// criguard's record of one eviction in `report`, of the pod `uid`, on the
/// memory signal and not a dry run, and no kernel OOM kill; printed after
/// `label`.
pub fn assert_one_memory_eviction(
    label: &str,
    report: &criguard::admin::EvictionsReport,
    uid: &str,
) {
    assert_eq!(report.evictions.len(), 1, "{report:#?}");
    let e = &report.evictions[0];
    assert_eq!(e.uid, uid);
    assert_eq!(e.signal, "allocatableMemory.available");
    assert!(!e.dry_run);
    assert!(report.kernel_oom_kills.is_empty(), "{report:#?}");
    println!(
        "{label}: criguard evicted {} at available {} MiB (threshold {}), usage {} MiB",
        e.pod,
        e.available >> 20,
        e.threshold,
        e.usage >> 20
    );
}

/// Polls `pod` until it is Failed with reason Evicted, as criguard leaves
/// an evicted pod, or panics after `deadline` naming `what`. The kubelet's
/// first Failed status carries no reason (for up to about a second, until
/// criguard writes its own again, `src/kube/reassert.rs`): the pod and the
/// polls that saw Failed without the reason.
pub fn poll_evicted(
    deadline: Duration,
    what: &str,
    mut pod: impl FnMut() -> Option<Value>,
) -> (Value, usize) {
    let mut blank = 0;
    let p = poll(deadline, what, || {
        let p = pod()?;
        if phase(&p) != "Failed" {
            return None;
        }
        if p["status"]["reason"] != "Evicted" {
            blank += 1;
            return None;
        }
        Some(p)
    });
    (p, blank)
}

/// The pod's `status.phase` ("" if none yet).
pub fn phase(p: &Value) -> &str {
    p["status"]["phase"].as_str().unwrap_or("")
}

/// The object's `metadata.uid`.
pub fn uid(p: &Value) -> &str {
    p["metadata"]["uid"].as_str().unwrap_or("")
}

/// The object's status condition of type `kind`.
pub fn condition<'a>(obj: &'a Value, kind: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

/// Whether the node `n` carries criguard's NoSchedule taint `key`.
pub fn tainted(n: &Value, key: &str) -> bool {
    n["spec"]["taints"].as_array().is_some_and(|t| {
        t.iter()
            .any(|t| t["key"] == key && t["effect"] == "NoSchedule")
    })
}

/// Asserts that the node `n` shows criguard's `condition` True and its
/// NoSchedule taint `key`; `when` names the moment in the failure message.
pub fn assert_pressure_marked(n: &Value, condition_type: &str, key: &str, when: &str) {
    let cond = condition(n, condition_type)
        .unwrap_or_else(|| panic!("{when}: no {condition_type} on the node"));
    assert_eq!(cond["status"], "True", "{when}: {cond:#}");
    assert!(tainted(n, key), "{when}: taints {}", n["spec"]["taints"]);
}

/// A test pod in `namespace` on `node`: busybox `sleep`, host network,
/// never pulled; `extra_spec` is spec lines (two spaces indented, each
/// ending in a newline), `annotations` the inside of a flow mapping.
pub fn pod_yaml(
    namespace: &str,
    name: &str,
    node: &str,
    resources: &str,
    extra_spec: &str,
    annotations: &str,
) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {namespace}
  annotations: {{{annotations}}}
spec:
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  hostNetwork: true
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 2
{extra_spec}  containers:
  - name: app
    image: {BUSYBOX}
    imagePullPolicy: Never
    command: ["sleep", "3600"]
    resources: {resources}
"#
    )
}

/// A Deployment `hog` in `namespace` (replicas 1, BestEffort, on `node`)
/// whose pod grows by 10 MiB of anonymous memory every `step` (a `sleep`
/// argument, seconds); its replacements find the marker it leaves in
/// `state` (a directory on the node) and only sleep.
pub fn hog_yaml(namespace: &str, node: &str, state: &str, step: &str) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: hog, namespace: {namespace}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: hog}}}}
  template:
    metadata: {{labels: {{app: hog}}}}
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
        volumeMounts: [{{name: state, mountPath: /state}}]
        command:
        - sh
        - -c
        - |
          if [ -e /state/grown ]; then exec sleep 3600; fi
          touch /state/grown
          exec awk 'BEGIN {{ for (i = 0; ; i++) {{ m[i] = sprintf("%10485760s", i); system("sleep {step}") }} }}'
"#
    )
}
