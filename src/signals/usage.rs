//! Per-pod disk and process usage, read directly from the filesystems.
//!
//! What the kubelet's eviction manager ranks pods by under disk and pid
//! pressure (`pkg/kubelet/eviction/helpers.go`), read now instead of from a
//! stats cache:
//!
//! - **writable layers** (`rootfs`): each container's snapshot directory,
//!   found through containerd's snapshots API ([`Snapshots::upperdir`]) and
//!   walked; containerd's own CRI stats refresh this only every ~10 s;
//! - **logs**: the pod's log directory (the kubelet writes each container's
//!   logs to `<log_directory>/<container name>/<restart>.log`);
//! - **volumes**: the pod's emptyDirs,
//!   `<kubelet root>/pods/<uid>/volumes/kubernetes.io~empty-dir/*`, counted
//!   on the kubelet root's filesystem only (a memory-backed emptyDir is a
//!   tmpfs mount and takes no disk);
//! - **processes**: pids in the pod's cgroup;
//! - and, for the node, the image content store
//!   (`<containerd root>/io.containerd.content.v1.content/blobs`), which
//!   containerd's `ImageFsInfo` leaves out (it counts snapshots only). It
//!   is walked, not asked of containerd's content service: the walk gives
//!   allocated bytes and inodes of every namespace's blobs, as imagefs
//!   pressure sees them, where `List` gives logical sizes of one
//!   namespace's blobs and no inodes, and `benches/content.rs` measures the
//!   walk faster. The content service is the fallback when the directory
//!   cannot be read from where criguard runs.
//!
//! Walks are blocking I/O: [`UsageReader::read`] runs them on tokio's
//! blocking pool, never on the thread that serves CRI calls. A part that
//! cannot be read is left at zero and named in [`PodUsage::errors`]; reading
//! usage never fails as a whole. [`counted`] says, as a pure function, which
//! part of a pod's usage a given signal ranks by.
//!
//! The pods to read come as plain data ([`UsagePod`]: who each is, where its
//! logs and cgroup are, its containers), built by the caller from the node
//! model: this module reads the node, it does not walk the model.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::disk::{self, DiskUsage};
use super::node::FsStats;
use crate::cgroup::fs::CgroupFs;
use crate::runtime::content::Content;
use crate::runtime::snapshots::Snapshots;
use crate::signals::table::{Signal, Source};

/// Where per-pod usage is read.
#[derive(Clone, Debug)]
pub struct UsageSources {
    /// The kubelet's root directory (nodefs): `pods/<uid>/volumes` below it.
    pub nodefs: PathBuf,
    /// containerd's root directory (imagefs): the content store below it.
    pub imagefs: PathBuf,
    /// The cgroup hierarchy, for process counts.
    pub cgroups: CgroupFs,
}

/// A pod whose usage is read: who it is and where its parts are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UsagePod {
    /// Sandbox id.
    pub sandbox_id: String,
    /// Pod UID (empty: unknown, no emptyDirs are read).
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Its log directory (empty: none).
    pub log_directory: String,
    /// Its cgroup from the hierarchy root; `None` when unknown.
    pub cgroup: Option<String>,
    /// Its containers, in the order their usage is reported.
    pub containers: Vec<UsageContainer>,
}

/// A container of a [`UsagePod`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UsageContainer {
    /// Container id (its writable layer is looked up by it).
    pub id: String,
    /// Container name (its logs are `<log_directory>/<name>`).
    pub name: String,
}

/// One container's share of its pod's usage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ContainerUsage {
    /// Container id.
    pub id: String,
    /// Container name.
    pub name: String,
    /// Its writable layer; `None` when it has none (snapshot removed) or it
    /// could not be read.
    pub rootfs: Option<DiskUsage>,
    /// Its log directory `<log_directory>/<name>`, shared by every attempt
    /// of that name; `None` when absent.
    pub logs: Option<DiskUsage>,
}

