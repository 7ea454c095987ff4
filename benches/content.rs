//! The image content store's size, two ways, side by side on one private
//! containerd: criguard's walk of `<root>/io.containerd.content.v1.content/blobs`
//! (what `NodeUsage.images` reads) against containerd's content service
//! `List` in namespace `k8s.io` (sizes summed), over the same blobs.
//!
//! It prints the time per reading (median and p90 of alternating rounds)
//! and what each one says, so the choice in `signals::usage` rests on
//! figures: the walk gives allocated bytes and inodes of every namespace's
//! blobs; `List` gives logical sizes and a blob count of one namespace.
//!
//! Run as root: `cargo bench --bench content`. `CRIGUARD_BENCH_IMAGES`
//! (default 40 filler images of 1 MiB) and `CRIGUARD_BENCH_ROUNDS`
//! (default 200) size it.

use criguard_test_kit as common;

use std::time::{Duration, Instant};

use common::containerd::PrivateContainerd;
use criguard::runtime::{RuntimeEndpoint, Upstream};
use criguard::signals::disk;
use criguard::signals::usage::content_blobs;

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn quantile(v: &mut [Duration], q: f64) -> Duration {
    v.sort();
    let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

fn main() {
    let images: usize = env_or("CRIGUARD_BENCH_IMAGES", 40);
    let rounds: usize = env_or("CRIGUARD_BENCH_ROUNDS", 200);
    let ctrd = PrivateContainerd::start();
    let names: Vec<String> = (0..images)
        .map(|i| format!("docker.io/library/criguard-content-{i}:latest"))
        .collect();
    let fillers: Vec<(&str, u64)> = names.iter().map(|n| (n.as_str(), 1)).collect();
    ctrd.import_fillers(&fillers);
    let blobs = content_blobs(&ctrd.root());
    // criguard's own loops run on a current-thread runtime.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let content = Upstream::new(RuntimeEndpoint::parse(ctrd.socket.to_str().unwrap()).unwrap())
            .content();
        // containerd's garbage collector may still drop an import's
        // leftovers: the figures shown are the last round's.
        let mut walked = disk::DiskUsage::default();
        let mut listed = criguard::runtime::content::ContentUsage::default();
        let (mut t_walk, mut t_list) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let t = Instant::now();
            walked = disk::walk(&blobs).expect("walk the blobs").usage;
            t_walk.push(t.elapsed());
            let t = Instant::now();
            listed = content.usage().await.expect("content List");
            t_list.push(t.elapsed());
        }
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let (w50, w90) = (quantile(&mut t_walk, 0.5), quantile(&mut t_walk, 0.9));
        let (l50, l90) = (quantile(&mut t_list, 0.5), quantile(&mut t_list, 0.9));
        println!(
            "\ncontent store: {} blobs listed in k8s.io ({images} filler images + pause + busybox), {rounds} alternating rounds",
            listed.blobs
        );
        println!("{:<34} {:>10} {:>10}   says", "", "p50", "p90");
        println!(
            "{:<34} {:>8.0}us {:>8.0}us   {} bytes allocated, {} inodes (all namespaces)",
            "walk of blobs/ (criguard)",
            us(w50),
            us(w90),
            walked.bytes,
            walked.inodes
        );
        println!(
            "{:<34} {:>8.0}us {:>8.0}us   {} bytes (logical), {} blobs (k8s.io only)",
            "content List (containerd-client)",
            us(l50),
            us(l90),
            listed.bytes,
            listed.blobs
        );
        println!("List / walk: p50 {:.1}x", us(l50) / us(w50));
    });
}
