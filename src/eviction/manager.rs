//! The eviction manager: observe, decide, reclaim, stop the right pod,
//! observe again.
//!
//! Each round reads the node signals fresh, steps the pure state machine
//! ([`crate::eviction::thresholds`]) and handles the thresholds to act on,
//! memory first, then pids, then disk:
//! - **disk** (`nodefs.*`, `imagefs.*`): node-level reclaim first
//!   ([`crate::eviction::reclaim::node_actions`]: dead containers, then unused
//!   images, asked for the deficit); if a fresh observation still meets the
//!   threshold, the first pod of the kubelet's disk ranking goes,
//!   and its containers are removed with their logs so that the space
//!   actually comes back (its emptyDirs stay: they are the kubelet's);
//! - **memory**: the first pod of the kubelet's memory ranking;
//! - **pid**: the pod with the most tasks among the lowest priority.
//!
//! Beside the rounds, within the housekeeping period (a fifth of it for a
//! pod that has used half of a limit), pods over a local-storage
//! limit of their API pod (an emptyDir's `sizeLimit`, a container's or the
//! pod's `ephemeral-storage` limit) are evicted at once with the kubelet's
//! grace of 1 s and its messages ([`crate::eviction::local_storage`]); their
//! usage is read in the background, so a walk never delays a memory round.
//!
//! A pod is stopped with StopContainer for each running container (grace 0
//! under a hard threshold, the pod's grace capped by
//! `evictionMaxPodGracePeriod` under a soft one) then StopPodSandbox,
//! through the runtime. With a grace period of 0 its processes are first
//! killed through its cgroup ([`super::killer`]), so the memory
//! comes back before the runtime has handled the stops. Stops are awaited and rounds never overlap, and the
//! manager observes again after each one. For disk, where containerd gives
//! the space of removed writable layers back in the background, the reclaim
//! each eviction started counts as in flight until the signal shows it (or
//! 10 s pass), so one pressure episode takes no more pods than it needs.
//!
//! [`EvictionManager::run`] starts a round on every housekeeping tick and,
//! between ticks, as soon as a memory event says to look
//! ([`crate::signals::notify`]).
//!
//! With a state directory the manager remembers, across restarts, when each
//! condition's threshold was last observed met and the latest evictions
//! ([`super::store::Remembered`], wall-clock times): a restarted manager keeps a
//! condition until the transition period has passed since that
//! observation, as the kubelet's state machine would have without the
//! restart, and `criguard evictions` still lists what it did.
//!
//! The manager holds its collaborators behind the seams of
//! [`super::seams`] (observing, ranking, node-level reclaim, stopping a
//! pod, reporting, the clock), so that its decisions are unit-tested with
//! fakes (the tests below) and `serve` wires the real ones.

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::config::{EvictionConfig, Threshold};
use crate::eviction::local_storage::{self, Exceeded};
use crate::eviction::rank::Victim;
use crate::eviction::reclaim::{InFlight, NodeAction, PodUse, node_actions, pending, plan_victims};
use crate::eviction::thresholds::{EvictionState, Observations, deficit};
use crate::kube::PodEviction;
use crate::lock::RwLocked;
use crate::model::{ContainerState, NodeModel, Pod, SandboxState};
use crate::signals::notify::{MemoryEvent, MemoryEvents};
use crate::signals::table::{Condition, Ranking, Signal};

use super::message::eviction_message;
use super::metrics::{
    ConditionLabels, EvictionLabels, EvictionMetrics, LimitLabels, SignalLabels, TriggerLabels,
};
use super::pressure::PressureMemory;
use super::ready::{self, Ready};
use super::seams::{Clock, NodeReclaim, PodKiller, Rank, Reporter, Signals};
use super::status::{Eviction, NodeStatus};
use super::store::{self, EvictedStore};
use super::unfinished::unfinished;
use fast::PreKilled;

/// The collaborators every manager needs (the optional ones, node-level
/// reclaim and the API report, come with the builders).
#[derive(Clone)]
pub struct Seams {
    /// Observes the node's signals.
    pub signals: Arc<dyn Signals>,
    /// Ranks the pods for each kind of signal.
    pub rank: Arc<dyn Rank>,
    /// Stops the evicted pods.
    pub killer: Arc<dyn PodKiller>,
    /// The time.
    pub clock: Arc<dyn Clock>,
}