/// A pod's usage, read now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PodUsage {
    /// Sandbox id.
    pub sandbox_id: String,
    /// Pod UID.
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Writable layers of all its containers.
    pub rootfs: DiskUsage,
    /// Its log directory.
    pub logs: DiskUsage,
    /// Its emptyDir volumes on the kubelet's filesystem.
    pub volumes: DiskUsage,
    /// Each emptyDir by name (a memory-backed one counts zero).
    pub empty_dirs: BTreeMap<String, DiskUsage>,
    /// Processes in its cgroup; `None` when the cgroup is gone or unknown.
    pub processes: Option<u64>,
    /// Per container.
    pub containers: Vec<ContainerUsage>,
    /// What could not be read, each naming the path or container.
    pub errors: Vec<String>,
}

impl PodUsage {
    /// Writable layers, logs and volumes together.
    pub fn total(&self) -> DiskUsage {
        self.rootfs + self.logs + self.volumes
    }

    /// `pod` with nothing counted yet.
    fn nothing(pod: &UsagePod) -> Self {
        PodUsage {
            sandbox_id: pod.sandbox_id.clone(),
            uid: pod.uid.clone(),
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            rootfs: DiskUsage::default(),
            logs: DiskUsage::default(),
            volumes: DiskUsage::default(),
            empty_dirs: BTreeMap::new(),
            processes: None,
            containers: Vec::new(),
            errors: Vec::new(),
        }
    }
}

/// The node's usage: filesystems, the image store and every pod.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeUsage {
    /// The kubelet root's filesystem (`None`: unreadable).
    pub nodefs: Option<FsStats>,
    /// containerd root's filesystem (`None`: unreadable).
    pub imagefs: Option<FsStats>,
    /// True when imagefs is a filesystem of its own, not nodefs.
    pub dedicated_imagefs: bool,
    /// The image content store (`None`: absent or unreadable).
    pub images: Option<DiskUsage>,
    /// Every pod, in the order given.
    pub pods: Vec<PodUsage>,
    /// How long the reading took, in microseconds.
    pub read_us: u64,
}

impl NodeUsage {
    /// The usage of the pod with sandbox `sandbox_id`.
    pub fn pod(&self, sandbox_id: &str) -> Option<&PodUsage> {
        self.pods.iter().find(|p| p.sandbox_id == sandbox_id)
    }
}

/// The part of a pod's usage that `signal` ranks by, as the kubelet's
/// eviction manager chooses it (`buildSignalToRankFunc`): with a dedicated
/// imagefs, nodefs signals count logs and volumes and imagefs signals the
/// writable layers; without, both count all three. Bytes for
/// `*.available`, inodes for `*.inodesFree`, processes for
/// `pid.available`; `None` for memory and swap signals (and unknown
/// process counts).
pub fn counted(signal: Signal, pod: &PodUsage, dedicated_imagefs: bool) -> Option<u64> {
    match signal.source() {
        Source::Memcg(_) | Source::Swap | Source::Psi(_) => return None,
        Source::Pids => return pod.processes,
        Source::Statfs(_) => {}
    }
    let p = signal.pod_parts(dedicated_imagefs)?;
    let part = pod.rootfs.only(p.rootfs) + pod.logs.only(p.logs) + pod.volumes.only(p.volumes);
    Some(if signal.is_bytes() {
        part.bytes
    } else {
        part.inodes
    })
}

/// The directory of the pod's emptyDir volumes under the kubelet root.
pub fn empty_dir_root(kubelet_root: &Path, uid: &str) -> PathBuf {
    kubelet_root
        .join("pods")
        .join(uid)
        .join("volumes")
        .join("kubernetes.io~empty-dir")
}

/// The image content store's blobs under containerd's root.
pub fn content_blobs(containerd_root: &Path) -> PathBuf {
    containerd_root.join("io.containerd.content.v1.content/blobs")
}

