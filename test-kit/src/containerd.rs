//! A private containerd and a criguard process in front of it, started with
//! the same `hack/` scripts a user runs, and torn down by PID on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use criguard::runtime::{RuntimeEndpoint, Upstream};
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

use crate::repo;

/// A unique, readable suffix for names in one test run: the process, a
/// count of the names it made (two test threads can read the same clock
/// tick: two tests once shared one kubepods memcg and evicted each other's
/// pods), and the time, so names from earlier runs of the same pid differ.
pub fn unique(prefix: &str) -> String {
    static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{prefix}-{}-{n}-{nanos:x}", std::process::id())
}

/// Which containerd `hack/containerd.sh` runs: `CRIGUARD_CONTAINERD` unset
/// or `1.6` is Debian's 1.6, `2` the 2.x build of `hack/k8s/build.sh`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerdVersion {
    /// containerd 1.6 (config `version = 2`, one CRI plugin).
    V1_6,
    /// containerd 2.x (config `version = 3`, the CRI split in three plugins).
    V2,
}

impl ContainerdVersion {
    /// The one `CRIGUARD_CONTAINERD` selects; panics naming a bad value.
    pub fn selected() -> Self {
        match std::env::var("CRIGUARD_CONTAINERD").as_deref() {
            Err(_) | Ok("1.6") => Self::V1_6,
            Ok("2") => Self::V2,
            Ok(other) => panic!("CRIGUARD_CONTAINERD must be 1.6 or 2, got {other:?}"),
        }
    }

    /// The version the instance in `dir` runs, from the layout of the
    /// config `hack/containerd.sh` wrote there (`version = 3` is 2.x).
    fn of_config(dir: &Path) -> Self {
        let config = std::fs::read_to_string(dir.join("config.toml")).unwrap_or_default();
        if config
            .lines()
            .any(|l| matches!(l.replace(' ', "").as_str(), "version=3" | "version=4"))
        {
            Self::V2
        } else {
            Self::V1_6
        }
    }

    /// Does `runtime_version` (CRI Version's `runtime_version`) belong to
    /// this containerd? 1.6 reports e.g. `1.6.20~ds1`, 2.x `v2.3.7`.
    pub fn matches(self, runtime_version: &str) -> bool {
        let v = runtime_version.trim_start_matches('v');
        match self {
            Self::V1_6 => v.starts_with("1.6."),
            Self::V2 => v.starts_with("2."),
        }
    }

    /// The config section of the CRI runtime settings (runc options,
    /// `restrict_oom_score_adj`, CNI under `.cni`, runtimes under
    /// `.containerd.runtimes`).
    pub fn cri_runtime_section(self) -> &'static str {
        match self {
            Self::V1_6 => r#"plugins."io.containerd.grpc.v1.cri""#,
            Self::V2 => r#"plugins."io.containerd.cri.v1.runtime""#,
        }
    }

    /// The config section of the CRI image settings (the CRI snapshotter
    /// is `snapshotter` here in 2.x, `containerd.snapshotter` under the
    /// runtime section in 1.6).
    pub fn cri_images_section(self) -> &'static str {
        match self {
            Self::V1_6 => r#"plugins."io.containerd.grpc.v1.cri""#,
            Self::V2 => r#"plugins."io.containerd.cri.v1.images""#,
        }
    }

    /// `[section]` and `key = value` lines for `CRIGUARD_CONTAINERD_EXTRA_TOML`
    /// setting `key` of the CRI runtime (`images == false`) or image
    /// settings to `value` (TOML), in this version's layout. `sub` is a
    /// sub-table below it, e.g. `containerd.runtimes.runc.options`.
    pub fn cri_toml(self, images: bool, sub: &str, key: &str, value: &str) -> String {
        let base = if images {
            self.cri_images_section()
        } else {
            self.cri_runtime_section()
        };
        let section = if sub.is_empty() {
            base.to_owned()
        } else {
            format!("{base}.{sub}")
        };
        format!("[{section}]\n{key} = {value}\n")
    }
}

/// Whether the tests run criguard as an NRI plugin (`CRIGUARD_MODE=nri`,
/// with `CRIGUARD_CONTAINERD=2`): every private containerd has NRI on, and
/// the kubelet's calls go to containerd ([`CriguardProcess::kubelet`]).
pub fn nri_mode() -> bool {
    std::env::var("CRIGUARD_MODE").as_deref() == Ok("nri")
}

