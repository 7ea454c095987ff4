//! What the client commands print for people: evictions with local time
//! and age, pods with the `oom_score_adj` the kernel holds beside the one
//! asked for, and `criguard status` as one screen. Pure formatting; the
//! clock, the time zone, `/proc` and the sockets are read by the callers
//! ([`super::client`]) and passed in.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use criguard::admin::{ConditionsReport, EvictionsReport};
use criguard::config::Threshold;
use criguard::eviction::Eviction;
use criguard::model::Pod;
use criguard::oom::kills::OomKill;
use criguard::signals::table::Signal;

use super::tables::Table;

/// A broken-down local time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalTime {
    /// Year, e.g. 2026.
    pub year: i32,
    /// Month, 1 to 12.
    pub month: u32,
    /// Day of the month, 1 to 31.
    pub day: u32,
    /// Hour, 0 to 23.
    pub hour: u32,
    /// Minute.
    pub minute: u32,
    /// Second.
    pub second: u32,
    /// The zone's abbreviation, e.g. `UTC`, `CET`.
    pub zone: String,
}

/// `ms` (since the epoch) in this machine's time zone (`TZ`, else
/// /etc/localtime, else UTC); `None` past the range of dates.
pub fn local_time(ms: u64) -> Option<LocalTime> {
    let at = jiff::Timestamp::from_millisecond(i64::try_from(ms).ok()?).ok()?;
    let tz = jiff::tz::TimeZone::system();
    let zone = tz.to_offset_info(at).abbreviation().to_owned();
    let t = at.to_zoned(tz);
    Some(LocalTime {
        year: i32::from(t.year()),
        month: t.month() as u32,
        day: t.day() as u32,
        hour: t.hour() as u32,
        minute: t.minute() as u32,
        second: t.second() as u32,
        zone,
    })
}

/// `2026-11-26 01:02:03 CET`.
pub fn format_local(t: &LocalTime) -> String {
    let mut s = format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    );
    if !t.zone.is_empty() {
        s.push(' ');
        s.push_str(&t.zone);
    }
    s
}

/// How long ago `at_ms` was at `now_ms`, in its two largest units:
/// `42s ago`, `3m12s ago`, `2h05m ago`, `4d03h ago`; `just now` under a
/// second, `in the future` for a clock that went back.
pub fn age(at_ms: u64, now_ms: u64) -> String {
    let Some(ms) = now_ms.checked_sub(at_ms) else {
        return "in the future".into();
    };
    let s = ms / 1000;
    match s {
        0 => "just now".into(),
        1..60 => format!("{s}s ago"),
        60..3600 => format!("{}m{:02}s ago", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m ago", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h ago", s / 86400, s % 86400 / 3600),
    }
}

/// When something happened, for people: local time and age
/// (`2026-11-26 01:02:03 CET (3m12s ago)`); the raw milliseconds if the
/// time cannot be converted.
pub fn when(at_ms: u64, now_ms: u64, local: impl Fn(u64) -> Option<LocalTime>) -> String {
    match local(at_ms) {
        Some(t) => format!("{} ({})", format_local(&t), age(at_ms, now_ms)),
        None => format!("{at_ms} ms ({})", age(at_ms, now_ms)),
    }
}

/// One eviction as a line: when, the pod, the threshold, the message.
pub fn eviction_line(e: &Eviction, when: &str) -> String {
    let dry = if e.dry_run { " (dry run)" } else { "" };
    format!("{when} {} [{}]{dry}: {}", e.pod, e.threshold, e.message)
}

/// One kernel OOM kill as a line.
pub fn oom_kill_line(k: &OomKill, when: &str) -> String {
    let first = k.first_ranked.as_deref().unwrap_or("none");
    let matched = if k.matched_rank {
        "criguard's first-ranked pod"
    } else {
        "not criguard's first-ranked pod"
    };
    format!(
        "{when} {} [kernel OOM kill] container {} ({:?}), {} process(es): {matched} (first ranked: {first})",
        k.pod, k.container, k.qos, k.kills
    )
}

/// `criguard evictions`: the evictions, then the kernel OOM kills, each
/// with its local time and age.
pub fn evictions_text(r: &EvictionsReport, when: impl Fn(u64) -> String) -> String {
    let mut out = String::new();
    for e in &r.evictions {
        let _ = writeln!(out, "{}", eviction_line(e, &when(e.at_unix_ms)));
    }
    for k in &r.kernel_oom_kills {
        let _ = writeln!(out, "{}", oom_kill_line(k, &when(k.at_unix_ms)));
    }
    out
}

