//! Plays the kubelet for the demo: runs one pod through criguard's socket,
//! shows what the runtime reports for it, and (unless `--keep`) removes it.
//!
//! Usage: `demo_pod SOCKET LOG_ROOT [--keep]`

use std::time::Duration;

use criguard::runtime::{RuntimeEndpoint, Upstream};
use criguard_test_kit::kubelet::{ContainerSpec, PodSpec};
use k8s_cri::v1 as cri;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(socket), Some(log_root)) = (args.get(1), args.get(2)) else {
        anyhow::bail!("usage: demo_pod SOCKET LOG_ROOT [--keep]");
    };
    let keep = args.iter().any(|a| a == "--keep");
    let up = Upstream::new(RuntimeEndpoint::parse(socket)?);
    let mut rt = up.runtime();

    let v = rt
        .version(cri::VersionRequest {
            version: "v1".into(),
        })
        .await?
        .into_inner();
    println!(
        "runtime via criguard: {} {} (CRI {})",
        v.runtime_name, v.runtime_version, v.runtime_api_version
    );

    let mut pod = PodSpec::new("demo", "criguard-demo-0001").container(ContainerSpec {
        name: "hello".into(),
        image: "docker.io/library/busybox:criguard".into(),
        command: vec![
            "sh".into(),
            "-c".into(),
            "while true; do echo hello from the demo pod; sleep 5; done".into(),
        ],
        memory_request: 256 << 20,
        memory_limit: 512 << 20,
        cpu_request_milli: 100,
        ..Default::default()
    });
    pod.cgroup_root = "/criguard-demo/kubepods".into();
    // The kubelet's oom_score_adj formula divides by the node's memory.
    let meminfo = std::fs::read_to_string("/proc/meminfo")?;
    pod.node_memory = criguard::signals::node::mem_total(&meminfo).unwrap_or(pod.node_memory);
    pod.log_root = log_root.clone();
    std::fs::create_dir_all(pod.log_directory())?;
    let config = pod.sandbox_config();
    let sandbox = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await?
        .into_inner()
        .pod_sandbox_id;
    let id = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox.clone(),
            config: Some(pod.container_config(0)),
            sandbox_config: Some(config),
        })
        .await?
        .into_inner()
        .container_id;
    rt.start_container(cri::StartContainerRequest {
        container_id: id.clone(),
    })
    .await?;
    let exec = rt
        .exec_sync(cri::ExecSyncRequest {
            container_id: id.clone(),
            cmd: vec!["cat".into(), "/proc/1/cmdline".into()],
            timeout: 5,
        })
        .await?
        .into_inner();

    println!("\nPOD                  QOS         SANDBOX       CONTAINER     STATE");
    for c in rt
        .list_containers(cri::ListContainersRequest { filter: None })
        .await?
        .into_inner()
        .containers
    {
        let name = c
            .labels
            .get("io.kubernetes.pod.name")
            .cloned()
            .unwrap_or_default();
        let state = cri::ContainerState::try_from(c.state)
            .map(|s| s.as_str_name())
            .unwrap_or("?");
        println!(
            "{name:<20} {:<11} {:<13} {:<13} {state}",
            format!("{:?}", pod.qos()),
            &c.pod_sandbox_id[..12],
            &c.id[..12]
        );
    }
    println!(
        "\nexec in container: {}",
        String::from_utf8_lossy(&exec.stdout)
            .replace('\0', " ")
            .trim()
    );
    println!("cgroup parent:     {}", pod.cgroup_parent());
    println!("container log:     {}/hello/0.log", pod.log_directory());

    // Show the first log line once the runtime has written it (2 s at most).
    let log_path = format!("{}/hello/0.log", pod.log_directory());
    for _ in 0..100 {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if let Some(line) = log.lines().next() {
            println!("log so far:        {line}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if keep {
        println!("\nthe pod keeps running; its log grows every 5 s");
        return Ok(());
    }
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: sandbox.clone(),
    })
    .await?;
    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: sandbox,
    })
    .await?;
    println!("\npod stopped and removed through criguard");
    Ok(())
}
