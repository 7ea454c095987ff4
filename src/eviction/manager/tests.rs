//! `round()` with fakes behind every seam: no runtime, no cgroups, no
//! sleeps. The fake node holds each signal's available amount; stopping a
//! pod gives back what it uses (at once, or never for a disk eviction whose
//! space is still on its way), node-level reclaim gives back what it is set
//! to; the clock moves only when a test moves it. The cases follow the
//! kubelet's `pkg/kubelet/eviction/eviction_manager_test.go` (memory
//! pressure with hard and soft thresholds, minimum reclaim, node reclaim
//! functions, the transition period, admission) plus criguard's dry run.

use std::collections::BTreeMap;
use std::sync::Mutex;

use futures::FutureExt;
use futures::future::BoxFuture;

use super::*;
use crate::config::Amount;
use crate::eviction::admission::decide;
use crate::eviction::thresholds::Observation;
use crate::model::Pod;
use crate::model::qos::QosClass;
use crate::signals::table::Refusal;

const MI: i64 = 1 << 20;
const GI: i64 = 1 << 30;
/// The fake wall clock's start, ms since the epoch.
const EPOCH_MS: u64 = 1_700_000_000_000;

/// A pod on the fake node.
struct FakePod {
    pod: Pod,
    /// The signal its usage counts against.
    signal: Signal,
    /// What it uses; stopping it gives this back.
    usage: i64,
    /// Whether stopping it gives the space back at once (false: the
    /// runtime's background removal has not landed yet).
    lands: bool,
    stopped: bool,
}

/// The fake node's state.
struct State {
    elapsed: Duration,
    available: BTreeMap<Signal, i64>,
    pods: Vec<FakePod>,
    /// What dead-container GC and image GC give back to each disk signal.
    container_gc_frees: i64,
    image_gc_frees: i64,
    /// Whether the runtime answers StopPodSandbox.
    stop_answers: bool,
    /// Every action on the node and every API report, in order.
    log: Vec<String>,
    /// Every set of node conditions written to the API.
    conditions: Vec<BTreeSet<Condition>>,
}

/// One fake node behind every seam.
struct Node {
    start: Instant,
    state: Mutex<State>,
}

const CAPACITY: u64 = 8 << 30;

impl Node {
    fn new(available: &[(Signal, i64)]) -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            state: Mutex::new(State {
                elapsed: Duration::ZERO,
                available: available.iter().copied().collect(),
                pods: Vec::new(),
                container_gc_frees: 0,
                image_gc_frees: 0,
                stop_answers: true,
                log: Vec::new(),
                conditions: Vec::new(),
            }),
        })
    }

    fn with(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.state.lock().unwrap());
    }

    /// Adds pod `name` of class `qos` using `usage` of `signal`.
    fn add(&self, name: &str, qos: QosClass, signal: Signal, usage: i64) {
        let pod = Pod {
            uid: format!("uid-{name}"),
            name: name.into(),
            namespace: "default".into(),
            sandbox_id: format!("sb-{name}"),
            attempt: 0,
            cgroup_parent: String::new(),
            log_directory: String::new(),
            qos,
            priority: 0,
            static_pod: false,
            critical: false,
            grace_period_s: Some(30),
            state: SandboxState::Ready,
            created_at_ns: 0,
            containers: BTreeMap::new(),
            source: Default::default(),
            requests: Default::default(),
        };
        self.with(|s| {
            s.pods.push(FakePod {
                pod,
                signal,
                usage,
                lands: true,
                stopped: false,
            })
        });
    }

    fn set(&self, signal: Signal, available: i64) {
        self.with(|s| {
            s.available.insert(signal, available);
        });
    }

    fn advance(&self, d: Duration) {
        self.with(|s| s.elapsed += d);
    }

    fn log(&self) -> Vec<String> {
        self.state.lock().unwrap().log.clone()
    }

    fn last_conditions(&self) -> BTreeSet<Condition> {
        let s = self.state.lock().unwrap();
        s.conditions.last().cloned().unwrap_or_default()
    }

    /// The pods not stopped and not in `tried`, largest usage first.
    fn ranked(&self, tried: &BTreeSet<String>) -> Vec<Victim> {
        let s = self.state.lock().unwrap();
        let mut pods: Vec<&FakePod> = s
            .pods
            .iter()
            .filter(|p| !p.stopped && !tried.contains(&p.pod.sandbox_id))
            .collect();
        pods.sort_by_key(|p| std::cmp::Reverse(p.usage));
        pods.into_iter()
            .map(|p| Victim {
                pod: p.pod.clone(),
                usage: Some(p.usage),
                request: 0,
                heaviest: None,
                reclaimable: p.usage as u64,
            })
            .collect()
    }

    /// Gives `freed` back to every disk signal observed.
    fn free_disk(s: &mut State, freed: i64) {
        for (sig, avail) in s.available.iter_mut() {
            if sig.ranking() == Ranking::Disk {
                *avail += freed;
            }
        }
    }
}

