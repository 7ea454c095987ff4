//! The kubelet's local-storage eviction (`pkg/kubelet/eviction/eviction_manager.go`,
//! `localStorageEviction`): a pod is evicted at once, whatever the node's
//! pressure, when an emptyDir uses more than its `sizeLimit`, when the pod
//! uses more ephemeral storage than its containers' limits together, or
//! when a container's logs (and writable layer, without a dedicated
//! imagefs) exceed its own `ephemeral-storage` limit; checked in that
//! order, the first found is the reason. Pure: usage comes in as plain data.

use std::time::Duration;

use crate::model::spec::{ApiPod, ContainerKind, Resource, aggregate};
use crate::quantity::format_bytes;

/// The kubelet's grace period for these evictions
/// (`immediateEvictionGracePeriodSeconds`).
pub const GRACE_S: i64 = 1;

/// What a pod uses of local storage, in bytes, as read now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StorageUse {
    /// Each emptyDir by volume name.
    pub empty_dirs: Vec<(String, u64)>,
    /// Each container by name: its logs and its writable layer.
    pub containers: Vec<(String, u64, u64)>,
    /// The pod's ephemeral storage: writable layers, logs and emptyDirs.
    pub total: u64,
}

/// Which limit a pod went over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exceeded {
    /// An emptyDir over its `sizeLimit`.
    EmptyDir {
        /// Volume name.
        volume: String,
        /// The limit.
        limit: i64,
    },
    /// The pod over its containers' limits together.
    Pod {
        /// The sum of the limits.
        limit: i64,
    },
    /// A container over its own limit.
    Container {
        /// Container name.
        name: String,
        /// The limit.
        limit: i64,
    },
}

impl Exceeded {
    /// The kubelet's metric label for it (`signalEmptyDirFsLimit`,
    /// `signalEphemeralPodFsLimit`, `signalEphemeralContainerFsLimit`),
    /// recorded as the eviction's signal.
    pub fn signal(&self) -> &'static str {
        match self {
            Exceeded::EmptyDir { .. } => "emptydirfs.limit",
            Exceeded::Pod { .. } => "ephemeralpodfs.limit",
            Exceeded::Container { .. } => "ephemeralcontainerfs.limit",
        }
    }

    /// The limit, in bytes.
    pub fn limit(&self) -> i64 {
        match self {
            Exceeded::EmptyDir { limit, .. }
            | Exceeded::Pod { limit }
            | Exceeded::Container { limit, .. } => *limit,
        }
    }

    /// The kubelet's message (`emptyDirMessageFmt`,
    /// `podEphemeralStorageMessageFmt`, `containerEphemeralStorageMessageFmt`).
    pub fn message(&self) -> String {
        let q = |v: i64| format_bytes(v.max(0) as u64);
        match self {
            Exceeded::EmptyDir { volume, limit } => {
                format!(
                    "Usage of EmptyDir volume {volume:?} exceeds the limit {:?}. ",
                    q(*limit)
                )
            }
            Exceeded::Pod { limit } => format!(
                "Pod ephemeral local storage usage exceeds the total limit of containers {}. ",
                q(*limit)
            ),
            Exceeded::Container { name, limit } => format!(
                "Container {name} exceeded its local ephemeral storage limit {:?}. ",
                q(*limit)
            ),
        }
    }
}

/// Whether `pod` has any limit this check enforces: only such pods are
/// read.
pub fn has_limits(pod: &ApiPod) -> bool {
    pod.empty_dirs
        .iter()
        .any(|e| e.size_limit.is_some_and(|l| l > 0))
        || pod
            .containers
            .iter()
            .any(|c| c.limits.ephemeral_storage.is_some())
}

/// The pod's ephemeral-storage limit (`PodLimits`, [`aggregate`]): the
/// regular containers' and sidecars' limits summed, no less than any init
/// container's with the sidecars started before it; `None` when no
/// container names one.
pub fn pod_limit(pod: &ApiPod) -> Option<i64> {
    aggregate(pod, |c| c.limits.get(Resource::EphemeralStorage))
}

