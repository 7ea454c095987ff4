//! The node model and `oom_score_adj`, against a real private containerd:
//! pods of every QoS class created the kubelet's way through criguard, the
//! model criguard keeps of them, the scores their processes really get, and
//! the model after criguard is SIGKILLed and started again.

use crate::common;

use std::collections::HashMap;

use common::containerd::{CriguardProcess, PrivateContainerd, unique};
use common::pods::{CgroupRoot, mem_total, proc_oom_score_adj, remove_pods, run_pod, sleeper};
use criguard::model::qos::QosClass;
use criguard::model::{ContainerState, Pod, SandboxState};
use criguard_test_kit::kubelet::{ContainerSpec, PodSpec};
use k8s_cri::v1 as cri;

fn by_name(pods: &[Pod]) -> HashMap<String, Pod> {
    pods.iter().map(|p| (p.name.clone(), p.clone())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_and_oom_scores_follow_the_kubelet_and_survive_sigkill() {
    // Declared first so that it is dropped last, after containerd has
    // stopped the containers whose cgroups live under it.
    let root = format!("/{}", unique("criguard-model"));
    let _cg = CgroupRoot(root.clone());
    let ctrd = PrivateContainerd::start();
    let listen = ctrd.dir.join("criguard.sock");
    // Static scores only: this test checks the kubelet's values and the
    // patch (tests/it/oom.rs covers the dynamic adjustment).
    let static_only = ["--dynamic-oom-score-adj=false"];
    let guard = CriguardProcess::start(&listen, &ctrd.socket, &static_only).await;
    let mut direct = ctrd.direct();
    let mut rt = guard.clients().rt;
    let cap = mem_total();
    let spec = |name: &str, containers: Vec<ContainerSpec>| {
        let mut p = PodSpec::new(name, &unique(name));
        p.cgroup_root = format!("{root}/kubepods");
        p.log_root = ctrd.dir.join("pods").to_str().unwrap().into();
        p.node_memory = cap;
        p.annotations
            .insert("kubernetes.io/config.source".into(), "api".into());
        p.containers = containers;
        p
    };

    let besteffort = spec("besteffort", vec![sleeper("app")]);
    let burstable = spec(
        "burstable",
        vec![ContainerSpec {
            memory_request: cap / 8,
            ..sleeper("app")
        }],
    );
    let guaranteed = spec(
        "guaranteed",
        vec![ContainerSpec {
            memory_limit: 128 << 20,
            cpu_limit_milli: 100,
            ..sleeper("app")
        }],
    );
    let mut static_pod = spec("static", vec![sleeper("app")]);
    static_pod
        .annotations
        .insert("kubernetes.io/config.source".into(), "file".into());
    let mut important = spec("important", vec![sleeper("app")]);
    important
        .annotations
        .insert("criguard.io/priority".into(), "1000".into());
    important.grace_period_s = 90;
    let mut exits = spec("exits", vec![sleeper("app")]);
    exits.containers[0].command = vec!["sh".into(), "-c".into(), "exit 3".into()];

    let (be_sb, be_c) = run_pod(&mut rt, &besteffort, None).await;
    let (_bu_sb, bu_c) = run_pod(&mut rt, &burstable, None).await;
    let (gu_sb, gu_c) = run_pod(&mut rt, &guaranteed, None).await;
    let (_st_sb, _) = run_pod(&mut rt, &static_pod, None).await;
    // A kubelet that sends 500 for a BestEffort container: criguard's patch wins.
    let (_im_sb, im_c) = run_pod(&mut rt, &important, Some(500)).await;
    let (ex_sb, _) = run_pod(&mut rt, &exits, None).await;

    // The model, as criguard learned it through the proxy.
    let pods = by_name(&guard.pods().await);
    assert_eq!(pods.len(), 6, "{pods:#?}");
    assert_eq!(pods["besteffort"].qos, QosClass::BestEffort);
    assert_eq!(pods["besteffort"].sandbox_id, be_sb);
    assert_eq!(pods["besteffort"].uid, besteffort.uid);
    assert_eq!(pods["besteffort"].memory_request(), 0);
    let bu = &pods["burstable"];
    assert_eq!(bu.qos, QosClass::Burstable);
    let derived = bu.memory_request();
    assert!(
        derived <= cap / 8 && cap / 8 - derived <= cap / 1000,
        "request {derived} vs {}",
        cap / 8
    );
    assert_eq!(
        bu.containers[&bu_c[0]].cgroup_path,
        format!("{}/{}", burstable.cgroup_parent(), bu_c[0])
    );
    let gu = &pods["guaranteed"];
    assert_eq!(
        (gu.qos, gu.memory_request()),
        (QosClass::Guaranteed, 128 << 20)
    );
    assert_eq!(gu.containers[&gu_c[0]].cpu_quota, 10_000);
    assert!(pods["static"].critical && pods["static"].static_pod);
    assert!(!pods["besteffort"].critical && !gu.critical);
    assert_eq!(
        (pods["important"].priority, pods["important"].grace_period_s),
        (1000, Some(90))
    );
    for p in pods.values() {
        assert_eq!(p.state, SandboxState::Ready, "{}", p.name);
        // No kubeconfig: every number inferred from CRI, and said so.
        assert_eq!(p.source, criguard::model::PodSource::Inferred, "{}", p.name);
    }

    // The scores the kernel will use. Negative values are clamped by this
    // test containerd (restrict_oom_score_adj) to its floor, which the pause
    // container shows: it asks for -998.
    let floor = proc_oom_score_adj(&mut direct, None, Some(&be_sb)).await;
    let bu_want = 1000 - (1000 * (cap / 8)) / cap;
    assert_eq!(
        proc_oom_score_adj(&mut direct, Some(&be_c[0]), None).await,
        1000
    );
    assert_eq!(
        proc_oom_score_adj(&mut direct, Some(&bu_c[0]), None).await,
        bu_want.max(floor)
    );
    assert_eq!(
        proc_oom_score_adj(&mut direct, Some(&gu_c[0]), None).await,
        (-997i64).max(floor)
    );
    assert_eq!(
        proc_oom_score_adj(&mut direct, Some(&im_c[0]), None).await,
        1000,
        "criguard's patch must override the kubelet's 500 for a BestEffort container"
    );
    assert!(
        floor < bu_want,
        "the test needs a floor below Burstable scores; floor {floor}"
    );

    // Pods in every state: running, exited by itself, sandbox stopped.
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: gu_sb.clone(),
    })
    .await
    .unwrap();
    common::poll_until(
        std::time::Duration::from_secs(20),
        "the exiting container to exit",
        || {
            let mut d = direct.rt.clone();
            let sb = ex_sb.clone();
            async move {
                let filter = cri::ContainerFilter {
                    pod_sandbox_id: sb,
                    ..Default::default()
                };
                let l = d
                    .list_containers(cri::ListContainersRequest {
                        filter: Some(filter),
                    })
                    .await
                    .ok()?;
                (l.into_inner().containers.first()?.state
                    == cri::ContainerState::ContainerExited as i32)
                    .then_some(())
            }
        },
    )
    .await;
    let before = guard.pods().await;
    let after_stop = by_name(&before);
    assert_eq!(after_stop["guaranteed"].state, SandboxState::NotReady);
    assert_eq!(
        after_stop["guaranteed"].containers[&gu_c[0]].state,
        ContainerState::Exited
    );
    assert!(
        after_stop["exits"]
            .containers
            .values()
            .all(|c| c.state == ContainerState::Exited)
    );

    // SIGKILL, start again: the rebuilt model is the same model.
    let status = guard.signal_and_wait(libc::SIGKILL);
    assert!(!status.success());
    let guard = CriguardProcess::start(&listen, &ctrd.socket, &static_only).await;
    let after = guard.pods().await;
    assert_eq!(before, after, "model changed across a SIGKILL restart");

    // Tear down through criguard; the model follows.
    remove_pods(&mut rt, after.iter().map(|p| p.sandbox_id.clone())).await;
    assert!(guard.pods().await.is_empty());
}