/// The TOML that turns NRI on in a containerd 2 of hack/containerd.sh
/// (which disables it: its default socket would be shared), its socket at
/// `nri/nri.sock` under the instance's directory. A plugin has 10 s to
/// answer instead of NRI's default 2 s: past it containerd closes the
/// plugin and creates the container unadjusted, and a test machine running
/// the suite's groups side by side can stall criguard that long; the tests
/// check what criguard answers, not how fast (benches/nri.rs measures that).
pub const NRI_ON: &str = "disabled_plugins = [\"io.containerd.snapshotter.v1.aufs\", \
    \"io.containerd.snapshotter.v1.btrfs\", \"io.containerd.snapshotter.v1.zfs\", \
    \"io.containerd.snapshotter.v1.devmapper\"]\n\
    [plugins.\"io.containerd.nri.v1.nri\"]\ndisable = false\nplugin_request_timeout = \"10s\"\n";

/// Registrations of a plugin named criguard that containerd (its log in
/// `dir`) has synchronised.
pub fn nri_registrations(dir: &Path) -> usize {
    let text = std::fs::read_to_string(dir.join("containerd.log")).unwrap_or_default();
    text.lines()
        .filter(|l| l.contains("connected and synchronized") && l.contains("criguard"))
        .count()
}

/// A containerd with its own root, state and socket under a temp directory.
pub struct PrivateContainerd {
    /// Everything of this instance lives here; `stop --purge` removes it.
    pub dir: PathBuf,
    /// Its gRPC (and CRI) socket.
    pub socket: PathBuf,
    /// Which containerd runs (what `CRIGUARD_CONTAINERD` selected).
    pub version: ContainerdVersion,
    /// TOML merged into its config (`CRIGUARD_CONTAINERD_EXTRA_TOML`),
    /// kept for [`Self::restart_daemon`].
    extra_toml: Option<String>,
    /// Set `CRIGUARD_KEEP=1` to leave it running for a post-mortem.
    keep: bool,
}

impl PrivateContainerd {
    /// Starts one; panics with containerd's log if it does not come up.
    pub fn start() -> Self {
        Self::start_in(Self::new_dir(), None)
    }

    /// [`Self::start`] with `toml` merged into the generated config
    /// (`CRIGUARD_CONTAINERD_EXTRA_TOML`); section names differ between
    /// versions: build them with [`ContainerdVersion::cri_toml`] for
    /// [`ContainerdVersion::selected`].
    pub fn start_with_toml(toml: &str) -> Self {
        Self::start_in(Self::new_dir(), Some(toml.to_owned()))
    }

