//! Memory events against the real kernel: memcg usage thresholds (cgroup
//! v1), PSI triggers and kernfs change notification (cgroup v2, through the
//! unified hierarchy of this hybrid host and `/proc/pressure/memory`).
//!
//! Ordering is proven with the kernel's own readings, not with timing: an
//! event may only be seen once the memcg's peak usage has reached the line,
//! and a PSI event only once the stall total has grown by the trigger's
//! stall time.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::memcg::{Filler, MEMORY, Proc, TestCgroup, UNIFIED, in_cgroups};
use criguard::cgroup::fs::{CgroupFs, stat_value};
use criguard::config::{Amount, EvictionConfig, Threshold};
use criguard::eviction::ready::BAND;
use criguard::signals::node::NodeSources;
use criguard::signals::notify::v2::{FileModified, PsiSettings, PsiTrigger, psi_total};
use criguard::signals::notify::{MemoryEvent, MemoryEvents, Watch, v1::usage_threshold};
use criguard::signals::table::Signal;
use tokio::time::timeout;

const MI: u64 = 1 << 20;

/// criguard's sources with `pods` as the pods' cgroup.
fn sources(pods: &str) -> NodeSources {
    NodeSources {
        cgroups: CgroupFs::detect(Path::new("/sys/fs/cgroup")),
        proc_root: "/proc".into(),
        memory_capacity: common::pods::mem_total() as u64,
        pods_cgroup: pods.to_owned(),
        nodefs: "/".into(),
        imagefs: "/".into(),
    }
}

/// A configuration with one hard `allocatableMemory.available` threshold.
fn allocatable_below(bytes: u64) -> EvictionConfig {
    EvictionConfig {
        hard: vec![Threshold {
            signal: Signal::AllocatableMemoryAvailable,
            amount: Amount::Quantity(bytes),
            grace_period: None,
            min_reclaim: None,
        }],
        soft: vec![],
        max_pod_grace_period: None,
        pressure_transition_period: Duration::from_secs(300),
        housekeeping_interval: Duration::from_secs(10),
    }
}

/// The same threshold soft: watched by its usage line alone (a hard one
/// near its line is polled too).
fn soft_allocatable_below(bytes: u64) -> EvictionConfig {
    let mut config = allocatable_below(bytes);
    config.soft = std::mem::take(&mut config.hard);
    config.soft[0].grace_period = Some(Duration::from_secs(30));
    config
}

/// Waits up to `limit` for an event.
async fn event_within(events: &mut MemoryEvents, limit: Duration) -> Option<MemoryEvent> {
    timeout(limit, events.next()).await.ok()
}

