//! End to end under real memory pressure: a small kubepods memcg, pods of
//! every class created the kubelet's way, one of them growing. criguard must
//! stop exactly the pod the kubelet's ranking picks, no more, say why, and
//! keep new BestEffort pods and the evicted pod out while the pressure lasts.

use crate::common;

use std::time::Duration;

use common::containerd::CriguardProcess;
use common::pods::{hog, run_pod, sleeper};
use common::pressure::Pressure;
use criguard::model::SandboxState;
use criguard::signals::table::Condition;
use criguard_test_kit::kubelet::{ContainerSpec, PodSpec};
use k8s_cri::v1 as cri;

const MI: i64 = 1 << 20;

/// The pods of both tests, their memcg, and criguard in front of containerd.
/// Fields drop in order: criguard, then containerd and the cgroup root.
struct Scenario {
    guard: CriguardProcess,
    p: Pressure,
    port: u16,
    /// BestEffort hog, Burstable over request, Burstable under, Guaranteed.
    pods: Vec<PodSpec>,
    containers: Vec<String>,
}

impl Scenario {
    /// Starts everything with `thresholds` (criguard flags; housekeeping
    /// every 1s unless they set it) and waits until every pod holds its
    /// memory: a 320Mi pods memcg about 150Mi full.
    async fn start(thresholds: &[&str]) -> Self {
        let p = Pressure::build("criguard-evict").memory_mib(320).start();
        let port = common::metrics::free_port();
        let guard = p
            .guard()
            .metrics(port)
            .arg("--eviction-pressure-transition-period=5s")
            .args(thresholds)
            .start()
            .await;
        let hogging = |mib, grow, request, limit, cpu| ContainerSpec {
            command: hog(mib, grow),
            memory_request: request,
            memory_limit: limit,
            cpu_limit_milli: cpu,
            ..sleeper("app")
        };
        let pods = vec![
            p.pod("besteffort-hog", hogging(60, 160, 0, 0, 0)),
            p.pod("burstable-over", hogging(40, 0, 16 * MI, 0, 0)),
            p.pod("burstable-under", hogging(20, 0, 100 * MI, 0, 0)),
            p.pod("guaranteed", hogging(10, 0, 0, 64 * MI, 100)),
        ];
        let mut rt = guard.kubelet().rt;
        let mut containers = Vec::new();
        for pod in &pods {
            let (_, c) = run_pod(&mut rt, pod, None).await;
            containers.push(c[0].clone());
        }
        for c in &containers {
            common::pods::wait_holding(&p.ctrd.direct().rt, c, Duration::from_secs(60)).await;
        }
        assert!(
            guard.evictions().await.is_empty(),
            "nothing may be evicted before the pressure"
        );
        Self {
            guard,
            p,
            port,
            pods,
            containers,
        }
    }

    /// A pod spec placed in this scenario's memcg.
    fn spec(&self, name: &str, c: ContainerSpec) -> PodSpec {
        self.p.pod(name, c)
    }

    /// The BestEffort hog grows by 160Mi: allocatable drops below 64Mi.
    async fn grow(&self) {
        self.p.grow(&self.containers[0]).await;
    }