/// Walks `path`: `None` when it does not exist (nothing to count); other
/// errors go to `errors`, prefixed with `what` when it names more than the
/// path does.
fn walk_some(path: &Path, what: Option<&str>, errors: &mut Vec<String>) -> Option<DiskUsage> {
    match disk::walk(path) {
        Ok(w) => Some(w.usage),
        Err(e) if e.is_not_found() => None,
        Err(e) => {
            errors.push(match what {
                Some(w) => format!("{w}: {e}"),
                None => e.to_string(),
            });
            None
        }
    }
}

/// Where each container's writable layer is: the directory, or why it is
/// not known (`None` when the snapshot does not exist, which is no error).
pub type Layers = HashMap<String, Result<Option<PathBuf>, String>>;

/// Reads one pod's usage (blocking I/O). `layers` holds the writable-layer
/// directories of its containers, looked up beforehand.
pub fn read_pod(pod: &UsagePod, layers: &Layers, src: &UsageSources) -> PodUsage {
    let mut errors = Vec::new();
    let mut containers = Vec::new();
    let log_dir = (!pod.log_directory.is_empty()).then(|| PathBuf::from(&pod.log_directory));
    let mut logs_by_name: HashMap<&str, Option<DiskUsage>> = HashMap::new();
    for c in &pod.containers {
        let what = format!("container {}", c.id);
        let rootfs = match layers.get(&c.id) {
            // Absent: removed with its container since the lookup.
            Some(Ok(Some(dir))) => walk_some(dir, Some(&what), &mut errors),
            Some(Err(e)) => {
                errors.push(format!("{what}: {e}"));
                None
            }
            Some(Ok(None)) | None => None,
        };
        let logs = *logs_by_name
            .entry(&c.name)
            .or_insert_with(|| walk_some(&log_dir.as_ref()?.join(&c.name), None, &mut errors));
        containers.push(ContainerUsage {
            id: c.id.clone(),
            name: c.name.clone(),
            rootfs,
            logs,
        });
    }
    let rootfs = containers.iter().filter_map(|c| c.rootfs).sum();
    let logs = log_dir
        .and_then(|dir| walk_some(&dir, None, &mut errors))
        .unwrap_or_default();
    let mut empty_dirs = BTreeMap::new();
    if !pod.uid.is_empty() {
        let root = empty_dir_root(&src.nodefs, &pod.uid);
        match (disk::device_of(&root), std::fs::read_dir(&root)) {
            (Ok(device), Ok(entries)) => {
                for e in entries.flatten() {
                    match disk::walk_on(&e.path(), device) {
                        Ok(w) => {
                            empty_dirs
                                .insert(e.file_name().to_string_lossy().into_owned(), w.usage);
                        }
                        Err(err) if err.is_not_found() => {}
                        Err(err) => errors.push(err.to_string()),
                    }
                }
            }
            (Err(e), _) if e.is_not_found() => {}
            (Err(e), _) => errors.push(e.to_string()),
            (_, Err(e)) => errors.push(format!("{}: {e}", root.display())),
        }
    }
    let processes = match pod.cgroup.as_ref().map(|cg| src.cgroups.pids(cg)) {
        None => None,
        Some(Ok(p)) => Some(p.len() as u64),
        Some(Err(e)) if e.source.kind() == std::io::ErrorKind::NotFound => None,
        Some(Err(e)) => {
            errors.push(e.to_string());
            None
        }
    };
    PodUsage {
        rootfs,
        logs,
        volumes: empty_dirs.values().copied().sum(),
        empty_dirs,
        processes,
        containers,
        errors,
        ..PodUsage::nothing(pod)
    }
}

