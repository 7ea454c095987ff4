//! Per-pod disk and process usage, and the node's filesystems.

use crate::admin::pb;
use crate::signals::disk::DiskUsage;
use crate::signals::node::FsStats;
use crate::signals::usage::{ContainerUsage, NodeUsage, PodUsage};

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_survives_the_round_trip() {
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
    }
}
