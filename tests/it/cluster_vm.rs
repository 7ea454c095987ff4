//! The cluster tier's VM node: a real control plane on this host
//! (`hack/cluster.sh up`, with its host node) and a second node in the VM
//! tier's machine (`hack/cluster/vm-node.sh up`): systemd as PID 1, cgroup
//! v2, containerd 2 with the systemd cgroup driver, criguard installed from
//! its Debian package (`hack/deb.sh`, `dpkg -i`: the package enables and
//! starts its socket and service) and the kubelet v1.37.2, all as systemd
//! units, the
//! kubelet dialling containerd (`CRIGUARD_VMNODE_KUBELET_RUNTIME=containerd`:
//! a node criguard has yet to adopt). The guest reaches the API server only
//! through QEMU's user network with `restrict=on` and a guestfwd to the API
//! server's loopback port.
//!
//! What it checks, through kubectl and, in the guest, criguard's admin
//! socket and metrics (`vm-node.sh exec`):
//! - the VM node registers and becomes Ready with kubelet v1.37.2 and
//!   runtime `containerd://2.3.7`, every unit active, and runs a pod with
//!   the kubelet on containerd's socket, no call of its through criguard;
//! - `criguard adopt --dry-run` prints the change of the kubelet's config
//!   file (`containerRuntimeEndpoint`) and changes nothing (the file, no
//!   backup, the same kubelet process); `criguard adopt` says criguard
//!   answered, backs the file up, rewrites it and restarts the kubelet: the
//!   restarted kubelet posts the node Ready, its CRI calls are relayed by
//!   criguard (its metrics), the pod started before keeps its container and
//!   criguard's model has it;
//! - a pod scheduled to the VM node runs, in the systemd driver's slices
//!   under `kubepods.slice`, and criguard's model has it;
//! - one memory eviction there: a BestEffort Deployment pod grows until
//!   criguard (before the kubelet, whose threshold is lower) evicts it; the
//!   API shows it Failed/Evicted with a DisruptionTarget condition,
//!   criguard's node condition and taint appear; a Guaranteed pod beside
//!   it keeps running; no kernel OOM kill;
//! - criguard restarted 20 times by `systemctl restart` under the running
//!   kubelet while pods churn (`hack/vm/criguard-restarts.sh` in the guest,
//!   pods created and deleted through the API): the node stays Ready (its
//!   Ready condition never changes, no NodeNotReady event), the running
//!   pods keep their containers (same IDs, restartCount 0), every churned
//!   pod runs and goes, systemd counts 20 starts and no failure; the
//!   kubelet's CRI errors are compared with a churn window without
//!   restarts: each restart hands over (the unit's `ExecStop=`), no call
//!   dropped by criguard (refused, reset, cut in flight) and none failed
//!   because the kubelet gave up waiting for the socket;
//! - criguard's package upgraded as many times as restarted (`dpkg -i` of
//!   the package rebuilt as a newer version each time: its postinst reloads
//!   the service, a handoff to the binary dpkg put in place) under the same
//!   churn, with the same checks and no start by systemd at all;
//! - criguard restarted during the memory pressure (as soon as its metrics
//!   show the signal under the threshold, the eviction under way) and again
//!   right after the eviction, within the transition period: the hog is
//!   evicted once, by criguard; the condition and taint hold across both
//!   restarts and go
//!   one transition period after the last observed pressure (the guest's
//!   clock: pressure.json and criguard's journal), the taint set and
//!   removed once (audit log); the evicted pod's status stays criguard's
//!   and `criguard evictions` still lists the eviction;
//! - `criguard adopt --undo`: the kubelet's config file as it was, byte for
//!   byte, no backup left, the kubelet restarted on containerd's socket
//!   (no further call through criguard), the node Ready again and the
//!   test's running pods with the same containers;
//! - then criguard as the DaemonSet of `deploy/` in NRI mode, installed,
//!   evicting, rolled to a new image and removed by kubectl alone
//!   ([`daemonset`]).
//!
//! It prints the VM's start to node Ready, the pod's start latency and the
//! whole test's time. Everything is stopped whatever happens (the VM first,
//! then `hack/cluster.sh down --purge`; `CRIGUARD_KEEP=1` leaves it all up);
//! on failure the cluster's state, every component's log and the guest's
//! journal are printed. Needs root, QEMU (`hack/vm.sh deps`), socat and the
//! binaries of `hack/k8s/build.sh`.

mod daemonset;

use crate::common::cluster as cluster_support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use cluster_support::{
    Cluster, assert_evicted, assert_one_memory_eviction, condition, criguard_patched, fresh_dir,
    hog_yaml, phase, pod_yaml, poll_evicted, repo, tainted, uid,
};
use serde_json::Value;

/// Namespace of the test's pods.
const NS: &str = "criguard-vm-test";
/// The VM node's name (`CRIGUARD_VMNODE_NAME`'s default).
const NODE: &str = "vm-node";
/// criguard's admin socket in the guest (systemd/criguard.service).
const ADMIN: &str = "/run/criguard/admin.sock";
/// Under TCG the guest is several times slower than the host: every wait on
/// it gets this long.
const GUEST_DEADLINE: Duration = Duration::from_secs(300);
/// How often a wait on the guest looks again (kubectl and `vm-node.sh exec`
/// cost the slow guest and the 2-core host alike).
const EVERY: Duration = Duration::from_millis(500);
/// `systemctl restart criguard` under the running kubelet, this many times:
/// 20 (the scenario), or `CRIGUARD_CLUSTER_VM_RESTARTS` (CI runs 5: each
/// restart costs about 7 s under TCG).
fn restarts() -> usize {
    std::env::var("CRIGUARD_CLUSTER_VM_RESTARTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(20)
}
/// How many restarts one `vm-node.sh exec` asks for.
const RESTART_CHUNK: usize = 5;
/// The guest's restart script (`vm-node.sh exec` runs it in the repository).
const RESTART_SCRIPT: &str = "hack/vm/criguard-restarts.sh";
/// The pressure transition period, ms (`CRIGUARD_VMNODE_TRANSITION`'s default).
const TRANSITION_MS: i64 = 30_000;
/// How much earlier than [`TRANSITION_MS`] after the last observed pressure
/// criguard's taint may go (pressure.json is written a little after the
/// observation it records).
const EARLY_MS: i64 = 2_000;
/// How much later: criguard's housekeeping round (10 s) that ends the
/// period, the API write under TCG.
const LATE_MS: i64 = 15_000;
/// How long the kubelet's CRI client waits for a new connection to answer
/// (k8s.io/cri-client's `minConnectionTimeout`, gRPC's MinConnectTimeout):
/// a restart whose socket stays unanswered longer fails the calls queued
/// meanwhile with Unavailable ("error reading server preface").
const KUBELET_CONNECT_TIMEOUT_MS: u64 = 5_000;
/// The kubelet's configuration file in the guest (hack/vm/cluster-node.sh).
const KUBELET_CONFIG: &str = "/etc/kubernetes/kubelet.yaml";
/// criguard's CRI socket, as the kubelet dials it.
const CRIGUARD_SOCK: &str = "unix:///run/criguard/criguard.sock";
/// containerd's, as the kubelet dials it before the adoption and after
/// its undo.
const CONTAINERD_SOCK: &str = "unix:///run/containerd/containerd.sock";
/// Where `criguard adopt` keeps its backup and record (its default).
const ADOPT_DIR: &str = "/var/lib/criguard/adopt";

/// [`cluster_support::poll_every`] [`EVERY`].
fn poll<T>(deadline: Duration, what: &str, check: impl FnMut() -> Option<T>) -> T {
    cluster_support::poll_every(EVERY, deadline, what, check)
}

/// The VM node of the cluster in `dir` (`hack/cluster/vm-node.sh`); dropped
/// before the [`Cluster`], it stops the VM and, if the test is failing,
/// prints the VM's logs (the guest's journal included, once it has stopped).
struct VmNode {
    dir: PathBuf,
    /// `vm-node/times.env`: milliseconds from `vm-node.sh up`'s start.
    times: BTreeMap<String, u64>,
}

impl VmNode {
    /// `hack/cluster/vm-node.sh up`: boots the VM node, its kubelet dialling
    /// `runtime` (`criguard` or `containerd`), and waits until it is Ready;
    /// stopped again if that fails.
    fn up(cluster: &Cluster, runtime: &str) -> Self {
        let mut node = VmNode {
            dir: cluster.dir.clone(),
            times: BTreeMap::new(),
        };
        let status = node
            .script(&["up"])
            .env("CRIGUARD_VMNODE_KUBELET_RUNTIME", runtime)
            .status()
            .expect("run vm-node.sh up");
        assert!(
            status.success(),
            "hack/cluster/vm-node.sh up failed: {status}"
        );
        let text = std::fs::read_to_string(node.dir.join("vm-node/times.env")).unwrap();
        node.times = text
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once('=')?;
                Some((k.to_owned(), v.parse().ok()?))
            })
            .collect();
        node
    }

    fn script(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(repo().join("hack/cluster/vm-node.sh"));
        cmd.arg(args[0])
            .arg(&self.dir)
            .args(&args[1..])
            .env("CRIGUARD_BIN", env!("CARGO_BIN_EXE_criguard"))
            // A VM the test leaves behind (killed) powers off after this.
            .env("CRIGUARD_VMNODE_LIFETIME", "1200");
        cmd
    }

    /// `script` run by bash in the guest as root (`vm-node.sh exec`): its
    /// output, or the output and status when it fails.
    fn try_guest(&self, script: &str) -> Result<String, String> {
        let out = self
            .script(&["exec", script])
            .output()
            .expect("run vm-node.sh exec");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(stdout)
        } else {
            Err(format!(
                "{}: {stdout}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    fn guest(&self, script: &str) -> String {
        self.try_guest(script)
            .unwrap_or_else(|e| panic!("in the guest: {script}: {e}"))
    }

    /// `criguard pods --json` of the guest's criguard.
    fn model(&self) -> Vec<criguard::model::Pod> {
        let out = self.guest(&format!("criguard pods --json --admin-socket {ADMIN}"));
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("criguard pods --json: {e}: {out}"))
    }

    /// `criguard evictions --json` of the guest's criguard.
    fn evictions(&self) -> criguard::admin::EvictionsReport {
        let out = self.guest(&format!("criguard evictions --json --admin-socket {ADMIN}"));
        serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("criguard evictions --json: {e}: {out}"))
    }

    /// The guest criguard's metrics, as text.
    fn metrics(&self) -> String {
        self.guest(
            "exec 3<>/dev/tcp/127.0.0.1/9809; printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3",
        )
    }

    /// What `criguard adopt` may change, in one request: the kubelet's
    /// config file, the backup directory's entries and the kubelet's pid.
    fn adoption_state(&self) -> String {
        self.guest(&format!(
            "cat {KUBELET_CONFIG}; echo '--- {ADOPT_DIR}'; ls -A {ADOPT_DIR} 2>/dev/null; \
             echo '--- kubelet.service'; systemctl show -p MainPID --value kubelet.service"
        ))
    }
}

