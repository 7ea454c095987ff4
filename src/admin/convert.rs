//! Between criguard's types and the admin API's messages: the only place
//! that knows both. Domain → message cannot fail; message → domain fails
//! on an enum value this version does not know (a newer criguard), naming
//! the message, the field and the value.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::pb;
use crate::config::Signal;
use crate::model::{Container, ContainerState, Pod, QosClass, SandboxState};
use crate::policy::thresholds::Condition;
use crate::reclaim::evict::{Eviction, NodeStatus};
use crate::reclaim::rank::RankEntry;
use crate::signals::disk::DiskUsage;
use crate::signals::node::FsStats;
use crate::signals::unix_ms;
use crate::signals::usage::{ContainerUsage, NodeUsage, PodUsage};

/// A message this version cannot turn into criguard's types.
#[derive(Debug, thiserror::Error)]
#[error("{message}.{field}: unknown value {value}")]
pub struct ConvertError {
    /// The message, e.g. `Pod`.
    pub message: &'static str,
    /// The field, e.g. `qos`.
    pub field: &'static str,
    /// The value received.
    pub value: String,
}

fn unknown(message: &'static str, field: &'static str, value: impl ToString) -> ConvertError {
    ConvertError {
        message,
        field,
        value: value.to_string(),
    }
}

fn qos_to(q: QosClass) -> pb::QosClass {
    match q {
        QosClass::Guaranteed => pb::QosClass::Guaranteed,
        QosClass::Burstable => pb::QosClass::Burstable,
        QosClass::BestEffort => pb::QosClass::BestEffort,
    }
}

fn qos_from(v: i32) -> Result<QosClass, ConvertError> {
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
        })
    }
}

impl From<&Eviction> for pb::Eviction {
    fn from(e: &Eviction) -> Self {
        Self {
            at_unix_ms: e.at_unix_ms,
            pod: e.pod.clone(),
            uid: e.uid.clone(),
            sandbox_id: e.sandbox_id.clone(),
            signal: e.signal.clone(),
            threshold: e.threshold.clone(),
            available: e.available,
            usage: e.usage,
            request: e.request,
            grace_s: e.grace_s,
            message: e.message.clone(),
            dry_run: e.dry_run,
        }
    }
}

impl From<pb::Eviction> for Eviction {
    fn from(e: pb::Eviction) -> Self {
        Self {
            at_unix_ms: e.at_unix_ms,
            pod: e.pod,
            uid: e.uid,
            sandbox_id: e.sandbox_id,
            signal: e.signal,
            threshold: e.threshold,
            available: e.available,
            usage: e.usage,
            request: e.request,
            grace_s: e.grace_s,
            message: e.message,
            dry_run: e.dry_run,
        }
    }
}

impl From<&RankEntry> for pb::RankEntry {
    fn from(e: &RankEntry) -> Self {
        Self {
            signal: e.signal.clone(),
            rank: e.rank as u64,
            pod: e.pod.clone(),
            qos: e.qos.clone(),
            priority: e.priority,
            usage: e.usage,
            request: e.request,
        }
    }
}

impl From<pb::RankEntry> for RankEntry {
    fn from(e: pb::RankEntry) -> Self {
        Self {
            signal: e.signal,
            rank: e.rank as usize,
            pod: e.pod,
            qos: e.qos,
            priority: e.priority,
            usage: e.usage,
            request: e.request,
        }
    }
}

impl From<DiskUsage> for pb::DiskUsage {
    fn from(d: DiskUsage) -> Self {
        Self {
            bytes: d.bytes,
            inodes: d.inodes,
        }
    }
}

impl From<pb::DiskUsage> for DiskUsage {
    fn from(d: pb::DiskUsage) -> Self {
        Self {
            bytes: d.bytes,
            inodes: d.inodes,
        }
    }
}

impl From<FsStats> for pb::FsStats {
    fn from(f: FsStats) -> Self {
        Self {
            available: f.available,
            capacity: f.capacity,
            inodes_free: f.inodes_free,
            inodes: f.inodes,
        }
    }
}

impl From<pb::FsStats> for FsStats {
    fn from(f: pb::FsStats) -> Self {
        Self {
            available: f.available,
            capacity: f.capacity,
            inodes_free: f.inodes_free,
            inodes: f.inodes,
        }
    }
}

