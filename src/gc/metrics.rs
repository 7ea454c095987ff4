//! What node-level reclaim (image and container GC) counts: bytes freed
//! and objects removed, by action.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Labels of a node-level reclaim action.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    /// `image_gc` or `container_gc`.
    pub action: Action,
}

label_values! {
    /// A node-level reclaim action.
    pub enum Action {
        /// Unused images removed.
        ImageGc => "image_gc",
        /// Dead containers and sandboxes removed.
        ContainerGc => "container_gc",
    }
}

/// Metrics of image and container garbage collection.
#[derive(Clone, Debug, Default)]
pub struct GcMetrics {
    /// Bytes freed, by action (measured on the filesystems, not estimated).
    pub bytes: Family<ActionLabels, Counter>,
    /// Objects removed (images, containers, sandboxes), by action.
    pub removed: Family<ActionLabels, Counter>,
}

impl GcMetrics {
    /// Registers every metric of the group.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "criguard_reclaimed_bytes",
            "Bytes freed on imagefs/nodefs by node-level reclaim, by action (image_gc, container_gc)",
            self.bytes.clone(),
        );
        registry.register(
            "criguard_reclaim_removals",
            "Images, containers and sandboxes removed by node-level reclaim, by action",
            self.removed.clone(),
        );
    }

    /// Records one action's removals and the bytes they freed.
    pub fn record(&self, action: Action, removed: u64, bytes: u64) {
        let l = ActionLabels { action };
        self.removed.get_or_create(&l).inc_by(removed);
        self.bytes.get_or_create(&l).inc_by(bytes);
    }
}
