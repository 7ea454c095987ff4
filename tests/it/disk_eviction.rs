//! Disk pressure, for real: containerd's root, the kubelet root and the pod
//! logs share one small tmpfs. Filled past `imagefs.available`, criguard
//! first removes what no pod needs (the dead container of a terminated pod,
//! an unused image), sees that it was not enough, and then evicts the pod
//! with the largest disk usage, a Guaranteed one, whose writable layer it
//! removes so that the space comes back; the small BestEffort pod, which
//! memory ranking would have taken first, stays.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::pods::{BUSYBOX, remove_pods, run_pod, wait_exited};
use common::pressure::Pressure;
use criguard::signals::node::fs_stats;
use criguard_test_kit::kubelet::ContainerSpec;
use k8s_cri::v1 as cri;

const MI: u64 = 1 << 20;

fn available(p: &Path) -> u64 {
    fs_stats(p).unwrap().available
}

fn writer(name: &str, mib: u64, then: &str) -> ContainerSpec {
    ContainerSpec {
        name: name.into(),
        image: BUSYBOX.into(),
        command: vec![
            "sh".into(),
            "-c".into(),
            format!(
                "dd if=/dev/zero of=/fill bs=1M count={mib} 2>/dev/null && touch /done; {then}"
            ),
        ],
        ..Default::default()
    }
}

async fn wait_written(
    rt: &mut cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
    id: &str,
) {
    common::poll_until(Duration::from_secs(30), "the writer to finish", || {
        let (mut rt, id) = (rt.clone(), id.to_owned());
        async move {
            let r = rt
                .exec_sync(cri::ExecSyncRequest {
                    container_id: id,
                    cmd: vec!["test".into(), "-e".into(), "/done".into()],
                    timeout: 5,
                })
                .await
                .ok()?
                .into_inner();
            (r.exit_code == 0).then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_reclaim_first_then_the_largest_disk_user_even_if_guaranteed() {
    // imagefs: containerd's root on a 256 MiB tmpfs; nodefs and the logs
    // on the same filesystem.
    let p = Pressure::build("criguard-disk").tmpfs(256, None).start();
    let (ctrd, fs) = (&p.ctrd, &p.imagefs);
    let unused = "docker.io/library/criguard-disk-unused:latest";
    ctrd.import_filler(unused, 8);

    let guard = p
        .guard()
        .args(&[
            "--eviction-hard=imagefs.available<100Mi",
            "--dynamic-oom-score-adj=true",
            "--minimum-image-ttl-duration=0s",
            "--eviction-pressure-transition-period=1m",
        ])
        .start()
        .await;
    let mut rt = guard.kubelet().rt;
    let pod = |name: &str, c: ContainerSpec| p.pod(name, c);

    // A: Guaranteed, 40 MiB in its writable layer. B: BestEffort, 5 MiB.
    // C: terminated, its dead container holding 10 MiB.
    let big = pod(
        "big-guaranteed",
        ContainerSpec {
            memory_request: 64 << 20,
            memory_limit: 64 << 20,
            cpu_request_milli: 100,
            cpu_limit_milli: 100,
            ..writer("big", 40, "sleep 3600")
        },
    );
    let small = pod("small-besteffort", writer("small", 5, "sleep 3600"));
    let dead = pod("terminated", writer("dead", 10, "exit 0"));
    let (big_sb, big_ids) = run_pod(&mut rt, &big, None).await;
    let (small_sb, small_ids) = run_pod(&mut rt, &small, None).await;
    let (dead_sb, dead_ids) = run_pod(&mut rt, &dead, None).await;
    wait_written(&mut rt, &big_ids[0]).await;
    wait_written(&mut rt, &small_ids[0]).await;
    wait_exited(&rt, &dead_ids[0], Duration::from_secs(30)).await;
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: dead_sb.clone(),
    })
    .await
    .unwrap();
    assert!(guard.evictions().await.is_empty(), "no pressure yet");

    // `criguard rank`, the dry run: memory would take the BestEffort pod
    // first, imagefs the Guaranteed pod with the largest writable layer.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_criguard"))
        .args(["rank", "--json", "--admin-socket"])
        .arg(&guard.admin)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rank: Vec<criguard::eviction::rank::RankEntry> =
        serde_json::from_slice(&out.stdout).unwrap();
    let first = |signal: &str| {
        rank.iter()
            .find(|e| e.signal == signal && e.rank == 1)
            .map(|e| e.pod.clone())
    };
    assert_eq!(
        first("memory.available").as_deref(),
        Some("default/small-besteffort"),
        "{rank:?}"
    );
    assert_eq!(
        first("imagefs.available").as_deref(),
        Some("default/big-guaranteed"),
        "{rank:?}"
    );

    // Pressure: leave 54 MiB available against a 100 Mi threshold. The dead
    // container (10 MiB) and the unused image (~16 MiB) cannot cover the
    // 46 MiB deficit; evicting the 40 MiB pod then can.
    // One fallocate(2): criguard never sees the filesystem half filled (a
    // round in the middle of a slow fill would reclaim what the rest of the
    // fill then takes, and the decision would see no reclaim at all).
    let target = 54 * MI;
    let ballast = std::fs::File::create(fs.join("ballast")).unwrap();
    let len = (available(fs) - target) as libc::off_t;
    // SAFETY: fallocate on a file descriptor we own, within its file.
    let rc = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&ballast), 0, 0, len) };
    assert_eq!(rc, 0, "fallocate: {}", std::io::Error::last_os_error());
    drop(ballast);
    let filled = available(fs);
    assert!(filled.abs_diff(target) < MI, "filled to {filled}");

    let evictions = guard
        .first_evictions(Duration::from_secs(30), "a disk eviction")
        .await;
    let e = &evictions[0];
    assert_eq!(e.sandbox_id, big_sb, "the largest disk user goes: {e:?}");
    assert_eq!(e.signal, "imagefs.available");
    assert!(
        e.message
            .starts_with("The node was low on resource: ephemeral-storage."),
        "{}",
        e.message
    );
    // Node-level reclaim ran first: at the decision more was available
    // than the 54 MiB of the fill.
    assert!(
        e.available as u64 > target + 20 * MI,
        "node-level reclaim should have freed ~26 MiB before the eviction: {e:?}"
    );

    let mut direct = ctrd.direct();
    let images = direct
        .img
        .list_images(cri::ListImagesRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .images;
    let tags: Vec<&String> = images.iter().flat_map(|i| &i.repo_tags).collect();
    assert!(
        !tags.iter().any(|t| *t == unused),
        "the unused image went first: {tags:?}"
    );
    assert!(tags.iter().any(|t| *t == BUSYBOX), "an image in use stays");
    // The eviction is published when the pod is killed; its stop and the
    // removal of its containers follow.
    let containers: Vec<String> = common::poll_until(
        Duration::from_secs(20),
        "the evicted pod's containers removed",
        || {
            let mut rt = direct.rt.clone();
            let big = big_ids[0].clone();
            async move {
                let ids: Vec<String> = rt
                    .list_containers(cri::ListContainersRequest { filter: None })
                    .await
                    .unwrap()
                    .into_inner()
                    .containers
                    .into_iter()
                    .map(|c| c.id)
                    .collect();
                (!ids.contains(&big)).then_some(ids)
            }
        },
    )
    .await;
    assert!(
        !containers.contains(&dead_ids[0]),
        "the dead container went first"
    );
    assert!(
        !containers.contains(&big_ids[0]),
        "the evicted pod's writable layer is removed with its container"
    );
    assert!(containers.contains(&small_ids[0]), "the small pod stays");

    // One eviction was enough, and the pressure is gone.
    common::poll_until(
        Duration::from_secs(10),
        "available back above 100Mi",
        || async { (available(fs) >= 100 * MI).then_some(()) },
    )
    .await;
    assert_eq!(guard.evictions().await.len(), 1, "no more pods than needed");
    let conditions = guard.conditions().await;
    assert!(
        conditions
            .conditions
            .contains(&criguard::signals::table::Condition::DiskPressure),
        "DiskPressure holds for the transition period: {conditions:?}"
    );

    // criguard first, so that its GC does not race the teardown.
    drop(guard);
    remove_pods(&mut direct.rt, [small_sb, big_sb, dead_sb]).await;
}

