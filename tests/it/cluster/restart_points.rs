//! criguard restarted at each step of an eviction on the host node, with
//! the real kubelet, API server and containerd: before the kill, between
//! the kill and the pod's status write (the API server frozen with SIGSTOP
//! across the kill and the restart), during the status reasserts, and
//! during the pressure transition period. Each run ends the same way: the
//! pod Failed with reason Evicted and the kubelet's message, once criguard's
//! report has settled (the kubelet's own status terminal with criguard's
//! reason); one eviction of it in criguard's record; criguard's taint set
//! once and removed once, after the transition period.
//!
//! `CRIGUARD_RESTART_POINT_RUNS` (default 1) runs each point that many times.
//! The runs take a [`RestartNode`]: the host node here (criguard SIGKILLed
//! and started again), the VM node in `cluster_vm` (`systemctl restart`, a
//! handoff).

use std::fmt;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Cluster, HostNodes, NS, audit_ms, cluster_up, day_diff, ms_of_day, unix_ms_now};
use crate::common::cluster::{BUSYBOX, criguard_patched, phase, poll, tainted, uid};

/// The host node's transition period, s.
const TRANSITION_S: u64 = 15;
/// The memory taint criguard sets.
const TAINT: &str = "criguard.io/memory-pressure";

/// A node whose criguard the runs restart.
pub trait RestartNode {
    /// The node's name in the API.
    fn name(&self) -> &str;
    /// The namespace of the runs' pods.
    fn namespace(&self) -> &str;
    /// criguard's pressure transition period there, s.
    fn transition_s(&self) -> u64;
    /// A BestEffort pod `name` that grows until criguard evicts it.
    fn hog_pod(&self, name: &str) -> String;
    /// Restarts criguard as this node's operator would; how long until it
    /// answered again, ms.
    fn restart(&self) -> u128;
    /// criguard's evictions, as `criguard evictions --json` prints them.
    fn evictions(&self) -> criguard::admin::EvictionsReport;
    /// criguard's eviction records of pod `uid`.
    fn evictions_of(&self, uid: &str) -> Vec<criguard::eviction::Eviction> {
        let report = self.evictions();
        report
            .evictions
            .into_iter()
            .filter(|e| e.uid == uid)
            .collect()
    }
    /// criguard's `kube-pods.json` (the reports not over), as text.
    fn pending_reports(&self) -> String;
}

/// The host node `node-a` of a cluster.
struct HostNode<'a>(&'a Cluster);

impl RestartNode for HostNode<'_> {
    fn name(&self) -> &str {
        "node-a"
    }

    fn namespace(&self) -> &str {
        NS
    }

    fn transition_s(&self) -> u64 {
        TRANSITION_S
    }

    fn hog_pod(&self, name: &str) -> String {
        hog_pod(name, NS, self.name(), "0.5")
    }

    fn restart(&self) -> u128 {
        self.0.restart_criguard(self.name()).as_millis()
    }

    fn evictions(&self) -> criguard::admin::EvictionsReport {
        HostNodes::evictions(self.0, self.name())
    }

    fn pending_reports(&self) -> String {
        let path = (self.0.node_dir(self.name())).join("criguard-state/kube-pods.json");
        std::fs::read_to_string(path).unwrap_or_default()
    }
}

/// Where in an eviction criguard is restarted.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Point {
    /// The hog Running and growing, not yet over the threshold.
    BeforeKill,
    /// The hog killed and recorded, its status not yet in the API (the API
    /// server frozen across the kill and the restart).
    KillToWrite,
    /// criguard's status written, its watch on the pod going.
    Reasserting,
    /// The pressure gone, its condition and taint held for the transition
    /// period.
    Transition,
}

impl Point {
    const ALL: [Point; 4] = [
        Point::BeforeKill,
        Point::KillToWrite,
        Point::Reasserting,
        Point::Transition,
    ];
}

impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Point::BeforeKill => "before-kill",
            Point::KillToWrite => "kill-to-write",
            Point::Reasserting => "reasserting",
            Point::Transition => "transition",
        })
    }
}

/// How one run ended.
struct Outcome {
    point: Point,
    /// The pod's phase/reason at the end, and whether its message is the kubelet's.
    end: String,
    kubelet_message: bool,
    /// criguard's records of the pod's eviction.
    evictions: usize,
    /// criguard's successful taint writes in the run (set, removed).
    taint_writes: usize,
    /// The taint's removal after the eviction record, ms.
    taint_gone_ms: i64,
    /// The transition period, ms.
    transition_ms: i64,
    /// How long the restart took (SIGKILL to both sockets answering), ms.
    restart_ms: u128,
    /// The restart after the eviction record, ms (negative: before it).
    restart_after_eviction_ms: i64,
    /// The eviction record to the report settled, s.
    settled_s: f64,
    /// Whether criguard's first status write on the pod came after the
    /// restart (the audit log's record of it).
    written_after_restart: bool,
}

impl Outcome {
    fn ok(&self) -> bool {
        self.end == "Failed/Evicted"
            && self.kubelet_message
            && self.evictions == 1
            && self.taint_writes == 2
            && self.taint_gone_ms >= self.transition_ms - 2000
            && match self.point {
                Point::BeforeKill => self.restart_after_eviction_ms < 0,
                _ => self.restart_after_eviction_ms >= 0,
            }
            && self.written_after_restart
                == matches!(self.point, Point::BeforeKill | Point::KillToWrite)
    }
}

/// A BestEffort pod `name` in `ns` on `node` that grows by 10 MiB every
/// `step` (a `sleep` argument, s).
pub fn hog_pod(name: &str, ns: &str, node: &str, step: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {ns}, labels: {{app: restart-point}}}}
spec:
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  hostNetwork: true
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 2
  containers:
  - name: hog
    image: {BUSYBOX}
    imagePullPolicy: Never
    command: ["awk", "BEGIN {{ for (i = 0; ; i++) {{ m[i] = sprintf(\"%10485760s\", i); system(\"sleep {step}\") }} }}"]
"#
    )
}

/// The API server stopped (SIGSTOP) until dropped (SIGCONT).
struct Frozen(i32);

impl Frozen {
    fn api_server(c: &Cluster) -> Self {
        let pid: i32 = std::fs::read_to_string(c.dir.join("pids/kube-apiserver.pid"))
            .expect("the API server's pid file")
            .trim()
            .parse()
            .expect("a pid");
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            String::from_utf8_lossy(&cmdline).contains("kube-apiserver"),
            "pid {pid} is not this cluster's API server"
        );
        // SAFETY: kill(2) on the API server's pid, checked above.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // SAFETY: as in `api_server`.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// The pod's status in the API, polled until Failed with reason Evicted.
fn evicted_in_api(c: &Cluster, ns: &str, name: &str, deadline: Duration) -> Value {
    poll(deadline, "the pod Failed/Evicted in the API", || {
        let p = c.json(&["-n", ns, "get", "pod", name]);
        (phase(&p) == "Failed" && p["status"]["reason"] == "Evicted").then_some(p)
    })
}

/// The times (ms of the day) of criguard's successful patches at or after
/// `from_ms` (ms since the epoch) that `what` picks.
fn criguard_patches(audit: &Path, from_ms: i64, what: impl Fn(&Value) -> bool) -> Vec<i64> {
    let from = ms_of_day(from_ms as u64);
    std::fs::read_to_string(audit)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| criguard_patched(e) && what(&e["objectRef"]))
        .filter_map(|e| audit_ms(e["stageTimestamp"].as_str()?))
        .filter(|&t| day_diff(t, from) >= 0)
        .collect()
}

