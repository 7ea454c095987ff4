//! containerd's native snapshots API (`containerd.services.snapshots.v1.Snapshots`),
//! served on the same socket as CRI.
//!
//! criguard needs two of its calls: `Mounts`, to learn where a container's
//! writable layer lives on the host (the overlay `upperdir=`), and `Usage`,
//! containerd's own walk of a snapshot, which benchmarks compare against.
//! The messages and the client are `containerd-client`'s, generated from
//! containerd's own protos; this module is their edge: what leaves it is a
//! directory, a [`Mount`] list or a [`UsageResponse`], and one error type.
//!
//! The CRI plugin names a container's snapshot after the container id, in
//! namespace `k8s.io`, with the snapshotter from its configuration
//! (containerd 1.6: `plugins."io.containerd.grpc.v1.cri".containerd.snapshotter`;
//! 2.x: `plugins."io.containerd.cri.v1.images".snapshotter`; default
//! `overlayfs` in both, its snapshots under
//! `<root>/io.containerd.snapshotter.v1.overlayfs`). A writable layer never
//! moves while its snapshot exists, so [`Snapshots::upperdir`] asks once per
//! container and caches the answer.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::lock::Locked;
use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
use containerd_client::services::v1::snapshots::{MountsRequest, UsageRequest};
use tonic::transport::Channel;

use super::namespaced;

/// `containerd.services.snapshots.v1.UsageResponse`: bytes (allocated
/// blocks × 512, hard links once) and inodes.
pub use containerd_client::services::v1::snapshots::UsageResponse;
/// `containerd.types.Mount`: type, source, target and fstab-style options.
pub use containerd_client::types::Mount;

/// The containerd namespace the CRI plugin keeps Kubernetes' objects in.
pub const CRI_NAMESPACE: &str = super::CRI_NAMESPACE;

/// containerd's default snapshotter for CRI.
pub const DEFAULT_SNAPSHOTTER: &str = "overlayfs";

/// Why a snapshot could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// containerd refused or failed the call.
    #[error("snapshots {method} of {key:?} (snapshotter {snapshotter}): {status}")]
    Call {
        /// `Mounts` or `Usage`.
        method: &'static str,
        /// Snapshot key (for CRI containers, the container id).
        key: String,
        /// Snapshotter name.
        snapshotter: String,
        /// containerd's answer.
        status: tonic::Status,
    },
    /// The mounts name no writable directory criguard understands.
    #[error("snapshot {key:?}: no writable layer in its mounts {mounts:?}")]
    NoWritableLayer {
        /// Snapshot key.
        key: String,
        /// The mounts as containerd gave them.
        mounts: Vec<Mount>,
    },
}

impl SnapshotError {
    /// True when containerd has no such snapshot (a container removed meanwhile).
    pub fn is_not_found(&self) -> bool {
        matches!(self, SnapshotError::Call { status, .. } if status.code() == tonic::Code::NotFound)
    }
}

/// The host directory a container writes into, from its snapshot's mounts:
/// the `upperdir=` of an overlay mount, or the source of a read-write bind
/// mount (a snapshot without parent layers). `None` for anything else.
pub fn writable_dir(mounts: &[Mount]) -> Option<PathBuf> {
    mounts.iter().find_map(|m| match m.r#type.as_str() {
        "overlay" => m
            .options
            .iter()
            .find_map(|o| o.strip_prefix("upperdir="))
            .map(PathBuf::from),
        "bind" | "rbind" if !m.options.iter().any(|o| o == "ro") && !m.source.is_empty() => {
            Some(PathBuf::from(&m.source))
        }
        _ => None,
    })
}

/// A client of containerd's snapshots service for one snapshotter, with a
/// cache of writable-layer directories by container id. Clones share the
/// cache and the connection.
#[derive(Clone, Debug)]
pub struct Snapshots {
    channel: Channel,
    snapshotter: String,
    namespace: String,
    upperdirs: Arc<Mutex<HashMap<String, PathBuf>>>,
}

impl Snapshots {
    /// A client over `channel` (containerd's socket) for `snapshotter`, in
    /// the CRI plugin's namespace.
    pub fn new(channel: Channel, snapshotter: &str) -> Self {
        Self {
            channel,
            snapshotter: snapshotter.to_owned(),
            namespace: CRI_NAMESPACE.to_owned(),
            upperdirs: Arc::default(),
        }
    }

    /// The snapshotter this client asks.
    pub fn snapshotter(&self) -> &str {
        &self.snapshotter
    }

    fn client(&self) -> SnapshotsClient<Channel> {
        SnapshotsClient::new(self.channel.clone())
    }