/// The `oom_score_adj` values a container's processes hold now, as one
/// column: `0`, `-997,0` when they differ, `-` when none could be read
/// (an exited container, another mount namespace).
pub fn effective_column(values: Option<&BTreeSet<i64>>) -> String {
    match values {
        Some(v) if !v.is_empty() => v.iter().map(i64::to_string).collect::<Vec<_>>().join(","),
        _ => "-".into(),
    }
}

/// `criguard pods`: one line per container, with where its pod's numbers
/// come from (SOURCE: `api` or `inferred`), the pod's memory request the
/// eviction manager ranks by (POD-REQ: init containers, sidecars,
/// pod-level resources and overhead counted), and the `oom_score_adj` it
/// was created with (WANT: the kubelet's, after criguard's patch) beside
/// the values its processes hold (EFF: what the kernel's OOM killer uses;
/// the dynamic adjuster's, or 0 where the kernel refused a negative one).
/// `effective` gives a container's, by container id.
pub fn pods_table(pods: &[Pod], effective: impl Fn(&str) -> Option<BTreeSet<i64>>) -> String {
    let mut t = Table::new(
        "",
        &[
            "NAMESPACE/POD",
            "QOS",
            "PRIORITY",
            "CRITICAL",
            "SOURCE",
            "POD-REQ",
            "STATE",
            "SANDBOX",
            "CONTAINER",
            "C-STATE",
            "MEM-REQ",
            "MEM-LIM",
            "OOM-WANT",
            "OOM-EFF",
        ],
    );
    for p in pods {
        let head = [
            format!("{}/{}", p.namespace, p.name),
            format!("{:?}", p.qos),
            p.priority.to_string(),
            (if p.critical { "yes" } else { "no" }).to_owned(),
            p.source.as_str().to_owned(),
            mib(p.memory_request()),
            format!("{:?}", p.state),
            p.sandbox_id.get(..12).unwrap_or(&p.sandbox_id).to_owned(),
        ];
        if p.containers.is_empty() {
            t.row(head.clone());
        }
        for c in p.containers.values() {
            t.row(head.iter().cloned().chain([
                c.name.clone(),
                format!("{:?}", c.state),
                mib(c.memory_request),
                mib(c.memory_limit),
                c.oom_score_adj.to_string(),
                effective_column(effective(&c.id).as_ref()),
            ]));
        }
    }
    t.finish()
}

fn mib(bytes: i64) -> String {
    if bytes <= 0 {
        "-".into()
    } else {
        format!("{}Mi", bytes >> 20)
    }
}

/// Whether a connection answered, for the status screen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reach {
    /// It answered: what it said (e.g. `containerd 1.7.24`) and how fast.
    Answered {
        /// What it answered.
        what: String,
        /// Round trip, milliseconds.
        ms: u64,
    },
    /// It did not: why.
    Failed(String),
    /// Not configured.
    Off(String),
}

impl Reach {
    fn text(&self) -> String {
        match self {
            Reach::Answered { what, ms } => format!("ok ({what}, {ms} ms)"),
            Reach::Failed(why) => format!("FAILED: {why}"),
            Reach::Off(why) => why.clone(),
        }
    }
}

/// The connections `criguard status` checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connections {
    /// The runtime's socket, and a CRI Version call on it.
    pub runtime: (String, Reach),
    /// criguard's CRI socket (the kubelet's endpoint), and a Version call through it.
    pub cri: (String, Reach),
    /// The Kubernetes API report: writes by outcome, from the metrics.
    pub api: Reach,
}

/// The overview `criguard status` prints between the configuration's state
/// and its settings: each signal against its hard threshold and its soft
/// one with the grace period (`MET` when the hard one is, `SOFT MET` when
/// only the soft one is: criguard acts once it has stayed met for the grace
/// period), the conditions, the last `last` evictions and kernel OOM kills,
/// the connections.
pub fn status_overview(
    thresholds: &[Threshold],
    conditions: &ConditionsReport,
    evictions: &EvictionsReport,
    last: usize,
    connections: &Connections,
    when: impl Fn(u64) -> String,
) -> String {
    let mut out = String::new();
    signals_table(&mut out, thresholds, conditions, &when);
    conditions_line(&mut out, conditions);
    last_events(&mut out, evictions, last, &when);
    connections_lines(&mut out, connections);
    out
}

