//! The eviction manager: observe, decide, reclaim, stop the right pod,
//! observe again.
//!
//! Each round reads the node signals fresh, steps the pure state machine
//! ([`crate::policy::thresholds`]) and handles the thresholds to act on,
//! memory first, then pids, then disk:
//! - **disk** (`nodefs.*`, `imagefs.*`): node-level reclaim first
//!   ([`crate::policy::reclaim::node_actions`]: dead containers, then unused
//!   images, asked for the deficit); if a fresh observation still meets the
//!   threshold, the pod with the largest usage that the signal counts goes,
//!   and its containers are removed with their logs so that the space
//!   actually comes back (its emptyDirs stay: they are the kubelet's);
//! - **memory**: the first pod of the kubelet's memory ranking;
//! - **pid**: the pod with the most tasks among the lowest priority.
//!
//! A pod is stopped with StopContainer for each running container (grace 0
//! under a hard threshold, the pod's grace capped by
//! `evictionMaxPodGracePeriod` under a soft one) then StopPodSandbox,
//! through the runtime. With a grace period of 0 its processes are first
//! killed through its cgroup ([`crate::cgroup::kill`]), so the memory
//! comes back before the runtime has handled the stops. Stops are awaited and rounds never overlap, and the
//! manager observes again after each one. For disk, where containerd gives
//! the space of removed writable layers back in the background, the reclaim
//! each eviction started counts as in flight until the signal shows it (or
//! 10 s pass), so one pressure episode takes no more pods than it needs.
//!
//! [`EvictionManager::run`] starts a round on every housekeeping tick and,
//! between ticks, as soon as a memory event says to look
//! ([`crate::signals::events`]).
//!
//! With a state directory the manager remembers, across restarts, when each
//! condition's threshold was last observed met and the latest evictions
//! ([`evicted::Remembered`], wall-clock times): a restarted manager keeps a
//! condition until the transition period has passed since that
//! observation, as the kubelet's state machine would have without the
//! restart, and `criguard evictions` still lists what it did.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use k8s_cri::v1 as cri;

use crate::cgroup::kill;
use crate::config::{EvictionConfig, Signal, Threshold};
use crate::kube::{KubeReport, PodEviction};
use crate::metrics::{
    ConditionLabels, EvictionLabels, EvictionMetrics, Metrics, SignalLabels, TriggerLabels,
};
use crate::model::{ContainerState, NodeModel, Pod, SandboxState};
pub use crate::node_state::{Eviction, NodeStatus};
use crate::policy::reclaim::{InFlight, NodeAction, PodUse, node_actions, pending, plan_victims};
use crate::policy::thresholds::{Condition, EvictionState, Observations, deficit};
use crate::quantity::format_bytes;
use crate::reclaim::container_gc::{ContainerGc, remove_container};
use crate::reclaim::evicted::{self, EvictedStore};
use crate::reclaim::image_gc::ImageGc;
use crate::reclaim::rank::{Ranker, Victim};
use crate::runtime::{CALL_DEADLINE, Upstream, bounded};
use crate::signal::Ranking;
use crate::signals::disk::dedicated_imagefs;
use crate::signals::events::{MemoryEvent, MemoryEvents};
use crate::signals::node::NodeSources;
use crate::signals::usage::UsageReader;

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
    node_reclaim: Option<(ContainerGc, ImageGc)>,
    ranker: Ranker,
    in_flight: Vec<InFlight>,
    store: Option<EvictedStore>,
    report: Option<KubeReport>,
    pressure: PressureMemory,
    reloads: Option<tokio::sync::watch::Receiver<Arc<Reloadable>>>,
}

/// What a configuration reload changes in a running manager: everything
/// else (the state machine's timers, the pressure memory, the evicted
/// pods, the model) is kept.
#[derive(Clone, Debug)]
pub struct Reloadable {
    /// Thresholds, grace and transition periods, housekeeping interval.
    pub config: EvictionConfig,
    /// Decide and log evictions, stop nothing.
    pub dry_run: bool,
    /// The node-level collectors, with their current policies.
    pub node_reclaim: Option<(ContainerGc, ImageGc)>,
}

