//! The disk rule of `criguard rank` and the parallel reads' order.

use super::*;
use crate::config::Amount;
use crate::eviction::thresholds::Observation;

fn threshold(signal: Signal, amount: Amount) -> Threshold {
    Threshold::hard(signal, amount)
}

#[test]
fn disk_is_ranked_only_near_a_threshold_or_when_it_cannot_tell() {
    let s = Signal::NodefsAvailable;
    let (hard, soft) = (
        threshold(s, Amount::Percentage(10.0)),
        threshold(s, Amount::Quantity(300)),
    );
    let obs = |available| Observation {
        available,
        capacity: 1000,
    };
    // The nearest (largest) line decides: 300 left twice is 600.
    assert!(disk_ranking_wanted(s, &[&hard, &soft], Some(&obs(599))).is_ok());
    let far = disk_ranking_wanted(s, &[&hard, &soft], Some(&obs(600))).unwrap_err();
    assert_eq!(
        far,
        NotRanked {
            signal: "nodefs.available".into(),
            available: 600,
            threshold: "300".into(),
        }
    );
    assert!(
        far.to_string().starts_with("nodefs.available: not ranked"),
        "{far}"
    );
    assert!(disk_ranking_wanted(s, &[&hard], Some(&obs(150))).is_ok());
    assert!(disk_ranking_wanted(s, &[&hard], Some(&obs(250))).is_err());
    assert!(disk_ranking_wanted(s, &[&hard], None).is_ok(), "unobserved");
    assert!(
        disk_ranking_wanted(s, &[], Some(&obs(999))).is_ok(),
        "no threshold told"
    );
}

#[test]
fn parallel_reads_keep_the_pods_order() {
    let model = NodeModel::new(0);
    let pods: Vec<Pod> = (0..200)
        .map(|i| {
            let mut m = model.clone();
            m.upsert_sandbox(crate::model::SandboxInfo {
                id: format!("{i:03}"),
                ..Default::default()
            });
            m.pods().remove(0)
        })
        .collect();
    let got = per_pod(&pods, |p| {
        (p.sandbox_id != "007").then(|| p.sandbox_id.clone())
    });
    let want: Vec<Option<String>> = (0..200)
        .map(|i| (i != 7).then(|| format!("{i:03}")))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn usage_reads_each_pod_where_the_model_places_it() {
    use crate::model::{ContainerInfo, SandboxInfo};
    let mut m = NodeModel::new(1 << 30);
    m.upsert_sandbox(SandboxInfo {
        id: "s1".into(),
        name: "p".into(),
        namespace: "ns".into(),
        uid: "u1".into(),
        cgroup_parent: "/kubepods/burstable/podu1".into(),
        log_directory: "/var/log/pods/ns_p_u1".into(),
        state: Some(SandboxState::Ready),
        ..Default::default()
    });
    for (id, name) in [("c2", "side"), ("c1", "app")] {
        m.upsert_container(ContainerInfo {
            id: id.into(),
            sandbox_id: "s1".into(),
            name: name.into(),
            state: Some(ContainerState::Running),
            ..Default::default()
        });
    }
    let pod = m.pod("s1").unwrap();
    let got = usage_pods(std::slice::from_ref(&pod));
    let container = |id: &str, name: &str| UsageContainer {
        id: id.into(),
        name: name.into(),
    };
    assert_eq!(
        got,
        [UsagePod {
            sandbox_id: "s1".into(),
            uid: "u1".into(),
            namespace: "ns".into(),
            name: "p".into(),
            log_directory: "/var/log/pods/ns_p_u1".into(),
            cgroup: pod.cgroup(),
            containers: vec![container("c1", "app"), container("c2", "side")],
        }]
    );
    assert!(got[0].cgroup.is_some());
}
