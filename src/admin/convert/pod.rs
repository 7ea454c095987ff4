//! Pods and containers, and the enums they carry.

use std::collections::BTreeMap;

use super::{ConvertError, unknown};
use crate::admin::pb;
use crate::model::qos::QosClass;
use crate::model::{Container, ContainerState, Pod, PodRequests, PodSource, SandboxState};

pub(super) fn qos_to(q: QosClass) -> pb::QosClass {
    match q {
        QosClass::Guaranteed => pb::QosClass::Guaranteed,
        QosClass::Burstable => pb::QosClass::Burstable,
        QosClass::BestEffort => pb::QosClass::BestEffort,
    }
}

pub(super) fn qos_from(v: i32) -> Result<QosClass, ConvertError> {
    match pb::QosClass::try_from(v) {
        Ok(pb::QosClass::Guaranteed) => Ok(QosClass::Guaranteed),
        Ok(pb::QosClass::Burstable) => Ok(QosClass::Burstable),
        Ok(pb::QosClass::BestEffort) => Ok(QosClass::BestEffort),
        _ => Err(unknown("Pod", "qos", v)),
    }
}

fn sandbox_state_to(s: SandboxState) -> pb::SandboxState {
    match s {
        SandboxState::Ready => pb::SandboxState::Ready,
        SandboxState::NotReady => pb::SandboxState::NotReady,
    }
}

fn sandbox_state_from(v: i32) -> Result<SandboxState, ConvertError> {
    match pb::SandboxState::try_from(v) {
        Ok(pb::SandboxState::Ready) => Ok(SandboxState::Ready),
        Ok(pb::SandboxState::NotReady) => Ok(SandboxState::NotReady),
        _ => Err(unknown("Pod", "state", v)),
    }
}

fn source_to(s: PodSource) -> pb::PodSource {
    match s {
        PodSource::Api => pb::PodSource::Api,
        PodSource::Inferred => pb::PodSource::Inferred,
    }
}

fn source_from(v: i32) -> Result<PodSource, ConvertError> {
    match pb::PodSource::try_from(v) {
        Ok(pb::PodSource::Api) => Ok(PodSource::Api),
        Ok(pb::PodSource::Inferred) => Ok(PodSource::Inferred),
        _ => Err(unknown("Pod", "source", v)),
    }
}

fn container_state_to(s: ContainerState) -> pb::ContainerState {
    match s {
        ContainerState::Created => pb::ContainerState::Created,
        ContainerState::Running => pb::ContainerState::Running,
        ContainerState::Exited => pb::ContainerState::Exited,
        ContainerState::Unknown => pb::ContainerState::Unknown,
    }
}

fn container_state_from(v: i32) -> Result<ContainerState, ConvertError> {
    match pb::ContainerState::try_from(v) {
        Ok(pb::ContainerState::Created) => Ok(ContainerState::Created),
        Ok(pb::ContainerState::Running) => Ok(ContainerState::Running),
        Ok(pb::ContainerState::Exited) => Ok(ContainerState::Exited),
        Ok(pb::ContainerState::Unknown) => Ok(ContainerState::Unknown),
        _ => Err(unknown("Container", "state", v)),
    }
}

impl From<&Container> for pb::Container {
    fn from(c: &Container) -> Self {
        Self {
            id: c.id.clone(),
            name: c.name.clone(),
            attempt: c.attempt,
            image: c.image.clone(),
            cgroup_path: c.cgroup_path.clone(),
            cpu_shares: c.cpu_shares,
            cpu_quota: c.cpu_quota,
            cpu_period: c.cpu_period,
            memory_limit: c.memory_limit,
            oom_score_adj: c.oom_score_adj,
            memory_request: c.memory_request,
            state: container_state_to(c.state).into(),
            created_at_ns: c.created_at_ns,
            api_oom_score_adj: c.api_oom_score_adj,
            ephemeral_storage_request: c.ephemeral_storage_request,
        }
    }
}

impl TryFrom<pb::Container> for Container {
    type Error = ConvertError;
    fn try_from(c: pb::Container) -> Result<Self, ConvertError> {
        Ok(Self {
            state: container_state_from(c.state)?,
            id: c.id,
            name: c.name,
            attempt: c.attempt,
            image: c.image,
            cgroup_path: c.cgroup_path,
            cpu_shares: c.cpu_shares,
            cpu_quota: c.cpu_quota,
            cpu_period: c.cpu_period,
            memory_limit: c.memory_limit,
            oom_score_adj: c.oom_score_adj,
            memory_request: c.memory_request,
            api_oom_score_adj: c.api_oom_score_adj,
            ephemeral_storage_request: c.ephemeral_storage_request,
            created_at_ns: c.created_at_ns,
        })
    }
}

