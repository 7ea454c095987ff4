//! Per-pod usage read by a running criguard (`GET /v1/usage`, what
//! `criguard usage` prints) against independent readings of the same
//! things: `du` of the writable layer and volumes, the overlay mount as the
//! container's own mountinfo shows it, containerd's snapshot `Usage`, the
//! log file, the pod cgroup's task files, and `statvfs` through `stat -f`.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::containerd::{CriguardProcess, PrivateContainerd, unique};
use common::pods::{BUSYBOX, CgroupRoot, create_and_start, init_pid, remove_pods};
use criguard::runtime::{RuntimeEndpoint, Upstream};
use criguard::signals::disk::DiskUsage;
use criguard::signals::table::Signal;
use criguard::signals::usage::{NodeUsage, PodUsage, counted, empty_dir_root};
use criguard_test_kit::kubelet::{ContainerSpec, PodSpec};
use k8s_cri::v1 as cri;

const MI: u64 = 1 << 20;

/// `du -s -x -B1` and `du -s -x --inodes` of `p`.
fn du(p: &Path) -> DiskUsage {
    let num = |args: &[&str]| -> u64 {
        let out = Command::new("du").args(args).arg(p).output().unwrap();
        assert!(out.status.success(), "du {args:?} {}", p.display());
        let text = String::from_utf8_lossy(&out.stdout);
        text.split_whitespace().next().unwrap().parse().unwrap()
    };
    DiskUsage {
        bytes: num(&["-s", "-x", "-B1"]),
        inodes: num(&["-s", "-x", "--inodes"]),
    }
}

/// Free and total inodes of the filesystem holding `p`, by `stat -f`.
fn stat_inodes(p: &Path) -> (u64, u64) {
    let out = Command::new("stat")
        .args(["-f", "-c", "%d %c"])
        .arg(p)
        .output()
        .unwrap();
    let f: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    (f[0], f[1])
}

/// A busybox container running `script` under `sh -c`.
fn shell(name: &str, script: &str) -> ContainerSpec {
    ContainerSpec {
        name: name.into(),
        image: BUSYBOX.into(),
        command: vec!["sh".into(), "-c".into(), script.into()],
        ..Default::default()
    }
}

/// A tmpfs mounted for the test, unmounted on drop.
struct Tmpfs(PathBuf);
impl Tmpfs {
    fn mount(at: &Path, opts: &str) -> Self {
        std::fs::create_dir_all(at).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", opts, "criguard-nodefs"])
            .arg(at)
            .status()
            .unwrap();
        assert!(ok.success(), "mount tmpfs on {}", at.display());
        Self(at.to_owned())
    }
}
impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// criguard before a private containerd, with a kubelet root and pod log
/// root of the test's own. Fields drop in order: criguard, containerd
/// (which unmounts and removes everything under its directory), cgroups.
struct Scenario {
    guard: CriguardProcess,
    ctrd: PrivateContainerd,
    kubelet_root: PathBuf,
    kubepods: String,
    sandboxes: Vec<String>,
    _cg: CgroupRoot,
}

impl Scenario {
    /// `kubelet_root` defaults to a directory beside containerd's root (one
    /// filesystem for both, as on most nodes).
    async fn start(ctrd: PrivateContainerd, kubelet_root: Option<PathBuf>) -> Self {
        let root = format!("/{}", unique("criguard-usage"));
        let cg = CgroupRoot(root.clone());
        let kubepods = format!("{root}/kubepods");
        let kubelet_root = kubelet_root.unwrap_or_else(|| ctrd.dir.join("kubelet"));
        std::fs::create_dir_all(&kubelet_root).unwrap();
        let (nodefs, imagefs) = (
            kubelet_root.to_str().unwrap().to_owned(),
            ctrd.root().to_str().unwrap().to_owned(),
        );
        let args = [
            "--kubepods-cgroup",
            &kubepods,
            "--nodefs",
            &nodefs,
            "--imagefs",
            &imagefs,
            "--snapshotter",
            "overlayfs",
            "--eviction-hard=memory.available<1Mi",
            "--dynamic-oom-score-adj=false",
        ];
        let guard =
            CriguardProcess::start(&ctrd.dir.join("criguard.sock"), &ctrd.socket, &args).await;
        Self {
            guard,
            ctrd,
            kubelet_root,
            kubepods,
            sandboxes: Vec::new(),
            _cg: cg,
        }
    }

    /// `pod` placed in this scenario: its cgroups under the test's root, its
    /// logs under the kubelet root.
    fn place(&self, mut pod: PodSpec) -> PodSpec {
        pod.cgroup_root = self.kubepods.clone();
        pod.log_root = self.kubelet_root.join("logs").to_str().unwrap().into();
        pod
    }

