//! What the relay may hold in memory across all its connections, and the
//! relay's own metrics and how often its complaints are logged.
//!
//! criguard holds bytes for inspection in two places: the request bodies
//! of observed calls (until their END_STREAM, see [`super::held`]) and
//! header blocks (until their END_HEADERS, for the shadow HPACK decoder).
//! Each is bounded per connection; together they are bounded by one
//! process-wide [`Budget`] ([`DEFAULT_HOLD_BUDGET`]):
//!
//! - a body that does not fit is relayed unheld, as it arrives, without
//!   being inspected: a call that the runtime alone would take is never
//!   failed or delayed for criguard's memory (the kubelet's own
//!   admission and eviction stay the backstop for that call);
//! - a header block growing past [`SMALL_BLOCK`] reserves the largest
//!   block the runtime takes (16 MiB); while that does not fit, criguard
//!   stops reading that client (a header block cannot pass uninspected:
//!   the HPACK state would be lost). A kubelet's header blocks are a few
//!   hundred bytes and never wait.
//!
//! An observed request stays charged after it has left for the runtime
//! while criguard keeps it for the answer ([`Charge`]): what is charged is
//! what is resident, so a runtime slow to answer cannot let more bodies
//! in than the budget holds (16 concurrent 15 MiB CreateContainer calls
//! to a loaded containerd took criguard 154 MiB above its base when the
//! charge ended with the send).
//!
//! When the bytes held drop back to nothing after more than
//! [`TRIM_ABOVE`] were held, the allocator is asked to return its free
//! memory to the system (`malloc_trim`), so that the peak does not stay
//! in criguard's RSS.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Bytes held for inspection across all connections by default.
pub const DEFAULT_HOLD_BUDGET: usize = 64 << 20;
/// Bytes of a header block any connection may hold outside the budget.
pub const SMALL_BLOCK: usize = 64 << 10;
/// A peak of held bytes above which the allocator is trimmed once they
/// are all given back.
pub const TRIM_ABOVE: usize = 4 << 20;

/// A process-wide allowance of bytes held for inspection.
#[derive(Debug)]
pub struct Budget {
    limit: usize,
    used: AtomicUsize,
    /// The most held since the allocator was last trimmed.
    peak: AtomicUsize,
}

impl Budget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            used: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `n` bytes if they fit; false (and nothing taken) otherwise.
    pub fn try_take(&self, n: usize) -> bool {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let Some(next) = cur.checked_add(n).filter(|&v| v <= self.limit) else {
                return false;
            };
            match self
                .used
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::Relaxed);
                    HELD_BYTES.set(next as i64);
                    return true;
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Whether `n` more bytes would fit now.
    pub fn fits(&self, n: usize) -> bool {
        self.used().checked_add(n).is_some_and(|v| v <= self.limit)
    }

    /// Takes `n` bytes even past the limit (they are given back at once by
    /// a caller that found they did not fit).
    pub fn take_anyway(&self, n: usize) {
        let now = self.used.fetch_add(n, Ordering::AcqRel) + n;
        HELD_BYTES.set(now as i64);
    }

    /// Gives back `n` bytes taken before.
    pub fn give(&self, n: usize) {
        if n == 0 {
            return;
        }
        let before = self.used.fetch_sub(n, Ordering::AcqRel);
        let now = before.saturating_sub(n);
        HELD_BYTES.set(now as i64);
        if now == 0 && self.peak.swap(0, Ordering::Relaxed) > TRIM_ABOVE {
            trim();
        }
    }
}

/// Bytes taken from a [`Budget`] for something kept in memory, given back
/// when the charge is dropped with it.
#[derive(Debug)]
pub struct Charge {
    budget: Arc<Budget>,
    n: usize,
}

impl Charge {
    /// Holds `n` bytes already taken from `budget`.
    pub fn new(budget: Arc<Budget>, n: usize) -> Self {
        Self { budget, n }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.give(self.n);
    }
}

impl Default for Budget {
    fn default() -> Self {
        Self::new(DEFAULT_HOLD_BUDGET)
    }
}

/// Returns the allocator's free memory to the system (glibc keeps freed
/// chunks of every thread's arena otherwise).
fn trim() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Makes large buffers (over 256 KiB) come from mmap, always: glibc's
/// default threshold grows with each large buffer freed, after which they
/// come from an arena and stay in RSS once freed. Called once when the
/// relay starts.
pub fn tune_allocator() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes the allocator's parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
    }
}

/// Why a client connection was refused.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    /// `limit` (the relay connection cap) or `fds` (out of descriptors).
    pub reason: &'static str,
}

/// Relayed connections open now (those answered unavailable included).
pub static CONNECTIONS: LazyLock<Gauge> = LazyLock::new(Gauge::default);
/// Client connections refused, by reason.
pub static REFUSED: LazyLock<Family<RefusedLabels, Counter>> = LazyLock::new(Family::default);
/// Bytes held for inspection now.
pub static HELD_BYTES: LazyLock<Gauge> = LazyLock::new(Gauge::default);
/// Observed request bodies relayed unheld because the budget was spent.
pub static UNHELD_BODIES: LazyLock<Counter> = LazyLock::new(Counter::default);
/// Header blocks over the runtime's header list size, refused.
pub static BLOCKS_REFUSED: LazyLock<Counter> = LazyLock::new(Counter::default);

/// Registers the relay's bound metrics in `registry`.
pub fn register(registry: &mut Registry) {
    registry.register(
        "criguard_cri_connections",
        "Kubelet connections criguard relays or serves now",
        CONNECTIONS.clone(),
    );
    registry.register(
        "criguard_cri_connections_refused",
        "Client connections criguard refused: at its connection limit (limit) or out of file descriptors (fds)",
        REFUSED.clone(),
    );
    registry.register(
        "criguard_cri_held_bytes",
        "Bytes of request bodies and header blocks criguard holds for inspection",
        HELD_BYTES.clone(),
    );
    registry.register(
        "criguard_cri_unheld_bodies",
        "Observed request bodies relayed uninspected because the hold budget was spent",
        UNHELD_BODIES.clone(),
    );
    registry.register(
        "criguard_cri_header_blocks_refused",
        "Header blocks larger than the runtime's header list size; their connection was ended",
        BLOCKS_REFUSED.clone(),
    );
}

/// How often a repeated complaint of the relay is logged.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// A repeated complaint of the relay: one line per [`LOG_EVERY`], saying
/// how many were not logged (usable in a `static`).
pub const fn complaint() -> crate::lograte::LogRate {
    crate::lograte::LogRate::new(1, LOG_EVERY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_what_fits_and_nothing_of_what_does_not() {
        let b = Budget::new(100);
        assert!(b.try_take(60));
        assert!(!b.try_take(41), "61 + 41 > 100");
        assert_eq!(b.used(), 60);
        assert!(b.try_take(40));
        assert!(!b.try_take(1));
        b.give(100);
        assert_eq!(b.used(), 0);
        assert!(b.try_take(100));
        assert!(!b.try_take(usize::MAX), "no overflow");
    }

    #[test]
    fn a_charge_is_given_back_when_dropped() {
        let b = Arc::new(Budget::new(100));
        assert!(b.try_take(70));
        let charge = Charge::new(b.clone(), 70);
        assert!(!b.fits(31), "the charged bytes still count");
        drop(charge);
        assert_eq!(b.used(), 0);
    }
}