/// Reads the node's usage (blocking I/O): filesystems, the image store
/// when `images` says so, and every pod in `pods` with the writable layers
/// in `layers`.
pub fn read_node(
    pods: &[UsagePod],
    layers: &Layers,
    src: &UsageSources,
    images: bool,
) -> NodeUsage {
    let started = Instant::now();
    let nodefs = super::probe::statvfs_blocking(&src.nodefs)
        .inspect_err(|e| tracing::debug!(%e, "nodefs not read"))
        .ok();
    let imagefs = super::probe::statvfs_blocking(&src.imagefs)
        .inspect_err(|e| tracing::debug!(%e, "imagefs not read"))
        .ok();
    let dedicated_imagefs = disk::dedicated_imagefs(&src.nodefs, &src.imagefs);
    let images = match images.then(|| disk::walk(&content_blobs(&src.imagefs))) {
        None => None,
        Some(Ok(w)) => Some(w.usage),
        Some(Err(e)) => {
            if !e.is_not_found() {
                tracing::warn!(%e, "image content store not read");
            }
            None
        }
    };
    let pods = pods.iter().map(|p| read_pod(p, layers, src)).collect();
    NodeUsage {
        nodefs,
        imagefs,
        dedicated_imagefs,
        images,
        pods,
        read_us: started.elapsed().as_micros() as u64,
    }
}

/// How long one snapshots call may take before the container is reported
/// unreadable for this round.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Reads per-pod usage on demand: looks up writable layers through
/// containerd (cached per container), then walks on the blocking pool.
/// Clones share the cache.
#[derive(Clone, Debug)]
pub struct UsageReader {
    snapshots: Snapshots,
    sources: Arc<UsageSources>,
    content: Option<Content>,
}

impl UsageReader {
    /// A reader over `snapshots` and `sources`.
    pub fn new(snapshots: Snapshots, sources: UsageSources) -> Self {
        Self {
            snapshots,
            sources: Arc::new(sources),
            content: None,
        }
    }

    /// The same reader, asking `content` (containerd's content service) for
    /// the image store when its directory cannot be walked.
    pub fn with_content(mut self, content: Content) -> Self {
        self.content = Some(content);
        self
    }

    /// The image store as containerd's content service lists it: bytes
    /// (logical) and one inode per blob; `None` when it does not answer.
    async fn listed_images(&self) -> Option<DiskUsage> {
        let content = self.content.as_ref()?;
        match tokio::time::timeout(LOOKUP_TIMEOUT, content.usage()).await {
            Ok(Ok(c)) => Some(DiskUsage {
                bytes: c.bytes,
                inodes: c.blobs,
            }),
            Ok(Err(e)) => {
                tracing::debug!(err = %e, "content store not listed");
                None
            }
            Err(_) => None,
        }
    }

    /// Where each container of `pods` keeps its writable layer; forgets
    /// cached directories of containers no longer in `pods`.
    pub async fn layers(&self, pods: &[UsagePod]) -> Layers {
        let mut out = Layers::new();
        let ids: HashSet<&str> = pods
            .iter()
            .flat_map(|p| p.containers.iter().map(|c| c.id.as_str()))
            .collect();
        self.snapshots.retain(&ids);
        for id in ids {
            let found =
                match tokio::time::timeout(LOOKUP_TIMEOUT, self.snapshots.upperdir(id)).await {
                    Ok(Ok(dir)) => Ok(Some(dir)),
                    Ok(Err(e)) if e.is_not_found() => Ok(None),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err(format!("snapshots Mounts: no answer in {LOOKUP_TIMEOUT:?}")),
                };
            out.insert(id.to_owned(), found);
        }
        out
    }

    /// Everything, read now; the walks run off the async thread. A
    /// filesystem whose observation is stuck ([`super::probe`]) is not
    /// walked, and a walk that has not finished in [`WALK_DEADLINE`] is
    /// left to its thread and answered as unread: a hung mount never holds
    /// the caller (an eviction round, an admin call), and never more than
    /// one walk waits on it.
    pub async fn read(&self, pods: Vec<UsagePod>) -> NodeUsage {
        self.read_with(pods, true).await
    }

    /// [`UsageReader::read`] without the image store (`images` `None`):
    /// what only the pods' own usage needs.
    pub async fn read_pods(&self, pods: Vec<UsagePod>) -> NodeUsage {
        self.read_with(pods, false).await
    }

