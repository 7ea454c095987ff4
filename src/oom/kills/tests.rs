//! The watcher against v1 fixture trees: notifications, counters, ranks.

use super::*;
use crate::model::{ContainerInfo, ContainerState, SandboxInfo, SandboxState};
use crate::signals::write_fixture as write;

/// A v1 fixture: pods "x" (BestEffort, container cx) and "y"
/// (Burstable, container cy), every counter at 0.
fn fixture() -> (tempfile::TempDir, NodeModel) {
    let t = tempfile::tempdir().unwrap();
    let mut m = NodeModel::new(1 << 30);
    for (sb, c, qos) in [("sx", "cx", "besteffort"), ("sy", "cy", "burstable")] {
        let parent = format!("/kubepods/{qos}/pod{sb}");
        m.upsert_sandbox(SandboxInfo {
            id: sb.into(),
            name: sb.trim_start_matches('s').into(),
            namespace: "ns".into(),
            uid: format!("uid-{sb}"),
            cgroup_parent: parent.clone(),
            state: Some(SandboxState::Ready),
            ..Default::default()
        });
        m.upsert_container(ContainerInfo {
            id: c.into(),
            sandbox_id: sb.into(),
            name: "app".into(),
            oom_score_adj: if qos == "besteffort" { 1000 } else { 900 },
            state: Some(ContainerState::Running),
            ..Default::default()
        });
        for task in [sb, c] {
            set(t.path(), &format!("{parent}/{task}"), 0);
        }
    }
    (t, m)
}

fn set(root: &Path, cgroup: &str, kills: u64) {
    write(
        root,
        &format!("memory{cgroup}/memory.oom_control"),
        &format!("oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n"),
    );
}

fn watcher(root: &Path, first: &str) -> OomKillWatcher {
    let mut ranks = RankHistory::default();
    ranks.record(1_000, Some(first.into()));
    OomKillWatcher::new(root, Arc::new(Mutex::new(ranks)), OomKills::default())
}

fn exit(id: &str, status: u32) -> TaskExit {
    TaskExit {
        container_id: id.into(),
        process_id: id.into(),
        pid: 1,
        exit_status: status,
        exited_at_unix_ms: 3_000,
    }
}

#[test]
fn a_notification_to_every_cgroup_records_only_the_one_that_lost_a_process() {
    let (t, m) = fixture();
    let mut w = watcher(t.path(), "sx");
    w.baseline(&m);
    set(t.path(), "/kubepods/besteffort/podsx/cx", 1);
    let now = Instant::now();
    // cgroup v1: every task below the OOMing cgroup is notified.
    let mut kills = Vec::new();
    for task in ["sx", "cx", "sy", "cy"] {
        kills.extend(w.on_oom(&m, task, 2_000, now));
    }
    assert_eq!(kills.len(), 1, "{kills:#?}");
    let k = &kills[0];
    assert_eq!((k.pod.as_str(), k.container.as_str()), ("ns/x", "app"));
    assert_eq!(
        (k.qos, k.kills, k.at_unix_ms),
        (QosClass::BestEffort, 1, 2_000)
    );
    assert!(k.matched_rank && k.notified);
    assert_eq!(k.first_ranked.as_deref(), Some("ns/x"));
    // The rechecks up to a second later find nothing new, and end.
    assert_eq!(w.deadline(), Some(now + RECHECKS[0]));
    assert!(w.on_deadline(&m, now + RECHECKS[0]).is_empty());
    assert_eq!(w.deadline(), Some(now + RECHECKS[1]), "the next recheck");
    assert!(w.on_deadline(&m, now + RECHECK_AFTER).is_empty());
    assert_eq!(w.deadline(), None);
    assert_eq!(w.store.list(), kills);
}

#[test]
fn a_kill_in_another_pod_than_the_first_ranked_does_not_match() {
    let (t, m) = fixture();
    let mut w = watcher(t.path(), "sx");
    w.baseline(&m);
    let now = Instant::now();
    // Counted only after the notification was read: the recheck finds it.
    assert!(w.on_oom(&m, "cy", 2_000, now).is_empty());
    set(t.path(), "/kubepods/burstable/podsy/cy", 1);
    let kills = w.on_deadline(&m, now + RECHECK_AFTER);
    assert_eq!(kills.len(), 1);
    assert_eq!(
        (kills[0].qos, kills[0].matched_rank),
        (QosClass::Burstable, false)
    );
    assert_eq!(kills[0].first_ranked.as_deref(), Some("ns/x"));
}

