//! Thresholds, grace periods, minimum reclaim and node conditions: the
//! kubelet's eviction state machine (`pkg/kubelet/eviction/eviction_manager.go`,
//! synchronize, and `helpers.go`), with time passed in.
//!
//! Each [`EvictionState::step`] takes fresh observations and `now` and says
//! which node conditions hold and which thresholds to act on:
//! - a threshold is met while `available < amount`; once met it stays met
//!   until `available ≥ amount + min_reclaim` (so reclaim goes past the line);
//! - node conditions follow every met threshold, soft ones before their grace
//!   period has passed too, and stay until no threshold of theirs has been
//!   met for the pressure transition period (no oscillation);
//! - criguard acts on hard thresholds at once and on soft thresholds once
//!   they have been met continuously for their grace period.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::config::{EvictionConfig, Threshold};
use crate::signals::table::{Condition, Signal};

/// One signal's reading: what is available and the capacity percentages refer to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observation {
    /// Available units (bytes, inodes, pids); negative when over-committed.
    pub available: i64,
    /// Capacity in the same units.
    pub capacity: u64,
}

/// Fresh readings of the signals criguard could read, and when they were
/// read. Plain data: the policy takes the time from here (or from its
/// caller), never from the clock.
#[derive(Clone, Debug, PartialEq)]
pub struct Observations {
    /// When the reading started (monotonic clock).
    pub at: Instant,
    /// Each signal that could be read; a signal that could not is absent.
    pub signals: BTreeMap<Signal, Observation>,
}

impl Observations {
    /// No readings yet, taken at `at`.
    pub fn new(at: Instant) -> Self {
        Self {
            at,
            signals: BTreeMap::new(),
        }
    }

    /// The reading of `signal`, if it was observed.
    pub fn get(&self, signal: &Signal) -> Option<&Observation> {
        self.signals.get(signal)
    }
}

/// How far below a threshold (plus its minimum reclaim when `with_reclaim`)
/// the observation is; `None` when the threshold is not met or unobserved.
pub fn deficit(t: &Threshold, obs: &Observations, with_reclaim: bool) -> Option<u64> {
    let o = obs.get(&t.signal)?;
    let mut line = t.amount.resolve(o.capacity) as i128;
    if with_reclaim && let Some(m) = t.min_reclaim {
        line += m.resolve(o.capacity) as i128;
    }
    let gap = line - o.available as i128;
    (gap > 0).then_some(gap as u64)
}

/// A threshold's identity across steps: its signal and whether it is soft.
type Key = (Signal, bool);

fn key(t: &Threshold) -> Key {
    (t.signal, t.grace_period.is_some())
}

/// What one step decided.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// Node conditions that hold now.
    pub conditions: BTreeSet<Condition>,
    /// Thresholds to act on now (hard, and soft past their grace period).
    pub act_on: Vec<Threshold>,
}

/// What the state machine remembers between steps.
#[derive(Clone, Debug, Default)]
pub struct EvictionState {
    /// Thresholds being acted on (kept until minimum reclaim is reached).
    acting: BTreeSet<Key>,
    /// When each currently met threshold was first seen met.
    first_observed: BTreeMap<Key, Instant>,
    /// When each condition was last seen.
    condition_seen: BTreeMap<Condition, Instant>,
}

impl EvictionState {
    /// When `t` was first seen met in its current episode, if it is met.
    pub fn met_since(&self, t: &Threshold) -> Option<Instant> {
        self.first_observed.get(&key(t)).copied()
    }

    /// The first instant after `now` at which a step would decide
    /// differently on the same readings: a met soft threshold's grace period
    /// running out, or a node condition's transition period ending. `None`
    /// when no such instant is pending.
    pub fn next_deadline(&self, config: &EvictionConfig, now: Instant) -> Option<Instant> {
        let graces = config.soft.iter().filter_map(|t| {
            let since = self.first_observed.get(&key(t))?;
            Some(*since + t.grace_period?)
        });
        let transitions = self
            .condition_seen
            .values()
            .map(|seen| *seen + config.pressure_transition_period);
        graces.chain(transitions).filter(|d| *d > now).min()
    }

