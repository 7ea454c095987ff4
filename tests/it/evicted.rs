//! End to end, no Kubernetes API: a pod evicted under real memory pressure
//! never runs again on the node. The test plays the kubelet, which does not
//! know criguard evicted the pod and asks for its sandbox again every
//! second, across a SIGKILL and restart of criguard: every request is
//! refused with the eviction message, the pod is evicted exactly once (and
//! that eviction is still listed after the restart), the node's
//! MemoryPressure clears and stays clear, and a new pod of the same name (a
//! new UID, as its controller would make) is admitted.

use crate::common;

use std::time::{Duration, Instant};

use common::containerd::unique;
use common::pressure::Pressure;
use k8s_cri::v1 as cri;

fn memory_pressure(c: &criguard::admin::ConditionsReport) -> bool {
    c.conditions
        .contains(&criguard::signals::table::Condition::MemoryPressure)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_pod_stays_down_across_kubelet_retries_and_a_criguard_restart() {
    let sc = Pressure::new(320);
    let state = tempfile::tempdir().unwrap();
    let args = [
        "--eviction-hard=allocatableMemory.available<64Mi",
        "--eviction-pressure-transition-period=3s",
    ];
    let guard = sc.criguard(state.path(), &args).await;
    let hog = sc.hog("hog", 60, 200);
    let (sandbox, container) = sc.run(&guard, &hog).await;
    sc.grow(&container).await;
    let evictions = guard
        .first_evictions(Duration::from_secs(60), "the eviction")
        .await;
    assert_eq!(evictions.len(), 1);
    let e = &evictions[0];
    assert_eq!(e.uid, hog.uid);
    let stopped = sc.exited_at_ms(&container).await;
    eprintln!(
        "eviction decided -> container exited: {} ms (no API)",
        stopped.saturating_sub(e.at_unix_ms)
    );

    // The kubelet's retries: every second for 30 s, with a SIGKILL and a
    // restart of criguard after 10 s.
    let mut guard = Some(guard);
    let mut second = None;
    let (mut refused, mut unavailable, mut cleared_at) = (0, 0, None::<u32>);
    let start = Instant::now();
    for attempt in 1..=30u32 {
        if attempt == 10 {
            let first = guard.take().unwrap();
            let before = first.evictions().await;
            assert_eq!(
                before.len(),
                1,
                "one eviction before the restart: {before:#?}"
            );
            first.signal_and_wait(libc::SIGKILL);
            second = Some(sc.criguard(state.path(), &args).await);
        }
        let g = guard.as_ref().or(second.as_ref()).unwrap();
        let req = Pressure::retry_request(&hog, attempt);
        match g.clients().rt.run_pod_sandbox(req).await {
            Ok(r) => panic!(
                "attempt {attempt}: the evicted pod was admitted again: {:?}",
                r.into_inner()
            ),
            Err(s) if s.code() == tonic::Code::ResourceExhausted => {
                assert!(
                    s.message().contains("criguard evicted pod default/hog"),
                    "{s:?}"
                );
                assert!(
                    s.message().contains(&e.message),
                    "the eviction message: {s:?}"
                );
                refused += 1;
            }
            Err(s) => {
                // criguard restarting: the kubelet sees the runtime as down.
                assert_eq!(
                    s.code(),
                    tonic::Code::Unavailable,
                    "attempt {attempt}: {s:?}"
                );
                unavailable += 1;
            }
        }
        // MemoryPressure: once it has cleared it must stay clear.
        let conditions = g.conditions().await;
        match (memory_pressure(&conditions), cleared_at) {
            (false, None) => cleared_at = Some(attempt),
            (true, Some(at)) => {
                panic!("MemoryPressure came back at attempt {attempt} after clearing at {at}")
            }
            _ => {}
        }
        let next = start + Duration::from_secs(attempt as u64);
        tokio::time::sleep_until(next.into()).await;
    }
    let g = second.as_ref().unwrap();
    eprintln!(
        "kubelet retries: {refused} refused, {unavailable} during the restart; MemoryPressure cleared at attempt {cleared_at:?}"
    );
    assert!(refused >= 28, "every retry refused: {refused}");
    assert!(cleared_at.is_some(), "MemoryPressure never cleared");
    let listed = g.evictions().await;
    assert_eq!(
        listed, evictions,
        "the one eviction, still listed after the restart, and no other"
    );

    // containerd agrees: the pod's only sandbox is the evicted one.
    let mut rt = sc.ctrd.direct().rt;
    let list = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .items;
    let of_hog: Vec<_> = list
        .iter()
        .filter(|s| s.metadata.as_ref().is_some_and(|m| m.uid == hog.uid))
        .collect();
    assert_eq!(of_hog.len(), 1, "{of_hog:#?}");
    assert_eq!(of_hog[0].id, sandbox);
    assert_eq!(
        of_hog[0].state,
        cri::PodSandboxState::SandboxNotready as i32
    );

    // The refusals were counted, and survived in the state file.
    let saved = std::fs::read_to_string(state.path().join("evicted-pods.json")).unwrap();
    assert!(saved.contains(&hog.uid), "{saved}");

    // Its controller's new pod (same name, new UID) is admitted.
    let replacement = sc.spec("hog", &unique("hog"), common::pods::sleeper("app"));
    let (new_sandbox, _) = common::pods::run_pod(&mut g.clients().rt, &replacement, None).await;
    common::pods::remove_pods(&mut g.clients().rt, [new_sandbox, sandbox]).await;
}
