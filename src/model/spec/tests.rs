//! Table cases written from the kubelet's behaviour for the same pods
//! (`pkg/kubelet/qos/policy_test.go`, `pkg/api/v1/resource/helpers_test.go`).

use super::*;
use QosClass::*;

const MI: i64 = 1 << 20;
const GI: i64 = 1 << 30;

fn container(name: &str, kind: ContainerKind, memory: Option<i64>) -> ApiContainer {
    ApiContainer {
        name: name.into(),
        kind,
        requests: Resources {
            memory,
            ephemeral_storage: None,
        },
        limits: Resources::default(),
    }
}

fn regular(name: &str, memory: i64) -> ApiContainer {
    container(name, ContainerKind::Regular, Some(memory))
}

fn pod(containers: Vec<ApiContainer>) -> ApiPod {
    ApiPod {
        uid: "u".into(),
        containers,
        ..Default::default()
    }
}

fn with_pod_memory(mut p: ApiPod, request: i64) -> ApiPod {
    p.pod_level = true;
    p.pod_memory_request = Some(request);
    p
}

fn adj(p: &ApiPod, qos: QosClass, name: &str, capacity: i64) -> i64 {
    oom_score_adj(p, qos, name, capacity).unwrap()
}

#[test]
fn burstable_scores_follow_the_request_within_three_and_999() {
    let cap = 4_000_000_000;
    let p = pod(vec![
        regular("quarter", 1_000_000_000),
        regular("tiny", 1),
        regular("all", 5_000_000_000),
        container("none", ContainerKind::Regular, None),
    ]);
    assert_eq!(adj(&p, Burstable, "quarter", cap), 750);
    assert_eq!(adj(&p, Burstable, "tiny", cap), 999);
    assert_eq!(adj(&p, Burstable, "all", cap), 3);
    assert_eq!(adj(&p, Burstable, "none", cap), 999);
    assert_eq!(adj(&p, Guaranteed, "quarter", cap), -997);
    assert_eq!(adj(&p, BestEffort, "none", cap), 1000);
    assert_eq!(oom_score_adj(&p, Burstable, "absent", cap), None);
}

#[test]
fn only_node_critical_pods_score_as_guaranteed_whatever_their_class() {
    let cap = 4_000_000_000;
    let mut p = pod(vec![regular("app", 1_000_000_000)]);
    p.priority = Some(2_000_000_000);
    p.priority_class = "system-cluster-critical".into();
    assert!(p.critical() && !p.node_critical());
    assert_eq!(
        adj(&p, Burstable, "app", cap),
        750,
        "cluster-critical keeps the formula"
    );
    p.priority = Some(2_000_001_000);
    p.priority_class = SYSTEM_NODE_CRITICAL.into();
    assert!(p.node_critical());
    assert_eq!(adj(&p, Burstable, "app", cap), -997);
    assert_eq!(adj(&p, BestEffort, "app", cap), -997);
    p.priority = Some(5);
    assert!(!p.critical(), "the class name alone makes no pod critical");
    p.mirror = true;
    assert!(p.critical(), "a mirror pod is a static pod's");
}

#[test]
fn an_unallocated_pod_level_request_is_shared_per_container() {
    let cap = 4_000_000_000;
    // No container requests: 2e9 shared by two, 1e9 each.
    let p = with_pod_memory(
        pod(vec![
            container("a", ContainerKind::Regular, None),
            container("b", ContainerKind::Regular, None),
        ]),
        2_000_000_000,
    );
    assert_eq!(adj(&p, Burstable, "a", cap), 750);
    assert_eq!(adj(&p, Burstable, "b", cap), 750);
    // 1e9 of 2e9 requested by one container: the other 1e9 shared.
    let p = with_pod_memory(
        pod(vec![
            regular("burstable", 1_000_000_000),
            container("best-effort", ContainerKind::Regular, None),
        ]),
        2_000_000_000,
    );
    assert_eq!(adj(&p, Burstable, "burstable", cap), 625);
    assert_eq!(adj(&p, Burstable, "best-effort", cap), 875);
    // Containers asking for more than the pod: nothing to share.
    let p = with_pod_memory(pod(vec![regular("a", 3_000_000_000)]), 2_000_000_000);
    assert_eq!(adj(&p, Burstable, "a", cap), 250);
}

