//! The image uses the proxy sees between image collections: a container
//! created through the proxy marks its image used now, and image GC takes
//! these marks at each collection.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::lock::Locked;

/// Image uses seen between collections (a container created through the
/// proxy): image reference as the kubelet wrote it → when, ms since the epoch.
#[derive(Clone, Debug, Default)]
pub struct ImageUses(Arc<Mutex<HashMap<String, i64>>>);

impl ImageUses {
    /// Records that a container was just created from `image`.
    pub fn touch(&self, image: &str) {
        let mut m = self.0.locked();
        m.insert(image.to_owned(), crate::clock::now_ms() as i64);
    }

    /// Takes every use recorded since the last call.
    pub(crate) fn take(&self) -> HashMap<String, i64> {
        std::mem::take(&mut *self.0.locked())
    }
}