/// Each signal observed or with a threshold: available, the hard
/// threshold and the soft one with its grace period (resolved against the
/// observed capacity; as configured for a signal not observed), capacity,
/// and which threshold is met.
fn signals_table(
    out: &mut String,
    thresholds: &[Threshold],
    conditions: &ConditionsReport,
    when: &impl Fn(u64) -> String,
) {
    let observed = conditions
        .observed_at_unix_ms
        .map_or("no round yet".to_owned(), when);
    let _ = writeln!(out, "\nsignals (read {observed}):");
    let mut t = Table::new(
        "  ",
        &[
            "SIGNAL",
            "AVAILABLE",
            "THRESHOLD",
            "SOFT (GRACE)",
            "CAPACITY",
            "",
        ],
    );
    let mut hard: BTreeMap<Signal, &Threshold> = BTreeMap::new();
    let mut soft: BTreeMap<Signal, &Threshold> = BTreeMap::new();
    for t in thresholds {
        match t.grace_period {
            None => hard.insert(t.signal, t),
            Some(_) => soft.insert(t.signal, t),
        };
    }
    let mut signals: BTreeSet<Signal> = conditions.observations.keys().copied().collect();
    signals.extend(hard.keys().copied());
    signals.extend(soft.keys().copied());
    for s in signals {
        let o = conditions.observations.get(&s);
        // Resolved against the observed capacity; as configured (`15%`)
        // for a signal not observed.
        let resolve = |t: &Threshold| match o {
            Some(o) => {
                let t = t.amount.resolve(o.capacity) as i64;
                (Some(t), s.show(t))
            }
            None => (None, t.amount_display()),
        };
        let threshold = hard.get(&s).map(|t| resolve(t));
        let soft_threshold = soft.get(&s).map(|t| {
            let (at, shown) = resolve(t);
            let grace = t.grace_period.map_or_else(String::new, |g| {
                format!(" ({})", criguard::quantity::format_duration(g))
            });
            (at, format!("{shown}{grace}"))
        });
        let below = |t: &Option<(Option<i64>, String)>| matches!((o, t), (Some(o), Some((Some(t), _))) if o.available < *t);
        let met = if below(&threshold) {
            "MET"
        } else if below(&soft_threshold) {
            "SOFT MET"
        } else {
            ""
        };
        t.row([
            s.name().to_owned(),
            o.map_or("-".into(), |o| s.show(o.available)),
            threshold.map_or("-".into(), |(_, shown)| shown),
            soft_threshold.map_or("-".into(), |(_, shown)| shown),
            o.map_or("-".into(), |o| s.show_capacity(o.capacity)),
            met.to_owned(),
        ]);
    }
    out.push_str(&t.finish());
}

/// The node conditions, or `none`.
fn conditions_line(out: &mut String, conditions: &ConditionsReport) {
    let conds: Vec<String> = conditions
        .conditions
        .iter()
        .map(|c| format!("{c:?}"))
        .collect();
    let _ = writeln!(
        out,
        "conditions: {}",
        if conds.is_empty() {
            "none".to_owned()
        } else {
            conds.join(", ")
        }
    );
}

/// The last `last` evictions and kernel OOM kills, oldest first.
fn last_events(
    out: &mut String,
    evictions: &EvictionsReport,
    last: usize,
    when: &impl Fn(u64) -> String,
) {
    let mut events: Vec<(u64, String)> = evictions
        .evictions
        .iter()
        .map(|e| (e.at_unix_ms, eviction_line(e, &when(e.at_unix_ms))))
        .chain(
            evictions
                .kernel_oom_kills
                .iter()
                .map(|k| (k.at_unix_ms, oom_kill_line(k, &when(k.at_unix_ms)))),
        )
        .collect();
    events.sort_by_key(|(at, _)| *at);
    let total = events.len();
    let _ = writeln!(
        out,
        "last evictions and kernel OOM kills ({} of {total}):",
        total.min(last)
    );
    if total == 0 {
        let _ = writeln!(out, "  none");
    }
    for (_, line) in events.iter().skip(total.saturating_sub(last)) {
        let _ = writeln!(out, "  {line}");
    }
}

/// The runtime, criguard's CRI socket and the Kubernetes API, each with
/// whether it answers.
fn connections_lines(out: &mut String, connections: &Connections) {
    let _ = writeln!(out, "connections:");
    let (rt, rt_reach) = &connections.runtime;
    let _ = writeln!(out, "  runtime {rt}: {}", rt_reach.text());
    let (cri, cri_reach) = &connections.cri;
    let _ = writeln!(out, "  CRI through criguard {cri}: {}", cri_reach.text());
    let _ = writeln!(out, "  Kubernetes API: {}", connections.api.text());
}