/// How full `pod` is: the largest share of a limit its `usage` takes (an
/// emptyDir's `sizeLimit`, the pod's total, a container's own), 0 without
/// limits; above 1 once one is exceeded.
pub fn fullness(pod: &ApiPod, usage: &StorageUse, dedicated_imagefs: bool) -> f64 {
    let share = |used: u64, limit: i64| used as f64 / limit.max(1) as f64;
    let dirs = pod.empty_dirs.iter().filter_map(|e| {
        let limit = e.size_limit.filter(|l| *l > 0)?;
        let used = usage.empty_dirs.iter().find(|(n, _)| *n == e.name)?.1;
        Some(share(used, limit))
    });
    let total = pod_limit(pod).map(|l| share(usage.total, l));
    let containers = usage.containers.iter().filter_map(|(name, logs, rootfs)| {
        let c = pod.containers.iter().find(|c| c.name == *name)?;
        let limit = c
            .limits
            .ephemeral_storage
            .filter(|l| *l != 0 && c.kind != ContainerKind::Init)?;
        Some(share(
            logs + if dedicated_imagefs { 0 } else { *rootfs },
            limit,
        ))
    });
    dirs.chain(total).chain(containers).fold(0.0, f64::max)
}

/// When a pod `fullness` full is read again: within `near` once it has used
/// half of a limit, else within `far` (the housekeeping period, as the
/// kubelet reads every pod): only pods near a limit are walked often.
pub fn recheck_in(fullness: f64, near: Duration, far: Duration) -> Duration {
    if fullness >= NEAR { near } else { far }
}

/// The share of a limit from which a pod is read at the short period.
pub const NEAR: f64 = 0.5;