/// How many calls of `method` (`RunPodSandbox`, `ListPodSandbox`) criguard
/// relayed, whatever their answer, from its `metrics`.
fn relayed(metrics: &str, method: &str) -> f64 {
    let label = format!("/{method}\"");
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("criguard_cri_request_duration_seconds_count") && l.contains(&label)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The kubelet's pid, the last part of [`VmNode::adoption_state`].
fn kubelet_pid(state: &str) -> u64 {
    let pid = state.rsplit("--- kubelet.service").next().unwrap_or("");
    pid.trim()
        .parse()
        .unwrap_or_else(|e| panic!("the kubelet's MainPID: {e}: {state}"))
}

/// Polls until the VM node is Ready in a status the kubelet posted at
/// `since_s` (the guest's clock, seconds since the epoch) or later: a
/// restarted kubelet's first status. How long that took.
fn ready_posted_since(c: &Cluster, since_s: i64, what: &str) -> Duration {
    let t = Instant::now();
    poll(GUEST_DEADLINE, what, || {
        let n = c.json(&["get", "node", NODE]);
        let ready = condition(&n, "Ready")?;
        let at = rfc3339_s(ready["lastHeartbeatTime"].as_str()?);
        (ready["status"] == "True" && at >= since_s).then_some(())
    });
    t.elapsed()
}

/// `criguard adopt`, a dry run first, on the VM node whose kubelet dials
/// containerd and runs `pod` (a Running pod, as the API shows it): the
/// dry run changes nothing; the adoption says criguard answered, backs up
/// and rewrites the kubelet's config file and restarts the kubelet, whose
/// calls then go through criguard, the node Ready, `pod`'s container the
/// same and in criguard's model. The kubelet's config file from before.
fn adopt(c: &Cluster, vm: &VmNode, pod: &Value) -> String {
    let before = vm.adoption_state();
    let original = before.split("--- ").next().unwrap_or_default().to_owned();
    let old_line = format!("containerRuntimeEndpoint: {CONTAINERD_SOCK}\n");
    let new_line = format!("containerRuntimeEndpoint: {CRIGUARD_SOCK}\n");
    assert!(
        original.contains(&old_line) && original.contains("cgroupDriver: systemd"),
        "the kubelet's config before the adoption: {original}"
    );
    // Nothing of the kubelet's went through criguard yet (its PLEG lists
    // the sandboxes every second).
    let metrics = vm.metrics();
    assert_eq!(
        relayed(&metrics, "ListPodSandbox"),
        0.0,
        "criguard relayed ListPodSandbox before the adoption"
    );
    let change = format!("{KUBELET_CONFIG}: {CONTAINERD_SOCK} -> {CRIGUARD_SOCK}\n");
    let diff = format!("- {old_line}+ {new_line}");

    // The dry run: the change printed, nothing else.
    let t = Instant::now();
    let dry = vm.guest("criguard adopt --dry-run");
    let dry_s = t.elapsed().as_secs_f64();
    assert!(
        dry.contains(&change)
            && dry.contains(&diff)
            && dry.contains("dry run: nothing written, nothing restarted"),
        "criguard adopt --dry-run: {dry}"
    );
    assert_eq!(
        vm.adoption_state(),
        before,
        "criguard adopt --dry-run changed something"
    );

    // The adoption.
    let since_s = guest_ms(vm) / 1000;
    let t = Instant::now();
    let out = vm.guest("criguard adopt");
    let adopt_s = t.elapsed().as_secs_f64();
    let backup = format!("{ADOPT_DIR}/etc_kubernetes_kubelet.yaml.orig");
    let at = |what: &str| {
        out.find(what)
            .unwrap_or_else(|| panic!("criguard adopt did not say {what:?}: {out}"))
    };
    // In this order: the change, criguard answering, the backup, the restart.
    let steps = [
        at(&change),
        at(&diff),
        at(&format!("{CRIGUARD_SOCK} answers (containerd ")),
        at(&format!("backup: {backup}\n")),
        at("kubelet.service restarted"),
    ];
    assert!(steps.is_sorted(), "criguard adopt's steps: {out}");
    let after = vm.adoption_state();
    assert_eq!(
        after.split("--- ").next().unwrap_or_default(),
        original.replace(&old_line, &new_line),
        "the kubelet's config after the adoption"
    );
    assert!(
        after.contains(&format!(
            "--- {ADOPT_DIR}\nadopt.json\netc_kubernetes_kubelet.yaml.orig\n"
        )),
        "the backup directory: {after}"
    );
    assert_ne!(
        kubelet_pid(&after),
        kubelet_pid(&before),
        "the kubelet not restarted"
    );
    assert_eq!(vm.guest(&format!("cat {backup}")), original, "the backup");
    let record: Value =
        serde_json::from_str(&vm.guest(&format!("cat {ADOPT_DIR}/adopt.json"))).unwrap();
    assert_eq!(
        (&record["path"], &record["old"], &record["new"]),
        (
            &Value::from(KUBELET_CONFIG),
            &Value::from(CONTAINERD_SOCK),
            &Value::from(CRIGUARD_SOCK)
        ),
        "{record:#}"
    );

    // The restarted kubelet: the node Ready, its calls through criguard.
    let ready = ready_posted_since(c, since_s, "the node Ready from the adopted kubelet");
    let t_relayed = Instant::now();
    let listed = poll(
        GUEST_DEADLINE,
        "the kubelet's ListPodSandbox relayed by criguard",
        || {
            let n = relayed(&vm.metrics(), "ListPodSandbox");
            (n > 0.0).then_some(n)
        },
    );
    let relayed_s = t_relayed.elapsed().as_secs_f64();
    // The pod the kubelet started on containerd runs on, and criguard's
    // model has it (read from containerd, not from a call it relayed).
    let name = pod["metadata"]["name"].as_str().unwrap();
    let now = c
        .pods(NS)
        .into_iter()
        .find(|p| uid(p) == uid(pod))
        .unwrap_or_else(|| panic!("{name} gone after the adoption"));
    assert_eq!(phase(&now), "Running", "{now:#}");
    assert_eq!(
        now["status"]["containerStatuses"], pod["status"]["containerStatuses"],
        "{name}'s containers after the adoption"
    );
    let model = vm.model();
    assert!(
        model
            .iter()
            .any(|p| p.uid == uid(pod) && p.containers.len() == 1),
        "criguard's model lacks {name}: {model:#?}"
    );
    println!(
        "cluster-vm: criguard adopt --dry-run {dry_s:.1} s; criguard adopt {adopt_s:.1} s (criguard answered, kubelet.yaml backed up, kubelet restarted), node Ready from the restarted kubelet {:.1} s later, its ListPodSandbox through criguard {relayed_s:.1} s after that ({listed} calls)",
        ready.as_secs_f64()
    );
    original
}

/// `criguard adopt --undo` at the end: the kubelet's config file is
/// `original` again, no backup left, the kubelet restarted on containerd's
/// socket (no further call of its through criguard), the node Ready again
/// and the test's running pods (not the hog's) with the same containers.
fn undo(c: &Cluster, vm: &VmNode, original: &str) {
    let before = vm.adoption_state();
    // The test's own pods (the hog's Deployment still replaces its pods
    // after the eviction: those come and go).
    let ours = |c: &Cluster| {
        let mut pods = containers(c);
        pods.retain(|name, _| !name.starts_with("hog-"));
        pods
    };
    let pods = ours(c);
    assert_eq!(
        pods.keys().map(String::as_str).collect::<Vec<_>>(),
        ["before-adoption", "guaranteed", "sleeper"],
        "the pods running before the undo"
    );
    let since_s = guest_ms(vm) / 1000;
    let t = Instant::now();
    let out = vm.guest("criguard adopt --undo");
    let undo_s = t.elapsed().as_secs_f64();
    assert!(
        out.contains(&format!(
            "{KUBELET_CONFIG}: {CRIGUARD_SOCK} -> {CONTAINERD_SOCK}"
        )) && out.contains("kubelet.service restarted"),
        "criguard adopt --undo: {out}"
    );
    let after = vm.adoption_state();
    assert_eq!(
        after.split("--- ").next().unwrap_or_default(),
        original,
        "the kubelet's config after the undo"
    );
    assert!(
        after.contains(&format!("--- {ADOPT_DIR}\n--- kubelet.service")),
        "the backup directory after the undo: {after}"
    );
    assert_ne!(
        kubelet_pid(&after),
        kubelet_pid(&before),
        "the kubelet not restarted"
    );
    // From here the kubelet's PLEG lists every second, on containerd.
    let listed = relayed(&vm.metrics(), "ListPodSandbox");
    let ready = ready_posted_since(c, since_s, "the node Ready from the kubelet on containerd");
    let now = ours(c);
    assert_eq!(now, pods, "the running pods' containers across the undo");
    let listed_after = relayed(&vm.metrics(), "ListPodSandbox");
    assert_eq!(
        listed_after, listed,
        "the kubelet's ListPodSandbox still relayed by criguard after the undo"
    );
    println!(
        "cluster-vm: criguard adopt --undo {undo_s:.1} s, node Ready from the kubelet on containerd {:.1} s later, {} pods running on with the same containers",
        ready.as_secs_f64(),
        now.len()
    );
}

impl Drop for VmNode {
    fn drop(&mut self) {
        if cluster_support::keep() {
            eprintln!(
                "CRIGUARD_KEEP=1: the VM node stays up: hack/cluster/vm-node.sh exec {0} CMD; \
                 hack/cluster/vm-node.sh down {0} before hack/cluster.sh down {0} --purge",
                self.dir.display()
            );
            return;
        }
        let _ = self.script(&["down"]).status();
        if std::thread::panicking()
            && let Ok(o) = self
                .script(&["logs"])
                .env("CRIGUARD_VMNODE_LOG_LINES", "150")
                .output()
        {
            eprintln!(
                "===== hack/cluster/vm-node.sh logs\n{}",
                String::from_utf8_lossy(&o.stdout)
            );
        }
    }
}

/// RFC 3339 UTC seconds (`2026-11-25T16:41:02Z`) as seconds since the epoch.
fn rfc3339_s(t: &str) -> i64 {
    let n = |r: std::ops::Range<usize>| t[r].parse::<i64>().unwrap();
    let (y, mo, d) = (n(0..4), n(5..7), n(8..10));
    // Days from civil (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    days * 86_400 + n(11..13) * 3600 + n(14..16) * 60 + n(17..19)
}

/// A busybox pod on the VM node: host network, never pulled.
fn vm_pod_yaml(name: &str, resources: &str) -> String {
    pod_yaml(NS, name, NODE, resources, "", "")
}

/// The VM node joins through criguard, runs a pod, and criguard evicts a
/// memory hog there, as described in the module documentation.
#[test]
fn vm_node_joins_through_criguard_and_criguard_evicts_the_memory_hog() {
    // SAFETY: geteuid has no preconditions.
    assert!(
        unsafe { libc::geteuid() } == 0,
        "the cluster tier's VM node needs root: run it with hack/test.sh"
    );
    let t_test = Instant::now();
    let mut c = Cluster::up(fresh_dir("cgv"), &[], "cluster-vm");
    // Whatever happens, down --purge: the VM node's share is large.
    c.keep_files_on_failure = false;
    let (vm, vm_ready) = the_node_joins(&c);

    // criguard adopt: a node with a pod the kubelet runs on containerd.
    c.kubectl(&["create", "namespace", NS]);
    c.apply(&vm_pod_yaml("before-adoption", "{}"));
    let unadopted = poll(GUEST_DEADLINE, "a pod Running before the adoption", || {
        c.pods(NS)
            .into_iter()
            .find(|p| p["metadata"]["name"] == "before-adoption" && phase(p) == "Running")
    });
    let t_adopt = Instant::now();
    let kubelet_config = adopt(&c, &vm, &unadopted);
    let adoption = t_adopt.elapsed();

    let pod_running = a_pod_on_the_vm_node(&c, &vm);
    let (ready, restart_failures, upgrade_failures) = restarts_and_upgrades_under_churn(&c, &vm);
    let hog_uid = eviction_with_a_restart_at_the_pressure(&c, &vm);
    restart_within_the_transition_period(&c, &vm, &hog_uid, &ready);

    // criguard adopt --undo.
    let t_undo = Instant::now();
    undo(&c, &vm, &kubelet_config);
    let undone = t_undo.elapsed();

    // criguard as the DaemonSet of deploy/, in NRI mode.
    let ds = daemonset::the_daemonset(&c, &vm);
    println!(
        "cluster-vm: VM node Ready {:.1} s, pod start {:.1} s, adoption {:.1} s, undo {:.1} s, whole test {:.1} s (before teardown)",
        vm_ready.as_secs_f64(),
        pod_running.as_secs_f64(),
        adoption.as_secs_f64(),
        undone.as_secs_f64(),
        t_test.elapsed().as_secs_f64()
    );
    println!(
        "cluster-vm: DaemonSet (NRI mode) Ready {:.1} s after kubectl apply -k, hog evicted {:.1} s after it was applied, rolled to a new tag in {:.1} s, removed in {:.1} s",
        ds.install.as_secs_f64(),
        ds.eviction.as_secs_f64(),
        ds.upgrade.as_secs_f64(),
        ds.removal.as_secs_f64()
    );
    assert!(
        restart_failures.is_empty(),
        "criguard's {} restarts under pod churn:\n{}",
        restarts(),
        restart_failures.join("\n")
    );
    assert!(
        upgrade_failures.is_empty(),
        "criguard's {} upgrades (handoffs) under pod churn:\n{}",
        restarts(),
        upgrade_failures.join("\n")
    );
}

/// The VM node comes up through criguard and joins: the versions, Ready,
/// its address; in the guest systemd runs every part, on cgroup v2, the
/// kubelet with the systemd driver. The node and how long it took.
fn the_node_joins(c: &Cluster) -> (VmNode, Duration) {
    let t_vm = Instant::now();
    let vm = VmNode::up(c, "containerd");
    let times = &vm.times;
    let vm_ready = t_vm.elapsed();
    let n = c.json(&["get", "node", NODE]);
    let info = &n["status"]["nodeInfo"];
    assert_eq!(
        info["containerRuntimeVersion"], "containerd://2.3.7",
        "{info:#}"
    );
    assert_eq!(info["kubeletVersion"], "v1.37.2", "{info:#}");
    assert_eq!(
        condition(&n, "Ready").map(|r| r["status"].clone()),
        Some("True".into())
    );
    let addresses = n["status"]["addresses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        addresses
            .iter()
            .any(|a| a["type"] == "InternalIP" && a["address"] == "10.0.2.15"),
        "{addresses:?}"
    );
    println!(
        "cluster-vm: {NODE} Ready {:.1} s after vm-node.sh up (guest set up after {} ms), kubelet {}, runtime {}, kernel {}, allocatable memory {}",
        vm_ready.as_secs_f64(),
        times["VMNODE_SETUP_MS"],
        info["kubeletVersion"],
        info["containerRuntimeVersion"],
        info["kernelVersion"],
        n["status"]["allocatable"]["memory"]
    );

    // In the guest: systemd runs every part, on cgroup v2, the kubelet with
    // the systemd driver and containerd's socket as its runtime.
    let units = vm.guest(
        "systemctl is-active containerd.service criguard.socket criguard.service kubelet.service",
    );
    assert_eq!(
        units.split_whitespace().collect::<Vec<_>>(),
        ["active"; 4],
        "containerd, criguard.socket, criguard, kubelet: {units}"
    );
    assert_eq!(vm.guest("stat -fc %T /sys/fs/cgroup").trim(), "cgroup2fs");
    (vm, vm_ready)
}

/// A pod on the VM node: Running, in criguard's model in the systemd
/// driver's slices, its calls relayed by criguard. How long it took.
fn a_pod_on_the_vm_node(c: &Cluster, vm: &VmNode) -> Duration {
    let t_pod = Instant::now();
    c.apply(&vm_pod_yaml("sleeper", "{}"));
    let sleeper = poll(GUEST_DEADLINE, "the sleeper Running on the VM node", || {
        c.pods(NS)
            .into_iter()
            .find(|p| p["metadata"]["name"] == "sleeper" && phase(p) == "Running")
    });
    let pod_running = t_pod.elapsed();
    assert_eq!(sleeper["spec"]["nodeName"], NODE);
    // The API's own view: pod created → container started (seconds).
    let created = rfc3339_s(sleeper["metadata"]["creationTimestamp"].as_str().unwrap());
    let started = rfc3339_s(
        sleeper["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
            .as_str()
            .unwrap(),
    );
    println!(
        "cluster-vm: pod Running {:.1} s after kubectl apply (container started {} s after the pod was created, API clock)",
        pod_running.as_secs_f64(),
        started - created
    );

    // criguard in the guest has it, in the systemd driver's slices.
    let model = vm.model();
    let mp = model
        .iter()
        .find(|p| p.uid == uid(&sleeper))
        .unwrap_or_else(|| panic!("criguard's model lacks the sleeper: {model:#?}"));
    assert_eq!(format!("{:?}", mp.qos), "BestEffort");
    assert_eq!(mp.state, criguard::model::SandboxState::Ready);
    assert_eq!(mp.containers.len(), 1, "{mp:#?}");
    let slice = format!(
        "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice",
        uid(&sleeper).replace('-', "_")
    );
    assert_eq!(mp.cgroup_parent, slice, "{mp:#?}");
    let container = mp.containers.values().next().unwrap();
    assert!(
        container.cgroup_path.starts_with(&slice) && container.cgroup_path.ends_with(".scope"),
        "{container:#?}"
    );
    // The kubelet's calls went through criguard.
    let metrics = vm.metrics();
    let relayed = relayed(&metrics, "RunPodSandbox");
    assert!(
        relayed >= 1.0,
        "no RunPodSandbox relayed by criguard:\n{metrics}"
    );
    println!(
        "cluster-vm: criguard's model has the sleeper ({}), RunPodSandbox calls relayed: {relayed}",
        mp.cgroup_parent
    );
    pod_running
}

/// criguard restarted and upgraded under pod churn, against a baseline
/// window without restarts: the node's Ready since, and the failures of
/// each (reported once the eviction scenario has run too).
fn restarts_and_upgrades_under_churn(
    c: &Cluster,
    vm: &VmNode,
) -> (String, Vec<String>, Vec<String>) {
    c.apply(&vm_pod_yaml(
        "guaranteed",
        "{requests: {cpu: 50m, memory: 64Mi}, limits: {cpu: 50m, memory: 64Mi}}",
    ));
    poll(GUEST_DEADLINE, "the Guaranteed pod Running", || {
        c.pods(NS)
            .into_iter()
            .find(|p| p["metadata"]["name"] == "guaranteed" && phase(p) == "Running")
    });
    let ready = ready_since(c);
    let before = containers(c);
    assert_eq!(
        before.len(),
        3,
        "before-adoption, sleeper and guaranteed: {before:?}"
    );
    // A window of the same churn without restarts: the CRI errors the
    // kubelet logs anyway (NotFound for a container it is deleting).
    let t_window = Instant::now();
    let since = vm.guest(&format!("{RESTART_SCRIPT} now")).trim().to_owned();
    let (cycles, _) = churn(c, vm, None, 2, &ready);
    let baseline = Report::parse(&vm.guest(&format!("{RESTART_SCRIPT} report {since}")));
    let baseline_codes = baseline.codes();
    println!(
        "cluster-vm: baseline window (no restart): {cycles} churn cycles in {:.1} s, kubelet CRI errors {} {baseline_codes:?}, criguard starts {}",
        t_window.elapsed().as_secs_f64(),
        baseline.cri_errors.len(),
        baseline.starts
    );
    assert_eq!(
        baseline.starts, 0,
        "criguard started in the baseline window"
    );
    // Its failures are reported after the eviction scenario has run too.
    let restart_failures = restarts_under_churn(c, vm, &ready, &before, &baseline);
    let upgrade_failures = upgrades_under_churn(c, vm, &ready, &before, &baseline);
    (ready, restart_failures, upgrade_failures)
}

/// A BestEffort Deployment pod that grows to 200 MiB at once, then 10 MiB
/// every 2 s; its replacement finds the marker on the node and only
/// sleeps. Between criguard's threshold (250Mi available) and the
/// kubelet's (100Mi) it grows for 30 s: room for a restart under TCG
/// and criguard's seconds to act.
/// criguard is restarted as soon as its metrics show the pressure, and
/// evicts it; its condition and taint are set, the kubelet's are not.
/// The hog's UID.
fn eviction_with_a_restart_at_the_pressure(c: &Cluster, vm: &VmNode) -> String {
    let fast = hog_yaml(NS, NODE, "/var/lib/criguard-vm-test/hog", "2");
    let hog = fast.replace(r#"system("sleep 2")"#, r#"if (i >= 20) system("sleep 2")"#);
    assert_ne!(hog, fast, "the hog's growth loop changed: {fast}");
    let t_hog = Instant::now();
    let (hog_uid, at_pressure) = std::thread::scope(|s| {
        // The guest restarts criguard as soon as its metrics show the
        // pressure (the guest serves one request at a time: nothing else
        // asks it meanwhile).
        let watcher = s.spawn(|| vm.try_guest(&format!("{RESTART_SCRIPT} on-pressure 240")));
        c.apply(&hog);
        let first = poll(GUEST_DEADLINE, "the hog Running", || {
            c.pods(NS)
                .into_iter()
                .find(|p| p["metadata"]["labels"]["app"] == "hog" && phase(p) == "Running")
        });
        println!(
            "cluster-vm: hog Running {:.1} s after it was applied",
            t_hog.elapsed().as_secs_f64()
        );
        let out = watcher
            .join()
            .unwrap()
            .unwrap_or_else(|e| panic!("{RESTART_SCRIPT} on-pressure: {e}"));
        (uid(&first).to_owned(), out)
    });
    let pressure_line = at_pressure.lines().find(|l| l.starts_with("pressure "));
    let restart = parse_restarts(&at_pressure);
    assert_eq!(restart.len(), 1, "{at_pressure}");
    println!(
        "cluster-vm: criguard restarted {:.1} s after the hog was applied, at {} (available, threshold), answering {} ms later",
        t_hog.elapsed().as_secs_f64(),
        pressure_line.unwrap_or("?"),
        restart[0].ms
    );
    let (evicted, blank) = poll_evicted(GUEST_DEADLINE, "the hog Failed/Evicted", || {
        c.pods(NS).into_iter().find(|p| uid(p) == hog_uid)
    });
    println!(
        "cluster-vm: hog evicted {:.1} s after it was applied (Failed without a reason in {blank} polls before)",
        t_hog.elapsed().as_secs_f64()
    );
    assert_evicted(&evicted);

    // criguard's node condition and taint (the pressure lasts the transition
    // period, 30 s, after the eviction).
    let n = poll(
        Duration::from_secs(20),
        "criguard's condition and taint",
        || {
            let n = c.json(&["get", "node", NODE]);
            (pressure_reported(&n) == (true, true)).then_some(n)
        },
    );
    // Not the kubelet's eviction: its own MemoryPressure never went True.
    assert_ne!(
        condition(&n, "MemoryPressure").map(|m| m["status"].clone()),
        Some("True".into()),
        "the kubelet saw memory pressure too"
    );
    hog_uid
}

/// criguard restarted again, at once, within the transition period: the
/// condition and taint stay, the eviction record too, and they go one
/// transition period after the last observed pressure, set and removed
/// once; the evicted pod stays Failed and the node Ready.
fn restart_within_the_transition_period(c: &Cluster, vm: &VmNode, hog_uid: &str, ready: &str) {
    // One request: when the pressure was last observed (pressure.json),
    // then the restart, each with the guest's clock.
    let out = vm.guest(&format!(
        "tr -d '\\n' </var/lib/criguard/pressure.json; echo; echo start $(date +%s%3N); {RESTART_SCRIPT} restart 1; echo end $(date +%s%3N)"
    ));
    let last = last_pressure_in(&out);
    let field = |key: &str| -> i64 {
        out.lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {out}"))
    };
    let (started, ended) = (field("start "), field("end "));
    let restart = parse_restarts(&out);
    assert_eq!(restart.len(), 1, "{out}");
    println!(
        "cluster-vm: criguard restarted {:.1} s after the last observed pressure, answering {:.1} s after it (transition {} s)",
        (started - last) as f64 / 1000.0,
        (ended - last) as f64 / 1000.0,
        TRANSITION_MS / 1000
    );
    assert!(
        started < last + TRANSITION_MS,
        "the second restart began after the transition period"
    );
    // Still there after the restart, when the period has not run out
    // meanwhile (under a loaded host the restart alone may take 20 s).
    let n = c.json(&["get", "node", NODE]);
    if guest_ms(vm) < last + TRANSITION_MS - EARLY_MS {
        assert_eq!(
            pressure_reported(&n),
            (true, true),
            "criguard's condition and taint after the restart: {:#}",
            n["status"]["conditions"]
        );
    } else {
        println!(
            "cluster-vm: the transition period ran out during the restart: not checked right after it"
        );
    }
    // criguard made exactly this eviction, the restarted one lists it, and
    // the kernel killed nothing.
    let report = poll(
        Duration::from_secs(60),
        "criguard's eviction record",
        || {
            let r = vm.evictions();
            (!r.evictions.is_empty()).then_some(r)
        },
    );
    assert_one_memory_eviction("cluster-vm (restarted criguard)", &report, hog_uid);

    // The taint and the condition go once the transition period has passed
    // since the last observed pressure, as without the restarts.
    poll(
        Duration::from_millis((TRANSITION_MS + 60_000) as u64),
        "criguard's condition and taint gone",
        || {
            let n = c.json(&["get", "node", NODE]);
            (pressure_reported(&n) == (false, false)).then_some(())
        },
    );
    let last_after = last_pressure(vm);
    assert_eq!(
        last_after, last,
        "pressure observed again after the eviction"
    );
    let removed = taint_removed_at(vm);
    let after = removed - last;
    println!(
        "cluster-vm: taint removed {:.1} s after the last observed pressure (transition {} s; restarts at the pressure and {:.1} s into the period)",
        after as f64 / 1000.0,
        TRANSITION_MS / 1000,
        (started - last) as f64 / 1000.0
    );
    assert!(
        (TRANSITION_MS - EARLY_MS..=TRANSITION_MS + LATE_MS).contains(&after),
        "criguard's taint went {after} ms after the last observed pressure, not one transition period ({TRANSITION_MS} ms)"
    );
    // Set once and removed once, across both restarts (the audit log).
    let taint_writes = taint_writes(c);
    assert_eq!(
        taint_writes, 2,
        "criguard's successful taint patches on {NODE} (set, removed)"
    );
    // The evicted pod's status is still criguard's (the revert watch went on
    // in the restarted criguard), and the record of the eviction is kept.
    let p = c
        .pods(NS)
        .into_iter()
        .find(|p| uid(p) == hog_uid)
        .expect("the evicted pod");
    assert_eq!(phase(&p), "Failed", "{p:#}");
    assert_evicted(&p);
    assert_one_memory_eviction("cluster-vm (after the period)", &vm.evictions(), hog_uid);
    let guaranteed = c
        .pods(NS)
        .into_iter()
        .find(|p| p["metadata"]["name"] == "guaranteed")
        .expect("the Guaranteed pod");
    assert_eq!(phase(&guaranteed), "Running", "{guaranteed:#}");
    assert_eq!(ready_since(c), ready, "the node's Ready changed");
}

/// criguard's package upgraded [`restarts()`] times (`dpkg -i` of a newer
/// version; its postinst's `systemctl reload` hands over) while pods churn: no
/// call of the kubelet's fails on its way (none gave up on the socket, none
/// dropped beyond the `baseline` window's), systemd starts nothing and
/// counts no failure, MainPID is a new process each time, the node stays
/// Ready since `ready` and the running pods keep their containers
/// (`before`). Every check that failed, described.
fn upgrades_under_churn(
    c: &Cluster,
    vm: &VmNode,
    ready: &str,
    before: &BTreeMap<String, Vec<(String, u64)>>,
    baseline: &Report,
) -> Vec<String> {
    let mut failed = Vec::new();
    let t_window = Instant::now();
    let since = vm.guest(&format!("{RESTART_SCRIPT} now")).trim().to_owned();
    let churned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        churn(c, vm, Some(("upgrade", restarts())), 2, ready)
    }));
    let report = Report::parse(&vm.guest(&format!("{RESTART_SCRIPT} report {since}")));
    let (gave_up, dropped) = report.transport_errors();
    let serving = &report.serving_ms;
    println!(
        "cluster-vm: {} upgrades (handoffs) in {:.1} s under pod churn: the new process forwarding {} ms mean, {} ms max after the SIGHUP (the old one accepting meanwhile); systemd: {} starts, {} failures, NRestarts {}; kubelet CRI error lines {} {:?} (baseline {}): gave up on the socket {}, failed on their way {}",
        report.handoffs,
        t_window.elapsed().as_secs_f64(),
        serving.iter().sum::<u64>() / serving.len().max(1) as u64,
        serving.iter().max().unwrap_or(&0),
        report.starts,
        report.failures,
        report.nrestarts,
        report.cri_errors.len(),
        report.codes(),
        baseline.cri_errors.len(),
        gave_up.len(),
        dropped.len()
    );
    for l in gave_up.iter().chain(&dropped).take(10) {
        println!("cluster-vm:   {l}");
    }
    let mut check = |ok: bool, what: String| {
        if !ok {
            failed.push(what);
        }
    };
    match churned {
        Ok((_, out)) => {
            let upgrades = parse_lines(&out, "upgrade ");
            let mut pids: Vec<u64> = upgrades.iter().map(|r| r.pid).collect();
            pids.sort_unstable();
            pids.dedup();
            check(
                upgrades.len() == restarts() && pids.len() == upgrades.len(),
                format!(
                    "{} upgrades of {}, each a new MainPID: {out}",
                    upgrades.len(),
                    restarts()
                ),
            );
        }
        Err(e) => check(false, format!("the churn: {}", panic_text(&*e))),
    }
    check(
        report.handoffs == restarts() as u64,
        format!("{} handoffs logged", report.handoffs),
    );
    check(
        (report.starts, report.failures, report.nrestarts) == (0, 0, 0),
        format!(
            "systemd: {} starts, {} failures, NRestarts {}",
            report.starts, report.failures, report.nrestarts
        ),
    );
    check(
        gave_up.is_empty() && dropped.len() <= baseline.transport_errors().1.len(),
        format!(
            "kubelet CRI calls failed on their way across the upgrades:\n{}",
            gave_up
                .iter()
                .chain(&dropped)
                .copied()
                .collect::<Vec<_>>()
                .join("\n")
        ),
    );
    failed.extend(node_undisturbed(c, ready, before));
    failed
}

