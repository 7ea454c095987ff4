//! Image GC against a real containerd whose imagefs is a small tmpfs:
//! filled past the high threshold, exactly the unused images go, least
//! recently used first, until usage is under the low threshold; the sandbox
//! image and images in use stay; last-used times survive a restart; the
//! bytes freed are counted as the filesystem measures them.

use crate::common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use common::containerd::{CriguardProcess, PrivateContainerd, unique};
use common::metrics::{free_port, parse, scrape, value};
use common::pods::{CgroupRoot, remove_pods, run_pod, sleeper};
use criguard::signals::node::fs_stats;
use criguard_test_kit::kubelet::PodSpec;
use k8s_cri::v1 as cri;

const FILLER_MIB: u64 = 8;
const HIGH: u64 = 70;
const LOW: u64 = 50;

fn available(root: &Path) -> u64 {
    fs_stats(root).unwrap().available
}

/// Image name → id, as the runtime lists them.
async fn images(c: &mut common::containerd::Clients) -> BTreeMap<String, String> {
    let list = c
        .img
        .list_images(cri::ListImagesRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .images;
    list.into_iter()
        .flat_map(|i| {
            let id = i.id.clone();
            i.repo_tags.into_iter().map(move |t| (t, id.clone()))
        })
        .collect()
}

fn filler(n: usize) -> String {
    format!("docker.io/library/criguard-gc-f{n}:latest")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_images_go_least_recently_used_first_down_to_the_low_threshold() {
    let root = format!("/{}", unique("criguard-imggc"));
    let _cg = CgroupRoot(root.clone());
    let ctrd = PrivateContainerd::start_on_tmpfs(192, None);
    let imagefs = ctrd.root();

    // Six filler images; each one's footprint on imagefs (content blob plus
    // unpacked snapshot) measured as it is imported.
    let mut footprint = BTreeMap::new();
    for n in 1..=6 {
        let before = available(&imagefs);
        ctrd.import_filler(&filler(n), FILLER_MIB);
        footprint.insert(filler(n), before - available(&imagefs));
    }
    for (name, bytes) in &footprint {
        assert!(
            *bytes >= (2 * FILLER_MIB) << 20,
            "{name}: {bytes} bytes on imagefs: not unpacked?"
        );
    }

    let port = free_port();
    let state = ctrd.dir.join("criguard-state");
    let listen = ctrd.dir.join("criguard.sock");
    let args = [
        format!("--metrics-address=127.0.0.1:{port}"),
        format!("--state-dir={}", state.display()),
        format!("--imagefs={}", imagefs.display()),
        "--image-gc-interval=1s".into(),
        format!("--image-gc-high-threshold={HIGH}"),
        format!("--image-gc-low-threshold={LOW}"),
        "--minimum-image-ttl-duration=0s".into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let guard = CriguardProcess::start(&listen, &ctrd.socket, &args).await;
    let mut c = guard.kubelet();
    let ids = images(&mut c).await;

    // A running pod uses f3 and busybox; f1, f2 and f6 are used, in that
    // order, by containers that are then removed; f4 and f5 never are.
    let mut pod = PodSpec::new("user", &unique("user"))
        .container(criguard_test_kit::kubelet::ContainerSpec {
            image: filler(3),
            ..sleeper("f3")
        })
        .container(sleeper("bb"));
    pod.cgroup_root = format!("{root}/kubepods");
    pod.log_root = ctrd.dir.join("pods").to_str().unwrap().into();
    let (running, _) = run_pod(&mut c.rt, &pod, None).await;
    for n in [1, 2, 6] {
        let mut p = PodSpec::new(&format!("once-f{n}"), &unique("once")).container(
            criguard_test_kit::kubelet::ContainerSpec {
                image: filler(n),
                ..sleeper("c")
            },
        );
        p.cgroup_root = format!("{root}/kubepods");
        p.log_root = pod.log_root.clone();
        let (sandbox, _) = run_pod(&mut c.rt, &p, None).await;
        remove_pods(&mut c.rt, [sandbox]).await;
    }

    // The uses reach the state file; criguard restarts and must keep them.
    let state_file = state.join("image-gc.json");
    let used = [1, 2, 6].map(|n| ids[&filler(n)].clone());
    common::poll_until(Duration::from_secs(20), "image uses saved", || async {
        let text = std::fs::read_to_string(&state_file).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        used.iter()
            .all(|id| v["images"][id]["lastUsedMs"].is_i64())
            .then_some(())
    })
    .await;
    guard.signal_and_wait(libc::SIGTERM);

    // While criguard is down, fill imagefs past the high threshold so that
    // 3.5 fillers must go.
    let each = footprint.values().sum::<u64>() / footprint.len() as u64;
    let cap = fs_stats(&imagefs).unwrap().capacity;
    let target = cap * (100 - LOW) / 100;
    let want_available = target - each * 7 / 2;
    assert!(
        want_available < cap * (100 - HIGH) / 100,
        "the fill must cross the high threshold"
    );
    let ballast = available(&imagefs) - want_available;
    let mut f = std::fs::File::create(imagefs.join("ballast")).unwrap();
    let chunk = vec![0x5au8; 1 << 20];
    let mut left = ballast;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n]).unwrap();
        left -= n as u64;
    }
    f.sync_all().unwrap();
    drop(f);
    let before = available(&imagefs);
    // criguard comes back to a full imagefs (filled while it was down, so
    // that no collection races the fill).
    let guard = CriguardProcess::start(&listen, &ctrd.socket, &args).await;
    let mut c = guard.kubelet();

    // The order the policy must follow: never used (f4, f5: first detected
    // together, ties by id), then f1, f2 by their last use. Predict how many
    // of them the measured footprints say are needed.
    let mut never: Vec<String> = [4, 5].map(filler).to_vec();
    never.sort_by_key(|n| ids[n].clone());
    let order: Vec<String> = never.into_iter().chain([1, 2].map(filler)).collect();
    let wanted = target - before;
    let mut cum = 0;
    let needed = order
        .iter()
        .position(|n| {
            cum += footprint[n];
            cum >= wanted
        })
        .expect("enough unused images")
        + 1;
    assert_eq!(needed, 4, "the fill was meant to need four images");

    let removals = common::poll_until(Duration::from_secs(30), "an image GC", || async {
        let s = parse(&scrape(port));
        value(
            &s,
            "criguard_reclaim_removals_total",
            &[("action", "image_gc")],
        )
        .filter(|v| *v > 0.0)
    })
    .await;
    let after = available(&imagefs);
    let left: BTreeMap<String, String> = images(&mut c).await;
    for name in &order[..needed] {
        assert!(!left.contains_key(name), "{name} should be gone: {left:?}");
    }
    for name in [
        filler(3),
        filler(6),
        "docker.io/library/busybox:criguard".into(),
        "registry.k8s.io/pause:3.9".into(),
    ] {
        assert!(left.contains_key(&name), "{name} must stay: {left:?}");
    }
    assert_eq!(removals, needed as f64, "no more images than needed");
    assert!(
        after >= target,
        "usage must end under the low threshold: available {after} < {target}"
    );

    // The bytes counted are the bytes the filesystem got back.
    let s = parse(&scrape(port));
    let counted = value(
        &s,
        "criguard_reclaimed_bytes_total",
        &[("action", "image_gc")],
    )
    .unwrap();
    let measured = (after - before) as f64;
    assert!(
        (counted - measured).abs() <= (1 << 20) as f64,
        "counted {counted} bytes, the filesystem got back {measured}"
    );

    remove_pods(&mut c.rt, [running]).await;
    drop(guard);
}

#[test]
fn invalid_image_gc_settings_exit_2_naming_the_key() {
    let cases: [(&[&str], &str); 3] = [
        (
            &[
                "--image-gc-high-threshold=70",
                "--image-gc-low-threshold=75",
            ],
            "imageGCLowThresholdPercent",
        ),
        (
            &["--image-gc-high-threshold=101"],
            "imageGCHighThresholdPercent",
        ),
        (
            &[
                "--minimum-image-ttl-duration=5m",
                "--image-maximum-gc-age=1m",
            ],
            "imageMaximumGCAge",
        ),
    ];
    for (args, key) in cases {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_criguard"))
            .arg("check-config")
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(key), "{args:?}: {err}");
    }
}
