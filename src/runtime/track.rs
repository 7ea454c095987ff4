//! Tracking containerd's task events in the node model, so the model
//! learns of a container that exits by itself at once instead of at the
//! next sync.
//!
//! [`TaskEvents::run`] subscribes to `/tasks/exit` and `/tasks/oom` in
//! namespace `k8s.io` ([`super::events`]) and applies each exit of a task's
//! init process to the model ([`NodeModel::task_exited`]): task id =
//! container id for CRI containers, sandbox id for a sandbox's pause task.
//! Every event also goes to the [`TaskWatcher`] attached, if any (`serve`
//! attaches the kernel OOM kill recorder, `oom::kills`): the loop
//! owns the interface, the recorder implements it, so this module knows
//! nothing of what watches.
//!
//! The periodic sync ([`super::sync`]) stays the safety net: events published
//! before containerd registered a subscription are never delivered, so
//! each subscription is followed, [`SETTLE`] later, by a catch-up sync (and
//! a sweep by the watcher). When the stream ends (containerd restarted or
//! stopped) the loop subscribes again after a back-off that doubles from
//! [`MIN_WAIT`] to [`MAX_WAIT`] and starts over once a subscription has
//! delivered an event or lived [`MAX_WAIT`]: a runtime that stays down
//! costs one connection attempt every few seconds, never a busy loop.
//!
//! The loop is thin: it waits on the stream, the next deadline (catch-up,
//! the watcher's recheck) and shutdown; every decision is in the model, the
//! watcher or [`Backoff`].

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crate::lock::RwLocked;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::Upstream;
use super::events::{EventError, Subscription, TOPIC_EXIT, TOPIC_OOM, TaskEvent, TaskExit};
use super::sync;
use crate::backoff::Backoff;
use crate::model::NodeModel;

/// The first wait before subscribing again.
pub const MIN_WAIT: Duration = Duration::from_millis(100);
/// The longest wait before subscribing again.
pub const MAX_WAIT: Duration = Duration::from_secs(2);
/// How long the events loop waits for one call of its watcher (the OOM
/// kill recorder's cgroup reads).
pub const OOM_READ_DEADLINE: Duration = Duration::from_secs(2);
/// How long after subscribing the catch-up sync runs: containerd has
/// registered the subscriber by then (it sends nothing to say so).
pub const SETTLE: Duration = Duration::from_millis(250);

/// Labels of a containerd event topic.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TopicLabels {
    /// `/tasks/exit` or `/tasks/oom`.
    pub topic: &'static str,
}

/// Metrics of containerd's task events (the kernel OOM kills they reveal
/// are counted by the recorder, `oom::kills`).
#[derive(Clone, Debug, Default)]
pub struct TaskEventMetrics {
    /// Subscriptions made to containerd's events service (the first, then
    /// one per re-subscription after containerd went away).
    pub subscriptions: Counter,
    /// Catch-up syncs completed after a subscription (what the events
    /// could not tell: before it was registered, or while containerd was down).
    pub catch_ups: Counter,
    /// Task events received, by topic.
    pub events: Family<TopicLabels, Counter>,
}

impl TaskEventMetrics {
    /// Registers every metric of the group.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "criguard_containerd_event_subscriptions",
            "Subscriptions to containerd's events service (/tasks/exit, /tasks/oom): the first and each one after containerd went away",
            self.subscriptions.clone(),
        );
        registry.register(
            "criguard_containerd_event_catch_up_syncs",
            "Model syncs run right after subscribing to containerd's events, for what happened before the subscription",
            self.catch_ups.clone(),
        );
        registry.register(
            "criguard_containerd_events",
            "containerd task events received, by topic",
            self.events.clone(),
        );
    }
}