/// criguard restarted [`restarts()`] times by `systemctl restart` while pods
/// churn, checked against the `baseline` window's report; the node is
/// Ready since `ready` and the running pods' containers are `before`. Every
/// check that failed, described (all are checked, and the figures printed,
/// whichever fail).
fn restarts_under_churn(
    c: &Cluster,
    vm: &VmNode,
    ready: &str,
    before: &BTreeMap<String, Vec<(String, u64)>>,
    baseline: &Report,
) -> Vec<String> {
    let mut failed = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            failed.push(what);
        }
    };
    let t_window = Instant::now();
    let since = vm.guest(&format!("{RESTART_SCRIPT} now")).trim().to_owned();
    let churned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        churn(c, vm, Some(("restart", restarts())), 2, ready)
    }));
    let window = t_window.elapsed();
    // What the guest saw, whatever the churn saw.
    let report = Report::parse(&vm.guest(&format!("{RESTART_SCRIPT} report {since}")));
    let down: Vec<u64> = report.downtimes.iter().map(|d| d.1).collect();
    let slow = down
        .iter()
        .filter(|d| **d > KUBELET_CONNECT_TIMEOUT_MS)
        .count();
    let (gave_up, dropped) = report.transport_errors();
    println!(
        "cluster-vm: restart window {:.1} s: systemd: {} starts, {} failures, NRestarts {}; SIGTERM to the next criguard forwarding {} ms mean, {} ms max, over the kubelet's {} ms connect timeout {slow} times; kubelet CRI error lines {} {:?}: the kubelet gave up waiting for the socket {}, calls failed otherwise on their way {}; cAdvisor's direct containerd errors {}",
        window.as_secs_f64(),
        report.starts,
        report.failures,
        report.nrestarts,
        down.iter().sum::<u64>() / down.len().max(1) as u64,
        down.iter().max().unwrap_or(&0),
        KUBELET_CONNECT_TIMEOUT_MS,
        report.cri_errors.len(),
        report.codes(),
        gave_up.len(),
        dropped.len(),
        report.cadvisor_errors.len()
    );
    for l in gave_up.iter().take(5).chain(&dropped) {
        println!("cluster-vm:   {l}");
    }
    match churned {
        Ok((cycles, out)) => {
            let restarts = parse_restarts(&out);
            check(
                restarts.len() == self::restarts(),
                format!("{} restarts of {}: {out}", restarts.len(), self::restarts()),
            );
            let mut pids: Vec<u64> = restarts.iter().map(|r| r.pid).collect();
            pids.push(baseline.mainpid);
            pids.sort_unstable();
            pids.dedup();
            check(
                pids.len() == restarts.len() + 1,
                format!("not a new MainPID each restart: {out}"),
            );
            let ms: Vec<u64> = restarts.iter().map(|r| r.ms).collect();
            let stop: Vec<u64> = restarts.iter().map(|r| r.systemctl_ms).collect();
            println!(
                "cluster-vm: {} systemctl restarts of criguard in {:.1} s under {cycles} churn cycles: restart to answering (the kubelet's Status answered OK, admin socket) {} ms mean, {} ms max (systemctl restart itself {} ms mean, {} ms max)",
                restarts.len(),
                window.as_secs_f64(),
                ms.iter().sum::<u64>() / ms.len().max(1) as u64,
                ms.iter().max().unwrap_or(&0),
                stop.iter().sum::<u64>() / stop.len().max(1) as u64,
                stop.iter().max().unwrap_or(&0),
            );
        }
        Err(e) => check(false, format!("the churn: {}", panic_text(&*e))),
    }
    check(
        report.starts == restarts() as u64,
        format!("systemd started criguard {} times", report.starts),
    );
    check(
        report.failures == 0,
        format!("criguard.service failed {} times", report.failures),
    );
    check(
        report.nrestarts == 0,
        format!("criguard crashed: NRestarts {}", report.nrestarts),
    );
    for f in node_undisturbed(c, ready, before) {
        check(false, f);
    }
    // containerd's own answers (NotFound, Unknown "already in removing
    // state": the kubelet's races with itself) come in either window. A
    // call that failed on its way is one direct to containerd would not
    // have failed: either the kubelet gave up waiting for the restarting
    // criguard to answer its new connection (its 5 s connect timeout,
    // "error reading server preface"), or criguard dropped it (refused,
    // reset, cut in flight).
    check(
        dropped.len() <= baseline.transport_errors().1.len(),
        format!(
            "CRI calls criguard's restarts dropped:\n{}",
            dropped.join("\n")
        ),
    );
    // Each restart hands over (the unit's ExecStop=): the socket is never
    // left without a process accepting, so the kubelet never gives up
    // waiting for one, however slow the guest.
    check(
        gave_up.is_empty(),
        format!(
            "the kubelet gave up waiting for criguard's socket across the restarts:\n{}",
            gave_up.join("\n")
        ),
    );
    check(
        report.handoffs == restarts() as u64,
        format!("{} restarts handed over of {}", report.handoffs, restarts()),
    );
    failed
}

