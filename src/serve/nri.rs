//! `--mode nri`: criguard attached to the runtime as an NRI plugin instead
//! of standing in the kubelet's call path. The same observer as the
//! proxy's decides (admission, `oom_score_adj`) and keeps the node model;
//! everything else (signals, ranking, the kill, stops and GC through the
//! runtime's CRI socket, the API report, admin, metrics) is the same in
//! both modes.

use std::sync::Arc;

use criguard::intercept::Observer;
use criguard::intercept::nri::{NriMetrics, NriObserver};
use criguard::nri::attach::{Registration, attach, stay_attached};

use super::loops::Stopping;
use crate::cli::args::ServeCmd;

/// The name criguard registers under.
pub const PLUGIN_NAME: &str = "criguard";

/// Attaches to `--nri-socket` (an error, one line naming the socket and
/// the containerd setting, when no runtime answers there) and keeps
/// attached across runtime restarts until `stopping`.
pub async fn start(
    cmd: &ServeCmd,
    observer: Observer,
    metrics: NriMetrics,
    stopping: Stopping,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let reg = Registration {
        socket: cmd.nri_socket.clone(),
        name: PLUGIN_NAME.into(),
        index: cmd.nri_index.clone(),
    };
    let handler = Arc::new(NriObserver::new(observer).with_metrics(metrics.clone()));
    let first = attach(&reg, handler.clone()).await?;
    Ok(tokio::spawn(stay_attached(
        reg,
        handler,
        Some(first),
        move |on| metrics.set_attached(on),
        stopping.cancelled_owned(),
    )))
}