#[test]
fn a_sidecar_scores_no_higher_than_the_smallest_regular_container() {
    let cap = 4_000_000_000;
    let mut p = pod(vec![
        regular("c1", 1_000_000_000),
        regular("c2", 500_000_000),
        container("sidecar", ContainerKind::Sidecar, Some(200_000_000)),
    ]);
    // Without pod-level resources: 200e6 alone would give 950.
    assert_eq!(adj(&p, Burstable, "sidecar", cap), 875);
    assert_eq!(adj(&p, Burstable, "c2", cap), 875);
    // With a 2e9 pod-level request: 0.3e9 unallocated, 0.1e9 each.
    p = with_pod_memory(p, 2_000_000_000);
    assert_eq!(adj(&p, Burstable, "c1", cap), 725);
    assert_eq!(adj(&p, Burstable, "c2", cap), 850);
    assert_eq!(adj(&p, Burstable, "sidecar", cap), 850);
    // A plain init container is no sidecar.
    let p = pod(vec![
        regular("c1", 1_000_000_000),
        container("init", ContainerKind::Init, Some(200_000_000)),
    ]);
    assert_eq!(adj(&p, Burstable, "init", cap), 950);
}

#[test]
fn requests_below_a_thousandth_of_a_large_node_still_count_exactly() {
    let cap = 256 * GI;
    let p = pod(vec![regular("small", 20 * MI)]);
    assert_eq!(adj(&p, Burstable, "small", cap), 999);
    assert_eq!(pod_request(&p, Resource::Memory), 20 * MI);
}

#[test]
fn the_pod_request_takes_init_containers_and_sidecars_as_the_scheduler_does() {
    // Regular 100 + sidecar 50 = 150; the init container after the sidecar
    // needs 300 + 50 while it runs: 350.
    let p = pod(vec![
        regular("app", 100 * MI),
        container("proxy", ContainerKind::Sidecar, Some(50 * MI)),
        container("migrate", ContainerKind::Init, Some(300 * MI)),
    ]);
    assert_eq!(pod_request(&p, Resource::Memory), 350 * MI);
    // An init container before the sidecar does not add it.
    let p = pod(vec![
        regular("app", 100 * MI),
        container("migrate", ContainerKind::Init, Some(120 * MI)),
        container("proxy", ContainerKind::Sidecar, Some(50 * MI)),
    ]);
    assert_eq!(pod_request(&p, Resource::Memory), 150 * MI);
    assert_eq!(pod_request(&p, Resource::EphemeralStorage), 0);
}

#[test]
fn overhead_counts_only_on_a_request_and_pod_level_requests_replace_the_containers() {
    let mut p = pod(vec![regular("app", 100 * MI)]);
    p.overhead = Resources {
        memory: Some(10 * MI),
        ephemeral_storage: Some(MI),
    };
    assert_eq!(pod_request(&p, Resource::Memory), 110 * MI);
    assert_eq!(
        pod_request(&p, Resource::EphemeralStorage),
        0,
        "no request, no overhead"
    );
    let p = with_pod_memory(p, 400 * MI);
    assert_eq!(pod_request(&p, Resource::Memory), 410 * MI);
    // Pod-level resources set by a CPU or limit alone: the memory request is
    // the pod-level one, absent.
    let mut p = pod(vec![regular("app", 100 * MI)]);
    p.pod_level = true;
    assert_eq!(pod_request(&p, Resource::Memory), 0);
    let mut p = pod(vec![ApiContainer {
        requests: Resources {
            memory: None,
            ephemeral_storage: Some(GI),
        },
        ..regular("app", 0)
    }]);
    assert_eq!(pod_request(&p, Resource::EphemeralStorage), GI);
    p.pod_level = true;
    assert_eq!(
        pod_request(&p, Resource::EphemeralStorage),
        0,
        "ephemeral-storage is no pod-level resource"
    );
}