/// What a restart or upgrade must leave of the node: Ready since `ready`
/// (churn checked it at every poll), the running pods' containers as
/// `before` (none restarted), and no NodeNotReady event from the node
/// controller. Every check that failed, described.
fn node_undisturbed(
    c: &Cluster,
    ready: &str,
    before: &BTreeMap<String, Vec<(String, u64)>>,
) -> Vec<String> {
    let mut failed = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            failed.push(what);
        }
    };
    let now = std::panic::catch_unwind(|| ready_since(c));
    check(
        now.as_deref().ok() == Some(ready),
        format!("the node's Ready changed (since {ready})"),
    );
    let after = containers(c);
    check(
        &after == before,
        format!("the running pods' containers: before {before:?}, now {after:?}"),
    );
    // Since the node went Ready last: the adoption's kubelet restart may
    // have reported it NotReady before.
    let not_ready = c.json(&[
        "get",
        "events",
        "-A",
        &format!("--field-selector=involvedObject.name={NODE},reason=NodeNotReady"),
    ]);
    let since_ready: Vec<&Value> = not_ready["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| {
            e["lastTimestamp"]
                .as_str()
                .is_none_or(|t| rfc3339_s(t) > rfc3339_s(ready))
        })
        .collect();
    check(
        since_ready.is_empty(),
        format!("NodeNotReady events since {ready}: {since_ready:#?}"),
    );
    failed
}

