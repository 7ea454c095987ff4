//! The admin API's server: tonic on the admin socket.
//!
//! Each handler is a few lines: sync the model where the answer must be
//! fresh (containers exit without passing criguard), read criguard's own
//! types, convert at the edge ([`super::convert`]). A failed sync is
//! logged and the model answered as it is. `WatchEvictions` streams from
//! [`NodeStatus::evictions`], woken by [`NodeStatus::recorded`], so a
//! watcher misses nothing and holds no copy of its own; every stream ends
//! when criguard stops. Accepting backs off while it fails
//! ([`crate::accept`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::lock::RwLocked;
use futures::Stream;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::config::ConfigStatus;
use super::pb;
use super::pb::admin_server::{Admin, AdminServer};
use crate::accept::Acceptor;
use crate::config::Threshold;
use crate::eviction::NodeStatus;
use crate::eviction::rank::{Ranker, usage_pods};
use crate::model::{NodeModel, Pod};
use crate::oom::kills::OomKills;
use crate::runtime::{Upstream, sync};
use crate::signals::table::{Ranking, Signal};
use crate::signals::usage::UsageReader;

/// How long open admin connections may finish after criguard is told to stop.
pub const DRAIN: Duration = Duration::from_secs(5);

/// How long an admin answer waits for the runtime before it answers from
/// the model as it is.
pub const SYNC_DEADLINE: Duration = Duration::from_secs(2);

/// What the admin API answers from.
#[derive(Clone, Debug)]
pub struct AdminState {
    /// The live model.
    pub model: Arc<RwLock<NodeModel>>,
    /// The runtime, to sync before answering.
    pub upstream: Upstream,
    /// Conditions and evictions.
    pub status: Arc<RwLock<NodeStatus>>,
    /// Per-pod usage, read on request.
    pub usage: UsageReader,
    /// Eviction orders, read on request (told the thresholds in effect
    /// at each request).
    pub ranker: Ranker,
    /// Kernel OOM kills recorded from containerd's events.
    pub oom_kills: OomKills,
    /// The configuration's state, as `serve` last published it (the
    /// thresholds `Rank` uses among it).
    pub config: watch::Receiver<ConfigStatus>,
    /// The API report's counters, read for `Status`.
    pub kube: crate::kube::metrics::KubeMetrics,
}

/// The signals `Rank` orders pods for: one memory signal, pid, and each
/// disk signal that has a threshold among `thresholds`.
pub fn rank_signals(thresholds: &[Threshold]) -> Vec<Signal> {
    let mut with: Vec<Signal> = thresholds.iter().map(|t| t.signal).collect();
    with.sort();
    with.dedup();
    let mut out = vec![Signal::MemoryAvailable, Signal::PidAvailable];
    out.extend(with.into_iter().filter(|s| s.ranking() == Ranking::Disk));
    out
}

impl AdminState {
    /// Syncs the model with the runtime; a failure is logged, not returned.
    /// Waited for at most [`SYNC_DEADLINE`]: a hung runtime must not hang
    /// `criguard pods` (the model, kept by the calls relayed and the
    /// events, answers as it is).
    async fn sync(&self, rpc: &str) {
        match tokio::time::timeout(SYNC_DEADLINE, sync::sync(&self.model, &self.upstream)).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                tracing::warn!(%err, rpc, "sync before an admin answer failed; answering from the model as it is")
            }
            Err(_) => {
                tracing::warn!(rpc, deadline = ?SYNC_DEADLINE, "the runtime did not answer the sync before an admin answer in time; answering from the model as it is")
            }
        }
    }

    /// The model's pods, after a sync for `rpc`.
    async fn synced_pods(&self, rpc: &str) -> Vec<Pod> {
        self.sync(rpc).await;
        self.model.read_locked().pods()
    }

    fn status(&self) -> std::sync::RwLockReadGuard<'_, NodeStatus> {
        self.status.read_locked()
    }
}

/// The service: the state, and whether criguard is stopping.
struct Service {
    state: AdminState,
    stopping: CancellationToken,
}

type EvictionStream = Pin<Box<dyn Stream<Item = Result<pb::Eviction, Status>> + Send>>;

#[tonic::async_trait]
impl Admin for Service {
    async fn pods(
        &self,
        _: Request<pb::PodsRequest>,
    ) -> Result<Response<pb::PodsResponse>, Status> {
        let pods = self.state.synced_pods("Pods").await;
        Ok(Response::new(pb::PodsResponse {
            pods: pods.iter().map(Into::into).collect(),
        }))
    }

