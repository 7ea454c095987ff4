//! The labels and annotations the kubelet puts on the CRI objects it
//! creates, by the names criguard reads them with
//! (`pkg/kubelet/kuberuntime/labels.go`, `pkg/kubelet/types/pod_update.go`).

/// Pod label: pod name.
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
/// Pod label: pod namespace.
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// Pod label: pod UID.
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
/// Container label: container name.
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Container annotation: the pod's termination grace period in seconds.
pub const ANNOTATION_GRACE: &str = "io.kubernetes.pod.terminationGracePeriod";
/// Container annotation: restart count.
pub const ANNOTATION_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
/// Pod annotation: where the kubelet learned of the pod (`file` for static
/// pods, `api` for the API server's).
pub const ANNOTATION_CONFIG_SOURCE: &str = "kubernetes.io/config.source";
