//! One kubelet-shaped pod in CRI terms, for unit tests: the BestEffort pod
//! `default/p` (UID `uid-1`) with one container `app`, carrying the labels,
//! annotations and `oom_score_adj` the kubelet sends
//! (`pkg/kubelet/kuberuntime/labels.go`, `pkg/kubelet/qos/policy.go`).
//! The integration tests build every other shape with the test kit's pod
//! builder (`test-kit/src/kubelet.rs`).

use std::collections::HashMap;

use k8s_cri::v1 as cri;

use super::keys::{
    ANNOTATION_GRACE, ANNOTATION_RESTART_COUNT, LABEL_CONTAINER_NAME, LABEL_POD_NAME,
    LABEL_POD_NAMESPACE, LABEL_POD_UID,
};
use super::qos::BESTEFFORT_OOM_SCORE_ADJ;

/// The pod's labels.
fn pod_labels() -> HashMap<String, String> {
    HashMap::from([
        (LABEL_POD_NAME.to_owned(), "p".to_owned()),
        (LABEL_POD_NAMESPACE.to_owned(), "default".to_owned()),
        (LABEL_POD_UID.to_owned(), "uid-1".to_owned()),
    ])
}

/// RunPodSandbox's config for the pod, in cgroup `cgroup_parent`.
pub fn sandbox_config(cgroup_parent: &str) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: "p".into(),
            uid: "uid-1".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        labels: pod_labels(),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// CreateContainer's config for the container `app`.
pub fn container_config() -> cri::ContainerConfig {
    let mut labels = pod_labels();
    labels.insert(LABEL_CONTAINER_NAME.to_owned(), "app".to_owned());
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: "app".into(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: "busybox".into(),
            ..Default::default()
        }),
        log_path: "app/0.log".into(),
        labels,
        annotations: HashMap::from([
            (ANNOTATION_RESTART_COUNT.to_owned(), "0".to_owned()),
            (ANNOTATION_GRACE.to_owned(), "30".to_owned()),
        ]),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(cri::LinuxContainerResources {
                cpu_period: 100_000,
                cpu_shares: 2,
                oom_score_adj: BESTEFFORT_OOM_SCORE_ADJ,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}