/// A panic's message.
fn panic_text(e: &(dyn std::any::Any + Send)) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

/// The VM node's Ready condition's lastTransitionTime; panics unless it is
/// True.
fn ready_since(c: &Cluster) -> String {
    let n = c.json(&["get", "node", NODE]);
    let ready = condition(&n, "Ready").expect("Ready condition");
    assert_eq!(ready["status"], "True", "{NODE} not Ready: {ready:#}");
    ready["lastTransitionTime"].as_str().unwrap().to_owned()
}

/// Every Running pod of the test's namespace: its name → its containers'
/// (containerID, restartCount).
fn containers(c: &Cluster) -> BTreeMap<String, Vec<(String, u64)>> {
    c.pods(NS)
        .iter()
        .filter(|p| phase(p) == "Running")
        .map(|p| {
            let ids = p["status"]["containerStatuses"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| {
                    (
                        s["containerID"].as_str().unwrap_or("").to_owned(),
                        s["restartCount"].as_u64().unwrap_or(u64::MAX),
                    )
                })
                .collect();
            (p["metadata"]["name"].as_str().unwrap().to_owned(), ids)
        })
        .collect()
}

/// Pods churned on the VM node: cycles of two pods created, Running, deleted
/// and gone, checking at every poll that the node is Ready since `ready`.
/// With `restarts` (the script's `restart` or `upgrade`, and how many),
/// the guest restarts or upgrades criguard that many times meanwhile
/// (`criguard-restarts.sh restart N`) and the churn goes on until it is
/// done; at least `min_cycles` cycles. The cycles, and the guest's output.
fn churn(
    c: &Cluster,
    vm: &VmNode,
    restarts: Option<(&str, usize)>,
    min_cycles: usize,
    ready: &str,
) -> (usize, String) {
    std::thread::scope(|s| {
        let guest = restarts.map(|(how, n)| {
            s.spawn(move || {
                // In requests of RESTART_CHUNK restarts: each within the
                // guest's 300 s per request however slow TCG is today.
                // An upgrade (a package built and installed) takes up to
                // a minute under a loaded TCG: one per request.
                let chunk = if how == "upgrade" { 1 } else { RESTART_CHUNK };
                let mut out = String::new();
                for first in (1..=n).step_by(chunk) {
                    let k = chunk.min(n + 1 - first);
                    out += &vm.try_guest(&format!("{RESTART_SCRIPT} {how} {k} {first}"))?;
                }
                Ok::<_, String>(out)
            })
        });
        let mut cycles = 0;
        while cycles < min_cycles || guest.as_ref().is_some_and(|g| !g.is_finished()) {
            let names = [format!("churn-{cycles}-a"), format!("churn-{cycles}-b")];
            for name in &names {
                c.apply(&vm_pod_yaml(name, "{}"));
            }
            let running = |p: &Value| {
                names.iter().any(|n| p["metadata"]["name"] == n.as_str()) && phase(p) == "Running"
            };
            poll(GUEST_DEADLINE, "the churned pods Running", || {
                assert_eq!(ready_since(c), ready, "the node's Ready changed");
                (c.pods(NS).iter().filter(|p| running(p)).count() == names.len()).then_some(())
            });
            c.kubectl(&[
                "-n",
                NS,
                "delete",
                "pod",
                &names[0],
                &names[1],
                "--wait=false",
            ]);
            poll(GUEST_DEADLINE, "the churned pods gone", || {
                assert_eq!(ready_since(c), ready, "the node's Ready changed");
                let pods = c.pods(NS);
                (!pods
                    .iter()
                    .any(|p| names.iter().any(|n| p["metadata"]["name"] == n.as_str())))
                .then_some(())
            });
            cycles += 1;
        }
        let out = match guest {
            Some(g) => g
                .join()
                .unwrap()
                .unwrap_or_else(|e| panic!("{RESTART_SCRIPT} restart: {e}")),
            None => String::new(),
        };
        (cycles, out)
    })
}