/// When each condition's threshold was last observed met (ms since the
/// epoch), and what of it is saved.
#[derive(Debug, Default)]
struct PressureMemory {
    last: BTreeMap<Condition, u64>,
    /// Changed since the last save.
    dirty: bool,
    /// Whether the last step found a threshold met.
    met: bool,
    /// The pressure just ended: the last observations are final, save them.
    ended: bool,
    saved_at: Option<Instant>,
    saved_held: BTreeSet<Condition>,
    saved_evictions: usize,
    /// A save that passed its deadline and has not finished.
    saving: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

/// The pressure memory is saved at most this often while only the times
/// advance (a change in the conditions held, an eviction, or the end of
/// the pressure, whose last observations are then final, saves at once).
const PRESSURE_SAVE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a disk eviction's reclaim counts as on its way: containerd
/// removes snapshots in its background garbage collection, within seconds.
const IN_FLIGHT_FOR: std::time::Duration = std::time::Duration::from_secs(10);

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
            ranker: Ranker::new(model.clone(), sources.clone(), None),
            config,
            sources,
            model,
            upstream,
            status,
            state: EvictionState::default(),
            dry_run,
            metrics: Metrics::new().eviction,
            node_reclaim: None,
            in_flight: Vec::new(),
            store: None,
            report: None,
            pressure: PressureMemory::default(),
            reloads: None,
        }
    }

    /// The same manager, taking each new value of `reloads` (a reloaded
    /// configuration) between rounds, and running a round at once with it.
    /// The state machine keeps its timers across the change (a threshold
    /// met under the old configuration and still met keeps its grace
    /// timer), as do the pressure memory and the evicted pods.
    pub fn with_reloads(mut self, reloads: tokio::sync::watch::Receiver<Arc<Reloadable>>) -> Self {
        self.reloads = Some(reloads);
        self
    }

    /// Takes up a reloaded configuration.
    fn reload(&mut self, r: &Reloadable) {
        self.config = r.config.clone();
        self.dry_run = r.dry_run;
        if r.node_reclaim.is_some() {
            self.node_reclaim = r.node_reclaim.clone();
        }
    }

    /// The same manager, saving the evicted pods in `store` whenever they
    /// change (each eviction before the pod is stopped; refusals and
    /// forgotten records after each round), and its pressure memory; what
    /// the last run remembered is taken up at once: a condition observed
    /// less than the transition period ago holds from now on.
    pub fn with_evicted_store(mut self, store: EvictedStore) -> Self {
        let now = evicted::unix_ms_now();
        let remembered = store.load_remembered();
        self.pressure.last = remembered.observations(now);
        self.pressure.saved_evictions = remembered.evictions.len();
        let held = evicted::held(
            &self.pressure.last,
            now,
            self.config.pressure_transition_period,
        );
        if !held.is_empty() {
            tracing::info!(conditions = ?held, "pressure remembered from before the restart: its conditions hold until the transition period has passed since it was last observed");
        }
        self.pressure.saved_held = held.clone();
        {
            let mut st = self.status.write().unwrap_or_else(|e| e.into_inner());
            st.conditions = held;
            st.dry_run = self.dry_run;
        }
        self.store = Some(store);
        self
    }

    /// The same manager, reporting evictions and pressure to the Kubernetes
    /// API: the pod's status before it is stopped (waiting at most the
    /// report's bound), then an event; criguard's node conditions and taints.
    pub fn with_report(mut self, report: KubeReport) -> Self {
        self.report = Some(report);
        self
    }

    /// The same manager, reclaiming disk at node level (dead containers,
    /// unused images) before it evicts for a disk signal.
    pub fn with_node_reclaim(mut self, containers: ContainerGc, images: ImageGc) -> Self {
        self.node_reclaim = Some((containers, images));
        self
    }

    /// The same manager, ranking pods under disk pressure by the usage
    /// `reader` reads (without it, disk signals get node-level reclaim only).
    pub fn with_usage(mut self, reader: UsageReader) -> Self {
        self.ranker = Ranker::new(self.model.clone(), self.sources.clone(), Some(reader));
        self
    }

    /// The same manager, publishing its figures in `metrics`.
    pub fn with_metrics(mut self, metrics: EvictionMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    fn publish(&self, obs: &Observations, conditions: &BTreeSet<Condition>) {
        let label = |signal: Signal| SignalLabels { signal };
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
            let labels = ConditionLabels { condition: c };
            self.metrics.condition.get_or_create(&labels).set(on);
        }
    }

    async fn observe(&mut self) -> (Observations, Vec<Threshold>) {
        let obs = self.sources.observe_bounded().await;
        let d = self.state.step(&self.config, &obs, obs.at);
        let mut conditions = d.conditions;
        conditions.extend(self.remember_pressure(&obs));
        self.publish(&obs, &conditions);
        if let Some(r) = &self.report {
            // A dry run writes no condition or taint (and clears what an
            // earlier configuration set): it must not change scheduling.
            let none = BTreeSet::new();
            r.node_conditions(if self.dry_run { &none } else { &conditions });
        }
        let mut st = self.status.write().unwrap_or_else(|e| e.into_inner());
        st.conditions = conditions;
        st.dry_run = self.dry_run;
        st.observations = Some(obs.clone());
        (obs, d.act_on)
    }

    /// Notes the conditions whose thresholds the step just found met, at
    /// the wall-clock time of `obs`; returns the conditions the memory
    /// holds then (the remembered ones from before a restart included).
    fn remember_pressure(&mut self, obs: &Observations) -> BTreeSet<Condition> {
        let at = wall_ms(obs.at);
        let mut met = false;
        for t in self.config.hard.iter().chain(&self.config.soft) {
            if self.state.met_since(t).is_some() {
                met = true;
                let c = t.signal.condition();
                if self.pressure.last.insert(c, at) != Some(at) {
                    self.pressure.dirty = true;
                }
            }
        }
        if self.pressure.met && !met && self.pressure.dirty {
            self.pressure.ended = true;
        }
        self.pressure.met = met;
        evicted::held(
            &self.pressure.last,
            at,
            self.config.pressure_transition_period,
        )
    }

    /// The instant the remembered pressure next runs out, if it holds.
    fn pressure_deadline(&self, obs: &Observations) -> Option<Instant> {
        let at = wall_ms(obs.at);
        evicted::next_expiry(
            &self.pressure.last,
            at,
            self.config.pressure_transition_period,
        )
        .map(|d| obs.at + d)
    }

    /// Saves the pressure memory and the latest evictions when they
    /// changed: at once when the conditions held or the evictions did,
    /// else at most every [`PRESSURE_SAVE_EVERY`].
    async fn save_pressure(&mut self) {
        self.save_pressure_with(None).await;
    }

    /// [`Self::save_pressure`] with `new`, an eviction about to be
    /// published, among the evictions saved: what `criguard evictions`
    /// lists is on disk before it is listed (unless the state directory
    /// fails, which delays the listing by [`evicted::STATE_WRITE_DEADLINE`]
    /// at most), so a crash right after cannot lose it.
    async fn save_pressure_with(&mut self, new: Option<&Eviction>) {
        let Some(store) = self.store.clone() else {
            return;
        };
        let (held, snapshot, evictions) = {
            let st = self.status.read().unwrap_or_else(|e| e.into_inner());
            let held = st.conditions.clone();
            let mut all = std::borrow::Cow::Borrowed(&st.evictions[..]);
            if let Some(e) = new {
                all.to_mut().push(e.clone());
            }
            let urgent = held != self.pressure.saved_held
                || all.len() != self.pressure.saved_evictions
                || self.pressure.ended;
            let due = self.pressure.dirty
                && self
                    .pressure
                    .saved_at
                    .is_none_or(|t| t.elapsed() >= PRESSURE_SAVE_EVERY);
            if !urgent && !due {
                return;
            }
            let r = evicted::Remembered::of(&self.pressure.last, &all);
            (held, r, all.len())
        };
        if self
            .pressure
            .saving
            .as_ref()
            .is_some_and(|h| !h.is_finished())
        {
            return; // the last save is stuck; this one waits for it
        }
        let mut save = tokio::task::spawn_blocking(move || store.save_remembered(&snapshot));
        let saved = match tokio::time::timeout(evicted::STATE_WRITE_DEADLINE, &mut save).await {
            Ok(r) => r,
            Err(_) => {
                tracing::warn!(deadline = ?evicted::STATE_WRITE_DEADLINE, "saving the pressure memory has not finished (a hung state directory?); no other save starts until it does");
                self.pressure.saving = Some(save);
                return;
            }
        };
        self.pressure.saving = None;
        match saved {
            Ok(Ok(())) => {
                self.pressure.dirty = false;
                self.pressure.ended = false;
                self.pressure.saved_at = Some(Instant::now());
                self.pressure.saved_held = held;
                self.pressure.saved_evictions = evictions;
            }
            Ok(Err(err)) => tracing::error!(%err, "cannot save the pressure memory"),
            Err(err) => tracing::error!(%err, "saving the pressure memory failed"),
        }
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
                r = next_reload(&mut self.reloads) => {
                    let every = self.config.housekeeping_interval;
                    self.reload(&r);
                    if let Some(ev) = events.as_mut() {
                        ev.retarget(&self.config);
                    }
                    if self.config.housekeeping_interval != every {
                        tick = tokio::time::interval(self.config.housekeeping_interval);
                        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                        tick.reset();
                    }
                    tracing::info!(dry_run = self.dry_run, "eviction manager: reloaded configuration taken up; observing now");
                    "reload"
                }
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
            let labels = TriggerLabels { trigger };
            self.metrics.rounds.get_or_create(&labels).inc();
            self.round().await;
            evicted::persist(&self.status, self.store.as_ref()).await;
            self.save_pressure().await;
            let Some(obs) = self.last_observations() else {
                continue;
            };
            deadline = [
                self.state.next_deadline(&self.config, obs.at),
                self.pressure_deadline(&obs),
            ]
            .into_iter()
            .flatten()
            .filter(|d| *d > obs.at)
            .min();
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
        let mut reclaimed = BTreeSet::new();
        loop {
            let (obs, mut act_on) = self.observe().await;
            act_on.sort_by_key(|t| t.signal.ranking());
            let Some(t) = act_on.into_iter().next() else {
                break;
            };
            let ranking = Instant::now();
            let victim = match t.signal.ranking() {
                Ranking::Memory => self.ranker.memory(&tried).await.into_iter().next(),
                Ranking::Pids => self.ranker.pids(&tried).await.into_iter().next(),
                Ranking::Disk => {
                    if reclaimed.insert(t.signal) && self.reclaim_node(&t, &obs).await {
                        continue; // observe again: it may have been enough
                    }
                    let available = obs.get(&t.signal).map_or(0, |o| o.available);
                    let need = deficit(&t, &obs, true).unwrap_or(0);
                    let coming = pending(&mut self.in_flight, t.signal, available, Instant::now());
                    if coming > 0 && coming >= need {
                        tracing::info!(threshold = %t, need, coming, "reclaim already on its way covers the deficit; no other pod is chosen");
                        break;
                    }
                    self.disk_victim(&t, need, &tried).await
                }
            };
            let Some(victim) = victim else {
                tracing::warn!(threshold = %t, "threshold met but no pod can be evicted");
                break;
            };
            tracing::debug!(
                threshold = %t,
                observe_ms = ms(ranking.saturating_duration_since(obs.at)),
                rank_ms = ms(ranking.elapsed()),
                "victim chosen"
            );
            tried.insert(victim.pod.sandbox_id.clone());
            let e = self.evict(&victim, &t, &obs).await;
            made.push(e);
            if self.dry_run {
                break; // nothing changed: another pass would choose the same pod
            }
        }
        made
    }

    /// Node-level reclaim for a disk threshold, each action asked for what
    /// is still missing; true when something ran (the caller observes
    /// again). A dry run only logs what would run.
    async fn reclaim_node(&mut self, t: &Threshold, obs: &Observations) -> bool {
        let Some((containers, images)) = self.node_reclaim.clone() else {
            return false;
        };
        let dedicated = dedicated_imagefs(&self.sources.nodefs, &self.sources.imagefs);
        let actions = node_actions(t.signal, dedicated);
        if self.dry_run {
            tracing::info!(threshold = %t, ?actions, "dry run: node-level reclaim skipped");
            return false;
        }
        let mut need = deficit(t, obs, true).unwrap_or(0);
        for (i, action) in actions.iter().enumerate() {
            if i > 0 {
                match deficit(t, &self.sources.observe_bounded().await, true) {
                    None => break,
                    Some(d) => need = d,
                }
            }
            let freed = match action {
                NodeAction::ContainerGc => containers.reclaim().await.freed,
                NodeAction::ImageGc => {
                    // Bytes are asked for; for inodes, every unused image.
                    let bytes = if t.signal.is_bytes() { need } else { u64::MAX };
                    images.free(bytes).await.freed
                }
            };
            tracing::info!(threshold = %t, ?action, freed, "node-level reclaim");
        }
        !actions.is_empty()
    }

    /// The first pod of the disk ranking; logs how many pods the deficit
    /// is expected to take.
    async fn disk_victim(
        &self,
        t: &Threshold,
        need: u64,
        tried: &BTreeSet<String>,
    ) -> Option<Victim> {
        let ranked = self.ranker.disk(t.signal, tried).await;
        let uses: Vec<PodUse> = ranked.iter().map(Victim::as_use).collect();
        let refs: Vec<&PodUse> = uses.iter().collect();
        let plan = plan_victims(&refs, need);
        tracing::info!(
            threshold = %t, need, planned = plan.len(),
            victims = ?plan.iter().map(|p| p.sandbox_id.as_str()).collect::<Vec<_>>(),
            "disk pressure: pods expected to cover the deficit, evicted one at a time"
        );
        ranked.into_iter().next()
    }

    async fn evict(&mut self, v: &Victim, t: &Threshold, obs: &Observations) -> Eviction {
        let pod = &v.pod;
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
        let message = eviction_message(t, available, v.heaviest.as_ref());
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
            usage: v.usage.unwrap_or(0),
            request: v.request,
            grace_s,
            message,
            dry_run: self.dry_run,
        };
        tracing::warn!(
            pod = %e.pod, uid = %e.uid, signal = %e.signal, threshold = %e.threshold, available = e.available,
            usage = e.usage, request = e.request, qos = ?pod.qos, priority = pod.priority, grace_s, dry_run = self.dry_run,
            "evicting pod: {}", e.message
        );
        if !self.dry_run {
            let saving = evicted::remember(&self.status, self.store.as_ref(), &e);
            if let Some(r) = &self.report {
                let offending = v.heaviest.as_ref().map(|(name, used, _)| {
                    (
                        name.clone(),
                        crate::quantity::format_bytes((*used).max(0) as u64),
                    )
                });
                r.pod_evicted(PodEviction {
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                    uid: pod.uid.clone(),
                    message: e.message.clone(),
                    resource: t.signal.resource().name().to_owned(),
                    offending: offending.filter(|_| t.signal.is_bytes()),
                })
                .await;
            }
            // After the API report: a Failed phase must reach the API before
            // the kubelet can see the pod's containers die ([`crate::kube`]).
            if grace_s == 0 {
                self.kill_first(pod, t);
            }
            // Published now, when the pod is killed (or its stop begins),
            // not when the runtime answers: a hung runtime must not hide
            // the eviction from `criguard evictions`, WatchEvictions and the
            // metrics. NotReady in the model keeps the next round from
            // choosing the pod again while its stop is still pending.
            let labels = EvictionLabels {
                signal: t.signal,
                qos: pod.qos,
            };
            self.metrics.evictions.get_or_create(&labels).inc();
            self.model
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .set_sandbox_state(&pod.sandbox_id, SandboxState::NotReady);
            self.save_pressure_with(Some(&e)).await;
            self.status
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .record_eviction(e.clone());
            let since = self.state.met_since(t);
            let stopped = self.stop(pod, grace_s).await;
            // The action is StopPodSandbox returning: timed before the
            // evicted pods' save (an fsync) is waited for.
            match (stopped, since) {
                (true, Some(since)) => self
                    .metrics
                    .pressure_to_action
                    .observe(since.elapsed().as_secs_f64()),
                (true, None) => {}
                (false, _) => {
                    let retry = StopRetry {
                        upstream: self.upstream.clone(),
                        sandbox_id: pod.sandbox_id.clone(),
                        since,
                        metric: self.metrics.pressure_to_action.clone(),
                    };
                    tokio::spawn(retry.run());
                }
            }
            if let Some(saving) = saving
                && tokio::time::timeout(evicted::STATE_WRITE_DEADLINE, saving)
                    .await
                    .is_err()
            {
                tracing::warn!(deadline = ?evicted::STATE_WRITE_DEADLINE, "saving the evicted pods has not finished (a hung state directory?); the round goes on, the record stays in memory");
            }
            if t.signal.ranking() == Ranking::Disk {
                self.in_flight.push(InFlight {
                    signal: t.signal,
                    amount: v.reclaimable,
                    baseline: available,
                    until: Instant::now() + IN_FLIGHT_FOR,
                });
                // Stopping frees no disk: the writable layers and logs go
                // with the containers. The kubelet would do this when it
                // deletes the evicted pod; it does not know of this eviction.
                let mut rt = self.upstream.runtime();
                for c in pod.containers.values() {
                    remove_container(&mut rt, &c.id).await;
                }
            }
            return e;
        }
        let mut st = self.status.write().unwrap_or_else(|e| e.into_inner());
        st.record_eviction(e.clone());
        e
    }

    /// Under a grace period of 0, kills `pod`'s processes through its
    /// cgroup before the runtime hears of it ([`kill`]): the memory comes
    /// back at once, not after containerd and the shims handled the stops.
    /// With the Kubernetes API configured this follows the status write
    /// (waited for at most its bound), as the runtime's stop does.
    fn kill_first(&self, pod: &Pod, t: &Threshold) {
        let Some(cgroup) = pod.cgroup() else {
            return;
        };
        if !kill::is_pod_cgroup_of(&cgroup, &pod.uid) {
            tracing::info!(
                sandbox = %pod.sandbox_id, %cgroup, uid = %pod.uid,
                "the pod's cgroup is not named for its UID; only the runtime stops it"
            );
            return;
        }
        match kill::kill_cgroup(&self.sources.cgroups, &cgroup) {
            Ok(killed) => {
                if let Some(since) = self.state.met_since(t) {
                    self.metrics
                        .pressure_to_kill
                        .observe(since.elapsed().as_secs_f64());
                }
                tracing::debug!(sandbox = %pod.sandbox_id, %cgroup, ?killed, "pod's processes killed");
            }
            Err(err) => tracing::warn!(
                sandbox = %pod.sandbox_id, %cgroup, %err,
                "could not kill the pod's processes through its cgroup; the runtime's stop follows"
            ),
        }
    }

    /// Stops `pod` as the kubelet does: StopContainer for every running
    /// container at once, then StopPodSandbox, each within its deadline
    /// ([`CALL_DEADLINE`], plus the grace period for StopContainer). True
    /// when StopPodSandbox succeeded; false when the runtime did not answer
    /// or failed, and the caller hands the stop to a [`StopRetry`]. A
    /// StopContainer the runtime did not answer in time skips the
    /// StopPodSandbox (it would wait as long again on the same runtime).
    async fn stop(&self, pod: &Pod, grace_s: i64) -> bool {
        let started = Instant::now();
        let deadline = CALL_DEADLINE + std::time::Duration::from_secs(grace_s.max(0) as u64);
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

/// Whether a call's failure says the runtime is not answering (down,
/// hung) rather than refusing this one call.
fn runtime_hung(err: &tonic::Status) -> bool {
    matches!(
        err.code(),
        tonic::Code::DeadlineExceeded | tonic::Code::Unavailable | tonic::Code::Cancelled
    )
}

/// The waits between StopPodSandbox attempts: doubling from 1 s to 30 s.
pub fn stop_retry_wait(attempt: u32) -> std::time::Duration {
    std::time::Duration::from_secs(1u64 << attempt.min(5)).min(std::time::Duration::from_secs(30))
}

/// An evicted pod's StopPodSandbox that the runtime did not complete (it
/// was down or hung): tried again, each attempt within [`CALL_DEADLINE`],
/// until the runtime answers. Its processes were killed through the
/// cgroup already; this tells the runtime, so that the sandbox and its
/// network are released as after any eviction.
struct StopRetry {
    upstream: Upstream,
    sandbox_id: String,
    since: Option<Instant>,
    metric: prometheus_client::metrics::histogram::Histogram,
}

impl StopRetry {
    async fn run(self) {
        let started = Instant::now();
        for attempt in 0u32.. {
            tokio::time::sleep(stop_retry_wait(attempt)).await;
            let mut rt = self.upstream.runtime();
            let req = cri::StopPodSandboxRequest {
                pod_sandbox_id: self.sandbox_id.clone(),
            };
            match bounded("StopPodSandbox", CALL_DEADLINE, rt.stop_pod_sandbox(req)).await {
                Ok(_) => {
                    if let Some(since) = self.since {
                        self.metric.observe(since.elapsed().as_secs_f64());
                    }
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

/// The wall-clock time of monotonic instant `at`, ms since the epoch.
fn wall_ms(at: Instant) -> u64 {
    let ago = at.elapsed().as_millis() as u64;
    evicted::unix_ms_now().saturating_sub(ago)
}

/// A duration in milliseconds, for logs.
fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Resolves at `deadline`, or never without one.
async fn until(deadline: Option<std::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

/// The next memory event, or never when there are no events.
/// The next reloaded configuration; pending forever without reloads (or
/// once their sender is gone).
async fn next_reload(
    reloads: &mut Option<tokio::sync::watch::Receiver<Arc<Reloadable>>>,
) -> Arc<Reloadable> {
    if let Some(rx) = reloads.as_mut() {
        match rx.changed().await {
            Ok(()) => return rx.borrow_and_update().clone(),
            Err(_) => *reloads = None,
        }
    }
    std::future::pending().await
}

async fn next_event(events: &mut Option<MemoryEvents>) -> MemoryEvent {
    match events {
        Some(e) => e.next().await,
        None => std::future::pending().await,
    }
}

/// The kubelet's message: which resource, the threshold, what was
/// available, and which container used how much against which request;
/// every sentence ends with ". ", trailing space included, as the kubelet's
/// (`pkg/kubelet/eviction/helpers.go`), so the API report matches it.
pub fn eviction_message(
    t: &Threshold,
    available: i64,
    heaviest: Option<&(String, i64, i64)>,
) -> String {
    let res = t.signal.resource().name();
    let show = |v: i64| {
        if t.signal.is_bytes() {
            format_bytes(v.max(0) as u64)
        } else {
            v.to_string()
        }
    };
    let mut m = format!(
        "The node was low on resource: {res}. Threshold quantity: {}, available: {}. ",
        t.amount_display(),
        show(available)
    );
    if let Some((name, used, request)) = heaviest {
        m.push_str(&format!(
            "Container {name} was using {}, request is {}, has larger consumption of {res}. ",
            show(*used),
            show(*request)
        ));
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Amount;

    fn threshold(signal: Signal, amount: Amount) -> Threshold {
        Threshold::hard(signal, amount)
    }

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

    #[test]
    fn messages_name_the_kubelets_resource_and_units() {
        let t = threshold(Signal::NodefsAvailable, Amount::Quantity(64 << 20));
        let m = eviction_message(&t, 10 << 20, Some(&("writer".into(), 80 << 20, 0)));
        assert_eq!(
            m,
            "The node was low on resource: ephemeral-storage. Threshold quantity: 64Mi, available: 10Mi. \
             Container writer was using 80Mi, request is 0, has larger consumption of ephemeral-storage. "
        );
        let t = threshold(Signal::PidAvailable, Amount::Quantity(20));
        let m = eviction_message(&t, 12, Some(&("forker".into(), 40, 0)));
        assert_eq!(
            m,
            "The node was low on resource: pids. Threshold quantity: 20, available: 12. \
             Container forker was using 40, request is 0, has larger consumption of pids. "
        );
        let t = threshold(Signal::ImagefsInodesFree, Amount::Percentage(5.0));
        assert!(eviction_message(&t, 3, None).starts_with("The node was low on resource: inodes."));
    }
}