    async fn evictions(
        &self,
        _: Request<pb::EvictionsRequest>,
    ) -> Result<Response<pb::EvictionsResponse>, Status> {
        let evictions = self
            .state
            .status()
            .evictions
            .iter()
            .map(Into::into)
            .collect();
        Ok(Response::new(pb::EvictionsResponse { evictions }))
    }

    async fn kernel_oom_kills(
        &self,
        _: Request<pb::KernelOomKillsRequest>,
    ) -> Result<Response<pb::KernelOomKillsResponse>, Status> {
        let kills = self.state.oom_kills.list().iter().map(Into::into).collect();
        Ok(Response::new(pb::KernelOomKillsResponse { kills }))
    }

    async fn rank(
        &self,
        _: Request<pb::RankRequest>,
    ) -> Result<Response<pb::RankResponse>, Status> {
        self.state.sync("Rank").await;
        let thresholds = self.state.config.borrow().thresholds.clone();
        let signals = rank_signals(&thresholds);
        let ranker = self.state.ranker.clone().with_thresholds(thresholds);
        let (entries, not_ranked) = ranker.report(&signals).await;
        Ok(Response::new(pb::RankResponse {
            entries: entries.iter().map(Into::into).collect(),
            not_ranked: not_ranked.iter().map(Into::into).collect(),
        }))
    }

    async fn usage(
        &self,
        _: Request<pb::UsageRequest>,
    ) -> Result<Response<pb::UsageResponse>, Status> {
        let pods = self.state.synced_pods("Usage").await;
        let usage = self.state.usage.read(usage_pods(&pods)).await;
        Ok(Response::new((&usage).into()))
    }

    async fn conditions(
        &self,
        _: Request<pb::ConditionsRequest>,
    ) -> Result<Response<pb::ConditionsResponse>, Status> {
        Ok(Response::new((&*self.state.status()).into()))
    }

    async fn status(
        &self,
        _: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let mut s = self.state.config.borrow().clone();
        if !s.serving.kubeconfig.is_empty() {
            let (ok, failed) = self.state.kube.write_counts();
            let failed = failed.into_iter().map(|(k, n)| (k.to_owned(), n));
            s.api_report = Some(super::config::ApiWrites {
                ok,
                failed: failed.collect(),
            });
        }
        Ok(Response::new((&s).into()))
    }

    type WatchEvictionsStream = EvictionStream;

    async fn watch_evictions(
        &self,
        req: Request<pb::WatchEvictionsRequest>,
    ) -> Result<Response<EvictionStream>, Status> {
        let (recorded, next) = {
            let st = self.state.status();
            let from = if req.get_ref().replay {
                0
            } else {
                st.evictions.len()
            };
            (st.recorded.subscribe(), from)
        };
        let watch = Watch {
            status: self.state.status.clone(),
            recorded,
            stopping: self.stopping.clone(),
            next,
        };
        let stream = futures::stream::unfold(watch, |mut w| async move {
            let e = w.next().await?;
            Some((Ok(e), w))
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// One `WatchEvictions` stream's place in the evictions.
struct Watch {
    status: Arc<RwLock<NodeStatus>>,
    recorded: watch::Receiver<usize>,
    stopping: CancellationToken,
    next: usize,
}

impl Watch {
    /// The next eviction, waiting for one; None once criguard stops.
    async fn next(&mut self) -> Option<pb::Eviction> {
        loop {
            // Marked seen before reading: a record made after this wakes
            // `changed` below even if this read already returned it.
            self.recorded.borrow_and_update();
            let found = {
                let st = self.status.read_locked();
                st.evictions.get(self.next).map(pb::Eviction::from)
            };
            if let Some(e) = found {
                self.next += 1;
                return Some(e);
            }
            tokio::select! {
                changed = self.recorded.changed() => changed.ok()?,
                () = self.stopping.cancelled() => return None,
            }
        }
    }
}

/// Serves the admin API on `listener` until `shutdown` resolves; open
/// connections then get [`DRAIN`] to finish and watch streams end.
pub async fn serve(listener: UnixListener, state: AdminState, shutdown: impl Future<Output = ()>) {
    let stopping = CancellationToken::new();
    let service = AdminServer::new(Service {
        state,
        stopping: stopping.clone(),
    });
    let stop = stopping.clone();
    let server = tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming_shutdown(Acceptor::new(listener, "admin"), async move {
            shutdown.await;
            stop.cancel();
        });
    let drained = async {
        stopping.cancelled().await;
        tokio::time::sleep(DRAIN).await;
    };
    tokio::select! {
        result = server => {
            if let Err(err) = result {
                tracing::error!(%err, "admin API server failed");
            }
        }
        () = drained => tracing::warn!(?DRAIN, "admin connections still open after the drain; closing them"),
    }
}
