//! criguard against CRI-O, not containerd: a private CRI-O v1.34.0
//! (`hack/crio.sh`, built from its Go module, Debian's conmon and runc, NRI
//! on). One scenario, both modes:
//! - as an NRI plugin on CRI-O's NRI socket, out of the kubelet's path:
//!   CRI-O synchronises the plugin, a BestEffort container created on
//!   CRI-O directly with `oom_score_adj` 500 runs with criguard's 1000, and
//!   the pod is in criguard's model;
//! - as the proxy in front of CRI-O: Version through criguard names cri-o,
//!   and a pod run through criguard is in its model.
//!
//! Runs only with `CRIGUARD_CRIO=1` (`hack/test.sh` gives it a group of
//! its own: the first run builds CRI-O); otherwise it says it is skipped
//! and passes. Pods here need no infra container: this host cannot set the
//! -998 CRI-O gives one (`common::crio`).

use crate::common;

use std::time::Duration;

use common::containerd::{CriguardProcess, unique};
use common::crio::{PrivateCrio, run_pod};
use common::kubelet::PodSpec;
use common::pods::{CgroupRoot, proc_oom_score_adj, remove_pods, sleeper};
use k8s_cri::v1 as cri;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn criguard_guards_cri_o_pods_as_an_nri_plugin_and_as_its_proxy() {
    if !common::crio::enabled() {
        eprintln!("CRI-O is tested with CRIGUARD_CRIO=1 (it builds CRI-O once): skipped here");
        return;
    }
    // Declared first, dropped last: the pods' cgroups go once CRI-O (and
    // with it every container it ran) is stopped, pass or fail.
    let root = format!("/{}", unique("criguard-crio"));
    let _cg = CgroupRoot(root.clone());
    let crio = PrivateCrio::start();
    let work = tempfile::tempdir().unwrap();
    let t = Duration::from_secs(30);
    let pod_of = |name: &str| {
        let mut pod = PodSpec::new(name, &unique(name)).container(sleeper("app"));
        pod.cgroup_root = format!("{root}/kubepods");
        pod
    };

    // (a) NRI: attached to CRI-O's NRI socket and reconciled.
    let listen = work.path().join("n.sock");
    let nri_socket = format!("--nri-socket={}", crio.nri_socket.display());
    let guard = CriguardProcess::start(&listen, &crio.socket, &["--mode=nri", &nri_socket]).await;
    let admin = guard.admin.clone();
    let line = common::poll_until(t, "criguard status --ready", || {
        let (ok, line) = common::containerd::status_ready(&admin);
        async move { ok.then_some(line) }
    })
    .await;
    assert_eq!(line, "ready");
    let synchronized = crio.log_lines("connected and synchronized");
    assert!(
        synchronized.iter().any(|l| l.contains("criguard")),
        "CRI-O's log names criguard's plugin synchronised:\n{}",
        crio.log_tail()
    );
    eprintln!("CRI-O: {}", synchronized.join("\n"));

    // A BestEffort pod created on CRI-O directly, the kubelet's way, with
    // a score criguard disagrees with: its process runs with criguard's.
    let mut c = crio.direct();
    let pod = pod_of("nri");
    let (sandbox, ids) = run_pod(&mut c.rt, &pod, &crio.pod_logs(), Some(500)).await;
    assert_eq!(
        proc_oom_score_adj(&mut c, Some(&ids[0]), None).await,
        1000,
        "CRI-O's log on the plugin:\n{}",
        crio.log_lines("criguard").join("\n")
    );
    let known = common::poll_until(t, "the NRI pod in criguard's model", || {
        let guard = &guard;
        let sandbox = sandbox.clone();
        async move {
            let pods = guard.pods().await;
            pods.into_iter().find(|p| p.sandbox_id == sandbox)
        }
    })
    .await;
    assert_eq!(known.containers[&ids[0]].oom_score_adj, 1000);
    remove_pods(&mut c.rt, [sandbox]).await;
    drop(guard);

    // (b) Proxy: criguard in front of CRI-O.
    let listen = work.path().join("p.sock");
    let proxy = CriguardProcess::start(&listen, &crio.socket, &[]).await;
    let mut p = proxy.clients();
    let version =
        p.rt.version(cri::VersionRequest::default())
            .await
            .expect("Version through criguard")
            .into_inner();
    assert_eq!(version.runtime_name, "cri-o", "{version:?}");
    let pod = pod_of("proxied");
    let (sandbox, ids) = run_pod(&mut p.rt, &pod, &crio.pod_logs(), Some(500)).await;
    let known = common::poll_until(t, "the proxied pod in criguard's model", || {
        let proxy = &proxy;
        let sandbox = sandbox.clone();
        async move {
            let pods = proxy.pods().await;
            pods.into_iter().find(|p| p.sandbox_id == sandbox)
        }
    })
    .await;
    assert!(
        known.containers.contains_key(&ids[0]),
        "the container in the model: {known:?}"
    );
    assert_eq!(
        proc_oom_score_adj(&mut p, Some(&ids[0]), None).await,
        1000,
        "the proxy's score on CRI-O"
    );
    remove_pods(&mut p.rt, [sandbox]).await;
}