    fn call_error(
        &self,
        method: &'static str,
        key: &str,
    ) -> impl FnOnce(tonic::Status) -> SnapshotError {
        let (key, snapshotter) = (key.to_owned(), self.snapshotter.clone());
        move |status| SnapshotError::Call {
            method,
            key,
            snapshotter,
            status,
        }
    }

    /// `Mounts` of snapshot `key`.
    pub async fn mounts(&self, key: &str) -> Result<Vec<Mount>, SnapshotError> {
        let req = MountsRequest {
            snapshotter: self.snapshotter.clone(),
            key: key.to_owned(),
        };
        let mut client = self.client();
        let call = client.mounts(namespaced(req, &self.namespace));
        let resp = super::bounded("Snapshots.Mounts", super::CALL_DEADLINE, call)
            .await
            .map_err(self.call_error("Mounts", key))?;
        Ok(resp.into_inner().mounts)
    }

    /// `Usage` of snapshot `key`: containerd walks it now (for an active
    /// snapshot) and answers bytes and inodes.
    pub async fn usage(&self, key: &str) -> Result<UsageResponse, SnapshotError> {
        let req = UsageRequest {
            snapshotter: self.snapshotter.clone(),
            key: key.to_owned(),
        };
        let mut client = self.client();
        let call = client.usage(namespaced(req, &self.namespace));
        let resp = super::bounded("Snapshots.Usage", super::CALL_DEADLINE, call)
            .await
            .map_err(self.call_error("Usage", key))?;
        Ok(resp.into_inner())
    }

    /// The host directory holding `container_id`'s writable layer: from the
    /// cache, else from `Mounts` (then cached).
    pub async fn upperdir(&self, container_id: &str) -> Result<PathBuf, SnapshotError> {
        if let Some(dir) = self.cached(container_id) {
            return Ok(dir);
        }
        let mounts = self.mounts(container_id).await?;
        let dir = writable_dir(&mounts).ok_or_else(|| SnapshotError::NoWritableLayer {
            key: container_id.to_owned(),
            mounts,
        })?;
        self.lock().insert(container_id.to_owned(), dir.clone());
        Ok(dir)
    }

    /// The cached writable-layer directory of `container_id`, without asking.
    pub fn cached(&self, container_id: &str) -> Option<PathBuf> {
        self.lock().get(container_id).cloned()
    }

    /// Drops cached directories of containers not in `live`.
    pub fn retain(&self, live: &std::collections::HashSet<&str>) {
        self.lock().retain(|id, _| live.contains(id.as_str()));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, PathBuf>> {
        self.upperdirs.locked()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn mount(t: &str, source: &str, options: &[&str]) -> Mount {
        Mount {
            r#type: t.into(),
            source: source.into(),
            target: String::new(),
            options: options.iter().map(|o| o.to_string()).collect(),
        }
    }

    #[test]
    fn overlay_upperdir_is_the_writable_layer() {
        let m = mount(
            "overlay",
            "overlay",
            &[
                "index=off",
                "workdir=/c/snapshots/12/work",
                "upperdir=/c/snapshots/12/fs",
                "lowerdir=/c/snapshots/3/fs:/c/snapshots/2/fs",
            ],
        );
        assert_eq!(
            writable_dir(&[m]),
            Some(PathBuf::from("/c/snapshots/12/fs"))
        );
    }

    #[test]
    fn parentless_snapshot_is_a_read_write_bind_mount() {
        let rw = mount("bind", "/c/snapshots/7/fs", &["rw", "rbind"]);
        assert_eq!(
            writable_dir(&[rw]),
            Some(PathBuf::from("/c/snapshots/7/fs"))
        );
        let ro = mount("bind", "/c/snapshots/7/fs", &["ro", "rbind"]);
        assert_eq!(writable_dir(&[ro]), None);
        assert_eq!(writable_dir(&[]), None);
    }

    #[test]
    fn messages_use_containerds_field_numbers() {
        // The generated messages keep containerd's wire format: MountsRequest
        // {snapshotter: "o", key: "k"} is fields 1 and 2, length-delimited.
        let bytes = MountsRequest {
            snapshotter: "o".into(),
            key: "k".into(),
        }
        .encode_to_vec();
        assert_eq!(bytes, [0x0a, 1, b'o', 0x12, 1, b'k']);
        // UsageResponse{size: 300, inodes: 2}: varints in fields 1 and 2.
        let u = UsageResponse::decode(&[0x08, 0xac, 0x02, 0x10, 0x02][..]).unwrap();
        assert_eq!((u.size, u.inodes), (300, 2));
        // Mount options are field 4, whatever else the message holds.
        let m = Mount::decode(&[0x0a, 1, b'b', 0x22, 2, b'r', b'w'][..]).unwrap();
        assert_eq!((m.r#type.as_str(), m.options), ("b", vec!["rw".to_owned()]));
    }
}