/// What follows the task events besides the model: the kernel OOM kill
/// recorder (`oom::kills::OomKillWatcher`), attached by `serve`.
///
/// Each call runs on the blocking pool (it may read cgroupfs) with a copy
/// of the model taken under its read lock and released at once, and is
/// waited for at most [`OOM_READ_DEADLINE`]; a call still running holds the
/// watcher, so the next ones are skipped, never queued, until it returns.
pub trait TaskWatcher: Send {
    /// Once, before the first subscription: what the model's tasks have
    /// counted so far.
    fn baseline(&mut self, model: &NodeModel);
    /// A task's exit (any process, init or not).
    fn on_exit(&mut self, model: &NodeModel, exit: &TaskExit);
    /// A `/tasks/oom` for `task`, published at `at_unix_ms` (epoch ms),
    /// received at `now`.
    fn on_oom(&mut self, model: &NodeModel, task: &str, at_unix_ms: u64, now: Instant);
    /// The kernel's log named `memcg` as the cgroup of a process its OOM
    /// killer took, `now`.
    fn on_kernel_kill(&mut self, _model: &NodeModel, _memcg: &str, _now: Instant) {}
    /// When the watcher next wants [`TaskWatcher::on_deadline`]; `None`:
    /// nothing pending.
    fn deadline(&self) -> Option<Instant>;
    /// Its deadline passed (or another did: it checks what is due at `now`).
    fn on_deadline(&mut self, model: &NodeModel, now: Instant);
    /// After a catch-up sync, at `now_ms` (epoch ms): what the events may
    /// have missed.
    fn sweep(&mut self, model: &NodeModel, now_ms: u64);
}

/// How one subscription ended.
enum Ended {
    /// Shutdown.
    Stopped,
    /// The stream failed or closed.
    Failed { err: EventError, delivered: bool },
}

/// The catch-up after a subscription: due at a time, running, or done.
enum CatchUp {
    Due(Instant),
    Running(JoinHandle<Result<(), sync::SyncError>>),
    Done,
}

/// The events loop's parts.
pub struct TaskEvents {
    model: Arc<RwLock<NodeModel>>,
    upstream: Upstream,
    /// Shared with the blocking threads its calls run on.
    oom: Option<Arc<Mutex<dyn TaskWatcher>>>,
    /// The cgroups of the kernel's OOM kills, from its log.
    kernel_kills: Option<UnboundedReceiver<String>>,
    metrics: TaskEventMetrics,
}

impl TaskEvents {
    /// A loop keeping `model` current from `upstream`'s events.
    pub fn new(model: Arc<RwLock<NodeModel>>, upstream: Upstream) -> Self {
        Self {
            model,
            upstream,
            oom: None,
            kernel_kills: None,
            metrics: TaskEventMetrics::default(),
        }
    }

    /// The same loop, handing every event to `watcher` (the kernel OOM kill
    /// recorder).
    pub fn with_watcher(mut self, watcher: impl TaskWatcher + 'static) -> Self {
        self.oom = Some(Arc::new(Mutex::new(watcher)));
        self
    }

    /// The same loop, handing the watcher the cgroup of each kernel OOM
    /// kill that `kills` brings (read from the kernel's log).
    pub fn with_kernel_kills(mut self, kills: UnboundedReceiver<String>) -> Self {
        self.kernel_kills = Some(kills);
        self
    }

    /// The same loop, counting in `metrics`.
    pub fn with_metrics(mut self, metrics: TaskEventMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Follows the events until `stopped` resolves.
    pub async fn run(mut self, stopped: impl Future<Output = ()>) {
        tokio::pin!(stopped);
        self.with_oom(|w, m| w.baseline(m)).await;
        let mut backoff = Backoff::new(MIN_WAIT, MAX_WAIT);
        let mut failures = 0u64;
        let mut no_service_said = false;
        loop {
            let started = Instant::now();
            let Ended::Failed { err, delivered } = self.follow(stopped.as_mut()).await else {
                return;
            };
            let healthy = delivered || started.elapsed() >= MAX_WAIT;
            let wait = backoff.after(healthy);
            failures = if healthy { 1 } else { failures + 1 };
            if err.no_event_service() {
                // Asked again with back-off all the same (each attempt also
                // reads the kernel's OOM kills queued since); said once.
                if !no_service_said {
                    tracing::info!(%err, "the runtime has no containerd event service (it is not containerd): the model follows it by its periodic sync");
                    no_service_said = true;
                }
            } else if failures == 1 {
                tracing::warn!(%err, ?wait, "containerd events: subscription ended; subscribing again (the sync covers the gap)");
            } else {
                tracing::debug!(%err, ?wait, failures, "containerd events: still unavailable");
            }
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = stopped.as_mut() => return,
            }
        }
    }

