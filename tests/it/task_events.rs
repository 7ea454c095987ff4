//! containerd's task events against a real private containerd: the model
//! learns of containers (and a sandbox) that end by themselves from
//! `/tasks/exit` alone, with no sync running, and keeps doing so after
//! containerd is killed and started again, without a busy loop while it is
//! down.

use crate::common;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use common::containerd::{Clients, PrivateContainerd, unique};
use common::pods::{CgroupRoot, init_pid, mem_total, remove_pods, run_pod, sleeper};
use criguard::model::{ContainerState, NodeModel, SandboxState};
use criguard::runtime::events::TOPIC_EXIT;
use criguard::runtime::sync;
use criguard::runtime::track::TaskEvents;
use criguard::runtime::track::{TaskEventMetrics, TopicLabels};
use criguard::runtime::{RuntimeEndpoint, Upstream};
use criguard_test_kit::kubelet::PodSpec;
use k8s_cri::v1 as cri;

fn exits_seen(m: &TaskEventMetrics) -> u64 {
    m.events
        .get_or_create(&TopicLabels { topic: TOPIC_EXIT })
        .get()
}

/// Runs `true` in `container` until the events loop counts an exit (the
/// exec's own): proof that a subscription is registered and delivering;
/// then waits for its catch-up sync, so that what follows can only reach
/// the model through events.
async fn wait_subscribed(direct: &Clients, container: &str, m: &TaskEventMetrics, nth: u64) {
    let before = exits_seen(m);
    common::poll_until(Duration::from_secs(30), "a live subscription", || {
        let mut rt = direct.rt.clone();
        let id = container.to_owned();
        async move {
            rt.exec_sync(cri::ExecSyncRequest {
                container_id: id,
                cmd: vec!["true".into()],
                timeout: 5,
            })
            .await
            .ok()?;
            // The exec's exit event follows its answer closely.
            for _ in 0..25 {
                if exits_seen(m) > before {
                    return Some(());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            None
        }
    })
    .await;
    common::poll_until(Duration::from_secs(10), "the catch-up sync", || async {
        (m.catch_ups.get() >= nth).then_some(())
    })
    .await;
}

fn state(model: &RwLock<NodeModel>, sandbox: &str, container: &str) -> ContainerState {
    let m = model.read().unwrap();
    m.pod(sandbox).unwrap().containers[container].state
}

/// SIGKILLs a container's (or sandbox's) init process from the host: an
/// exit containerd did not cause and criguard did not forward.
async fn kill_init(direct: &mut Clients, container: Option<&str>, sandbox: Option<&str>) {
    let pid = init_pid(direct, container, sandbox).await;
    // SAFETY: plain kill(2) of a process of this test's own container.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
}

async fn wait_exited(model: &RwLock<NodeModel>, sandbox: &str, container: &str, what: &str) {
    common::poll_until(Duration::from_secs(5), what, || async {
        (state(model, sandbox, container) == ContainerState::Exited).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exits_reach_the_model_from_events_across_a_containerd_restart() {
    let root = format!("/{}", unique("criguard-taskev"));
    let _cg = CgroupRoot(root.clone());
    let ctrd = PrivateContainerd::start();
    let upstream = Upstream::new(RuntimeEndpoint::parse(ctrd.socket.to_str().unwrap()).unwrap());
    let mut direct = ctrd.direct();
    let mut pod = PodSpec::new("exits", &unique("exits"));
    pod.cgroup_root = format!("{root}/kubepods");
    pod.log_root = ctrd.dir.join("pods").to_str().unwrap().into();
    pod.node_memory = mem_total();
    pod.containers = ["a", "b", "c", "probe"].map(sleeper).to_vec();
    let (sb, ids) = run_pod(&mut direct.rt, &pod, None).await;
    let [a, b, c, probe] = <[String; 4]>::try_from(ids).unwrap();

    // The model as criguard rebuilds it; no periodic sync from here on.
    let model = Arc::new(RwLock::new(
        sync::rebuild(&upstream, mem_total()).await.unwrap(),
    ));
    assert_eq!(state(&model, &sb, &a), ContainerState::Running);
    let metrics = TaskEventMetrics::default();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let events = TaskEvents::new(model.clone(), upstream.clone()).with_metrics(metrics.clone());
    let task = tokio::spawn(events.run(async move {
        let mut rx = stop_rx;
        let _ = rx.wait_for(|s| *s).await;
    }));
    wait_subscribed(&direct, &probe, &metrics, 1).await;
    assert_eq!(
        state(&model, &sb, &probe),
        ContainerState::Running,
        "an exec's exit is not its container's"
    );

    // A container killed from outside: in the model within the deadline,
    // with no sync running.
    kill_init(&mut direct, Some(&a), None).await;
    wait_exited(&model, &sb, &a, "a's exit in the model").await;

    // containerd crashes and stays down for four subscription attempts;
    // b dies meanwhile.
    let attempts_before = metrics.subscriptions.get();
    let pid_b = init_pid(&mut direct, Some(&b), None).await;
    let down = std::time::Instant::now();
    ctrd.kill_daemon();
    // SAFETY: plain kill(2) of this test's container process.
    assert_eq!(unsafe { libc::kill(pid_b as i32, libc::SIGKILL) }, 0);
    let took = common::poll_until(
        Duration::from_secs(10),
        "four subscription attempts while containerd is down",
        || async {
            let attempts = metrics.subscriptions.get() - attempts_before;
            (attempts >= 4).then(|| down.elapsed())
        },
    )
    .await;
    // Back-off, not a busy loop: before the fourth attempt the loop waited
    // at least MIN_WAIT, then twice, four and eight times that (1.5 s in
    // all: fewer attempts a second than the 10 in 3 s once allowed),
    // however fast each failed attempt was.
    let waits = criguard::runtime::track::MIN_WAIT * (1 + 2 + 4 + 8);
    assert!(
        took >= waits,
        "four subscription attempts {took:?} after containerd went down: back-off, not a busy loop"
    );
    assert_eq!(
        state(&model, &sb, &b),
        ContainerState::Running,
        "not seen yet"
    );
    ctrd.restart_daemon();

    // b's exit happened with nobody to tell: the re-subscription's catch-up
    // (or the shim's late publish) brings it.
    common::poll_until(
        Duration::from_secs(20),
        "b's exit after the restart",
        || async { (state(&model, &sb, &b) == ContainerState::Exited).then_some(()) },
    )
    .await;
    // The new subscription delivers: c's exit arrives from events.
    wait_subscribed(&direct, &probe, &metrics, 2).await;
    kill_init(&mut direct, Some(&c), None).await;
    wait_exited(&model, &sb, &c, "c's exit after the restart").await;

    // The sandbox's pause task dies: the sandbox is NotReady, the probe
    // container still runs (the kubelet, not the model, stops it).
    kill_init(&mut direct, None, Some(&sb)).await;
    common::poll_until(Duration::from_secs(5), "the sandbox NotReady", || async {
        let m = model.read().unwrap();
        (m.pod(&sb)?.state == SandboxState::NotReady).then_some(())
    })
    .await;
    assert_eq!(state(&model, &sb, &probe), ContainerState::Running);

    let _ = stop_tx.send(true);
    task.await.unwrap();
    remove_pods(&mut direct.rt, [sb]).await;
}