/// The eviction manager's state and handles.
pub struct EvictionManager {
    config: EvictionConfig,
    signals: Arc<dyn Signals>,
    rank: Arc<dyn Rank>,
    killer: Arc<dyn PodKiller>,
    clock: Arc<dyn Clock>,
    model: Arc<RwLock<NodeModel>>,
    status: Arc<RwLock<NodeStatus>>,
    state: EvictionState,
    dry_run: bool,
    metrics: EvictionMetrics,
    node_reclaim: Option<Arc<dyn NodeReclaim>>,
    in_flight: Vec<InFlight>,
    store: Option<EvictedStore>,
    report: Option<Arc<dyn Reporter>>,
    pressure: PressureMemory,
    reloads: Option<tokio::sync::watch::Receiver<Arc<Reloadable>>>,
    /// Sandboxes of evicted pods this process has asked the runtime to stop.
    stops_taken: BTreeSet<String>,
    /// No stall threshold acts before this: PSI's average lags an eviction's
    /// relief by up to its window, and the round would evict again meanwhile.
    stall_hold: Option<std::time::Instant>,
    /// The memory ranking kept ready near a hard memory threshold.
    ready: Option<Ready<Victim>>,
    /// A pod killed at a crossing whose eviction the next round records.
    pre_killed: Option<PreKilled>,
}

/// What a configuration reload changes in a running manager: everything
/// else (the state machine's timers, the pressure memory, the evicted
/// pods, the model) is kept.
#[derive(Clone)]
pub struct Reloadable {
    /// Thresholds, grace and transition periods, housekeeping interval.
    pub config: EvictionConfig,
    /// Decide and log evictions, stop nothing.
    pub dry_run: bool,
    /// The node-level collectors, with their current policies.
    pub node_reclaim: Option<Arc<dyn NodeReclaim>>,
}

/// How long a disk eviction's reclaim counts as on its way: containerd
/// removes snapshots in its background garbage collection, within seconds.
const IN_FLIGHT_FOR: Duration = Duration::from_secs(10);