    /// One subscription, from the Subscribe call until it fails or shutdown.
    async fn follow(&mut self, mut stopped: Pin<&mut impl Future<Output = ()>>) -> Ended {
        self.metrics.subscriptions.inc();
        let events = self.upstream.events();
        let subscribe = events.subscribe();
        tokio::pin!(subscribe);
        let mut sub: Option<Subscription> = None;
        let mut delivered = false;
        let mut catch_up = CatchUp::Due(Instant::now() + SETTLE);
        loop {
            let due = match &catch_up {
                CatchUp::Due(at) => Some(*at),
                _ => None,
            };
            let oom_due = self
                .oom
                .as_ref()
                .and_then(|w| w.try_lock().ok().and_then(|w| w.deadline()));
            let deadline = due.into_iter().chain(oom_due).min();
            tokio::select! {
                () = stopped.as_mut() => return Ended::Stopped,
                r = &mut subscribe, if sub.is_none() => match r {
                    Ok(s) => sub = Some(s),
                    Err(err) => return Ended::Failed { err, delivered },
                },
                r = next(&mut sub), if sub.is_some() => match r {
                    Ok(ev) => {
                        delivered = true;
                        self.apply(ev).await;
                    }
                    Err(err) if err.ends_subscription() => {
                        return Ended::Failed { err, delivered };
                    }
                    Err(err) => tracing::warn!(%err, "containerd event not readable; skipped"),
                },
                memcg = kernel_kill(&mut self.kernel_kills), if self.kernel_kills.is_some() => match memcg {
                    Some(memcg) => {
                        tracing::debug!(%memcg, "kernel OOM kill in the kernel's log");
                        let now = Instant::now();
                        self.with_oom(move |w, m| w.on_kernel_kill(m, &memcg, now)).await;
                    }
                    None => self.kernel_kills = None,
                },
                r = joined(&mut catch_up), if matches!(catch_up, CatchUp::Running(_)) => {
                    catch_up = CatchUp::Done;
                    match r {
                        Ok(Ok(())) => {
                            self.metrics.catch_ups.inc();
                            self.sweep().await;
                        }
                        Ok(Err(err)) => tracing::warn!(%err, "catch-up sync after subscribing failed; the periodic sync retries"),
                        Err(err) => tracing::error!(%err, "catch-up sync panicked"),
                    }
                }
                () = sleep_until(deadline), if deadline.is_some() => {
                    let now = Instant::now();
                    if due.is_some_and(|at| at <= now) {
                        let (model, up) = (self.model.clone(), self.upstream.clone());
                        catch_up = CatchUp::Running(tokio::spawn(async move {
                            sync::sync(&model, &up).await
                        }));
                    }
                    self.with_oom(move |w, m| {
                        w.on_deadline(m, now);
                    })
                    .await;
                }
            }
        }
    }

    /// Applies one event to the model and hands it to the watcher.
    async fn apply(&mut self, ev: TaskEvent) {
        match ev {
            TaskEvent::Exit(exit) => {
                self.count(TOPIC_EXIT);
                if exit.is_init() {
                    let owner = self.model.write_locked().task_exited(&exit.container_id);
                    tracing::debug!(task = %exit.container_id, status = exit.exit_status, ?owner, "task exited");
                }
                self.with_oom(move |w, m| {
                    w.on_exit(m, &exit);
                })
                .await;
            }
            TaskEvent::Oom {
                container_id,
                at_unix_ms,
            } => {
                self.count(TOPIC_OOM);
                tracing::debug!(task = %container_id, "OOM notification");
                let now = Instant::now();
                self.with_oom(move |w, m| {
                    w.on_oom(m, &container_id, at_unix_ms, now);
                })
                .await;
            }
        }
    }

    fn count(&self, topic: &'static str) {
        self.metrics
            .events
            .get_or_create(&TopicLabels { topic })
            .inc();
    }

    /// After a catch-up: OOM kills the events may have missed.
    async fn sweep(&mut self) {
        let now_ms = crate::clock::now_ms();
        self.with_oom(move |w, m| {
            w.sweep(m, now_ms);
        })
        .await;
    }

    /// Runs `f` on the watcher with a copy of the model, on the
    /// blocking pool (it reads cgroup counters), waited for at most
    /// [`OOM_READ_DEADLINE`]. A call still running holds the recorder: the
    /// next ones are skipped, never queued, until it returns.
    async fn with_oom(&self, f: impl FnOnce(&mut dyn TaskWatcher, &NodeModel) + Send + 'static) {
        let Some(w) = self.oom.clone() else { return };
        let model = snapshot(&self.model);
        let run = tokio::task::spawn_blocking(move || match w.try_lock() {
            Ok(mut w) => {
                f(&mut *w, &model);
                true
            }
            Err(_) => false,
        });
        match tokio::time::timeout(OOM_READ_DEADLINE, run).await {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => tracing::warn!(
                "OOM kill recorder still busy (a cgroup read stuck?); this event's check skipped"
            ),
            Ok(Err(err)) => tracing::error!(%err, "OOM kill recorder panicked"),
            Err(_) => {
                tracing::warn!(deadline = ?OOM_READ_DEADLINE, "OOM kill check did not finish in time (a cgroup read stuck?); going on without it")
            }
        }
    }
}

