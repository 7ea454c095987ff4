//! Scenario 4: the kubelet's real scores, which this host's root cannot set
//! (no CAP_SYS_RESOURCE): Guaranteed and node-critical containers at −997,
//! sandboxes at −998 (containerd's own, with `restrict_oom_score_adj` off),
//! BestEffort 1000, Burstable by the formula, each read from
//! `/proc/<pid>/oom_score_adj`. Then a real kernel OOM in a 200 MiB
//! `kubepods.slice`: criguard's adjuster makes the kernel kill the pod
//! criguard ranks first, not the bigger one the static scores would give
//! up, while the −997 pods are never candidates.

use std::path::Path;
use std::time::Duration;

use crate::common::containerd::{Clients, CriguardProcess};
use crate::common::pods::{grow, hog, init_pid, oom_score_adj_of, sleeper, wait_holding};
use crate::guest::{self, CONTAINERD, Slice, pod};
use criguard::oom::scores::badness;
use criguard_test_kit::kubelet::ContainerSpec;
use k8s_cri::v1 as cri;

const MI: i64 = 1 << 20;
const LIMIT: i64 = 200 * MI;

async fn status(c: &mut Clients, id: &str) -> cri::ContainerStatus {
    let req = cri::ContainerStatusRequest {
        container_id: id.into(),
        verbose: false,
    };
    c.rt.container_status(req)
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap()
}

fn running(s: &cri::ContainerStatus) -> bool {
    s.state == cri::ContainerState::ContainerRunning as i32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "inside the VM only: hack/vm.sh test"]