/// Whether the node shows criguard's memory condition True and its taint.
fn pressure_reported(n: &Value) -> (bool, bool) {
    let cond = condition(n, "CriguardMemoryPressure").is_some_and(|c| c["status"] == "True");
    (cond, tainted(n, "criguard.io/memory-pressure"))
}

/// The guest's clock, ms since the epoch.
fn guest_ms(vm: &VmNode) -> i64 {
    let out = vm.guest("date +%s%3N");
    out.trim()
        .parse()
        .unwrap_or_else(|e| panic!("date: {e}: {out}"))
}

/// When the guest's criguard last observed memory pressure (pressure.json,
/// its clock, ms since the epoch).
fn last_pressure(vm: &VmNode) -> i64 {
    last_pressure_in(&vm.guest("tr -d '\\n' </var/lib/criguard/pressure.json"))
}

/// The memory pressure's `last_observed` in `out`, whose first line is
/// pressure.json.
fn last_pressure_in(out: &str) -> i64 {
    let json = out.lines().next().unwrap_or("");
    let v: Value =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("pressure.json: {e}: {out}"));
    v["last_observed"]["MemoryPressure"]
        .as_i64()
        .unwrap_or_else(|| panic!("no MemoryPressure in pressure.json: {out}"))
}

/// When criguard last logged its taints updated to none (its journal, the
/// guest's clock, ms since the epoch).
fn taint_removed_at(vm: &VmNode) -> i64 {
    let out = vm.guest(
        "journalctl -u criguard.service -o short-unix --no-pager | grep \"NoSchedule taints updated\"",
    );
    removal_ms(&out).unwrap_or_else(|| panic!("no taint removal in criguard's journal:\n{out}"))
}

