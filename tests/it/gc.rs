//! Dead-container and sandbox GC against a real containerd: a container
//! that keeps exiting leaves only its newest dead instance, running
//! containers are never touched, a removed container's log goes with it,
//! and a pod's older empty sandbox goes.

use crate::common;

use std::time::Duration;

use common::containerd::{CriguardProcess, PrivateContainerd, unique};
use common::pods::{CgroupRoot, create_and_start, remove_pods, sleeper, wait_exited};
use criguard_test_kit::kubelet::{ContainerSpec, PodSpec};
use k8s_cri::v1 as cri;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_newest_dead_instance_and_the_newest_sandbox_remain() {
    let root = format!("/{}", unique("criguard-gc"));
    let _cg = CgroupRoot(root.clone());
    let ctrd = PrivateContainerd::start();
    let args = ["--container-gc-interval=1s"];
    let guard = CriguardProcess::start(&ctrd.dir.join("criguard.sock"), &ctrd.socket, &args).await;
    let rt = guard.kubelet().rt;
    let spec = |name: &str| {
        let mut p = PodSpec::new(name, &unique(name))
            .container(ContainerSpec {
                command: vec!["sh".into(), "-c".into(), "exit 1".into()],
                ..sleeper("crash")
            })
            .container(sleeper("keep"));
        p.cgroup_root = format!("{root}/kubepods");
        p.log_root = ctrd.dir.join("pods").to_str().unwrap().into();
        std::fs::create_dir_all(p.log_directory()).unwrap();
        p
    };
    let run = |p: &PodSpec| {
        let mut rt = rt.clone();
        let config = p.sandbox_config();
        async move {
            let req = cri::RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            };
            rt.run_pod_sandbox(req)
                .await
                .unwrap()
                .into_inner()
                .pod_sandbox_id
        }
    };
    let create = |p: &PodSpec, sandbox: &str, index: usize, attempt: u32| {
        let mut rt = rt.clone();
        let mut config = p.container_config(index);
        config.metadata.as_mut().unwrap().attempt = attempt;
        config.log_path = format!("{}/{attempt}.log", config.metadata.as_ref().unwrap().name);
        let (sandbox, sandbox_config) = (sandbox.to_owned(), p.sandbox_config());
        async move { create_and_start(&mut rt, &sandbox, config, &sandbox_config).await }
    };

    // Pod P: "crash" exits three times (the kubelet makes a new container
    // per restart), "keep" runs.
    let p = spec("crashloop");
    let sandbox = run(&p).await;
    let keep = create(&p, &sandbox, 1, 0).await;
    let mut crashes = Vec::new();
    for attempt in 0..3 {
        let id = create(&p, &sandbox, 0, attempt).await;
        wait_exited(&ctrd.direct().rt, &id, Duration::from_secs(20)).await;
        crashes.push(id);
    }
    // Pod Q: an old sandbox, stopped and empty, then a newer one.
    let mut q = spec("resandboxed");
    let old = run(&q).await;
    let stop = cri::StopPodSandboxRequest {
        pod_sandbox_id: old.clone(),
    };
    rt.clone().stop_pod_sandbox(stop).await.unwrap();
    q.attempt = 1;
    let new = run(&q).await;

    let mut direct = ctrd.direct().rt;
    let (containers, sandboxes) =
        common::poll_until(Duration::from_secs(30), "container GC", || {
            let mut d = direct.clone();
            let old = old.clone();
            async move {
                let c = d
                    .list_containers(cri::ListContainersRequest { filter: None })
                    .await
                    .ok()?
                    .into_inner()
                    .containers;
                let s = d
                    .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
                    .await
                    .ok()?
                    .into_inner()
                    .items;
                let crash_left = c
                    .iter()
                    .filter(|c| c.metadata.as_ref().unwrap().name == "crash")
                    .count();
                (crash_left == 1 && !s.iter().any(|s| s.id == old)).then_some((c, s))
            }
        })
        .await;
    let ids: Vec<&str> = containers.iter().map(|c| c.id.as_str()).collect();
    assert!(
        ids.contains(&crashes[2].as_str()),
        "the newest dead instance stays: {ids:?}"
    );
    assert!(
        ids.contains(&keep.as_str()),
        "a running container is never collected"
    );
    // The kubelet names each attempt's log <name>/<attempt>.log; removed
    // containers take their logs with them, the kept one keeps its log.
    let logs = std::path::Path::new(&p.log_directory()).join("crash");
    for attempt in 0..2 {
        let log = logs.join(format!("{attempt}.log"));
        assert!(!log.exists(), "{} should be gone", log.display());
    }
    assert!(
        logs.join("2.log").exists(),
        "the kept container's log stays"
    );
    let sids: Vec<&str> = sandboxes.iter().map(|s| s.id.as_str()).collect();
    assert!(
        sids.contains(&sandbox.as_str()) && sids.contains(&new.as_str()),
        "{sids:?}"
    );

    let all = direct
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .items;
    remove_pods(&mut guard.kubelet().rt, all.into_iter().map(|s| s.id)).await;
}