/// Restarts `node`'s criguard: how long it took and when it ended (ms
/// since the epoch).
fn restart(node: &dyn RestartNode) -> (u128, i64) {
    let took = node.restart();
    (took, unix_ms_now())
}

/// Runs `point` once on `node` (run `run`): the hog applied, criguard
/// restarted at the point, the end state read once the taint is gone and
/// the report settled.
fn one_run(c: &Cluster, node: &dyn RestartNode, point: Point, run: usize) -> Outcome {
    let (ns, name) = (node.namespace(), format!("hog-{point}-{run}"));
    let transition_s = node.transition_s();
    let run_start = unix_ms_now();
    c.apply(&node.hog_pod(&name));
    let pod = poll(Duration::from_secs(300), "the hog Running", || {
        let p = c.json(&["-n", ns, "get", "pod", &name]);
        (phase(&p) == "Running").then_some(p)
    });
    let hog_uid = uid(&pod).to_owned();
    let (restart_ms, restarted_at) = match point {
        Point::BeforeKill => {
            assert!(
                node.evictions_of(&hog_uid).is_empty(),
                "{point}: evicted before the restart"
            );
            restart(node)
        }
        Point::KillToWrite => {
            let frozen = Frozen::api_server(c);
            poll(
                Duration::from_secs(90),
                "the hog evicted, API frozen",
                || (!node.evictions_of(&hog_uid).is_empty()).then_some(()),
            );
            let r = restart(node);
            drop(frozen);
            r
        }
        Point::Reasserting => {
            evicted_in_api(c, ns, &name, Duration::from_secs(180));
            restart(node)
        }
        Point::Transition => {
            evicted_in_api(c, ns, &name, Duration::from_secs(180));
            // The API can show the status a moment before criguard's
            // record: it is written before the pod is killed and recorded.
            let at = poll(
                Duration::from_secs(30),
                "criguard's eviction record",
                || {
                    node.evictions_of(&hog_uid)
                        .first()
                        .map(|e| e.at_unix_ms as i64)
                },
            );
            let mid = at + transition_s as i64 * 1000 / 2;
            std::thread::sleep(Duration::from_millis((mid - unix_ms_now()).max(0) as u64));
            let n = c.json(&["get", "node", node.name()]);
            assert!(tainted(&n, TAINT), "{point}: the taint before the restart");
            restart(node)
        }
    };
    let records = poll(
        Duration::from_secs(90),
        "criguard's eviction record",
        || {
            let e = node.evictions_of(&hog_uid);
            (!e.is_empty()).then_some(e)
        },
    );
    let evicted_at = records[0].at_unix_ms as i64;
    poll(
        Duration::from_secs(transition_s + 90),
        "the taint removed",
        || (!tainted(&c.json(&["get", "node", node.name()]), TAINT)).then_some(()),
    );
    // The report settles once the kubelet's own status is terminal with
    // criguard's reason and has stood: the pod leaves kube-pods.json.
    poll(
        Duration::from_secs(180),
        "criguard's report settled",
        || (!node.pending_reports().contains(&hog_uid)).then_some(()),
    );
    let settled_s = (unix_ms_now() - evicted_at) as f64 / 1000.0;
    let p = c.json(&["-n", ns, "get", "pod", &name]);
    let end = format!(
        "{}/{}",
        phase(&p),
        p["status"]["reason"].as_str().unwrap_or("")
    );
    let kubelet_message = (p["status"]["message"].as_str())
        .is_some_and(|m| m.starts_with("The node was low on resource: memory."));
    let audit = c.dir.join("audit.log");
    let writes = criguard_patches(&audit, run_start, |o| {
        o["resource"] == "nodes" && o["subresource"].is_null()
    });
    let status_writes = criguard_patches(&audit, run_start, |o| {
        o["resource"] == "pods" && o["name"] == name.as_str() && o["subresource"] == "status"
    });
    let written_after_restart = status_writes
        .first()
        .is_some_and(|&t| day_diff(t, ms_of_day(restarted_at as u64)) > 0);
    let taint_gone_ms = writes
        .last()
        .map_or(-1, |&t| day_diff(t, ms_of_day(evicted_at as u64)));
    let evictions = node.evictions_of(&hog_uid).len();
    c.kubectl(&[
        "-n",
        ns,
        "delete",
        "pod",
        &name,
        "--grace-period=0",
        "--force",
        "--wait=true",
    ]);
    let o = Outcome {
        point,
        end,
        kubelet_message,
        evictions,
        taint_writes: writes.len(),
        taint_gone_ms,
        transition_ms: transition_s as i64 * 1000,
        restart_ms,
        restart_after_eviction_ms: restarted_at - evicted_at,
        settled_s,
        written_after_restart,
    };
    println!(
        "restart-points: {point} run {run}: end {} (kubelet's message {}), evictions {}, taint writes {}, taint removed {:.1} s after the eviction, restart {} ms at {:+.1} s from the eviction, report settled after {:.1} s, status first written after the restart {}: {}",
        o.end,
        o.kubelet_message,
        o.evictions,
        o.taint_writes,
        o.taint_gone_ms as f64 / 1000.0,
        o.restart_ms,
        o.restart_after_eviction_ms as f64 / 1000.0,
        o.settled_s,
        o.written_after_restart,
        if o.ok() { "ok" } else { "FAILED" }
    );
    if !o.ok() {
        println!("restart-points: the pod at the end: {p:#}");
    }
    o
}