    /// Runs `pod` (placed) the kubelet's way, after making what the kubelet
    /// makes first: its log directories and, for each `(container, volume,
    /// path)` in `empty_dirs`, the emptyDir directory, mounted into that
    /// container at `path`. The container ids, in order.
    async fn run(&mut self, pod: &PodSpec, empty_dirs: &[(usize, &str, &str)]) -> Vec<String> {
        let mut rt = self.guard.clients().rt;
        let config = pod.sandbox_config();
        for c in &pod.containers {
            std::fs::create_dir_all(Path::new(&pod.log_directory()).join(&c.name)).unwrap();
        }
        let sandbox = rt
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            })
            .await
            .unwrap()
            .into_inner()
            .pod_sandbox_id;
        self.sandboxes.push(sandbox.clone());
        let mut ids = Vec::new();
        for i in 0..pod.containers.len() {
            let mut cc = pod.container_config(i);
            for (_, volume, path) in empty_dirs.iter().filter(|(c, ..)| *c == i) {
                let dir = empty_dir_root(&self.kubelet_root, &pod.uid).join(volume);
                std::fs::create_dir_all(&dir).unwrap();
                cc.mounts.push(cri::Mount {
                    container_path: (*path).into(),
                    host_path: dir.to_str().unwrap().into(),
                    ..Default::default()
                });
            }
            ids.push(create_and_start(&mut rt, &sandbox, cc, &config).await);
        }
        ids
    }

    /// Polls criguard's `/v1/usage` until `ready` holds for pod `uid`.
    async fn usage_when(
        &self,
        what: &str,
        uid: &str,
        ready: impl Fn(&PodUsage) -> bool,
    ) -> (NodeUsage, PodUsage) {
        common::poll_until(Duration::from_secs(60), what, || async {
            let node = criguard::admin::get_usage(&self.guard.admin).await.ok()?;
            let pod = node.pods.iter().find(|p| p.uid == uid)?.clone();
            ready(&pod).then_some((node, pod))
        })
        .await
    }

    async fn teardown(&self) {
        let mut rt = self.guard.clients().rt;
        remove_pods(&mut rt, self.sandboxes.iter().cloned()).await;
    }
}

/// The overlay upperdir of a container's root, as its own mountinfo shows it.
async fn upperdir_from_mountinfo(ctrd: &PrivateContainerd, id: &str) -> PathBuf {
    let pid = init_pid(&mut ctrd.direct(), Some(id), None).await;
    let info = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root = info
        .lines()
        .find(|l| l.split(' ').nth(4) == Some("/"))
        .unwrap_or_else(|| panic!("no root mount in {info}"));
    let opts = root.rsplit(' ').next().unwrap();
    let upper = opts
        .split(',')
        .find_map(|o| o.strip_prefix("upperdir="))
        .unwrap_or_else(|| panic!("root is not an overlay with an upperdir: {root}"));
    PathBuf::from(upper)
}

