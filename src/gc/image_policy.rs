//! Image garbage collection, the kubelet's policy
//! (`pkg/kubelet/images/image_gc_manager.go`), as pure functions.
//!
//! An image is *used* while any container on the node (running or not) or
//! any sandbox refers to it; pinned images and the sandbox image are never
//! candidates. Unused images go least recently used first (ties: first
//! detected first), and only once they were first detected at least
//! `min_age` ago. With imagefs usage at or above the high threshold,
//! enough is freed to bring it down to the low threshold; with a maximum
//! age, unused images not used for longer than that go too.
//!
//! Two deliberate differences from the kubelet, both on the safe side:
//! an image never seen in use counts as used when first detected (the
//! kubelet's zero "last used" makes a freshly pulled image the first to
//! go by age), and the age rule honours `min_age` as well.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::config::image_gc::ImageGcPolicy;

/// What is known of one image at a collection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRecord {
    /// Image id (`sha256:…`).
    pub id: String,
    /// Repo tags, for logs.
    pub tags: Vec<String>,
    /// Size as the runtime reports it, bytes.
    pub size: u64,
    /// Used by a container or sandbox now.
    pub in_use: bool,
    /// Pinned by the runtime, or the sandbox image: never removed.
    pub pinned: bool,
    /// When criguard first saw it, ms since the epoch.
    pub first_detected_ms: i64,
    /// When it was last seen in use, ms since the epoch (None: never).
    pub last_used_ms: Option<i64>,
}

impl ImageRecord {
    /// Last use, counting an image never used as used when first detected.
    pub fn last_used_or_detected(&self) -> i64 {
        self.last_used_ms.unwrap_or(self.first_detected_ms)
    }

    /// A name for logs: its first tag, else its id.
    pub fn display_name(&self) -> &str {
        self.tags.first().map_or(self.id.as_str(), |t| t.as_str())
    }
}

/// Bytes to free so that usage drops to the low threshold, if usage is at
/// or above the high threshold (the kubelet's integer arithmetic).
pub fn bytes_to_free(policy: &ImageGcPolicy, capacity: u64, available: u64) -> Option<u64> {
    if capacity == 0 {
        return None;
    }
    let available = available.min(capacity);
    let usage_percent = 100 - (available as u128 * 100 / capacity as u128) as u64;
    if usage_percent < u64::from(policy.high_percent) {
        return None;
    }
    let target_available = capacity as u128 * u128::from(100 - policy.low_percent) / 100;
    Some((target_available as u64).saturating_sub(available))
}

/// Unused, unpinned images old enough to remove, in removal order: least
/// recently used first, ties broken by first detection, then id.
pub fn candidates(images: &[ImageRecord], now_ms: i64, min_age: Duration) -> Vec<&ImageRecord> {
    let mut out: Vec<&ImageRecord> = images
        .iter()
        .filter(|i| !i.in_use && !i.pinned)
        .filter(|i| now_ms.saturating_sub(i.first_detected_ms) >= min_age.as_millis() as i64)
        .collect();
    out.sort_by(|a, b| {
        (a.last_used_or_detected(), a.first_detected_ms, &a.id).cmp(&(
            b.last_used_or_detected(),
            b.first_detected_ms,
            &b.id,
        ))
    });
    out
}

/// Candidates unused for longer than `max_age` (all of them go).
pub fn too_old<'a>(
    images: &'a [ImageRecord],
    now_ms: i64,
    policy: &ImageGcPolicy,
) -> Vec<&'a ImageRecord> {
    let Some(max) = policy.max_age else {
        return Vec::new();
    };
    candidates(images, now_ms, policy.min_age)
        .into_iter()
        .filter(|i| now_ms.saturating_sub(i.last_used_or_detected()) > max.as_millis() as i64)
        .collect()
}

/// First-detected and last-used times of the images criguard has seen,
/// keyed by image id; persisted so that they survive a restart.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ImageTimes {
    /// Image id → times.
    pub images: BTreeMap<String, Times>,
}

/// The times of one image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Times {
    /// First detected, ms since the epoch.
    pub first_detected_ms: i64,
    /// Last seen in use, ms since the epoch.
    pub last_used_ms: Option<i64>,
}

/// One image as the runtime lists it, with what refers to it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// Image id.
    pub id: String,
    /// Repo tags.
    pub tags: Vec<String>,
    /// Size, bytes.
    pub size: u64,
    /// In use now.
    pub in_use: bool,
    /// Never to be removed.
    pub pinned: bool,
    /// The latest use criguard saw between collections (a container
    /// created through the proxy), ms since the epoch.
    pub seen_used_ms: Option<i64>,
}

