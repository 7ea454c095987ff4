//! The loops' plumbing: criguard stopping, the node model's readiness, and
//! rounds at a period.

use std::future::Future;
use std::time::Duration;

use criguard::cri::proxy::Ready;
use tokio_util::sync::CancellationToken;

/// What every loop waits on to learn that criguard is stopping: cancelled
/// once, when it stops.
pub type Stopping = CancellationToken;

/// Runs `f` at each tick of `tick` until `stopped` resolves.
pub async fn periodic_on(
    tick: &mut tokio::time::Interval,
    stopped: impl Future<Output = ()>,
    mut f: impl FnMut(),
) {
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            _ = tick.tick() => f(),
            () = &mut stopped => return,
        }
    }
}

/// Runs `run` once the node model is rebuilt (`ready` set), or nothing
/// when `stopped` resolves first.
pub async fn after_ready(
    ready: Ready,
    stopped: impl Future<Output = ()> + Send,
    run: impl Future<Output = ()> + Send,
) {
    let go = tokio::select! {
        () = ready.wait() => true,
        () = stopped => false,
    };
    if go {
        run.await;
    }
}

/// Runs `round` every `every` until `stopped` resolves; a round in progress
/// finishes first, and a slow round delays the next instead of piling up.
pub async fn periodic<F, Fut>(every: Duration, stopped: impl Future<Output = ()>, mut round: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    tokio::pin!(stopped);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => round().await,
            () = &mut stopped => return,
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(start_paused = true)]
    async fn after_ready_runs_once_ready_and_never_when_stopped_first() {
        let ran = Arc::new(AtomicUsize::new(0));
        let ready = Ready::default();
        let stopping = Stopping::new();
        let count = ran.clone();
        let task = tokio::spawn(after_ready(
            ready.clone(),
            stopping.clone().cancelled_owned(),
            async move {
                count.fetch_add(1, Ordering::SeqCst);
            },
        ));
        tokio::task::yield_now().await;
        assert_eq!(ran.load(Ordering::SeqCst), 0, "ran before ready");
        ready.set();
        task.await.unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 1);

        let never = Ready::default();
        stopping.cancel();
        let count = ran.clone();
        after_ready(never, stopping.cancelled_owned(), async move {
            count.fetch_add(1, Ordering::SeqCst);
        })
        .await;
        assert_eq!(ran.load(Ordering::SeqCst), 1, "ran although stopped");
    }

    #[tokio::test(start_paused = true)]
    async fn periodic_runs_a_round_per_period_until_stopped() {
        let rounds = Arc::new(AtomicUsize::new(0));
        let stopping = Stopping::new();
        let count = rounds.clone();
        let task = tokio::spawn(periodic(
            Duration::from_secs(10),
            stopping.clone().cancelled_owned(),
            move || {
                let count = count.clone();
                async move {
                    count.fetch_add(1, Ordering::SeqCst);
                }
            },
        ));
        // The first tick is at once, then one per period.
        tokio::time::sleep(Duration::from_secs(35)).await;
        assert_eq!(rounds.load(Ordering::SeqCst), 4);
        stopping.cancel();
        task.await.unwrap();
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(rounds.load(Ordering::SeqCst), 4, "rounds after the stop");
    }
}
