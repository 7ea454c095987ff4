//! The dynamic scores' bound, and what a round redoes, as tables.

use super::*;

const MI: i64 = 1 << 20;

fn c(id: &str, adj: i64, usage: i64) -> ContainerMemory {
    ContainerMemory {
        id: id.into(),
        sandbox_id: format!("sb-{id}"),
        kubelet_adj: adj,
        usage,
    }
}

#[test]
fn first_victim_outscores_every_other_container() {
    // The article's case: a big Burstable pod (996) would outscore a
    // small BestEffort one (1000) that the kubelet ranks first.
    let total = 256 * MI;
    let cs = [
        c("small-be", 1000, 40 * MI),
        c("big-burstable", 996, 150 * MI),
        c("under", 992, 20 * MI),
    ];
    assert!(
        badness(150 * MI, 996, total) > badness(40 * MI, 1000, total),
        "scenario must need criguard"
    );
    let t = dynamic_scores(Some("sb-small-be"), &cs, total);
    assert!(!t.contains_key("small-be"), "already 1000");
    let adj = |id: &str, k: i64| *t.get(id).unwrap_or(&k);
    let victim = badness(0, 1000, total);
    for (id, k, usage) in [("big-burstable", 996, 150 * MI), ("under", 992, 20 * MI)] {
        assert!(
            badness(usage, adj(id, k), total) < victim,
            "{id} would still be chosen"
        );
    }
}

#[test]
fn low_scores_stay_and_no_victim_restores_nothing_needed() {
    let cs = [c("guaranteed", -997, 500 * MI), c("small", 500, MI)];
    assert!(dynamic_scores(Some("sb-x"), &cs, 1024 * MI).is_empty());
    assert!(dynamic_scores(None, &cs, 1024 * MI).is_empty());
}

#[test]
fn nothing_ranked_restores_every_score_even_a_besteffort_1000() {
    // A BestEffort static pod (critical: never ranked) alone on the
    // node: with no first victim there is nothing to bound it below,
    // so it keeps the kubelet's 1000.
    let cs = [c("static-be", 1000, 3 * MI), c("guaranteed", -997, MI)];
    assert_eq!(dynamic_scores(None, &cs, 256 * MI), HashMap::new());
    // The same container with a victim elsewhere is bounded.
    let t = dynamic_scores(Some("sb-guaranteed"), &cs, 256 * MI);
    assert_eq!(t.get("static-be"), Some(&(999 - 12)));
}

fn check(generation: u64, total: i64, usage: &[(&str, Option<i64>)]) -> Check {
    Check {
        generation,
        total,
        usage: usage.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
    }
}

#[test]
fn a_decision_stands_until_something_that_decides_a_score_moves() {
    let t0 = Instant::now();
    let refresh = Duration::from_secs(10);
    let at = t0 + Duration::from_secs(1);
    let total = 1000 * MI; // one step: about 1 MiB
    let last = check(7, total, &[("a", Some(100 * MI)), ("b", None)]);
    let d = |now: &Check, at| decide(Some((&last, t0)), now, at, refresh);
    assert_eq!(decide(None, &last, t0, refresh), Some(Why::First));
    assert_eq!(d(&last, at), None, "nothing moved");
    let within = check(7, total, &[("a", Some(100 * MI + MI / 2)), ("b", None)]);
    assert_eq!(d(&within, at), None, "less than a step");
    let moved = check(7, total, &[("a", Some(102 * MI)), ("b", None)]);
    assert_eq!(d(&moved, at), Some(Why::Usage("a".into())));
    let readable = check(7, total, &[("a", Some(100 * MI)), ("b", Some(0))]);
    assert_eq!(d(&readable, at), Some(Why::Usage("b".into())));
    let model = check(8, total, &[("a", Some(100 * MI)), ("b", None)]);
    assert_eq!(d(&model, at), Some(Why::Model));
    let scope = check(7, total / 2, &[("a", Some(100 * MI)), ("b", None)]);
    assert_eq!(d(&scope, at), Some(Why::Scope));
    assert_eq!(d(&last, t0 + refresh), Some(Why::Refresh));
}

#[test]
fn what_criguard_set_decides_whether_processes_are_written() {
    use Known::{AtMost, Exactly};
    // Never written by criguard: read the processes and write.
    assert!(needs_write(None, AtMost(998)));
    // A bound as high as or higher than the one set: nothing to do.
    assert!(!needs_write(Some(AtMost(990)), AtMost(998)));
    assert!(!needs_write(Some(Exactly(990)), AtMost(990)));
    // A lower bound, or an exact score that differs: written.
    assert!(needs_write(Some(AtMost(998)), AtMost(990)));
    assert!(needs_write(Some(AtMost(998)), Exactly(998)));
    assert!(!needs_write(Some(Exactly(1000)), Exactly(1000)));
}

#[test]
fn only_changed_targets_and_restores_are_planned() {
    use Known::{AtMost, Exactly};
    let total = 1000 * MI;
    let mut bu = c("bu", 900, 200 * MI);
    bu.sandbox_id = "sb-bu".into();
    let cs = [c("be", 1000, 10 * MI), bu, c("g", -997, 10 * MI)];
    let plan = |known: &HashMap<String, Known>, verify| {
        plan_writes(Some("sb-be"), &cs, total, known, verify)
    };
    let first = plan(&HashMap::new(), false);
    let want: Vec<(&str, Known, Reason)> = first
        .iter()
        .map(|w| (w.id.as_str(), w.want, w.reason))
        .collect();
    // be is already 1000 as the kubelet set it: no target, nothing.
    assert_eq!(want, [("bu", AtMost(799), Reason::KeptBelow)]);
    let known = HashMap::from([("bu".to_owned(), AtMost(799))]);
    assert!(plan(&known, false).is_empty(), "all set already");
    assert_eq!(plan(&known, true).len(), 1, "verify lists it anyway");
    // A container criguard changed that needs no target any more.
    let known = HashMap::from([("g".to_owned(), AtMost(-998)), ("bu".into(), AtMost(799))]);
    let w = plan(&known, false);
    assert_eq!(w.len(), 1);
    assert_eq!(
        (w[0].id.as_str(), w[0].want, w[0].reason),
        ("g", Exactly(-997), Reason::Restored)
    );
}

#[test]
fn a_container_needs_its_own_usage_read_only_when_its_pods_could_bound_it() {
    let total = 1000 * MI;
    // BestEffort (1000) is always bounded below 1000 unless first.
    assert!(may_need_bound(1000, Some(0), total));
    // Burstable at 900: bounded once the pod holds ≥ 10 % of the scope.
    assert!(!may_need_bound(900, Some(90 * MI), total));
    assert!(may_need_bound(900, Some(150 * MI), total));
    assert!(may_need_bound(900, None, total), "unknown pod usage");
    assert!(!may_need_bound(-997, Some(total), total));
    assert_eq!(bound(1000, 0, total), 999);
    assert_eq!(bound(0, 2 * total, total), -1000, "never below -1000");
}