/// An absent required usage reads as nothing counted.
fn disk(d: Option<pb::DiskUsage>) -> DiskUsage {
    d.map(Into::into).unwrap_or_default()
}

impl From<&PodUsage> for pb::PodUsage {
    fn from(p: &PodUsage) -> Self {
        Self {
            sandbox_id: p.sandbox_id.clone(),
            uid: p.uid.clone(),
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            rootfs: Some(p.rootfs.into()),
            logs: Some(p.logs.into()),
            volumes: Some(p.volumes.into()),
            empty_dirs: p
                .empty_dirs
                .iter()
                .map(|(k, v)| (k.clone(), (*v).into()))
                .collect(),
            processes: p.processes,
            containers: p
                .containers
                .iter()
                .map(|c| pb::ContainerUsage {
                    id: c.id.clone(),
                    name: c.name.clone(),
                    rootfs: c.rootfs.map(Into::into),
                    logs: c.logs.map(Into::into),
                })
                .collect(),
            errors: p.errors.clone(),
        }
    }
}

impl From<pb::PodUsage> for PodUsage {
    fn from(p: pb::PodUsage) -> Self {
        Self {
            sandbox_id: p.sandbox_id,
            uid: p.uid,
            namespace: p.namespace,
            name: p.name,
            rootfs: disk(p.rootfs),
            logs: disk(p.logs),
            volumes: disk(p.volumes),
            empty_dirs: p
                .empty_dirs
                .into_iter()
                .map(|(k, v)| (k, v.into()))
                .collect(),
            processes: p.processes,
            containers: p
                .containers
                .into_iter()
                .map(|c| ContainerUsage {
                    id: c.id,
                    name: c.name,
                    rootfs: c.rootfs.map(Into::into),
                    logs: c.logs.map(Into::into),
                })
                .collect(),
            errors: p.errors,
        }
    }
}

impl From<&NodeUsage> for pb::UsageResponse {
    fn from(u: &NodeUsage) -> Self {
        Self {
            nodefs: u.nodefs.map(Into::into),
            imagefs: u.imagefs.map(Into::into),
            dedicated_imagefs: u.dedicated_imagefs,
            images: u.images.map(Into::into),
            pods: u.pods.iter().map(Into::into).collect(),
            read_us: u.read_us,
        }
    }
}

impl From<pb::UsageResponse> for NodeUsage {
    fn from(u: pb::UsageResponse) -> Self {
        Self {
            nodefs: u.nodefs.map(Into::into),
            imagefs: u.imagefs.map(Into::into),
            dedicated_imagefs: u.dedicated_imagefs,
            images: u.images.map(Into::into),
            pods: u.pods.into_iter().map(Into::into).collect(),
            read_us: u.read_us,
        }
    }
}

/// One signal as last observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observed {
    /// Available amount (bytes, inodes or pids).
    pub available: i64,
    /// The signal's capacity.
    pub capacity: u64,
}

/// Node conditions and the last observations, as `Conditions` answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionsReport {
    /// The conditions that hold now.
    pub conditions: BTreeSet<Condition>,
    /// Each signal read in the last round.
    pub observations: BTreeMap<Signal, Observed>,
    /// When they were read (None: no round yet).
    pub observed_at_unix_ms: Option<u64>,
}

fn condition_to(c: Condition) -> pb::NodeCondition {
    match c {
        Condition::MemoryPressure => pb::NodeCondition::MemoryPressure,
        Condition::DiskPressure => pb::NodeCondition::DiskPressure,
        Condition::PIDPressure => pb::NodeCondition::PidPressure,
    }
}

fn condition_from(v: i32) -> Result<Condition, ConvertError> {
    match pb::NodeCondition::try_from(v) {
        Ok(pb::NodeCondition::MemoryPressure) => Ok(Condition::MemoryPressure),
        Ok(pb::NodeCondition::DiskPressure) => Ok(Condition::DiskPressure),
        Ok(pb::NodeCondition::PidPressure) => Ok(Condition::PIDPressure),
        _ => Err(unknown("ConditionsResponse", "conditions", v)),
    }
}