#[test]
fn a_notified_task_stopped_by_sigkill_is_no_kill_without_its_counter() {
    // cgroup v1: the OOM notified x too; the kubelet then stops x
    // (SIGKILL) and its cgroup is removed. Not the OOM killer's doing.
    let (t, m) = fixture();
    let mut w = watcher(t.path(), "sx");
    w.baseline(&m);
    let now = Instant::now();
    assert!(w.on_oom(&m, "cx", 2_000, now).is_empty());
    std::fs::remove_dir_all(t.path().join("memory/kubepods/besteffort/podsx/cx")).unwrap();
    assert!(w.on_exit(&m, &exit("cx", 137)).is_empty());
    assert!(!w.suspects.contains_key("cx"), "the task is gone");
    // The victim's own exit, counter up: the kill is recorded there.
    assert!(w.on_oom(&m, "cy", 2_000, now).is_empty());
    set(t.path(), "/kubepods/burstable/podsy/cy", 1);
    let kills = w.on_exit(&m, &exit("cy", 137));
    assert_eq!(
        (kills.len(), kills[0].matched_rank, kills[0].notified),
        (1, false, true)
    );
}

#[test]
fn kills_from_before_the_baseline_are_not_new_and_a_sweep_finds_missed_ones() {
    let (t, m) = fixture();
    set(t.path(), "/kubepods/besteffort/podsx/cx", 4);
    let mut w = watcher(t.path(), "sx");
    w.baseline(&m);
    assert!(w.sweep(&m, 5_000).is_empty());
    set(t.path(), "/kubepods/besteffort/podsx/cx", 6);
    let kills = w.sweep(&m, 5_000);
    assert_eq!(
        (kills.len(), kills[0].kills, kills[0].notified),
        (1, 2, false)
    );
    // An exec killed by SIGKILL leaves its container known.
    let mut exec = exit("cx", 137);
    exec.process_id = "exec-1".into();
    set(t.path(), "/kubepods/besteffort/podsx/cx", 7);
    assert_eq!(w.on_exit(&m, &exec).len(), 1);
    assert_eq!(w.seen.get("cx"), Some(&7));
}

#[test]
fn a_v2_notification_counts_a_kill_even_when_the_scope_is_gone() {
    // cgroup v2, systemd driver: the emptied scope is removed before the
    // notification arrives; containerd sent it because the counter rose.
    let t = tempfile::tempdir().unwrap();
    write(t.path(), "cgroup.controllers", "memory\n");
    let mut m = NodeModel::new(1 << 30);
    m.upsert_sandbox(SandboxInfo {
        id: "sx".into(),
        name: "x".into(),
        namespace: "ns".into(),
        cgroup_parent: "kubepods-besteffort-podx.slice".into(),
        state: Some(SandboxState::Ready),
        ..Default::default()
    });
    m.upsert_container(ContainerInfo {
        id: "cx".into(),
        sandbox_id: "sx".into(),
        name: "app".into(),
        oom_score_adj: 1000,
        state: Some(ContainerState::Running),
        ..Default::default()
    });
    let mut w = watcher(t.path(), "sx");
    let kills = w.on_oom(&m, "cx", 2_000, Instant::now());
    assert_eq!(kills.len(), 1, "{kills:#?}");
    assert!(kills[0].matched_rank && kills[0].notified);
    // Its SIGKILL exit adds nothing.
    assert!(w.on_exit(&m, &exit("cx", 137)).is_empty());
    // On v1 the same gone cgroup at a notification is no evidence.
    let (t1, m1) = fixture();
    let mut w1 = watcher(t1.path(), "sx");
    std::fs::remove_dir_all(t1.path().join("memory/kubepods/besteffort/podsx/cx")).unwrap();
    assert!(w1.on_oom(&m1, "cx", 2_000, Instant::now()).is_empty());
}