impl Signals for Node {
    fn observe(&self) -> BoxFuture<'_, Observations> {
        let s = self.state.lock().unwrap();
        let mut obs = Observations::new(self.start + s.elapsed);
        for (sig, available) in &s.available {
            let o = Observation {
                available: *available,
                capacity: CAPACITY,
            };
            obs.signals.insert(*sig, o);
        }
        futures::future::ready(obs).boxed()
    }
}

impl Rank for Node {
    fn memory<'a>(&'a self, tried: &'a BTreeSet<String>) -> BoxFuture<'a, Vec<Victim>> {
        futures::future::ready(self.ranked(tried)).boxed()
    }

    fn pids<'a>(&'a self, tried: &'a BTreeSet<String>) -> BoxFuture<'a, Vec<Victim>> {
        futures::future::ready(self.ranked(tried)).boxed()
    }

    /// Only the pods whose usage counts against swap: a round that asks
    /// the wrong ranking picks another pod.
    fn swap<'a>(&'a self, tried: &'a BTreeSet<String>) -> BoxFuture<'a, Vec<Victim>> {
        let swapping: BTreeSet<String> = (self.state.lock().unwrap().pods.iter())
            .filter(|p| p.signal == Signal::SwapAvailable)
            .map(|p| p.pod.sandbox_id.clone())
            .collect();
        let mut ranked = self.ranked(tried);
        ranked.retain(|v| swapping.contains(&v.pod.sandbox_id));
        futures::future::ready(ranked).boxed()
    }

    fn disk<'a>(&'a self, _: Signal, tried: &'a BTreeSet<String>) -> BoxFuture<'a, Vec<Victim>> {
        futures::future::ready(self.ranked(tried)).boxed()
    }
}

impl NodeReclaim for Node {
    fn dedicated_imagefs(&self) -> bool {
        false
    }

    fn collect_containers(&self) -> BoxFuture<'_, u64> {
        let mut s = self.state.lock().unwrap();
        s.log.push("collect containers".into());
        let freed = s.container_gc_frees;
        Node::free_disk(&mut s, freed);
        futures::future::ready(freed as u64).boxed()
    }

    fn free_images(&self, bytes: u64) -> BoxFuture<'_, u64> {
        let mut s = self.state.lock().unwrap();
        s.log.push(format!("free images {}Mi", bytes as i64 / MI));
        let freed = s.image_gc_frees;
        Node::free_disk(&mut s, freed);
        futures::future::ready(freed as u64).boxed()
    }
}

impl PodKiller for Node {
    fn kill_now(&self, pod: &Pod) -> bool {
        self.with(|s| s.log.push(format!("kill {}", pod.name)));
        true
    }

