//! A real kernel OOM inside a small kubepods memory cgroup: the process the
//! kernel kills belongs to the pod criguard ranks first, not to the one the
//! kubelet's static scores would have it kill. Either way criguard records
//! the kill from containerd's `/tasks/oom` event: the container, its pod's
//! QoS class and whether the pod was criguard's first-ranked one
//! (`criguard evictions`, `criguard_kernel_oom_kills_total{matched_rank}`).

use crate::common;

use std::time::Duration;

use common::containerd::{CriguardProcess, PrivateContainerd, unique};
use common::metrics::{free_port, parse, scrape, scraped, value};
use common::pods::{
    CgroupRoot, grow, hog, init_pid, mem_total, oom_score_adj_of, run_pod, sleeper, wait_holding,
};
use criguard::model::qos::QosClass;
use criguard::oom::kills::OomKill;
use criguard::oom::scores::badness;
use criguard_test_kit::kubelet::{ContainerSpec, PodSpec};
use k8s_cri::v1 as cri;

const MI: i64 = 1 << 20;
/// The pods' memcg limit (the kubelet's allocatable memory, in miniature).
const LIMIT: i64 = 320 * MI;

/// What the scenario saw once the kernel killed.
struct Outcome {
    /// The statuses of X, Y and Z.
    statuses: [cri::ContainerStatus; 3],
    /// Which of them the kernel's OOM killer killed, in its order, from its
    /// own log; `None` where `/dev/kmsg` cannot be read.
    kernel_kills: Option<Vec<String>>,
    /// The kills criguard recorded.
    kills: Vec<OomKill>,
    /// Its metrics after the kill.
    metrics: Vec<common::metrics::Sample>,
    /// `criguard evictions` after the kill.
    text: String,
}

