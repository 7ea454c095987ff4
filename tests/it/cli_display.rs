//! What the client commands show for people, against a real `criguard
//! serve` in front of a private containerd:
//! - `criguard pods` shows the `oom_score_adj` a container was created
//!   with (OOM-WANT) beside the one its process holds (OOM-EFF), the latter
//!   equal to what /proc says of the container's init process;
//! - `criguard evictions` shows an eviction's local time and age, not its
//!   raw milliseconds;
//! - `criguard status` is one screen: the signal against its threshold
//!   (MET), the condition, the eviction, the runtime and criguard's CRI
//!   socket answering, the API report off.

use crate::common;

use std::time::Duration;

use common::containerd::{Clients, PrivateContainerd, unique};
use common::pods::{CgroupRoot, proc_oom_score_adj, remove_pods, run_pod, sleeper};
use common::served::Served;
use criguard_test_kit::kubelet::PodSpec;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_evictions_and_status_show_what_people_need() {
    let root = format!("/{}", unique("criguard-display"));
    let _cg = CgroupRoot(root.clone());
    let ctrd = PrivateContainerd::start();
    let served = Served::start(
        &ctrd,
        "display",
        "evictionHard = { \"memory.available\" = \"1Mi\" }\nimageGCHighThresholdPercent = 100\n",
        &[],
    )
    .await;
    let mut c = Clients::new(&served.socket);
    let mut pod = PodSpec::new("shown", &unique("shown")).container(sleeper("sleeper"));
    pod.cgroup_root = format!("{root}/kubepods");
    pod.log_root = ctrd.dir.join("pods").to_str().unwrap().into();
    let (sandbox, ids) = run_pod(&mut c.rt, &pod, None).await;

    // pods: OOM-WANT is the kubelet's BestEffort score; OOM-EFF what the
    // kernel holds for the container's process, read here independently.
    let line = common::poll_until(Duration::from_secs(20), "the pod listed", || async {
        let (code, out) = served.cli(&["pods"]);
        assert_eq!(code, 0, "{out}");
        out.lines()
            .find(|l| l.contains("default/shown") && l.contains("sleeper"))
            .map(str::to_owned)
    })
    .await;
    let (code, header) = served.cli(&["pods"]);
    assert_eq!(code, 0);
    assert!(
        header
            .lines()
            .next()
            .unwrap()
            .ends_with("OOM-WANT  OOM-EFF"),
        "{header}"
    );
    let kernel = proc_oom_score_adj(&mut c, Some(&ids[0]), None).await;
    let cols: Vec<&str> = line.split_whitespace().collect();
    let (want, eff) = (cols[cols.len() - 2], cols[cols.len() - 1]);
    assert_eq!(want, "1000", "{line}");
    assert_eq!(eff, kernel.to_string(), "{line}");

    // An eviction (a threshold every machine is under, reloaded).
    std::fs::write(
        &served.config,
        "evictionHard = { \"memory.available\" = \"1Ei\" }\nimageGCHighThresholdPercent = 100\n",
    )
    .unwrap();
    let pid = nix::unistd::Pid::from_raw(served.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    let evictions = common::poll_until(Duration::from_secs(30), "the pod evicted", || async {
        let (_, out) = served.cli(&["evictions"]);
        out.contains("default/shown").then_some(out)
    })
    .await;
    let report = served.cli(&["evictions", "--json"]).1;
    let report: criguard::admin::EvictionsReport = serde_json::from_str(&report).unwrap();
    let ms = report.evictions[0].at_unix_ms;
    let line = evictions
        .lines()
        .find(|l| l.contains("default/shown"))
        .unwrap();
    let shape =
        regex::Regex::new(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d( \S+)? \((just now|\d+s ago)\) default/shown \[memory.available<1Ei\]: ")
            .unwrap();
    assert!(shape.is_match(line), "{line}");
    assert!(!line.contains(&ms.to_string()), "raw ms: {line}");

    // status: one screen, checking the runtime and CRI socket this
    // criguard says it forwards to and serves (none of them the defaults).
    let (code, status) = served.cli(&["status"]);
    assert_eq!(code, 0, "{status}");
    let mem = status
        .lines()
        .find(|l| l.trim_start().starts_with("memory.available "))
        .unwrap_or_else(|| panic!("{status}"));
    assert!(mem.contains("1Ei") && mem.ends_with("MET"), "{mem}");
    for part in [
        "configuration: valid",
        "conditions: MemoryPressure",
        "default/shown [memory.available<1Ei]",
        &format!("runtime {}: ok (containerd ", served.runtime),
        &format!(
            "CRI through criguard {}: ok (containerd ",
            served.socket.display()
        ),
        "Kubernetes API: off (no kubeconfig)",
        "\nsettings:\n",
        "evictionHard: memory.available<1Ei",
    ] {
        assert!(status.contains(part), "{part:?} not in:\n{status}");
    }
    remove_pods(&mut c.rt, [sandbox]).await;
}
