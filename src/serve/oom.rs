//! The dynamic `oom_score_adj` adjuster's loop: every round ranks running
//! pods for memory (the kernel OOM kills are matched against that ranking)
//! and, with `--dynamic-oom-score-adj`, writes the scores that make the
//! first-ranked pod the kernel's victim. Its cgroupfs and procfs reads
//! block briefly, so each round runs off the loops' thread.

use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use criguard::metrics::Metrics;
use criguard::model::NodeModel;
use criguard::oom::adjust::OomAdjuster;
use criguard::oom::history::RankHistory;

use super::loops::{Stopping, periodic};

/// The adjuster over `node`, recording its rankings in `ranks`; it writes
/// scores only when `dynamic`.
pub fn build(
    node: &Arc<RwLock<NodeModel>>,
    cgroup_root: &Path,
    metrics: &Metrics,
    ranks: Arc<Mutex<RankHistory>>,
    dynamic: bool,
) -> Arc<Mutex<OomAdjuster>> {
    let a = OomAdjuster::new(node.clone(), cgroup_root.to_owned(), "/proc".into())
        .with_metrics(metrics.oom.clone())
        .with_rank_history(ranks);
    let a = if dynamic { a } else { a.rank_only() };
    Arc::new(Mutex::new(a))
}

/// Runs a round every `every` until criguard stops.
pub async fn run(adjuster: Arc<Mutex<OomAdjuster>>, every: Duration, stopping: Stopping) {
    periodic(every, stopping.clone().cancelled_owned(), move || {
        let a = adjuster.clone();
        // cgroupfs and procfs reads block briefly: off the proxy's thread.
        // A round still running (stuck on a read) is not queued behind:
        // this one is skipped, so blocked threads never pile up.
        let round = move || match a.try_lock() {
            Ok(mut a) => {
                a.round();
            }
            Err(std::sync::TryLockError::Poisoned(p)) => {
                p.into_inner().round();
            }
            Err(std::sync::TryLockError::WouldBlock) => {
                tracing::warn!(
                    "oom_score_adj: the last round has not finished; this one is skipped"
                );
            }
        };
        async move {
            let _ = tokio::task::spawn_blocking(round).await;
        }
    })
    .await;
}
