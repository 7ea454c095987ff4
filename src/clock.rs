//! Wall-clock times as criguard records them: milliseconds (or
//! nanoseconds) since the Unix epoch, 0 for a time before it.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// `t` in ms since the epoch.
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Now, in ms since the epoch.
pub fn now_ms() -> u64 {
    unix_ms(SystemTime::now())
}

/// Now, in ns since the epoch (the runtime's `created_at` unit).
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// A past monotonic instant `at` in ms since the epoch, for display (the
/// wall clock now, less the time elapsed since `at`).
pub fn instant_ms(at: Instant) -> u64 {
    unix_ms(SystemTime::now() - at.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn times_before_the_epoch_are_zero_and_instants_map_to_the_wall_clock() {
        assert_eq!(unix_ms(UNIX_EPOCH - Duration::from_secs(1)), 0);
        assert_eq!(unix_ms(UNIX_EPOCH + Duration::from_millis(1500)), 1500);
        let before = now_ms();
        let at = instant_ms(Instant::now());
        assert!(at >= before && at <= now_ms());
        assert!(now_ns() / 1_000_000 >= before as i64);
    }
}