    async fn teardown(&self) {
        self.guard.remove_all_pods().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_pressure_evicts_the_first_ranked_pod_only_and_admission_follows() {
    let sc = Scenario::start(&["--eviction-hard=allocatableMemory.available<64Mi"]).await;
    let (guard, port) = (&sc.guard, sc.port);
    let besteffort = &sc.pods[0];
    let rt = guard.kubelet().rt;
    let spec = |name: &str, c: ContainerSpec| sc.spec(name, c);
    // A node agent watching criguard's admin API learns of the eviction.
    let mut watch = Box::pin(
        criguard::admin::watch_evictions(&guard.admin, false)
            .await
            .unwrap(),
    );
    sc.grow().await;
    let evictions = guard
        .first_evictions(Duration::from_secs(60), "an eviction")
        .await;
    assert_eq!(
        evictions[0].uid, besteffort.uid,
        "the BestEffort hog ranks first: {evictions:#?}"
    );
    let watched =
        tokio::time::timeout(Duration::from_secs(5), futures::StreamExt::next(&mut watch))
            .await
            .expect("WatchEvictions sent the eviction")
            .expect("the watch is open")
            .unwrap();
    assert_eq!(watched, evictions[0]);
    assert_eq!(evictions[0].signal, "allocatableMemory.available");
    assert!(
        evictions[0]
            .message
            .starts_with("The node was low on resource: memory."),
        "{}",
        evictions[0].message
    );
    assert!(evictions[0].available < 64 * MI);

    // Conditions: MemoryPressure while it lasts.
    let conditions = guard.conditions().await;
    assert!(
        conditions.conditions.contains(&Condition::MemoryPressure),
        "{conditions:?}"
    );

    // Admission under MemoryPressure: no new BestEffort pod, not the evicted
    // pod either; a Burstable pod is fine.
    let refused = |p: &PodSpec| {
        let mut rt = rt.clone();
        let config = p.sandbox_config();
        async move {
            std::fs::create_dir_all(config.log_directory.clone()).unwrap();
            rt.run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await
        }
    };
    let newcomer = spec("besteffort-new", sleeper("app"));
    let err = refused(&newcomer).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("MemoryPressure"), "{err:?}");
    let mut again = besteffort.clone();
    again.attempt = 1;
    let err = refused(&again).await.unwrap_err();
    assert!(err.message().contains("evicted"), "{err:?}");
    let welcome = spec(
        "burstable-new",
        ContainerSpec {
            memory_request: 8 * MI,
            ..sleeper("app")
        },
    );
    refused(&welcome)
        .await
        .expect("a Burstable pod is admitted under MemoryPressure");

    // No more victims than needed: the others all still run.
    let pods = guard.pods().await;
    for p in &pods {
        let want = if p.uid == besteffort.uid {
            SandboxState::NotReady
        } else {
            SandboxState::Ready
        };
        assert_eq!(p.state, want, "{}", p.name);
    }
    assert_eq!(guard.evictions().await.len(), 1);

    // The same story in the metrics.
    use common::metrics::{parse, scrape, value};
    // The eviction is published at the kill; pressure-to-action is
    // observed once StopPodSandbox returns, in the background.
    common::poll_until(
        Duration::from_secs(20),
        "the StopPodSandbox timed",
        || async {
            let m = parse(&scrape(port));
            value(&m, "criguard_pressure_to_action_seconds_count", &[]).filter(|v| *v >= 1.0)
        },
    )
    .await;
    let m = parse(&scrape(port));
    let evicted = [
        ("signal", "allocatableMemory.available"),
        ("qos", "BestEffort"),
    ];
    assert_eq!(value(&m, "criguard_evictions_total", &evicted), Some(1.0));
    assert!(
        value(
            &m,
            "criguard_admission_refusals_total",
            &[("condition", "MemoryPressure")]
        ) >= Some(1.0)
    );
    assert!(
        value(
            &m,
            "criguard_admission_refusals_total",
            &[("condition", "Evicted")]
        ) >= Some(1.0)
    );
    assert_eq!(
        value(&m, "criguard_pressure_to_action_seconds_count", &[]),
        Some(1.0)
    );
    // A hard threshold: the pod's processes were killed through its cgroup
    // before the runtime stopped it.
    assert_eq!(
        value(&m, "criguard_pressure_to_kill_seconds_count", &[]),
        Some(1.0)
    );
    assert!(
        value(&m, "criguard_pressure_to_kill_seconds_sum", &[])
            <= value(&m, "criguard_pressure_to_action_seconds_sum", &[])
    );
    let threshold = value(
        &m,
        "criguard_signal_threshold",
        &[("signal", "allocatableMemory.available")],
    );
    assert_eq!(threshold, Some((64 * MI) as f64));
    assert!(
        value(
            &m,
            "criguard_signal_available",
            &[("signal", "allocatableMemory.available")]
        )
        .is_some()
    );

    // After the transition period without pressure, BestEffort pods return.
    // As the kubelet does, a sandbox name still taken (containerd keeps a
    // sandbox refused by NRI, torn down NotReady, now and then) is tried
    // again with the next attempt.
    let attempt = std::sync::atomic::AtomicU32::new(0);
    common::poll_until(Duration::from_secs(30), "admission to reopen", || {
        let mut next = newcomer.clone();
        next.attempt = attempt.load(std::sync::atomic::Ordering::Relaxed);
        let attempt = &attempt;
        async move {
            match refused(&next).await {
                Ok(_) => Some(()),
                Err(e) if e.message().contains("is reserved for") => {
                    attempt.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    None
                }
                Err(_) => None,
            }
        }
    })
    .await;

    sc.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_threshold_waits_for_its_grace_period_then_evicts_with_the_capped_grace() {
    // No housekeeping tick after the first: the memory event raises the
    // condition and the end of the grace period starts the evicting round.
    let sc = Scenario::start(&[
        "--housekeeping-interval=300s",
        "--eviction-hard=memory.available<1Ki",
        "--eviction-soft=allocatableMemory.available<64Mi",
        "--eviction-soft-grace-period=allocatableMemory.available=4s",
        "--eviction-max-pod-grace-period=5",
    ])
    .await;
    sc.grow().await;
    // MemoryPressure is reported as soon as the soft threshold is met...
    let seen = common::poll_until(Duration::from_secs(60), "MemoryPressure", || async {
        let c = sc.guard.conditions().await;
        c.conditions
            .contains(&Condition::MemoryPressure)
            .then(std::time::SystemTime::now)
    })
    .await;
    // ...but nothing is evicted inside the grace period.
    assert!(
        sc.guard.evictions().await.is_empty(),
        "evicted inside the grace period"
    );
    let evictions = sc
        .guard
        .first_evictions(Duration::from_secs(60), "the soft eviction")
        .await;
    let e = &evictions[0];
    assert_eq!(e.uid, sc.pods[0].uid);
    let seen_ms = seen
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    // The condition was seen within a poll of the threshold first being met;
    // allow a second for a slow admin answer.
    assert!(
        e.at_unix_ms + 1000 >= seen_ms + 4000,
        "evicted {} ms after pressure was seen",
        e.at_unix_ms - seen_ms
    );
    assert_eq!(
        e.grace_s, 5,
        "soft eviction grace: min(pod's 30 s, evictionMaxPodGracePeriod 5 s)"
    );
    assert!(e.threshold.contains("for 4s"), "{}", e.threshold);
    use common::metrics::{parse, scrape, value};
    let m = parse(&scrape(sc.port));
    let rounds = |trigger| {
        value(
            &m,
            "criguard_eviction_rounds_total",
            &[("trigger", trigger)],
        )
    };
    assert_eq!(rounds("tick"), Some(1.0), "only the first tick");
    assert!(rounds("deadline") >= Some(1.0), "the grace period's end");
    sc.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_event_evicts_between_housekeeping_ticks() {
    // The housekeeping tick runs once at start, then not for 300 s: only a
    // memory event can start a round in between.
    let t0 = std::time::SystemTime::now();
    let sc = Scenario::start(&[
        "--housekeeping-interval=300s",
        "--eviction-hard=allocatableMemory.available<64Mi",
    ])
    .await;
    let ms = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
    };
    let grown = std::time::SystemTime::now();
    sc.grow().await;
    let evictions = sc
        .guard
        .first_evictions(Duration::from_secs(60), "an eviction")
        .await;
    let e = &evictions[0];
    assert_eq!(e.uid, sc.pods[0].uid, "the BestEffort hog: {evictions:#?}");
    assert!(
        e.at_unix_ms < ms(t0) + 300_000,
        "evicted before the second tick"
    );
    eprintln!(
        "pressure started {} ms before the eviction",
        e.at_unix_ms - ms(grown)
    );

    // criguard's own account agrees: one tick, and rounds started by memcg thresholds.
    use common::metrics::{parse, scrape, value};
    let m = parse(&scrape(sc.port));
    let rounds = |trigger| {
        value(
            &m,
            "criguard_eviction_rounds_total",
            &[("trigger", trigger)],
        )
    };
    assert_eq!(rounds("tick"), Some(1.0));
    assert!(rounds("memcg_threshold") >= Some(1.0), "{m:?}");
    assert_eq!(
        sc.guard.evictions().await.len(),
        1,
        "no more pods than needed"
    );
    sc.teardown().await;
}
