//! A private CRI-O (`hack/crio.sh`: v1.34.0 built from its Go module, with
//! Debian's conmon and runc, NRI on), everything under one directory, torn
//! down by PID on drop; and pods run on it the kubelet's way.
//!
//! Root here lacks `CAP_SYS_RESOURCE`, and CRI-O gives a pod's infra
//! container `oom_score_adj` -998: only pods that need none run, those in
//! the node's network namespace with a pid namespace per container
//! ([`crio_sandbox_config`]), CRI-O's `drop_infra_ctr` then making none.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

use crate::containerd::{Clients, unique};
use crate::kubelet::PodSpec;
use crate::repo;

/// Whether the CRI-O tests run: `CRIGUARD_CRIO=1` (`hack/test.sh` runs
/// them in a group of their own; the first run builds CRI-O, minutes).
pub fn enabled() -> bool {
    std::env::var("CRIGUARD_CRIO").as_deref() == Ok("1")
}

/// A CRI-O with its own root, runroot, config and sockets under a
/// directory of its own.
pub struct PrivateCrio {
    /// Everything of this instance lives here; `stop` removes it.
    pub dir: PathBuf,
    /// Its CRI socket.
    pub socket: PathBuf,
    /// Its NRI socket.
    pub nri_socket: PathBuf,
    /// Set `CRIGUARD_KEEP=1` to leave it running for a post-mortem.
    keep: bool,
}

impl PrivateCrio {
    /// `hack/crio.sh build` (cached after the first time), then
    /// `hack/crio.sh start DIR`; panics with CRI-O's log if it does not
    /// come up.
    pub fn start() -> Self {
        assert!(
            nix::unistd::geteuid().is_root(),
            "integration tests need root: run them with hack/test.sh"
        );
        let script = repo().join("hack/crio.sh");
        let built = Command::new(&script)
            .arg("build")
            .stderr(Stdio::inherit())
            .output()
            .expect("run hack/crio.sh build");
        assert!(built.status.success(), "hack/crio.sh build failed");
        let bin = String::from_utf8_lossy(&built.stdout)
            .lines()
            .last()
            .expect("hack/crio.sh build prints its bin dir")
            .to_owned();
        // Short: the sockets' paths must fit a unix socket address.
        let dir = std::env::temp_dir().join(unique("criguard-crio"));
        let out = Command::new(&script)
            .arg("start")
            .arg(&dir)
            .env("CRIGUARD_CRIO_BIN", &bin)
            .stderr(Stdio::inherit())
            .output()
            .expect("run hack/crio.sh start");
        let me = Self {
            socket: dir.join("crio.sock"),
            nri_socket: dir.join("nri.sock"),
            keep: std::env::var_os("CRIGUARD_KEEP").is_some(),
            dir,
        };
        assert!(
            out.status.success(),
            "private CRI-O did not start:\n{}",
            me.log_tail()
        );
        // CriguardProcess::start, given `--mode=nri`, waits for a "plugin
        // ... connected and synchronized" line naming criguard in
        // containerd.log beside the runtime's socket. CRI-O's NRI is the
        // same adaptation library (containerd/nri) and logs the same line,
        // to crio.log: the name the kit reads points there.
        std::os::unix::fs::symlink("crio.log", me.dir.join("containerd.log"))
            .expect("link containerd.log to crio.log");
        me
    }

    /// CRI clients straight to CRI-O, as the kubelet's with criguard an
    /// NRI plugin.
    pub fn direct(&self) -> Clients {
        Clients::new(&self.socket)
    }

    /// CRI-O's log lines that contain `needle`.
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("crio.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }

    /// The last 40 lines of CRI-O's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("crio.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// The directory pods' logs go under (CRI-O's `log_dir`).
    pub fn pod_logs(&self) -> PathBuf {
        self.dir.join("pod-logs")
    }
}

impl Drop for PrivateCrio {
    fn drop(&mut self) {
        if self.keep {
            eprintln!(
                "CRIGUARD_KEEP: CRI-O left running in {}",
                self.dir.display()
            );
            return;
        }
        let status = Command::new(repo().join("hack/crio.sh"))
            .arg("stop")
            .arg(&self.dir)
            .status();
        if !matches!(status, Ok(s) if s.success()) {
            eprintln!(
                "hack/crio.sh stop {} failed: {status:?}",
                self.dir.display()
            );
        }
    }
}

/// `pod`'s `PodSandboxConfig` as the kubelet sends it, but with a pid
/// namespace per container (the kubelet's for a pod without
/// `shareProcessNamespace` is POD): with it and host networking CRI-O runs
/// no infra container, whose `oom_score_adj` -998 this host cannot set.
pub fn crio_sandbox_config(pod: &PodSpec) -> cri::PodSandboxConfig {
    let mut config = pod.sandbox_config();
    let ns = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
        .expect("the kubelet's namespace options");
    ns.pid = cri::NamespaceMode::Container as i32;
    config
}

/// [`crate::pods::run_pod`] for CRI-O: the sandbox from
/// [`crio_sandbox_config`], the containers' log directories made under
/// `log_root`, as the kubelet does; `adj_override` replaces the kubelet's
/// `oom_score_adj` of each container.
pub async fn run_pod(
    rt: &mut RuntimeServiceClient<Channel>,
    pod: &PodSpec,
    log_root: &Path,
    adj_override: Option<i64>,
) -> (String, Vec<String>) {
    let mut pod = pod.clone();
    pod.log_root = log_root.display().to_string();
    // The kubelet makes each container's log directory (conmon does not).
    for c in &pod.containers {
        std::fs::create_dir_all(Path::new(&pod.log_directory()).join(&c.name)).unwrap();
    }
    let config = crio_sandbox_config(&pod);
    crate::pods::run_pod_in(rt, &pod, config, adj_override).await
}
