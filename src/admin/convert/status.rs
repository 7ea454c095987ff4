//! Evictions, eviction orders, and node conditions with the last observations.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{ConvertError, unknown};
use crate::admin::pb;
use crate::clock::instant_ms as unix_ms;
use crate::eviction::rank::{NotRanked, RankEntry};
use crate::eviction::{Eviction, NodeStatus};
use crate::signals::table::{Condition, Signal};

impl From<&Eviction> for pb::Eviction {
    fn from(e: &Eviction) -> Self {
        Self {
            at_unix_ms: e.at_unix_ms,
            pod: e.pod.clone(),
            uid: e.uid.clone(),
            sandbox_id: e.sandbox_id.clone(),
            signal: e.signal.clone(),
            threshold: e.threshold.clone(),
            available: e.available,
            usage: e.usage,
            request: e.request,
            grace_s: e.grace_s,
            message: e.message.clone(),
            dry_run: e.dry_run,
        }
    }
}

impl From<pb::Eviction> for Eviction {
    fn from(e: pb::Eviction) -> Self {
        Self {
            at_unix_ms: e.at_unix_ms,
            pod: e.pod,
            uid: e.uid,
            sandbox_id: e.sandbox_id,
            signal: e.signal,
            threshold: e.threshold,
            available: e.available,
            usage: e.usage,
            request: e.request,
            grace_s: e.grace_s,
            message: e.message,
            dry_run: e.dry_run,
        }
    }
}

impl From<&RankEntry> for pb::RankEntry {
    fn from(e: &RankEntry) -> Self {
        Self {
            signal: e.signal.clone(),
            rank: e.rank as u64,
            pod: e.pod.clone(),
            qos: e.qos.clone(),
            priority: e.priority,
            usage: e.usage,
            request: e.request,
            stall: e.stall,
        }
    }
}

impl From<pb::RankEntry> for RankEntry {
    fn from(e: pb::RankEntry) -> Self {
        Self {
            signal: e.signal,
            rank: e.rank as usize,
            pod: e.pod,
            qos: e.qos,
            priority: e.priority,
            usage: e.usage,
            request: e.request,
            stall: e.stall,
        }
    }
}

impl From<&NotRanked> for pb::NotRanked {
    fn from(n: &NotRanked) -> Self {
        Self {
            signal: n.signal.clone(),
            available: n.available,
            threshold: n.threshold.clone(),
        }
    }
}

impl From<pb::NotRanked> for NotRanked {
    fn from(n: pb::NotRanked) -> Self {
        Self {
            signal: n.signal,
            available: n.available,
            threshold: n.threshold,
        }
    }
}

/// One signal as last observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observed {
    /// Available amount (bytes, inodes or pids).
    pub available: i64,
    /// The signal's capacity.
    pub capacity: u64,
}

/// Node conditions and the last observations, as `Conditions` answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionsReport {
    /// The conditions that hold now.
    pub conditions: BTreeSet<Condition>,
    /// Each signal read in the last round.
    pub observations: BTreeMap<Signal, Observed>,
    /// When they were read (None: no round yet).
    pub observed_at_unix_ms: Option<u64>,
}

fn condition_to(c: Condition) -> pb::NodeCondition {
    match c {
        Condition::MemoryPressure => pb::NodeCondition::MemoryPressure,
        Condition::DiskPressure => pb::NodeCondition::DiskPressure,
        Condition::PIDPressure => pb::NodeCondition::PidPressure,
    }
}

fn condition_from(v: i32) -> Result<Condition, ConvertError> {
    match pb::NodeCondition::try_from(v) {
        Ok(pb::NodeCondition::MemoryPressure) => Ok(Condition::MemoryPressure),
        Ok(pb::NodeCondition::DiskPressure) => Ok(Condition::DiskPressure),
        Ok(pb::NodeCondition::PidPressure) => Ok(Condition::PIDPressure),
        _ => Err(unknown("ConditionsResponse", "conditions", v)),
    }
}

impl From<&NodeStatus> for pb::ConditionsResponse {
    fn from(st: &NodeStatus) -> Self {
        Self {
            conditions: st
                .conditions
                .iter()
                .map(|c| condition_to(*c).into())
                .collect(),
            observations: st
                .observations
                .iter()
                .flat_map(|o| &o.signals)
                .map(|(s, o)| pb::Observation {
                    signal: s.name().to_owned(),
                    available: o.available,
                    capacity: o.capacity,
                })
                .collect(),
            observed_at_unix_ms: st.observations.as_ref().map(|o| unix_ms(o.at)),
        }
    }
}

impl TryFrom<pb::ConditionsResponse> for ConditionsReport {
    type Error = ConvertError;
    fn try_from(r: pb::ConditionsResponse) -> Result<Self, ConvertError> {
        let conditions = r
            .conditions
            .into_iter()
            .map(condition_from)
            .collect::<Result<_, _>>()?;
        let observations = r
            .observations
            .into_iter()
            .map(|o| {
                let signal = Signal::parse(&o.signal)
                    .ok_or_else(|| unknown("Observation", "signal", &o.signal))?;
                let observed = Observed {
                    available: o.available,
                    capacity: o.capacity,
                };
                Ok((signal, observed))
            })
            .collect::<Result<_, ConvertError>>()?;
        Ok(Self {
            conditions,
            observations,
            observed_at_unix_ms: r.observed_at_unix_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evictions_and_ranks_survive_the_round_trip() {
        let e = Eviction {
            at_unix_ms: 1,
            pod: "ns/p".into(),
            uid: "u".into(),
            sandbox_id: "sb".into(),
            signal: "memory.available".into(),
            threshold: "memory.available<100Mi".into(),
            available: -5,
            usage: 10,
            request: 0,
            grace_s: 0,
            message: "The node was low on resource: memory. ".into(),
            dry_run: true,
        };
        assert_eq!(Eviction::from(pb::Eviction::from(&e)), e);
        let r = RankEntry {
            signal: "pid.available".into(),
            rank: 2,
            pod: "ns/p".into(),
            qos: "BestEffort".into(),
            priority: -3,
            usage: None,
            request: 0,
            stall: Some(1234),
        };
        assert_eq!(RankEntry::from(pb::RankEntry::from(&r)), r);
        let n = NotRanked {
            signal: "nodefs.available".into(),
            available: 5 << 30,
            threshold: "10%".into(),
        };
        assert_eq!(NotRanked::from(pb::NotRanked::from(&n)), n);
    }

    #[test]
    fn conditions_carry_typed_conditions_and_signals() {
        let mut st = NodeStatus {
            conditions: [Condition::DiskPressure, Condition::PIDPressure].into(),
            ..Default::default()
        };
        let mut obs = crate::eviction::thresholds::Observations::new(std::time::Instant::now());
        obs.signals.insert(
            Signal::NodefsInodesFree,
            crate::eviction::thresholds::Observation {
                available: 12,
                capacity: 100,
            },
        );
        st.observations = Some(obs);
        let r = ConditionsReport::try_from(pb::ConditionsResponse::from(&st)).unwrap();
        assert_eq!(r.conditions, st.conditions);
        assert_eq!(
            r.observations[&Signal::NodefsInodesFree],
            Observed {
                available: 12,
                capacity: 100
            }
        );
        assert!(r.observed_at_unix_ms.is_some());
        let bad = pb::ConditionsResponse {
            observations: vec![pb::Observation {
                signal: "memory.free".into(),
                available: 0,
                capacity: 0,
            }],
            ..Default::default()
        };
        let e = ConditionsReport::try_from(bad).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Observation.signal: unknown value memory.free"
        );
    }
}