/// The first limit `pod` exceeds with `usage`, in the kubelet's order;
/// `dedicated_imagefs` leaves writable layers out of a container's use (they
/// are then on imagefs, not the node's ephemeral storage). Critical pods
/// are never evicted for it (the caller leaves them out).
pub fn exceeded(pod: &ApiPod, usage: &StorageUse, dedicated_imagefs: bool) -> Option<Exceeded> {
    for e in &pod.empty_dirs {
        let Some(limit) = e.size_limit.filter(|l| *l > 0) else {
            continue;
        };
        let used = usage.empty_dirs.iter().find(|(n, _)| *n == e.name);
        if used.is_some_and(|(_, u)| *u as i128 > limit as i128) {
            return Some(Exceeded::EmptyDir {
                volume: e.name.clone(),
                limit,
            });
        }
    }
    if let Some(limit) = pod_limit(pod)
        && usage.total as i128 > limit as i128
    {
        return Some(Exceeded::Pod { limit });
    }
    for (name, logs, rootfs) in &usage.containers {
        let spec = pod.containers.iter().find(|c| c.name == *name);
        let limit = spec
            .filter(|c| c.kind != ContainerKind::Init)
            .and_then(|c| c.limits.ephemeral_storage)
            .filter(|l| *l != 0);
        let used = logs + if dedicated_imagefs { 0 } else { *rootfs };
        if let Some(limit) = limit
            && used as i128 > limit as i128
        {
            return Some(Exceeded::Container {
                name: name.clone(),
                limit,
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::spec::{ApiContainer, EmptyDir, Resources};

    const MI: i64 = 1 << 20;

    fn container(name: &str, kind: ContainerKind, limit: Option<i64>) -> ApiContainer {
        ApiContainer {
            name: name.into(),
            kind,
            requests: Resources::default(),
            limits: Resources {
                memory: None,
                ephemeral_storage: limit,
            },
        }
    }

    fn pod() -> ApiPod {
        ApiPod {
            uid: "u".into(),
            containers: vec![
                container("app", ContainerKind::Regular, Some(100 * MI)),
                container("proxy", ContainerKind::Sidecar, Some(20 * MI)),
                container("setup", ContainerKind::Init, Some(500 * MI)),
            ],
            empty_dirs: vec![
                EmptyDir {
                    name: "cache".into(),
                    memory: false,
                    size_limit: Some(64 * MI),
                },
                EmptyDir {
                    name: "scratch".into(),
                    memory: false,
                    size_limit: None,
                },
            ],
            ..Default::default()
        }
    }

    fn usage(cache: i64, app_logs: i64, app_rootfs: i64, total: i64) -> StorageUse {
        StorageUse {
            empty_dirs: vec![
                ("cache".into(), cache as u64),
                ("scratch".into(), 900 << 20),
            ],
            containers: vec![
                ("app".into(), app_logs as u64, app_rootfs as u64),
                ("setup".into(), 0, 600 << 20),
            ],
            total: total as u64,
        }
    }

    #[test]
    fn the_kubelets_order_emptydir_then_pod_then_container() {
        let p = pod();
        assert!(has_limits(&p));
        // The init container's 500Mi with the sidecar before it: 520Mi.
        assert_eq!(pod_limit(&p), Some(520 * MI));
        assert_eq!(exceeded(&p, &usage(10 * MI, MI, MI, 100 * MI), false), None);
        let all = usage(65 * MI, 200 * MI, 0, 600 * MI);
        let first = exceeded(&p, &all, false).unwrap();
        assert_eq!(
            first,
            Exceeded::EmptyDir {
                volume: "cache".into(),
                limit: 64 * MI
            }
        );
        assert_eq!(
            first.message(),
            "Usage of EmptyDir volume \"cache\" exceeds the limit \"64Mi\". "
        );
        assert_eq!(first.signal(), "emptydirfs.limit");
        let pod_over = exceeded(&p, &usage(0, 200 * MI, 0, 600 * MI), false).unwrap();
        assert_eq!(pod_over, Exceeded::Pod { limit: 520 * MI });
        assert_eq!(
            pod_over.message(),
            "Pod ephemeral local storage usage exceeds the total limit of containers 520Mi. "
        );
        let c = exceeded(&p, &usage(0, 60 * MI, 50 * MI, 110 * MI), false).unwrap();
        assert_eq!(
            c,
            Exceeded::Container {
                name: "app".into(),
                limit: 100 * MI
            }
        );
        assert_eq!(
            c.message(),
            "Container app exceeded its local ephemeral storage limit \"100Mi\". "
        );
        // Exactly at a limit is not over it.
        assert_eq!(
            exceeded(&p, &usage(64 * MI, 50 * MI, 50 * MI, 520 * MI), false),
            None
        );
    }

    #[test]
    fn with_a_dedicated_imagefs_a_containers_writable_layer_does_not_count() {
        let p = pod();
        let u = usage(0, 60 * MI, 50 * MI, 110 * MI);
        assert_eq!(exceeded(&p, &u, true), None);
        // An init container's own limit is not checked, only its share of
        // the pod's.
        let u = usage(0, 0, 0, 0);
        let mut init_over = u.clone();
        init_over.containers[1].2 = 700 << 20;
        assert_eq!(exceeded(&p, &init_over, false), None);
    }

    #[test]
    fn a_pod_near_a_limit_is_read_at_the_short_period() {
        let p = pod();
        let (near, far) = (Duration::from_secs(2), Duration::from_secs(10));
        // 10 of the emptyDir's 64Mi, 2 of the container's 100Mi: far.
        let u = usage(10 * MI, MI, MI, 20 * MI);
        let f = fullness(&p, &u, false);
        assert!((f - 10.0 / 64.0).abs() < 1e-9, "{f}");
        assert_eq!(recheck_in(f, near, far), far);
        // The container at 60 of its 100Mi: near.
        let u = usage(0, 30 * MI, 30 * MI, 60 * MI);
        assert!((fullness(&p, &u, false) - 0.6).abs() < 1e-9);
        assert_eq!(recheck_in(fullness(&p, &u, false), near, far), near);
        // Without the writable layer (dedicated imagefs): 30 of 100.
        assert!((fullness(&p, &u, true) - 0.3).abs() < 1e-9);
    }

    #[test]
    fn a_pod_without_limits_is_not_read() {
        let mut p = pod();
        p.containers
            .iter_mut()
            .for_each(|c| c.limits.ephemeral_storage = None);
        p.empty_dirs[0].size_limit = None;
        assert!(!has_limits(&p));
        assert_eq!(pod_limit(&p), None);
    }
}