#[cfg(test)]
mod tests {
    use super::*;
    use criguard::admin::Observed;
    use criguard::config::Amount;
    use criguard::signals::table::Condition;

    fn utc(ms: u64) -> Option<LocalTime> {
        let s = ms / 1000;
        // 2026-11-26 is day 20538 since the epoch.
        let day = s / 86400;
        (day == 20538).then(|| LocalTime {
            year: 2026,
            month: 11,
            day: 26,
            hour: (s % 86400 / 3600) as u32,
            minute: (s % 3600 / 60) as u32,
            second: (s % 60) as u32,
            zone: "UTC".into(),
        })
    }

    const T: u64 = 20538 * 86400 * 1000 + 3_723_000; // 01:02:03 UTC

    fn eviction(pod: &str, at: u64) -> Eviction {
        Eviction {
            at_unix_ms: at,
            pod: format!("default/{pod}"),
            uid: "u".into(),
            sandbox_id: "s".into(),
            signal: "memory.available".into(),
            threshold: "memory.available<100Mi".into(),
            available: 1,
            usage: 2,
            request: 0,
            grace_s: 0,
            message: "The node was low on resource: memory.".into(),
            dry_run: false,
        }
    }

    #[test]
    fn ages_use_their_two_largest_units() {
        assert_eq!(age(T, T + 400), "just now");
        assert_eq!(age(T, T + 42_000), "42s ago");
        assert_eq!(age(T, T + 192_000), "3m12s ago");
        assert_eq!(age(T, T + 7_500_000), "2h05m ago");
        assert_eq!(age(T, T + 356_400_000), "4d03h ago");
        assert_eq!(age(T + 1, T), "in the future");
    }

    #[test]
    fn evictions_show_local_time_and_age_not_raw_milliseconds() {
        let report = EvictionsReport {
            evictions: vec![eviction("a", T)],
            kernel_oom_kills: vec![],
        };
        let text = evictions_text(&report, |at| when(at, T + 192_000, utc));
        assert_eq!(
            text,
            "2026-11-26 01:02:03 UTC (3m12s ago) default/a [memory.available<100Mi]: The node was low on resource: memory.\n"
        );
        assert!(!text.contains(&T.to_string()));
        // A time the C library cannot convert keeps the milliseconds.
        assert_eq!(when(5, 1005, |_| None), "5 ms (1s ago)");
    }

    #[test]
    fn the_real_local_time_round_trips_the_date() {
        let t = local_time(T).unwrap();
        assert_eq!(t.year, 2026);
        assert!(t.minute < 60 && t.second == 3, "{t:?}");
    }

    #[test]
    fn the_effective_score_column_shows_every_distinct_value() {
        assert_eq!(effective_column(None), "-");
        assert_eq!(effective_column(Some(&BTreeSet::new())), "-");
        assert_eq!(effective_column(Some(&BTreeSet::from([0]))), "0");
        assert_eq!(effective_column(Some(&BTreeSet::from([0, -997]))), "-997,0");
    }

