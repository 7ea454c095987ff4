use super::*;
use serde_json::json;

const MI: i64 = 1 << 20;

fn pod(v: serde_json::Value) -> Pod {
    serde_json::from_value(v).unwrap()
}

#[test]
fn a_pods_facts_are_read_with_the_allocated_requests_after_a_resize() {
    let p = pod(json!({
        "metadata": {"name": "web", "namespace": "prod", "uid": "u-1"},
        "spec": {
            "priority": 1000000, "priorityClassName": "high",
            "containers": [{"name": "app", "resources": {
                "requests": {"memory": "300Mi", "cpu": "100m"},
                "limits": {"memory": "768Mi", "ephemeral-storage": "1Gi"}}}],
            "initContainers": [
                {"name": "proxy", "restartPolicy": "Always",
                 "resources": {"requests": {"memory": "32Mi"}}},
                {"name": "migrate", "resources": {"requests": {"ephemeral-storage": "2Gi"}}}],
            "overhead": {"memory": "10Mi"},
            "volumes": [
                {"name": "cache", "emptyDir": {"sizeLimit": "64Mi"}},
                {"name": "shm", "emptyDir": {"medium": "Memory"}},
                {"name": "config", "configMap": {"name": "c"}}],
        },
        "status": {"containerStatuses": [{
            "name": "app", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
            "allocatedResources": {"memory": "50Mi", "cpu": "100m"},
            "resources": {"limits": {"memory": "512Mi"}}}]},
    }));
    let a = api_pod(&p).unwrap();
    assert_eq!(
        (a.uid.as_str(), a.namespace.as_str(), a.name.as_str()),
        ("u-1", "prod", "web")
    );
    assert_eq!(
        (a.priority, a.priority_class.as_str()),
        (Some(1_000_000), "high")
    );
    assert!(!a.mirror && !a.pod_level);
    let app = a.container("app").unwrap();
    assert_eq!(app.kind, ContainerKind::Regular);
    assert_eq!(
        app.requests.memory,
        Some(50 * MI),
        "allocated, not the spec's 300Mi"
    );
    assert_eq!(
        app.limits.memory,
        Some(512 * MI),
        "applied, not the spec's 768Mi"
    );
    assert_eq!(a.container("proxy").unwrap().kind, ContainerKind::Sidecar);
    let migrate = a.container("migrate").unwrap();
    assert_eq!(migrate.kind, ContainerKind::Init);
    assert_eq!(migrate.requests.ephemeral_storage, Some(2 << 30));
    assert_eq!(a.overhead.memory, Some(10 * MI));
    assert_eq!(
        a.empty_dirs,
        [
            EmptyDir {
                name: "cache".into(),
                memory: false,
                size_limit: Some(64 * MI)
            },
            EmptyDir {
                name: "shm".into(),
                memory: true,
                size_limit: None
            },
        ]
    );
}

#[test]
fn a_mirror_pod_is_keyed_by_its_static_pods_uid_and_is_critical() {
    let p = pod(json!({
        "metadata": {"name": "etcd-node1", "namespace": "kube-system", "uid": "mirror-uid",
                     "annotations": {"kubernetes.io/config.mirror": "static-uid"}},
        "spec": {"containers": [{"name": "etcd"}], "priority": 2000001000,
                 "priorityClassName": "system-node-critical"},
    }));
    let a = api_pod(&p).unwrap();
    assert_eq!(a.uid, "static-uid");
    assert_eq!(sandbox_uid(&p).map(String::as_str), Some("static-uid"));
    assert!(a.mirror && a.critical() && a.node_critical());
}

#[test]
fn pod_level_resources_are_recognised_by_cpu_memory_or_huge_pages() {
    let with = |resources: serde_json::Value| {
        api_pod(&pod(json!({
            "metadata": {"uid": "u"},
            "spec": {"containers": [{"name": "a"}], "resources": resources},
        })))
        .unwrap()
    };
    let a = with(json!({"requests": {"memory": "2Gi"}, "limits": {"memory": "4Gi"}}));
    assert!(a.pod_level);
    assert_eq!(
        (a.pod_memory_request, a.pod_memory_limit),
        (Some(2 << 30), Some(4 << 30))
    );
    assert!(with(json!({"limits": {"cpu": "1"}})).pod_level);
    assert!(with(json!({"requests": {"hugepages-2Mi": "4Mi"}})).pod_level);
    assert!(!with(json!({})).pod_level);
}

#[test]
fn a_field_that_is_not_a_quantity_is_named_with_its_value() {
    let p = pod(json!({
        "metadata": {"uid": "u"},
        "spec": {"containers": [{"name": "app", "resources": {"requests": {"memory": "lots"}}}]},
    }));
    let err = api_pod(&p).unwrap_err();
    assert!(
        err.contains("container app: requests.memory") && err.contains("\"lots\""),
        "{err}"
    );
    let p = pod(json!({"metadata": {"name": "x"}, "spec": {"containers": []}}));
    assert!(api_pod(&p).unwrap_err().contains("metadata.uid"));
}
