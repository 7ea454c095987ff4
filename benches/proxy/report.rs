//! Percentiles and the side-by-side table: each path against containerd
//! direct and against the best byte relay of the same run.

use std::time::Duration;

/// The paths, in the order the clients cycle through them.
pub const PATHS: [&str; 5] = ["direct", "socat", "relay", "loop", "criguard"];
/// Index of criguard in [`PATHS`].
pub const CRIGUARD: usize = 4;
/// Indices of the byte relays (the floor) in [`PATHS`].
const FLOOR: [usize; 3] = [1, 2, 3];

/// Latencies of one (client, method), one list per path.
pub struct Sample {
    /// Which client library made the calls.
    pub client: &'static str,
    /// The CRI method.
    pub method: &'static str,
    /// Per path (indexed like [`PATHS`]), sorted.
    pub times: Vec<Vec<Duration>>,
}

impl Sample {
    /// Sorts each path's latencies.
    pub fn new(client: &'static str, method: &'static str, mut times: Vec<Vec<Duration>>) -> Self {
        times.iter_mut().for_each(|t| t.sort());
        Self {
            client,
            method,
            times,
        }
    }

    /// The best byte relay's percentile `p`, in µs.
    pub fn floor(&self, p: f64) -> f64 {
        FLOOR
            .iter()
            .map(|&i| self.pct(i, p))
            .fold(f64::MAX, f64::min)
    }

    /// Percentile `p` (0..=1) of path `i`, in µs.
    pub fn pct(&self, i: usize, p: f64) -> f64 {
        let t = &self.times[i];
        let k = ((t.len() as f64 - 1.0) * p).round() as usize;
        t[k].as_secs_f64() * 1e6
    }
}

/// Prints the table header.
pub fn header() {
    println!(
        "{:<8} {:<16} {:<9} {:>6} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9}",
        "client",
        "method",
        "path",
        "calls",
        "p50 µs",
        "p99 µs",
        "p50/dir",
        "p99/dir",
        "p50/floor",
        "p99/floor"
    );
}

/// Prints one (client, method): a row per path, ratios against direct and
/// against the best byte relay (socat, ours or criguard's loop, whichever is lower).
pub fn rows(s: &Sample) {
    let (floor50, floor99) = (s.floor(0.5), s.floor(0.99));
    for (i, path) in PATHS.iter().enumerate() {
        let (p50, p99) = (s.pct(i, 0.5), s.pct(i, 0.99));
        let vs_floor = if i == 0 {
            String::from("         -          -")
        } else {
            format!("{:>9.3} {:>9.3}", p50 / floor50, p99 / floor99)
        };
        println!(
            "{:<8} {:<16} {:<9} {:>6} {:>8.0} {:>8.0} {:>9.3} {:>9.3} {vs_floor}",
            if i == 0 { s.client } else { "" },
            if i == 0 { s.method } else { "" },
            path,
            s.times[i].len(),
            p50,
            p99,
            p50 / s.pct(0, 0.5),
            p99 / s.pct(0, 0.99),
        );
    }
}

/// One line summing criguard against the floor over all samples.
pub fn summary(samples: &[Sample]) {
    let worst = |p: f64| {
        samples
            .iter()
            .map(|s| s.pct(CRIGUARD, p) / s.floor(p))
            .fold(0.0, f64::max)
    };
    println!(
        "criguard vs best byte relay, worst over all rows: p50 ×{:.3}, p99 ×{:.3} (targets ≤ 1.05, ≤ 1.10)",
        worst(0.5),
        worst(0.99)
    );
}