/// A copy of the model, taken under its read lock and released at once:
/// the watcher reads cgroup counters with it, and no lock the relay
/// thread waits on may be held across I/O.
fn snapshot(model: &RwLock<NodeModel>) -> NodeModel {
    model.read_locked().clone()
}

async fn next(sub: &mut Option<Subscription>) -> Result<TaskEvent, EventError> {
    match sub {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}

/// The next kernel OOM kill's cgroup; `None` once the log's reader ended.
async fn kernel_kill(kills: &mut Option<UnboundedReceiver<String>>) -> Option<String> {
    match kills {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn joined(c: &mut CatchUp) -> Result<Result<(), sync::SyncError>, tokio::task::JoinError> {
    match c {
        CatchUp::Running(h) => h.await,
        _ => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ContainerInfo, ContainerState};

    /// One call a watcher got: its name, the task, and whether the model
    /// it was given already saw the task's container exit.
    type Call = (&'static str, String, bool);

    /// A watcher that writes down each call.
    #[derive(Clone, Default)]
    struct Recorder(Arc<Mutex<Vec<Call>>>);

    impl Recorder {
        fn note(&self, call: &'static str, task: &str, m: &NodeModel) {
            let exited = m.container_state(task) == Some(ContainerState::Exited);
            self.0.lock().unwrap().push((call, task.to_owned(), exited));
        }
    }

    impl TaskWatcher for Recorder {
        fn baseline(&mut self, m: &NodeModel) {
            self.note("baseline", "", m);
        }
        fn on_exit(&mut self, m: &NodeModel, exit: &TaskExit) {
            self.note("exit", &exit.container_id, m);
        }
        fn on_oom(&mut self, m: &NodeModel, task: &str, _: u64, _: Instant) {
            self.note("oom", task, m);
        }
        fn deadline(&self) -> Option<Instant> {
            None
        }
        fn on_deadline(&mut self, m: &NodeModel, _: Instant) {
            self.note("deadline", "", m);
        }
        fn sweep(&mut self, m: &NodeModel, _: u64) {
            self.note("sweep", "", m);
        }
    }

    #[tokio::test]
    async fn each_event_reaches_the_model_then_the_watcher() {
        let mut model = NodeModel::new(1 << 30);
        model.upsert_sandbox(crate::model::tests::sandbox("s1", "/kubepods/pods1"));
        model.upsert_container(ContainerInfo {
            id: "c1".into(),
            sandbox_id: "s1".into(),
            state: Some(ContainerState::Running),
            ..Default::default()
        });
        let model = Arc::new(RwLock::new(model));
        // Never dialled: the events are handed in, not subscribed to.
        let upstream =
            Upstream::new(super::super::RuntimeEndpoint::parse("/nowhere.sock").unwrap());
        let seen = Recorder::default();
        let mut events = TaskEvents::new(model.clone(), upstream).with_watcher(seen.clone());
        events
            .apply(TaskEvent::Oom {
                container_id: "c1".into(),
                at_unix_ms: 1,
            })
            .await;
        let exit = TaskExit {
            container_id: "c1".into(),
            process_id: "c1".into(),
            pid: 7,
            exit_status: 137,
            exited_at_unix_ms: 2,
        };
        events.apply(TaskEvent::Exit(exit)).await;
        events.sweep().await;
        let calls = seen.0.lock().unwrap().clone();
        assert_eq!(
            calls,
            [
                ("oom", "c1".to_owned(), false),
                ("exit", "c1".to_owned(), true),
                ("sweep", String::new(), false),
            ]
        );
        let m = model.read_locked();
        assert_eq!(m.container_state("c1"), Some(ContainerState::Exited));
    }

    #[test]
    fn a_runtime_down_for_a_minute_costs_a_few_dozen_attempts() {
        // Never a busy loop: the sum of waits over 60 s of failures.
        let mut b = Backoff::new(MIN_WAIT, MAX_WAIT);
        let (mut t, mut attempts) = (Duration::ZERO, 0);
        while t < Duration::from_secs(60) {
            t += b.after(false);
            attempts += 1;
        }
        assert!(attempts <= 35, "{attempts} attempts");
    }
}