#[test]
fn on_v2_a_gone_scope_takes_what_its_pods_counter_holds_beyond_its_siblings() {
    // The systemd driver: the victim's scope is removed at once and
    // containerd never sends /tasks/oom; the pod's slice still counts it.
    let t = tempfile::tempdir().unwrap();
    write(t.path(), "cgroup.controllers", "memory\n");
    let pod = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podx.slice";
    let events = |kills: u64| format!("low 0\nhigh 0\nmax 0\noom 1\noom_kill {kills}\n");
    for task in ["sx", "cx", "cy"] {
        write(
            t.path(),
            &format!("{pod}/cri-containerd-{task}.scope/memory.events"),
            &events(0),
        );
    }
    write(t.path(), &format!("{pod}/memory.events"), &events(0));
    let mut m = NodeModel::new(1 << 30);
    m.upsert_sandbox(SandboxInfo {
        id: "sx".into(),
        name: "x".into(),
        namespace: "ns".into(),
        cgroup_parent: "kubepods-besteffort-podx.slice".into(),
        state: Some(SandboxState::Ready),
        ..Default::default()
    });
    for c in ["cx", "cy"] {
        m.upsert_container(ContainerInfo {
            id: c.into(),
            sandbox_id: "sx".into(),
            name: format!("app-{c}"),
            oom_score_adj: 1000,
            state: Some(ContainerState::Running),
            ..Default::default()
        });
    }
    let mut w = watcher(t.path(), "sx");
    w.baseline(&m);
    // cx is killed: the pod counts it, cx's scope is gone.
    write(t.path(), &format!("{pod}/memory.events"), &events(1));
    std::fs::remove_dir_all(t.path().join(format!("{pod}/cri-containerd-cx.scope"))).unwrap();
    let kills = w.on_exit(&m, &exit("cx", 137));
    assert_eq!(kills.len(), 1, "{kills:#?}");
    assert_eq!((kills[0].container.as_str(), kills[0].kills), ("app-cx", 1));
    assert!(kills[0].matched_rank && !kills[0].notified);
    // A late notification for it adds nothing: the pod's kill is accounted.
    assert!(w.on_oom(&m, "cx", 3_000, Instant::now()).is_empty());
    // cy is stopped by the kubelet (SIGKILL), its scope gone: no new kill.
    std::fs::remove_dir_all(t.path().join(format!("{pod}/cri-containerd-cy.scope"))).unwrap();
    assert!(w.on_exit(&m, &exit("cy", 137)).is_empty());
    assert_eq!(w.store.list().len(), 1);
}

#[test]
fn on_v2_a_kill_in_a_readable_sibling_stays_the_siblings() {
    let t = tempfile::tempdir().unwrap();
    write(t.path(), "cgroup.controllers", "memory\n");
    let pod = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podx.slice";
    let events = |kills: u64| format!("oom 1\noom_kill {kills}\n");
    for task in ["sx", "cx", "cy"] {
        write(
            t.path(),
            &format!("{pod}/cri-containerd-{task}.scope/memory.events"),
            &events(0),
        );
    }
    write(t.path(), &format!("{pod}/memory.events"), &events(0));
    let mut m = NodeModel::new(1 << 30);
    m.upsert_sandbox(SandboxInfo {
        id: "sx".into(),
        name: "x".into(),
        namespace: "ns".into(),
        cgroup_parent: "kubepods-besteffort-podx.slice".into(),
        state: Some(SandboxState::Ready),
        ..Default::default()
    });
    for c in ["cx", "cy"] {
        m.upsert_container(ContainerInfo {
            id: c.into(),
            sandbox_id: "sx".into(),
            name: c.into(),
            state: Some(ContainerState::Running),
            ..Default::default()
        });
    }
    let mut w = watcher(t.path(), "sx");
    w.baseline(&m);
    // cy lost a process (still running); cx is stopped by SIGKILL.
    write(
        t.path(),
        &format!("{pod}/cri-containerd-cy.scope/memory.events"),
        &events(1),
    );
    write(t.path(), &format!("{pod}/memory.events"), &events(1));
    std::fs::remove_dir_all(t.path().join(format!("{pod}/cri-containerd-cx.scope"))).unwrap();
    let kills = w.on_exit(&m, &exit("cx", 137));
    assert_eq!(kills.len(), 1, "{kills:#?}");
    assert_eq!(
        kills[0].container_id, "cy",
        "the kill is cy's, not the stopped cx's"
    );
}