    fn stop<'a>(&'a self, pod: &'a Pod, grace_s: i64) -> BoxFuture<'a, bool> {
        let mut s = self.state.lock().unwrap();
        s.log.push(format!("stop {} grace {grace_s}", pod.name));
        let p = s
            .pods
            .iter_mut()
            .find(|p| p.pod.sandbox_id == pod.sandbox_id)
            .expect("a pod of the node");
        p.stopped = true;
        let (signal, usage, lands) = (p.signal, p.usage, p.lands);
        if lands {
            *s.available.get_mut(&signal).expect("an observed signal") += usage;
        }
        futures::future::ready(s.stop_answers).boxed()
    }

    fn retry_stop(&self, sandbox_id: &str, _stopped: Box<dyn FnOnce() + Send>) {
        self.with(|s| s.log.push(format!("retry {sandbox_id}")));
    }

    fn remove_containers<'a>(&'a self, pod: &'a Pod) -> BoxFuture<'a, ()> {
        self.with(|s| s.log.push(format!("remove {}", pod.name)));
        futures::future::ready(()).boxed()
    }
}

impl Reporter for Node {
    fn node_conditions(&self, conditions: &BTreeSet<Condition>) {
        self.with(|s| s.conditions.push(conditions.clone()));
    }

    fn pod_evicted(&self, e: PodEviction) -> BoxFuture<'_, ()> {
        self.with(|s| s.log.push(format!("report {}", e.name)));
        futures::future::ready(()).boxed()
    }
}

impl Clock for Node {
    fn now(&self) -> Instant {
        self.start + self.state.lock().unwrap().elapsed
    }

    fn unix_ms(&self) -> u64 {
        EPOCH_MS + self.state.lock().unwrap().elapsed.as_millis() as u64
    }
}

fn config(hard: Vec<Threshold>, soft: Vec<Threshold>) -> EvictionConfig {
    EvictionConfig {
        hard,
        soft,
        max_pod_grace_period: Some(Duration::from_secs(10)),
        pressure_transition_period: Duration::from_secs(300),
        housekeeping_interval: Duration::from_secs(10),
    }
}

fn hard(signal: Signal, amount: i64) -> Threshold {
    Threshold::hard(signal, Amount::Quantity(amount as u64))
}

fn soft(signal: Signal, amount: i64, grace_s: u64) -> Threshold {
    Threshold {
        grace_period: Some(Duration::from_secs(grace_s)),
        ..hard(signal, amount)
    }
}

/// A manager on `node` with every seam, node-level reclaim and the API
/// report; and the status it keeps.
fn manager(
    node: &Arc<Node>,
    config: EvictionConfig,
    dry_run: bool,
) -> (EvictionManager, Arc<RwLock<NodeStatus>>) {
    let model = Arc::new(RwLock::new(NodeModel::new(CAPACITY as i64)));
    manager_on(node, config, dry_run, model)
}

/// [`manager`] with the node model `model`.
fn manager_on(
    node: &Arc<Node>,
    config: EvictionConfig,
    dry_run: bool,
    model: Arc<RwLock<NodeModel>>,
) -> (EvictionManager, Arc<RwLock<NodeStatus>>) {
    let status = Arc::new(RwLock::new(NodeStatus::default()));
    let seams = Seams {
        signals: node.clone(),
        rank: node.clone(),
        killer: node.clone(),
        clock: node.clone(),
    };
    let m = EvictionManager::new(config, seams, model, status.clone(), dry_run)
        .with_node_reclaim(node.clone())
        .with_report(node.clone());
    (m, status)
}

fn names(evictions: &[Eviction]) -> Vec<&str> {
    evictions.iter().map(|e| e.pod.as_str()).collect()
}

fn conditions(status: &RwLock<NodeStatus>) -> BTreeSet<Condition> {
    status.read().unwrap().conditions.clone()
}

use Signal::{MemoryAvailable as Memory, NodefsAvailable as Nodefs};

