//! The cluster tier's VM node: a real control plane on this host
//! (`hack/cluster.sh up`, with its host node) and a second node in the VM
//! tier's machine (`hack/cluster/vm-node.sh up`): systemd as PID 1, cgroup
//! v2, containerd 2 with the systemd cgroup driver, criguard installed by
//! `hack/install.sh` and the kubelet v1.37.2, all as systemd units. The
//! guest reaches the API server only through QEMU's user network with
//! `restrict=on` and a guestfwd to the API server's loopback port.
//!
//! What it checks, through kubectl and, in the guest, criguard's admin
//! socket and metrics (`vm-node.sh exec`):
//! - the VM node registers and becomes Ready with kubelet v1.37.2 and
//!   runtime `containerd://2.3.7`, every unit active, the kubelet's CRI
//!   calls relayed by criguard;
//! - a pod scheduled to the VM node runs, in the systemd driver's slices
//!   under `kubepods.slice`, and criguard's model has it;
//! - one memory eviction there: a BestEffort Deployment pod grows until
//!   criguard (before the kubelet, whose threshold is lower) evicts it; the
//!   API shows it Failed/Evicted with a DisruptionTarget condition,
//!   criguard's node condition and taint appear; a Guaranteed pod beside
//!   it keeps running; no kernel OOM kill.
//!
//! It prints the VM's start to node Ready, the pod's start latency and the
//! whole test's time. Everything is stopped whatever happens (the VM first,
//! then `hack/cluster.sh down --purge`; `CRIGUARD_KEEP=1` leaves it all up);
//! on failure the cluster's state, every component's log and the guest's
//! journal are printed. Needs root, QEMU (`hack/vm.sh deps`), socat and the
//! binaries of `hack/k8s/build.sh`.

#[path = "common/cluster.rs"]
mod cluster_support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use cluster_support::{
    Cluster, assert_evicted, assert_one_memory_eviction, condition, fresh_dir, hog_yaml, phase,
    pod_yaml, repo, uid,
};

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
    /// `hack/cluster/vm-node.sh up`: boots the VM node and waits until it is
    /// Ready; stopped again if that fails.
    fn up(cluster: &Cluster) -> Self {
        let mut node = VmNode {
            dir: cluster.dir.clone(),
            times: BTreeMap::new(),
        };
        let status = node.script(&["up"]).status().expect("run vm-node.sh up");
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

    // --- the node -------------------------------------------------------------
    let t_vm = Instant::now();
    let vm = VmNode::up(&c);
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
    // the systemd driver and criguard's socket as its runtime.
    let units = vm.guest(
        "systemctl is-active containerd.service criguard.socket criguard.service kubelet.service",
    );
    assert_eq!(
        units.split_whitespace().collect::<Vec<_>>(),
        ["active"; 4],
        "containerd, criguard.socket, criguard, kubelet: {units}"
    );
    assert_eq!(vm.guest("stat -fc %T /sys/fs/cgroup").trim(), "cgroup2fs");
    let kubelet_cfg = vm.guest("cat /etc/kubernetes/kubelet.yaml");
    assert!(
        kubelet_cfg.contains("cgroupDriver: systemd"),
        "{kubelet_cfg}"
    );
    assert!(
        kubelet_cfg.contains("containerRuntimeEndpoint: unix:///run/criguard/criguard.sock"),
        "{kubelet_cfg}"
    );

    // --- a pod on the VM node ----------------------------------------------------
    c.kubectl(&["create", "namespace", NS]);
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
    let relayed = metrics
        .lines()
        .filter(|l| {
            l.starts_with("criguard_cri_request_duration_seconds_count")
                && l.contains("RunPodSandbox")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    assert!(
        relayed >= 1.0,
        "no RunPodSandbox relayed by criguard:\n{metrics}"
    );
    println!(
        "cluster-vm: criguard's model has the sleeper ({}), RunPodSandbox calls relayed: {relayed}",
        mp.cgroup_parent
    );

    // --- one memory eviction on the VM node ---------------------------------------
    c.apply(&vm_pod_yaml(
        "guaranteed",
        "{requests: {cpu: 50m, memory: 64Mi}, limits: {cpu: 50m, memory: 64Mi}}",
    ));
    // A BestEffort Deployment pod that grows 10 MiB a second once; its
    // replacement finds the marker on the node and only sleeps. Between
    // criguard's threshold (250Mi available) and the kubelet's (100Mi) it
    // grows for 15 s: under TCG criguard takes seconds to act.
    let hog = hog_yaml(NS, NODE, "/var/lib/criguard-vm-test/hog", "1");
    poll(GUEST_DEADLINE, "the Guaranteed pod Running", || {
        c.pods(NS)
            .into_iter()
            .find(|p| p["metadata"]["name"] == "guaranteed" && phase(p) == "Running")
    });
    let t_hog = Instant::now();
    c.apply(&hog);
    let first = poll(GUEST_DEADLINE, "the hog Running", || {
        c.pods(NS)
            .into_iter()
            .find(|p| p["metadata"]["labels"]["app"] == "hog" && phase(p) == "Running")
    });
    let hog_uid = uid(&first).to_owned();
    println!(
        "cluster-vm: hog Running {:.1} s after it was applied",
        t_hog.elapsed().as_secs_f64()
    );
    let evicted = poll(GUEST_DEADLINE, "the hog Failed/Evicted", || {
        let p = c.pods(NS).into_iter().find(|p| uid(p) == hog_uid)?;
        (phase(&p) == "Failed").then_some(p)
    });
    println!(
        "cluster-vm: hog evicted {:.1} s after it was applied",
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
            let cond = condition(&n, "CriguardMemoryPressure")?.clone();
            let tainted = n["spec"]["taints"].as_array().is_some_and(|t| {
                t.iter().any(|t| {
                    t["key"] == "criguard.io/memory-pressure" && t["effect"] == "NoSchedule"
                })
            });
            (cond["status"] == "True" && tainted).then_some(n)
        },
    );
    // Not the kubelet's eviction: its own MemoryPressure never went True.
    assert_ne!(
        condition(&n, "MemoryPressure").map(|m| m["status"].clone()),
        Some("True".into()),
        "the kubelet saw memory pressure too"
    );

    // criguard made exactly this eviction, and the kernel killed nothing.
    let report = poll(
        Duration::from_secs(60),
        "criguard's eviction record",
        || {
            let r = vm.evictions();
            (!r.evictions.is_empty()).then_some(r)
        },
    );
    assert_one_memory_eviction("cluster-vm", &report, &hog_uid);
    let metrics = vm.metrics();
    let to_action: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("criguard_pressure_to_action_seconds_"))
        .filter(|l| l.contains("_sum") || l.contains("_count"))
        .collect();
    println!("cluster-vm: {}", to_action.join("; "));
    let guaranteed = c
        .pods(NS)
        .into_iter()
        .find(|p| p["metadata"]["name"] == "guaranteed")
        .expect("the Guaranteed pod");
    assert_eq!(phase(&guaranteed), "Running", "{guaranteed:#}");

    println!(
        "cluster-vm: VM node Ready {:.1} s, pod start {:.1} s, whole test {:.1} s (before teardown)",
        vm_ready.as_secs_f64(),
        pod_running.as_secs_f64(),
        t_test.elapsed().as_secs_f64()
    );
}
