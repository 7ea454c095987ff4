//! CRI requests shaped the way the kubelet shapes them.
//!
//! criguard learns everything about a pod from what the kubelet sends, so the
//! demo, the integration tests and the benchmarks must send exactly that:
//! the kubelet's labels and annotations, its cgroup parents, its resources and
//! its `oom_score_adj`. This module builds those requests from a small pod
//! description. Sources: kubelet `pkg/kubelet/kuberuntime/kuberuntime_sandbox.go`
//! (generatePodSandboxConfig), `kuberuntime_container.go`
//! (generateContainerConfig), `labels.go`, `pkg/kubelet/cm/helpers_linux.go`
//! (cgroup parents) and `pkg/kubelet/qos/policy.go` (`oom_score_adj`).
//!
//! Not part of criguard itself: the test kit is a dev-dependency of criguard,
//! for its tests, benches and examples. The label and annotation names that
//! criguard reads live in [`criguard::model::keys`] and are re-exported here.

use std::collections::HashMap;

use k8s_cri::v1 as cri;

pub use criguard::model::keys::{
    ANNOTATION_CONFIG_SOURCE, ANNOTATION_GRACE, ANNOTATION_RESTART_COUNT, LABEL_CONTAINER_NAME,
    LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID,
};

/// The kubelet's CPU CFS period in microseconds.
pub const CPU_PERIOD_US: i64 = 100_000;

pub use criguard::model::qos::QosClass;

/// Which cgroup driver names the kubelet's cgroups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupDriver {
    /// `/kubepods/burstable/pod<uid>`.
    Cgroupfs,
    /// `kubepods-burstable-pod<uid_with_underscores>.slice`.
    Systemd,
}

/// One container of a [`PodSpec`].
#[derive(Clone, Debug, Default)]
pub struct ContainerSpec {
    /// Container name.
    pub name: String,
    /// Image reference.
    pub image: String,
    /// Command (entrypoint override).
    pub command: Vec<String>,
    /// Memory request in bytes (0: none).
    pub memory_request: i64,
    /// Memory limit in bytes (0: none).
    pub memory_limit: i64,
    /// CPU request in millicores (0: none).
    pub cpu_request_milli: i64,
    /// CPU limit in millicores (0: none).
    pub cpu_limit_milli: i64,
    /// cgroup v2 files set as CRI's `unified` resources, as the kubelet sets
    /// `memory.swap.max` for its swap behaviour (empty: none).
    pub unified: std::collections::BTreeMap<String, String>,
}

/// A pod as the kubelet would run it.
#[derive(Clone, Debug)]
pub struct PodSpec {
    /// Pod name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Pod UID.
    pub uid: String,
    /// Sandbox attempt.
    pub attempt: u32,
    /// Containers.
    pub containers: Vec<ContainerSpec>,
    /// Cgroup root under which the kubelet puts pods (`/kubepods` by default).
    pub cgroup_root: String,
    /// Cgroup driver.
    pub driver: CgroupDriver,
    /// Directory under which pod log directories are made.
    pub log_root: String,
    /// Pod annotations (priority, config source, ...).
    pub annotations: HashMap<String, String>,
    /// Termination grace period in seconds.
    pub grace_period_s: i64,
    /// Node memory capacity in bytes, for the Burstable `oom_score_adj`.
    pub node_memory: i64,
}

impl PodSpec {
    /// A pod with kubelet defaults: namespace `default`, cgroupfs driver under
    /// `/kubepods`, 30 s grace, no containers yet.
    pub fn new(name: &str, uid: &str) -> Self {
        Self {
            name: name.to_owned(),
            namespace: "default".to_owned(),
            uid: uid.to_owned(),
            attempt: 0,
            containers: Vec::new(),
            cgroup_root: "/kubepods".to_owned(),
            driver: CgroupDriver::Cgroupfs,
            log_root: "/var/log/pods".to_owned(),
            annotations: HashMap::new(),
            grace_period_s: 30,
            node_memory: 8 << 30,
        }
    }

    /// Adds a container.
    pub fn container(mut self, c: ContainerSpec) -> Self {
        self.containers.push(c);
        self
    }