impl EvictionManager {
    /// A manager acting on `config` through `seams`, keeping `model` and
    /// `status` current.
    pub fn new(
        config: EvictionConfig,
        seams: Seams,
        model: Arc<RwLock<NodeModel>>,
        status: Arc<RwLock<NodeStatus>>,
        dry_run: bool,
    ) -> Self {
        Self {
            config,
            signals: seams.signals,
            rank: seams.rank,
            killer: seams.killer,
            clock: seams.clock,
            model,
            status,
            state: EvictionState::default(),
            dry_run,
            metrics: EvictionMetrics::default(),
            node_reclaim: None,
            in_flight: Vec::new(),
            store: None,
            report: None,
            pressure: PressureMemory::default(),
            reloads: None,
            stops_taken: BTreeSet::new(),
            stall_hold: None,
            ready: None,
            pre_killed: None,
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
        let now = self.clock.unix_ms();
        let remembered = store.load_remembered();
        let (pressure, held) =
            PressureMemory::restored(&remembered, now, self.config.pressure_transition_period);
        if !held.is_empty() {
            tracing::info!(conditions = ?held, "pressure remembered from before the restart: its conditions hold until the transition period has passed since it was last observed");
        }
        self.pressure = pressure;
        {
            let mut st = self.status.write_locked();
            st.conditions = held;
            st.dry_run = self.dry_run;
        }
        self.store = Some(store);
        self
    }

    /// The same manager, reporting evictions and pressure to the Kubernetes
    /// API: the pod's status before it is stopped (waiting at most the
    /// report's bound), then an event; criguard's node conditions and taints.
    pub fn with_report(mut self, report: Arc<dyn Reporter>) -> Self {
        self.report = Some(report);
        self
    }

    /// The same manager, reclaiming disk at node level (dead containers,
    /// unused images) before it evicts for a disk signal (without it, disk
    /// signals go straight to pods).
    pub fn with_node_reclaim(mut self, reclaim: Arc<dyn NodeReclaim>) -> Self {
        self.node_reclaim = Some(reclaim);
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
        let mut obs = self.signals.observe().await;
        if let Some(pk) = &self.pre_killed {
            ready::merge(&mut obs, pk.threshold.signal, &pk.reading);
        }
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
        let mut st = self.status.write_locked();
        st.conditions = conditions;
        st.dry_run = self.dry_run;
        st.observations = Some(obs.clone());
        (obs, d.act_on)
    }

    /// Notes the conditions whose thresholds the step just found met, at
    /// the wall-clock time of `obs`; returns the conditions the memory
    /// holds then (the remembered ones from before a restart included).
    fn remember_pressure(&mut self, obs: &Observations) -> BTreeSet<Condition> {
        let at = self.wall_ms(obs.at);
        let met: Vec<Condition> = (self.config.hard.iter().chain(&self.config.soft))
            .filter(|t| self.state.met_since(t).is_some())
            .map(|t| t.signal.condition())
            .collect();
        self.pressure
            .note(&met, at, self.config.pressure_transition_period)
    }

    /// The instant the remembered pressure next runs out, if it holds.
    fn pressure_deadline(&self, obs: &Observations) -> Option<Instant> {
        let at = self.wall_ms(obs.at);
        self.pressure
            .deadline(at, self.config.pressure_transition_period)
            .map(|d| obs.at + d)
    }

    /// The wall-clock time of monotonic instant `at`, ms since the epoch.
    fn wall_ms(&self, at: Instant) -> u64 {
        let ago = self.clock.now().saturating_duration_since(at).as_millis() as u64;
        self.clock.unix_ms().saturating_sub(ago)
    }

    /// How long ago `since` was, in seconds, for the latency metrics.
    fn secs_since(&self, since: Instant) -> f64 {
        self.clock
            .now()
            .saturating_duration_since(since)
            .as_secs_f64()
    }

    /// Saves the pressure memory and the latest evictions when they
    /// changed ([`PressureMemory::save`]), with `new`, an eviction about to
    /// be published, among the evictions saved.
    async fn save_pressure(&mut self, new: Option<&Eviction>) {
        self.pressure
            .save(self.store.as_ref(), &self.status, new, &*self.clock)
            .await;
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
        let (found_tx, mut found) = tokio::sync::mpsc::channel(1);
        let _finder = AbortOnDrop(tokio::spawn(find_over_limits(
            self.rank.clone(),
            self.config.housekeeping_interval,
            found_tx,
        )));
        let mut tick = tokio::time::interval(self.config.housekeeping_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut deadline = None;
        loop {
            let refresh = self.ready_refresh();
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
                    if let Some(c) = &ev.crossed {
                        self.kill_at_crossing(c);
                    }
                    ev.watch.kind()
                }
                () = until(refresh) => {
                    self.keep_ready().await;
                    continue;
                }
                Some(over) = found.recv() => {
                    self.evict_over_limits(over).await;
                    continue;
                }
                () = &mut stopped => return,
            };
            if let Some(ev) = events.as_mut() {
                ev.drain();
            }
            let labels = TriggerLabels { trigger };
            self.metrics.rounds.get_or_create(&labels).inc();
            self.round().await;
            self.evict_pre_killed().await;
            store::persist(&self.status, self.store.as_ref()).await;
            self.save_pressure(None).await;
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
            events = rearm(events, obs).await;
            self.keep_ready().await;
        }
    }

    /// The last round's last observations.
    fn last_observations(&self) -> Option<Observations> {
        let st = self.status.read_locked();
        st.observations.clone()
    }