    /// Starts one whose root (its imagefs: content store and snapshots)
    /// is a fresh tmpfs of `size_mib` MiB with at most `inodes` inodes;
    /// `stop` unmounts it with everything else under the directory.
    pub fn start_on_tmpfs(size_mib: u64, inodes: Option<u64>) -> Self {
        let dir = Self::new_dir();
        let root = dir.join("root");
        std::fs::create_dir_all(&root).unwrap();
        let mut opts = format!("size={size_mib}m,mode=0711");
        if let Some(n) = inodes {
            opts.push_str(&format!(",nr_inodes={n}"));
        }
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &opts, "criguard-imagefs"])
            .arg(&root)
            .status()
            .expect("run mount");
        assert!(ok.success(), "mount tmpfs on {}", root.display());
        Self::start_in(dir, None)
    }

    fn new_dir() -> PathBuf {
        assert!(
            nix_is_root(),
            "integration tests need root and containerd: run them with hack/test.sh"
        );
        tempfile::Builder::new()
            .prefix("criguard-ctrd-")
            .tempdir()
            .unwrap()
            .keep()
    }

    /// The containerd root: the imagefs criguard watches.
    pub fn root(&self) -> PathBuf {
        self.dir.join("root")
    }

    /// `hack/containerd.sh start DIR` with the caller's environment
    /// (`CRIGUARD_CONTAINERD` included) and `extra_toml`, if any.
    fn start_command(dir: &Path, extra_toml: Option<&str>) -> Command {
        let mut cmd = Command::new(repo().join("hack/containerd.sh"));
        cmd.arg("start").arg(dir).stderr(Stdio::inherit());
        if let Some(toml) = extra_toml {
            cmd.env("CRIGUARD_CONTAINERD_EXTRA_TOML", toml);
        }
        cmd
    }

    fn start_in(dir: PathBuf, extra_toml: Option<String>) -> Self {
        let wanted = ContainerdVersion::selected();
        // NRI on for a criguard attached as a plugin (top-level keys first).
        let extra_toml = match (nri_mode(), extra_toml) {
            (false, t) => t,
            (true, Some(t)) if t.contains(NRI_ON) => Some(t),
            (true, t) => Some(format!("{NRI_ON}{}", t.unwrap_or_default())),
        };
        let out = Self::start_command(&dir, extra_toml.as_deref())
            .output()
            .expect("run hack/containerd.sh");
        let keep = std::env::var_os("CRIGUARD_KEEP").is_some();
        let me = Self {
            socket: dir.join("containerd.sock"),
            version: ContainerdVersion::of_config(&dir),
            dir,
            keep,
            extra_toml,
        };
        if !out.status.success() {
            panic!(
                "private containerd did not start:\n{}",
                std::fs::read_to_string(me.dir.join("containerd.log")).unwrap_or_default()
            );
        }
        assert_eq!(
            me.version,
            wanted,
            "CRIGUARD_CONTAINERD selected {wanted:?} but {} has another config",
            me.dir.display()
        );
        me.wait_for_cri_images();
        me
    }

    /// Waits (up to 30 s) until the CRI image service lists the imported
    /// pause and busybox images by their tags: containerd 2's CRI plugin
    /// learns an import from its event stream, after `ctr import` returns,
    /// so a test's first ListImages could otherwise race it. Runs on a
    /// thread of its own, so it may be called from inside a test's runtime.
    fn wait_for_cri_images(&self) {
        let socket = self.socket.clone();
        let listed = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let mut img = Clients::new(&socket).img;
                let end = std::time::Instant::now() + Duration::from_secs(30);
                let mut tags = Vec::new();
                while std::time::Instant::now() < end {
                    let req = k8s_cri::v1::ListImagesRequest { filter: None };
                    if let Ok(r) = img.list_images(req).await {
                        tags = r
                            .into_inner()
                            .images
                            .into_iter()
                            .flat_map(|i| i.repo_tags)
                            .collect();
                        if [super::pods::BUSYBOX, "registry.k8s.io/pause:3.9"]
                            .iter()
                            .all(|want| tags.iter().any(|t| t == want))
                        {
                            return Ok(());
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(tags)
            })
        })
        .join()
        .expect("the image wait thread");
        if let Err(tags) = listed {
            panic!(
                "the CRI image service never listed pause and busybox by tag (last: {tags:?}):\n{}",
                self.log_tail()
            );
        }
    }

    /// Kills this instance's containerd daemon alone (SIGKILL, by the pid
    /// in its pid file), as a crash would: shims and containers keep
    /// running. Returns once the process is gone.
    pub fn kill_daemon(&self) {
        let pid: i32 = std::fs::read_to_string(self.dir.join("containerd.pid"))
            .expect("containerd pid file")
            .trim()
            .parse()
            .expect("a pid");
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let config = self.dir.join("config.toml");
        assert!(
            String::from_utf8_lossy(&cmdline).contains(config.to_str().unwrap()),
            "pid {pid} is not this instance's containerd"
        );
        // SAFETY: plain kill(2) on a pid checked above to be our containerd.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let end = std::time::Instant::now() + Duration::from_secs(10);
        // Gone, or a zombie until its parent (init) reaps it.
        while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        }) {
            assert!(
                std::time::Instant::now() < end,
                "containerd {pid} survived SIGKILL"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts this instance's containerd again after [`Self::kill_daemon`]
    /// (same directory: it finds its shims and containers).
    pub fn restart_daemon(&self) {
        let out = Self::start_command(&self.dir, self.extra_toml.as_deref())
            .env(
                "CRIGUARD_CONTAINERD",
                match self.version {
                    ContainerdVersion::V1_6 => "1.6",
                    ContainerdVersion::V2 => "2",
                },
            )
            .output()
            .expect("run hack/containerd.sh");
        assert!(
            out.status.success(),
            "containerd did not start again:\n{}",
            self.log_tail()
        );
    }

    /// CRI clients straight to containerd (the "direct" side of comparisons).
    pub fn direct(&self) -> Clients {
        Clients::new(&self.socket)
    }

    /// Builds (or reuses) a filler image `name` of `size_mib` MiB with
    /// `hack/images.sh --filler` and imports it into namespace k8s.io.
    pub fn import_filler(&self, name: &str, size_mib: u64) {
        self.import_fillers(&[(name, size_mib)]);
    }

    /// [`Self::import_filler`] for many images, imported in one go.
    pub fn import_fillers(&self, images: &[(&str, u64)]) {
        let cache = std::env::var_os("CRIGUARD_IMAGE_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo().join("target/criguard-images"));
        let mut tars = Vec::new();
        for (name, size_mib) in images {
            let out = Command::new(repo().join("hack/images.sh"))
                .arg(&cache)
                .args(["--filler", name, &size_mib.to_string()])
                .stderr(Stdio::inherit())
                .output()
                .expect("run hack/images.sh");
            assert!(out.status.success(), "hack/images.sh --filler {name}");
            let tar = String::from_utf8(out.stdout).unwrap();
            tars.push(
                tar.lines()
                    .last()
                    .expect("images.sh printed no archive")
                    .to_owned(),
            );
        }
        let ok = Command::new(repo().join("hack/containerd.sh"))
            .arg("import")
            .arg(&self.dir)
            .args(&tars)
            .stderr(Stdio::inherit())
            .status()
            .expect("run hack/containerd.sh import");
        assert!(ok.success(), "import {tars:?}");
    }

    /// The tail of containerd's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for PrivateContainerd {
    fn drop(&mut self) {
        if self.keep {
            eprintln!(
                "CRIGUARD_KEEP: containerd left running in {}",
                self.dir.display()
            );
            return;
        }
        let status = Command::new(repo().join("hack/containerd.sh"))
            .arg("stop")
            .arg(&self.dir)
            .arg("--purge")
            .status();
        if !matches!(status, Ok(s) if s.success()) {
            eprintln!(
                "hack/containerd.sh stop {} failed: {status:?}",
                self.dir.display()
            );
        }
    }
}

fn nix_is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// CRI v1 clients to one socket.
pub struct Clients {
    /// RuntimeService.
    pub rt: RuntimeServiceClient<Channel>,
    /// ImageService.
    pub img: ImageServiceClient<Channel>,
}

impl Clients {
    /// Clients over a lazily dialled channel to `socket`.
    pub fn new(socket: &Path) -> Self {
        let up = Upstream::new(RuntimeEndpoint::parse(socket.to_str().unwrap()).unwrap());
        Self {
            rt: up.runtime(),
            img: up.images(),
        }
    }
}

/// `criguard status --ready` on the admin socket `admin`: whether it
/// exited 0, and its one line (stdout or stderr).
pub fn status_ready(admin: &Path) -> (bool, String) {
    let out = std::process::Command::new(crate::criguard_bin())
        .args(["status", "--ready", "--admin-socket"])
        .arg(admin)
        .output()
        .expect("run criguard status --ready");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text.trim().to_owned())
}

/// The `criguard` binary serving in front of a runtime.
pub struct CriguardProcess {
    /// criguard's CRI socket (none is bound in `--mode nri`).
    pub socket: PathBuf,
    /// The socket the kubelet dials: criguard's, or the runtime's when
    /// criguard runs as an NRI plugin (`--mode=nri`).
    pub kubelet_socket: PathBuf,
    /// criguard's admin socket (next to `socket`).
    pub admin: PathBuf,
    child: Child,
}

impl CriguardProcess {
    /// Starts `criguard serve` and waits until its socket accepts.
    pub async fn start(listen: &Path, runtime: &Path, extra: &[&str]) -> Self {
        Self::start_via(&[], listen, runtime, extra).await
    }

    /// [`Self::start`] through `wrapper`, a command that execs criguard in
    /// its place (e.g. `prlimit --nofile=128:128`), so the pid is criguard's.
    pub async fn start_via(
        wrapper: &[&str],
        listen: &Path,
        runtime: &Path,
        extra: &[&str],
    ) -> Self {
        let admin = listen.with_extension("admin.sock");
        let ctrd_dir = runtime.parent().unwrap_or(runtime).to_owned();
        // Under CRIGUARD_MODE=nri a test that names no mode runs criguard
        // attached to its containerd's NRI (NRI_ON).
        let given = extra.iter().any(|a| a.starts_with("--mode"));
        let nri_flags = (nri_mode() && !given).then(|| {
            let socket = ctrd_dir.join("nri/nri.sock");
            [
                "--mode=nri".to_owned(),
                format!("--nri-socket={}", socket.display()),
            ]
        });
        let nri = nri_flags.is_some()
            || extra.windows(2).any(|w| w == ["--mode", "nri"])
            || extra.contains(&"--mode=nri");
        let registered = nri_registrations(&ctrd_dir);
        let bin = crate::criguard_bin();
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        let child = cmd
            .arg("serve")
            .arg("--listen")
            .arg(listen)
            .arg("--admin-socket")
            .arg(&admin)
            .args(
                if extra.iter().any(|a| a.starts_with("--metrics-address")) {
                    &[][..]
                } else {
                    // Parallel tests must not fight over the default port.
                    &["--metrics-address", "none"][..]
                },
            )
            .args(if extra.iter().any(|a| a.starts_with("--state-dir")) {
                vec![]
            } else {
                // Never the host's /var/lib/criguard.
                vec!["--state-dir".into(), listen.with_extension("state")]
            })
            .arg("--runtime-endpoint")
            .arg(format!("unix://{}", runtime.display()))
            .args(extra)
            .args(nri_flags.iter().flatten())
            .env(
                "CRIGUARD_LOG",
                std::env::var("CRIGUARD_LOG").unwrap_or_else(|_| "criguard=debug,info".into()),
            )
            .spawn()
            .expect("spawn criguard");
        let me = Self {
            socket: listen.to_owned(),
            kubelet_socket: if nri {
                runtime.to_owned()
            } else {
                listen.to_owned()
            },
            admin,
            child,
        };
        // As an NRI plugin criguard binds no CRI socket: its admin socket.
        let serving = if nri {
            me.admin.clone()
        } else {
            listen.to_owned()
        };
        super::poll_until(Duration::from_secs(20), "criguard's socket", || {
            let serving = serving.clone();
            async move {
                tokio::net::UnixStream::connect(serving)
                    .await
                    .ok()
                    .map(|_| ())
            }
        })
        .await;
        if nri {
            // Attached: containerd has synchronised one more registration.
            super::poll_until(Duration::from_secs(20), "criguard attached by NRI", || {
                let done = nri_registrations(&ctrd_dir) > registered;
                async move { done.then_some(()) }
            })
            .await;
        }
        me
    }

    /// CRI clients on the kubelet's socket: criguard's, or the runtime's
    /// when criguard runs as an NRI plugin.
    pub fn kubelet(&self) -> Clients {
        Clients::new(&self.kubelet_socket)
    }

    /// CRI clients through criguard.
    pub fn clients(&self) -> Clients {
        Clients::new(&self.socket)
    }

    /// Stops and removes every pod criguard's model knows, on the kubelet's
    /// socket.
    pub async fn remove_all_pods(&self) {
        let ids = self.pods().await.into_iter().map(|p| p.sandbox_id);
        super::pods::remove_pods(&mut self.kubelet().rt, ids).await;
    }

    /// The live node model, as `criguard pods --json` prints it.
    pub async fn pods(&self) -> Vec<criguard::model::Pod> {
        criguard::admin::get_pods(&self.admin)
            .await
            .expect("criguard admin socket")
    }

    /// The evictions made, as `criguard evictions --json` prints them.
    pub async fn evictions(&self) -> Vec<criguard::eviction::Eviction> {
        criguard::admin::get_evictions(&self.admin)
            .await
            .expect("criguard admin socket")
    }

    /// The evictions made, once there is at least one (panics after `deadline`).
    pub async fn first_evictions(
        &self,
        deadline: Duration,
        what: &str,
    ) -> Vec<criguard::eviction::Eviction> {
        super::poll_until(deadline, what, || async {
            let e = self.evictions().await;
            (!e.is_empty()).then_some(e)
        })
        .await
    }

    /// The kernel OOM kills recorded, as `criguard evictions --json` prints them.
    pub async fn oom_kills(&self) -> Vec<criguard::oom::kills::OomKill> {
        criguard::admin::get_oom_kills(&self.admin)
            .await
            .expect("criguard admin socket")
    }

    /// Conditions and observations, as the admin API serves them.
    pub async fn conditions(&self) -> criguard::admin::ConditionsReport {
        criguard::admin::get_conditions(&self.admin)
            .await
            .expect("criguard admin socket")
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` and waits for the exit status.
    pub fn signal_and_wait(mut self, signal: i32) -> std::process::ExitStatus {
        let signal = nix::sys::signal::Signal::try_from(signal).expect("a signal number");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), signal)
            .expect("signal our own child");
        self.child.wait().unwrap()
    }
}

impl Drop for CriguardProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Removes a cgroup subtree (relative to each v1 hierarchy and the v2 root),
/// deepest directories first. Test pods live under a unique root, so this
/// never touches cgroups the test did not cause.
pub fn remove_cgroup_tree(relative: &str) {
    let relative = relative.trim_start_matches('/');
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for h in hierarchies.flatten() {
        let top = h.path().join(relative);
        let mut dirs = Vec::new();
        collect_dirs(&top, &mut dirs);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for d in dirs {
            let _ = std::fs::remove_dir(&d);
        }
    }
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    if !dir.is_dir() {
        return;
    }
    out.push(dir.to_owned());
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                collect_dirs(&e.path(), out);
            }
        }
    }
}