    /// One evaluation with fresh `obs` at `now` (normally `obs.at`, when
    /// they were read).
    pub fn step(&mut self, config: &EvictionConfig, obs: &Observations, now: Instant) -> Decision {
        let all: Vec<&Threshold> = config.hard.iter().chain(&config.soft).collect();
        let met: Vec<&Threshold> = all
            .iter()
            .copied()
            .filter(|t| {
                deficit(t, obs, false).is_some()
                    || (self.acting.contains(&key(t)) && deficit(t, obs, true).is_some())
            })
            .collect();
        let met_keys: BTreeSet<Key> = met.iter().map(|t| key(t)).collect();
        self.first_observed.retain(|k, _| met_keys.contains(k));
        for k in &met_keys {
            self.first_observed.entry(*k).or_insert(now);
        }
        for t in &met {
            self.condition_seen.insert(t.signal.condition(), now);
        }
        let period = config.pressure_transition_period;
        let conditions = self
            .condition_seen
            .iter()
            .filter(|(_, seen)| now.saturating_duration_since(**seen) < period || **seen == now)
            .map(|(c, _)| *c)
            .collect();
        let act_on: Vec<Threshold> = met
            .into_iter()
            .filter(|t| {
                let since = self.first_observed[&key(t)];
                now.saturating_duration_since(since) >= t.grace_period.unwrap_or(Duration::ZERO)
            })
            .cloned()
            .collect();
        self.acting = act_on.iter().map(key).collect();
        Decision { conditions, act_on }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Amount;

    const MI: i64 = 1 << 20;

    fn config(hard: Vec<Threshold>, soft: Vec<Threshold>) -> EvictionConfig {
        EvictionConfig {
            hard,
            soft,
            max_pod_grace_period: None,
            pressure_transition_period: Duration::from_secs(300),
            housekeeping_interval: Duration::from_secs(10),
        }
    }

    fn readings(signal: Signal, available: i64, capacity: u64) -> Observations {
        Observations {
            at: Instant::now(),
            signals: BTreeMap::from([(
                signal,
                Observation {
                    available,
                    capacity,
                },
            )]),
        }
    }

    fn memory(available: i64) -> Observations {
        readings(Signal::MemoryAvailable, available, 10 << 30)
    }

    fn t(signal: Signal, amount: Amount, grace: Option<u64>, reclaim: Option<Amount>) -> Threshold {
        Threshold {
            signal,
            amount,
            grace_period: grace.map(Duration::from_secs),
            min_reclaim: reclaim,
        }
    }

    #[test]
    fn hard_threshold_acts_at_once_and_percentages_use_capacity() {
        // Seed: on a 10Gi node memory.available<10% is memory.available<1Gi.
        let c = config(
            vec![t(
                Signal::MemoryAvailable,
                Amount::Percentage(10.0),
                None,
                None,
            )],
            vec![],
        );
        let mut s = EvictionState::default();
        let now = Instant::now();
        assert!(s.step(&c, &memory(1100 * MI), now).act_on.is_empty());
        let d = s.step(&c, &memory(1000 * MI), now + Duration::from_secs(1));
        assert_eq!(d.act_on.len(), 1);
        assert_eq!(d.conditions, BTreeSet::from([Condition::MemoryPressure]));
    }

    #[test]
    fn soft_threshold_raises_the_condition_at_once_but_acts_after_its_grace_period() {
        let c = config(
            vec![],
            vec![t(
                Signal::MemoryAvailable,
                Amount::Quantity(1536 << 20),
                Some(90),
                None,
            )],
        );
        let mut s = EvictionState::default();
        let t0 = Instant::now();
        let d = s.step(&c, &memory(1000 * MI), t0);
        assert!(d.act_on.is_empty());
        assert!(d.conditions.contains(&Condition::MemoryPressure));
        assert!(
            s.step(&c, &memory(1000 * MI), t0 + Duration::from_secs(89))
                .act_on
                .is_empty()
        );
        assert_eq!(
            s.step(&c, &memory(1000 * MI), t0 + Duration::from_secs(90))
                .act_on
                .len(),
            1
        );
    }

    #[test]
    fn a_soft_threshold_that_clears_restarts_its_grace_period() {
        let c = config(
            vec![],
            vec![t(
                Signal::MemoryAvailable,
                Amount::Quantity(1 << 30),
                Some(60),
                None,
            )],
        );
        let mut s = EvictionState::default();
        let t0 = Instant::now();
        s.step(&c, &memory(500 * MI), t0);
        s.step(&c, &memory(2000 * MI), t0 + Duration::from_secs(50));
        assert!(
            s.step(&c, &memory(500 * MI), t0 + Duration::from_secs(70))
                .act_on
                .is_empty()
        );
        assert_eq!(
            s.step(&c, &memory(500 * MI), t0 + Duration::from_secs(130))
                .act_on
                .len(),
            1
        );
    }

    #[test]
    fn minimum_reclaim_keeps_acting_until_past_the_threshold_plus_reclaim() {
        // Seed: nodefs.available<1Gi with minimum reclaim 500Mi works until 1.5Gi is free.
        let th = t(
            Signal::NodefsAvailable,
            Amount::Quantity(1 << 30),
            None,
            Some(Amount::Quantity(500 << 20)),
        );
        let c = config(vec![th], vec![]);
        let disk = |available: i64| readings(Signal::NodefsAvailable, available, 100 << 30);
        let mut s = EvictionState::default();
        let t0 = Instant::now();
        assert_eq!(s.step(&c, &disk(900 * MI), t0).act_on.len(), 1);
        assert_eq!(
            s.step(&c, &disk(1200 * MI), t0).act_on.len(),
            1,
            "above 1Gi but below 1.5Gi: still acting"
        );
        assert!(s.step(&c, &disk(1600 * MI), t0).act_on.is_empty());
        assert!(
            s.step(&c, &disk(1200 * MI), t0).act_on.is_empty(),
            "not met again until below 1Gi"
        );
    }

    #[test]
    fn conditions_stay_for_the_transition_period_after_pressure_ends() {
        let c = config(
            vec![t(
                Signal::MemoryAvailable,
                Amount::Quantity(100 << 20),
                None,
                None,
            )],
            vec![],
        );
        let mut s = EvictionState::default();
        let t0 = Instant::now();
        s.step(&c, &memory(50 * MI), t0);
        let later = |secs| t0 + Duration::from_secs(secs);
        assert!(
            s.step(&c, &memory(500 * MI), later(299))
                .conditions
                .contains(&Condition::MemoryPressure)
        );
        assert!(
            s.step(&c, &memory(500 * MI), later(300))
                .conditions
                .is_empty()
        );
    }

    #[test]
    fn the_next_deadline_is_a_grace_period_or_a_transition_period_running_out() {
        let soft = t(
            Signal::MemoryAvailable,
            Amount::Quantity(1 << 30),
            Some(90),
            None,
        );
        let mut c = config(vec![], vec![soft]);
        c.pressure_transition_period = Duration::from_secs(300);
        let mut s = EvictionState::default();
        let t0 = Instant::now();
        let at = |secs| t0 + Duration::from_secs(secs);
        assert_eq!(s.next_deadline(&c, t0), None, "nothing met yet");
        s.step(&c, &memory(500 * MI), t0);
        assert_eq!(s.next_deadline(&c, t0), Some(at(90)), "the grace period");
        s.step(&c, &memory(500 * MI), at(90));
        assert_eq!(
            s.next_deadline(&c, at(90)),
            Some(at(390)),
            "acting: the condition, seen last at 90 s, lasts 300 s more"
        );
        s.step(&c, &memory(2000 * MI), at(100));
        assert_eq!(s.next_deadline(&c, at(100)), Some(at(390)));
        s.step(&c, &memory(2000 * MI), at(390));
        assert_eq!(s.next_deadline(&c, at(390)), None, "all over");
    }

    #[test]
    fn unobserved_signals_never_meet_thresholds() {
        let c = config(
            vec![t(Signal::PidAvailable, Amount::Quantity(100), None, None)],
            vec![],
        );
        let d = EvictionState::default().step(&c, &memory(0), Instant::now());
        assert!(d.act_on.is_empty() && d.conditions.is_empty());
    }
}
