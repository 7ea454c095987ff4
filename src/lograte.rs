//! Rate limiting of log lines that a flood can repeat.
//!
//! A client can make criguard repeat one line as fast as it sends requests
//! (a RunPodSandbox refused for an evicted pod, 530 bytes each: 500 000
//! lines, 268 MB of journal in 13 s). Each such call site logs through
//! [`log_limited!`](crate::log_limited): the first `burst` lines of each
//! `period` are logged as they come; past that they are counted, and the
//! next line logged (the first of a later period) is preceded by one line
//! saying how many were suppressed. A flood therefore costs at most
//! `burst + 1` lines a period, and no count is lost.
//!
//! Each call site has its own limit (a `static` in the macro's expansion),
//! so a flood of one line never hides another.

use crate::lock::Locked;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One call site's window: when the period began, lines logged in it and
/// lines suppressed since the last one logged.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    start: Option<Instant>,
    logged: u32,
    suppressed: u64,
}

/// What to do with one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Log it, after a summary of `suppressed` lines when that is not 0.
    Log {
        /// Lines suppressed since the last one logged.
        suppressed: u64,
        /// How long ago the period in which they were suppressed began.
        over: Duration,
    },
    /// Count it, do not log it.
    Suppress,
}

impl Window {
    /// The verdict for a line at `now`, at most `burst` lines logged per
    /// `period`; updates the window.
    pub fn admit(&mut self, now: Instant, burst: u32, period: Duration) -> Verdict {
        let start = *self.start.get_or_insert(now);
        let over = now.saturating_duration_since(start);
        if over >= period {
            self.start = Some(now);
            self.logged = 0;
        }
        if self.logged < burst {
            self.logged += 1;
            let suppressed = std::mem::take(&mut self.suppressed);
            Verdict::Log { suppressed, over }
        } else {
            self.suppressed += 1;
            Verdict::Suppress
        }
    }
}

/// A call site's limit: at most `burst` lines a `period`.
#[derive(Debug)]
pub struct LogRate {
    burst: u32,
    period: Duration,
    window: Mutex<Window>,
}

impl LogRate {
    /// A limit of `burst` lines a `period` (usable in a `static`).
    pub const fn new(burst: u32, period: Duration) -> Self {
        Self {
            burst,
            period,
            window: Mutex::new(Window {
                start: None,
                logged: 0,
                suppressed: 0,
            }),
        }
    }

    /// The verdict for a line now.
    pub fn admit(&self) -> Verdict {
        self.admit_at(Instant::now())
    }

    /// The verdict for a line at `now`.
    pub fn admit_at(&self, now: Instant) -> Verdict {
        let mut w = self.window.locked();
        w.admit(now, self.burst, self.period)
    }

    /// `Some(suppressed)` when a line may be logged at `now` (`suppressed`
    /// lines were not logged since the last one), `None` otherwise: for
    /// call sites that put the count in their own line.
    pub fn allow(&self, now: Instant) -> Option<u64> {
        match self.admit_at(now) {
            Verdict::Log { suppressed, .. } => Some(suppressed),
            Verdict::Suppress => None,
        }
    }
}

/// Lines a limited call site logs per period unless it says otherwise.
pub const BURST: u32 = 10;
/// The period of a limited call site unless it says otherwise.
pub const PERIOD: Duration = Duration::from_secs(10);

/// Logs like `tracing::$level!(...)`, at most [`BURST`] lines every
/// [`PERIOD`] from this call site (or `burst = N, period = DURATION,`
/// first); past that lines are counted, and the next line logged is
/// preceded by `"N similar lines suppressed"` with the count.
///
/// ```
/// criguard::log_limited!(info, "RunPodSandbox refused");
/// criguard::log_limited!(warn, burst = 1, period = std::time::Duration::from_secs(60), "still failing");
/// ```
#[macro_export]
macro_rules! log_limited {
    ($level:ident, burst = $burst:expr, period = $period:expr, $($arg:tt)+) => {{
        static LIMIT: $crate::lograte::LogRate = $crate::lograte::LogRate::new($burst, $period);
        if let $crate::lograte::Verdict::Log { suppressed, over } = LIMIT.admit() {
            if suppressed > 0 {
                ::tracing::$level!(
                    suppressed,
                    over_s = over.as_secs(),
                    "{suppressed} similar lines suppressed (at most {} every {:?} from one place); the next is one of them",
                    $burst,
                    $period
                );
            }
            ::tracing::$level!($($arg)+);
        }
    }};
    ($level:ident, $($arg:tt)+) => {
        $crate::log_limited!(
            $level,
            burst = $crate::lograte::BURST,
            period = $crate::lograte::PERIOD,
            $($arg)+
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_logs_the_burst_then_one_summary_a_period() {
        let t0 = Instant::now();
        let period = Duration::from_secs(10);
        let mut w = Window::default();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        for i in 0..3 {
            assert_eq!(
                w.admit(at(i), 3, period),
                Verdict::Log {
                    suppressed: 0,
                    over: Duration::from_millis(i)
                }
            );
        }
        for i in 3..1000 {
            assert_eq!(w.admit(at(i), 3, period), Verdict::Suppress);
        }
        // The next period: the count of the suppressed lines comes first.
        assert_eq!(
            w.admit(at(10_000), 3, period),
            Verdict::Log {
                suppressed: 997,
                over: period
            }
        );
        assert_eq!(
            w.admit(at(10_001), 3, period),
            Verdict::Log {
                suppressed: 0,
                over: Duration::from_millis(1)
            }
        );
    }

    #[test]
    fn lines_within_the_burst_are_never_suppressed() {
        let t0 = Instant::now();
        let mut w = Window::default();
        for s in 0..100 {
            // One line every 4 s against 3 every 10 s: always logged.
            let v = w.admit(t0 + Duration::from_secs(4 * s), 3, Duration::from_secs(10));
            assert!(matches!(v, Verdict::Log { suppressed: 0, .. }), "{v:?}");
        }
    }

    #[test]
    fn one_line_a_period_logs_once_per_period_and_counts_the_rest() {
        let t = LogRate::new(1, Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(t.allow(t0), Some(0));
        assert_eq!(t.allow(t0 + Duration::from_secs(1)), None);
        assert_eq!(t.allow(t0 + Duration::from_secs(9)), None);
        assert_eq!(t.allow(t0 + Duration::from_secs(10)), Some(2));
        assert_eq!(t.allow(t0 + Duration::from_secs(11)), None);
    }

    #[test]
    fn the_macro_limits_each_call_site() {
        let limit = LogRate::new(2, Duration::from_secs(3600));
        let logged = (0..50)
            .filter(|_| matches!(limit.admit(), Verdict::Log { .. }))
            .count();
        assert_eq!(logged, 2);
        for _ in 0..50 {
            crate::log_limited!(
                info,
                burst = 2,
                period = Duration::from_secs(3600),
                n = 1,
                "x"
            );
        }
    }
}