#[tokio::test]
async fn a_hard_threshold_evicts_one_pod_at_once_with_no_grace() {
    let node = Node::new(&[(Memory, 900 * MI)]);
    node.add("big", QosClass::BestEffort, Memory, 600 * MI);
    node.add("small", QosClass::BestEffort, Memory, 200 * MI);
    let (mut m, status) = manager(&node, config(vec![hard(Memory, GI)], vec![]), false);
    let made = m.round().await;
    // The first of the ranking goes, and it was enough: the small one stays.
    assert_eq!(names(&made), ["default/big"]);
    assert_eq!(made[0].grace_s, 0);
    assert!(
        made[0].message.starts_with(
            "The node was low on resource: memory. Threshold quantity: 1Gi, available: 900Mi."
        ),
        "{}",
        made[0].message
    );
    // Reported before it is killed, killed before the runtime stops it.
    assert_eq!(node.log(), ["report big", "kill big", "stop big grace 0"]);
    {
        let st = status.read().unwrap();
        assert_eq!(st.evictions, made);
        assert!(st.evicted.get("uid-big").is_some(), "never admitted again");
        assert!(st.conditions.contains(&Condition::MemoryPressure));
    }
    // Relieved: the next round does nothing.
    assert!(m.round().await.is_empty());
}

#[tokio::test]
async fn a_soft_threshold_acts_only_after_its_grace_period() {
    let node = Node::new(&[(Memory, 1500 * MI)]);
    node.add("big", QosClass::Burstable, Memory, 600 * MI);
    let (mut m, status) = manager(&node, config(vec![], vec![soft(Memory, 2 * GI, 60)]), false);
    assert!(m.round().await.is_empty());
    // The condition holds from the first observation, as the kubelet's.
    assert!(conditions(&status).contains(&Condition::MemoryPressure));
    node.advance(Duration::from_secs(59));
    assert!(m.round().await.is_empty());
    assert!(node.log().is_empty());
    node.advance(Duration::from_secs(1));
    let made = m.round().await;
    assert_eq!(names(&made), ["default/big"]);
    // The pod's 30 s, capped by evictionMaxPodGracePeriod; no cgroup kill.
    assert_eq!(made[0].grace_s, 10);
    assert_eq!(node.log(), ["report big", "stop big grace 10"]);
}

#[tokio::test]
async fn a_soft_threshold_relieved_before_its_grace_period_starts_over() {
    let node = Node::new(&[(Memory, 1500 * MI)]);
    node.add("big", QosClass::Burstable, Memory, 600 * MI);
    let (mut m, _) = manager(&node, config(vec![], vec![soft(Memory, 2 * GI, 60)]), false);
    assert!(m.round().await.is_empty());
    node.advance(Duration::from_secs(30));
    node.set(Memory, 3 * GI);
    assert!(m.round().await.is_empty());
    // Met again past the first grace period: its grace counts from now.
    node.advance(Duration::from_secs(31));
    node.set(Memory, 1500 * MI);
    assert!(m.round().await.is_empty());
    node.advance(Duration::from_secs(59));
    assert!(m.round().await.is_empty());
    assert!(node.log().is_empty(), "{:?}", node.log());
    node.advance(Duration::from_secs(1));
    assert_eq!(names(&m.round().await), ["default/big"]);
}

#[tokio::test]
async fn minimum_reclaim_keeps_evicting_until_the_threshold_plus_it() {
    let pods = |node: &Node| {
        for (name, usage) in [("a", 300), ("b", 250), ("c", 200), ("d", 100)] {
            node.add(name, QosClass::BestEffort, Memory, usage * MI);
        }
    };
    // Without minimum reclaim one pod lifts 900Mi over the 1Gi line.
    let node = Node::new(&[(Memory, 900 * MI)]);
    pods(&node);
    let (mut m, _) = manager(&node, config(vec![hard(Memory, GI)], vec![]), false);
    assert_eq!(names(&m.round().await), ["default/a"]);
    // With 500Mi more to reclaim, pods go one at a time until 1524Mi.
    let node = Node::new(&[(Memory, 900 * MI)]);
    pods(&node);
    let t = Threshold {
        min_reclaim: Some(Amount::Quantity(500 << 20)),
        ..hard(Memory, GI)
    };
    let (mut m, _) = manager(&node, config(vec![t], vec![]), false);
    assert_eq!(
        names(&m.round().await),
        ["default/a", "default/b", "default/c"]
    );
    // 1650Mi now: past the threshold and its minimum reclaim, the episode
    // is over; d stays.
    assert!(m.round().await.is_empty());
}