impl From<&Pod> for pb::Pod {
    fn from(p: &Pod) -> Self {
        Self {
            uid: p.uid.clone(),
            name: p.name.clone(),
            namespace: p.namespace.clone(),
            sandbox_id: p.sandbox_id.clone(),
            attempt: p.attempt,
            cgroup_parent: p.cgroup_parent.clone(),
            log_directory: p.log_directory.clone(),
            qos: qos_to(p.qos).into(),
            priority: p.priority,
            static_pod: p.static_pod,
            critical: p.critical,
            grace_period_s: p.grace_period_s,
            state: sandbox_state_to(p.state).into(),
            created_at_ns: p.created_at_ns,
            containers: p.containers.values().map(Into::into).collect(),
            source: source_to(p.source).into(),
            memory_request: p.requests.memory,
            ephemeral_storage_request: p.requests.ephemeral_storage,
            pod_level_memory_request: p.requests.pod_level_memory,
        }
    }
}

impl TryFrom<pb::Pod> for Pod {
    type Error = ConvertError;
    fn try_from(p: pb::Pod) -> Result<Self, ConvertError> {
        let containers = p
            .containers
            .into_iter()
            .map(|c| Container::try_from(c).map(|c| (c.id.clone(), c)))
            .collect::<Result<BTreeMap<_, _>, _>>()?;
        Ok(Self {
            qos: qos_from(p.qos)?,
            state: sandbox_state_from(p.state)?,
            uid: p.uid,
            name: p.name,
            namespace: p.namespace,
            sandbox_id: p.sandbox_id,
            attempt: p.attempt,
            cgroup_parent: p.cgroup_parent,
            log_directory: p.log_directory,
            priority: p.priority,
            static_pod: p.static_pod,
            critical: p.critical,
            grace_period_s: p.grace_period_s,
            created_at_ns: p.created_at_ns,
            containers,
            source: source_from(p.source)?,
            requests: PodRequests {
                memory: p.memory_request,
                ephemeral_storage: p.ephemeral_storage_request,
                pod_level_memory: p.pod_level_memory_request,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_pod() -> Pod {
        let c = Container {
            id: "c1".into(),
            name: "app".into(),
            attempt: 1,
            image: "docker.io/library/busybox:1.36".into(),
            cgroup_path: "/kubepods/burstable/podu1/c1".into(),
            cpu_shares: 102,
            cpu_quota: 50_000,
            cpu_period: 100_000,
            memory_limit: 512 << 20,
            oom_score_adj: 968,
            memory_request: 256 << 20,
            api_oom_score_adj: Some(968),
            ephemeral_storage_request: 1 << 30,
            state: ContainerState::Running,
            created_at_ns: 1_700_000_000_000_000_000,
        };
        Pod {
            uid: "u1".into(),
            name: "web".into(),
            namespace: "default".into(),
            sandbox_id: "sb1".into(),
            attempt: 0,
            cgroup_parent: "/kubepods/burstable/podu1".into(),
            log_directory: "/var/log/pods/default_web_u1".into(),
            qos: QosClass::Burstable,
            priority: 100,
            static_pod: false,
            critical: false,
            grace_period_s: Some(30),
            state: SandboxState::Ready,
            created_at_ns: 1_700_000_000_000_000_000,
            containers: [(c.id.clone(), c)].into(),
            source: PodSource::Api,
            requests: PodRequests {
                memory: 266 << 20,
                ephemeral_storage: 1 << 30,
                pod_level_memory: None,
            },
        }
    }

    #[test]
    fn a_pod_survives_the_round_trip() {
        let pod = sample_pod();
        assert_eq!(Pod::try_from(pb::Pod::from(&pod)).unwrap(), pod);
        let mut none = pod.clone();
        none.grace_period_s = None;
        assert_eq!(Pod::try_from(pb::Pod::from(&none)).unwrap(), none);
    }

    #[test]
    fn an_unknown_enum_value_names_message_field_and_value() {
        let mut msg = pb::Pod::from(&sample_pod());
        msg.qos = 42;
        let e = Pod::try_from(msg).unwrap_err();
        assert_eq!(e.to_string(), "Pod.qos: unknown value 42");
        let mut msg = pb::Pod::from(&sample_pod());
        msg.containers[0].state = 0;
        let e = Pod::try_from(msg).unwrap_err();
        assert_eq!(e.to_string(), "Container.state: unknown value 0");
    }
}
