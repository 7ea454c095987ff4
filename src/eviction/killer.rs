//! Stopping an evicted pod on the node ([`super::seams::PodKiller`]), as the
//! kubelet's `killPodNow` does through its pod workers: under a grace
//! period of 0 its processes are first killed through its cgroup
//! ([`crate::cgroup::kill`]), so that the memory comes back before the
//! runtime has handled the stops; then StopContainer for each running
//! container and StopPodSandbox through the runtime; a stop the runtime
//! does not answer is retried in the background ([`StopRetry`]). For disk
//! the pod's containers are removed too, with their writable layers and logs.

use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_cri::v1 as cri;

use super::seams::PodKiller;
use super::stop_retry::{StopRetry, runtime_hung};
use crate::cgroup::fs::CgroupFs;
use crate::cgroup::kill;
use crate::model::{ContainerState, Pod};
use crate::runtime::remove::remove_container;
use crate::runtime::{CALL_DEADLINE, Upstream, bounded};

/// Stops pods through their cgroups and the runtime; cheap to clone.
#[derive(Clone, Debug)]
pub struct RuntimeKiller {
    upstream: Upstream,
    cgroups: CgroupFs,
}

impl RuntimeKiller {
    /// A killer stopping pods through `upstream` and killing their
    /// processes in `cgroups`.
    pub fn new(upstream: Upstream, cgroups: CgroupFs) -> Self {
        Self { upstream, cgroups }
    }

    /// Stops `pod` as the kubelet does: StopContainer for every running
    /// container at once, then StopPodSandbox, each within its deadline
    /// ([`CALL_DEADLINE`], plus the grace period for StopContainer). True
    /// when StopPodSandbox succeeded; false when the runtime did not answer
    /// or failed, and the caller hands the stop to a [`StopRetry`]. A
    /// StopContainer the runtime did not answer in time skips the
    /// StopPodSandbox (it would wait as long again on the same runtime).
    async fn stop_pod(&self, pod: &Pod, grace_s: i64) -> bool {
        let started = Instant::now();
        let deadline = CALL_DEADLINE + Duration::from_secs(grace_s.max(0) as u64);
        let stops = pod
            .containers
            .values()
            .filter(|c| c.state == ContainerState::Running)
            .map(|c| {
                let mut rt = self.upstream.runtime();
                let req = cri::StopContainerRequest {
                    container_id: c.id.clone(),
                    timeout: grace_s,
                };
                async move {
                    let r = bounded("StopContainer", deadline, rt.stop_container(req)).await;
                    match r {
                        Ok(_) => true,
                        Err(err) => {
                            tracing::warn!(container = %c.id, %err, "StopContainer failed; StopPodSandbox follows");
                            !runtime_hung(&err)
                        }
                    }
                }
            });
        let answered = futures::future::join_all(stops).await;
        let containers_stopped = Instant::now();
        if answered.contains(&false) {
            tracing::warn!(sandbox = %pod.sandbox_id, "the runtime does not answer: StopPodSandbox retried until it does (the pod's processes are already killed when its grace period is 0)");
            return false;
        }
        let mut rt = self.upstream.runtime();
        let req = cri::StopPodSandboxRequest {
            pod_sandbox_id: pod.sandbox_id.clone(),
        };
        let ok = match bounded("StopPodSandbox", CALL_DEADLINE, rt.stop_pod_sandbox(req)).await {
            Ok(_) => true,
            Err(err) => {
                tracing::error!(sandbox = %pod.sandbox_id, %err, "StopPodSandbox failed; retried until the runtime answers");
                false
            }
        };
        tracing::debug!(
            sandbox = %pod.sandbox_id,
            stop_containers_ms = ms(containers_stopped - started),
            stop_sandbox_ms = ms(containers_stopped.elapsed()),
            ok,
            "pod stopped"
        );
        ok
    }
}

impl PodKiller for RuntimeKiller {
    /// Kills `pod`'s processes through its cgroup before the runtime hears
    /// of it ([`kill`]): the memory comes back at once, not after
    /// containerd and the shims handled the stops.
    fn kill_now(&self, pod: &Pod) -> bool {
        let Some(cgroup) = pod.cgroup() else {
            return false;
        };
        if !kill::is_pod_cgroup_of(&cgroup, &pod.uid) {
            tracing::info!(
                sandbox = %pod.sandbox_id, %cgroup, uid = %pod.uid,
                "the pod's cgroup is not named for its UID; only the runtime stops it"
            );
            return false;
        }
        match kill::kill_cgroup(&self.cgroups, &cgroup) {
            Ok(killed) => {
                tracing::debug!(sandbox = %pod.sandbox_id, %cgroup, ?killed, "pod's processes killed");
                true
            }
            Err(err) => {
                tracing::warn!(
                    sandbox = %pod.sandbox_id, %cgroup, %err,
                    "could not kill the pod's processes through its cgroup; the runtime's stop follows"
                );
                false
            }
        }
    }

    fn stop<'a>(&'a self, pod: &'a Pod, grace_s: i64) -> BoxFuture<'a, bool> {
        self.stop_pod(pod, grace_s).boxed()
    }

    fn retry_stop(&self, sandbox_id: &str, stopped: Box<dyn FnOnce() + Send>) {
        let retry = StopRetry {
            upstream: self.upstream.clone(),
            sandbox_id: sandbox_id.to_owned(),
            stopped,
        };
        tokio::spawn(retry.run());
    }

    fn remove_containers<'a>(&'a self, pod: &'a Pod) -> BoxFuture<'a, ()> {
        async move {
            let mut rt = self.upstream.runtime();
            for c in pod.containers.values() {
                remove_container(&mut rt, &c.id).await;
            }
        }
        .boxed()
    }
}

/// A duration in milliseconds, for logs.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
