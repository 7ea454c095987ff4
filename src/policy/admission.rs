//! Admission at RunPodSandbox, as the kubelet's eviction admission handler
//! (`pkg/kubelet/eviction/eviction_manager.go`, Admit) decides it, plus
//! criguard's own rule that an evicted pod stays down while its pressure lasts.

use std::collections::BTreeSet;

use super::thresholds::Condition;
use crate::model::QosClass;

/// Whether a new sandbox may start; the error says why not.
///
/// Critical pods are always admitted. A pod criguard evicted is refused while
/// the condition it was evicted for holds (conditions include the pressure
/// transition period). Under DiskPressure no pod is admitted; under
/// MemoryPressure no BestEffort pod.
pub fn admit(
    conditions: &BTreeSet<Condition>,
    evicted_for: Option<Condition>,
    qos: QosClass,
    critical: bool,
) -> Result<(), String> {
    if critical {
        return Ok(());
    }
    if let Some(c) = evicted_for
        && conditions.contains(&c)
    {
        return Err(format!(
            "criguard evicted this pod because of {c:?}; it may run again once the node has had no {c:?} for the pressure transition period"
        ));
    }
    if conditions.contains(&Condition::DiskPressure) {
        return Err("the node has condition DiskPressure: no new pods are admitted".into());
    }
    if qos == QosClass::BestEffort && conditions.contains(&Condition::MemoryPressure) {
        return Err(
            "the node has condition MemoryPressure: no new BestEffort pods are admitted".into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use Condition::*;
    use QosClass::*;

    #[test]
    fn admission_follows_the_kubelet_and_keeps_evicted_pods_down() {
        let memory = BTreeSet::from([MemoryPressure]);
        let disk = BTreeSet::from([DiskPressure]);
        let none = BTreeSet::new();
        let cases = [
            (&memory, None, BestEffort, false, false),
            (&memory, None, Burstable, false, true),
            (&memory, None, BestEffort, true, true),
            (&disk, None, Guaranteed, false, false),
            (&disk, None, Guaranteed, true, true),
            (&memory, Some(MemoryPressure), Guaranteed, false, false),
            (&none, Some(MemoryPressure), BestEffort, false, true),
            (&none, None, BestEffort, false, true),
        ];
        for (conds, evicted, qos, critical, ok) in cases {
            assert_eq!(
                admit(conds, evicted, qos, critical).is_ok(),
                ok,
                "{conds:?} {evicted:?} {qos:?} {critical}"
            );
        }
    }
}
