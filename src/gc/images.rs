//! Image garbage collection through the CRI.
//!
//! A collection lists the runtime's images and containers, updates the
//! images' first-detected and last-used times (persisted under the state
//! directory, so a restart forgets nothing), asks the pure policy
//! ([`crate::gc::image_policy`]) what may go, and removes it with
//! RemoveImage, so containerd's own bookkeeping stays right. containerd's
//! CRI deletes an image's content and snapshots before RemoveImage
//! returns, so the bytes freed are measured: `statvfs` of imagefs before
//! and after. One step beyond the kubelet: images go one at a time and the
//! collection stops as soon as the measured space reaches the target,
//! instead of trusting the runtime's (compressed) image sizes.
//!
//! "Used" means referenced by any container the runtime lists, running or
//! not, or created through criguard since the last collection; images the
//! runtime marks pinned (CRI `Image.pinned`, which the kubelet honours too)
//! and the sandbox image are never removed. containerd 2.x pins its sandbox
//! image (`pinned_images.sandbox`) and no longer names it in its verbose
//! Status; containerd 1.6 pins nothing, and names it there
//! (`config.sandboxImage`), which is read only when no listed image is
//! pinned.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_cri::v1 as cri;

use super::metrics::{Action, GcMetrics};
use crate::config::image_gc::ImageGcPolicy;
use crate::gc::image_policy::{
    ImageRecord, ImageTimes, Listed, bytes_to_free, candidates, too_old,
};
pub use crate::gc::image_uses::ImageUses;
use crate::quantity::format_bytes;
use crate::runtime::{CALL_DEADLINE, Upstream, bounded};
use crate::signals::probe::{self, FsStats};

/// Why an image was removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Reason {
    /// Unused for longer than `imageMaximumGCAge`.
    Age,
    /// imagefs above the high threshold, or reclaim asked for space.
    Space,
}

/// One image removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Removed {
    /// Image id.
    pub id: String,
    /// Its first tag, else its id.
    pub name: String,
    /// Size as the runtime reported it.
    pub size: u64,
    /// Why.
    pub reason: Reason,
}

/// What one collection did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageGcReport {
    /// Images removed, in order.
    pub removed: Vec<Removed>,
    /// Bytes the collection set out to free (0: none needed).
    pub wanted: u64,
    /// imagefs bytes freed, measured.
    pub freed: u64,
}

/// The image garbage collector (cheap to clone; collections never overlap).
#[derive(Clone, Debug)]
pub struct ImageGc {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    upstream: Upstream,
    policy: ImageGcPolicy,
    imagefs: PathBuf,
    state_file: Option<PathBuf>,
    uses: ImageUses,
    times: tokio::sync::Mutex<ImageTimes>,
    metrics: GcMetrics,
}

/// Docker-style normalisation of an image reference (`busybox` →
/// `docker.io/library/busybox:latest`), so that references written either
/// way match the runtime's tags.
pub fn normalize_ref(r: &str) -> String {
    if r.starts_with("sha256:") {
        return r.to_owned();
    }
    let (name, digest) = match r.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (r, None),
    };
    let first = name.split('/').next().unwrap_or("");
    let has_domain =
        name.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    let mut full = match (has_domain, name.contains('/')) {
        (true, _) => name.to_owned(),
        (false, true) => format!("docker.io/{name}"),
        (false, false) => format!("docker.io/library/{name}"),
    };
    let last = full.rsplit('/').next().unwrap_or("");
    if digest.is_none() && !last.contains(':') {
        full.push_str(":latest");
    }
    match digest {
        Some(d) => format!("{full}@{d}"),
        None => full,
    }
}

impl ImageGc {
    /// A collector with `policy`, for the imagefs holding `imagefs`,
    /// keeping its image times in `state_file` (None: in memory only).
    pub fn new(
        upstream: Upstream,
        policy: ImageGcPolicy,
        imagefs: PathBuf,
        state_file: Option<PathBuf>,
        uses: ImageUses,
        metrics: GcMetrics,
    ) -> Self {
        let times = state_file.as_deref().map(load_times).unwrap_or_default();
        Self {
            inner: Arc::new(Inner {
                upstream,
                policy,
                imagefs,
                state_file,
                uses,
                times: tokio::sync::Mutex::new(times),
                metrics,
            }),
        }
    }

    /// A periodic collection: images unused beyond the maximum age, then,
    /// at or above the high threshold, down to the low threshold.
    pub async fn round(&self) -> ImageGcReport {
        self.collect(None).await
    }

    /// Reclaim asked by the eviction manager: remove unused images (least
    /// recently used first, minimum age honoured) until `bytes` are freed
    /// or none is left; thresholds do not matter here.
    pub async fn free(&self, bytes: u64) -> ImageGcReport {
        self.collect(Some(bytes)).await
    }