#[test]
fn a_sweep_counts_every_kill_of_a_container_created_since_the_baseline() {
    // The events missed a kill (the subscription came up late): the sweep
    // after the catch-up reads the container for the first time. Created
    // after criguard started watching, its whole counter is new.
    let (t, mut m) = fixture();
    let mut w = watcher(t.path(), "sx");
    w.baseline(&m);
    let later_ns = i64::try_from(w.baseline_ms + 1_000).unwrap() * 1_000_000;
    m.upsert_container(ContainerInfo {
        id: "cz".into(),
        sandbox_id: "sy".into(),
        name: "late".into(),
        created_at_ns: later_ns,
        state: Some(ContainerState::Running),
        ..Default::default()
    });
    set(t.path(), "/kubepods/burstable/podsy/cz", 1);
    let kills = w.sweep(&m, 5_000);
    assert_eq!(kills.len(), 1, "{kills:#?}");
    assert_eq!((kills[0].container.as_str(), kills[0].kills), ("late", 1));
    // One created before the baseline is only a starting point.
    m.upsert_container(ContainerInfo {
        id: "cw".into(),
        sandbox_id: "sy".into(),
        name: "old".into(),
        created_at_ns: 1_000_000,
        state: Some(ContainerState::Running),
        ..Default::default()
    });
    set(t.path(), "/kubepods/burstable/podsy/cw", 3);
    assert!(w.sweep(&m, 6_000).is_empty());
    assert_eq!(w.seen.get("cw"), Some(&3));
}

#[test]
fn a_kill_counted_just_after_its_notification_is_found_by_an_early_recheck() {
    // The notification crossed to criguard before the kernel counted the
    // kill; the victim's cgroup is gone by the time its exit arrives.
    let (t, m) = fixture();
    let mut w = watcher(t.path(), "sx");
    w.baseline(&m);
    let now = Instant::now();
    assert!(w.on_oom(&m, "cx", 2_000, now).is_empty(), "not counted yet");
    assert!(w.on_deadline(&m, now + RECHECKS[0]).is_empty());
    set(t.path(), "/kubepods/besteffort/podsx/cx", 1);
    let kills = w.on_deadline(&m, now + RECHECKS[1]);
    assert_eq!(kills.len(), 1, "{kills:#?}");
    assert!(kills[0].notified && kills[0].matched_rank);
    assert!(!w.suspects.contains_key("cx"), "found: no more rechecks");
    std::fs::remove_dir_all(t.path().join("memory/kubepods/besteffort/podsx/cx")).unwrap();
    assert!(w.on_exit(&m, &exit("cx", 137)).is_empty(), "counted once");
}

#[test]
fn a_notification_after_the_exit_marks_the_kill_and_counts_nothing_more() {
    // containerd 2 on a loaded machine: the victim's exit (SIGKILL, its
    // counter up) arrives first, its /tasks/oom 60 ms later.
    let (t, m) = fixture();
    let mut w = watcher(t.path(), "sx");
    w.baseline(&m);
    set(t.path(), "/kubepods/besteffort/podsx/cx", 1);
    let kills = w.on_exit(&m, &exit("cx", 137));
    assert_eq!((kills.len(), kills[0].notified), (1, false));
    let now = Instant::now();
    assert!(
        w.on_oom(&m, "cx", 3_060, now).is_empty(),
        "no second record"
    );
    assert_eq!(w.deadline(), None, "nothing to recheck");
    let kept = w.store.list();
    assert_eq!(kept.len(), 1, "{kept:#?}");
    assert!(kept[0].notified && kept[0].matched_rank, "{kept:#?}");
    assert_eq!(kept[0].kills, 1);
    // Another notification for it (v1 notifies every cgroup below) finds
    // the reading the exit took: still one kill.
    assert!(w.on_oom(&m, "cx", 3_100, now).is_empty());
    assert!(w.on_deadline(&m, now + RECHECK_AFTER).is_empty());
    assert_eq!(w.store.list().len(), 1);
}

#[test]
fn only_the_latest_exits_readings_are_kept() {
    let (t, m) = fixture();
    let mut w = watcher(t.path(), "sx");
    w.baseline(&m);
    w.on_exit(&m, &exit("cx", 0));
    assert!(w.seen.contains_key("cx"), "kept for a late notification");
    for i in 0..GONE_KEEP {
        w.on_exit(&m, &exit(&format!("other-{i}"), 0));
    }
    assert!(
        !w.seen.contains_key("cx"),
        "forgotten {GONE_KEEP} exits later"
    );
    assert_eq!(w.gone.len(), GONE_KEEP);
}

