//! The image uses the proxy sees between image collections: a container
//! created through the proxy marks its image used now, and image GC takes
//! these marks at each collection.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// Image uses seen between collections (a container created through the
/// proxy): image reference as the kubelet wrote it → when, ms since the epoch.
#[derive(Clone, Debug, Default)]
pub struct ImageUses(Arc<Mutex<HashMap<String, i64>>>);

impl ImageUses {
    /// Records that a container was just created from `image`.
    pub fn touch(&self, image: &str) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.insert(image.to_owned(), now_ms());
    }

    /// Takes every use recorded since the last call.
    pub(crate) fn take(&self) -> HashMap<String, i64> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Now, ms since the epoch (0 before it).
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
