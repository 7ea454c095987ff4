//! End to end under real memory pressure: a small kubepods memcg, pods of
//! every class created the kubelet's way, one of them growing. criguard must
//! stop exactly the pod the kubelet's ranking picks, no more, say why, and
//! keep new BestEffort pods and the evicted pod out while the pressure lasts.

mod common;

use std::time::Duration;

use common::containerd::{CriguardProcess, PrivateContainerd, unique};
use common::pods::{CgroupRoot, hog, mem_total, remove_pods, run_pod, sleeper};
use criguard::kubelet::{ContainerSpec, PodSpec};
use criguard::model::SandboxState;
use k8s_cri::v1 as cri;

const MI: i64 = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_pressure_evicts_the_first_ranked_pod_only_and_admission_follows() {
    let root = format!("/{}", unique("criguard-evict"));
    let _cg = CgroupRoot(root.clone());
    let ctrd = PrivateContainerd::start();
    let kubepods = format!("{root}/kubepods");
    std::fs::create_dir_all(format!("/sys/fs/cgroup/memory{kubepods}")).unwrap();
    std::fs::write(
        format!("/sys/fs/cgroup/memory{kubepods}/memory.limit_in_bytes"),
        (320 * MI).to_string(),
    )
    .unwrap();

    let dir = ctrd.dir.to_str().unwrap().to_owned();
    let port = common::metrics::free_port();
    let metrics_address = format!("127.0.0.1:{port}");
    let args = [
        "--metrics-address",
        &metrics_address,
        "--kubepods-cgroup",
        &kubepods,
        "--nodefs",
        &dir,
        "--imagefs",
        &dir,
        "--eviction-hard=allocatableMemory.available<64Mi",
        "--housekeeping-interval=1s",
        "--eviction-pressure-transition-period=5s",
        "--dynamic-oom-score-adj=false",
    ];
    let guard = CriguardProcess::start(&ctrd.dir.join("criguard.sock"), &ctrd.socket, &args).await;
    let mut rt = guard.clients().rt;
    let direct = ctrd.direct();
    let cap = mem_total();
    let spec = |name: &str, c: ContainerSpec| {
        let mut p = PodSpec::new(name, &unique(name)).container(c);
        p.cgroup_root = kubepods.clone();
        p.log_root = ctrd.dir.join("pods").to_str().unwrap().into();
        p.node_memory = cap;
        p
    };
    let besteffort = spec(
        "besteffort-hog",
        ContainerSpec {
            command: hog(60, 160),
            ..sleeper("hog")
        },
    );
    let over = spec(
        "burstable-over",
        ContainerSpec {
            memory_request: 16 * MI,
            command: hog(40, 0),
            ..sleeper("app")
        },
    );
    let under = spec(
        "burstable-under",
        ContainerSpec {
            memory_request: 100 * MI,
            command: hog(20, 0),
            ..sleeper("app")
        },
    );
    let guaranteed = spec(
        "guaranteed",
        ContainerSpec {
            memory_limit: 64 * MI,
            cpu_limit_milli: 100,
            command: hog(10, 0),
            ..sleeper("app")
        },
    );
    let mut containers = Vec::new();
    for p in [&besteffort, &over, &under, &guaranteed] {
        let (_, c) = run_pod(&mut rt, p, None).await;
        containers.push(c[0].clone());
    }
    for c in &containers {
        common::poll_until(
            Duration::from_secs(60),
            "the pods to hold their memory",
            || {
                let mut d = direct.rt.clone();
                let id = c.clone();
                async move {
                    let cmd = vec!["test".into(), "-e".into(), "/tmp/ready".into()];
                    let r = d
                        .exec_sync(cri::ExecSyncRequest {
                            container_id: id,
                            cmd,
                            timeout: 5,
                        })
                        .await
                        .ok()?;
                    (r.into_inner().exit_code == 0).then_some(())
                }
            },
        )
        .await;
    }
    assert!(
        guard.evictions().await.is_empty(),
        "nothing may be evicted before the pressure"
    );

    // The BestEffort hog grows by 160Mi: allocatable drops below 64Mi.
    let go = cri::ExecSyncRequest {
        container_id: containers[0].clone(),
        cmd: vec!["touch".into(), "/tmp/go".into()],
        timeout: 5,
    };
    direct.rt.clone().exec_sync(go).await.unwrap();
    let evictions = common::poll_until(Duration::from_secs(60), "an eviction", || async {
        let e = guard.evictions().await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert_eq!(
        evictions[0].uid, besteffort.uid,
        "the BestEffort hog ranks first: {evictions:#?}"
    );
    assert_eq!(evictions[0].signal, "allocatableMemory.available");
    assert!(
        evictions[0]
            .message
            .starts_with("The node was low on resource: memory."),
        "{}",
        evictions[0].message
    );
    assert!(evictions[0].available < 64 * MI);

    // Conditions: MemoryPressure while it lasts.
    let conditions = guard.conditions().await;
    assert!(
        conditions["conditions"]
            .to_string()
            .contains("MemoryPressure"),
        "{conditions}"
    );

    // Admission under MemoryPressure: no new BestEffort pod, not the evicted
    // pod either; a Burstable pod is fine.
    let refused = |p: &PodSpec| {
        let mut rt = rt.clone();
        let config = p.sandbox_config();
        async move {
            std::fs::create_dir_all(config.log_directory.clone()).unwrap();
            rt.run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await
        }
    };
    let newcomer = spec("besteffort-new", sleeper("app"));
    let err = refused(&newcomer).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("MemoryPressure"), "{err:?}");
    let mut again = besteffort.clone();
    again.attempt = 1;
    let err = refused(&again).await.unwrap_err();
    assert!(err.message().contains("evicted"), "{err:?}");
    let welcome = spec(
        "burstable-new",
        ContainerSpec {
            memory_request: 8 * MI,
            ..sleeper("app")
        },
    );
    refused(&welcome)
        .await
        .expect("a Burstable pod is admitted under MemoryPressure");

    // No more victims than needed: the others all still run.
    let pods = guard.pods().await;
    for p in &pods {
        let want = if p.uid == besteffort.uid {
            SandboxState::NotReady
        } else {
            SandboxState::Ready
        };
        assert_eq!(p.state, want, "{}", p.name);
    }
    assert_eq!(guard.evictions().await.len(), 1);

    // The same story in the metrics.
    use common::metrics::{parse, scrape, value};
    let m = parse(&scrape(port));
    let evicted = [
        ("signal", "allocatableMemory.available"),
        ("qos", "BestEffort"),
    ];
    assert_eq!(value(&m, "criguard_evictions_total", &evicted), Some(1.0));
    assert!(
        value(
            &m,
            "criguard_admission_refusals_total",
            &[("condition", "MemoryPressure")]
        ) >= Some(1.0)
    );
    assert!(
        value(
            &m,
            "criguard_admission_refusals_total",
            &[("condition", "Evicted")]
        ) >= Some(1.0)
    );
    assert_eq!(
        value(&m, "criguard_pressure_to_action_seconds_count", &[]),
        Some(1.0)
    );
    let threshold = value(
        &m,
        "criguard_signal_threshold",
        &[("signal", "allocatableMemory.available")],
    );
    assert_eq!(threshold, Some((64 * MI) as f64));
    assert!(
        value(
            &m,
            "criguard_signal_available",
            &[("signal", "allocatableMemory.available")]
        )
        .is_some()
    );

    // After the transition period without pressure, BestEffort pods return.
    common::poll_until(Duration::from_secs(30), "admission to reopen", || async {
        refused(&newcomer).await.ok().map(|_| ())
    })
    .await;

    remove_pods(
        &mut rt,
        guard.pods().await.into_iter().map(|p| p.sandbox_id),
    )
    .await;
}