    /// A collection: the age pass (periodic rounds only), then the space
    /// pass when space is wanted, then the measurement and the record.
    async fn collect(&self, demand: Option<u64>) -> ImageGcReport {
        let inner = &self.inner;
        // Held to the end: collections never overlap.
        let mut times = inner.times.lock().await;
        let mut report = ImageGcReport::default();
        let now = crate::clock::now_ms() as i64;
        let before = probe::statvfs(&inner.imagefs).await.ok();
        let records = match self.detect(&mut times, now).await {
            Ok(r) => r,
            Err(err) => {
                tracing::warn!(%err, "image GC: cannot list images and containers; skipped");
                return report;
            }
        };
        self.save(&times);
        let mut gone = Vec::new();
        if demand.is_none() {
            self.remove_too_old(&records, now, &mut gone, &mut report)
                .await;
        }
        // Measured after the age pass, which may have freed enough.
        let start = probe::statvfs(&inner.imagefs).await.ok();
        if let Some(wanted) = bytes_wanted(demand, start, &inner.policy) {
            report.wanted = wanted;
            if let (None, Some(fs)) = (demand, start) {
                tracing::info!(
                    usage_percent = 100 - fs.available * 100 / fs.capacity.max(1),
                    high = inner.policy.high_percent,
                    low = inner.policy.low_percent,
                    wanted,
                    "image GC: imagefs usage is at or above the high threshold; freeing down to the low threshold"
                );
            }
            self.remove_for_space(&records, now, wanted, start, &mut gone, &mut report)
                .await;
        }
        self.record(&mut report, before).await;
        report
    }

    /// The age pass: removes the images unused beyond the maximum age.
    async fn remove_too_old(
        &self,
        records: &[ImageRecord],
        now: i64,
        gone: &mut Vec<String>,
        report: &mut ImageGcReport,
    ) {
        for img in too_old(records, now, &self.inner.policy) {
            if self.remove(img, Reason::Age).await {
                gone.push(img.id.clone());
                report.removed.push(removed(img, Reason::Age));
            }
        }
    }

    /// The space pass: removes unused images, least recently used first
    /// (minimum age honoured), until `wanted` bytes are freed, measured
    /// from `start` when statvfs works, else by the runtime's sizes.
    async fn remove_for_space(
        &self,
        records: &[ImageRecord],
        now: i64,
        wanted: u64,
        start: Option<FsStats>,
        gone: &mut Vec<String>,
        report: &mut ImageGcReport,
    ) {
        let inner = &self.inner;
        let mut by_size = 0u64;
        let imagefs = inner.imagefs.clone();
        let freed = |by_size: u64| {
            let imagefs = imagefs.clone();
            async move {
                match start {
                    Some(_) => measured(&imagefs, start).await,
                    None => by_size,
                }
            }
        };
        for img in candidates(records, now, inner.policy.min_age) {
            if freed(by_size).await >= wanted {
                break;
            }
            if gone.contains(&img.id) {
                continue;
            }
            if self.remove(img, Reason::Space).await {
                by_size += img.size;
                gone.push(img.id.clone());
                report.removed.push(removed(img, Reason::Space));
            }
        }
        let got = freed(by_size).await;
        if got < wanted {
            tracing::warn!(
                wanted,
                freed = got,
                "image GC: could not free the required amount: no other unused image is old enough"
            );
        }
    }

    /// Measures what the collection freed since `before` (else sums the
    /// runtime's sizes), counts it and logs it.
    async fn record(&self, report: &mut ImageGcReport, before: Option<FsStats>) {
        let inner = &self.inner;
        report.freed = match before {
            Some(_) => measured(&inner.imagefs, before).await,
            None => report.removed.iter().map(|r| r.size).sum(),
        };
        inner
            .metrics
            .record(Action::ImageGc, report.removed.len() as u64, report.freed);
        if !report.removed.is_empty() {
            tracing::info!(
                removed = report.removed.len(),
                freed = report.freed,
                "image GC: freed {} on imagefs",
                format_bytes(report.freed)
            );
        }
    }

