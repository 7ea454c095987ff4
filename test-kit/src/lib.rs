//! Shared test harness: the kubelet's side of the socket, a private
//! containerd, and criguard itself.

pub mod apiserver;
pub mod clients;
pub mod cluster;
pub mod containerd;
pub mod crio;
pub mod echo;
pub mod h2peer;
pub mod kubeapi;
pub mod kubelet;
pub mod memcg;
pub mod metrics;
pub mod pods;
pub mod pressure;
pub mod rawgrpc;
pub mod served;
pub mod tonic_raw;

use std::path::{Path, PathBuf};
use std::time::Duration;

use criguard::cri;
use criguard::runtime::{RuntimeEndpoint, Upstream};
use tokio::sync::oneshot;

/// The repository's root: the kit is its folder `test-kit/`.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("test-kit/ is in the repository")
        .to_owned()
}

/// The criguard binary of the build the running test or bench belongs to:
/// `criguard` in the profile directory above the executable's `deps/`,
/// where Cargo puts it for the package's own tests (`CARGO_BIN_EXE_criguard`,
/// which this crate, not being criguard's, is not given).
pub fn criguard_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's executable");
    let dir = exe.parent().expect("the executable's directory");
    let profile = if dir.ends_with("deps") {
        dir.parent().unwrap_or(dir)
    } else {
        dir
    };
    profile.join("criguard")
}

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit, once: the
/// tests that open hundreds of client sockets call it, and every test of
/// the binary shares the process and its limit. Children started later
/// inherit it (criguard raises its own soft limit at start anyway).
pub fn raise_nofile() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        use nix::sys::resource::{Resource, getrlimit, setrlimit};
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).expect("setrlimit NOFILE");
    });
}

/// criguard served in-process on `listen`, forwarding to `upstream`.
pub struct InProcessProxy {
    /// The socket the "kubelet" dials.
    pub socket: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl InProcessProxy {
    /// Binds `listen` and serves until dropped or [`InProcessProxy::stop`].
    pub fn start(listen: &Path, upstream: &Path) -> Self {
        let listener = criguard::listen::bind(listen).expect("bind criguard socket");
        let endpoint = RuntimeEndpoint::parse(upstream.to_str().unwrap()).unwrap();
        let model = criguard::model::NodeModel::new(8 << 30);
        let observer =
            criguard::intercept::Observer::new(std::sync::Arc::new(std::sync::RwLock::new(model)));
        let proxy = cri::Proxy::new(&Upstream::new(endpoint)).with_observer(observer);
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(cri::serve(
            listener,
            proxy,
            async {
                let _ = rx.await;
            },
            Duration::from_secs(5),
        ));
        Self {
            socket: listen.to_owned(),
            stop: Some(tx),
            task: Some(task),
        }
    }

    /// Stops serving and waits for the drain to finish.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }
}

impl Drop for InProcessProxy {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// Polls `check` every 20 ms until it returns `Some` or `deadline` passes.
pub async fn poll_until<T, F, Fut>(deadline: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = tokio::time::Instant::now() + deadline;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() > end {
            panic!("timed out after {deadline:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