#[test]
fn on_v1_a_pods_first_notification_reads_its_other_tasks() {
    // containerd 1.6 passed the sandbox's notification on first; the
    // victim's own came only after its exit had removed its cgroup.
    let (t, m) = fixture();
    let mut w = watcher(t.path(), "sx");
    w.baseline(&m);
    set(t.path(), "/kubepods/besteffort/podsx/cx", 1);
    let now = Instant::now();
    let kills = w.on_oom(&m, "sx", 2_000, now);
    assert_eq!(kills.len(), 1, "{kills:#?}");
    assert_eq!((kills[0].container_id.as_str(), kills[0].kills), ("cx", 1));
    assert!(kills[0].notified && kills[0].matched_rank, "{kills:#?}");
    assert_eq!(kills[0].at_unix_ms, 2_000);
    std::fs::remove_dir_all(t.path().join("memory/kubepods/besteffort/podsx/cx")).unwrap();
    assert!(w.on_oom(&m, "cx", 2_200, now).is_empty());
    assert!(w.on_exit(&m, &exit("cx", 137)).is_empty());
    assert!(w.on_deadline(&m, now + RECHECK_AFTER).is_empty());
    assert_eq!(w.store.list().len(), 1, "one kill, recorded once");
}

#[test]
fn on_v1_any_first_notification_reads_every_pods_tasks() {
    // The pods' own cgroup ran out: containerd passed y's notification on
    // first, and x's (the victim's) only after x's exit removed its cgroup.
    let (t, m) = fixture();
    let mut w = watcher(t.path(), "sx");
    w.baseline(&m);
    set(t.path(), "/kubepods/besteffort/podsx/cx", 1);
    let now = Instant::now();
    let kills = w.on_oom(&m, "cy", 2_000, now);
    assert_eq!(kills.len(), 1, "{kills:#?}");
    assert_eq!((kills[0].container_id.as_str(), kills[0].kills), ("cx", 1));
    assert!(kills[0].notified && kills[0].matched_rank, "{kills:#?}");
    let mut suspects: Vec<&str> = w.suspects.keys().map(String::as_str).collect();
    suspects.sort_unstable();
    assert_eq!(suspects, ["cx", "cy", "sx", "sy"], "each rechecked");
    std::fs::remove_dir_all(t.path().join("memory/kubepods/besteffort/podsx/cx")).unwrap();
    assert!(w.on_exit(&m, &exit("cx", 137)).is_empty());
    assert!(w.on_oom(&m, "cx", 2_100, now).is_empty());
    for d in RECHECKS {
        assert!(w.on_deadline(&m, now + d).is_empty());
    }
    assert_eq!(w.deadline(), None, "every recheck done");
    assert_eq!(w.store.list().len(), 1, "one kill, recorded once");
}

#[test]
fn on_v1_a_kill_the_kernels_log_names_is_recorded_once_even_when_its_cgroup_is_gone() {
    let (t, m) = fixture();
    let mut w = watcher(t.path(), "sx");
    w.baseline(&m);
    let now = Instant::now();
    // Readable: the counter records it; the gone cgroup adds nothing later.
    set(t.path(), "/kubepods/burstable/podsy/cy", 1);
    let kills = w.on_kernel_kill(&m, "/kubepods/burstable/podsy/cy", now);
    assert_eq!(kills.len(), 1, "{kills:#?}");
    assert_eq!((kills[0].container_id.as_str(), kills[0].kills), ("cy", 1));
    std::fs::remove_dir_all(t.path().join("memory/kubepods/burstable/podsy/cy")).unwrap();
    assert!(w.on_exit(&m, &exit("cy", 137)).is_empty());
    // Gone before anything read it (containerd deleted the task first):
    // recorded from the log, once.
    std::fs::remove_dir_all(t.path().join("memory/kubepods/besteffort/podsx/cx")).unwrap();
    let kills = w.on_kernel_kill(&m, "/kubepods/besteffort/podsx/cx", now);
    assert_eq!(kills.len(), 1, "{kills:#?}");
    assert_eq!((kills[0].container_id.as_str(), kills[0].kills), ("cx", 1));
    assert!(kills[0].notified && kills[0].matched_rank, "{kills:#?}");
    assert!(w.on_oom(&m, "cx", 2_000, now).is_empty());
    assert!(w.on_exit(&m, &exit("cx", 137)).is_empty());
    for d in RECHECKS {
        assert!(w.on_deadline(&m, now + d).is_empty());
    }
    assert_eq!(w.store.list().len(), 2, "one record per kill");
    // A cgroup the model does not know is no pod's.
    assert!(
        w.on_kernel_kill(&m, "/system.slice/x.scope", now)
            .is_empty()
    );
}