/// Each point `CRIGUARD_RESTART_POINT_RUNS` times (default 1) on `node`,
/// a summary printed after `label`; panics naming the runs that did not
/// end as the kubelet's eviction.
pub fn run_points(c: &Cluster, node: &dyn RestartNode, label: &str) {
    let runs: usize = std::env::var("CRIGUARD_RESTART_POINT_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let started = Instant::now();
    let outcomes: Vec<Outcome> = (0..runs)
        .flat_map(|run| Point::ALL.map(|point| (run, point)))
        .map(|(run, point)| one_run(c, node, point, run))
        .collect();
    for point in Point::ALL {
        let of: Vec<&Outcome> = outcomes.iter().filter(|o| o.point == point).collect();
        let good = of.iter().filter(|o| o.ok()).count();
        let mut restarts: Vec<u128> = of.iter().map(|o| o.restart_ms).collect();
        restarts.sort_unstable();
        println!(
            "restart-points ({label}): {point}: {good}/{} runs ended Failed/Evicted with the kubelet's message, one eviction, the taint removed once; restart p50 {} ms, max {} ms",
            of.len(),
            restarts[restarts.len() / 2],
            restarts[restarts.len() - 1]
        );
    }
    println!(
        "restart-points ({label}): {} runs in {:.0} s",
        outcomes.len(),
        started.elapsed().as_secs_f64()
    );
    let failed: Vec<String> = (outcomes.iter().filter(|o| !o.ok()))
        .map(|o| format!("{} ({})", o.point, o.end))
        .collect();
    assert!(
        failed.is_empty(),
        "runs that did not end as the kubelet's eviction: {failed:?}"
    );
}

#[test]
fn a_restart_at_any_step_of_an_eviction_ends_in_the_kubelets_end_state() {
    let transition = format!("{TRANSITION_S}s");
    // The nodes' imagefs is the host's disk and the hogs' image cannot be
    // pulled again: image GC is off, or a host disk over 85 % full has
    // criguard collect the image between two runs (ErrImageNeverPull).
    let c = cluster_up(&[
        ("CRIGUARD_CLUSTER_TRANSITION", transition.as_str()),
        (
            "CRIGUARD_CLUSTER_CRIGUARD_ARGS",
            "--image-gc-high-threshold=100",
        ),
    ]);
    c.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n"
    ));
    run_points(&c, &HostNode(&c), "host node");
}
