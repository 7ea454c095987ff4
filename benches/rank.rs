//! Decision cost: ranking 250 pods × 4 containers for memory pressure and
//! computing their dynamic `oom_score_adj`, the pure work criguard does on
//! every round. Prints p50/p99 per call against the 1 ms target.
//!
//! Run with `cargo bench --bench rank`.

use std::time::{Duration, Instant};

use criguard::eviction::rank::order::{PodMemory, rank_memory};
use criguard::oom::scores::{ContainerMemory, dynamic_scores};

const PODS: usize = 250;
const PER_POD: usize = 4;
const MI: i64 = 1 << 20;

/// A small deterministic generator (xorshift), so runs compare.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn time<F: FnMut()>(iterations: usize, mut f: F) -> (Duration, Duration) {
    let mut samples: Vec<Duration> = (0..iterations)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    samples.sort();
    (samples[iterations / 2], samples[iterations * 99 / 100])
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let mut rng = Rng(0x5eed);
    let pods: Vec<PodMemory> = (0..PODS)
        .map(|i| PodMemory {
            sandbox_id: format!("sandbox-{i:04}"),
            priority: (rng.next() % 4) as i32 * 1000,
            request: (rng.next() % 512) as i64 * MI,
            usage: Some((rng.next() % 1024) as i64 * MI),
            critical: rng.next().is_multiple_of(50),
        })
        .collect();
    let containers: Vec<ContainerMemory> = pods
        .iter()
        .flat_map(|p| {
            let adj = (rng.next() % 1000) as i64;
            let usage = p.usage.unwrap_or(0) / PER_POD as i64;
            (0..PER_POD).map(move |c| ContainerMemory {
                id: format!("{}-c{c}", p.sandbox_id),
                sandbox_id: p.sandbox_id.clone(),
                kubelet_adj: adj,
                usage,
            })
        })
        .collect();
    let (r50, r99) = time(2000, || {
        std::hint::black_box(rank_memory(std::hint::black_box(&pods)));
    });
    let first = rank_memory(&pods)[0].sandbox_id.clone();
    let (d50, d99) = time(2000, || {
        std::hint::black_box(dynamic_scores(
            Some(&first),
            std::hint::black_box(&containers),
            64 << 30,
        ));
    });
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!("criguard decision cost, {PODS} pods × {PER_POD} containers, 2000 runs each (µs)");
    println!(
        "{:<34} {:>10} {:>10} {:>12}",
        "step", "p50", "p99", "p99 / 1 ms"
    );
    for (name, p50, p99) in [
        ("rank_memory (kubelet ranking)", r50, r99),
        ("dynamic_scores (oom_score_adj)", d50, d99),
    ] {
        println!(
            "{name:<34} {:>10.1} {:>10.1} {:>12.3}",
            us(p50),
            us(p99),
            us(p99) / 1000.0
        );
    }
    println!("target: ranking 250 pods × 4 containers in < 1 ms");
}
