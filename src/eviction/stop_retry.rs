//! An evicted pod's StopPodSandbox that the runtime did not complete (it
//! was down or hung), tried again until the runtime answers.

use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;

use crate::runtime::{CALL_DEADLINE, Upstream, bounded};

/// Whether a call's failure says the runtime is not answering (down,
/// hung) rather than refusing this one call.
pub(crate) fn runtime_hung(err: &tonic::Status) -> bool {
    matches!(
        err.code(),
        tonic::Code::DeadlineExceeded | tonic::Code::Unavailable | tonic::Code::Cancelled
    )
}

/// The waits between StopPodSandbox attempts: doubling from 1 s to 30 s.
pub fn stop_retry_wait(attempt: u32) -> Duration {
    Duration::from_secs(1u64 << attempt.min(5)).min(Duration::from_secs(30))
}

/// An evicted pod's StopPodSandbox that the runtime did not complete:
/// tried again, each attempt within [`CALL_DEADLINE`], until the runtime
/// answers. Its processes were killed through the cgroup already; this
/// tells the runtime, so that the sandbox and its network are released as
/// after any eviction.
pub(crate) struct StopRetry {
    pub(crate) upstream: Upstream,
    pub(crate) sandbox_id: String,
    /// Called once the stop completed (not when the sandbox is gone).
    pub(crate) stopped: Box<dyn FnOnce() + Send>,
}

impl StopRetry {
    /// Retries until the runtime answers.
    pub(crate) async fn run(self) {
        let started = Instant::now();
        for attempt in 0u32.. {
            tokio::time::sleep(stop_retry_wait(attempt)).await;
            let mut rt = self.upstream.runtime();
            let req = cri::StopPodSandboxRequest {
                pod_sandbox_id: self.sandbox_id.clone(),
            };
            match bounded("StopPodSandbox", CALL_DEADLINE, rt.stop_pod_sandbox(req)).await {
                Ok(_) => {
                    (self.stopped)();
                    tracing::info!(
                        sandbox = %self.sandbox_id, attempts = attempt + 1,
                        after_s = started.elapsed().as_secs_f64(),
                        "StopPodSandbox of an evicted pod completed now that the runtime answers"
                    );
                    return;
                }
                Err(err) if err.code() == tonic::Code::NotFound => {
                    tracing::info!(sandbox = %self.sandbox_id, "evicted pod's sandbox is gone; no stop needed");
                    return;
                }
                Err(err) => tracing::debug!(
                    sandbox = %self.sandbox_id, attempt, %err,
                    "StopPodSandbox still not completed; retrying"
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_stop_is_retried_doubling_up_to_30_s() {
        let waits: Vec<u64> = (0..8).map(|a| stop_retry_wait(a).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
    }

    #[test]
    fn only_silence_counts_as_a_hung_runtime() {
        assert!(runtime_hung(&tonic::Status::deadline_exceeded("x")));
        assert!(runtime_hung(&tonic::Status::unavailable("x")));
        assert!(!runtime_hung(&tonic::Status::not_found("x")));
        assert!(!runtime_hung(&tonic::Status::internal("x")));
    }
}
