//! The bodies criguard sends to the Kubernetes API, as pure functions.
//!
//! Each mirrors what the kubelet writes for a node-pressure eviction
//! (kubelet `pkg/kubelet/eviction/eviction_manager.go`, `evictPod`, and its
//! status manager's patch, `pkg/util/pod/pod.go` `PatchPodStatus`):
//! - the pod's status: phase `Failed`, reason `Evicted`, the eviction
//!   message, and the condition `DisruptionTarget` (status True, reason
//!   `TerminationByKubelet`, the same message), sent as a strategic merge
//!   patch whose `metadata.uid` is a precondition, so conditions merge by
//!   type and a new pod of the same name is never touched;
//! - a `Warning` event, reason `Evicted`, with the kubelet's annotations
//!   (`starved_resource`, `offending_containers`, `offending_containers_usage`);
//! - criguard's own node conditions (`CriguardMemoryPressure`, …) and
//!   NoSchedule taints (`criguard.io/memory-pressure`, …).

use std::collections::BTreeSet;
use std::time::SystemTime;

use serde_json::{Value, json};

use crate::signals::table::Condition;

/// What the report needs to know of one eviction.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PodEviction {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Pod UID (a precondition of every write to the pod).
    pub uid: String,
    /// The kubelet-style eviction message.
    pub message: String,
    /// The kubelet's name of the starved resource (`memory`, `ephemeral-storage`, …).
    pub resource: String,
    /// The container using most of it and its usage (`name`, `40Mi`), if known.
    pub offending: Option<(String, String)>,
}

/// The kubelet's pod status reason for an eviction.
pub const REASON_EVICTED: &str = "Evicted";
/// The pod condition type the kubelet adds when it terminates a pod.
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
/// That condition's reason for a kubelet (node-pressure) termination.
pub const TERMINATION_BY_KUBELET: &str = "TerminationByKubelet";
/// `source.component` (and `reportingComponent`) of criguard's events.
pub const COMPONENT: &str = "criguard";

/// `t` as the API's seconds-precision RFC 3339 (`2024-05-01T12:00:00Z`).
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map(|ts| ts.to_string())
        .unwrap_or_default()
}

/// The strategic merge patch of the pod's `status` subresource.
pub fn pod_status_patch(e: &PodEviction, now: SystemTime) -> Value {
    let t = rfc3339(now);
    json!({
        "metadata": { "uid": e.uid },
        "status": {
            "phase": "Failed",
            "reason": REASON_EVICTED,
            "message": e.message,
            "conditions": [{
                "type": DISRUPTION_TARGET,
                "status": "True",
                "reason": TERMINATION_BY_KUBELET,
                "message": e.message,
                "lastProbeTime": null,
                "lastTransitionTime": t,
            }],
        },
    })
}

/// The Warning event the kubelet records on an evicted pod, from criguard
/// on `node`; `resource_version` is the pod's as the status patch left it.
pub fn pod_event(e: &PodEviction, node: &str, resource_version: &str, now: SystemTime) -> Value {
    let nanos = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let t = rfc3339(now);
    let mut annotations = serde_json::Map::new();
    annotations.insert("starved_resource".into(), json!(e.resource));
    if let Some((container, usage)) = &e.offending {
        annotations.insert("offending_containers".into(), json!(container));
        annotations.insert("offending_containers_usage".into(), json!(usage));
    }
    json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": format!("{}.{nanos:x}", e.name),
            "namespace": e.namespace,
            "annotations": annotations,
        },
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": e.namespace,
            "name": e.name,
            "uid": e.uid,
            "resourceVersion": resource_version,
        },
        "type": "Warning",
        "reason": REASON_EVICTED,
        "message": e.message,
        "source": { "component": COMPONENT, "host": node },
        "reportingComponent": COMPONENT,
        "reportingInstance": node,
        "firstTimestamp": t,
        "lastTimestamp": t,
        "count": 1,
    })
}