async fn the_kubelets_negative_scores_and_a_kernel_oom() {
    guest::require();
    let _t = guest::Timer::start("scores-oom");
    let _kubepods = Slice::create("kubepods.slice", &[&format!("MemoryMax={LIMIT}")]);
    let mut d = guest::node_containerd().await;
    let tmp = tempfile::tempdir().unwrap();
    let listen = tmp.path().join("criguard.sock");

    // Part 1: the static scores, criguard's adjuster off.
    let guard = CriguardProcess::start(
        &listen,
        Path::new(CONTAINERD),
        &["--dynamic-oom-score-adj=false"],
    )
    .await;
    let gu = pod(
        "gu",
        0,
        ContainerSpec {
            memory_limit: 32 * MI,
            cpu_limit_milli: 100,
            ..sleeper("app")
        },
    );
    // A static pod marked node-critical (the kubelet's −997 for
    // system-node-critical static pods), otherwise BestEffort.
    let mut critical = pod("critical", 0, sleeper("app"));
    critical
        .annotations
        .insert("kubernetes.io/config.source".into(), "file".into());
    critical
        .annotations
        .insert("criguard.io/test-node-critical".into(), "true".into());
    let be = pod("be", 0, sleeper("app"));
    let bu = pod(
        "bu",
        0,
        ContainerSpec {
            memory_request: 256 * MI,
            ..sleeper("app")
        },
    );
    // Burstable: 1000 − ⌊1000·256Mi/MemTotal⌋.
    let bu_want = bu.oom_score_adj(&bu.containers[0]);
    let specs = [(&gu, -997), (&critical, -997), (&be, 1000), (&bu, bu_want)];
    let ran = guest::run_pods(&guard.clients().rt, &specs.map(|(p, _)| p)).await;
    let mut seen = Vec::new();
    for ((p, want), (sb, ids)) in specs.iter().zip(&ran) {
        let got = oom_score_adj_of(init_pid(&mut d, Some(&ids[0]), None).await);
        assert_eq!(got, *want, "{}'s container", p.name);
        let pause = oom_score_adj_of(init_pid(&mut d, None, Some(sb)).await);
        assert_eq!(pause, -998, "{}'s sandbox", p.name);
        seen.push(format!("{} {got}", p.name));
    }
    guest::report(&format!(
        "scores: containers {}; every sandbox -998",
        seen.join(", ")
    ));
    drop(guard);

    // Part 2: a kernel OOM in kubepods.slice, criguard's adjuster on; the
    // pods above stay (small; gu at −997, critical excluded, be and bu
    // ranked after X).
    let guard = CriguardProcess::start(
        &listen,
        Path::new(CONTAINERD),
        &[
            "--dynamic-oom-score-adj=true",
            "--oom-adjust-interval",
            "1s",
        ],
    )
    .await;
    // X: BestEffort, priority 0, small; it grows into the OOM.
    let x = pod(
        "x-besteffort",
        0,
        ContainerSpec {
            command: hog(10, 150),
            ..sleeper("hog")
        },
    );
    // Y: Burstable over its 64Mi request, priority 1000, big.
    let y = pod(
        "y-important",
        1000,
        ContainerSpec {
            memory_request: 64 * MI,
            command: hog(120, 0),
            ..sleeper("hog")
        },
    );
    let ran2 = guest::run_pods(&guard.clients().rt, &[&x, &y]).await;
    let (xc, yc) = (ran2[0].1[0].clone(), ran2[1].1[0].clone());
    let gc = ran[0].1[0].clone();
    for c in [&xc, &yc] {
        wait_holding(&d.rt, c, Duration::from_secs(180)).await;
    }
    let (xpid, ypid) = (
        init_pid(&mut d, Some(&xc), None).await,
        init_pid(&mut d, Some(&yc), None).await,
    );
    // The scenario needs criguard: at the static scores the kernel would
    // kill Y (bigger), though the kubelet's ranking takes X.
    let y_static = y.oom_score_adj(&y.containers[0]);
    assert!(badness(120 * MI, y_static, LIMIT) > badness(LIMIT - 130 * MI, 1000, LIMIT));
    crate::common::poll_until(
        Duration::from_secs(30),
        "criguard to adjust oom_score_adj",
        || async move {
            (oom_score_adj_of(xpid) == 1000 && oom_score_adj_of(ypid) < 500).then_some(())
        },
    )
    .await;
    let y_adj = oom_score_adj_of(ypid);

    grow(&d.rt, &xc).await;
    let statuses = crate::common::poll_until(Duration::from_secs(120), "the OOM kill", || {
        let mut d = Clients::new(Path::new(CONTAINERD));
        let ids = [xc.clone(), yc.clone(), gc.clone()];
        async move {
            let mut all = Vec::new();
            for id in &ids {
                all.push(status(&mut d, id).await);
            }
            all.iter().any(|s| !running(s)).then_some(all)
        }
    })
    .await;
    let [xs, ys, gs] = <[cri::ContainerStatus; 3]>::try_from(statuses).unwrap();
    // containerd says OOMKilled only when its shim read the scope's
    // memory.events before systemd removed the emptied scope; under TCG it
    // sometimes does not, and says Error. The kernel's counter (below) and
    // the kill criguard records from the pod's counter are the evidence.
    assert!(
        xs.exit_code == 137 && ["OOMKilled", "Error"].contains(&xs.reason.as_str()),
        "X (criguard's first) must be the OOM victim: {xs:?}"
    );
    assert!(
        running(&ys) && running(&gs),
        "Y and gu survive: {ys:?} {gs:?}"
    );
    let kills = std::fs::read_to_string("/sys/fs/cgroup/kubepods.slice/memory.events").unwrap();
    assert!(
        kills.lines().any(|l| l == "oom_kill 1"),
        "exactly one kill: {kills}"
    );
    // criguard recorded the kill (from containerd's /tasks/oom, or from the
    // pod's counter when the scope was gone first), matched with its ranking.
    let recorded =
        crate::common::poll_until(Duration::from_secs(30), "the OOM kill record", || async {
            let k = guard.oom_kills().await;
            (!k.is_empty()).then_some(k)
        })
        .await;
    assert!(
        recorded.iter().all(|k| k.container_id == xc),
        "{recorded:#?}"
    );
    let k = &recorded[0];
    assert!(
        k.matched_rank && k.qos == criguard::model::qos::QosClass::BestEffort,
        "{k:#?}"
    );
    guest::report(&format!(
        "scores: kernel OOM in kubepods.slice killed X (adjusted to 1000; Y lowered from {y_static} to {y_adj}, gu at -997; containerd's reason {}); criguard recorded {} {} matched_rank={} notified={}",
        xs.reason, k.pod, k.container, k.matched_rank, k.notified
    ));

    drop(guard);
    let all = ran.into_iter().chain(ran2).map(|(sb, _)| sb).collect();
    guest::remove_all(&d.rt, all).await;
}
