//! The eviction manager: observe, decide, stop the right pod, observe again.
//!
//! Each round reads the node signals fresh, steps the pure state machine
//! ([`crate::policy::thresholds`]) and, for each memory threshold to act on,
//! stops the first pod of the kubelet's memory ranking: StopContainer for
//! each running container (grace 0 under a hard threshold, the pod's grace
//! capped by `evictionMaxPodGracePeriod` under a soft one) then
//! StopPodSandbox, through the runtime. It then observes again before
//! choosing another victim, so one pressure episode takes no more pods than
//! it needs. [`EvictionManager::run`] starts a round on every housekeeping
//! tick and, between ticks, as soon as a memory event says to look
//! ([`crate::signals::events`]). Disk and pid signals are observed and raise conditions (and so
//! admission refusals); reclaiming them is not implemented yet.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_cri::v1 as cri;
use serde::{Deserialize, Serialize};

use crate::config::{EvictionConfig, Signal, Threshold};
use crate::metrics::{
    ConditionLabels, EvictionLabels, EvictionMetrics, Metrics, SignalLabels, TriggerLabels,
};
use crate::model::{ContainerState, NodeModel, Pod, SandboxState};
use crate::policy::rank::{PodMemory, rank_memory};
use crate::policy::thresholds::{Condition, EvictionState, Observations, condition_of};
use crate::quantity::format_bytes;
use crate::runtime::Upstream;
use crate::signals::events::{MemoryEvent, MemoryEvents};
use crate::signals::node::NodeSources;

/// One eviction, as logged and as `criguard evictions` shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Eviction {
    /// When, ms since the epoch.
    pub at_unix_ms: u64,
    /// `namespace/name`.
    pub pod: String,
    /// Pod UID.
    pub uid: String,
    /// Sandbox id.
    pub sandbox_id: String,
    /// The signal whose threshold was met.
    pub signal: String,
    /// The threshold, as configured.
    pub threshold: String,
    /// The signal's available amount when the pod was chosen.
    pub available: i64,
    /// The pod's working set, bytes.
    pub usage: i64,
    /// The pod's memory request, bytes.
    pub request: i64,
    /// Grace given to its containers, seconds.
    pub grace_s: i64,
    /// The kubelet-style message.
    pub message: String,
    /// Decided but not carried out (`--dry-run`).
    pub dry_run: bool,
}

/// What the rest of criguard needs to know: conditions, evicted pods, history.
#[derive(Clone, Debug, Default)]
pub struct NodeStatus {
    /// Node conditions now.
    pub conditions: BTreeSet<Condition>,
    /// Pod UID → the condition it was evicted for (while it holds).
    pub evicted: HashMap<String, Condition>,
    /// Every eviction since start.
    pub evictions: Vec<Eviction>,
    /// The last observations (none before the first round).
    pub observations: Option<Observations>,
}

/// The eviction manager's state and handles.
pub struct EvictionManager {
    config: EvictionConfig,
    sources: NodeSources,
    model: Arc<RwLock<NodeModel>>,
    upstream: Upstream,
    status: Arc<RwLock<NodeStatus>>,
    state: EvictionState,
    dry_run: bool,
    metrics: EvictionMetrics,
}

fn is_memory(s: Signal) -> bool {
    matches!(
        s,
        Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable
    )
}

impl EvictionManager {
    /// A manager acting on `config` with the given sources and handles.
    pub fn new(
        config: EvictionConfig,
        sources: NodeSources,
        model: Arc<RwLock<NodeModel>>,
        upstream: Upstream,
        status: Arc<RwLock<NodeStatus>>,
        dry_run: bool,
    ) -> Self {
        Self {
            config,
            sources,
            model,
            upstream,
            status,
            state: EvictionState::default(),
            dry_run,
            metrics: Metrics::new().eviction,
        }
    }

