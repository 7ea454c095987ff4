//! Image garbage collection settings, by KubeletConfiguration's names:
//! `imageGCHighThresholdPercent` (default 85), `imageGCLowThresholdPercent`
//! (80), `imageMinimumGCAge` (2m) and `imageMaximumGCAge` (0: off). The
//! kubelet's flags `--image-gc-high-threshold`, `--image-gc-low-threshold`
//! and `--minimum-image-ttl-duration` override the file; so does
//! `--image-maximum-gc-age`, which the kubelet has only as a config key.

use std::time::Duration;

use super::{ConfigError, duration};

/// The kubelet's image GC settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageGcPolicy {
    /// `imageGCHighThresholdPercent`: imagefs usage (%) that starts a collection.
    pub high_percent: u8,
    /// `imageGCLowThresholdPercent`: the usage (%) a collection brings it down to.
    pub low_percent: u8,
    /// `imageMinimumGCAge`: an image younger than this (since first detected) stays.
    pub min_age: Duration,
    /// `imageMaximumGCAge`: unused longer than this, an image goes (None: off).
    pub max_age: Option<Duration>,
}

impl Default for ImageGcPolicy {
    fn default() -> Self {
        Self {
            high_percent: 85,
            low_percent: 80,
            min_age: Duration::from_secs(120),
            max_age: None,
        }
    }
}

/// Image GC settings as written, before validation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RawImageGc {
    /// `imageGCHighThresholdPercent`.
    pub high_percent: Option<i64>,
    /// `imageGCLowThresholdPercent`.
    pub low_percent: Option<i64>,
    /// `imageMinimumGCAge`.
    pub min_age: Option<String>,
    /// `imageMaximumGCAge`.
    pub max_age: Option<String>,
}

impl RawImageGc {
    /// Overrides this (file) configuration with `flags`, key by key.
    pub fn merge(self, flags: RawImageGc) -> RawImageGc {
        RawImageGc {
            high_percent: flags.high_percent.or(self.high_percent),
            low_percent: flags.low_percent.or(self.low_percent),
            min_age: flags.min_age.or(self.min_age),
            max_age: flags.max_age.or(self.max_age),
        }
    }

    /// Validates into the policy, with the kubelet's rules and defaults.
    pub fn validate(&self) -> Result<ImageGcPolicy, ConfigError> {
        let d = ImageGcPolicy::default();
        let percent = |key: &str, v: Option<i64>, default: u8| match v {
            None => Ok(default),
            Some(p) if (0..=100).contains(&p) => Ok(p as u8),
            Some(p) => Err(ConfigError::new(
                key,
                p.to_string(),
                "must be a percentage between 0 and 100",
            )),
        };
        let high = percent(
            "imageGCHighThresholdPercent",
            self.high_percent,
            d.high_percent,
        )?;
        let low = percent(
            "imageGCLowThresholdPercent",
            self.low_percent,
            d.low_percent,
        )?;
        if low >= high {
            return Err(ConfigError::new(
                "imageGCLowThresholdPercent",
                low.to_string(),
                format!("must be lower than imageGCHighThresholdPercent ({high})"),
            ));
        }
        let min_age = match &self.min_age {
            Some(v) => duration("imageMinimumGCAge", v)?,
            None => d.min_age,
        };
        let max_age = match &self.max_age {
            Some(v) => Some(duration("imageMaximumGCAge", v)?).filter(|m| !m.is_zero()),
            None => None,
        };
        if let Some(max) = max_age
            && max <= min_age
        {
            return Err(ConfigError::new(
                "imageMaximumGCAge",
                self.max_age.clone().unwrap_or_default(),
                format!(
                    "must be longer than imageMinimumGCAge ({})",
                    crate::quantity::format_duration(min_age)
                ),
            ));
        }
        Ok(ImageGcPolicy {
            high_percent: high,
            low_percent: low,
            min_age,
            max_age,
        })
    }
}

/// The effective image GC settings, one line each, in the kubelet's names.
pub fn describe(p: &ImageGcPolicy) -> String {
    let f = crate::quantity::format_duration;
    format!(
        "imageGCHighThresholdPercent: {}\nimageGCLowThresholdPercent: {}\nimageMinimumGCAge: {}\nimageMaximumGCAge: {}\n",
        p.high_percent,
        p.low_percent,
        f(p.min_age),
        p.max_age.map_or("0 (off)".to_owned(), f)
    )
}

/// The default collection period (the kubelet's is 5 minutes).
pub const DEFAULT_PERIOD: Duration = Duration::from_secs(300);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_given_means_the_kubelets_defaults() {
        let p = RawImageGc::default().validate().unwrap();
        assert_eq!(p, ImageGcPolicy::default());
        assert_eq!((p.high_percent, p.low_percent), (85, 80));
        assert_eq!(p.min_age, Duration::from_secs(120));
        assert_eq!(p.max_age, None);
    }

    #[test]
    fn every_bad_value_is_named() {
        let cases = [
            (
                RawImageGc {
                    high_percent: Some(101),
                    ..Default::default()
                },
                "imageGCHighThresholdPercent",
                "101",
            ),
            (
                RawImageGc {
                    low_percent: Some(-1),
                    ..Default::default()
                },
                "imageGCLowThresholdPercent",
                "-1",
            ),
            (
                RawImageGc {
                    high_percent: Some(70),
                    ..Default::default()
                },
                "imageGCLowThresholdPercent",
                "80",
            ),
            (
                RawImageGc {
                    min_age: Some("-2m".into()),
                    ..Default::default()
                },
                "imageMinimumGCAge",
                "-2m",
            ),
            (
                RawImageGc {
                    max_age: Some("1m".into()),
                    ..Default::default()
                },
                "imageMaximumGCAge",
                "1m",
            ),
        ];
        for (raw, key, value) in cases {
            let e = raw.validate().unwrap_err();
            assert_eq!((e.key.as_str(), e.value.as_str()), (key, value), "{e}");
        }
    }

    #[test]
    fn flags_override_the_file_key_by_key() {
        let file = RawImageGc {
            high_percent: Some(90),
            low_percent: Some(50),
            max_age: Some("1h".into()),
            ..Default::default()
        };
        let flags = RawImageGc {
            high_percent: Some(95),
            ..Default::default()
        };
        let p = file.merge(flags).validate().unwrap();
        assert_eq!((p.high_percent, p.low_percent), (95, 50));
        assert_eq!(p.max_age, Some(Duration::from_secs(3600)));
        // A zero maximum age is off, as for the kubelet.
        let off = RawImageGc {
            max_age: Some("0s".into()),
            ..Default::default()
        };
        assert_eq!(off.validate().unwrap().max_age, None);
    }
}