#[tokio::test]
async fn node_level_reclaim_comes_first_and_spares_the_pods_when_enough() {
    let node = Node::new(&[(Nodefs, 800 * MI)]);
    node.add("writer", QosClass::BestEffort, Nodefs, 300 * MI);
    node.with(|s| {
        s.container_gc_frees = 100 * MI;
        s.image_gc_frees = 500 * MI;
    });
    let (mut m, status) = manager(&node, config(vec![hard(Nodefs, GI)], vec![]), false);
    assert!(m.round().await.is_empty());
    // Dead containers first; images asked for what is still missing.
    assert_eq!(node.log(), ["collect containers", "free images 124Mi"]);
    assert!(status.read().unwrap().evictions.is_empty());
}

#[tokio::test]
async fn when_node_level_reclaim_falls_short_a_pod_goes_with_its_containers() {
    let node = Node::new(&[(Nodefs, 800 * MI)]);
    node.add("writer", QosClass::BestEffort, Nodefs, 300 * MI);
    node.add("reader", QosClass::BestEffort, Nodefs, 10 * MI);
    node.with(|s| s.image_gc_frees = 50 * MI);
    let (mut m, _) = manager(&node, config(vec![hard(Nodefs, GI)], vec![]), false);
    assert_eq!(names(&m.round().await), ["default/writer"]);
    assert_eq!(
        node.log(),
        [
            "collect containers",
            "free images 224Mi",
            "report writer",
            "kill writer",
            "stop writer grace 0",
            // Stopping frees no disk: the containers go too.
            "remove writer",
        ]
    );
}

#[tokio::test]
async fn a_disk_eviction_whose_space_is_on_its_way_takes_no_second_pod() {
    let node = Node::new(&[(Nodefs, 900 * MI)]);
    node.add("w1", QosClass::BestEffort, Nodefs, 300 * MI);
    node.add("w2", QosClass::BestEffort, Nodefs, 200 * MI);
    node.with(|s| s.pods.iter_mut().for_each(|p| p.lands = false));
    let cfg = config(vec![hard(Nodefs, GI)], vec![]);
    let status = Arc::new(RwLock::new(NodeStatus::default()));
    let seams = Seams {
        signals: node.clone(),
        rank: node.clone(),
        killer: node.clone(),
        clock: node.clone(),
    };
    let model = Arc::new(RwLock::new(NodeModel::new(CAPACITY as i64)));
    // No node-level reclaim: straight to the pods.
    let mut m = EvictionManager::new(cfg, seams, model, status, false);
    // w1's 300Mi cover the 124Mi missing once they land: w2 stays.
    assert_eq!(names(&m.round().await), ["default/w1"]);
    assert!(m.round().await.is_empty());
    // They never landed: past IN_FLIGHT_FOR the next pod goes.
    node.advance(IN_FLIGHT_FOR);
    assert_eq!(names(&m.round().await), ["default/w2"]);
}

#[tokio::test]
async fn conditions_outlast_the_pressure_by_the_transition_period() {
    let node = Node::new(&[(Memory, 900 * MI)]);
    node.add("big", QosClass::BestEffort, Memory, 600 * MI);
    let (mut m, status) = manager(&node, config(vec![hard(Memory, GI)], vec![]), false);
    assert_eq!(m.round().await.len(), 1);
    let memory = BTreeSet::from([Condition::MemoryPressure]);
    assert_eq!(node.last_conditions(), memory);
    // Relieved since the eviction; the condition stays 300 s from the
    // last observation that met the threshold.
    node.advance(Duration::from_secs(299));
    assert!(m.round().await.is_empty());
    assert_eq!(conditions(&status), memory);
    assert_eq!(node.last_conditions(), memory);
    node.advance(Duration::from_secs(1));
    assert!(m.round().await.is_empty());
    assert!(conditions(&status).is_empty());
    assert!(node.last_conditions().is_empty());
}