/// Runs the scenario and returns what was seen once the kernel has killed
/// one of X, Y and Z.
async fn oom_scenario(dynamic: bool) -> Outcome {
    // Declared first so that it is dropped last, after containerd has
    // stopped the containers whose cgroups live under it.
    let root = format!("/{}", unique("criguard-oom"));
    let _cg = CgroupRoot(root.clone());
    let ctrd = PrivateContainerd::start();
    // The pods' memory cgroup with a small limit, made before any pod.
    common::memcg::limited(&format!("{root}/kubepods"), Some(LIMIT), None);

    let listen = ctrd.dir.join("criguard.sock");
    let switch = if dynamic {
        "--dynamic-oom-score-adj=true"
    } else {
        "--dynamic-oom-score-adj=false"
    };
    let port = free_port();
    let metrics_address = format!("127.0.0.1:{port}");
    let guard = CriguardProcess::start(
        &listen,
        &ctrd.socket,
        &[
            switch,
            "--oom-adjust-interval",
            "1s",
            "--metrics-address",
            &metrics_address,
        ],
    )
    .await;
    let mut rt = guard.kubelet().rt;
    let mut direct = ctrd.direct();
    let cap = mem_total();
    let spec = |name: &str, priority: i32, c: ContainerSpec| {
        let mut p = PodSpec::new(name, &unique(name)).container(c);
        p.cgroup_root = format!("{root}/kubepods");
        p.log_root = ctrd.dir.join("pods").to_str().unwrap().into();
        p.node_memory = cap;
        p.annotations
            .insert("criguard.io/priority".into(), priority.to_string());
        p
    };
    // X: BestEffort, priority 0, small; it is the one that grows into the OOM.
    let x = spec(
        "x-besteffort",
        0,
        ContainerSpec {
            command: hog(10, 200),
            ..sleeper("hog")
        },
    );
    // Y: Burstable over its 100Mi request, priority 1000, big.
    let y = spec(
        "y-important",
        1000,
        ContainerSpec {
            memory_request: 100 * MI,
            command: hog(200, 0),
            ..sleeper("hog")
        },
    );
    // Z: Burstable under its 200Mi request.
    let z = spec(
        "z-under",
        0,
        ContainerSpec {
            memory_request: 200 * MI,
            command: hog(20, 0),
            ..sleeper("hog")
        },
    );
    let (_, xc) = run_pod(&mut rt, &x, None).await;
    let (_, yc) = run_pod(&mut rt, &y, None).await;
    let (_, zc) = run_pod(&mut rt, &z, None).await;
    for c in [&xc[0], &yc[0], &zc[0]] {
        wait_holding(&direct.rt, c, Duration::from_secs(60)).await;
    }

    // The scenario must need criguard: at the kubelet's static scores the
    // kernel would kill Y (bigger) although the kubelet's ranking picks X
    // (lower priority, both over request).
    let (xpid, ypid, zpid) = (
        init_pid(&mut direct, Some(&xc[0]), None).await,
        init_pid(&mut direct, Some(&yc[0]), None).await,
        init_pid(&mut direct, Some(&zc[0]), None).await,
    );
    let y_static = y.oom_score_adj(&y.containers[0]);
    let x_at_oom = LIMIT - 220 * MI; // roughly what X holds when the limit is hit
    assert!(badness(200 * MI, y_static, LIMIT) > badness(x_at_oom, 1000, LIMIT));

    if dynamic {
        // criguard re-adjusts: X to 1000, Y well below.
        common::poll_until(
            Duration::from_secs(20),
            "criguard to adjust oom_score_adj",
            || async move {
                (oom_score_adj_of(xpid) == 1000 && oom_score_adj_of(ypid) < 500).then_some(())
            },
        )
        .await;
    } else {
        assert_eq!(
            oom_score_adj_of(ypid),
            y_static,
            "the kubelet's score must stand"
        );
        // The kill is matched against the adjuster's latest ranking: let
        // one round start after every hog holds its memory (two counted
        // from now: the one running may have started before).
        let rounds = || scraped(port, "criguard_oom_rank_rounds_total", &[]);
        let before = rounds().unwrap_or(0.0);
        common::poll_until(
            Duration::from_secs(20),
            "a ranking round after the pods hold their memory",
            || async move { rounds().is_some_and(|n| n >= before + 2.0).then_some(()) },
        )
        .await;
    }

    // X grows into the limit; the kernel kills someone.
    let mut kmsg = KernelLog::from_now();
    grow(&direct.rt, &xc[0]).await;
    let status = |id: String| {
        let mut d = direct.rt.clone();
        async move {
            d.container_status(cri::ContainerStatusRequest {
                container_id: id,
                verbose: false,
            })
            .await
            .unwrap()
            .into_inner()
            .status
            .unwrap()
        }
    };
    let statuses = common::poll_until(Duration::from_secs(60), "the OOM kill", || async {
        let mut all = Vec::new();
        for id in [&xc[0], &yc[0], &zc[0]] {
            all.push(status(id.clone()).await);
        }
        let exited = all
            .iter()
            .any(|s| s.state == cri::ContainerState::ContainerExited as i32);
        exited.then(|| <[cri::ContainerStatus; 3]>::try_from(all).unwrap())
    })
    .await;

    // The kernel's own order of its kills: each hog is its container's
    // init, so the PIDs it logs name the containers.
    let kernel_kills = match kmsg.as_mut() {
        Some(log) => {
            let ours = [(xpid, &xc[0]), (ypid, &yc[0]), (zpid, &zc[0])];
            let named = |pids: &[i64]| -> Vec<String> {
                pids.iter()
                    .filter_map(|p| ours.iter().find(|(q, _)| q == p))
                    .map(|(_, id)| id.to_string())
                    .collect()
            };
            let order = common::poll_until(
                Duration::from_secs(10),
                "the OOM kill in the kernel's log",
                || {
                    let got = named(log.oom_killed());
                    async move { (!got.is_empty()).then_some(got) }
                },
            )
            .await;
            Some(order)
        }
        None => None,
    };

    // The kill as criguard recorded it from containerd's events.
    common::poll_until(Duration::from_secs(20), "the OOM kill record", || async {
        (!guard.oom_kills().await.is_empty()).then_some(())
    })
    .await;

    // The teardown SIGKILLs every container, each notified of the OOM on
    // cgroup v1 a moment ago: none of that is a kernel OOM kill.
    guard.remove_all_pods().await;
    let kills = guard.oom_kills().await;
    let metrics = parse(&scrape(port));
    // What `criguard evictions` shows of it, as JSON and as text.
    let cli = |json: bool| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_criguard"))
            .arg("evictions")
            .arg("--admin-socket")
            .arg(&guard.admin)
            .args(json.then_some("--json"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let report: criguard::admin::EvictionsReport = serde_json::from_str(&cli(true)).unwrap();
    assert_eq!(report.kernel_oom_kills, kills, "criguard evictions --json");
    assert!(
        report.evictions.is_empty(),
        "no threshold configured to evict"
    );
    Outcome {
        statuses,
        kernel_kills,
        kills,
        metrics,
        text: cli(false),
    }
}

/// Checks the recorded kills: the one in `container_id`, of class `qos`,
/// matched or not, seen through `/tasks/oom`; besides it at most one in
/// `second` (see [`first_victim`]); each counted in the metric under its
/// own `matched_rank`. `second`'s kill is allowed even when the statuses
/// showed it running: they are taken at the first exit, and the kernel's
/// second kill can come after them, before the teardown reads the records.
fn assert_recorded(
    o: &Outcome,
    container_id: &str,
    qos: QosClass,
    matched: bool,
    second: Option<&str>,
) {
    eprintln!("recorded: {:#?}", o.kills);
    assert!(
        o.kills
            .iter()
            .all(|k| k.container_id == container_id || Some(k.container_id.as_str()) == second),
        "only the killed containers: {:#?}",
        o.kills
    );
    let k = o
        .kills
        .iter()
        .find(|k| k.container_id == container_id)
        .expect("the first victim's kill recorded");
    assert_eq!((k.qos, k.matched_rank), (qos, matched), "{k:#?}");
    eprintln!("criguard evictions:\n{}", o.text);
    assert!(
        o.text.contains("[kernel OOM kill]") && o.text.contains(&k.pod),
        "{}",
        o.text
    );
    assert!(
        k.notified,
        "announced: containerd's /tasks/oom or the kernel's log: {k:#?}"
    );
    assert!(
        k.first_ranked
            .as_deref()
            .is_some_and(|p| p.contains("x-besteffort")),
        "criguard ranked X first: {k:#?}"
    );
    for label in [true, false] {
        let kills: u64 = o
            .kills
            .iter()
            .filter(|k| k.matched_rank == label)
            .map(|k| k.kills)
            .sum();
        let name = if label { "true" } else { "false" };
        assert_eq!(
            value(
                &o.metrics,
                "criguard_kernel_oom_kills_total",
                &[("matched_rank", name)]
            )
            .unwrap_or(0.0),
            kills as f64,
            "criguard_kernel_oom_kills_total{{matched_rank={name}}}"
        );
    }
    assert!(
        value(
            &o.metrics,
            "criguard_containerd_events_total",
            &[("topic", "/tasks/oom")]
        )
        .is_some_and(|n| n >= 1.0)
    );
}

/// Checks that the kernel's first victim was `first`, and that `next`
/// ended, if it did, only in a second kernel kill. One OOM can end in two
/// kills on a loaded host: the kernel kills again when the grower's next
/// charge fails before the first victim's memory is uncharged. The order is
/// the kernel's own, from its log (`kernel`): exit times cannot give it,
/// since a first victim with much memory can finish exiting after a
/// smaller second one. Without the log, exit times are the fallback.
fn first_victim(
    first: &cri::ContainerStatus,
    next: &cri::ContainerStatus,
    kernel: Option<&[String]>,
) {
    assert!(oom_killed(first), "the kernel's first victim: {first:?}");
    match kernel {
        Some(order) => {
            eprintln!("the kernel's OOM kills, in order: {order:?}");
            assert_eq!(
                order.first(),
                Some(&first.id),
                "the kernel's first OOM victim, by its log (kills in order: {order:?})"
            );
        }
        None => eprintln!("no /dev/kmsg: the kill order comes from exit times"),
    }
    if running(next) {
        return;
    }
    let second = match kernel {
        Some(order) => order.iter().skip(1).any(|id| *id == next.id),
        None => next.finished_at >= first.finished_at,
    };
    assert!(
        oom_killed(next) && second,
        "only a second kernel kill after the first may end {next:?} (first {first:?}, kernel's kills {kernel:?})"
    );
    eprintln!(
        "the kernel killed twice: {} exited {} ms after {}",
        next.metadata.as_ref().map_or("?", |m| m.name.as_str()),
        (next.finished_at - first.finished_at) / 1_000_000,
        first.metadata.as_ref().map_or("?", |m| m.name.as_str()),
    );
}

/// The kernel's log from the moment it was opened, read for the OOM
/// killer's own record of whom it killed ("Killed process N"), in order.
struct KernelLog {
    kmsg: std::fs::File,
    killed: Vec<i64>,
}

impl KernelLog {
    /// `/dev/kmsg` from its end; `None` where it cannot be read.
    fn from_now() -> Option<Self> {
        use std::io::{Seek, SeekFrom};
        use std::os::unix::fs::OpenOptionsExt;
        let mut kmsg = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .ok()?;
        kmsg.seek(SeekFrom::End(0)).ok()?;
        Some(Self {
            kmsg,
            killed: Vec::new(),
        })
    }

    /// Every PID the OOM killer killed since the log was opened.
    fn oom_killed(&mut self) -> &[i64] {
        use std::io::Read;
        // One record per read; EPIPE: records overwritten before they were
        // read (skipped); EAGAIN: nothing more yet.
        let mut record = vec![0u8; 8192];
        loop {
            match self.kmsg.read(&mut record) {
                Ok(0) => break,
                Ok(n) => self
                    .killed
                    .extend(killed_pid(&String::from_utf8_lossy(&record[..n]))),
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
                Err(_) => break,
            }
        }
        &self.killed
    }
}

/// The PID in a `/dev/kmsg` record of the OOM killer's ("prio,seq,ts,flags;…
/// Killed process N (comm) …").
fn killed_pid(record: &str) -> Option<i64> {
    let message = record.split_once(';')?.1;
    let rest = message.split_once("Killed process ")?.1;
    rest.split_whitespace().next()?.parse().ok()
}

#[test]
fn the_oom_killers_record_is_read() {
    let r = "3,1234,76180406943,-;Memory cgroup out of memory: Killed process 21681 (awk) total-vm:113664kB, anon-rss:99892kB, file-rss:1296kB, shmem-rss:0kB, UID:0 pgtables:284kB oom_score_adj:1000\n";
    assert_eq!(killed_pid(r), Some(21681));
    assert_eq!(
        killed_pid("6,1,2,-;Killed process in a message body\n"),
        None
    );
    assert_eq!(killed_pid("6,1,2,-;eth0: link up\n"), None);
}

fn running(s: &cri::ContainerStatus) -> bool {
    s.state == cri::ContainerState::ContainerRunning as i32
}

fn oom_killed(s: &cri::ContainerStatus) -> bool {
    s.state == cri::ContainerState::ContainerExited as i32
        && s.exit_code == 137
        && s.reason == "OOMKilled"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_oom_kills_the_pod_criguard_ranks_first() {
    let o = oom_scenario(true).await;
    let [x, y, z] = &o.statuses;
    // X (criguard's first) is the OOM victim; Y only in a second kill.
    first_victim(x, y, o.kernel_kills.as_deref());
    assert!(running(z), "Z must survive: {z:?}");
    assert_recorded(&o, &x.id, QosClass::BestEffort, true, Some(&y.id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_dynamic_scores_the_kernel_kills_the_bigger_higher_priority_pod() {
    // The control: the same pods at the kubelet's static scores.
    let o = oom_scenario(false).await;
    let [x, y, z] = &o.statuses;
    // At static scores the kernel picks Y; X only in a second kill.
    first_victim(y, x, o.kernel_kills.as_deref());
    assert!(running(z), "Z must survive: {z:?}");
    // criguard still ranked X first: Y's kill is recorded as a miss.
    assert_recorded(&o, &y.id, QosClass::Burstable, false, Some(&x.id));
}