fn inodes_free(p: &Path) -> u64 {
    fs_stats(p).unwrap().inodes_free
}

/// A container that creates `n` files once `/go` exists.
fn file_maker(name: &str, n: u32) -> ContainerSpec {
    let script = format!(
        "while [ ! -e /go ]; do sleep 0.1; done; i=0; while [ $i -lt {n} ]; do : > /f$i; i=$((i+1)); done; touch /done; sleep 3600"
    );
    ContainerSpec {
        name: name.into(),
        image: BUSYBOX.into(),
        command: vec!["sh".into(), "-c".into(), script],
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inode_pressure_takes_the_pod_with_most_inodes() {
    let p = Pressure::build("criguard-inodes")
        .tmpfs(256, Some(6000))
        .start();
    let (ctrd, fs) = (&p.ctrd, &p.imagefs);
    // Pods, logs and the two containers' files take a few hundred inodes;
    // the threshold sits 600 below what is free now, so only the 2000
    // files of the big maker cross it.
    let threshold = inodes_free(fs) - 600;
    let guard = p
        .guard()
        .arg(format!("--eviction-hard=imagefs.inodesFree<{threshold}"))
        .arg("--dynamic-oom-score-adj=true")
        .start()
        .await;
    let mut rt = guard.kubelet().rt;
    let pod = |name: &str, c: ContainerSpec| p.pod(name, c);
    let (few_sb, few_ids) = run_pod(&mut rt, &pod("few", file_maker("few", 100)), None).await;
    let (many_sb, many_ids) = run_pod(&mut rt, &pod("many", file_maker("many", 2000)), None).await;
    let go = |id: String| {
        let mut rt = guard.kubelet().rt;
        async move {
            rt.exec_sync(cri::ExecSyncRequest {
                container_id: id,
                cmd: vec!["touch".into(), "/go".into()],
                timeout: 5,
            })
            .await
            .unwrap();
        }
    };
    go(few_ids[0].clone()).await;
    wait_written(&mut rt, &few_ids[0]).await;
    assert!(
        inodes_free(fs) > threshold,
        "the small pod alone must not cross the threshold"
    );
    assert!(guard.evictions().await.is_empty());
    go(many_ids[0].clone()).await;

    let evictions = guard
        .first_evictions(Duration::from_secs(60), "an inode eviction")
        .await;
    let e = &evictions[0];
    assert_eq!(e.sandbox_id, many_sb, "{e:?}");
    assert_eq!(e.signal, "imagefs.inodesFree");
    // Observed while it writes (the crossing comes some 500 files in), or
    // after: either way more than the small pod's 100.
    assert!(e.usage > 100, "its inodes: {e:?}");
    assert!(
        e.message
            .starts_with("The node was low on resource: inodes."),
        "{}",
        e.message
    );
    common::poll_until(
        Duration::from_secs(20),
        "the inodes to come back",
        || async { (inodes_free(fs) > threshold).then_some(()) },
    )
    .await;
    assert_eq!(guard.evictions().await.len(), 1, "one pod was enough");

    drop(guard);
    remove_pods(&mut ctrd.direct().rt, [few_sb, many_sb]).await;
}
