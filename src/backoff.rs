//! Waits between retries: from a first wait, doubling, capped, started
//! over after a success. The one back-off for every retry loop (runtime
//! events, API writes, failing accepts).

use std::time::Duration;

/// Doubling waits between `min` and `max`, counting the attempts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
    attempts: u32,
}

impl Backoff {
    /// Waits from `min` doubling to `max`.
    pub const fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max,
            next: min,
            attempts: 0,
        }
    }

    /// The wait before the next attempt (one more counted).
    pub fn next_wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(self.max);
        self.attempts = self.attempts.saturating_add(1);
        wait
    }

    /// The wait after an attempt ended; `healthy` (it succeeded, or lived
    /// long) starts the doubling over first.
    pub fn after(&mut self, healthy: bool) -> Duration {
        if healthy {
            self.reset();
        }
        self.next_wait()
    }

    /// Starts over from the first wait, no attempt counted.
    pub fn reset(&mut self) {
        self.next = self.min;
        self.attempts = 0;
    }

    /// Waits handed out since the start or the last reset.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Whether any wait was handed out since the start or the last reset.
    pub fn failing(&self) -> bool {
        self.attempts > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn waits_double_up_to_the_cap_and_count() {
        let mut b = Backoff::new(100 * MS, 2000 * MS);
        let waits: Vec<u64> = (0..8).map(|_| b.next_wait().as_millis() as u64).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 2000, 2000, 2000]);
        assert_eq!(b.attempts(), 8);
    }

    #[test]
    fn health_or_a_reset_starts_the_waits_over() {
        let mut b = Backoff::new(100 * MS, 2000 * MS);
        for _ in 0..5 {
            b.after(false);
        }
        assert_eq!(b.after(true), 100 * MS);
        assert_eq!(b.after(false), 200 * MS);
        b.reset();
        assert!(!b.failing());
        assert_eq!(b.next_wait(), 100 * MS);
        assert!(b.failing());
    }
}
