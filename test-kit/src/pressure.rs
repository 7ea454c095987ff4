//! Pressure scenarios for end-to-end tests: a private containerd (on a
//! tmpfs of its own when disk is what runs short), a kubepods cgroup with a
//! memory and/or pids limit, criguard started with the flags every such
//! test needs, and pods placed the kubelet's way in that cgroup.
//!
//! ```ignore
//! let p = Pressure::build("criguard-pid").pids(100).start();
//! let guard = p.guard().arg("--eviction-hard=pid.available<30").start().await;
//! let (sandbox, containers) = p.start_pod(&guard, &p.pod("forker", forker(80))).await;
//! ```
//!
//! Drops in order: the caller drops its criguard first, then this.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_cri::v1 as cri;

use super::containerd::{CriguardProcess, PrivateContainerd, unique};
use super::pods::{CgroupRoot, grow, hog, mem_total, run_pod, sleeper, wait_exited, wait_holding};
use crate::kubelet::{ContainerSpec, PodSpec};

/// A private containerd and a kubepods cgroup, made by [`Builder::start`].
pub struct Pressure {
    /// The containerd.
    pub ctrd: PrivateContainerd,
    /// The pods' cgroup, as criguard's `--kubepods-cgroup`.
    pub kubepods: String,
    /// criguard's `--nodefs`: containerd's directory, or `kubelet/` on its
    /// tmpfs root.
    pub nodefs: PathBuf,
    /// criguard's `--imagefs`: containerd's directory, or its tmpfs root.
    pub imagefs: PathBuf,
    /// Where the pods' logs go (on the tmpfs, when there is one).
    pub log_root: PathBuf,
    _cg: CgroupRoot,
}

/// What a [`Pressure`] scenario is made of; [`Pressure::build`] makes one.
pub struct Builder {
    prefix: String,
    memory_mib: Option<i64>,
    pids_max: Option<i64>,
    tmpfs: Option<(u64, Option<u64>)>,
}

impl Builder {
    /// A kubepods memcg limited to `mib` MiB.
    pub fn memory_mib(mut self, mib: i64) -> Self {
        self.memory_mib = Some(mib);
        self
    }

    /// A kubepods cgroup limited to `max` tasks (the kubelet's
    /// system-reserved pids).
    pub fn pids(mut self, max: i64) -> Self {
        self.pids_max = Some(max);
        self
    }

    /// containerd's root on a fresh tmpfs of `size_mib` MiB (at most
    /// `inodes` inodes): criguard's imagefs, with its nodefs
    /// (`kubelet/`) and the pods' logs (`logs/`) on the same filesystem.
    pub fn tmpfs(mut self, size_mib: u64, inodes: Option<u64>) -> Self {
        self.tmpfs = Some((size_mib, inodes));
        self
    }

    /// Makes the cgroup and starts containerd.
    pub fn start(self) -> Pressure {
        let root = format!("/{}", unique(&self.prefix));
        let cg = CgroupRoot(root.clone());
        let kubepods = format!("{root}/kubepods");
        if self.memory_mib.is_some() || self.pids_max.is_some() {
            super::memcg::limited(&kubepods, self.memory_mib.map(|m| m << 20), self.pids_max);
        }
        let (ctrd, nodefs, imagefs, log_root) = match self.tmpfs {
            Some((size, inodes)) => {
                let ctrd = PrivateContainerd::start_on_tmpfs(size, inodes);
                let fs = ctrd.root();
                let kubelet = fs.join("kubelet");
                std::fs::create_dir_all(&kubelet).unwrap();
                let logs = fs.join("logs");
                (ctrd, kubelet, fs, logs)
            }
            None => {
                let ctrd = PrivateContainerd::start();
                let dir = ctrd.dir.clone();
                let logs = dir.join("pods");
                (ctrd, dir.clone(), dir, logs)
            }
        };
        Pressure {
            ctrd,
            kubepods,
            nodefs,
            imagefs,
            log_root,
            _cg: cg,
        }
    }
}

