//! The gRPC paths criguard knows by name: every CRI method, for metric
//! labels (a bounded set: anything else is `other`), and which of them
//! criguard observes.

use std::collections::HashMap;
use std::sync::LazyLock;

use super::observe::Method;

/// What criguard knows of a gRPC path.
#[derive(Debug, PartialEq, Eq)]
pub struct MethodInfo {
    /// The metric label: `runtime.v1.RuntimeService/Version`, or `other`.
    pub label: &'static str,
    /// The lifecycle method criguard observes at this path, if any.
    pub observed: Option<Method>,
}

const RUNTIME: &[&str] = &[
    "Version",
    "RunPodSandbox",
    "StopPodSandbox",
    "RemovePodSandbox",
    "PodSandboxStatus",
    "ListPodSandbox",
    "CreateContainer",
    "StartContainer",
    "StopContainer",
    "RemoveContainer",
    "ListContainers",
    "ContainerStatus",
    "UpdateContainerResources",
    "ReopenContainerLog",
    "ExecSync",
    "Exec",
    "Attach",
    "PortForward",
    "ContainerStats",
    "ListContainerStats",
    "PodSandboxStats",
    "ListPodSandboxStats",
    "UpdateRuntimeConfig",
    "Status",
    "CheckpointContainer",
    "GetContainerEvents",
    "ListMetricDescriptors",
    "ListPodSandboxMetrics",
    "RuntimeConfig",
    "UpdatePodSandboxResources",
];

const IMAGE: &[&str] = &[
    "ListImages",
    "ImageStatus",
    "PullImage",
    "RemoveImage",
    "ImageFsInfo",
];

static OTHER: MethodInfo = MethodInfo {
    label: "other",
    observed: None,
};

static KNOWN: LazyLock<HashMap<String, MethodInfo>> = LazyLock::new(|| {
    let mut known = HashMap::new();
    for version in ["v1", "v1alpha2"] {
        for (service, methods) in [("RuntimeService", RUNTIME), ("ImageService", IMAGE)] {
            for m in methods {
                let label = format!("runtime.{version}.{service}/{m}");
                let path = format!("/{label}");
                let observed = Method::from_path(&path);
                // Leaked once: a fixed set of about 70 short strings.
                let label: &'static str = Box::leak(label.into_boxed_str());
                known.insert(path, MethodInfo { label, observed });
            }
        }
    }
    known
});

/// What criguard knows of `path`.
pub fn lookup(path: &str) -> &'static MethodInfo {
    KNOWN.get(path).unwrap_or(&OTHER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cri_paths_are_labelled_and_lifecycle_ones_observed() {
        let v = lookup("/runtime.v1.RuntimeService/Version");
        assert_eq!(v.label, "runtime.v1.RuntimeService/Version");
        assert_eq!(v.observed, None);
        let c = lookup("/runtime.v1.RuntimeService/CreateContainer");
        assert_eq!(c.observed, Some(Method::CreateContainer));
        assert_eq!(
            lookup("/runtime.v1alpha2.ImageService/PullImage").label,
            "runtime.v1alpha2.ImageService/PullImage"
        );
    }

    #[test]
    fn anything_else_is_other() {
        for p in [
            "/grpc.health.v1.Health/Check",
            "/runtime.v1.RuntimeService/NoSuchMethod",
            "",
        ] {
            assert_eq!(lookup(p), &OTHER, "{p}");
        }
    }
}
