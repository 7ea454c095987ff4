//! Kernel OOM kills: telling them apart from OOM notifications, and
//! matching them against criguard's memory ranking at the time.
//!
//! A memory cgroup's `oom_kill` counter (cgroup v1 `memory.oom_control`, v2
//! `memory.events`) counts the processes the kernel's OOM killer took from
//! it. containerd's `/tasks/oom` only says a task's cgroup was notified (on
//! cgroup v1 every cgroup below the one that ran out is), so the counter is
//! the evidence and the event the moment to look. Whether the dynamic
//! `oom_score_adj` rule worked is then one comparison: was the killed
//! container's pod the one criguard ranked first ([`RankHistory`]) just
//! before the kill?

use std::collections::VecDeque;

/// New kills in a cgroup whose counter was last seen at `last` (`None`:
/// never read, so counted from 0 as for a container created since) and
/// reads `now`. A counter that went down belongs to a new cgroup of the
/// same name: all of `now` is new.
pub fn new_kills(last: Option<u64>, now: u64) -> u64 {
    match last {
        Some(l) if l <= now => now - l,
        _ => now,
    }
}

/// Kills to record on cgroup v2 when neither a gone task's counter nor its
/// pod's can be read: one for the task's own `/tasks/oom` (containerd
/// publishes it on v2 only after the task's `oom_kill` counter rose,
/// `pkg/oom/v2`), none for a mere SIGKILL exit. (On v1 every cgroup below
/// the one that ran out is notified, so a notification is no evidence and
/// this is not asked.)
pub fn kills_from_notification(notification: bool) -> u64 {
    u64::from(notification)
}

/// The pod criguard ranked first for memory, round by round (oldest first),
/// with the wall-clock time of each round in ms since the epoch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RankHistory {
    rounds: VecDeque<(u64, Option<String>)>,
}

impl RankHistory {
    /// How many rounds are kept: at a round a second, the last 16 s.
    pub const KEEP: usize = 16;

    /// Records a round at `at_unix_ms` whose first-ranked pod (sandbox id)
    /// was `first` (`None`: no pod ranked).
    pub fn record(&mut self, at_unix_ms: u64, first: Option<String>) {
        if self.rounds.len() == Self::KEEP {
            self.rounds.pop_front();
        }
        self.rounds.push_back((at_unix_ms, first));
    }

    /// The pod ranked first by the latest round at or before `at_unix_ms`;
    /// `None` when no round was that early or it ranked no pod.
    pub fn first_at(&self, at_unix_ms: u64) -> Option<&str> {
        self.rounds
            .iter()
            .rev()
            .find(|(t, _)| *t <= at_unix_ms)
            .and_then(|(_, first)| first.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kills_are_the_counters_increase_and_a_fresh_counter_counts_whole() {
        assert_eq!(new_kills(Some(2), 3), 1);
        assert_eq!(new_kills(Some(3), 3), 0);
        assert_eq!(new_kills(None, 1), 1, "a container new since the baseline");
        assert_eq!(new_kills(Some(5), 1), 1, "a new cgroup under the same name");
    }

    #[test]
    fn a_v2_notification_alone_is_a_kill_and_a_sigkill_alone_is_not() {
        assert_eq!(kills_from_notification(true), 1);
        assert_eq!(kills_from_notification(false), 0);
    }

    #[test]
    fn the_rank_at_a_kill_is_the_latest_round_before_it() {
        let mut h = RankHistory::default();
        assert_eq!(h.first_at(1_000), None, "no round yet");
        h.record(1_000, Some("x".into()));
        h.record(2_000, Some("y".into()));
        h.record(3_000, None);
        assert_eq!(h.first_at(999), None);
        assert_eq!(h.first_at(1_000), Some("x"));
        assert_eq!(h.first_at(2_999), Some("y"));
        assert_eq!(h.first_at(3_500), None, "the last round ranked nobody");
    }

    #[test]
    fn only_the_last_rounds_are_kept() {
        let mut h = RankHistory::default();
        for t in 0..40u64 {
            h.record(t, Some(format!("p{t}")));
        }
        assert_eq!(h.rounds.len(), RankHistory::KEEP);
        assert_eq!(h.first_at(39), Some("p39"));
        assert_eq!(h.first_at(10), None, "older than what is kept");
    }
}