    /// The QoS class by the kubelet's rule (`pkg/apis/core/v1/helper/qos`):
    /// BestEffort when nothing is set; Guaranteed when every container has
    /// CPU and memory limits and requests equal to them; else Burstable.
    pub fn qos(&self) -> QosClass {
        let any = self.containers.iter().any(|c| {
            c.memory_request > 0
                || c.memory_limit > 0
                || c.cpu_request_milli > 0
                || c.cpu_limit_milli > 0
        });
        if !any {
            return QosClass::BestEffort;
        }
        let guaranteed = self.containers.iter().all(|c| {
            c.memory_limit > 0
                && c.cpu_limit_milli > 0
                && (c.memory_request == 0 || c.memory_request == c.memory_limit)
                && (c.cpu_request_milli == 0 || c.cpu_request_milli == c.cpu_limit_milli)
        });
        if guaranteed {
            QosClass::Guaranteed
        } else {
            QosClass::Burstable
        }
    }

    /// The pod's cgroup parent as the kubelet passes it in
    /// `LinuxPodSandboxConfig.cgroup_parent`.
    pub fn cgroup_parent(&self) -> String {
        let qos = match self.qos() {
            QosClass::Guaranteed => None,
            QosClass::Burstable => Some("burstable"),
            QosClass::BestEffort => Some("besteffort"),
        };
        match self.driver {
            CgroupDriver::Cgroupfs => match qos {
                Some(q) => format!("{}/{q}/pod{}", self.cgroup_root, self.uid),
                None => format!("{}/pod{}", self.cgroup_root, self.uid),
            },
            CgroupDriver::Systemd => {
                let uid = self.uid.replace('-', "_");
                match qos {
                    Some(q) => format!("kubepods-{q}-pod{uid}.slice"),
                    None => format!("kubepods-pod{uid}.slice"),
                }
            }
        }
    }

    /// The pod's log directory: `<log_root>/<namespace>_<name>_<uid>`.
    pub fn log_directory(&self) -> String {
        format!(
            "{}/{}_{}_{}",
            self.log_root, self.namespace, self.name, self.uid
        )
    }

    fn pod_labels(&self) -> HashMap<String, String> {
        HashMap::from([
            (LABEL_POD_NAME.to_owned(), self.name.clone()),
            (LABEL_POD_NAMESPACE.to_owned(), self.namespace.clone()),
            (LABEL_POD_UID.to_owned(), self.uid.clone()),
        ])
    }