/// The time (ms) of the last line of `journal` (`journalctl -o short-unix`
/// lines of criguard's "taints updated") that lists no taint.
fn removal_ms(journal: &str) -> Option<i64> {
    journal
        .lines()
        .filter(|l| l.contains("taints=[]"))
        .filter_map(|l| l.split_whitespace().next()?.parse::<f64>().ok())
        .map(|s| (s * 1000.0).round() as i64)
        .next_back()
}

/// criguard's successful patches of the VM node's taints in the audit log.
fn taint_writes(c: &Cluster) -> usize {
    let audit = std::fs::read_to_string(c.dir.join("audit.log")).unwrap();
    audit
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| {
            criguard_patched(e)
                && e["objectRef"]["resource"] == "nodes"
                && e["objectRef"]["name"] == NODE
                && e["objectRef"]["subresource"].is_null()
        })
        .count()
}

/// What `criguard-restarts.sh report SINCE` says.
#[derive(Debug, Default, PartialEq)]
struct Report {
    /// systemd's "Started criguard.service" lines.
    starts: u64,
    /// criguard.service's "Failed with result" lines.
    failures: u64,
    /// systemd's automatic restarts of criguard (crashes).
    nrestarts: u64,
    /// criguard's pid now.
    mainpid: u64,
    /// For each restart: its SIGTERM (the guest's clock, ms since the
    /// epoch) and how long until the next process forwarded, ms.
    downtimes: Vec<(i64, u64)>,
    /// The kubelet's journal lines with "rpc error" from its CRI calls,
    /// which pass through criguard.
    cri_errors: Vec<String>,
    /// criguard's completed handoffs.
    handoffs: u64,
    /// For each handoff, its SIGHUP to the new process forwarding, ms (the
    /// old one accepting meanwhile).
    serving_ms: Vec<u64>,
    /// Those from cAdvisor inside the kubelet, which calls containerd's own
    /// API socket (`/run/containerd/containerd.sock`, its `--containerd`
    /// default), not the CRI, with a 2 s deadline of its own: containerd
    /// slow under TCG, never criguard.
    cadvisor_errors: Vec<String>,
}

/// cAdvisor's log lines for its direct calls to containerd
/// (`manager/manager.go` in `github.com/google/cadvisor/lib`).
const CADVISOR_LINES: [&str; 2] = [
    "Failed to process watch event",
    "Failed to create existing container",
];