    async fn read_with(&self, pods: Vec<UsagePod>, images: bool) -> NodeUsage {
        for fs in [&self.sources.nodefs, &self.sources.imagefs] {
            if let Err(e @ super::probe::ProbeError::Stuck { .. }) = super::probe::statvfs(fs).await
            {
                return unread(&pods, &e.to_string());
            }
        }
        let layers = self.layers(&pods).await;
        let sources = self.sources.clone();
        let fallback = pods.clone();
        let walk = tokio::task::spawn_blocking(move || read_node(&pods, &layers, &sources, images));
        match tokio::time::timeout(WALK_DEADLINE, walk).await {
            Ok(Ok(mut u)) => {
                if images && u.images.is_none() {
                    u.images = self.listed_images().await;
                }
                u
            }
            // A panic in a walk must not take the caller down.
            Ok(Err(e)) => {
                tracing::error!(err = %e, "usage reading failed");
                unread(&fallback, &format!("usage reading failed: {e}"))
            }
            Err(_) => {
                tracing::warn!(deadline = ?WALK_DEADLINE, "usage walk not finished within its deadline (a hung filesystem?); answered as unread");
                unread(
                    &fallback,
                    &format!("usage walk not finished in {WALK_DEADLINE:?}"),
                )
            }
        }
    }
}

/// How long a usage walk is waited for.
pub const WALK_DEADLINE: Duration = Duration::from_secs(30);