    /// The `PodSandboxConfig` of RunPodSandbox, with host networking (so no
    /// CNI is needed and, as CRI requires for host networking, no hostname).
    pub fn sandbox_config(&self) -> cri::PodSandboxConfig {
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: self.name.clone(),
                uid: self.uid.clone(),
                namespace: self.namespace.clone(),
                attempt: self.attempt,
            }),
            hostname: String::new(),
            log_directory: self.log_directory(),
            labels: self.pod_labels(),
            annotations: self.annotations.clone(),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: self.cgroup_parent(),
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        network: cri::NamespaceMode::Node as i32,
                        pid: cri::NamespaceMode::Pod as i32,
                        ipc: cri::NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The kubelet's `oom_score_adj` for a container of this pod
    /// (`pkg/kubelet/qos/policy.go`, GetContainerOOMScoreAdjust). Node-critical
    /// pods (static with priority class system-node-critical, which CRI does
    /// not carry) are modelled by the annotation `criguard.io/test-node-critical`
    /// on a static pod.
    pub fn oom_score_adj(&self, c: &ContainerSpec) -> i64 {
        let source = self
            .annotations
            .get(ANNOTATION_CONFIG_SOURCE)
            .map(String::as_str);
        let node_critical = criguard::model::derive::is_static(source)
            && self
                .annotations
                .contains_key("criguard.io/test-node-critical");
        criguard::model::derive::kubelet_oom_score_adj(
            self.qos(),
            node_critical,
            c.memory_request,
            self.node_memory,
        )
    }

    /// The `ContainerConfig` of CreateContainer for container `index`.
    pub fn container_config(&self, index: usize) -> cri::ContainerConfig {
        let c = &self.containers[index];
        let mut labels = self.pod_labels();
        labels.insert(LABEL_CONTAINER_NAME.to_owned(), c.name.clone());
        let annotations = HashMap::from([
            (ANNOTATION_RESTART_COUNT.to_owned(), "0".to_owned()),
            (ANNOTATION_GRACE.to_owned(), self.grace_period_s.to_string()),
            (
                "io.kubernetes.container.terminationMessagePath".to_owned(),
                "/dev/termination-log".to_owned(),
            ),
        ]);
        let cpu_request = if c.cpu_request_milli > 0 {
            c.cpu_request_milli
        } else {
            c.cpu_limit_milli
        };
        // kubelet: shares = milli * 1024 / 1000, at least 2.
        let cpu_shares = (cpu_request * 1024 / 1000).max(2);
        let cpu_quota = if c.cpu_limit_milli > 0 {
            c.cpu_limit_milli * CPU_PERIOD_US / 1000
        } else {
            0
        };
        cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: c.name.clone(),
                attempt: 0,
            }),
            // The kubelet names the image as the pod spec wrote it too
            // (CRI-O refuses a container without it).
            image: Some(cri::ImageSpec {
                image: c.image.clone(),
                user_specified_image: c.image.clone(),
                ..Default::default()
            }),
            command: c.command.clone(),
            log_path: format!("{}/0.log", c.name),
            labels,
            annotations,
            linux: Some(cri::LinuxContainerConfig {
                resources: Some(cri::LinuxContainerResources {
                    cpu_period: CPU_PERIOD_US,
                    cpu_quota,
                    cpu_shares,
                    memory_limit_in_bytes: c.memory_limit,
                    oom_score_adj: self.oom_score_adj(c),
                    unified: c.unified.clone().into_iter().collect(),
                    ..Default::default()
                }),
                security_context: Some(cri::LinuxContainerSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        network: cri::NamespaceMode::Node as i32,
                        pid: cri::NamespaceMode::Container as i32,
                        ipc: cri::NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(mem_req: i64, mem_lim: i64, cpu_req: i64, cpu_lim: i64) -> ContainerSpec {
        ContainerSpec {
            name: "c".into(),
            image: "busybox".into(),
            memory_request: mem_req,
            memory_limit: mem_lim,
            cpu_request_milli: cpu_req,
            cpu_limit_milli: cpu_lim,
            ..Default::default()
        }
    }

    #[test]
    fn qos_and_cgroup_parent_follow_the_kubelet() {
        let be = PodSpec::new("a", "u-1").container(c(0, 0, 0, 0));
        assert_eq!(be.qos(), QosClass::BestEffort);
        assert_eq!(be.cgroup_parent(), "/kubepods/besteffort/podu-1");
        let bu = PodSpec::new("a", "u-1").container(c(64 << 20, 0, 0, 0));
        assert_eq!(bu.qos(), QosClass::Burstable);
        assert_eq!(bu.cgroup_parent(), "/kubepods/burstable/podu-1");
        let mut gu = PodSpec::new("a", "u-1").container(c(0, 64 << 20, 0, 500));
        assert_eq!(gu.qos(), QosClass::Guaranteed);
        assert_eq!(gu.cgroup_parent(), "/kubepods/podu-1");
        gu.driver = CgroupDriver::Systemd;
        assert_eq!(gu.cgroup_parent(), "kubepods-podu_1.slice");
    }

    #[test]
    fn burstable_oom_score_adj_is_clamped_like_the_kubelet() {
        let mut p = PodSpec::new("a", "u").container(c(1 << 30, 0, 0, 0));
        p.node_memory = 4 << 30;
        assert_eq!(p.oom_score_adj(&p.containers[0]), 750);
        p.containers[0].memory_request = 4 << 30;
        assert_eq!(p.oom_score_adj(&p.containers[0]), 3);
        p.containers[0].memory_request = 1;
        assert_eq!(p.oom_score_adj(&p.containers[0]), 999);
    }
}