impl Report {
    /// Parses the script's KEY=VALUE and `kubelet: ` lines.
    fn parse(text: &str) -> Self {
        let mut r = Report::default();
        for line in text.lines() {
            if let Some(l) = line.strip_prefix("kubelet: ") {
                if CADVISOR_LINES.iter().any(|c| l.contains(c)) {
                    r.cadvisor_errors.push(l.to_owned());
                } else {
                    r.cri_errors.push(l.to_owned());
                }
            } else if let Some(v) = line.strip_prefix("DOWNTIMES=") {
                r.downtimes = v
                    .split_whitespace()
                    .filter_map(|d| {
                        let (at, ms) = d.split_once(':')?;
                        Some((epoch_ms(at)?, ms.parse().ok()?))
                    })
                    .collect();
            } else if let Some(v) = line.strip_prefix("SERVING_MS=") {
                r.serving_ms = v
                    .split_whitespace()
                    .filter_map(|m| m.parse().ok())
                    .collect();
            } else if let Some((k, v)) = line.split_once('=') {
                let v = v.trim().parse().unwrap_or(u64::MAX);
                match k {
                    "STARTS" => r.starts = v,
                    "FAILURES" => r.failures = v,
                    "NRESTARTS" => r.nrestarts = v,
                    "MAINPID" => r.mainpid = v,
                    "HANDOFFS" => r.handoffs = v,
                    _ => {}
                }
            }
        }
        r
    }

    /// The kubelet's CRI errors that are not the runtime's answer, the call
    /// having failed on its way: (the kubelet gave up waiting for a new
    /// connection to answer, "error reading server preface" on a
    /// connection it closed itself; every other: refused, reset, cut in
    /// flight, deadline, cancellation).
    fn transport_errors(&self) -> (Vec<&str>, Vec<&str>) {
        self.cri_errors
            .iter()
            .filter(|l| {
                ["Unavailable", "DeadlineExceeded", "Canceled"]
                    .iter()
                    .any(|c| l.contains(&format!("code = {c} ")))
                    || l.contains("connection error")
                    || l.contains("transport is closing")
            })
            .map(String::as_str)
            .partition(|l| {
                l.contains("error reading server preface")
                    && l.contains("use of closed network connection")
            })
    }

    /// The gRPC codes of the kubelet's CRI errors (`rpc error: code = X`),
    /// counted.
    fn codes(&self) -> BTreeMap<String, usize> {
        let mut codes = BTreeMap::new();
        for l in &self.cri_errors {
            let code = l
                .split_once("rpc error: code = ")
                .and_then(|(_, r)| r.split_whitespace().next())
                .unwrap_or("?");
            *codes.entry(code.to_owned()).or_default() += 1;
        }
        codes
    }
}

/// One `restart I PID MS SYSTEMCTL_MS` line of `criguard-restarts.sh`.
#[derive(Debug, PartialEq)]
struct Restart {
    /// The new criguard's pid.
    pid: u64,
    /// `systemctl restart`'s start to the new criguard answering, ms.
    ms: u64,
    /// How long `systemctl restart` itself took (the old one's stop), ms.
    systemctl_ms: u64,
}

/// `journalctl -o short-unix`'s seconds (`1764089012.5`) as ms since the
/// epoch.
fn epoch_ms(s: &str) -> Option<i64> {
    s.parse::<f64>().ok().map(|s| (s * 1000.0).round() as i64)
}

/// The `restart` lines of `criguard-restarts.sh`'s output.
fn parse_restarts(text: &str) -> Vec<Restart> {
    parse_lines(text, "restart ")
}

/// The script's `PREFIX I PID MS MS2` lines.
fn parse_lines(text: &str, prefix: &str) -> Vec<Restart> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.strip_prefix(prefix)?.split_whitespace().skip(1);
            let mut n = || f.next()?.parse().ok();
            Some(Restart {
                pid: n()?,
                ms: n()?,
                systemctl_ms: n()?,
            })
        })
        .collect()
}

#[test]
fn the_restart_scripts_output_is_read() {
    let r = Report::parse(
        "STARTS=20\nFAILURES=0\nNRESTARTS=0\nMAINPID=812\nDOWNTIMES=1764089000.5:3600 1764089010.25:12000 \nKUBELET_CRI_ERRORS=2\n\
         kubelet: 1764089012.5 vm kubelet[9]: E1125 \"ContainerStatus from runtime service failed\" err=\"rpc error: code = NotFound desc = an error\"\n\
         kubelet: 1764089013.1 vm kubelet[9]: E1125 err=\"rpc error: code = Unavailable desc = closing\"\n\
         kubelet: 1764089014.2 vm kubelet[9]: E1125 \"Status from runtime service failed\" err=\"rpc error: code = Unavailable desc = connection error: desc = \\\"error reading server preface: raw-read unix @->/run/criguard/criguard.sock: use of closed network connection\\\"\"\n\
         kubelet: 1764089015.3 vm kubelet[9]: W1125 manager.go:1079] Failed to process watch event {EventType:0 Name:/kubepods.slice/x.scope WatchSource:0}: rpc error: code = DeadlineExceeded desc = context deadline exceeded\n",
    );
    assert_eq!(
        (r.starts, r.failures, r.nrestarts, r.mainpid),
        (20, 0, 0, 812)
    );
    assert_eq!(
        r.downtimes,
        [(1_764_089_000_500, 3600), (1_764_089_010_250, 12_000)]
    );
    let (gave_up, dropped) = r.transport_errors();
    assert_eq!((gave_up.len(), dropped.len()), (1, 1), "{r:?}");
    // cAdvisor's deadline on containerd's own socket is not a CRI call.
    assert_eq!(r.cadvisor_errors.len(), 1, "{r:?}");
    assert_eq!(
        r.codes(),
        BTreeMap::from([("NotFound".to_owned(), 1), ("Unavailable".to_owned(), 2)])
    );
    assert_eq!(
        parse_restarts("restart 1 812 2400 900\nnoise\nrestart 2 830 1900 700\nrestart 3 1\n"),
        [
            Restart {
                pid: 812,
                ms: 2400,
                systemctl_ms: 900
            },
            Restart {
                pid: 830,
                ms: 1900,
                systemctl_ms: 700
            }
        ]
    );
    assert_eq!(
        removal_ms(
            "1764089000.250 vm criguard[5]: INFO criguard's NoSchedule taints updated node=vm taints=[\"criguard.io/memory-pressure\"]\n\
             1764089031.5 vm criguard[7]: INFO criguard's NoSchedule taints updated node=vm taints=[]\n"
        ),
        Some(1_764_089_031_500)
    );
    assert_eq!(removal_ms(""), None);
}

impl crate::cluster::restart_points::RestartNode for VmNode {
    fn name(&self) -> &str {
        NODE
    }

    fn namespace(&self) -> &str {
        NS
    }

    fn transition_s(&self) -> u64 {
        (TRANSITION_MS / 1000) as u64
    }

    fn hog_pod(&self, name: &str) -> String {
        // 10 MiB a second from the start: under TCG the crossing comes
        // tens of seconds after the pod runs, room for the restart before it.
        crate::cluster::restart_points::hog_pod(name, NS, NODE, "1")
    }

    fn restart(&self) -> u128 {
        let out = self.guest(&format!("{RESTART_SCRIPT} restart 1"));
        let r = parse_restarts(&out);
        assert_eq!(r.len(), 1, "{RESTART_SCRIPT} restart 1: {out}");
        u128::from(r[0].ms)
    }

    fn evictions(&self) -> criguard::admin::EvictionsReport {
        VmNode::evictions(self)
    }

    fn pending_reports(&self) -> String {
        self.guest("cat /var/lib/criguard/kube-pods.json 2>/dev/null || true")
    }
}

/// criguard restarted as an operator does on the VM node (`systemctl
/// restart`: a handoff) at each step of an eviction, as the host node's
/// [`crate::cluster::restart_points`] runs do: the kubelet's end state
/// every time, one eviction, the taint set and removed once. Opt-in: a
/// run of the four points takes about 10 minutes under TCG.
#[test]
#[ignore = "opt-in (about 10 minutes under TCG): cargo test --test it -- --ignored cluster_vm::restart_points"]
fn restart_points_on_the_vm_node() {
    // SAFETY: geteuid has no preconditions.
    assert!(unsafe { libc::geteuid() } == 0, "the VM node needs root");
    let mut c = Cluster::up(fresh_dir("cgp"), &[], "cluster-vm");
    c.keep_files_on_failure = false;
    let vm = VmNode::up(&c, "criguard");
    c.kubectl(&["create", "namespace", NS]);
    crate::cluster::restart_points::run_points(&c, &vm, "VM node");
}