fn within(a: u64, b: u64, tolerance: u64) -> bool {
    a.abs_diff(b) <= tolerance
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_pod_usage_agrees_with_du_containerd_the_log_file_and_the_cgroup() {
    let mut sc = Scenario::start(PrivateContainerd::start(), None).await;
    let uid = unique("uid");
    let spec = PodSpec::new("usage", &uid)
        .container(shell(
            "writer",
            "dd if=/dev/zero of=/big bs=1M count=64 && touch /done && exec sleep 3600",
        ))
        .container(shell(
            "volume",
            "dd if=/dev/zero of=/scratch/data bs=1M count=8 && mkdir /scratch/many && \
             i=0; while [ $i -lt 100 ]; do echo $i > /scratch/many/f$i; i=$((i+1)); done; \
             touch /scratch/done; exec sleep 3600",
        ))
        .container(shell(
            "logger",
            "i=0; while [ $i -lt 2000 ]; do echo \"log line $i of the usage test\"; i=$((i+1)); done; \
             touch /logged; exec sleep 3600",
        ))
        .container(shell(
            "forks",
            "sleep 3600 & sleep 3600 & sleep 3600 & touch /forked; wait",
        ));
    let pod = sc.place(spec);
    let ids = sc.run(&pod, &[(1, "scratch", "/scratch")]).await;
    let upstream = Upstream::new(RuntimeEndpoint::parse(sc.ctrd.socket.to_str().unwrap()).unwrap());
    let snapshots = upstream.snapshots("overlayfs");
    let upper = snapshots.upperdir(&ids[0]).await.unwrap();
    let volume = empty_dir_root(&sc.kubelet_root, &uid).join("scratch");
    let log_dir = PathBuf::from(pod.log_directory());
    let log_file = log_dir.join("logger/0.log");
    let (_, u) = sc
        .usage_when("the containers to finish writing", &uid, |_| {
            upper.join("done").exists()
                && volume.join("done").exists()
                && std::fs::read_to_string(&log_file)
                    .is_ok_and(|t| t.contains("log line 1999 of the usage test"))
        })
        .await;

    // Writable layer: found through the snapshots API where the container's
    // own root mount says it is, and counted as du and containerd count it.
    assert_eq!(
        upper,
        upperdir_from_mountinfo(&sc.ctrd, &ids[0]).await,
        "the snapshots API names the overlay upperdir of the container's root"
    );
    let writer = u.containers.iter().find(|c| c.id == ids[0]).unwrap();
    let rootfs = writer.rootfs.expect("the writer's layer was read");
    let by_du = du(&upper);
    assert!(rootfs.bytes >= 64 * MI, "{rootfs:?}");
    assert!(
        within(rootfs.bytes, by_du.bytes, 64 << 10),
        "{rootfs:?} vs du {by_du:?}"
    );
    assert_eq!(
        rootfs.inodes, by_du.inodes,
        "inodes as du --inodes counts them"
    );
    let ctrd_usage = snapshots.usage(&ids[0]).await.unwrap();
    assert!(
        within(rootfs.bytes, ctrd_usage.size as u64, 64 << 10)
            && rootfs.inodes == ctrd_usage.inodes as u64,
        "containerd's own walk agrees: {rootfs:?} vs {ctrd_usage:?}"
    );
    let layers: u64 = u
        .containers
        .iter()
        .filter_map(|c| c.rootfs)
        .map(|r| r.bytes)
        .sum();
    assert_eq!(
        u.rootfs.bytes, layers,
        "the pod's rootfs is its containers' layers"
    );

    // emptyDir: counted as a volume, not in the writing container's layer.
    let by_du = du(&volume);
    assert_eq!(u.empty_dirs["scratch"], by_du, "emptyDir vs du");
    assert_eq!(u.volumes, by_du);
    assert!(u.volumes.bytes >= 8 * MI && u.volumes.inodes >= 103);
    let volume_layer = u
        .containers
        .iter()
        .find(|c| c.id == ids[1])
        .unwrap()
        .rootfs
        .unwrap();
    assert!(
        volume_layer.bytes < MI,
        "writes to the volume stay out of the layer: {volume_layer:?}"
    );

    // Logs: the kubelet's layout, the log file as the runtime wrote it.
    let len = std::fs::metadata(&log_file).unwrap().len();
    let logger = u.containers.iter().find(|c| c.id == ids[2]).unwrap();
    let logs = logger.logs.expect("the logger's log directory was read");
    assert_eq!(logs, du(&log_dir.join("logger")));
    assert!(
        logs.bytes >= len && logs.bytes <= len.next_multiple_of(4096) + 4096,
        "the log file of {len} bytes, its blocks and its directory's: {logs:?}"
    );
    assert_eq!(u.logs, du(&log_dir), "the pod's log directory vs du");

    // Processes: every pid of the pod's cgroup (pause, sh, three sleeps
    // and the other containers' processes), as the pids hierarchy's task
    // files list them.
    let pod_cgroup = pod.cgroup_parent();
    let tasks = || {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "find /sys/fs/cgroup/pids{pod_cgroup} -name tasks -exec cat {{}} + | wc -l"
            ))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<u64>()
            .unwrap()
    };
    // 1 pause + writer, volume, logger sleeping (3) + forks' sh and 3 sleeps.
    let (_, u) = sc
        .usage_when("8 processes in the pod", &uid, |p| p.processes == Some(8))
        .await;
    assert_eq!(
        u.processes,
        Some(tasks()),
        "criguard's count vs the pod cgroup's tasks"
    );
    assert_eq!(counted(Signal::PidAvailable, &u, false), Some(8));
    assert!(u.errors.is_empty(), "{:?}", u.errors);

    // `criguard usage` prints the same reading for people and as JSON.
    let cli = |json: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_criguard"));
        cmd.arg("usage").arg("--admin-socket").arg(&sc.guard.admin);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let table = cli(false);
    let line = table
        .lines()
        .find(|l| l.starts_with("default/usage "))
        .unwrap_or_else(|| panic!("no line for the pod:\n{table}"));
    assert!(line.trim_end().ends_with(" 8"), "8 processes: {line}");
    let parsed: NodeUsage = serde_json::from_str(&cli(true)).unwrap();
    let p = parsed.pods.iter().find(|p| p.uid == uid).unwrap();
    assert_eq!(
        (p.rootfs, p.volumes),
        (u.rootfs, u.volumes),
        "a quiet pod reads the same twice"
    );

    sc.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inode_signals_on_small_tmpfs_filesystems_match_statvfs_and_du() {
    // imagefs: containerd's root on a tmpfs of 20000 inodes; nodefs: the
    // kubelet root on another tmpfs of 2000 (so imagefs is dedicated).
    let ctrd = PrivateContainerd::start_on_tmpfs(256, Some(20_000));
    let kubelet = ctrd.dir.join("kubelet");
    let nodefs_mount = Tmpfs::mount(&kubelet, "size=64m,nr_inodes=2000,mode=0755");
    let mut sc = Scenario::start(ctrd, Some(kubelet.clone())).await;
    let uid = unique("uid");
    let pod = sc.place(PodSpec::new("inodes", &uid)).container(shell(
        "files",
        "mkdir /layer /v/many && i=0; while [ $i -lt 500 ]; do : > /layer/f$i; \
         [ $i -lt 300 ] && : > /v/many/f$i; i=$((i+1)); done; touch /v/done; exec sleep 3600",
    ));
    let ids = sc.run(&pod, &[(0, "v", "/v")]).await;
    let volume = empty_dir_root(&kubelet, &uid).join("v");
    sc.usage_when("the files written", &uid, |p| {
        volume.join("done").exists() && p.rootfs.inodes >= 502
    })
    .await;
    // A reading taken after the writer finished (the one above may predate
    // its last file), on filesystems quiet from the reading to `stat -f`:
    // criguard's statvfs equals stat -f's. containerd may still create and
    // remove files of its own on imagefs, so a reading a change fell
    // between is taken again.
    let root = sc.ctrd.root();
    let (node, u) = common::poll_until(
        Duration::from_secs(60),
        "statvfs equal to stat -f",
        || async {
            let node = criguard::admin::get_usage(&sc.guard.admin).await.ok()?;
            let pod = node.pods.iter().find(|p| p.uid == uid)?.clone();
            let (n, i) = (node.nodefs.as_ref()?, node.imagefs.as_ref()?);
            let quiet = (n.inodes_free, n.inodes) == stat_inodes(&kubelet)
                && (i.inodes_free, i.inodes) == stat_inodes(&root);
            quiet.then_some((node, pod))
        },
    )
    .await;

    assert!(
        node.dedicated_imagefs,
        "two tmpfs: imagefs is its own filesystem"
    );
    let (nodefs, imagefs) = (node.nodefs.unwrap(), node.imagefs.unwrap());
    assert_eq!((nodefs.inodes, imagefs.inodes), (2000, 20_000));
    // Everything on the nodefs tmpfs is this pod's logs and volume (plus
    // the directories leading to them): criguard's parts fit its used inodes.
    let used = nodefs.inodes - nodefs.inodes_free;
    assert!(
        u.volumes.inodes >= 302 && u.volumes.inodes + u.logs.inodes <= used,
        "{u:?}, {used} used"
    );
    assert_eq!(u.volumes, du(&volume));

    let upper = Upstream::new(RuntimeEndpoint::parse(sc.ctrd.socket.to_str().unwrap()).unwrap())
        .snapshots("overlayfs")
        .upperdir(&ids[0])
        .await
        .unwrap();
    assert_eq!(u.rootfs, du(&upper), "writable layer vs du on tmpfs");
    // The rank each inode signal uses, with a dedicated imagefs.
    assert_eq!(
        counted(Signal::NodefsInodesFree, &u, node.dedicated_imagefs),
        Some(u.logs.inodes + u.volumes.inodes)
    );
    assert_eq!(
        counted(Signal::ImagefsInodesFree, &u, node.dedicated_imagefs),
        Some(u.rootfs.inodes)
    );
    // The image store (pause and busybox blobs) is on imagefs and counted.
    let images = node.images.expect("content store read");
    assert_eq!(
        images,
        du(&sc
            .ctrd
            .root()
            .join("io.containerd.content.v1.content/blobs"))
    );
    assert!(images.inodes > 2);
    // containerd's content service lists the same blobs (all in k8s.io
    // here): one per file below blobs/sha256, logical sizes within the
    // allocated bytes.
    let listed = Upstream::new(RuntimeEndpoint::parse(sc.ctrd.socket.to_str().unwrap()).unwrap())
        .content()
        .usage()
        .await
        .unwrap();
    assert_eq!(
        listed.blobs + 2,
        images.inodes,
        "blobs/ and blobs/sha256 are the +2"
    );
    assert!(
        listed.bytes <= images.bytes && listed.bytes > images.bytes / 2,
        "{listed:?} vs {images:?}"
    );

    sc.teardown().await;
    drop(sc);
    drop(nodefs_mount);
}
