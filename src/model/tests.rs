//! The node model's rules, on plain data.

use super::*;

/// A Ready sandbox `id` under cgroup `parent` (shared with other modules' tests).
pub(crate) fn sandbox(id: &str, parent: &str) -> SandboxInfo {
    SandboxInfo {
        id: id.into(),
        name: format!("pod-{id}"),
        namespace: "default".into(),
        uid: format!("uid-{id}"),
        cgroup_parent: parent.into(),
        state: Some(SandboxState::Ready),
        ..Default::default()
    }
}

fn container(id: &str, sandbox: &str, adj: i64, limit: i64) -> ContainerInfo {
    ContainerInfo {
        id: id.into(),
        sandbox_id: sandbox.into(),
        name: format!("c-{id}"),
        oom_score_adj: adj,
        memory_limit: limit,
        state: Some(ContainerState::Running),
        annotations: HashMap::from([(crate::model::keys::ANNOTATION_GRACE.into(), "45".into())]),
        ..Default::default()
    }
}

#[test]
fn burstable_pod_gets_requests_from_oom_score_adj() {
    let mut m = NodeModel::new(1000 << 20);
    m.upsert_sandbox(sandbox("s1", "/kubepods/burstable/poduid-s1"));
    m.upsert_container(container("c1", "s1", 750, 0));
    let pod = m.pod("s1").unwrap();
    assert_eq!(pod.qos, QosClass::Burstable);
    assert_eq!(pod.memory_request(), 250 << 20);
    assert_eq!(pod.grace_period_s, Some(45));
    assert_eq!(
        pod.containers["c1"].cgroup_path,
        "/kubepods/burstable/poduid-s1/c1"
    );
    assert!(!pod.critical);
}

#[test]
fn stopping_a_sandbox_exits_its_running_containers() {
    let mut m = NodeModel::new(1 << 30);
    m.upsert_sandbox(sandbox("s1", "/kubepods/pods1"));
    m.upsert_container(container("c1", "s1", -997, 64 << 20));
    m.set_sandbox_state("s1", SandboxState::NotReady);
    let pod = m.pod("s1").unwrap();
    assert_eq!(pod.state, SandboxState::NotReady);
    assert_eq!(pod.containers["c1"].state, ContainerState::Exited);
    assert_eq!(pod.containers["c1"].memory_request, 64 << 20);
}

#[test]
fn upsert_keeps_runtime_owned_fields_it_was_not_given() {
    let mut m = NodeModel::new(1 << 30);
    let mut s = sandbox("s1", "/kubepods/pods1");
    s.created_at_ns = 42;
    m.upsert_sandbox(s);
    let mut again = sandbox("s1", "/kubepods/pods1");
    again.state = None;
    m.upsert_sandbox(again);
    let pod = m.pod("s1").unwrap();
    assert_eq!((pod.created_at_ns, pod.state), (42, SandboxState::Ready));
}

#[test]
fn a_task_exit_ends_its_container_and_a_pause_exit_only_its_sandbox() {
    let mut m = NodeModel::new(1 << 30);
    m.upsert_sandbox(sandbox("s1", "/kubepods/pods1"));
    m.upsert_container(container("c1", "s1", 1000, 0));
    m.upsert_container(container("c2", "s1", 1000, 0));
    assert_eq!(
        m.task_exited("c1"),
        TaskOwner::Container {
            sandbox_id: "s1".into()
        }
    );
    let pod = m.pod("s1").unwrap();
    assert_eq!(pod.containers["c1"].state, ContainerState::Exited);
    assert_eq!(pod.state, SandboxState::Ready);
    assert_eq!(m.task_exited("s1"), TaskOwner::Sandbox);
    let pod = m.pod("s1").unwrap();
    assert_eq!(pod.state, SandboxState::NotReady);
    assert_eq!(
        pod.containers["c2"].state,
        ContainerState::Running,
        "a dead pause process does not stop the containers"
    );
    assert_eq!(m.task_exited("nobody"), TaskOwner::Unknown);
}

#[test]
fn stale_reports_never_move_a_state_backwards() {
    let mut m = NodeModel::new(1 << 30);
    m.upsert_sandbox(sandbox("s1", "/kubepods/pods1"));
    let mut c = container("c1", "s1", 1000, 0);
    c.state = Some(ContainerState::Created);
    m.upsert_container(c.clone());
    m.task_exited("c1");
    // The StartContainer answer observed after the exit event.
    m.set_container_state("c1", ContainerState::Running);
    // A list read before the exit, applied after it.
    m.refresh_container("c1", ContainerState::Running, 5);
    m.upsert_container(ContainerInfo {
        state: Some(ContainerState::Running),
        ..c
    });
    m.refresh_sandbox("s1", SandboxState::NotReady, 1);
    m.refresh_sandbox("s1", SandboxState::Ready, 1);
    let pod = m.pod("s1").unwrap();
    assert_eq!(pod.containers["c1"].state, ContainerState::Exited);
    assert_eq!(pod.state, SandboxState::NotReady);
    // Forward moves still apply; Unknown replaces nothing known.
    let mut m = NodeModel::new(1 << 30);
    m.upsert_sandbox(sandbox("s1", "/kubepods/pods1"));
    m.upsert_container(container("c1", "s1", 1000, 0));
    m.refresh_container("c1", ContainerState::Unknown, 0);
    assert_eq!(
        m.pod("s1").unwrap().containers["c1"].state,
        ContainerState::Running
    );
    m.refresh_container("c1", ContainerState::Exited, 0);
    assert_eq!(
        m.pod("s1").unwrap().containers["c1"].state,
        ContainerState::Exited
    );
}

