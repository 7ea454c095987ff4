//! Node-level reclaim as the eviction manager asks for it
//! ([`super::seams::NodeReclaim`]): criguard's dead-container GC and image
//! GC, with the filesystems that tell whether images live apart.

use std::path::PathBuf;

use futures::FutureExt;
use futures::future::BoxFuture;

use crate::eviction::seams::NodeReclaim;
use crate::gc::containers::ContainerGc;
use crate::gc::images::ImageGc;
use crate::signals::disk::dedicated_imagefs;

/// The node's collectors, with the policies in effect; cheap to clone.
#[derive(Clone, Debug)]
pub struct Collectors {
    /// Dead-container GC.
    pub containers: ContainerGc,
    /// Image GC.
    pub images: ImageGc,
    /// The nodefs root.
    pub nodefs: PathBuf,
    /// The imagefs root.
    pub imagefs: PathBuf,
}

impl NodeReclaim for Collectors {
    fn dedicated_imagefs(&self) -> bool {
        dedicated_imagefs(&self.nodefs, &self.imagefs)
    }

    fn collect_containers(&self) -> BoxFuture<'_, u64> {
        async move { self.containers.reclaim().await.freed }.boxed()
    }

    fn free_images(&self, bytes: u64) -> BoxFuture<'_, u64> {
        async move { self.images.free(bytes).await.freed }.boxed()
    }
}