#[tokio::test]
async fn memcg_threshold_event_fires_after_usage_crosses_the_kubelets_line_and_not_before() {
    let cg = TestCgroup::create(MEMORY, "criguard-ev");
    let limit = 512 * MI;
    cg.write("memory.limit_in_bytes", &limit.to_string());
    let mut filler = Filler::start(&[&cg]);
    let src = sources(&cg.name());
    // Threshold 16 MiB below the room left: the line sits 16 MiB above usage now.
    let usage = cg.read_u64("memory.usage_in_bytes");
    let amount = limit - usage - 16 * MI;
    let config = soft_allocatable_below(amount);
    let mut events = MemoryEvents::new(src.clone(), &config, Default::default());
    events.rearm(&src.observe());
    let armed = events.armed();
    let [Watch::Usage { bytes: line, .. }] = armed[..] else {
        panic!("one usage threshold expected, armed: {armed:?}");
    };
    // The kubelet's line, from an independent reading of the memcg.
    let stat = std::fs::read_to_string(cg.file("memory.stat")).unwrap();
    let inactive = stat_value(&stat, "total_inactive_file").unwrap();
    assert_eq!(line, usage_threshold(limit, amount, inactive));

    // Grow 1 MiB at a time. The filler allocates nothing between steps, and
    // the kernel's peak usage is read before looking for the event: an event
    // seen with a peak below the line would have fired before the crossing.
    // The kernel checks thresholds every 128 charged pages per CPU, so the
    // event may trail the crossing by that much per CPU.
    cg.write("memory.max_usage_in_bytes", "0");
    let slack = 4 * MI + 128 * 4096 * std::thread::available_parallelism().unwrap().get() as u64;
    let mut seen = None;
    for mib in 2..=64 {
        filler.grow_to(mib);
        let peak = cg.read_u64("memory.max_usage_in_bytes");
        match event_within(&mut events, Duration::from_millis(100)).await {
            Some(ev) => {
                assert!(
                    peak >= line,
                    "event before the crossing: peak {peak} < line {line}"
                );
                eprintln!(
                    "event at step {mib} MiB: peak {} KiB past the line",
                    (peak - line) / 1024
                );
                seen = Some(ev);
                break;
            }
            None => assert!(
                peak < line + slack,
                "usage {peak} went {} past the line with no event",
                peak - line
            ),
        }
    }
    let ev = seen.expect("an event once usage crossed the line");
    assert_eq!(ev.watch, armed[0]);
    // Read back when it fired: the signal below its threshold, which the
    // eviction loop may kill at once for.
    let crossed = ev.crossed.expect("the crossing's reading");
    assert_eq!(crossed.signal, Signal::AllocatableMemoryAvailable);
    assert_eq!(crossed.reading.capacity, limit);
    assert!(
        crossed.reading.available < amount as i64,
        "{crossed:?} not below {amount}"
    );

    // Re-armed after the observation it caused: same line (inactive_file
    // did not move), same registration.
    events.rearm(&src.observe());
    assert_eq!(events.armed(), armed);
    // The kernel also signals the way down: the filler's memory going away.
    drop(filler);
    let down = event_within(&mut events, Duration::from_secs(10)).await;
    let down = down.expect("an event when usage fell back below the line");
    assert_eq!(down.crossed, None, "read back above the threshold");
    assert!(cg.read_u64("memory.usage_in_bytes") < line);
}

#[tokio::test]
async fn a_second_line_says_when_usage_comes_within_the_band_of_a_hard_threshold() {
    let cg = TestCgroup::create(MEMORY, "criguard-ev");
    let limit = 512 * MI;
    cg.write("memory.limit_in_bytes", &limit.to_string());
    let mut filler = Filler::start(&[&cg]);
    let src = sources(&cg.name());
    // The threshold's line 16 MiB past the band's, itself 16 MiB above usage.
    let usage = cg.read_u64("memory.usage_in_bytes");
    let amount = limit - usage - 32 * MI - BAND;
    let mut events = MemoryEvents::new(src.clone(), &allocatable_below(amount), Default::default());
    events.rearm(&src.observe());
    let armed = events.armed();
    let [
        Watch::Usage {
            bytes: line,
            band: false,
            ..
        },
        Watch::Usage {
            bytes: band_line,
            band: true,
            ..
        },
    ] = armed[..]
    else {
        panic!("the threshold's line and the band's expected, armed: {armed:?}");
    };
    assert_eq!(line - band_line, BAND);
    cg.write("memory.max_usage_in_bytes", "0");
    let mut seen = None;
    for mib in 2..=40 {
        filler.grow_to(mib);
        if let Some(ev) = event_within(&mut events, Duration::from_millis(100)).await {
            seen = Some(ev);
            break;
        }
    }
    let ev = seen.expect("an event once usage came within the band");
    let peak = cg.read_u64("memory.max_usage_in_bytes");
    assert!(
        peak >= band_line && peak < line,
        "peak {peak}, lines {band_line} and {line}"
    );
    assert_eq!(ev.watch, armed[1]);
    assert_eq!(ev.crossed, None, "near, not past: nothing to kill for");
    // Observed near, re-armed: the threshold's line, and a poll (the kernel
    // checks the line only every 128 pages charged per CPU).
    events.rearm(&src.observe());
    let now = events.armed();
    assert!(
        matches!(now[..], [ref line, Watch::Poll { .. }] if *line == armed[0]),
        "{now:?}"
    );
}

