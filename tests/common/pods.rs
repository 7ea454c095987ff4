//! Pods created the kubelet's way through a CRI client, and what the kernel
//! says of their processes.

use std::time::Duration;

use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

use super::containerd::{Clients, remove_cgroup_tree};
use criguard::kubelet::{ContainerSpec, PodSpec};

/// The busybox image hack/images.sh builds.
pub const BUSYBOX: &str = "docker.io/library/busybox:criguard";

/// Removes a test's cgroup root when dropped, pass or fail.
pub struct CgroupRoot(pub String);
impl Drop for CgroupRoot {
    fn drop(&mut self) {
        remove_cgroup_tree(&self.0);
    }
}

/// MemTotal of this machine, read independently of criguard.
pub fn mem_total() -> i64 {
    criguard::model::sync::mem_total(&std::fs::read_to_string("/proc/meminfo").unwrap()).unwrap()
}

/// A busybox container that sleeps.
pub fn sleeper(name: &str) -> ContainerSpec {
    ContainerSpec {
        name: name.into(),
        image: BUSYBOX.into(),
        command: vec!["sleep".into(), "3600".into()],
        ..Default::default()
    }
}

/// Runs `pod` through `rt` the kubelet's way; `adj_override` replaces the
/// kubelet's `oom_score_adj` in the request (a kubelet criguard disagrees with).
pub async fn run_pod(
    rt: &mut RuntimeServiceClient<Channel>,
    pod: &PodSpec,
    adj_override: Option<i64>,
) -> (String, Vec<String>) {
    std::fs::create_dir_all(pod.log_directory()).unwrap();
    let config = pod.sandbox_config();
    let sandbox = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    let mut ids = Vec::new();
    for i in 0..pod.containers.len() {
        let mut cc = pod.container_config(i);
        if let Some(adj) = adj_override {
            cc.linux
                .as_mut()
                .unwrap()
                .resources
                .as_mut()
                .unwrap()
                .oom_score_adj = adj;
        }
        let id = create_and_start(rt, &sandbox, cc, &config).await;
        ids.push(id);
    }
    (sandbox, ids)
}

/// CreateContainer then StartContainer, the kubelet's way; the container id.
pub async fn create_and_start(
    rt: &mut RuntimeServiceClient<Channel>,
    sandbox: &str,
    config: cri::ContainerConfig,
    sandbox_config: &cri::PodSandboxConfig,
) -> String {
    let req = cri::CreateContainerRequest {
        pod_sandbox_id: sandbox.to_owned(),
        config: Some(config),
        sandbox_config: Some(sandbox_config.clone()),
    };
    let id = rt
        .create_container(req)
        .await
        .unwrap()
        .into_inner()
        .container_id;
    let start = cri::StartContainerRequest {
        container_id: id.clone(),
    };
    rt.start_container(start).await.unwrap();
    id
}

/// Waits (up to `deadline`) until container `id` has exited.
pub async fn wait_exited(rt: &RuntimeServiceClient<Channel>, id: &str, deadline: Duration) {
    super::poll_until(deadline, "the container to exit", || {
        let (mut rt, id) = (rt.clone(), id.to_owned());
        async move {
            let s = rt
                .container_status(cri::ContainerStatusRequest {
                    container_id: id,
                    verbose: false,
                })
                .await
                .ok()?
                .into_inner()
                .status?;
            (s.state == cri::ContainerState::ContainerExited as i32).then_some(())
        }
    })
    .await;
}

/// The host pid of a container's (or, with `sandbox`, a sandbox's) init process.
pub async fn init_pid(c: &mut Clients, container: Option<&str>, sandbox: Option<&str>) -> i64 {
    let info = match (container, sandbox) {
        (Some(id), _) => {
            let req = cri::ContainerStatusRequest {
                container_id: id.into(),
                verbose: true,
            };
            c.rt.container_status(req).await.unwrap().into_inner().info
        }
        (_, Some(id)) => {
            let req = cri::PodSandboxStatusRequest {
                pod_sandbox_id: id.into(),
                verbose: true,
            };
            c.rt.pod_sandbox_status(req)
                .await
                .unwrap()
                .into_inner()
                .info
        }
        _ => unreachable!("name a container or a sandbox"),
    };
    let info: serde_json::Value = serde_json::from_str(&info["info"]).unwrap();
    info["pid"].as_i64().unwrap()
}

/// `/proc/<pid>/oom_score_adj`.
pub fn oom_score_adj_of(pid: i64) -> i64 {
    std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// The real `oom_score_adj` of a container's (or sandbox's) init process.
pub async fn proc_oom_score_adj(
    c: &mut Clients,
    container: Option<&str>,
    sandbox: Option<&str>,
) -> i64 {
    oom_score_adj_of(init_pid(c, container, sandbox).await)
}

/// A shell that holds `mib` MiB of heap in 10 MiB steps (so it never peaks
/// much above what it holds), then, once /tmp/go exists, `grow_mib` more.
pub fn hog(mib: i64, grow_mib: i64) -> Vec<String> {
    let script = format!(
        "hold() {{ n=$1; i=0; while [ $i -lt $n ]; do \
           eval \"v$2$i=\\$(yes aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa | head -c 10485760)\"; i=$((i+1)); done; }}; \
         hold {} a; touch /tmp/ready; \
         while [ ! -e /tmp/go ]; do sleep 0.1; done; hold {} b; while true; do sleep 3600; done",
        mib / 10,
        grow_mib / 10
    );
    vec!["sh".into(), "-c".into(), script]
}

/// Stops and removes every sandbox in `sandbox_ids` through `rt`, the
/// kubelet's teardown.
pub async fn remove_pods(
    rt: &mut RuntimeServiceClient<Channel>,
    sandbox_ids: impl IntoIterator<Item = String>,
) {
    for id in sandbox_ids {
        rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .unwrap();
        rt.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id })
            .await
            .unwrap();
    }
}