/// criguard's node condition type for a pressure condition.
pub fn condition_type(c: Condition) -> &'static str {
    match c {
        Condition::MemoryPressure => "CriguardMemoryPressure",
        Condition::DiskPressure => "CriguardDiskPressure",
        Condition::PIDPressure => "CriguardPIDPressure",
    }
}

/// criguard's NoSchedule taint key for a pressure condition.
pub fn taint_key(c: Condition) -> &'static str {
    match c {
        Condition::MemoryPressure => "criguard.io/memory-pressure",
        Condition::DiskPressure => "criguard.io/disk-pressure",
        Condition::PIDPressure => "criguard.io/pid-pressure",
    }
}

/// Every pressure condition criguard reports.
pub const ALL: [Condition; 3] = [
    Condition::MemoryPressure,
    Condition::DiskPressure,
    Condition::PIDPressure,
];

fn reason_and_message(c: Condition) -> (&'static str, &'static str) {
    match c {
        Condition::MemoryPressure => (
            "CriguardHasInsufficientMemory",
            "criguard: a memory eviction threshold is met; pods are being evicted and new BestEffort pods refused",
        ),
        Condition::DiskPressure => (
            "CriguardHasDiskPressure",
            "criguard: a disk eviction threshold is met; pods are being evicted and new pods refused",
        ),
        Condition::PIDPressure => (
            "CriguardHasInsufficientPID",
            "criguard: the pid eviction threshold is met; pods are being evicted",
        ),
    }
}

/// The strategic merge patch of the node's `status` that makes criguard's
/// conditions in the API (`present`, by condition type) match `wanted`:
/// missing ones added, ones whose pressure ended deleted (`$patch: delete`,
/// merged by type, so every other condition stays). `None`: nothing to do.
pub fn node_conditions_patch(
    wanted: &BTreeSet<Condition>,
    present: &BTreeSet<String>,
    now: SystemTime,
) -> Option<Value> {
    let t = rfc3339(now);
    let mut items = Vec::new();
    for c in ALL {
        let ty = condition_type(c);
        match (wanted.contains(&c), present.contains(ty)) {
            (true, false) => {
                let (reason, message) = reason_and_message(c);
                items.push(json!({
                    "type": ty, "status": "True", "reason": reason, "message": message,
                    "lastHeartbeatTime": t, "lastTransitionTime": t,
                }));
            }
            (false, true) => items.push(json!({ "type": ty, "$patch": "delete" })),
            _ => {}
        }
    }
    (!items.is_empty()).then(|| json!({ "status": { "conditions": items } }))
}

