//! The kubelet's whole pod lifecycle through criguard against a real, private
//! containerd, every answer compared with the same call made directly.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::containerd::{Clients, ContainerdVersion, CriguardProcess, PrivateContainerd, unique};
use common::pods::{BUSYBOX, CgroupRoot};
use criguard_test_kit::kubelet::{ContainerSpec, PodSpec};
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

fn sorted_images(mut l: Vec<cri::Image>) -> Vec<cri::Image> {
    l.sort_by(|a, b| a.id.cmp(&b.id));
    l
}

fn assert_same_error(direct: tonic::Status, proxied: tonic::Status) {
    assert_eq!(direct.code(), proxied.code(), "{direct:?} vs {proxied:?}");
    assert_eq!(direct.message(), proxied.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_lifecycle_through_criguard_matches_direct() {
    // Declared first so that it is dropped last, after containerd has
    // stopped the containers whose cgroups live under it.
    let root = format!("/{}", unique("criguard-test"));
    let _cg = CgroupRoot(root.clone());
    let ctrd = PrivateContainerd::start();
    let guard =
        CriguardProcess::start(&ctrd.dir.join("criguard/criguard.sock"), &ctrd.socket, &[]).await;
    let (direct, through) = (ctrd.direct(), guard.clients());
    let mut s = Sides {
        version: ctrd.version,
        d: direct.rt,
        di: direct.img,
        p: through.rt,
        pi: through.img,
    };
    identity_and_health(&mut s).await;
    runtime_config(&mut s).await;
    images(&mut s, &ctrd).await;
    let mut pod = run_pod(&mut s, &root, &ctrd).await;
    start_container(&mut s, &mut pod).await;
    stats(&mut s, &pod).await;
    exec(&mut s, &pod).await;
    update_resources(&mut s, &pod).await;
    errors(&mut s).await;
    container_events(&mut s, &pod).await;
    teardown(&mut s, &pod).await;
}

/// The same containerd twice: directly (`d`, `di`) and through criguard
/// (`p`, `pi`).
struct Sides {
    version: ContainerdVersion,
    d: RuntimeServiceClient<Channel>,
    di: ImageServiceClient<Channel>,
    p: RuntimeServiceClient<Channel>,
    pi: ImageServiceClient<Channel>,
}

/// The pod the lifecycle runs, and its container once started.
struct Pod {
    spec: PodSpec,
    sandbox_id: String,
    sandbox_config: cri::PodSandboxConfig,
    created: String,
}

/// Runtime identity and health.
async fn identity_and_health(s: &mut Sides) {
    let Sides {
        version: ctrd_version,
        d,
        p,
        ..
    } = s;
    let vreq = cri::VersionRequest {
        version: "v1".into(),
    };
    let version = p.version(vreq.clone()).await.unwrap().into_inner();
    assert_eq!(d.version(vreq).await.unwrap().into_inner(), version);
    assert!(
        ctrd_version.matches(&version.runtime_version),
        "{:?} selected, runtime says {version:?}",
        ctrd_version
    );
    let status = p
        .status(cri::StatusRequest { verbose: false })
        .await
        .unwrap()
        .into_inner();
    let direct_status = d
        .status(cri::StatusRequest { verbose: false })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status, direct_status);
    let runtime_ready = status
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.r#type == "RuntimeReady");
    assert!(
        runtime_ready.is_some_and(|c| c.status),
        "containerd must report RuntimeReady"
    );
}

/// RuntimeConfig: containerd 1.6 does not implement it (the error must be
/// the same); 2.x answers with its cgroup driver (cgroupfs here), which
/// must pass through unchanged.
async fn runtime_config(s: &mut Sides) {
    let Sides { version, d, p, .. } = s;
    match (
        *version,
        d.runtime_config(cri::RuntimeConfigRequest {}).await,
        p.runtime_config(cri::RuntimeConfigRequest {}).await,
    ) {
        (ContainerdVersion::V1_6, Err(a), Err(b)) => {
            assert_eq!(a.code(), tonic::Code::Unimplemented, "{a:?}");
            assert_same_error(a, b)
        }
        (ContainerdVersion::V2, Ok(a), Ok(b)) => {
            let b = b.into_inner();
            assert_eq!(a.into_inner(), b);
            assert_eq!(
                b.linux.map(|l| l.cgroup_driver),
                Some(cri::CgroupDriver::Cgroupfs as i32),
                "hack/containerd.sh sets SystemdCgroup = false"
            );
        }
        (v, a, b) => panic!("{v:?}: RuntimeConfig direct {a:?} but through criguard {b:?}"),
    }
}

/// Images: the image filesystem, the list and a status.
async fn images(s: &mut Sides, ctrd: &PrivateContainerd) {
    let Sides { di, pi, .. } = s;
    let fs_d = di
        .image_fs_info(cri::ImageFsInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let fs_p = pi
        .image_fs_info(cri::ImageFsInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let mounts = |r: &cri::ImageFsInfoResponse| -> Vec<String> {
        r.image_filesystems
            .iter()
            .map(|f| f.fs_id.clone().unwrap().mountpoint)
            .collect()
    };
    assert_eq!(mounts(&fs_d), mounts(&fs_p));
    assert!(
        mounts(&fs_p)[0].starts_with(ctrd.dir.to_str().unwrap()),
        "imagefs must be the private root"
    );
    let list = cri::ListImagesRequest { filter: None };
    let images = sorted_images(
        pi.list_images(list.clone())
            .await
            .unwrap()
            .into_inner()
            .images,
    );
    assert_eq!(
        sorted_images(di.list_images(list).await.unwrap().into_inner().images),
        images
    );
    assert!(
        images
            .iter()
            .any(|i| i.repo_tags.iter().any(|t| t == BUSYBOX)),
        "{images:?}"
    );
    let istatus = cri::ImageStatusRequest {
        image: Some(cri::ImageSpec {
            image: BUSYBOX.into(),
            ..Default::default()
        }),
        verbose: false,
    };
    assert_eq!(
        di.image_status(istatus.clone()).await.unwrap().into_inner(),
        pi.image_status(istatus).await.unwrap().into_inner()
    );
}

/// A Burstable pod, created the kubelet's way, through criguard.
async fn run_pod(s: &mut Sides, root: &str, ctrd: &PrivateContainerd) -> Pod {
    let Sides { d, p, .. } = s;
    let mut pod = PodSpec::new("web", &unique("uid")).container(ContainerSpec {
        name: "app".into(),
        image: BUSYBOX.into(),
        command: vec!["sleep".into(), "3600".into()],
        memory_request: 32 << 20,
        memory_limit: 64 << 20,
        cpu_request_milli: 100,
        ..Default::default()
    });
    pod.cgroup_root = format!("{root}/kubepods");
    pod.log_root = ctrd.dir.join("pods").to_str().unwrap().to_owned();
    pod.annotations = HashMap::from([("kubernetes.io/config.source".into(), "api".into())]);
    std::fs::create_dir_all(pod.log_directory()).unwrap();
    let sandbox_config = pod.sandbox_config();
    let sandbox_id = p
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox_config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    let ps = cri::PodSandboxStatusRequest {
        pod_sandbox_id: sandbox_id.clone(),
        verbose: false,
    };
    let sandbox_status = p.pod_sandbox_status(ps.clone()).await.unwrap().into_inner();
    assert_eq!(
        d.pod_sandbox_status(ps).await.unwrap().into_inner(),
        sandbox_status
    );
    let st = sandbox_status.status.unwrap();
    assert_eq!(st.state, cri::PodSandboxState::SandboxReady as i32);
    assert_eq!(st.labels["io.kubernetes.pod.uid"], pod.uid);
    assert_eq!(st.metadata.unwrap().name, "web");
    Pod {
        spec: pod,
        sandbox_id,
        sandbox_config,
        created: String::new(),
    }
}

/// A container in the pod, started.
async fn start_container(s: &mut Sides, pod: &mut Pod) {
    let Sides { d, p, .. } = s;
    let Pod {
        spec: pod_spec,
        sandbox_id,
        sandbox_config,
        created: started,
    } = pod;
    let pod = &*pod_spec;
    let created = p
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.clone(),
            config: Some(pod.container_config(0)),
            sandbox_config: Some(sandbox_config.clone()),
        })
        .await
        .unwrap()
        .into_inner()
        .container_id;
    p.start_container(cri::StartContainerRequest {
        container_id: created.clone(),
    })
    .await
    .unwrap();
    let cs = cri::ContainerStatusRequest {
        container_id: created.clone(),
        verbose: false,
    };
    let cstatus = p.container_status(cs.clone()).await.unwrap().into_inner();
    assert_eq!(d.container_status(cs).await.unwrap().into_inner(), cstatus);
    assert_eq!(
        cstatus.status.unwrap().state,
        cri::ContainerState::ContainerRunning as i32
    );
    let lc = cri::ListContainersRequest { filter: None };
    let listed = p.list_containers(lc.clone()).await.unwrap().into_inner();
    assert_eq!(d.list_containers(lc).await.unwrap().into_inner(), listed);
    assert_eq!(listed.containers.len(), 1);
    *started = created;
}

/// Stats: the same objects (values move between two calls).
async fn stats(s: &mut Sides, pod: &Pod) {
    let Sides { d, p, .. } = s;
    let Pod {
        sandbox_id,
        created,
        ..
    } = pod;
    let stats = p
        .container_stats(cri::ContainerStatsRequest {
            container_id: created.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(&stats.stats.unwrap().attributes.unwrap().id, created);
    let all = p
        .list_container_stats(cri::ListContainerStatsRequest { filter: None })
        .await
        .unwrap()
        .into_inner();
    let direct_all = d
        .list_container_stats(cri::ListContainerStatsRequest { filter: None })
        .await
        .unwrap()
        .into_inner();
    let ids = |r: &cri::ListContainerStatsResponse| -> Vec<String> {
        r.stats
            .iter()
            .map(|s| s.attributes.clone().unwrap().id)
            .collect()
    };
    assert_eq!(ids(&all), ids(&direct_all));
    let pod_stats = p
        .list_pod_sandbox_stats(cri::ListPodSandboxStatsRequest { filter: None })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(pod_stats.stats.len(), 1);
    assert_eq!(
        &pod_stats.stats[0].attributes.clone().unwrap().id,
        sandbox_id
    );
}

/// Exec.
async fn exec(s: &mut Sides, pod: &Pod) {
    let Sides { d, p, .. } = s;
    let created = &pod.created;
    let exec = cri::ExecSyncRequest {
        container_id: created.clone(),
        cmd: vec![
            "sh".into(),
            "-c".into(),
            "echo hello; echo oops >&2; exit 3".into(),
        ],
        timeout: 10,
    };
    let via = p.exec_sync(exec.clone()).await.unwrap().into_inner();
    assert_eq!(d.exec_sync(exec).await.unwrap().into_inner(), via);
    assert_eq!(
        (via.stdout.as_slice(), via.stderr.as_slice(), via.exit_code),
        (&b"hello\n"[..], &b"oops\n"[..], 3)
    );
}

/// A resource update reaches the container's real cgroup.
async fn update_resources(s: &mut Sides, pod: &Pod) {
    let Sides { p, .. } = s;
    let Pod {
        spec: pod, created, ..
    } = pod;
    p.update_container_resources(cri::UpdateContainerResourcesRequest {
        container_id: created.clone(),
        linux: Some(cri::LinuxContainerResources {
            cpu_shares: 512,
            cpu_period: 100_000,
            memory_limit_in_bytes: 96 << 20,
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    let cg = format!("{}/{created}", pod.cgroup_parent());
    let read = |ctl: &str, file: &str| {
        std::fs::read_to_string(format!("/sys/fs/cgroup/{ctl}{cg}/{file}"))
            .unwrap_or_else(|e| panic!("{ctl}{cg}/{file}: {e}"))
            .trim()
            .to_owned()
    };
    assert_eq!(read("cpu", "cpu.shares"), "512");
    assert_eq!(
        read("memory", "memory.limit_in_bytes"),
        (96u64 << 20).to_string()
    );
}

/// Errors arrive with the same code and message.
async fn errors(s: &mut Sides) {
    let Sides { d, p, .. } = s;
    let missing = cri::ContainerStatusRequest {
        container_id: "does-not-exist".into(),
        verbose: false,
    };
    assert_same_error(
        d.container_status(missing.clone()).await.unwrap_err(),
        p.container_status(missing).await.unwrap_err(),
    );
}

/// GetContainerEvents. containerd 1.6 does not serve it: both sides
/// must fail alike. 2.x does: events that found no subscriber are kept
/// (five minutes) for the next one to subscribe, later ones go to every
/// live subscriber. So the direct stream is opened first and events
/// made (a throwaway container created and removed, again) until it
/// answers, then the same for the stream through criguard: the first
/// event through criguard must be one the direct stream carried too,
/// unchanged, of a throwaway container of this pod (streaming in
/// general is proven against a recording upstream).
async fn container_events(s: &mut Sides, pod: &Pod) {
    let Sides { version, d, p, .. } = s;
    let Pod {
        spec: pod,
        sandbox_id,
        sandbox_config,
        ..
    } = pod;
    let ev = |c: &k8s_cri::v1::runtime_service_client::RuntimeServiceClient<_>| {
        let mut c = c.clone();
        async move { c.get_container_events(cri::GetEventsRequest {}).await }
    };
    match version {
        ContainerdVersion::V1_6 => match (ev(d).await, ev(p).await) {
            (Err(a), Err(b)) => {
                assert_eq!(a.code(), tonic::Code::Unimplemented, "{a:?}");
                assert_same_error(a, b)
            }
            (a, b) => panic!(
                "1.6 GetContainerEvents: direct {:?}, through criguard {:?}",
                a.map(|_| ()),
                b.map(|_| ())
            ),
        },
        ContainerdVersion::V2 => {
            let mut throwaway: Vec<String> = Vec::new();
            let mut streams = Vec::new();
            for (side, c) in [("direct", d.clone()), ("criguard", p.clone())] {
                let opened = tokio::spawn(ev(&c));
                let end = std::time::Instant::now() + Duration::from_secs(30);
                while !opened.is_finished() {
                    assert!(
                        std::time::Instant::now() < end,
                        "2.x: no container event on the {side} stream within 30 s"
                    );
                    let mut config = pod.container_config(0);
                    if let Some(m) = config.metadata.as_mut() {
                        m.attempt = 100 + throwaway.len() as u32;
                    }
                    let id = p
                        .create_container(cri::CreateContainerRequest {
                            pod_sandbox_id: sandbox_id.clone(),
                            config: Some(config),
                            sandbox_config: Some(sandbox_config.clone()),
                        })
                        .await
                        .unwrap()
                        .into_inner()
                        .container_id;
                    p.remove_container(cri::RemoveContainerRequest {
                        container_id: id.clone(),
                    })
                    .await
                    .unwrap();
                    throwaway.push(id);
                }
                streams.push(
                    opened
                        .await
                        .unwrap()
                        .unwrap_or_else(|e| panic!("2.x GetContainerEvents {side}: {e:?}"))
                        .into_inner(),
                );
            }
            let mut via = streams.pop().unwrap();
            let mut direct = streams.pop().unwrap();
            let first = tokio::time::timeout(Duration::from_secs(10), via.message())
                .await
                .expect("criguard: headers but no event")
                .unwrap()
                .expect("criguard: stream ended");
            assert!(throwaway.contains(&first.container_id), "{first:?}");
            assert_eq!(
                first.pod_sandbox_status.as_ref().map(|s| s.id.as_str()),
                Some(sandbox_id.as_str())
            );
            let mut seen = Vec::new();
            loop {
                let e = tokio::time::timeout(Duration::from_secs(10), direct.message())
                    .await
                    .unwrap_or_else(|_| {
                        panic!("the direct stream lacks {first:?}; it carried {seen:?}")
                    })
                    .unwrap()
                    .expect("direct: stream ended");
                if e == first {
                    break;
                }
                seen.push(e);
            }
        }
    }
}

/// Teardown, the kubelet's order: nothing left.
async fn teardown(s: &mut Sides, pod: &Pod) {
    let Sides { d, p, .. } = s;
    let Pod {
        sandbox_id,
        created,
        ..
    } = pod;
    p.stop_container(cri::StopContainerRequest {
        container_id: created.clone(),
        timeout: 0,
    })
    .await
    .unwrap();
    let stopped = p
        .container_status(cri::ContainerStatusRequest {
            container_id: created.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        stopped.status.unwrap().state,
        cri::ContainerState::ContainerExited as i32
    );
    p.remove_container(cri::RemoveContainerRequest {
        container_id: created.clone(),
    })
    .await
    .unwrap();
    p.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: sandbox_id.clone(),
    })
    .await
    .unwrap();
    p.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: sandbox_id.clone(),
    })
    .await
    .unwrap();
    let left = d
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .unwrap()
        .into_inner();
    assert!(left.items.is_empty(), "{left:?}");
    let left = d
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .unwrap()
        .into_inner();
    assert!(left.containers.is_empty(), "{left:?}");
}

/// `CRIGUARD_CONTAINERD_EXTRA_TOML` reaches the CRI plugin of whichever
/// containerd runs, through the section names of its config layout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_toml_reaches_the_cri_runtime_settings_of_either_containerd() {
    let version = ContainerdVersion::selected();
    let toml = version.cri_toml(false, "", "max_container_log_line_size", "12345");
    let ctrd = PrivateContainerd::start_with_toml(&toml);
    assert_eq!(ctrd.version, version);
    let config = std::fs::read_to_string(ctrd.dir.join("config.toml")).unwrap();
    assert!(
        config.contains(&format!("[{}]", version.cri_runtime_section())),
        "{config}"
    );
    let Clients { rt: mut d, .. } = ctrd.direct();
    let info = d
        .status(cri::StatusRequest { verbose: true })
        .await
        .unwrap()
        .into_inner()
        .info;
    let cri_config: serde_json::Value =
        serde_json::from_str(info.get("config").expect("verbose Status has config")).unwrap();
    // The same setting under another JSON name in each version.
    let key = match version {
        ContainerdVersion::V1_6 => "maxContainerLogSize",
        ContainerdVersion::V2 => "maxContainerLogLineSize",
    };
    assert_eq!(
        cri_config.get(key),
        Some(&serde_json::json!(12345)),
        "{key}: {cri_config}"
    );
}
