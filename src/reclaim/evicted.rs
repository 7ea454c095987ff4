//! The evicted pods' state file, `<state-dir>/evicted-pods.json`.
//!
//! The decisions are in [`crate::policy::evicted`]; this is only the file:
//! read once at start, written atomically (a temporary file, fsynced, renamed
//! over the old one, the directory fsynced) whenever the set changed. The
//! directory is created 0700 and the file is 0600: pod names and eviction
//! messages are the node's business. A file that cannot be read or parsed is
//! logged and set aside as `evicted-pods.json.bad`, and criguard starts with
//! no records: that must never keep it from serving.

use std::path::{Path, PathBuf};

use std::sync::RwLock;

use crate::node_state::{Eviction, NodeStatus};
use crate::policy::evicted::EvictedPods;

/// The file's name in the state directory.
pub const FILE_NAME: &str = "evicted-pods.json";

/// Where the evicted pods are kept.
#[derive(Clone, Debug)]
pub struct EvictedStore {
    path: PathBuf,
}

impl EvictedStore {
    /// The store in `state_dir`.
    pub fn new(state_dir: &Path) -> Self {
        Self {
            path: state_dir.join(FILE_NAME),
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The records saved last time (none when there is no file), under the
    /// limits of `into`, pruned at `now_ms`.
    pub fn load_into(&self, into: &mut EvictedPods, now_ms: u64) {
        let text = match std::fs::read(&self.path) {
            Ok(t) => t,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return,
            Err(err) => {
                tracing::error!(path = %self.path.display(), %err, "cannot read the evicted pods; starting without them");
                return;
            }
        };
        match serde_json::from_slice::<EvictedPods>(&text) {
            Ok(loaded) => {
                into.adopt(loaded, now_ms);
                tracing::info!(path = %self.path.display(), pods = into.pods.len(), "evicted pods loaded: their sandboxes stay refused");
            }
            Err(err) => {
                let bad = self.path.with_extension("json.bad");
                let _ = std::fs::rename(&self.path, &bad);
                tracing::error!(path = %self.path.display(), set_aside = %bad.display(), %err, "evicted pods file not valid JSON; starting without it");
            }
        }
    }

    /// The node status criguard starts with: no conditions yet, the evicted
    /// pods saved by the last run.
    pub fn initial_status(&self) -> NodeStatus {
        let mut status = NodeStatus::default();
        self.load_into(&mut status.evicted, unix_ms_now());
        status
    }

    /// Writes `pods` atomically and privately ([`crate::statefile`]);
    /// errors carry the path.
    pub fn save(&self, pods: &EvictedPods) -> std::io::Result<()> {
        crate::statefile::write_private(&self.path, &serde_json::to_vec_pretty(pods)?)
    }
}

/// Records eviction `e` in `status` for admission at once and starts saving
/// the set to `store` off the proxy's thread; the caller awaits the save
/// once the pod is stopped, so a restart cannot let the pod back in.
pub fn remember(
    status: &RwLock<NodeStatus>,
    store: Option<&EvictedStore>,
    e: &Eviction,
) -> Option<tokio::task::JoinHandle<()>> {
    let snapshot = {
        let mut st = status.write().unwrap_or_else(|e| e.into_inner());
        st.evicted.insert(&e.uid, &e.pod, &e.message, e.at_unix_ms);
        st.evicted.take_dirty();
        st.evicted.clone()
    };
    let store = store?.clone();
    let pod = e.pod.clone();
    Some(tokio::task::spawn_blocking(move || {
        if let Err(err) = store.save(&snapshot) {
            tracing::error!(%err, %pod, "cannot save the evicted pods; the pod stays refused until criguard restarts");
        }
    }))
}

/// Forgets evicted pods nobody asked for in a long while and saves the set
/// to `store` if it changed (off the proxy's thread: the save fsyncs).
pub async fn persist(status: &RwLock<NodeStatus>, store: Option<&EvictedStore>) {
    let snapshot = {
        let mut st = status.write().unwrap_or_else(|e| e.into_inner());
        for uid in st.evicted.prune(unix_ms_now()) {
            tracing::info!(%uid, "evicted pod forgotten: its sandbox was not asked for in a long while");
        }
        st.evicted.take_dirty().then(|| st.evicted.clone())
    };
    if let (Some(store), Some(pods)) = (store.cloned(), snapshot) {
        let saved = tokio::task::spawn_blocking(move || store.save(&pods)).await;
        if let Ok(Err(err)) = saved {
            tracing::error!(%err, "cannot save the evicted pods");
        }
    }
}

fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn saved_records_come_back_with_private_modes() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        let store = EvictedStore::new(&dir);
        let mut pods = EvictedPods::default();
        pods.insert(
            "uid-1",
            "ns/hog",
            "The node was low on resource: memory.",
            1_000,
        );
        store.save(&pods).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(store.path()), 0o600);
        assert!(!dir.join("evicted-pods.json.tmp").exists());
        let mut back = EvictedPods::default();
        store.load_into(&mut back, 2_000);
        assert_eq!(back.pods, pods.pods);
    }

    #[test]
    fn a_corrupt_file_is_set_aside_and_nothing_is_loaded() {
        let tmp = tempfile::tempdir().unwrap();
        let store = EvictedStore::new(tmp.path());
        std::fs::write(store.path(), b"{not json").unwrap();
        let mut back = EvictedPods::default();
        store.load_into(&mut back, 0);
        assert!(back.pods.is_empty());
        assert!(tmp.path().join("evicted-pods.json.bad").exists());
        // And a missing file is simply no records.
        store.load_into(&mut back, 0);
        assert!(back.pods.is_empty());
    }
}
