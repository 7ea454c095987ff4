//! Kernel OOM kills in pods.

use super::ConvertError;
use super::pod::{qos_from, qos_to};
use crate::admin::pb;
use crate::oom::kills::OomKill;

impl From<&OomKill> for pb::KernelOomKill {
    fn from(k: &OomKill) -> Self {
        Self {
            at_unix_ms: k.at_unix_ms,
            pod: k.pod.clone(),
            uid: k.uid.clone(),
            sandbox_id: k.sandbox_id.clone(),
            container: k.container.clone(),
            container_id: k.container_id.clone(),
            qos: qos_to(k.qos).into(),
            kills: k.kills,
            first_ranked: k.first_ranked.clone(),
            matched_rank: k.matched_rank,
            notified: k.notified,
        }
    }
}

impl TryFrom<pb::KernelOomKill> for OomKill {
    type Error = ConvertError;
    fn try_from(k: pb::KernelOomKill) -> Result<Self, ConvertError> {
        Ok(Self {
            qos: qos_from(k.qos).map_err(|e| ConvertError {
                message: "KernelOomKill",
                ..e
            })?,
            at_unix_ms: k.at_unix_ms,
            pod: k.pod,
            uid: k.uid,
            sandbox_id: k.sandbox_id,
            container: k.container,
            container_id: k.container_id,
            kills: k.kills,
            first_ranked: k.first_ranked,
            matched_rank: k.matched_rank,
            notified: k.notified,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::qos::QosClass;

    #[test]
    fn a_kill_survives_the_round_trip_and_an_unknown_class_is_named() {
        let k = OomKill {
            at_unix_ms: 1_795_447_067_674,
            pod: "default/x".into(),
            uid: "u1".into(),
            sandbox_id: "sb1".into(),
            container: "hog".into(),
            container_id: "c1".into(),
            qos: QosClass::BestEffort,
            kills: 1,
            first_ranked: Some("default/x".into()),
            matched_rank: true,
            notified: true,
        };
        let back = OomKill::try_from(pb::KernelOomKill::from(&k)).unwrap();
        assert_eq!(back, k);
        let mut none = k.clone();
        none.first_ranked = None;
        assert_eq!(
            OomKill::try_from(pb::KernelOomKill::from(&none)).unwrap(),
            none
        );
        let bad = pb::KernelOomKill {
            qos: 42,
            ..pb::KernelOomKill::from(&k)
        };
        let err = OomKill::try_from(bad).unwrap_err();
        assert_eq!(err.to_string(), "KernelOomKill.qos: unknown value 42");
    }
}