/// The node's taints with criguard's own set to `wanted`, every other taint
/// kept as it is; `None` when they already match. Taints have no merge key
/// in the API (the list is replaced whole), so the caller sends the whole
/// list with the node's `resourceVersion` as a precondition.
pub fn taints_with(current: &[Value], wanted: &BTreeSet<Condition>) -> Option<Vec<Value>> {
    let ours: Vec<&str> = ALL.iter().map(|c| taint_key(*c)).collect();
    let key = |t: &Value| t.get("key").and_then(Value::as_str).map(str::to_owned);
    let mut out: Vec<Value> = current
        .iter()
        .filter(|t| key(t).is_none_or(|k| !ours.contains(&k.as_str())))
        .cloned()
        .collect();
    for c in ALL.iter().filter(|c| wanted.contains(c)) {
        out.push(json!({ "key": taint_key(*c), "effect": "NoSchedule" }));
    }
    let have: BTreeSet<String> = current
        .iter()
        .filter_map(key)
        .filter(|k| ours.contains(&k.as_str()))
        .collect();
    let want: BTreeSet<String> = wanted.iter().map(|c| taint_key(*c).to_owned()).collect();
    (have != want).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn eviction() -> PodEviction {
        PodEviction {
            namespace: "default".into(),
            name: "hog".into(),
            uid: "1234-abcd".into(),
            message:
                "The node was low on resource: memory. Threshold quantity: 64Mi, available: 41Mi."
                    .into(),
            resource: "memory".into(),
            offending: Some(("app".into(), "180Mi".into())),
        }
    }

    #[test]
    fn the_status_patch_is_the_kubelets_eviction_status_with_a_uid_precondition() {
        let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let p = pod_status_patch(&eviction(), at);
        assert_eq!(p["metadata"]["uid"], "1234-abcd");
        assert_eq!(p["status"]["phase"], "Failed");
        assert_eq!(p["status"]["reason"], "Evicted");
        assert_eq!(p["status"]["message"], eviction().message);
        let c = &p["status"]["conditions"][0];
        assert_eq!(c["type"], "DisruptionTarget");
        assert_eq!(c["status"], "True");
        assert_eq!(c["reason"], "TerminationByKubelet");
        assert_eq!(c["message"], eviction().message);
        assert_eq!(c["lastTransitionTime"], "2023-11-14T22:13:20Z");
        assert_eq!(p["status"]["conditions"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn the_event_is_a_warning_on_the_pod_from_criguard_on_this_node() {
        let at = UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789);
        let ev = pod_event(&eviction(), "node-a", "42", at);
        assert_eq!(
            ev["metadata"]["name"],
            format!("hog.{:x}", 1_700_000_000_123_456_789u128)
        );
        assert_eq!(ev["metadata"]["namespace"], "default");
        assert_eq!(ev["type"], "Warning");
        assert_eq!(ev["reason"], "Evicted");
        assert_eq!(ev["involvedObject"]["uid"], "1234-abcd");
        assert_eq!(ev["involvedObject"]["kind"], "Pod");
        assert_eq!(ev["involvedObject"]["resourceVersion"], "42");
        assert_eq!(
            ev["source"],
            json!({"component": "criguard", "host": "node-a"})
        );
        let a = &ev["metadata"]["annotations"];
        assert_eq!(a["starved_resource"], "memory");
        assert_eq!(a["offending_containers"], "app");
        assert_eq!(a["offending_containers_usage"], "180Mi");
    }

    #[test]
    fn node_conditions_are_added_and_deleted_by_type_only_when_they_differ() {
        let t = UNIX_EPOCH;
        let memory = BTreeSet::from([Condition::MemoryPressure]);
        let none = BTreeSet::new();
        let p = node_conditions_patch(&memory, &BTreeSet::new(), t).unwrap();
        let c = &p["status"]["conditions"][0];
        assert_eq!(c["type"], "CriguardMemoryPressure");
        assert_eq!(c["status"], "True");
        assert_eq!(c["reason"], "CriguardHasInsufficientMemory");
        let present = BTreeSet::from(["CriguardMemoryPressure".to_owned()]);
        assert_eq!(node_conditions_patch(&memory, &present, t), None);
        let p = node_conditions_patch(&none, &present, t).unwrap();
        assert_eq!(
            p,
            json!({"status": {"conditions": [{"type": "CriguardMemoryPressure", "$patch": "delete"}]}})
        );
    }

    #[test]
    fn taints_keep_everyone_elses_and_change_only_criguards() {
        let lifecycle =
            json!({"key": "node.kubernetes.io/memory-pressure", "effect": "NoSchedule"});
        let disk = BTreeSet::from([Condition::DiskPressure]);
        let got = taints_with(std::slice::from_ref(&lifecycle), &disk).unwrap();
        assert_eq!(
            got,
            vec![
                lifecycle.clone(),
                json!({"key": "criguard.io/disk-pressure", "effect": "NoSchedule"})
            ]
        );
        assert_eq!(taints_with(&got, &disk), None, "already there");
        assert_eq!(taints_with(&got, &BTreeSet::new()), Some(vec![lifecycle]));
    }
}