    #[test]
    fn the_overview_puts_each_signal_against_its_threshold() {
        let thresholds = vec![
            Threshold::hard(Signal::MemoryAvailable, Amount::Quantity(100 << 20)),
            Threshold::hard(Signal::NodefsAvailable, Amount::Percentage(10.0)),
            Threshold::hard(Signal::ImagefsAvailable, Amount::Percentage(15.0)),
        ];
        let conditions = ConditionsReport {
            conditions: BTreeSet::from([Condition::MemoryPressure]),
            observations: BTreeMap::from([
                (
                    Signal::MemoryAvailable,
                    Observed {
                        available: 50 << 20,
                        capacity: 1 << 30,
                    },
                ),
                (
                    Signal::NodefsAvailable,
                    Observed {
                        available: 500 << 20,
                        capacity: 1 << 30,
                    },
                ),
            ]),
            observed_at_unix_ms: Some(T),
        };
        let evictions = EvictionsReport {
            evictions: (0..8).map(|i| eviction(&format!("p{i}"), T + i)).collect(),
            kernel_oom_kills: vec![],
        };
        let connections = Connections {
            runtime: (
                "unix:///run/containerd/containerd.sock".into(),
                Reach::Answered {
                    what: "containerd 1.7".into(),
                    ms: 2,
                },
            ),
            cri: (
                "/run/criguard/criguard.sock".into(),
                Reach::Failed("connection refused".into()),
            ),
            api: Reach::Off("not configured (no kubeconfig)".into()),
        };
        let text = status_overview(
            &thresholds,
            &conditions,
            &evictions,
            3,
            &connections,
            |at| when(at, T + 60_000, utc),
        );
        let mem = text
            .lines()
            .find(|l| l.trim_start().starts_with("memory.available"))
            .unwrap();
        assert!(
            mem.contains("50Mi") && mem.contains("100Mi") && mem.ends_with("MET"),
            "{mem}"
        );
        let nodefs = text
            .lines()
            .find(|l| l.trim_start().starts_with("nodefs.available"))
            .unwrap();
        // 10% of 1Gi, not met.
        assert!(
            nodefs.contains("500Mi") && !nodefs.contains("MET"),
            "{nodefs}"
        );
        assert!(text.contains("conditions: MemoryPressure"), "{text}");
        // Not observed: the threshold as configured.
        let imagefs = text
            .lines()
            .find(|l| l.trim_start().starts_with("imagefs.available"))
            .unwrap();
        assert!(
            imagefs.contains(" 15%") && !imagefs.contains("MET"),
            "{imagefs}"
        );
        assert!(text.contains("(3 of 8)"), "{text}");
        assert!(
            text.contains("default/p7") && !text.contains("default/p4"),
            "{text}"
        );
        assert!(
            text.contains(
                "runtime unix:///run/containerd/containerd.sock: ok (containerd 1.7, 2 ms)"
            )
        );
        assert!(text.contains(
            "CRI through criguard /run/criguard/criguard.sock: FAILED: connection refused"
        ));
        assert!(text.contains("Kubernetes API: not configured"));
        assert!(
            text.contains("signals (read 2026-11-26 01:02:03 UTC (1m00s ago))"),
            "{text}"
        );
    }

    #[test]
    fn the_overview_shows_soft_thresholds_with_their_grace_beside_the_hard_ones() {
        let soft = |signal, amount, s| Threshold {
            grace_period: Some(std::time::Duration::from_secs(s)),
            ..Threshold::hard(signal, amount)
        };
        let thresholds = vec![
            Threshold::hard(Signal::MemoryAvailable, Amount::Quantity(100 << 20)),
            soft(Signal::MemoryAvailable, Amount::Quantity(300 << 20), 90),
            soft(Signal::NodefsAvailable, Amount::Percentage(15.0), 120),
            soft(Signal::ImagefsAvailable, Amount::Percentage(20.0), 60),
        ];
        let observed = |available| Observed {
            available,
            capacity: 1 << 30,
        };
        let conditions = ConditionsReport {
            conditions: BTreeSet::new(),
            observations: BTreeMap::from([
                // Under the soft threshold, over the hard one.
                (Signal::MemoryAvailable, observed(200 << 20)),
                // Over the soft threshold (15% of 1Gi is 153.6Mi).
                (Signal::NodefsAvailable, observed(500 << 20)),
            ]),
            observed_at_unix_ms: Some(T),
        };
        let evictions = EvictionsReport {
            evictions: vec![],
            kernel_oom_kills: vec![],
        };
        let connections = Connections {
            runtime: ("r".into(), Reach::Off("-".into())),
            cri: ("c".into(), Reach::Off("-".into())),
            api: Reach::Off("-".into()),
        };
        let text = status_overview(
            &thresholds,
            &conditions,
            &evictions,
            3,
            &connections,
            |_| "then".into(),
        );
        let line = |signal: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with(signal))
                .unwrap_or_else(|| panic!("no {signal} in {text}"))
                .split_whitespace()
                .collect::<Vec<_>>()
        };
        let header = text.lines().find(|l| l.contains("SIGNAL")).unwrap();
        assert_eq!(
            header.split_whitespace().collect::<Vec<_>>(),
            [
                "SIGNAL",
                "AVAILABLE",
                "THRESHOLD",
                "SOFT",
                "(GRACE)",
                "CAPACITY"
            ]
        );
        assert_eq!(
            line("memory.available"),
            [
                "memory.available",
                "200Mi",
                "100Mi",
                "300Mi",
                "(1m30s)",
                "1Gi",
                "SOFT",
                "MET"
            ]
        );
        assert_eq!(
            line("nodefs.available"),
            ["nodefs.available", "500Mi", "-", "153.6Mi", "(2m0s)", "1Gi"]
        );
        // Not observed: as configured.
        assert_eq!(
            line("imagefs.available"),
            ["imagefs.available", "-", "-", "20%", "(1m0s)", "-"]
        );
    }
}
