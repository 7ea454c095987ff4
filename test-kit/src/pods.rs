//! Pods created the kubelet's way through a CRI client, and what the kernel
//! says of their processes.

use std::time::Duration;

use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

use super::containerd::{Clients, remove_cgroup_tree};
use crate::kubelet::{ContainerSpec, PodSpec};

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
    criguard::signals::node::mem_total(&std::fs::read_to_string("/proc/meminfo").unwrap()).unwrap()
}

/// A one-container BestEffort pod under `/kubepods`, as the relay tests
/// send it.
pub fn besteffort_pod(uid: &str) -> PodSpec {
    let mut pod = PodSpec::new("p", uid).container(ContainerSpec {
        name: "app".into(),
        image: "busybox".into(),
        ..Default::default()
    });
    pod.cgroup_root = "/kubepods".into();
    pod
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

/// A busybox container `forker` that starts `n` sleeping children and waits.
pub fn forker(n: u32) -> ContainerSpec {
    ContainerSpec {
        name: "forker".into(),
        image: BUSYBOX.into(),
        command: vec![
            "sh".into(),
            "-c".into(),
            format!("for i in $(seq {n}); do sleep 3600 & done; wait"),
        ],
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
    run_pod_in(rt, pod, pod.sandbox_config(), adj_override).await
}

/// [`run_pod`] with `config` as the sandbox's configuration.
pub async fn run_pod_in(
    rt: &mut RuntimeServiceClient<Channel>,
    pod: &PodSpec,
    config: cri::PodSandboxConfig,
    adj_override: Option<i64>,
) -> (String, Vec<String>) {
    std::fs::create_dir_all(pod.log_directory()).unwrap();
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

/// A process that holds `mib` MiB of heap in 10 MiB steps (so it never
/// peaks much above what it holds), then, once /tmp/go exists, `grow_mib`
/// more; /tmp/ready says the first share is held. One busybox awk process
/// holds it all (strings built by `sprintf`, each page written), so an OOM
/// kill of it ends the container; about four times faster than growing
/// shell variables, which matters under the VM tier's emulated CPU.
pub fn hog(mib: i64, grow_mib: i64) -> Vec<String> {
    let program = format!(
        "function hold(n, tag,   i) {{ for (i = 0; i < n; i++) m[tag i] = sprintf(\"%10485760s\", tag i) }} \
         BEGIN {{ hold({}, \"a\"); system(\"touch /tmp/ready\"); \
           while (system(\"test -e /tmp/go\") != 0) system(\"sleep 0.1\"); \
           hold({}, \"b\"); while (1) system(\"sleep 3600\") }}",
        mib / 10,
        grow_mib / 10
    );
    vec!["awk".into(), program]
}

/// Runs `cmd` in container `id` (ExecSync, 30 s); its exit code, or `None`
/// when it could not be run.
pub async fn exec(rt: &RuntimeServiceClient<Channel>, id: &str, cmd: &[&str]) -> Option<i32> {
    let req = cri::ExecSyncRequest {
        container_id: id.to_owned(),
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        timeout: 30,
    };
    Some(rt.clone().exec_sync(req).await.ok()?.into_inner().exit_code)
}

/// Waits (up to `deadline`) until the [`hog`] in container `id` holds its
/// first share of memory (`/tmp/ready`).
pub async fn wait_holding(rt: &RuntimeServiceClient<Channel>, id: &str, deadline: Duration) {
    super::poll_until(deadline, "the hog to hold its memory", || async {
        (exec(rt, id, &["test", "-e", "/tmp/ready"]).await == Some(0)).then_some(())
    })
    .await;
}

/// Tells the [`hog`] in container `id` to take its second share.
pub async fn grow(rt: &RuntimeServiceClient<Channel>, id: &str) {
    assert_eq!(exec(rt, id, &["touch", "/tmp/go"]).await, Some(0));
}

/// Stops and removes every sandbox in `sandbox_ids` through `rt`, the
/// kubelet's teardown.
///
/// Both calls are retried for at most 10 s each, as the kubelet's pod
/// workers retry them: criguard may still be removing an evicted pod's
/// containers in the background ("already in removing state"), and
/// containerd fails a stop whose shim is exiting with the pod's last
/// process ("failed to kill container …: ttrpc: closed"). NotFound means
/// the sandbox is gone.
pub async fn remove_pods(
    rt: &mut RuntimeServiceClient<Channel>,
    sandbox_ids: impl IntoIterator<Item = String>,
) {
    for id in sandbox_ids {
        let stop = cri::StopPodSandboxRequest {
            pod_sandbox_id: id.clone(),
        };
        until_done("StopPodSandbox", &id, || {
            let mut rt = rt.clone();
            let stop = stop.clone();
            async move { rt.stop_pod_sandbox(stop).await.map(|_| ()) }
        })
        .await;
        let remove = cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.clone(),
        };
        until_done("RemovePodSandbox", &id, || {
            let mut rt = rt.clone();
            let remove = remove.clone();
            async move { rt.remove_pod_sandbox(remove).await.map(|_| ()) }
        })
        .await;
    }
}

/// Calls `call` until it succeeds or answers NotFound, at most 10 s;
/// panics with its last error after that.
async fn until_done<F, Fut>(what: &str, id: &str, mut call: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), tonic::Status>>,
{
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match call().await {
            Ok(()) => return,
            Err(e) if e.code() == tonic::Code::NotFound => return,
            Err(e) if std::time::Instant::now() < end => {
                eprintln!("remove_pods: {what} {id}: {} (retrying)", e.message());
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{what} {id}: {e}"),
        }
    }
}

/// One pod as the kubelet's memory ranking sees it: `namespace/name`,
/// priority, memory request and working set, bytes.
pub struct Ranked {
    /// `namespace/name`.
    pub pod: String,
    /// `spec.priority`.
    pub priority: i64,
    /// The request the kubelet ranks by.
    pub request: i64,
    /// The working set.
    pub usage: i64,
}

/// The kubelet's memory order (`rankMemoryPressure` in
/// `pkg/kubelet/eviction/helpers.go`), written apart from criguard's code:
/// over the request first, then lower priority, then the larger usage
/// above the request; ties keep input order.
pub fn kubelet_memory_order(mut pods: Vec<Ranked>) -> Vec<String> {
    pods.sort_by(|a, b| {
        (b.usage > b.request)
            .cmp(&(a.usage > a.request))
            .then(a.priority.cmp(&b.priority))
            .then((b.usage - b.request).cmp(&(a.usage - a.request)))
    });
    pods.into_iter().map(|p| p.pod).collect()
}