#[tokio::test]
async fn a_removed_memcg_fires_once_and_a_recreated_one_is_armed_anew() {
    let cg = TestCgroup::create(MEMORY, "criguard-ev");
    cg.write("memory.limit_in_bytes", &(256 * MI).to_string());
    let src = sources(&cg.name());
    // Within the band of its line: one watch, no band line.
    let mut events = MemoryEvents::new(
        src.clone(),
        &soft_allocatable_below(200 * MI),
        Default::default(),
    );
    events.rearm(&src.observe());
    assert_eq!(events.armed().len(), 1);

    // Removal signals the eventfd one last time; the next observation no
    // longer sees the signal, so nothing stays armed, and nothing fails.
    std::fs::remove_dir(&cg.dir).unwrap();
    let gone = event_within(&mut events, Duration::from_secs(10)).await;
    assert!(gone.is_some(), "no event when the memcg was removed");
    events.rearm(&src.observe());
    assert!(events.armed().is_empty(), "{:?}", events.armed());

    // The same name again: a new registration on the new memcg, which fires.
    std::fs::create_dir(&cg.dir).unwrap();
    cg.write("memory.limit_in_bytes", &(256 * MI).to_string());
    let mut filler = Filler::start(&[&cg]);
    let amount = 256 * MI - cg.read_u64("memory.usage_in_bytes") - 8 * MI;
    let config = soft_allocatable_below(amount);
    let mut events = MemoryEvents::new(src.clone(), &config, Default::default());
    events.rearm(&src.observe());
    assert_eq!(events.armed().len(), 1);
    filler.grow_to(24);
    let ev = event_within(&mut events, Duration::from_secs(10)).await;
    assert!(ev.is_some(), "no event from the re-created memcg");
    drop(filler);
}

#[tokio::test]
async fn a_line_passed_between_observing_and_arming_is_reported_at_once() {
    // The kernel reports crossings only; a line registered below usage is
    // never signalled, so criguard must notice that itself.
    let cg = TestCgroup::create(MEMORY, "criguard-ev");
    let limit = 256 * MI;
    cg.write("memory.limit_in_bytes", &limit.to_string());
    let mut filler = Filler::start(&[&cg]);
    let src = sources(&cg.name());
    let amount = limit - cg.read_u64("memory.usage_in_bytes") - 8 * MI;
    let config = allocatable_below(amount);
    let before = src.observe();
    filler.grow_to(24);
    let mut events = MemoryEvents::new(src.clone(), &config, Default::default());
    events.rearm(&before);
    let ev = event_within(&mut events, Duration::from_millis(200))
        .await
        .expect("the line passed after the observation is reported");
    assert_eq!(ev.detail, "crossed while being armed");
    let crossed = ev.crossed.expect("read back past the threshold");
    assert!(crossed.reading.available < amount as i64, "{crossed:?}");

    // Armed from an observation that already meets the threshold: the round
    // that read it has acted, so there is nothing new to report.
    let after = src.observe();
    assert!(
        after
            .get(&Signal::AllocatableMemoryAvailable)
            .unwrap()
            .available
            < amount as i64
    );
    let mut events = MemoryEvents::new(src.clone(), &config, Default::default());
    events.rearm(&after);
    assert_eq!(events.armed().len(), 1);
    assert!(
        event_within(&mut events, Duration::from_millis(200))
            .await
            .is_none(),
        "no event for a threshold the observation already met"
    );
}

/// Whether this process holds CAP_SYS_RESOURCE (PSI windows of any length).
fn has_cap_sys_resource() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .unwrap();
    const CAP_SYS_RESOURCE: u32 = 24; // linux/capability.h
    u64::from_str_radix(eff.trim(), 16).unwrap() & (1 << CAP_SYS_RESOURCE) != 0
}

