//! The eviction manager's memory of pressure: when each condition's
//! threshold was last observed met (wall-clock, ms since the epoch), so
//! that a restarted manager keeps a condition until the transition period
//! has passed since that observation; saved with the latest evictions in
//! `pressure.json` ([`super::store::Remembered`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use super::seams::Clock;
use super::status::{Eviction, NodeStatus};
use super::store::{self, EvictedStore, Remembered};
use crate::lock::RwLocked;
use crate::signals::table::Condition;

/// The pressure memory is saved at most this often while only the times
/// advance (a change in the conditions held, an eviction, or the end of
/// the pressure, whose last observations are then final, saves at once).
const PRESSURE_SAVE_EVERY: Duration = Duration::from_secs(1);

/// When each condition's threshold was last observed met (ms since the
/// epoch), and what of it is saved.
#[derive(Debug, Default)]
pub(super) struct PressureMemory {
    /// Condition → when a threshold of it was last observed met.
    pub(super) last: BTreeMap<Condition, u64>,
    /// Changed since the last save.
    dirty: bool,
    /// Whether the last step found a threshold met.
    met: bool,
    /// The pressure just ended: the last observations are final, save them.
    ended: bool,
    saved_at: Option<Instant>,
    saved_held: BTreeSet<Condition>,
    saved_evictions: usize,
    /// A save that passed its deadline and has not finished.
    saving: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl PressureMemory {
    /// The memory a restarted manager starts with: what the last run
    /// `remembered`, at `now_ms`; returns it with the conditions it holds
    /// now, by the transition `period`.
    pub(super) fn restored(
        remembered: &Remembered,
        now_ms: u64,
        period: Duration,
    ) -> (Self, BTreeSet<Condition>) {
        let last = remembered.observations(now_ms);
        let held = store::held(&last, now_ms, period);
        let memory = Self {
            last,
            saved_evictions: remembered.evictions.len(),
            saved_held: held.clone(),
            ..Self::default()
        };
        (memory, held)
    }

    /// Notes that the thresholds of the conditions `met` were observed met
    /// at `at_ms`; returns the conditions the memory holds then (the
    /// remembered ones from before a restart included).
    pub(super) fn note(
        &mut self,
        met: &[Condition],
        at_ms: u64,
        period: Duration,
    ) -> BTreeSet<Condition> {
        for c in met {
            if self.last.insert(*c, at_ms) != Some(at_ms) {
                self.dirty = true;
            }
        }
        let met = !met.is_empty();
        if self.met && !met && self.dirty {
            self.ended = true;
        }
        self.met = met;
        store::held(&self.last, at_ms, period)
    }

    /// How long from `at_ms` until the remembered pressure next runs out,
    /// if it holds.
    pub(super) fn deadline(&self, at_ms: u64, period: Duration) -> Option<Duration> {
        store::next_expiry(&self.last, at_ms, period)
    }

    /// Saves the memory and the latest evictions (`status`'s, with `new`,
    /// an eviction about to be published) to `store` when they changed:
    /// at once when the conditions held or the evictions did, else at most
    /// every [`PRESSURE_SAVE_EVERY`]. What `criguard evictions` lists is
    /// on disk before it is listed (unless the state directory fails,
    /// which delays the listing by [`store::STATE_WRITE_DEADLINE`] at
    /// most), so a crash right after cannot lose it.
    pub(super) async fn save(
        &mut self,
        store: Option<&EvictedStore>,
        status: &RwLock<NodeStatus>,
        new: Option<&Eviction>,
        clock: &dyn Clock,
    ) {
        let Some(store) = store.cloned() else {
            return;
        };
        let (held, snapshot, evictions) = {
            let st = status.read_locked();
            let held = st.conditions.clone();
            let mut all = std::borrow::Cow::Borrowed(&st.evictions[..]);
            if let Some(e) = new {
                all.to_mut().push(e.clone());
            }
            let urgent = held != self.saved_held || all.len() != self.saved_evictions || self.ended;
            let now = clock.now();
            let due = self.dirty
                && self
                    .saved_at
                    .is_none_or(|t| now.saturating_duration_since(t) >= PRESSURE_SAVE_EVERY);
            if !urgent && !due {
                return;
            }
            let r = Remembered::of(&self.last, &all);
            (held, r, all.len())
        };
        if self.saving.as_ref().is_some_and(|h| !h.is_finished()) {
            return; // the last save is stuck; this one waits for it
        }
        let mut save = tokio::task::spawn_blocking(move || store.save_remembered(&snapshot));
        let saved = match tokio::time::timeout(store::STATE_WRITE_DEADLINE, &mut save).await {
            Ok(r) => r,
            Err(_) => {
                tracing::warn!(deadline = ?store::STATE_WRITE_DEADLINE, "saving the pressure memory has not finished (a hung state directory?); no other save starts until it does");
                self.saving = Some(save);
                return;
            }
        };
        self.saving = None;
        match saved {
            Ok(Ok(())) => {
                self.dirty = false;
                self.ended = false;
                self.saved_at = Some(clock.now());
                self.saved_held = held;
                self.saved_evictions = evictions;
            }
            Ok(Err(err)) => tracing::error!(%err, "cannot save the pressure memory"),
            Err(err) => tracing::error!(%err, "saving the pressure memory failed"),
        }
    }
}