#[test]
fn removing_a_sandbox_removes_its_containers() {
    let mut m = NodeModel::new(1 << 30);
    m.upsert_sandbox(sandbox("s1", "/kubepods/pods1"));
    m.upsert_container(container("c1", "s1", -997, 1));
    m.remove_sandbox("s1");
    assert_eq!(m.ids(), (vec![], vec![]));
}

#[test]
fn pod_with_derives_as_a_copy_with_the_container_added_would() {
    let mut m = NodeModel::new(1000 << 20);
    m.upsert_sandbox(sandbox("s1", "/kubepods/burstable/poduid-s1"));
    m.upsert_container(container("c1", "s1", 750, 0));
    m.upsert_sandbox(sandbox("s2", "/kubepods/podus2"));
    m.upsert_container(container("c2", "s2", -997, 100 << 20));
    let extra = container("new", "s1", 900, 0);
    let mut copy = m.clone();
    copy.upsert_container(extra.clone());
    assert_eq!(m.pod_with("s1", None, &extra), copy.pod("s1"));
    // Unknown sandbox: the fallback's inputs, or nothing without one.
    let extra = container("new", "s3", -997, 50 << 20);
    assert_eq!(m.pod_with("s3", None, &extra), None);
    let fallback = sandbox("s3", "/kubepods/pods3");
    let mut copy = m.clone();
    copy.upsert_sandbox(fallback.clone());
    copy.upsert_container(extra.clone());
    assert_eq!(m.pod_with("s3", Some(fallback), &extra), copy.pod("s3"));
    assert_eq!(m.pod("s3"), None, "the model itself is not changed");
}

fn api_pod(uid: &str, priority: i32, requests: &[(&str, i64)]) -> spec::ApiPod {
    spec::ApiPod {
        uid: uid.into(),
        priority: Some(priority),
        containers: requests
            .iter()
            .map(|(name, memory)| spec::ApiContainer {
                name: (*name).into(),
                kind: spec::ContainerKind::Regular,
                requests: spec::Resources {
                    memory: Some(*memory),
                    ephemeral_storage: Some(1 << 30),
                },
                limits: spec::Resources::default(),
            })
            .collect(),
        ..Default::default()
    }
}

#[test]
fn the_apis_pod_gives_exact_requests_priority_and_the_kubelets_score() {
    // 24 GiB node: a 20 MiB request is below capacity/1000 and reads as 0
    // from the score.
    let mut m = NodeModel::new(24 << 30);
    m.upsert_sandbox(sandbox("s1", "/kubepods/burstable/poduid-s1"));
    m.upsert_container(container("c1", "s1", 999, 0));
    let inferred = m.pod("s1").unwrap();
    assert_eq!(inferred.source, PodSource::Inferred);
    assert_eq!((inferred.memory_request(), inferred.priority), (0, 0));
    assert_eq!(inferred.containers["c1"].api_oom_score_adj, None);
    assert_eq!(m.sources(), (0, 1));

    let before = m.generation();
    m.upsert_api_pod(api_pod("uid-s1", 2_000_000_000, &[("c-c1", 20 << 20)]));
    assert!(
        m.generation() > before,
        "an API pod changes what is derived"
    );
    let pod = m.pod("s1").unwrap();
    assert_eq!(pod.source, PodSource::Api);
    assert_eq!(pod.memory_request(), 20 << 20);
    assert_eq!(pod.requests.ephemeral_storage, 1 << 30);
    assert_eq!(pod.containers["c1"].memory_request, 20 << 20);
    assert_eq!(pod.containers["c1"].ephemeral_storage_request, 1 << 30);
    assert_eq!(pod.priority, 2_000_000_000);
    assert!(pod.critical, "system-cluster-critical's priority");
    assert_eq!(pod.containers["c1"].api_oom_score_adj, Some(999));
    assert_eq!(m.sources(), (1, 0));

    // The same pod again changes nothing; a list without it forgets it.
    let g = m.generation();
    m.upsert_api_pod(api_pod("uid-s1", 2_000_000_000, &[("c-c1", 20 << 20)]));
    assert_eq!(m.generation(), g);
    m.set_api_pods([api_pod("uid-other", 0, &[])]);
    assert_eq!(m.pod("s1").unwrap().source, PodSource::Inferred);
    m.remove_api_pod("uid-other");
    assert!(m.api_pod("uid-other").is_none());
}

#[test]
fn an_in_place_resize_updates_the_containers_limits() {
    let mut m = NodeModel::new(1 << 30);
    m.upsert_sandbox(sandbox("s1", "/kubepods/burstable/poduid-s1"));
    m.upsert_container(container("c1", "s1", 500, 512 << 20));
    let g = m.generation();
    let resized = ContainerResources {
        cpu_shares: 204,
        cpu_quota: 0,
        cpu_period: 100_000,
        memory_limit: 768 << 20,
    };
    m.update_container_resources("c1", &resized);
    assert!(m.generation() > g);
    let c = &m.pod("s1").unwrap().containers["c1"];
    assert_eq!((c.memory_limit, c.cpu_shares), (768 << 20, 204));
    assert_eq!(c.oom_score_adj, 500, "the score stays as created");
    m.update_container_resources("absent", &resized);
}