    /// The same manager, publishing its figures in `metrics`.
    pub fn with_metrics(mut self, metrics: EvictionMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    fn publish(&self, obs: &Observations, conditions: &BTreeSet<Condition>) {
        let label = |s: Signal| SignalLabels {
            signal: s.to_string(),
        };
        for (sig, o) in &obs.signals {
            self.metrics
                .available
                .get_or_create(&label(*sig))
                .set(o.available);
        }
        for t in &self.config.hard {
            if let Some(o) = obs.get(&t.signal) {
                let line = t.amount.resolve(o.capacity) as i64;
                self.metrics
                    .threshold
                    .get_or_create(&label(t.signal))
                    .set(line);
            }
        }
        for c in [
            Condition::MemoryPressure,
            Condition::DiskPressure,
            Condition::PIDPressure,
        ] {
            let on = i64::from(conditions.contains(&c));
            let labels = ConditionLabels {
                condition: format!("{c:?}"),
            };
            self.metrics.condition.get_or_create(&labels).set(on);
        }
    }

    fn observe(&mut self) -> (Observations, Vec<Threshold>) {
        let obs = self.sources.observe();
        let d = self.state.step(&self.config, &obs, obs.at);
        self.publish(&obs, &d.conditions);
        let mut st = self.status.write().unwrap_or_else(|e| e.into_inner());
        st.evicted.retain(|_, c| d.conditions.contains(c));
        st.conditions = d.conditions;
        st.observations = Some(obs.clone());
        (obs, d.act_on)
    }

    /// Runs rounds until `stopped` resolves: on every housekeeping tick; at
    /// once on every memory event from `events` (`None`: no events); and
    /// when a soft threshold's grace period or a condition's transition
    /// period runs out. After each round the events are re-armed from its
    /// last observations. A round in progress finishes first, and a slow
    /// round delays the next tick instead of piling rounds up.
    pub async fn run(
        mut self,
        mut events: Option<MemoryEvents>,
        stopped: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(stopped);
        let mut tick = tokio::time::interval(self.config.housekeeping_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut deadline = None;
        loop {
            let trigger = tokio::select! {
                _ = tick.tick() => "tick",
                () = until(deadline) => "deadline",
                ev = next_event(&mut events) => {
                    tracing::debug!(watch = %ev.watch, detail = %ev.detail, "memory event: observing now");
                    ev.watch.kind()
                }
                () = &mut stopped => return,
            };
            if let Some(ev) = events.as_mut() {
                ev.drain();
            }
            let labels = TriggerLabels {
                trigger: trigger.to_owned(),
            };
            self.metrics.rounds.get_or_create(&labels).inc();
            self.round().await;
            let Some(obs) = self.last_observations() else {
                continue;
            };
            deadline = self.state.next_deadline(&self.config, obs.at);
            if let Some(mut ev) = events.take() {
                // Registering a memcg threshold waits for an RCU grace period
                // in the kernel (milliseconds): off the proxy's thread.
                let rearmed = tokio::task::spawn_blocking(move || {
                    ev.rearm(&obs);
                    ev
                });
                events = match rearmed.await {
                    Ok(ev) => Some(ev),
                    Err(err) => {
                        tracing::error!(%err, "re-arming memory events failed; the housekeeping tick goes on alone");
                        None
                    }
                };
            }
        }
    }

    /// The last round's last observations.
    fn last_observations(&self) -> Option<Observations> {
        let st = self.status.read().unwrap_or_else(|e| e.into_inner());
        st.observations.clone()
    }

    /// One round; returns the evictions it made.
    pub async fn round(&mut self) -> Vec<Eviction> {
        let mut made = Vec::new();
        let mut tried = BTreeSet::new();
        loop {
            let (obs, act_on) = self.observe();
            let Some(t) = act_on.into_iter().find(|t| is_memory(t.signal)) else {
                break;
            };
            let Some((pod, usage)) = self.memory_victim(&tried) else {
                tracing::warn!(threshold = %t, "memory threshold met but no pod can be evicted");
                break;
            };
            tried.insert(pod.sandbox_id.clone());
            let e = self.evict(&pod, usage, &t, &obs).await;
            made.push(e);
            if self.dry_run {
                break; // nothing changed: another pass would choose the same pod
            }
        }
        made
    }

    /// The first pod of the kubelet's memory ranking, with its working set.
    fn memory_victim(&self, tried: &BTreeSet<String>) -> Option<(Pod, i64)> {
        let pods: Vec<Pod> = self.model.read().unwrap_or_else(|e| e.into_inner()).pods();
        let running: Vec<&Pod> = pods
            .iter()
            .filter(|p| p.state == SandboxState::Ready && !tried.contains(&p.sandbox_id))
            .collect();
        let usage: HashMap<&str, i64> = running
            .iter()
            .filter_map(|p| {
                Some((
                    p.sandbox_id.as_str(),
                    self.sources
                        .cgroups
                        .memory(&p.cgroup_parent)
                        .ok()?
                        .working_set as i64,
                ))
            })
            .collect();
        let candidates: Vec<PodMemory> = running
            .iter()
            .map(|p| PodMemory {
                sandbox_id: p.sandbox_id.clone(),
                priority: p.priority,
                request: p.memory_request(),
                usage: usage.get(p.sandbox_id.as_str()).copied(),
                critical: p.critical,
            })
            .collect();
        let first = rank_memory(&candidates).first()?.sandbox_id.clone();
        let pod = running.into_iter().find(|p| p.sandbox_id == first)?.clone();
        let u = usage.get(first.as_str()).copied().unwrap_or(0);
        Some((pod, u))
    }

    async fn evict(
        &mut self,
        pod: &Pod,
        usage: i64,
        t: &Threshold,
        obs: &Observations,
    ) -> Eviction {
        let grace_s = match t.grace_period {
            None => 0,
            Some(_) => {
                let cap = self
                    .config
                    .max_pod_grace_period
                    .map_or(0, |d| d.as_secs() as i64);
                pod.grace_period_s.unwrap_or(30).min(cap)
            }
        };
        let available = obs.get(&t.signal).map_or(0, |o| o.available);
        let heaviest = pod
            .containers
            .values()
            .filter(|c| c.state == ContainerState::Running)
            .filter_map(|c| {
                Some((
                    c,
                    self.sources
                        .cgroups
                        .memory(&c.cgroup_path)
                        .ok()?
                        .working_set as i64,
                ))
            })
            .max_by_key(|(_, u)| *u);
        let mut message = format!(
            "The node was low on resource: memory. Threshold quantity: {}, available: {}. ",
            t.amount_display(),
            format_bytes(available.max(0) as u64)
        );
        if let Some((c, u)) = heaviest {
            message.push_str(&format!(
                "Container {} was using {}, request is {}, has larger consumption of memory. ",
                c.name,
                format_bytes(u.max(0) as u64),
                format_bytes(c.memory_request.max(0) as u64)
            ));
        }
        let e = Eviction {
            at_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            pod: format!("{}/{}", pod.namespace, pod.name),
            uid: pod.uid.clone(),
            sandbox_id: pod.sandbox_id.clone(),
            signal: t.signal.to_string(),
            threshold: t.to_string(),
            available,
            usage,
            request: pod.memory_request(),
            grace_s,
            message: message.trim_end().to_owned(),
            dry_run: self.dry_run,
        };
        tracing::warn!(
            pod = %e.pod, uid = %e.uid, signal = %e.signal, threshold = %e.threshold, available = e.available,
            usage = e.usage, request = e.request, qos = ?pod.qos, priority = pod.priority, grace_s, dry_run = self.dry_run,
            "evicting pod: {}", e.message
        );
        if !self.dry_run {
            self.stop(pod, grace_s).await;
            let labels = EvictionLabels {
                signal: e.signal.clone(),
                qos: format!("{:?}", pod.qos),
            };
            self.metrics.evictions.get_or_create(&labels).inc();
            if let Some(since) = self.state.met_since(t) {
                self.metrics
                    .pressure_to_action
                    .observe(since.elapsed().as_secs_f64());
            }
            let mut m = self.model.write().unwrap_or_else(|e| e.into_inner());
            m.set_sandbox_state(&pod.sandbox_id, SandboxState::NotReady);
        }
        let mut st = self.status.write().unwrap_or_else(|e| e.into_inner());
        if !self.dry_run {
            st.evicted.insert(pod.uid.clone(), condition_of(t.signal));
        }
        st.evictions.push(e.clone());
        e
    }

    async fn stop(&self, pod: &Pod, grace_s: i64) {
        let mut rt = self.upstream.runtime();
        for c in pod
            .containers
            .values()
            .filter(|c| c.state == ContainerState::Running)
        {
            let req = cri::StopContainerRequest {
                container_id: c.id.clone(),
                timeout: grace_s,
            };
            if let Err(err) = rt.stop_container(req).await {
                tracing::warn!(container = %c.id, %err, "StopContainer failed; StopPodSandbox follows");
            }
        }
        let req = cri::StopPodSandboxRequest {
            pod_sandbox_id: pod.sandbox_id.clone(),
        };
        if let Err(err) = rt.stop_pod_sandbox(req).await {
            tracing::error!(sandbox = %pod.sandbox_id, %err, "StopPodSandbox failed");
        }
    }
}

/// Resolves at `deadline`, or never without one.
async fn until(deadline: Option<std::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

/// The next memory event, or never when there are no events.
async fn next_event(events: &mut Option<MemoryEvents>) -> MemoryEvent {
    match events {
        Some(e) => e.next().await,
        None => std::future::pending().await,
    }
}