#[tokio::test]
async fn psi_triggers_fire_after_the_cgroup_stalls_on_memory_and_not_before() {
    // A v2 cgroup for PSI and a small v1 memcg in which reading a file
    // bigger than the limit, over and over, stalls on reclaim and refaults.
    let psi_cg = TestCgroup::create(UNIFIED, "criguard-psi");
    let memcg = TestCgroup::create(MEMORY, "criguard-psi");
    memcg.write("memory.limit_in_bytes", &(16 * MI).to_string());
    let settings = PsiSettings::new(
        Duration::from_millis(50),
        Duration::from_secs(2),
        "stall",
        "window",
    )
    .unwrap();
    let pressure = psi_cg.file("memory.pressure");
    let cgroup_trigger = PsiTrigger::arm(&pressure, &settings).unwrap();
    let system_trigger = PsiTrigger::arm(Path::new("/proc/pressure/memory"), &settings).unwrap();
    let read_total = |p: &Path| psi_total(&std::fs::read_to_string(p).unwrap(), "some").unwrap();
    let system = Path::new("/proc/pressure/memory");
    let (cg0, sys0) = (read_total(&pressure), read_total(system));
    assert_eq!(cg0, 0, "no task has run in the new cgroup, so none stalled");

    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let file = tmp.path().join("thrash.dat");
    let script = format!(
        "head -c 67108864 /dev/zero > {f}; while true; do cat {f} > /dev/null; done",
        f = file.display()
    );
    let _thrash = Proc(in_cgroups(&[&psi_cg, &memcg], &script).spawn().unwrap());

    timeout(Duration::from_secs(30), cgroup_trigger.fired())
        .await
        .expect("the cgroup's trigger fired within 30 s")
        .unwrap();
    let stalled = read_total(&pressure) - cg0;
    assert!(
        stalled >= 50_000,
        "fired after {stalled} µs of stall, not 50 ms"
    );
    // The system-wide file has the same interface and counts the same stalls.
    timeout(Duration::from_secs(30), system_trigger.fired())
        .await
        .expect("the system trigger fired within 30 s")
        .unwrap();
    let stalled = read_total(system) - sys0;
    assert!(
        stalled >= 50_000,
        "system: fired after {stalled} µs of stall"
    );
}

#[tokio::test]
async fn psi_windows_follow_the_kernels_privilege_rule() {
    let system = Path::new("/proc/pressure/memory");
    let ms = Duration::from_millis;
    let two_s = PsiSettings::new(ms(150), ms(2000), "stall", "window").unwrap();
    PsiTrigger::arm(system, &two_s).expect("a 2 s window is always accepted");
    let one_s = PsiSettings::new(ms(150), ms(1000), "stall", "window").unwrap();
    match (PsiTrigger::arm(system, &one_s), has_cap_sys_resource()) {
        (Ok(_), true) => {}
        (Err(e), false) => {
            let msg = e.to_string();
            assert!(
                msg.contains("/proc/pressure/memory") && msg.contains("multiple of 2s"),
                "{msg}"
            );
        }
        (r, cap) => panic!("1 s window with CAP_SYS_RESOURCE={cap}: {r:?}"),
    }
}

#[tokio::test]
async fn kernfs_change_notification_reports_the_counters_that_went_up() {
    // cgroup.events changes the way memory.events does (cgroup_file_notify).
    let cg = TestCgroup::create(UNIFIED, "criguard-kernfs");
    let mut watch = FileModified::watch(&cg.file("cgroup.events")).unwrap();
    assert!(
        timeout(Duration::from_millis(200), watch.changed())
            .await
            .is_err(),
        "nothing changed yet"
    );
    let sleeper = Proc(in_cgroups(&[&cg], "exec sleep 600").spawn().unwrap());
    let up = timeout(Duration::from_secs(10), watch.changed())
        .await
        .expect("a change when a process joined")
        .unwrap();
    assert_eq!(up, [("populated".to_owned(), 1)]);
    drop(sleeper);
    let down = timeout(Duration::from_secs(10), watch.changed())
        .await
        .expect("a change when the process left")
        .unwrap();
    assert!(down.is_empty(), "nothing went up: {down:?}");
}
