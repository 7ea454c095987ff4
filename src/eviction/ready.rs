//! The memory ranking kept ready while a hard memory threshold is near,
//! so that the memory event that reads the line crossed (a cgroup v2 poll,
//! a cgroup v1 usage line read back when it fires) can kill at once: no
//! observation and no ranking stand between the crossing and the SIGKILL.
//!
//! While the last observation puts a hard memory threshold (no grace
//! period) within [`BAND`] of its line, the eviction manager ranks the pods
//! by memory every [`REFRESH`] and keeps the result. At a crossing the
//! ranking is used only if the node model has not changed since it was made
//! (a pod started, stopped or resized) and it is at most [`MAX_AGE`] old
//! (usage moves); otherwise the round ranks afresh as always. The round
//! that follows the kill records the eviction as any other (report, stop,
//! metrics), with the crossing's reading among its observations.

use std::time::{Duration, Instant};

use super::thresholds::{Observation, Observations};
use crate::config::Threshold;
use crate::signals::table::{Ranking, Signal};

/// How near its line a hard memory threshold keeps a ranking ready: the
/// bytes memory growing at 2 GiB/s takes 60 ms to use.
pub const BAND: u64 = 128 << 20;
/// How often the ready ranking is made again while near.
pub const REFRESH: Duration = Duration::from_millis(200);
/// The oldest ready ranking a crossing kills by.
pub const MAX_AGE: Duration = Duration::from_millis(400);

/// The thresholds a crossing may kill for at once: hard ones (no grace
/// period, so the kubelet would act on the first observation) ranked by
/// memory.
pub fn fast(t: &Threshold) -> bool {
    t.grace_period.is_none() && t.signal.ranking() == Ranking::Memory && !t.signal.is_stall()
}

/// Whether `obs` puts a threshold of `hard` that kills at once within
/// [`BAND`] of its line (or past it).
pub fn near(hard: &[Threshold], obs: &Observations) -> bool {
    hard.iter().filter(|t| fast(t)).any(|t| {
        obs.get(&t.signal).is_some_and(|o| {
            let line = t.amount.resolve(o.capacity) as i64;
            o.available - line < BAND as i64
        })
    })
}

/// A memory ranking of `V`s (pods) made at `at` with the node model at
/// `generation`.
#[derive(Clone, Debug)]
pub struct Ready<V> {
    /// The pods in the kubelet's memory order.
    pub victims: Vec<V>,
    /// The node model's generation when ranked.
    pub generation: u64,
    /// When ranked.
    pub at: Instant,
}

impl<V> Ready<V> {
    /// The first pod to kill at `now` with the model at `generation`, if
    /// this ranking still holds.
    pub fn victim(&self, generation: u64, now: Instant) -> Option<&V> {
        let fresh = now.saturating_duration_since(self.at) <= MAX_AGE;
        (fresh && generation == self.generation)
            .then(|| self.victims.first())
            .flatten()
    }
}

/// `obs` with `signal` read as `reading` where that is lower: the event's
/// reading was observed, milliseconds before, and the kill since may
/// already have given memory back.
pub fn merge(obs: &mut Observations, signal: Signal, reading: &Observation) {
    let o = obs.signals.entry(signal).or_insert(*reading);
    if reading.available < o.available {
        o.available = reading.available;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Amount;

    const MI: i64 = 1 << 20;

    fn threshold(signal: Signal, mib: u64, grace: Option<Duration>) -> Threshold {
        Threshold {
            signal,
            amount: Amount::Quantity(mib << 20),
            grace_period: grace,
            min_reclaim: None,
        }
    }

    fn reading(signal: Signal, available: i64) -> Observations {
        let mut obs = Observations::new(Instant::now());
        obs.signals.insert(
            signal,
            Observation {
                available,
                capacity: 1 << 30,
            },
        );
        obs
    }

    #[test]
    fn only_a_hard_memory_threshold_near_its_line_keeps_a_ranking() {
        let hard = [threshold(Signal::MemoryAvailable, 200, None)];
        assert!(near(&hard, &reading(Signal::MemoryAvailable, 300 * MI)));
        assert!(
            near(&hard, &reading(Signal::MemoryAvailable, 100 * MI)),
            "past it"
        );
        assert!(!near(&hard, &reading(Signal::MemoryAvailable, 400 * MI)));
        assert!(
            !near(&hard, &reading(Signal::NodefsAvailable, 100 * MI)),
            "unobserved"
        );
        let soft = [threshold(
            Signal::MemoryAvailable,
            200,
            Some(Duration::from_secs(1)),
        )];
        assert!(!near(&soft, &reading(Signal::MemoryAvailable, 100 * MI)));
        let disk = [threshold(Signal::NodefsAvailable, 200, None)];
        assert!(!near(&disk, &reading(Signal::NodefsAvailable, 100 * MI)));
        let swap = [threshold(Signal::SwapAvailable, 200, None)];
        assert!(
            !near(&swap, &reading(Signal::SwapAvailable, 100 * MI)),
            "swap ranks its own way"
        );
    }

    #[test]
    fn a_ready_ranking_holds_only_for_the_same_model_while_fresh() {
        let at = Instant::now();
        let r = Ready {
            victims: vec!["a"],
            generation: 7,
            at,
        };
        assert_eq!(r.victim(7, at + MAX_AGE), Some(&"a"));
        assert!(r.victim(8, at).is_none(), "the model changed");
        assert!(
            r.victim(7, at + MAX_AGE + Duration::from_millis(1))
                .is_none(),
            "stale"
        );
        let empty = Ready {
            victims: vec![],
            ..r
        };
        assert!(empty.victim(7, at).is_none());
    }

    #[test]
    fn the_crossing_reading_counts_where_it_is_lower() {
        let mut obs = reading(Signal::MemoryAvailable, 150 * MI);
        let seen = Observation {
            available: 190 * MI,
            capacity: 1 << 30,
        };
        merge(&mut obs, Signal::MemoryAvailable, &seen);
        assert_eq!(
            obs.get(&Signal::MemoryAvailable).unwrap().available,
            150 * MI
        );
        let mut freed = reading(Signal::MemoryAvailable, 250 * MI);
        merge(&mut freed, Signal::MemoryAvailable, &seen);
        assert_eq!(
            freed.get(&Signal::MemoryAvailable).unwrap().available,
            190 * MI
        );
        let mut unread = Observations::new(Instant::now());
        merge(&mut unread, Signal::AllocatableMemoryAvailable, &seen);
        assert_eq!(unread.get(&Signal::AllocatableMemoryAvailable), Some(&seen));
    }
}