    /// Lists images and what uses them, and updates their times.
    async fn detect(
        &self,
        times: &mut ImageTimes,
        now: i64,
    ) -> Result<Vec<ImageRecord>, tonic::Status> {
        let inner = &self.inner;
        let mut rt = inner.upstream.runtime();
        let mut img = inner.upstream.images();
        let list = img.list_images(cri::ListImagesRequest { filter: None });
        let images = bounded("ListImages", CALL_DEADLINE, list)
            .await?
            .into_inner()
            .images;
        let list = rt.list_containers(cri::ListContainersRequest { filter: None });
        let containers = bounded("ListContainers", CALL_DEADLINE, list)
            .await?
            .into_inner()
            .containers;
        let sandbox_image = if needs_sandbox_lookup(&images) {
            sandbox_image(&mut rt).await
        } else {
            None
        };
        let mut refs: Vec<String> = Vec::new();
        for c in &containers {
            refs.push(c.image_ref.clone());
            if let Some(spec) = &c.image {
                refs.push(normalize_ref(&spec.image));
            }
        }
        let seen: Vec<(String, i64)> = inner
            .uses
            .take()
            .into_iter()
            .map(|(r, t)| (normalize_ref(&r), t))
            .collect();
        let names = |i: &cri::Image| -> Vec<String> {
            let mut v = vec![i.id.clone()];
            v.extend(i.repo_tags.iter().cloned());
            v.extend(i.repo_digests.iter().cloned());
            v
        };
        let listed: Vec<Listed> = images
            .iter()
            .map(|i| {
                let n = names(i);
                Listed {
                    id: i.id.clone(),
                    tags: i.repo_tags.clone(),
                    size: i.size,
                    in_use: refs.iter().any(|r| n.contains(r)),
                    pinned: i.pinned
                        || sandbox_image
                            .as_ref()
                            .is_some_and(|s| n.contains(&normalize_ref(s))),
                    seen_used_ms: seen
                        .iter()
                        .filter(|(r, _)| n.contains(r))
                        .map(|(_, t)| *t)
                        .max(),
                }
            })
            .collect();
        Ok(times.detect(&listed, now))
    }

    async fn remove(&self, img: &ImageRecord, reason: Reason) -> bool {
        let mut client = self.inner.upstream.images();
        let req = cri::RemoveImageRequest {
            image: Some(cri::ImageSpec {
                image: img.id.clone(),
                ..Default::default()
            }),
        };
        let idle_s = (crate::clock::now_ms() as i64 - img.last_used_or_detected()) / 1000;
        match bounded("RemoveImage", CALL_DEADLINE, client.remove_image(req)).await {
            Ok(_) => {
                tracing::info!(
                    image = %img.display_name(), id = %img.id, size = img.size, ?reason,
                    unused_for_s = idle_s,
                    "image GC: removed an unused image ({}, unused for {idle_s}s)",
                    format_bytes(img.size)
                );
                true
            }
            Err(err) => {
                tracing::warn!(image = %img.display_name(), id = %img.id, %err, "image GC: RemoveImage failed");
                false
            }
        }
    }

    fn save(&self, times: &ImageTimes) {
        let Some(path) = &self.inner.state_file else {
            return;
        };
        if let Err(err) = save_times(path, times) {
            tracing::warn!(path = %path.display(), %err, "image GC: cannot save image times");
        }
    }
}

/// The bytes a collection sets out to free: all that reclaim asked for
/// (`demand`), else, for a periodic round, what brings imagefs (`start`)
/// from at or above the high threshold down to the low one.
fn bytes_wanted(
    demand: Option<u64>,
    start: Option<FsStats>,
    policy: &ImageGcPolicy,
) -> Option<u64> {
    match (demand, start) {
        (Some(b), _) => Some(b),
        (None, Some(fs)) => bytes_to_free(policy, fs.capacity, fs.available),
        (None, None) => None,
    }
}

fn removed(img: &ImageRecord, reason: Reason) -> Removed {
    Removed {
        id: img.id.clone(),
        name: img.display_name().to_owned(),
        size: img.size,
        reason,
    }
}

/// Bytes freed on the filesystem at `path` since `before` (0 if unknown).
async fn measured(path: &Path, before: Option<FsStats>) -> u64 {
    match (before, probe::statvfs(path).await) {
        (Some(b), Ok(now)) => now.available.saturating_sub(b.available),
        _ => 0,
    }
}

/// Must the sandbox image be looked up in the verbose Status? Only when
/// the runtime pins none of `images`: a runtime that pins (containerd 1.7
/// and 2.x) pins its sandbox image, and 2.x no longer names it in Status.
fn needs_sandbox_lookup(images: &[cri::Image]) -> bool {
    !images.iter().any(|i| i.pinned)
}

/// The sandbox (pause) image named in a verbose Status answer's `config`
/// (containerd 1.6: `sandboxImage`); `None` when absent (containerd 2.x,
/// whose `config` holds the runtime settings only) or unreadable.
fn sandbox_image_in(info: &std::collections::HashMap<String, String>) -> Option<String> {
    let config: serde_json::Value = serde_json::from_str(info.get("config")?).ok()?;
    Some(config.get("sandboxImage")?.as_str()?.to_owned())
}

/// containerd's configured sandbox (pause) image, from its verbose status.
async fn sandbox_image(
    rt: &mut cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
) -> Option<String> {
    let status = rt.status(cri::StatusRequest { verbose: true });
    let info = bounded("Status", CALL_DEADLINE, status)
        .await
        .ok()?
        .into_inner()
        .info;
    sandbox_image_in(&info)
}

