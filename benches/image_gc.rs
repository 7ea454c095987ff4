//! Image GC: time and bytes freed to bring an imagefs holding 50 unused
//! images from 90 % to under the kubelet's default low threshold (80 %),
//! against a real private containerd on a tmpfs.
//!
//! Two runs side by side, each on a fresh containerd with the same images:
//! - **criguard**: [`ImageGc::round`], which removes least recently used
//!   images one at a time and stops when `statvfs` shows the target reached;
//! - **kubelet arithmetic**: the same order, stopping when the sum of the
//!   runtime's reported image sizes covers the bytes to free (what the
//!   kubelet's `freeSpace` trusts).
//!
//! Run with `hack/bench-image-gc.sh` (or `cargo bench --bench image_gc` as
//! root). `CRIGUARD_BENCH_IMAGES` (default 50) and
//! `CRIGUARD_BENCH_IMAGE_MIB` (default 2) size it.

use criguard_test_kit as common;

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use common::containerd::PrivateContainerd;
use criguard::config::image_gc::ImageGcPolicy;
use criguard::gc::image_policy::bytes_to_free;
use criguard::gc::images::{ImageGc, ImageUses};
use criguard::gc::metrics::GcMetrics;
use criguard::runtime::{RuntimeEndpoint, Upstream};
use criguard::signals::node::fs_stats;
use k8s_cri::v1 as cri;

fn env_u64(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn usage_percent(root: &Path) -> f64 {
    let fs = fs_stats(root).unwrap();
    100.0 * (fs.capacity - fs.available) as f64 / fs.capacity as f64
}

/// Fills `root` with a plain file until usage is `percent` %.
fn top_up(root: &Path, percent: u64) {
    let fs = fs_stats(root).unwrap();
    let want_available = fs.capacity * (100 - percent) / 100;
    let mut left = fs.available.saturating_sub(want_available);
    let mut f = std::fs::File::create(root.join("ballast")).unwrap();
    let chunk = vec![0xa5u8; 1 << 16];
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n]).unwrap();
        left -= n as u64;
    }
    f.sync_all().unwrap();
}

struct Outcome {
    time: Duration,
    removed: usize,
    freed: u64,
    wanted: u64,
    end_percent: f64,
}

/// A private containerd on a tmpfs with `n` unused images at 90 % usage.
fn prepare(n: u64, mib: u64) -> PrivateContainerd {
    // Each image takes about twice its filler on imagefs (content blob and
    // unpacked snapshot); size the tmpfs so the images alone fill ~85 %.
    let size_mib = (n * (2 * mib + 1) + 8) * 100 / 85;
    let ctrd = PrivateContainerd::start_on_tmpfs(size_mib, None);
    let names: Vec<String> = (0..n)
        .map(|i| format!("docker.io/library/criguard-bench-gc-{i:02}:latest"))
        .collect();
    let images: Vec<(&str, u64)> = names.iter().map(|s| (s.as_str(), mib)).collect();
    ctrd.import_fillers(&images);
    top_up(&ctrd.root(), 90);
    ctrd
}

fn upstream(ctrd: &PrivateContainerd) -> Upstream {
    Upstream::new(RuntimeEndpoint::parse(ctrd.socket.to_str().unwrap()).unwrap())
}

const POLICY: ImageGcPolicy = ImageGcPolicy {
    high_percent: 85,
    low_percent: 80,
    min_age: Duration::ZERO,
    max_age: None,
};

async fn run_criguard(ctrd: &PrivateContainerd) -> Outcome {
    let root = ctrd.root();
    let gc = ImageGc::new(
        upstream(ctrd),
        POLICY,
        root.clone(),
        None,
        ImageUses::default(),
        GcMetrics::default(),
    );
    let t = Instant::now();
    let r = gc.round().await;
    let time = t.elapsed();
    Outcome {
        time,
        removed: r.removed.len(),
        freed: r.freed,
        wanted: r.wanted,
        end_percent: usage_percent(&root),
    }
}

/// The kubelet's stopping rule on the same order (all images were first
/// detected together and never used, so the order is by id).
async fn run_kubelet_arithmetic(ctrd: &PrivateContainerd) -> Outcome {
    let root = ctrd.root();
    let up = upstream(ctrd);
    let mut img = up.images();
    let t = Instant::now();
    let before = fs_stats(&root).unwrap();
    let wanted = bytes_to_free(&POLICY, before.capacity, before.available).unwrap_or(0);
    let mut images = img
        .list_images(cri::ListImagesRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .images;
    images.retain(|i| !i.repo_tags.iter().any(|t| !t.contains("criguard-bench-gc")));
    images.sort_by(|a, b| a.id.cmp(&b.id));
    let (mut sum, mut removed) = (0u64, 0usize);
    for i in images {
        if sum >= wanted {
            break;
        }
        img.remove_image(cri::RemoveImageRequest {
            image: Some(cri::ImageSpec {
                image: i.id.clone(),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
        sum += i.size;
        removed += 1;
    }
    let time = t.elapsed();
    Outcome {
        time,
        removed,
        freed: fs_stats(&root)
            .unwrap()
            .available
            .saturating_sub(before.available),
        wanted,
        end_percent: usage_percent(&root),
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let n = env_u64("CRIGUARD_BENCH_IMAGES", 50);
    let size = env_u64("CRIGUARD_BENCH_IMAGE_MIB", 2);
    println!(
        "image GC: {n} unused images of {size} MiB filler each, imagefs at 90 %, \
         policy high 85 % / low 80 %"
    );
    let a = prepare(n, size);
    let start = usage_percent(&a.root());
    let ours = run_criguard(&a).await;
    drop(a);
    let b = prepare(n, size);
    let theirs = run_kubelet_arithmetic(&b).await;
    drop(b);
    println!("start usage: {start:.1} %");
    println!(
        "{:<22} {:>10} {:>8} {:>12} {:>12} {:>10}",
        "run", "time", "removed", "wanted MiB", "freed MiB", "end usage"
    );
    for (name, o) in [("criguard", &ours), ("kubelet arithmetic", &theirs)] {
        println!(
            "{:<22} {:>8.1}ms {:>8} {:>12.1} {:>12.1} {:>9.1}%",
            name,
            o.time.as_secs_f64() * 1e3,
            o.removed,
            mib(o.wanted),
            mib(o.freed),
            o.end_percent
        );
    }
    println!(
        "ratio criguard/kubelet: time ×{:.2}, images removed ×{:.2}, bytes freed ×{:.2}; \
         under 80 %: criguard {}, kubelet arithmetic {}",
        ours.time.as_secs_f64() / theirs.time.as_secs_f64(),
        ours.removed as f64 / theirs.removed.max(1) as f64,
        ours.freed as f64 / theirs.freed.max(1) as f64,
        ours.end_percent < 80.0,
        theirs.end_percent < 80.0
    );
}
