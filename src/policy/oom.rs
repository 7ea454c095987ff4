//! Dynamic `oom_score_adj`: make the kernel's OOM victim criguard's first.
//!
//! The kernel kills the task with the highest badness,
//! `rss + swap + page tables + oom_score_adj · T / 1000`, where `T` is the
//! memory of the OOM's scope (the memcg limit, or all RAM and swap). With
//! the kubelet's static scores a big Burstable pod can outscore a small
//! BestEffort one although the kubelet's ranking would evict by priority
//! first (seed: guaranteed-pod-eviction-article.md). criguard closes the gap
//! with a bound that holds whatever the tasks' exact sizes:
//!
//! - every container of the first-ranked pod gets 1000, so its largest task
//!   scores at least `T`;
//! - every other container whose score could reach `T` is lowered to
//!   `999 − ⌈1000 · usage / T⌉`, so its tasks score at most `0.999 · T`
//!   (`usage`, the container's working set, bounds each task's rss).
//!
//! Containers already below their bound keep the kubelet's value; scores are
//! never raised except for the first victim. Using the smallest scope for
//! `T` (the pods' memcg limit) makes the bound hold in larger scopes too.

use std::collections::HashMap;

/// What the OOM ordering needs to know of a container.
#[derive(Clone, Debug, PartialEq)]
pub struct ContainerMemory {
    /// Container id.
    pub id: String,
    /// Its pod's sandbox id.
    pub sandbox_id: String,
    /// The kubelet's static `oom_score_adj` for it.
    pub kubelet_adj: i64,
    /// Working set, bytes.
    pub usage: i64,
}

/// Target scores for containers whose score should differ from the
/// kubelet's, given the first victim's sandbox and the OOM scope `total` in
/// bytes. With no first victim (nothing ranks: every pod critical, or no
/// pod running) nothing needs bounding, so the map is empty and every
/// score goes back to the kubelet's.
pub fn dynamic_scores(
    first_victim: Option<&str>,
    containers: &[ContainerMemory],
    total: i64,
) -> HashMap<String, i64> {
    let Some(first_victim) = first_victim else {
        return HashMap::new();
    };
    let total = total.max(1);
    containers
        .iter()
        .filter_map(|c| {
            let target = if c.sandbox_id == first_victim {
                1000
            } else {
                let share = (1000 * c.usage.max(0) as u128).div_ceil(total as u128) as i64;
                c.kubelet_adj.min(999 - share)
            };
            (target != c.kubelet_adj).then(|| (c.id.clone(), target.max(-1000)))
        })
        .collect()
}

/// The kernel's badness of a task, in bytes, for tests and explanations.
pub fn badness(rss: i64, adj: i64, total: i64) -> i64 {
    rss + adj * total / 1000
}

#[cfg(test)]
mod tests {
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
        // so it keeps the kubelet's 1000 (it used to be lowered to 998).
        let cs = [c("static-be", 1000, 3 * MI), c("guaranteed", -997, MI)];
        assert_eq!(dynamic_scores(None, &cs, 256 * MI), HashMap::new());
        // The same container with a victim elsewhere is bounded.
        let t = dynamic_scores(Some("sb-guaranteed"), &cs, 256 * MI);
        assert_eq!(t.get("static-be"), Some(&(999 - 12)));
    }
}