fn load_times(path: &Path) -> ImageTimes {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|err| {
            tracing::warn!(path = %path.display(), %err, "image GC: unreadable image times; starting afresh");
            ImageTimes::default()
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => ImageTimes::default(),
        Err(err) => {
            tracing::warn!(path = %path.display(), %err, "image GC: cannot read image times; starting afresh");
            ImageTimes::default()
        }
    }
}

/// Writes the times atomically, private to root ([`crate::statefile`]).
fn save_times(path: &Path, times: &ImageTimes) -> std::io::Result<()> {
    crate::statefile::write_private(path, &serde_json::to_vec_pretty(times)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reclaim_wants_what_it_asked_and_a_round_what_the_thresholds_say() {
        let policy = ImageGcPolicy {
            high_percent: 85,
            low_percent: 80,
            ..Default::default()
        };
        let fs = |available| FsStats {
            available,
            capacity: 1000,
            inodes_free: 0,
            inodes: 0,
        };
        assert_eq!(bytes_wanted(Some(7), Some(fs(900)), &policy), Some(7));
        assert_eq!(bytes_wanted(Some(7), None, &policy), Some(7));
        assert_eq!(bytes_wanted(None, None, &policy), None);
        assert_eq!(bytes_wanted(None, Some(fs(900)), &policy), None);
        assert_eq!(bytes_wanted(None, Some(fs(100)), &policy), Some(100));
    }

    #[test]
    fn the_sandbox_image_is_read_from_16s_status_and_absent_from_2s() {
        let info = |config: &str| {
            std::collections::HashMap::from([("config".to_owned(), config.to_owned())])
        };
        // containerd 1.6.20's verbose Status (abridged).
        let v16 = info(
            r#"{"containerd":{"snapshotter":"overlayfs"},"sandboxImage":"registry.k8s.io/pause:3.9","rootDir":"/r"}"#,
        );
        assert_eq!(
            sandbox_image_in(&v16).as_deref(),
            Some("registry.k8s.io/pause:3.9")
        );
        // containerd 2.3's: runtime settings only.
        let v2 = info(
            r#"{"containerd":{"defaultRuntimeName":"runc"},"containerdRootDir":"/r","rootDir":"/r/io.containerd.grpc.v1.cri"}"#,
        );
        assert_eq!(sandbox_image_in(&v2), None);
        assert_eq!(sandbox_image_in(&info("not json")), None);
        assert_eq!(sandbox_image_in(&Default::default()), None);
    }

    #[test]
    fn the_status_lookup_is_skipped_once_the_runtime_pins_images() {
        let image = |id: &str, pinned: bool| cri::Image {
            id: id.into(),
            pinned,
            ..Default::default()
        };
        // 1.6: nothing pinned, the pause image must be found in Status.
        assert!(needs_sandbox_lookup(&[
            image("a", false),
            image("b", false)
        ]));
        assert!(needs_sandbox_lookup(&[]));
        // 2.x: the pause image is pinned.
        assert!(!needs_sandbox_lookup(&[
            image("a", false),
            image("pause", true)
        ]));
    }

    #[test]
    fn references_normalise_like_docker() {
        for (r, want) in [
            ("busybox", "docker.io/library/busybox:latest"),
            ("busybox:1.36", "docker.io/library/busybox:1.36"),
            ("me/app", "docker.io/me/app:latest"),
            ("registry.k8s.io/pause:3.9", "registry.k8s.io/pause:3.9"),
            ("localhost:5000/app", "localhost:5000/app:latest"),
            ("localhost/app:v1", "localhost/app:v1"),
            (
                "busybox@sha256:abcd",
                "docker.io/library/busybox@sha256:abcd",
            ),
            ("sha256:abcd", "sha256:abcd"),
        ] {
            assert_eq!(normalize_ref(r), want, "{r}");
        }
    }

    #[test]
    fn times_persist_atomically_and_a_bad_file_starts_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/image-gc.json");
        let mut t = ImageTimes::default();
        t.detect(
            &[Listed {
                id: "sha256:1".into(),
                tags: vec![],
                size: 1,
                in_use: true,
                pinned: false,
                seen_used_ms: None,
            }],
            42,
        );
        save_times(&path, &t).unwrap();
        assert_eq!(load_times(&path), t);
        // Private: the state directory 0700, the file 0600.
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        assert_eq!(mode(&path), 0o600);
        std::fs::write(&path, "not json").unwrap();
        assert_eq!(load_times(&path), ImageTimes::default());
        assert_eq!(
            load_times(&dir.path().join("absent")),
            ImageTimes::default()
        );
    }
}