/// Every pod's usage unread, with `why`.
fn unread(pods: &[UsagePod], why: &str) -> NodeUsage {
    NodeUsage {
        nodefs: None,
        imagefs: None,
        dedicated_imagefs: false,
        images: None,
        pods: pods
            .iter()
            .map(|p| PodUsage {
                errors: vec![why.to_owned()],
                ..PodUsage::nothing(p)
            })
            .collect(),
        read_us: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signals::write_fixture as write;

    fn usage(bytes: u64, inodes: u64) -> DiskUsage {
        DiskUsage { bytes, inodes }
    }

    fn pod_usage(rootfs: DiskUsage, logs: DiskUsage, volumes: DiskUsage) -> PodUsage {
        PodUsage {
            rootfs,
            logs,
            volumes,
            processes: Some(7),
            ..PodUsage::nothing(&model_pod(Path::new("/nowhere"), "/kubepods/pod1"))
        }
    }

    /// A pod "p" (uid "u1", log dir `<logs>/ns_p_u1`) with containers c1
    /// ("app") and c2 ("side").
    fn model_pod(logs: &Path, parent: &str) -> UsagePod {
        UsagePod {
            sandbox_id: "s1".into(),
            name: "p".into(),
            namespace: "ns".into(),
            uid: "u1".into(),
            cgroup: crate::cgroup::path::pod(parent),
            log_directory: logs.join("ns_p_u1").display().to_string(),
            containers: [("c1", "app"), ("c2", "side")]
                .map(|(id, name)| UsageContainer {
                    id: id.into(),
                    name: name.into(),
                })
                .into(),
        }
    }

    #[test]
    fn with_a_dedicated_imagefs_nodefs_counts_logs_and_volumes_and_imagefs_writable_layers() {
        let p = pod_usage(usage(100, 1), usage(20, 2), usage(3, 4));
        let table = [
            (Signal::NodefsAvailable, Some(23)),
            (Signal::NodefsInodesFree, Some(6)),
            (Signal::ImagefsAvailable, Some(100)),
            (Signal::ImagefsInodesFree, Some(1)),
            (Signal::PidAvailable, Some(7)),
            (Signal::MemoryAvailable, None),
        ];
        for (sig, want) in table {
            assert_eq!(counted(sig, &p, true), want, "{sig}");
        }
    }

    #[test]
    fn without_a_dedicated_imagefs_every_disk_signal_counts_everything() {
        let p = pod_usage(usage(100, 1), usage(20, 2), usage(3, 4));
        for (sig, want) in [
            (Signal::NodefsAvailable, Some(123)),
            (Signal::NodefsInodesFree, Some(7)),
            (Signal::ImagefsAvailable, Some(123)),
            (Signal::ImagefsInodesFree, Some(7)),
            (Signal::AllocatableMemoryAvailable, None),
        ] {
            assert_eq!(counted(sig, &p, false), want, "{sig}");
        }
    }

    #[test]
    fn a_pod_from_a_fixture_tree() {
        let t = tempfile::tempdir().unwrap();
        let (logs, kubelet, upper) = (
            t.path().join("logs"),
            t.path().join("kubelet"),
            t.path().join("upper"),
        );
        write(&logs, "ns_p_u1/app/0.log", &"x".repeat(10_000));
        write(&logs, "ns_p_u1/app/1.log", "y");
        write(&logs, "ns_p_u1/side/0.log", "z");
        let vols = empty_dir_root(&kubelet, "u1");
        write(&vols, "cache/a", &"a".repeat(50_000));
        write(&vols, "scratch/b/c", "c");
        write(&upper, "big", &"b".repeat(200_000));
        let cg = t.path().join("cg");
        write(&cg, "cgroup.controllers", "memory pids\n");
        write(&cg, "kubepods/pod1/cgroup.procs", "");
        write(&cg, "kubepods/pod1/c1/cgroup.procs", "10\n11\n");
        write(&cg, "kubepods/pod1/c2/cgroup.procs", "12\n");
        let src = UsageSources {
            nodefs: kubelet.clone(),
            imagefs: t.path().join("containerd"),
            cgroups: CgroupFs::detect(&cg),
        };
        let pod = model_pod(&logs, "/kubepods/pod1");
        let layers = Layers::from([
            ("c1".to_owned(), Ok(Some(upper.clone()))),
            ("c2".to_owned(), Ok(None)),
        ]);
        let u = read_pod(&pod, &layers, &src);
        let walk = |p: &Path| disk::walk(p).unwrap().usage;
        assert_eq!(u.errors, Vec::<String>::new());
        assert_eq!(u.rootfs, walk(&upper));
        assert_eq!(u.logs, walk(&logs.join("ns_p_u1")));
        assert_eq!(u.containers[0].logs, Some(walk(&logs.join("ns_p_u1/app"))));
        assert_eq!(u.containers[1].rootfs, None, "no snapshot, no layer");
        assert_eq!(
            u.volumes,
            walk(&vols.join("cache")) + walk(&vols.join("scratch"))
        );
        assert_eq!(u.empty_dirs.len(), 2);
        assert_eq!(u.processes, Some(3));
        // The image store is absent: no number, no error.
        let node = read_node(std::slice::from_ref(&pod), &layers, &src, true);
        assert_eq!(node.images, None);
        assert!(!node.dedicated_imagefs, "one filesystem for both");
        assert_eq!(node.pod("s1"), Some(&u));
        assert_eq!(node.pods, vec![u]);
    }

    #[test]
    fn unreadable_parts_are_named_and_the_rest_still_counts() {
        let t = tempfile::tempdir().unwrap();
        let logs = t.path().join("logs");
        write(&logs, "ns_p_u1/app/0.log", "x");
        let src = UsageSources {
            nodefs: t.path().join("kubelet"),
            imagefs: t.path().to_owned(),
            cgroups: CgroupFs::detect(&t.path().join("no-cgroups")),
        };
        let pod = model_pod(&logs, "/kubepods/pod1");
        let layers = Layers::from([(
            "c1".to_owned(),
            Err("snapshots Mounts of \"c1\": unavailable".to_owned()),
        )]);
        let u = read_pod(&pod, &layers, &src);
        assert_eq!(u.errors.len(), 1, "{:?}", u.errors);
        assert!(u.errors[0].contains("c1"), "{:?}", u.errors);
        assert!(u.logs.bytes > 0);
        assert_eq!(u.processes, None, "no cgroup: unknown, not zero");
    }
}