/// criguard's command line for a [`Pressure`] scenario; [`Pressure::guard`]
/// makes one with the base flags.
pub struct Guard<'a> {
    p: &'a Pressure,
    args: Vec<String>,
}

impl Guard<'_> {
    /// One more flag; a flag of the base set given here replaces it.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// More flags, as [`Self::arg`].
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }

    /// Metrics served on 127.0.0.1:`port`.
    pub fn metrics(self, port: u16) -> Self {
        self.arg(format!("--metrics-address=127.0.0.1:{port}"))
    }

    /// The command line: the base flags this one does not give, then its own.
    pub fn command_line(&self) -> Vec<String> {
        let p = self.p;
        let base = [
            format!("--kubepods-cgroup={}", p.kubepods),
            format!("--nodefs={}", p.nodefs.display()),
            format!("--imagefs={}", p.imagefs.display()),
            "--dynamic-oom-score-adj=false".to_owned(),
            "--housekeeping-interval=1s".to_owned(),
        ];
        let given = |flag: &str| {
            let name = flag.split('=').next().unwrap();
            self.args.iter().any(|a| a.split('=').next() == Some(name))
        };
        base.into_iter()
            .filter(|b| !given(b))
            .chain(self.args.iter().cloned())
            .collect()
    }

    /// Starts criguard in front of the scenario's containerd.
    pub async fn start(self) -> CriguardProcess {
        let args = self.command_line();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        CriguardProcess::start(
            &self.p.ctrd.dir.join("criguard.sock"),
            &self.p.ctrd.socket,
            &args,
        )
        .await
    }
}

impl Pressure {
    /// A scenario whose cgroup is named after `prefix`: nothing limited,
    /// containerd on the host's filesystem until the builder says otherwise.
    pub fn build(prefix: &str) -> Builder {
        Builder {
            prefix: prefix.to_owned(),
            memory_mib: None,
            pids_max: None,
            tmpfs: None,
        }
    }

    /// containerd and a `limit_mib` MiB kubepods memcg.
    pub fn new(limit_mib: i64) -> Self {
        Self::build("criguard-kube").memory_mib(limit_mib).start()
    }

    /// criguard's command line with the base flags: this cgroup, nodefs and
    /// imagefs as above, static oom scores, housekeeping every second.
    pub fn guard(&self) -> Guard<'_> {
        Guard {
            p: self,
            args: Vec::new(),
        }
    }

    /// Starts criguard with the base flags, `--state-dir=state_dir`, and
    /// `extra`.
    pub async fn criguard(&self, state_dir: &Path, extra: &[&str]) -> CriguardProcess {
        self.guard()
            .arg(format!("--state-dir={}", state_dir.display()))
            .args(extra)
            .start()
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

    /// A pod spec with this cgroup and log root.
    pub fn spec(&self, name: &str, uid: &str, c: ContainerSpec) -> PodSpec {
        let mut p = PodSpec::new(name, uid).container(c);
        p.cgroup_root = self.kubepods.clone();
        p.log_root = self.log_root.to_str().unwrap().into();
        p.node_memory = mem_total();
        p
    }

    /// [`Self::spec`] with a fresh uid.
    pub fn pod(&self, name: &str, c: ContainerSpec) -> PodSpec {
        self.spec(name, &unique(name), c)
    }

    /// Runs `pod` the kubelet's way (through `guard`, or to containerd
    /// with `guard` attached by NRI); returns (sandbox, containers).
    pub async fn start_pod(&self, guard: &CriguardProcess, pod: &PodSpec) -> (String, Vec<String>) {
        run_pod(&mut guard.kubelet().rt, pod, None).await
    }

    /// Runs `pod` through `guard` and waits until its memory is held;
    /// returns (sandbox, container).
    pub async fn run(&self, guard: &CriguardProcess, pod: &PodSpec) -> (String, String) {
        let (sandbox, c) = run_pod(&mut guard.kubelet().rt, pod, None).await;
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
