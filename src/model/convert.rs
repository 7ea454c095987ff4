//! CRI messages to model inputs, in one place.
//!
//! Two sources feed the model: the kubelet's requests (RunPodSandbox,
//! CreateContainer) as criguard forwards them, and the runtime's status
//! answers, whose verbose `info` holds the original config as Go's
//! `encoding/json` wrote it (proto field names, zero values omitted), so
//! it is read field by field with defaults rather than deserialised whole.

use std::collections::HashMap;

use k8s_cri::v1 as cri;
use serde_json::Value;

use super::{ContainerInfo, ContainerState, SandboxInfo, SandboxState, derive, keys};

/// The annotations the model keeps; the others (e.g. the kubelet's
/// container ports as JSON, or anything a client pads a request with) are
/// never read, and are not copied.
pub const READ_ANNOTATIONS: [&str; 3] = [
    keys::ANNOTATION_GRACE,
    keys::ANNOTATION_CONFIG_SOURCE,
    derive::PRIORITY_ANNOTATION,
];

/// The annotations of `all` the model keeps ([`READ_ANNOTATIONS`]).
pub fn read_annotations(all: &HashMap<String, String>) -> HashMap<String, String> {
    READ_ANNOTATIONS
        .iter()
        .filter_map(|&k| Some((k.to_owned(), all.get(k)?.clone())))
        .collect()
}

/// Model inputs from a RunPodSandbox request and the id the runtime gave.
pub fn sandbox_from_request(id: &str, config: &cri::PodSandboxConfig) -> SandboxInfo {
    let meta = config.metadata.clone().unwrap_or_default();
    SandboxInfo {
        id: id.to_owned(),
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        attempt: meta.attempt,
        annotations: read_annotations(&config.annotations),
        cgroup_parent: config
            .linux
            .as_ref()
            .map(|l| l.cgroup_parent.clone())
            .unwrap_or_default(),
        log_directory: config.log_directory.clone(),
        created_at_ns: 0,
        state: Some(SandboxState::Ready),
    }
}

/// Model inputs from a CreateContainer request and the id the runtime gave.
pub fn container_from_request(
    id: &str,
    sandbox_id: &str,
    config: &cri::ContainerConfig,
) -> ContainerInfo {
    let meta = config.metadata.clone().unwrap_or_default();
    let res = config
        .linux
        .as_ref()
        .and_then(|l| l.resources.clone())
        .unwrap_or_default();
    ContainerInfo {
        id: id.to_owned(),
        sandbox_id: sandbox_id.to_owned(),
        name: meta.name,
        attempt: meta.attempt,
        image: config
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default(),
        annotations: read_annotations(&config.annotations),
        cpu_shares: res.cpu_shares,
        cpu_quota: res.cpu_quota,
        cpu_period: res.cpu_period,
        memory_limit: res.memory_limit_in_bytes,
        oom_score_adj: res.oom_score_adj,
        created_at_ns: 0,
        state: Some(ContainerState::Created),
    }
}

/// The resources of a container the runtime can change in place.
pub fn resources(res: &cri::LinuxContainerResources) -> super::ContainerResources {
    super::ContainerResources {
        cpu_shares: res.cpu_shares,
        cpu_quota: res.cpu_quota,
        cpu_period: res.cpu_period,
        memory_limit: res.memory_limit_in_bytes,
    }
}

/// Sandbox state from CRI's enum value.
pub fn sandbox_state(v: i32) -> SandboxState {
    if v == cri::PodSandboxState::SandboxReady as i32 {
        SandboxState::Ready
    } else {
        SandboxState::NotReady
    }
}

