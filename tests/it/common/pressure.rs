//! Real memory pressure for end-to-end tests: a private containerd, a
//! small kubepods memcg, BestEffort pods that hold memory and grow on
//! request, and criguard started with the base flags such a test needs.
//! Drops in order: the caller drops its criguard first, then this.

use std::path::Path;
use std::time::Duration;

use k8s_cri::v1 as cri;

use super::containerd::{CriguardProcess, PrivateContainerd, unique};
use super::pods::{CgroupRoot, grow, hog, mem_total, run_pod, sleeper, wait_exited, wait_holding};
use criguard::kubelet::{ContainerSpec, PodSpec};

/// A private containerd with a kubepods memcg of a given size.
pub struct Pressure {
    /// The containerd.
    pub ctrd: PrivateContainerd,
    /// The pods' cgroup, as criguard's `--kubepods-cgroup`.
    pub kubepods: String,
    _cg: CgroupRoot,
}

impl Pressure {
    /// containerd and a `limit_mib` MiB kubepods memcg.
    pub fn new(limit_mib: i64) -> Self {
        let root = format!("/{}", unique("criguard-kube"));
        let cg = CgroupRoot(root.clone());
        let ctrd = PrivateContainerd::start();
        let kubepods = format!("{root}/kubepods");
        super::memcg::limited(&kubepods, Some(limit_mib << 20), None);
        Self {
            ctrd,
            kubepods,
            _cg: cg,
        }
    }

    /// Starts criguard with the base flags (this memcg, containerd's dir
    /// as nodefs and imagefs, housekeeping 1s, static oom scores) plus `extra`.
    pub async fn criguard(&self, state_dir: &Path, extra: &[&str]) -> CriguardProcess {
        let dir = self.ctrd.dir.to_str().unwrap();
        let state = format!("--state-dir={}", state_dir.display());
        let mut args = vec![
            "--kubepods-cgroup",
            &self.kubepods,
            "--nodefs",
            dir,
            "--imagefs",
            dir,
            "--dynamic-oom-score-adj=false",
            "--housekeeping-interval=1s",
            &state,
        ];
        args.extend_from_slice(extra);
        CriguardProcess::start(
            &self.ctrd.dir.join("criguard.sock"),
            &self.ctrd.socket,
            &args,
        )
        .await
    }

    /// A BestEffort pod in this memcg that holds `mib` MiB, and `grow_mib`
    /// more once told to ([`Self::grow`]).
    pub fn hog(&self, name: &str, mib: i64, grow_mib: i64) -> PodSpec {
        let c = ContainerSpec {
            command: hog(mib, grow_mib),
            ..sleeper("app")
        };
        self.spec(name, &unique(name), c)
    }

    /// A pod spec with this memcg and log root.
    pub fn spec(&self, name: &str, uid: &str, c: ContainerSpec) -> PodSpec {
        let mut p = PodSpec::new(name, uid).container(c);
        p.cgroup_root = self.kubepods.clone();
        p.log_root = self.ctrd.dir.join("pods").to_str().unwrap().into();
        p.node_memory = mem_total();
        p
    }

    /// Runs `pod` through `guard` and waits until its memory is held;
    /// returns (sandbox, container).
    pub async fn run(&self, guard: &CriguardProcess, pod: &PodSpec) -> (String, String) {
        let (sandbox, c) = run_pod(&mut guard.clients().rt, pod, None).await;
        wait_holding(&self.ctrd.direct().rt, &c[0], Duration::from_secs(60)).await;
        (sandbox, c[0].clone())
    }

    /// Tells a hog container to grow.
    pub async fn grow(&self, container: &str) {
        grow(&self.ctrd.direct().rt, container).await;
    }

    /// When the container exited (Unix ms), once it has.
    pub async fn exited_at_ms(&self, container: &str) -> u64 {
        let mut rt = self.ctrd.direct().rt;
        wait_exited(&rt, container, Duration::from_secs(30)).await;
        let req = cri::ContainerStatusRequest {
            container_id: container.to_owned(),
            verbose: false,
        };
        let s = rt
            .container_status(req)
            .await
            .unwrap()
            .into_inner()
            .status
            .unwrap();
        (s.finished_at / 1_000_000) as u64
    }

    /// The RunPodSandbox request the kubelet sends again for `pod`.
    pub fn retry_request(pod: &PodSpec, attempt: u32) -> cri::RunPodSandboxRequest {
        let mut again = pod.clone();
        again.attempt = attempt;
        std::fs::create_dir_all(again.log_directory()).unwrap();
        cri::RunPodSandboxRequest {
            config: Some(again.sandbox_config()),
            runtime_handler: String::new(),
        }
    }
}