impl ImageTimes {
    /// Updates the times from a listing made at `now_ms` (the kubelet's
    /// detectImages): new images are first detected now, images in use are
    /// used now, uses seen in between count, and images the runtime no
    /// longer lists are forgotten. Returns the records to decide on.
    pub fn detect(&mut self, listed: &[Listed], now_ms: i64) -> Vec<ImageRecord> {
        self.images
            .retain(|id, _| listed.iter().any(|l| &l.id == id));
        listed
            .iter()
            .map(|l| {
                let t = self.images.entry(l.id.clone()).or_insert(Times {
                    first_detected_ms: now_ms,
                    last_used_ms: None,
                });
                let used = if l.in_use { Some(now_ms) } else { None };
                t.last_used_ms = t.last_used_ms.max(l.seen_used_ms).max(used);
                ImageRecord {
                    id: l.id.clone(),
                    tags: l.tags.clone(),
                    size: l.size,
                    in_use: l.in_use,
                    pinned: l.pinned,
                    first_detected_ms: t.first_detected_ms,
                    last_used_ms: t.last_used_ms,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;

    fn img(id: &str, first: i64, last: Option<i64>) -> ImageRecord {
        ImageRecord {
            id: id.into(),
            tags: vec![format!("{id}:latest")],
            size: 10,
            in_use: false,
            pinned: false,
            first_detected_ms: first,
            last_used_ms: last,
        }
    }

    fn ids(v: &[&ImageRecord]) -> Vec<String> {
        v.iter().map(|i| i.id.clone()).collect()
    }

    #[test]
    fn frees_down_to_the_low_threshold_from_the_high_one() {
        let p = ImageGcPolicy::default();
        // 84 % used: below the high threshold, nothing to do.
        assert_eq!(bytes_to_free(&p, 1000, 160), None);
        // 85 % used: free until 20 % is available.
        assert_eq!(bytes_to_free(&p, 1000, 150), Some(50));
        // Full.
        assert_eq!(bytes_to_free(&p, 1000, 0), Some(200));
        // available > capacity is clamped, an empty filesystem is ignored.
        assert_eq!(bytes_to_free(&p, 1000, 5000), None);
        assert_eq!(bytes_to_free(&p, 0, 0), None);
        // The kubelet's integer arithmetic: 15.9 % available is 15 %, so
        // 84.1 % used counts as 85 %.
        assert_eq!(bytes_to_free(&p, 1000, 159), Some(41));
    }

    #[test]
    fn least_recently_used_first_then_first_detected() {
        let now = 100 * MIN;
        let images = [
            img("used-late", 0, Some(50 * MIN)),
            img("used-early", 0, Some(10 * MIN)),
            img("never-used-old", 5 * MIN, None),
            img("never-used-older", MIN, None),
            img("tie-b", 2 * MIN, Some(30 * MIN)),
            img("tie-a", 3 * MIN, Some(30 * MIN)),
        ];
        let got = ids(&candidates(&images, now, Duration::from_secs(120)));
        assert_eq!(
            got,
            [
                "never-used-older",
                "never-used-old",
                "used-early",
                "tie-b",
                "tie-a",
                "used-late"
            ]
        );
    }

    #[test]
    fn in_use_pinned_and_young_images_are_never_candidates() {
        let now = 10 * MIN;
        let mut in_use = img("in-use", 0, Some(now));
        in_use.in_use = true;
        let mut pinned = img("pause", 0, None);
        pinned.pinned = true;
        let young = img("young", now - MIN, None);
        let old_enough = img("old-enough", now - 2 * MIN, None);
        let images = [in_use, pinned, young, old_enough];
        let got = ids(&candidates(&images, now, Duration::from_secs(120)));
        assert_eq!(got, ["old-enough"]);
    }

    #[test]
    fn maximum_age_takes_only_images_unused_for_longer() {
        let now = 100 * MIN;
        let p = ImageGcPolicy {
            max_age: Some(Duration::from_secs(30 * 60)),
            ..Default::default()
        };
        let images = [
            img("stale", 0, Some(60 * MIN)),
            img("fresh", 0, Some(80 * MIN)),
            img("never-used-long-ago", 10 * MIN, None),
            img("never-used-recently", 90 * MIN, None),
        ];
        assert_eq!(
            ids(&too_old(&images, now, &p)),
            ["never-used-long-ago", "stale"]
        );
        let off = ImageGcPolicy::default();
        assert!(too_old(&images, now, &off).is_empty());
    }

    fn listed(id: &str, in_use: bool, seen: Option<i64>) -> Listed {
        Listed {
            id: id.into(),
            tags: vec![],
            size: 1,
            in_use,
            pinned: false,
            seen_used_ms: seen,
        }
    }

    #[test]
    fn detection_keeps_first_seen_and_latest_use_and_forgets_removed_images() {
        let mut t = ImageTimes::default();
        let r = t.detect(&[listed("a", false, None), listed("b", true, None)], 1000);
        assert_eq!(r[0].first_detected_ms, 1000);
        assert_eq!(r[0].last_used_ms, None);
        assert_eq!(r[1].last_used_ms, Some(1000));
        // Later: b no longer used keeps its last use; a was used in between.
        let r = t.detect(
            &[listed("a", false, Some(1500)), listed("b", false, None)],
            2000,
        );
        assert_eq!(
            (r[0].first_detected_ms, r[0].last_used_ms),
            (1000, Some(1500))
        );
        assert_eq!(
            (r[1].first_detected_ms, r[1].last_used_ms),
            (1000, Some(1000))
        );
        // An older sighting never moves a last use back.
        let r = t.detect(&[listed("a", false, Some(1200))], 3000);
        assert_eq!(r[0].last_used_ms, Some(1500));
        assert!(!t.images.contains_key("b"), "b is gone from the runtime");
        // The times survive a round trip through their persisted form.
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<ImageTimes>(&json).unwrap(), t);
    }
}
