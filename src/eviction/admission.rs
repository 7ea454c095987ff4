//! Admission at RunPodSandbox, as the kubelet's eviction admission handler
//! (`pkg/kubelet/eviction/eviction_manager.go`, Admit) decides it, plus
//! criguard's own rule that a pod it evicted never runs again on this node
//! (see [`super::records`]): [`admit`] is the pure rule, [`decide`] applies
//! it to the node's status for the proxy's observer.

use std::collections::BTreeSet;
use std::sync::RwLock;

use super::records::EvictedPod;
use super::status::NodeStatus;
use crate::lock::RwLocked;
use crate::model::qos::QosClass;
use crate::signals::table::{Condition, Refusal};

/// Whether a new sandbox may start; the error says why not.
///
/// A pod UID criguard evicted is refused for good, with the eviction's
/// message (its controller makes a new pod, with a new UID). Otherwise
/// critical pods are always admitted; under DiskPressure no pod is, and
/// under MemoryPressure no BestEffort pod.
pub fn admit(
    conditions: &BTreeSet<Condition>,
    evicted: Option<&EvictedPod>,
    qos: QosClass,
    critical: bool,
) -> Result<(), (Refusal, String)> {
    if let Some(e) = evicted {
        return Err((
            Refusal::Evicted,
            format!(
                "criguard evicted pod {} from this node: {} An evicted pod does not run again; its controller creates a new one",
                e.pod,
                e.message.trim_end()
            ),
        ));
    }
    if critical {
        return Ok(());
    }
    if conditions.contains(&Condition::DiskPressure) {
        return Err((
            Refusal::DiskPressure,
            "the node has condition DiskPressure: no new pods are admitted".into(),
        ));
    }
    if qos == QosClass::BestEffort && conditions.contains(&Condition::MemoryPressure) {
        return Err((
            Refusal::MemoryPressure,
            "the node has condition MemoryPressure: no new BestEffort pods are admitted".into(),
        ));
    }
    Ok(())
}

/// The admission of a new sandbox of pod `uid` against the node's
/// `status` at `now_ms` (Unix ms): [`admit`] on its conditions and evicted
/// pods. Under a dry run only an evicted pod is refused (the refusal a
/// condition would bring is logged, the pod admitted: a dry run changes
/// nothing on the node); an evicted pod's refusal is noted in its record,
/// which the next eviction round saves.
pub fn decide(
    status: &RwLock<NodeStatus>,
    uid: &str,
    qos: QosClass,
    critical: bool,
    now_ms: u64,
) -> Result<(), (Refusal, String)> {
    let mut st = status.write_locked();
    let decision = admit(&st.conditions, st.evicted.get(uid), qos, critical);
    let (refusal, why) = match decision {
        Ok(()) => return Ok(()),
        Err(r) => r,
    };
    if st.dry_run && refusal != Refusal::Evicted {
        // A dry run changes nothing on the node: the pod starts.
        drop(st);
        crate::log_limited!(info, %uid, ?qos, reason = %why, "dry run: RunPodSandbox would be refused; admitted");
        return Ok(());
    }
    if refusal == Refusal::Evicted {
        // Saved with the next eviction round: asked for, not forgotten.
        st.evicted.asked(uid, now_ms);
    }
    Err((refusal, why))
}

#[cfg(test)]
mod tests {
    use super::*;
    use Condition::*;
    use QosClass::*;

    #[test]
    fn admission_follows_the_kubelet_and_keeps_evicted_pods_down_for_good() {
        let evicted = EvictedPod {
            pod: "ns/hog".into(),
            message: "The node was low on resource: memory. ".into(),
            evicted_at_ms: 0,
            last_asked_ms: 0,
            refusals: 0,
        };
        let memory = BTreeSet::from([MemoryPressure]);
        let disk = BTreeSet::from([DiskPressure]);
        let none = BTreeSet::new();
        let e = Some(&evicted);
        use Refusal as R;
        let cases = [
            (&memory, None, BestEffort, false, Some(R::MemoryPressure)),
            (&memory, None, Burstable, false, None),
            (&memory, None, BestEffort, true, None),
            (&disk, None, Guaranteed, false, Some(R::DiskPressure)),
            (&disk, None, Guaranteed, true, None),
            (&memory, e, Guaranteed, false, Some(R::Evicted)),
            // Pressure long gone: an evicted UID still never comes back.
            (&none, e, BestEffort, false, Some(R::Evicted)),
            (&none, e, Guaranteed, true, Some(R::Evicted)),
            (&none, None, BestEffort, false, None),
        ];
        for (conds, evicted, qos, critical, want) in cases {
            let got = admit(conds, evicted, qos, critical).err().map(|(r, _)| r);
            assert_eq!(got, want, "{conds:?} {evicted:?} {qos:?} {critical}");
        }
        let (_, why) = admit(&none, e, BestEffort, false).unwrap_err();
        assert_eq!(
            why,
            "criguard evicted pod ns/hog from this node: The node was low on resource: memory. \
             An evicted pod does not run again; its controller creates a new one"
        );
    }
}