#[tokio::test]
async fn admission_refuses_by_the_conditions_the_round_set() {
    let now = EPOCH_MS;
    let node = Node::new(&[(Memory, 900 * MI)]);
    node.add("big", QosClass::BestEffort, Memory, 600 * MI);
    let (mut m, status) = manager(&node, config(vec![hard(Memory, GI)], vec![]), false);
    m.round().await;
    let refused = |uid: &str, qos, critical| decide(&status, uid, qos, critical, now).err();
    // MemoryPressure: no new BestEffort pod; the others are admitted.
    let r = refused("uid-new", QosClass::BestEffort, false).map(|r| r.0);
    assert_eq!(r, Some(Refusal::MemoryPressure));
    assert!(refused("uid-new", QosClass::Burstable, false).is_none());
    // The evicted pod never comes back, whatever its class.
    let r = refused("uid-big", QosClass::Guaranteed, true).map(|r| r.0);
    assert_eq!(r, Some(Refusal::Evicted));

    // DiskPressure (nothing to reclaim, no pod to evict): no new pod but
    // critical ones.
    let node = Node::new(&[(Nodefs, 900 * MI)]);
    let (mut m, status) = manager(&node, config(vec![hard(Nodefs, GI)], vec![]), false);
    assert!(m.round().await.is_empty());
    let refused = |qos, critical| decide(&status, "uid-new", qos, critical, now).err();
    let r = refused(QosClass::Guaranteed, false).map(|r| r.0);
    assert_eq!(r, Some(Refusal::DiskPressure));
    assert!(refused(QosClass::Guaranteed, true).is_none());
}

#[tokio::test]
async fn a_dry_run_decides_and_records_but_reclaims_stops_and_reports_nothing() {
    let node = Node::new(&[(Nodefs, 800 * MI)]);
    node.add("writer", QosClass::BestEffort, Nodefs, 300 * MI);
    node.with(|s| s.image_gc_frees = 500 * MI);
    let (mut m, status) = manager(&node, config(vec![hard(Nodefs, GI)], vec![]), true);
    let made = m.round().await;
    assert_eq!(names(&made), ["default/writer"]);
    assert!(made[0].dry_run);
    assert!(node.log().is_empty(), "{:?}", node.log());
    // No condition or taint for the API; admission refuses nothing for it.
    assert!(node.last_conditions().is_empty());
    {
        let st = status.read().unwrap();
        assert_eq!(st.evictions, made, "listed by `criguard evictions`");
        assert!(st.evicted.get("uid-writer").is_none(), "admitted again");
        assert!(st.conditions.contains(&Condition::DiskPressure));
    }
    assert!(decide(&status, "uid-new", QosClass::BestEffort, false, EPOCH_MS).is_ok());
}

#[tokio::test]
async fn a_stop_the_runtime_does_not_answer_is_retried_and_the_round_goes_on() {
    let node = Node::new(&[(Memory, 900 * MI)]);
    node.add("big", QosClass::BestEffort, Memory, 600 * MI);
    node.with(|s| s.stop_answers = false);
    let (mut m, status) = manager(&node, config(vec![hard(Memory, GI)], vec![]), false);
    assert_eq!(names(&m.round().await), ["default/big"]);
    assert_eq!(
        node.log(),
        ["report big", "kill big", "stop big grace 0", "retry sb-big"]
    );
    assert_eq!(status.read().unwrap().evictions.len(), 1);
}