impl From<&NodeStatus> for pb::ConditionsResponse {
    fn from(st: &NodeStatus) -> Self {
        Self {
            conditions: st
                .conditions
                .iter()
                .map(|c| condition_to(*c).into())
                .collect(),
            observations: st
                .observations
                .iter()
                .flat_map(|o| &o.signals)
                .map(|(s, o)| pb::Observation {
                    signal: s.name().to_owned(),
                    available: o.available,
                    capacity: o.capacity,
                })
                .collect(),
            observed_at_unix_ms: st.observations.as_ref().map(|o| unix_ms(o.at)),
        }
    }
}

impl TryFrom<pb::ConditionsResponse> for ConditionsReport {
    type Error = ConvertError;
    fn try_from(r: pb::ConditionsResponse) -> Result<Self, ConvertError> {
        let conditions = r
            .conditions
            .into_iter()
            .map(condition_from)
            .collect::<Result<_, _>>()?;
        let observations = r
            .observations
            .into_iter()
            .map(|o| {
                let signal = Signal::parse(&o.signal)
                    .ok_or_else(|| unknown("Observation", "signal", &o.signal))?;
                let observed = Observed {
                    available: o.available,
                    capacity: o.capacity,
                };
                Ok((signal, observed))
            })
            .collect::<Result<_, ConvertError>>()?;
        Ok(Self {
            conditions,
            observations,
            observed_at_unix_ms: r.observed_at_unix_ms,
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

    #[test]
    fn usage_evictions_and_ranks_survive_the_round_trip() {
        let d = DiskUsage {
            bytes: 4096,
            inodes: 3,
        };
        let usage = NodeUsage {
            nodefs: Some(FsStats {
                available: 1,
                capacity: 2,
                inodes_free: 3,
                inodes: 4,
            }),
            imagefs: None,
            dedicated_imagefs: true,
            images: Some(d),
            pods: vec![PodUsage {
                sandbox_id: "sb".into(),
                uid: "u".into(),
                namespace: "ns".into(),
                name: "p".into(),
                rootfs: d,
                logs: DiskUsage::default(),
                volumes: d,
                empty_dirs: [("cache".to_owned(), d)].into(),
                processes: Some(7),
                containers: vec![ContainerUsage {
                    id: "c".into(),
                    name: "app".into(),
                    rootfs: Some(d),
                    logs: None,
                }],
                errors: vec!["/x: gone".into()],
            }],
            read_us: 99,
        };
        assert_eq!(NodeUsage::from(pb::UsageResponse::from(&usage)), usage);
        let e = Eviction {
            at_unix_ms: 1,
            pod: "ns/p".into(),
            uid: "u".into(),
            sandbox_id: "sb".into(),
            signal: "memory.available".into(),
            threshold: "memory.available<100Mi".into(),
            available: -5,
            usage: 10,
            request: 0,
            grace_s: 0,
            message: "The node was low on resource: memory. ".into(),
            dry_run: true,
        };
        assert_eq!(Eviction::from(pb::Eviction::from(&e)), e);
        let r = RankEntry {
            signal: "pid.available".into(),
            rank: 2,
            pod: "ns/p".into(),
            qos: "BestEffort".into(),
            priority: -3,
            usage: None,
            request: 0,
        };
        assert_eq!(RankEntry::from(pb::RankEntry::from(&r)), r);
    }

    #[test]
    fn conditions_carry_typed_conditions_and_signals() {
        let mut st = NodeStatus {
            conditions: [Condition::DiskPressure, Condition::PIDPressure].into(),
            ..Default::default()
        };
        let mut obs = crate::policy::thresholds::Observations::new(std::time::Instant::now());
        obs.signals.insert(
            Signal::NodefsInodesFree,
            crate::policy::thresholds::Observation {
                available: 12,
                capacity: 100,
            },
        );
        st.observations = Some(obs);
        let r = ConditionsReport::try_from(pb::ConditionsResponse::from(&st)).unwrap();
        assert_eq!(r.conditions, st.conditions);
        assert_eq!(
            r.observations[&Signal::NodefsInodesFree],
            Observed {
                available: 12,
                capacity: 100
            }
        );
        assert!(r.observed_at_unix_ms.is_some());
        let bad = pb::ConditionsResponse {
            observations: vec![pb::Observation {
                signal: "memory.free".into(),
                available: 0,
                capacity: 0,
            }],
            ..Default::default()
        };
        let e = ConditionsReport::try_from(bad).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Observation.signal: unknown value memory.free"
        );
    }
}