/// Container state from CRI's enum value.
pub fn container_state(v: i32) -> ContainerState {
    match cri::ContainerState::try_from(v) {
        Ok(cri::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(cri::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(cri::ContainerState::ContainerExited) => ContainerState::Exited,
        _ => ContainerState::Unknown,
    }
}

/// Why a verbose status could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InfoError {
    /// No `info` key: the runtime was not asked verbosely or does not say.
    #[error("{kind} {id}: the runtime's verbose status has no \"info\"")]
    Missing {
        /// `sandbox` or `container`.
        kind: &'static str,
        /// Object id.
        id: String,
    },
    /// `info` is not JSON.
    #[error("{kind} {id}: verbose \"info\" is not JSON: {source}")]
    Json {
        /// `sandbox` or `container`.
        kind: &'static str,
        /// Object id.
        id: String,
        /// Parser error.
        source: serde_json::Error,
    },
}

fn info_json(
    kind: &'static str,
    id: &str,
    info: &HashMap<String, String>,
) -> Result<Value, InfoError> {
    let raw = info.get("info").ok_or_else(|| InfoError::Missing {
        kind,
        id: id.to_owned(),
    })?;
    serde_json::from_str(raw).map_err(|source| InfoError::Json {
        kind,
        id: id.to_owned(),
        source,
    })
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn i64_at(v: &Value, path: &[&str]) -> i64 {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

/// Model inputs from a verbose PodSandboxStatus answer.
pub fn sandbox_from_status(resp: &cri::PodSandboxStatusResponse) -> Result<SandboxInfo, InfoError> {
    let status = resp.status.clone().unwrap_or_default();
    let info = info_json("sandbox", &status.id, &resp.info)?;
    let config = info.get("config").cloned().unwrap_or(Value::Null);
    let meta = status.metadata.unwrap_or_default();
    Ok(SandboxInfo {
        id: status.id,
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        attempt: meta.attempt,
        annotations: read_annotations(&status.annotations),
        cgroup_parent: str_at(&config, &["linux", "cgroup_parent"]).to_owned(),
        log_directory: str_at(&config, &["log_directory"]).to_owned(),
        created_at_ns: status.created_at,
        state: Some(sandbox_state(status.state)),
    })
}

/// Model inputs from a verbose ContainerStatus answer.
pub fn container_from_status(
    resp: &cri::ContainerStatusResponse,
) -> Result<ContainerInfo, InfoError> {
    let status = resp.status.clone().unwrap_or_default();
    let info = info_json("container", &status.id, &resp.info)?;
    let config = info.get("config").cloned().unwrap_or(Value::Null);
    let res = |k: &str| i64_at(&config, &["linux", "resources", k]);
    // The resources now, where the runtime reports them (CRI's
    // `ContainerStatus.resources`): an in-place resize changed them since
    // the config was written.
    let now = status
        .resources
        .as_ref()
        .and_then(|r| r.linux.as_ref())
        .map(resources);
    let meta = status.metadata.unwrap_or_default();
    Ok(ContainerInfo {
        id: status.id,
        sandbox_id: str_at(&info, &["sandboxID"]).to_owned(),
        name: meta.name,
        attempt: meta.attempt,
        image: str_at(&config, &["image", "image"]).to_owned(),
        annotations: read_annotations(&status.annotations),
        cpu_shares: now.map_or_else(|| res("cpu_shares"), |r| r.cpu_shares),
        cpu_quota: now.map_or_else(|| res("cpu_quota"), |r| r.cpu_quota),
        cpu_period: now.map_or_else(|| res("cpu_period"), |r| r.cpu_period),
        memory_limit: now.map_or_else(|| res("memory_limit_in_bytes"), |r| r.memory_limit),
        oom_score_adj: res("oom_score_adj"),
        created_at_ns: status.created_at,
        state: Some(container_state(status.state)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_annotations_criguard_reads_are_kept() {
        let annotations = HashMap::from([
            (keys::ANNOTATION_GRACE.to_owned(), "45".to_owned()),
            ("io.kubernetes.container.ports".into(), "[…]".into()),
            ("padding".into(), "x".repeat(1 << 20)),
        ]);
        let config = cri::ContainerConfig {
            annotations: annotations.clone(),
            ..Default::default()
        };
        let c = container_from_request("c1", "sb1", &config);
        assert_eq!(
            c.annotations,
            HashMap::from([(keys::ANNOTATION_GRACE.into(), "45".into())])
        );
        let sandbox = cri::PodSandboxConfig {
            annotations: HashMap::from([
                (keys::ANNOTATION_CONFIG_SOURCE.into(), "file".into()),
                (derive::PRIORITY_ANNOTATION.into(), "7".into()),
                ("other".into(), "y".into()),
            ]),
            ..Default::default()
        };
        let s = sandbox_from_request("sb1", &sandbox);
        let mut kept: Vec<_> = s.annotations.keys().map(String::as_str).collect();
        kept.sort_unstable();
        assert_eq!(
            kept,
            [derive::PRIORITY_ANNOTATION, keys::ANNOTATION_CONFIG_SOURCE]
        );
    }

    #[test]
    fn verbose_container_info_is_read_with_omitted_zero_fields() {
        // As containerd writes it: snake_case proto names, zero values left out.
        let info = r#"{"sandboxID":"sb1","pid":42,"config":{"metadata":{"name":"app"},
            "image":{"image":"busybox"},"linux":{"resources":{"cpu_shares":102,
            "memory_limit_in_bytes":67108864,"oom_score_adj":750}}}}"#;
        let resp = cri::ContainerStatusResponse {
            status: Some(cri::ContainerStatus {
                id: "c1".into(),
                state: cri::ContainerState::ContainerRunning as i32,
                created_at: 7,
                ..Default::default()
            }),
            info: HashMap::from([("info".into(), info.into())]),
        };
        let c = container_from_status(&resp).unwrap();
        assert_eq!(
            (c.sandbox_id.as_str(), c.image.as_str()),
            ("sb1", "busybox")
        );
        assert_eq!(
            (c.cpu_shares, c.cpu_quota, c.memory_limit, c.oom_score_adj),
            (102, 0, 64 << 20, 750)
        );
        assert_eq!(
            (c.created_at_ns, c.state),
            (7, Some(ContainerState::Running))
        );
    }

    #[test]
    fn missing_or_broken_info_names_the_object() {
        let mut resp = cri::PodSandboxStatusResponse {
            status: Some(cri::PodSandboxStatus {
                id: "sb9".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(
            sandbox_from_status(&resp)
                .unwrap_err()
                .to_string()
                .contains("sb9")
        );
        resp.info.insert("info".into(), "{not json".into());
        assert!(
            sandbox_from_status(&resp)
                .unwrap_err()
                .to_string()
                .contains("sb9")
        );
    }
}