#[tokio::test]
async fn a_pod_evicted_by_an_earlier_process_is_stopped_once_by_this_one() {
    let node = Node::new(&[(Memory, 4 * GI)]);
    node.add("hog", QosClass::BestEffort, Memory, 600 * MI);
    node.add("web", QosClass::BestEffort, Memory, 100 * MI);
    let model = Arc::new(RwLock::new(NodeModel::new(CAPACITY as i64)));
    for name in ["hog", "web"] {
        model
            .write()
            .unwrap()
            .upsert_sandbox(crate::model::SandboxInfo {
                id: format!("sb-{name}"),
                uid: format!("uid-{name}"),
                name: name.into(),
                namespace: "default".into(),
                state: Some(SandboxState::Ready),
                ..Default::default()
            });
    }
    let (mut m, status) = manager_on(&node, config(vec![hard(Memory, GI)], vec![]), false, model);
    // What the earlier process saved: the hog evicted, its stop not seen through.
    (status.write().unwrap().evicted).insert("uid-hog", "default/hog", "m", EPOCH_MS);
    assert!(m.round().await.is_empty(), "no pressure: nothing evicted");
    assert_eq!(node.log(), ["kill hog", "stop hog grace 0"]);
    m.round().await;
    assert_eq!(node.log().len(), 2, "stopped once: {:?}", node.log());
}

#[tokio::test]
async fn memory_goes_before_disk_and_a_threshold_with_no_victim_ends_the_round() {
    let node = Node::new(&[(Memory, 900 * MI), (Nodefs, 900 * MI)]);
    node.add("big", QosClass::BestEffort, Memory, 600 * MI);
    let cfg = config(vec![hard(Nodefs, GI), hard(Memory, GI)], vec![]);
    let (mut m, status) = manager(&node, cfg, false);
    // Memory first; then disk, whose reclaim frees nothing and whose only
    // pod is gone: the round ends with the pressure still there.
    assert_eq!(names(&m.round().await), ["default/big"]);
    assert_eq!(
        node.log(),
        [
            "report big",
            "kill big",
            "stop big grace 0",
            "collect containers",
            "free images 124Mi",
        ]
    );
    let both = BTreeSet::from([Condition::MemoryPressure, Condition::DiskPressure]);
    assert_eq!(conditions(&status), both);
}

#[tokio::test]
async fn a_swap_threshold_evicts_by_the_swap_ranking_and_admits_as_memory_pressure() {
    let swap = Signal::SwapAvailable;
    let node = Node::new(&[(swap, 100 * MI)]);
    node.add("swapper", QosClass::Burstable, swap, 300 * MI);
    // Larger, but its usage is memory: the memory ranking would pick it.
    node.add(
        "big",
        QosClass::BestEffort,
        Signal::MemoryAvailable,
        600 * MI,
    );
    let (mut m, status) = manager(&node, config(vec![hard(swap, 200 * MI)], vec![]), false);
    let made = m.round().await;
    assert_eq!(names(&made), ["default/swapper"]);
    assert!(
        made[0].message.starts_with(
            "The node was low on resource: swap. Threshold quantity: 200Mi, available: 100Mi."
        ),
        "{}",
        made[0].message
    );
    assert!(conditions(&status).contains(&Condition::MemoryPressure));
    let refused = |qos| decide(&status, "uid-new", qos, false, EPOCH_MS).err();
    assert_eq!(
        refused(QosClass::BestEffort).map(|r| r.0),
        Some(Refusal::MemoryPressure)
    );
    assert!(refused(QosClass::Burstable).is_none());
}

#[tokio::test]
async fn a_stall_threshold_evicts_once_per_psi_window_by_the_memory_ranking() {
    let stall = Signal::MemoryPressureSome;
    // 50% stalled; evicting a pod does not lower PSI's average at once.
    let node = Node::new(&[(stall, 5_000), (Memory, 8 * GI)]);
    node.add("big", QosClass::BestEffort, Memory, 600 * MI);
    node.add("small", QosClass::BestEffort, Memory, 200 * MI);
    let (mut m, status) = manager(&node, config(vec![hard(stall, 8_000)], vec![]), false);
    let made = m.round().await;
    assert_eq!(names(&made), ["default/big"], "one pod per round, not both");
    assert!(
        made[0].message.starts_with(
            "The node was low on resource: memory. Threshold quantity: stalled more than"
        ),
        "{}",
        made[0].message
    );
    assert!(conditions(&status).contains(&Condition::MemoryPressure));
    node.advance(Duration::from_secs(5));
    assert!(m.round().await.is_empty(), "within PSI's window");
    node.advance(Duration::from_secs(5));
    assert_eq!(names(&m.round().await), ["default/small"]);
}

