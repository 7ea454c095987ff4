//! The kill at a memory event's crossing by the memory ranking kept ready
//! ([`crate::eviction::ready`]): the manager's side.

use std::collections::BTreeSet;
use std::time::Instant;

use super::EvictionManager;
use crate::config::Threshold;
use crate::eviction::rank::Victim;
use crate::eviction::ready::{self, Ready};
use crate::eviction::thresholds::{Observation, Observations};
use crate::lock::RwLocked;
use crate::signals::notify::Crossing;

/// A pod killed at a memory event's crossing, whose eviction the next round records.
#[derive(Clone, Debug)]
pub(super) struct PreKilled {
    /// The pod, as the ready ranking had it.
    pub(super) victim: Victim,
    /// The threshold crossed.
    pub(super) threshold: Threshold,
    /// The signal as the event read it.
    pub(super) reading: Observation,
}

impl EvictionManager {
    /// Ranks the pods by memory and keeps the ranking while the last
    /// observations put a hard memory threshold near its line; drops it
    /// otherwise (and in a dry run, which kills nothing).
    pub(super) async fn keep_ready(&mut self) {
        let near = (self.last_observations()).is_some_and(|o| ready::near(&self.config.hard, &o));
        if !near || self.dry_run {
            self.ready = None;
            return;
        }
        let generation = self.model.read_locked().generation();
        let victims = self.rank.memory(&BTreeSet::new()).await;
        self.ready = Some(Ready {
            victims,
            generation,
            at: self.clock.now(),
        });
    }

    /// When the ready ranking is to be made again.
    pub(super) fn ready_refresh(&self) -> Option<Instant> {
        self.ready.as_ref().map(|r| r.at + ready::REFRESH)
    }

    /// Kills the first pod of the ready ranking at once when `c` crosses a
    /// hard memory threshold and the ranking still holds; the round that
    /// follows records the eviction (report, stop, metrics) with `c`'s
    /// reading among its observations.
    pub(super) fn kill_at_crossing(&mut self, c: &Crossing) {
        if self.dry_run || self.pre_killed.is_some() {
            return;
        }
        let crossed = |t: &&Threshold| {
            t.signal == c.signal
                && ready::fast(t)
                && c.reading.available < t.amount.resolve(c.reading.capacity) as i64
        };
        let Some(t) = self.config.hard.iter().find(crossed).cloned() else {
            return;
        };
        let generation = self.model.read_locked().generation();
        let now = self.clock.now();
        let Some((v, at)) =
            (self.ready.as_ref()).and_then(|r| Some((r.victim(generation, now)?.clone(), r.at)))
        else {
            return;
        };
        if !self.killer.kill_now(&v.pod) {
            return;
        }
        self.metrics.crossing_kills.inc();
        tracing::info!(
            pod = %format!("{}/{}", v.pod.namespace, v.pod.name), threshold = %t,
            available = c.reading.available, ranked_ms_ago = super::ms(now.saturating_duration_since(at)),
            "pod killed as a memory event read the threshold crossed, by the memory ranking kept ready; its eviction follows"
        );
        self.ready = None;
        self.pre_killed = Some(PreKilled {
            victim: v,
            threshold: t,
            reading: c.reading,
        });
    }

    /// Records the eviction of a pod killed at a crossing that the round
    /// did not take up (its memory came back before the round observed).
    pub(super) async fn evict_pre_killed(&mut self) {
        let Some(pk) = self.pre_killed.take() else {
            return;
        };
        let mut obs =
            (self.last_observations()).unwrap_or_else(|| Observations::new(self.clock.now()));
        ready::merge(&mut obs, pk.threshold.signal, &pk.reading);
        self.evict(&pk.victim, &pk.threshold, &obs).await;
    }
}