    /// One round; returns the evictions it made.
    pub async fn round(&mut self) -> Vec<Eviction> {
        self.finish_stops().await;
        let mut made = Vec::new();
        let mut tried = BTreeSet::new();
        let mut reclaimed = BTreeSet::new();
        loop {
            let (obs, mut act_on) = self.observe().await;
            let held = self.stall_hold.is_some_and(|h| self.clock.now() < h);
            act_on.retain(|t| !(held && t.signal.is_stall()));
            act_on.sort_by_key(|t| t.signal.ranking());
            let Some(t) = act_on.into_iter().next() else {
                break;
            };
            let ranking = self.clock.now();
            let victim = match t.signal.ranking() {
                Ranking::Memory => match self.pre_killed.take() {
                    Some(pk) => Some(pk.victim),
                    None => self.rank.memory(&tried).await.into_iter().next(),
                },
                Ranking::Swap => self.rank.swap(&tried).await.into_iter().next(),
                Ranking::Pids => self.rank.pids(&tried).await.into_iter().next(),
                Ranking::Disk => {
                    if reclaimed.insert(t.signal) && self.reclaim_node(&t, &obs).await {
                        continue; // observe again: it may have been enough
                    }
                    let available = obs.get(&t.signal).map_or(0, |o| o.available);
                    let need = deficit(&t, &obs, true).unwrap_or(0);
                    let now = self.clock.now();
                    let coming = pending(&mut self.in_flight, t.signal, available, now);
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
                rank_ms = ms(self.clock.now().saturating_duration_since(ranking)),
                "victim chosen"
            );
            tried.insert(victim.pod.sandbox_id.clone());
            if t.signal.is_stall() {
                self.stall_hold = Some(self.clock.now() + crate::config::PSI_WINDOW);
            }
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
        let Some(reclaim) = self.node_reclaim.clone() else {
            return false;
        };
        let actions = node_actions(t.signal, reclaim.dedicated_imagefs());
        if self.dry_run {
            tracing::info!(threshold = %t, ?actions, "dry run: node-level reclaim skipped");
            return false;
        }
        let mut need = deficit(t, obs, true).unwrap_or(0);
        for (i, action) in actions.iter().enumerate() {
            if i > 0 {
                match deficit(t, &self.signals.observe().await, true) {
                    None => break,
                    Some(d) => need = d,
                }
            }
            let freed = match action {
                NodeAction::ContainerGc => reclaim.collect_containers().await,
                NodeAction::ImageGc => {
                    // Bytes are asked for; for inodes, every unused image.
                    let bytes = if t.signal.is_bytes() { need } else { u64::MAX };
                    reclaim.free_images(bytes).await
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
        let ranked = self.rank.disk(t.signal, tried).await;
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

    /// The grace period `t` gives a pod whose own is `pod_grace_s`: 0 under
    /// a hard threshold; under a soft one the pod's (30 s when unset),
    /// capped by `evictionMaxPodGracePeriod`.
    fn grace_s(&self, t: &Threshold, pod_grace_s: Option<i64>) -> i64 {
        match t.grace_period {
            None => 0,
            Some(_) => {
                let cap = self
                    .config
                    .max_pod_grace_period
                    .map_or(0, |d| d.as_secs() as i64);
                pod_grace_s.unwrap_or(30).min(cap)
            }
        }
    }

    async fn evict(&mut self, v: &Victim, t: &Threshold, obs: &Observations) -> Eviction {
        let pod = &v.pod;
        let grace_s = self.grace_s(t, pod.grace_period_s);
        let available = obs.get(&t.signal).map_or(0, |o| o.available);
        let pod_level = pod
            .requests
            .pod_level_memory
            .zip(v.usage)
            .map(|(request, used)| (pod.name.as_str(), used, request));
        let message = eviction_message(t, available, pod_level, v.heaviest.as_ref());
        let e = Eviction {
            at_unix_ms: self.clock.unix_ms(),
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
        if self.dry_run {
            let mut st = self.status.write_locked();
            st.record_eviction(e.clone());
        } else {
            self.carry_out(v, Cause::Threshold(t), &e).await;
        }
        e
    }

    /// Evicts each pod of `found` (read in the background) still running,
    /// for the local-storage limit it exceeds.
    async fn evict_over_limits(&mut self, found: Vec<(Victim, Exceeded)>) {
        for (v, over) in found {
            let running = self
                .model
                .read_locked()
                .sandbox_info(&v.pod.sandbox_id)
                .is_some_and(|s| s.state == Some(SandboxState::Ready));
            if running {
                self.evict_over_limit(&v, &over).await;
            }
        }
    }

    /// Evicts `v` for local-storage limit `over`: the kubelet's message,
    /// grace and record, whatever the node's pressure.
    async fn evict_over_limit(&mut self, v: &Victim, over: &Exceeded) -> Eviction {
        let pod = &v.pod;
        let e = Eviction {
            at_unix_ms: self.clock.unix_ms(),
            pod: format!("{}/{}", pod.namespace, pod.name),
            uid: pod.uid.clone(),
            sandbox_id: pod.sandbox_id.clone(),
            signal: over.signal().to_owned(),
            threshold: crate::quantity::format_bytes(over.limit().max(0) as u64),
            available: 0,
            usage: v.usage.unwrap_or(0),
            request: over.limit(),
            grace_s: local_storage::GRACE_S,
            message: over.message(),
            dry_run: self.dry_run,
        };
        tracing::warn!(
            pod = %e.pod, uid = %e.uid, limit = %e.signal, usage = e.usage, qos = ?pod.qos,
            priority = pod.priority, grace_s = e.grace_s, dry_run = self.dry_run,
            "evicting pod: {}", e.message
        );
        if self.dry_run {
            self.status.write_locked().record_eviction(e.clone());
        } else {
            self.carry_out(v, Cause::Limit(over), &e).await;
        }
        e
    }

    /// Carries out eviction `e` of victim `v` for `cause`: records it for
    /// admission (and saves it), reports it to the API, kills the pod (at
    /// once under a grace period of 0), publishes it, stops the pod through
    /// the runtime and, for disk, removes its containers.
    async fn carry_out(&mut self, v: &Victim, cause: Cause<'_>, e: &Eviction) {
        let (pod, grace_s, available) = (&v.pod, e.grace_s, e.available);
        let saving = store::remember(&self.status, self.store.as_ref(), e);
        let threshold = match cause {
            Cause::Threshold(t) => Some(t),
            Cause::Limit(_) => None,
        };
        let since = threshold.and_then(|t| self.state.met_since(t));
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
                resource: threshold
                    .map_or("ephemeral-storage", |t| t.signal.resource().name())
                    .to_owned(),
                offending: offending.filter(|_| threshold.is_some_and(|t| t.signal.is_bytes())),
            })
            .await;
        }
        // After the API report: a Failed phase must reach the API before
        // the kubelet can see the pod's containers die ([`crate::kube`]).
        // Under a grace period of 0 the pod's processes are killed before
        // the runtime hears of it: the memory comes back at once.
        if grace_s == 0
            && self.killer.kill_now(pod)
            && let Some(since) = since
        {
            self.metrics
                .pressure_to_kill
                .observe(self.secs_since(since));
        }
        // Published now, when the pod is killed (or its stop begins),
        // not when the runtime answers: a hung runtime must not hide
        // the eviction from `criguard evictions`, WatchEvictions and the
        // metrics. NotReady in the model keeps the next round from
        // choosing the pod again while its stop is still pending.
        self.count(cause, pod);
        self.model
            .write_locked()
            .set_sandbox_state(&pod.sandbox_id, SandboxState::NotReady);
        self.save_pressure(Some(e)).await;
        self.status.write_locked().record_eviction(e.clone());
        self.stops_taken.insert(pod.sandbox_id.clone());
        self.stop(pod, grace_s, since).await;
        if let Some(saving) = saving
            && tokio::time::timeout(store::STATE_WRITE_DEADLINE, saving)
                .await
                .is_err()
        {
            tracing::warn!(deadline = ?store::STATE_WRITE_DEADLINE, "saving the evicted pods has not finished (a hung state directory?); the round goes on, the record stays in memory");
        }
        let disk = threshold.is_none_or(|t| t.signal.ranking() == Ranking::Disk);
        if let Some(t) = threshold.filter(|_| disk) {
            self.in_flight.push(InFlight {
                signal: t.signal,
                amount: v.reclaimable,
                baseline: available,
                until: self.clock.now() + IN_FLIGHT_FOR,
            });
        }
        if disk {
            // Stopping frees no disk: the writable layers and logs go
            // with the containers. The kubelet would do this when it
            // deletes the evicted pod; it does not know of this eviction.
            self.killer.remove_containers(pod).await;
        }
    }

    /// Stops the sandboxes of pods evicted before this process that it has
    /// not stopped yet ([`unfinished`]): a restart or a handoff between an
    /// eviction's record and its completed StopPodSandbox leaves them to it.
    /// Their processes are killed first when the eviction gave no grace.
    async fn finish_stops(&mut self) {
        if self.dry_run {
            return;
        }
        let ids = {
            // Lock order: the status, then the model (nothing holds the
            // model's lock while it takes the status's).
            let st = self.status.read_locked();
            unfinished(&self.model.read_locked(), &st.evicted, &self.stops_taken)
        };
        for id in ids {
            self.stops_taken.insert(id.clone());
            let Some(pod) = self.model.read_locked().pod(&id) else {
                continue;
            };
            let grace_s = (self.status.read_locked().evictions.iter())
                .rfind(|e| e.uid == pod.uid)
                .map_or(0, |e| e.grace_s);
            let running = pod.state == SandboxState::Ready
                || (pod.containers.values()).any(|c| c.state == ContainerState::Running);
            if running {
                tracing::warn!(
                    pod = %format!("{}/{}", pod.namespace, pod.name), uid = %pod.uid, sandbox = %id, grace_s,
                    "a pod evicted by an earlier criguard process still runs: stopping it now"
                );
                if grace_s == 0 {
                    self.killer.kill_now(&pod);
                }
            } else {
                tracing::debug!(sandbox = %id, "sandbox of a pod evicted by an earlier process: StopPodSandbox once more, in case its stop never completed");
            }
            self.stop(&pod, grace_s, None).await;
        }
    }

    /// Counts an eviction of `pod` for `cause`.
    fn count(&self, cause: Cause<'_>, pod: &Pod) {
        match cause {
            Cause::Threshold(t) => {
                let labels = EvictionLabels {
                    signal: t.signal,
                    qos: pod.qos,
                };
                self.metrics.evictions.get_or_create(&labels).inc();
            }
            Cause::Limit(over) => {
                let labels = LimitLabels {
                    limit: over.signal(),
                };
                self.metrics.local_storage.get_or_create(&labels).inc();
            }
        }
    }

    /// Stops `pod` through the runtime, timing pressure (met `since`) to
    /// action; a stop the runtime did not complete is retried in the
    /// background, and timed when it completes.
    async fn stop(&self, pod: &Pod, grace_s: i64, since: Option<Instant>) {
        let stopped = self.killer.stop(pod, grace_s).await;
        // The action is StopPodSandbox returning: timed before the
        // evicted pods' save (an fsync) is waited for.
        match (stopped, since) {
            (true, Some(since)) => self
                .metrics
                .pressure_to_action
                .observe(self.secs_since(since)),
            (true, None) => {}
            (false, _) => {
                let metric = self.metrics.pressure_to_action.clone();
                let clock = self.clock.clone();
                self.killer.retry_stop(
                    &pod.sandbox_id,
                    Box::new(move || {
                        if let Some(since) = since {
                            let secs = clock.now().saturating_duration_since(since);
                            metric.observe(secs.as_secs_f64());
                        }
                    }),
                );
            }
        }
    }
}

/// Why a pod is evicted.
#[derive(Clone, Copy)]
enum Cause<'a> {
    /// A threshold met.
    Threshold(&'a Threshold),
    /// A local-storage limit exceeded.
    Limit(&'a Exceeded),
}

/// Aborts a background task when dropped: the finder ends with the manager.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Reads which pods exceed a local-storage limit and hands those found to
/// the manager (one batch waits at most; the next reading starts once it
/// is taken). A pod is read again within the housekeeping period `every`,
/// or within a fifth of it (at least 1 s) once it has used half of a limit
/// ([`local_storage::recheck_in`]): only pods near a limit are walked often.
async fn find_over_limits(
    rank: Arc<dyn Rank>,
    every: Duration,
    found: tokio::sync::mpsc::Sender<Vec<(Victim, Exceeded)>>,
) {
    let near = (every / 5).max(Duration::from_secs(1)).min(every);
    let mut tick = tokio::time::interval(near);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut due: std::collections::HashMap<String, Instant> = Default::default();
    loop {
        tick.tick().await;
        let now = Instant::now();
        let skip: BTreeSet<String> = due
            .iter()
            .filter(|(_, at)| **at > now)
            .map(|(id, _)| id.clone())
            .collect();
        let reading = rank.local_storage(&skip).await;
        // Pods gone or read now get a new time; the skipped keep theirs.
        due.retain(|id, _| skip.contains(id));
        for (id, full) in reading.fullness {
            due.insert(id, now + local_storage::recheck_in(full, near, every));
        }
        if !reading.over.is_empty() && found.send(reading.over).await.is_err() {
            return;
        }
    }
}

/// A duration in milliseconds, for logs.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Resolves at `deadline`, or never without one.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

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

/// `events` re-armed after `obs` (none without events, or when re-arming
/// failed: the housekeeping tick goes on alone).
async fn rearm(events: Option<MemoryEvents>, obs: Observations) -> Option<MemoryEvents> {
    let mut ev = events?;
    // Registering a memcg threshold waits for an RCU grace period in the
    // kernel (milliseconds): off the proxy's thread.
    let rearmed = tokio::task::spawn_blocking(move || {
        ev.rearm(&obs);
        ev
    });
    match rearmed.await {
        Ok(ev) => Some(ev),
        Err(err) => {
            tracing::error!(%err, "re-arming memory events failed; the housekeeping tick goes on alone");
            None
        }
    }
}

/// The next memory event, or never when there are no events.
async fn next_event(events: &mut Option<MemoryEvents>) -> MemoryEvent {
    match events {
        Some(e) => e.next().await,
        None => std::future::pending().await,
    }
}

mod fast;
#[cfg(test)]
mod tests;