/// A poll's reading of `memory.available` at `available`.
fn crossing(available: i64) -> crate::signals::notify::Crossing {
    crate::signals::notify::Crossing {
        signal: Memory,
        reading: Observation {
            available,
            capacity: CAPACITY,
        },
    }
}

#[tokio::test]
async fn a_crossing_kills_the_ready_victim_at_once_and_the_round_records_it() {
    let node = Node::new(&[(Memory, 300 * MI)]);
    node.add("grower", QosClass::BestEffort, Memory, 500 * MI);
    node.add("steady", QosClass::BestEffort, Memory, 100 * MI);
    let (mut m, status) = manager(&node, config(vec![hard(Memory, 200 * MI)], vec![]), false);
    // 100Mi above the line: no eviction, a ranking kept ready.
    assert!(m.round().await.is_empty());
    m.keep_ready().await;
    assert!(m.ready_refresh().is_some(), "near the line");
    // A fresh ranking would now choose the steady pod; the crossing kills
    // by the ranking it kept, before any observation.
    node.with(|s| s.pods[1].usage = 900 * MI);
    m.kill_at_crossing(&crossing(190 * MI));
    assert_eq!(node.log(), ["kill grower"]);
    // The kill already gave the memory back: the round still records the
    // eviction of that pod, by the crossing's reading, and of no other.
    node.set(Memory, 600 * MI);
    let made = m.round().await;
    assert_eq!(names(&made), ["default/grower"]);
    assert!(
        made[0].message.contains("available: 190Mi"),
        "{}",
        made[0].message
    );
    assert_eq!(
        node.log(),
        [
            "kill grower",
            "report grower",
            "kill grower",
            "stop grower grace 0"
        ]
    );
    assert!(conditions(&status).contains(&Condition::MemoryPressure));
    assert!(m.round().await.is_empty(), "relieved");
}

#[tokio::test]
async fn no_kill_at_a_crossing_without_a_fresh_ranking_or_a_hard_threshold() {
    let node = Node::new(&[(Memory, 300 * MI)]);
    node.add("grower", QosClass::BestEffort, Memory, 500 * MI);
    let far = config(vec![hard(Memory, 100 * MI)], vec![]);
    let (mut m, _) = manager(&node, far, false);
    // 200Mi above its line: no ranking kept, nothing killed at a crossing.
    m.round().await;
    m.keep_ready().await;
    assert!(m.ready_refresh().is_none());
    m.kill_at_crossing(&crossing(90 * MI));
    // Near, but the ranking has gone stale.
    let (mut m, _) = manager(&node, config(vec![hard(Memory, 200 * MI)], vec![]), false);
    m.round().await;
    m.keep_ready().await;
    node.advance(crate::eviction::ready::MAX_AGE + Duration::from_millis(1));
    m.kill_at_crossing(&crossing(190 * MI));
    // A soft threshold waits for its grace period: never killed at once.
    let grace = config(vec![], vec![soft(Memory, 200 * MI, 10)]);
    let (mut m, _) = manager(&node, grace, false);
    m.round().await;
    m.keep_ready().await;
    m.kill_at_crossing(&crossing(190 * MI));
    // A dry run kills nothing.
    let (mut m, _) = manager(&node, config(vec![hard(Memory, 200 * MI)], vec![]), true);
    m.round().await;
    m.keep_ready().await;
    m.kill_at_crossing(&crossing(190 * MI));
    assert_eq!(node.log(), Vec::<String>::new());
}
