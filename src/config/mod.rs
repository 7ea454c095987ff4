//! criguard's eviction configuration, in the kubelet's own words.
//!
//! Two sources, as for the kubelet: a TOML file whose keys are
//! KubeletConfiguration's (`evictionHard`, `evictionSoft`, …; see [`mod@file`])
//! and kubelet-style flags (`--eviction-hard=memory.available<100Mi,…`; see
//! [`flags`]). Flags override the file key by key. Both are parsed into one
//! [`RawEviction`] and validated once by [`RawEviction::validate`] into an
//! [`EvictionConfig`]; every error names the key, the value and the rule.
//!
//! Defaults follow the kubelet on Linux: with no `evictionHard` at all, the
//! hard thresholds are `memory.available<100Mi`, `nodefs.available<10%`,
//! `nodefs.inodesFree<5%`, `imagefs.available<15%`. As with the kubelet,
//! giving `evictionHard` replaces that whole set (signals left out have no
//! hard threshold); the transition period defaults to 5m and housekeeping
//! to 10s. An empty `evictionHard` is refused, since it would turn every hard
//! threshold off unnoticed: `none` (`--eviction-hard=none`,
//! `evictionHard = "none"`) says so explicitly.

pub mod file;
pub mod flags;
pub mod image_gc;
pub mod kube;
pub mod metrics;

use std::collections::BTreeMap;
use std::time::Duration;

use crate::quantity::{self, QuantityError};
use crate::signals::table::Signal;

/// A threshold amount: absolute, or a percentage of the signal's capacity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Amount {
    /// Bytes, inodes or pids.
    Quantity(u64),
    /// Percent of capacity, in (0, 100].
    Percentage(f64),
}

impl Amount {
    /// The amount in units, given the signal's capacity.
    pub fn resolve(self, capacity: u64) -> u64 {
        match self {
            Amount::Quantity(q) => q,
            Amount::Percentage(p) => (capacity as f64 * p / 100.0).round() as u64,
        }
    }

    fn show(self, bytes: bool) -> String {
        match self {
            Amount::Quantity(q) if bytes => quantity::format_bytes(q),
            Amount::Quantity(q) => q.to_string(),
            Amount::Percentage(p) => format!("{p}%"),
        }
    }
}

/// One threshold: act when the signal's available amount is below `amount`.
#[derive(Clone, Debug, PartialEq)]
pub struct Threshold {
    /// The signal.
    pub signal: Signal,
    /// Below this the threshold is met.
    pub amount: Amount,
    /// Soft thresholds: how long it must stay met before criguard acts.
    pub grace_period: Option<Duration>,
    /// Reclaim this much beyond the threshold once acting.
    pub min_reclaim: Option<Amount>,
}

impl Threshold {
    /// A hard threshold: no grace period, no minimum reclaim.
    pub fn hard(signal: Signal, amount: Amount) -> Self {
        Self {
            signal,
            amount,
            grace_period: None,
            min_reclaim: None,
        }
    }

    /// The amount as configured (`100Mi`, `10%`).
    pub fn amount_display(&self) -> String {
        match (self.signal.is_stall(), self.amount) {
            // Kept as the share not stalled: shown as the share stalled.
            (true, Amount::Percentage(p)) => {
                format!("{}%", ((100.0 - p) * 1000.0).round() / 1000.0)
            }
            _ => self.amount.show(self.signal.is_bytes()),
        }
    }

    /// `<` for every signal but the stall signals, met above their line.
    pub fn operator(&self) -> char {
        if self.signal.is_stall() { '>' } else { '<' }
    }
}

impl std::fmt::Display for Threshold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}{}{}",
            self.signal,
            self.operator(),
            self.amount_display()
        )?;
        if let Some(g) = self.grace_period {
            write!(f, " for {}", quantity::format_duration(g))?;
        }
        if let Some(m) = self.min_reclaim {
            write!(f, ", reclaiming {} more", m.show(self.signal.is_bytes()))?;
        }
        Ok(())
    }
}

/// The validated eviction configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct EvictionConfig {
    /// Hard thresholds: act at once, pods stopped with no grace.
    pub hard: Vec<Threshold>,
    /// Soft thresholds: act after their grace period.
    pub soft: Vec<Threshold>,
    /// Cap on a pod's termination grace under soft eviction (None: 0, as the kubelet).
    pub max_pod_grace_period: Option<Duration>,
    /// How long a pressure condition stays after its thresholds stop being met.
    pub pressure_transition_period: Duration,
    /// Interval of the housekeeping tick.
    pub housekeeping_interval: Duration,
}

/// A configuration error: which key, which value, which rule.
#[derive(Clone, Debug, PartialEq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub struct ConfigError {
    /// The key (file key or flag name).
    pub key: String,
    /// The offending value.
    pub value: String,
    /// What is wrong.
    pub rule: String,
}

impl std::fmt::Display for ConfigError {
    /// `key: "value": rule`, or `key: rule` when there is no value to show.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}: {}", self.key, self.rule)
        } else {
            write!(f, "{}: {:?}: {}", self.key, self.value, self.rule)
        }
    }
}

impl ConfigError {
    pub(crate) fn new(key: &str, value: impl Into<String>, rule: impl Into<String>) -> Self {
        Self {
            key: key.to_owned(),
            value: value.into(),
            rule: rule.into(),
        }
    }
}

/// Configuration as written, before validation: signal names and strings.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RawEviction {
    /// `evictionHard`: signal → amount (None: not given, kubelet defaults;
    /// empty: `none` was given, no hard threshold at all).
    pub hard: Option<BTreeMap<String, String>>,
    /// `evictionSoft`.
    pub soft: BTreeMap<String, String>,
    /// `evictionSoftGracePeriod`: signal → duration.
    pub soft_grace_period: BTreeMap<String, String>,
    /// `evictionMaxPodGracePeriod` in seconds.
    pub max_pod_grace_period: Option<i64>,
    /// `evictionMinimumReclaim`: signal → amount.
    pub minimum_reclaim: BTreeMap<String, String>,
    /// `evictionPressureTransitionPeriod`.
    pub pressure_transition_period: Option<String>,
    /// `housekeepingInterval`.
    pub housekeeping_interval: Option<String>,
}

/// The kubelet's Linux default hard thresholds.
pub const DEFAULT_HARD: [(&str, &str); 4] = [
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
    ("imagefs.available", "15%"),
];

fn signal(key: &str, name: &str) -> Result<Signal, ConfigError> {
    Signal::parse(name).ok_or_else(|| {
        let known: Vec<&str> = Signal::ALL.iter().map(|s| s.name()).collect();
        ConfigError::new(
            key,
            name,
            format!("unknown signal; known signals: {}", known.join(", ")),
        )
    })
}

/// The window of the stall signals' PSI average (`avg10`).
pub const PSI_WINDOW: Duration = Duration::from_secs(10);

/// A threshold's amount for `sig`: as [`amount`], but for a stall signal a
/// percentage of time stalled, in (0, 100), kept as the share not stalled.
fn threshold_amount(
    key: &str,
    sig: Signal,
    name: &str,
    value: &str,
) -> Result<Amount, ConfigError> {
    if !sig.is_stall() {
        return amount(key, name, value);
    }
    let bad = |why: &str| ConfigError::new(key, format!("{name}={value}"), why.to_owned());
    match amount(key, name, value) {
        Ok(Amount::Percentage(p)) if p < 100.0 => Ok(Amount::Percentage(100.0 - p)),
        Ok(Amount::Percentage(_)) => Err(bad(
            "a stall of 100% is never exceeded: give a share of time under 100%",
        )),
        Ok(Amount::Quantity(_)) => Err(bad(
            "a stall threshold is a share of time, a percentage: e.g. 20%",
        )),
        Err(_) => Err(bad(
            "a stall threshold is a percentage of time stalled between 0 and 100%",
        )),
    }
}

/// The largest threshold quantity: signals are compared as `int64`, as the
/// kubelet's `resource.Quantity` values are (8Ei − 1).
pub const MAX_QUANTITY: u64 = i64::MAX as u64;

fn amount(key: &str, sig: &str, value: &str) -> Result<Amount, ConfigError> {
    let err = |e: QuantityError| ConfigError::new(key, format!("{sig}={value}"), e.to_string());
    if value.ends_with('%') {
        return quantity::parse_percentage(value)
            .map(Amount::Percentage)
            .map_err(err);
    }
    match quantity::parse_quantity(value) {
        Ok(q) if q > MAX_QUANTITY => Err(ConfigError::new(
            key,
            format!("{sig}={value}"),
            format!("out of range: at most {MAX_QUANTITY} (8Ei minus one)"),
        )),
        Ok(q) => Ok(Amount::Quantity(q)),
        Err(QuantityError::TooLarge { .. }) => Err(ConfigError::new(
            key,
            format!("{sig}={value}"),
            format!("out of range: at most {MAX_QUANTITY} (8Ei minus one)"),
        )),
        Err(e) => Err(err(e)),
    }
}

/// A duration (`90s`, `1m30s`, …) given for `key`, or the error naming both.
pub fn duration(key: &str, value: &str) -> Result<Duration, ConfigError> {
    quantity::parse_duration(value).map_err(|e| ConfigError::new(key, value, e.to_string()))
}

impl RawEviction {
    /// Overrides this (file) configuration with `flags`, key by key.
    pub fn merge(mut self, flags: RawEviction) -> RawEviction {
        if flags.hard.is_some() {
            self.hard = flags.hard;
        }
        for (dst, src) in [
            (&mut self.soft, flags.soft),
            (&mut self.soft_grace_period, flags.soft_grace_period),
            (&mut self.minimum_reclaim, flags.minimum_reclaim),
        ] {
            if !src.is_empty() {
                *dst = src;
            }
        }
        self.max_pod_grace_period = flags.max_pod_grace_period.or(self.max_pod_grace_period);
        self.pressure_transition_period = flags
            .pressure_transition_period
            .or(self.pressure_transition_period);
        self.housekeeping_interval = flags.housekeeping_interval.or(self.housekeeping_interval);
        self
    }

    /// Validates into an [`EvictionConfig`]; the first error found is
    /// returned, in this order: minimum reclaim, hard thresholds, soft
    /// grace periods, soft thresholds, the maximum pod grace period,
    /// housekeeping, the transition period.
    pub fn validate(&self) -> Result<EvictionConfig, ConfigError> {
        let reclaim = self.minimum_reclaims()?;
        let hard = self.hard_thresholds(&reclaim)?;
        let graces = self.soft_grace_periods()?;
        let soft = self.soft_thresholds(&graces, &reclaim)?;
        let max_pod_grace_period = self.max_pod_grace()?;
        let housekeeping_interval = period(
            "housekeepingInterval",
            &self.housekeeping_interval,
            Duration::from_secs(10),
        )?;
        if housekeeping_interval.is_zero() {
            return Err(ConfigError::new(
                "housekeepingInterval",
                "0",
                "must be positive",
            ));
        }
        Ok(EvictionConfig {
            hard,
            soft,
            max_pod_grace_period,
            pressure_transition_period: period(
                "evictionPressureTransitionPeriod",
                &self.pressure_transition_period,
                Duration::from_secs(300),
            )?,
            housekeeping_interval,
        })
    }

    /// `evictionMinimumReclaim`, by signal.
    fn minimum_reclaims(&self) -> Result<BTreeMap<Signal, Amount>, ConfigError> {
        let mut reclaim = BTreeMap::new();
        for (name, value) in &self.minimum_reclaim {
            let sig = signal("evictionMinimumReclaim", name)?;
            if sig.is_stall() {
                return Err(ConfigError::new(
                    "evictionMinimumReclaim",
                    format!("{name}={value}"),
                    "a stall signal has no amount to reclaim",
                ));
            }
            reclaim.insert(sig, amount("evictionMinimumReclaim", name, value)?);
        }
        Ok(reclaim)
    }

    /// `evictionHard` (the kubelet's defaults when not given), each with
    /// its minimum reclaim.
    fn hard_thresholds(
        &self,
        reclaim: &BTreeMap<Signal, Amount>,
    ) -> Result<Vec<Threshold>, ConfigError> {
        let defaults: BTreeMap<String, String> = DEFAULT_HARD
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut hard = Vec::new();
        for (name, value) in self.hard.as_ref().unwrap_or(&defaults) {
            let sig = signal("evictionHard", name)?;
            let amount = threshold_amount("evictionHard", sig, name, value)?;
            hard.push(Threshold {
                signal: sig,
                amount,
                grace_period: None,
                min_reclaim: reclaim.get(&sig).copied(),
            });
        }
        Ok(hard)
    }

    /// `evictionSoftGracePeriod`, by signal; each must have a soft threshold.
    fn soft_grace_periods(&self) -> Result<BTreeMap<Signal, Duration>, ConfigError> {
        let mut graces = BTreeMap::new();
        for (name, value) in &self.soft_grace_period {
            let sig = signal("evictionSoftGracePeriod", name)?;
            if !self.soft.contains_key(name) {
                return Err(ConfigError::new(
                    "evictionSoftGracePeriod",
                    format!("{name}={value}"),
                    "a grace period for a signal with no soft threshold (add it to evictionSoft)",
                ));
            }
            let grace = duration("evictionSoftGracePeriod", value)?;
            if sig.is_stall() && grace < PSI_WINDOW {
                return Err(ConfigError::new(
                    "evictionSoftGracePeriod",
                    format!("{name}={value}"),
                    "shorter than PSI's shortest average (avg10): a stall window is at least 10s",
                ));
            }
            graces.insert(sig, grace);
        }
        Ok(graces)
    }

    /// `evictionSoft`, each with its grace period (required) and minimum
    /// reclaim.
    fn soft_thresholds(
        &self,
        graces: &BTreeMap<Signal, Duration>,
        reclaim: &BTreeMap<Signal, Amount>,
    ) -> Result<Vec<Threshold>, ConfigError> {
        let mut soft = Vec::new();
        for (name, value) in &self.soft {
            let sig = signal("evictionSoft", name)?;
            let amount = threshold_amount("evictionSoft", sig, name, value)?;
            let Some(grace) = graces.get(&sig).copied() else {
                return Err(ConfigError::new(
                    "evictionSoft",
                    format!("{name}={value}"),
                    "a soft threshold needs a grace period in evictionSoftGracePeriod",
                ));
            };
            soft.push(Threshold {
                signal: sig,
                amount,
                grace_period: Some(grace),
                min_reclaim: reclaim.get(&sig).copied(),
            });
        }
        Ok(soft)
    }

    /// `evictionMaxPodGracePeriod`: not negative.
    fn max_pod_grace(&self) -> Result<Option<Duration>, ConfigError> {
        match self.max_pod_grace_period {
            None => Ok(None),
            Some(s) if s < 0 => Err(ConfigError::new(
                "evictionMaxPodGracePeriod",
                s.to_string(),
                "must not be negative",
            )),
            Some(s) => Ok(Some(Duration::from_secs(s as u64))),
        }
    }
}

/// The duration `v` of setting `key`, or `default` when not given.
fn period(key: &str, v: &Option<String>, default: Duration) -> Result<Duration, ConfigError> {
    match v {
        Some(v) => duration(key, v),
        None => Ok(default),
    }
}

impl EvictionConfig {
    /// The effective configuration, one line per setting, in the kubelet's names.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        let list = |ts: &[Threshold]| {
            if ts.is_empty() {
                "(none)".to_owned()
            } else {
                ts.iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        out.push_str(&format!("evictionHard: {}\n", list(&self.hard)));
        out.push_str(&format!("evictionSoft: {}\n", list(&self.soft)));
        let max = self
            .max_pod_grace_period
            .map_or("0 (pods stopped at once)".to_owned(), |d| {
                format!("{}s", d.as_secs())
            });
        out.push_str(&format!("evictionMaxPodGracePeriod: {max}\n"));
        out.push_str(&format!(
            "evictionPressureTransitionPeriod: {}\n",
            quantity::format_duration(self.pressure_transition_period)
        ));
        out.push_str(&format!(
            "housekeepingInterval: {}\n",
            quantity::format_duration(self.housekeeping_interval)
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn nothing_given_means_the_kubelets_linux_defaults() {
        let c = RawEviction::default().validate().unwrap();
        let hard: Vec<String> = c.hard.iter().map(|t| t.to_string()).collect();
        assert_eq!(
            hard,
            [
                "imagefs.available<15%",
                "memory.available<100Mi",
                "nodefs.available<10%",
                "nodefs.inodesFree<5%"
            ]
        );
        assert!(c.soft.is_empty());
        assert_eq!(c.pressure_transition_period, Duration::from_secs(300));
        assert_eq!(c.housekeeping_interval, Duration::from_secs(10));
    }

    #[test]
    fn stall_thresholds_are_shares_of_time_with_a_psi_window() {
        let raw =
            |hard: &[(&str, &str)], soft: &[(&str, &str)], grace: &[(&str, &str)]| RawEviction {
                hard: Some(map(hard)),
                soft: map(soft),
                soft_grace_period: map(grace),
                ..Default::default()
            };
        let c = raw(
            &[("memory.pressure.some", "20%")],
            &[("memory.pressure.full", "5%")],
            &[("memory.pressure.full", "30s")],
        )
        .validate()
        .unwrap();
        // Kept as the share not stalled; shown as the share stalled.
        assert_eq!(c.hard[0].amount, Amount::Percentage(80.0));
        assert_eq!(c.hard[0].to_string(), "memory.pressure.some>20%");
        assert_eq!(c.soft[0].to_string(), "memory.pressure.full>5% for 30s");
        for (value, needle) in [
            ("150%", "between 0 and 100%"),
            ("100%", "never exceeded"),
            ("0%", "between 0 and 100%"),
            ("100Mi", "a percentage"),
        ] {
            let e = raw(&[("memory.pressure.some", value)], &[], &[])
                .validate()
                .unwrap_err();
            assert_eq!(e.key, "evictionHard");
            assert!(e.to_string().contains(needle), "{value}: {e}");
        }
        let e = raw(
            &[],
            &[("memory.pressure.some", "20%")],
            &[("memory.pressure.some", "5s")],
        )
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("at least 10s"), "{e}");
        let mut r = raw(&[("memory.pressure.some", "20%")], &[], &[]);
        r.minimum_reclaim = map(&[("memory.pressure.some", "1%")]);
        assert!(
            r.validate()
                .unwrap_err()
                .to_string()
                .contains("no amount to reclaim")
        );
    }

    #[test]
    fn seed_example_with_minimum_reclaim() {
        // --eviction-hard=memory.available<500Mi,nodefs.available<1Gi,imagefs.available<100Gi
        // --eviction-minimum-reclaim="memory.available=0Mi,nodefs.available=500Mi,imagefs.available=2Gi"
        let raw = RawEviction {
            hard: Some(map(&[
                ("memory.available", "500Mi"),
                ("nodefs.available", "1Gi"),
                ("imagefs.available", "100Gi"),
            ])),
            minimum_reclaim: map(&[
                ("memory.available", "0Mi"),
                ("nodefs.available", "500Mi"),
                ("imagefs.available", "2Gi"),
            ]),
            ..Default::default()
        };
        let c = raw.validate().unwrap();
        let nodefs = c
            .hard
            .iter()
            .find(|t| t.signal == Signal::NodefsAvailable)
            .unwrap();
        assert_eq!(nodefs.amount, Amount::Quantity(1 << 30));
        assert_eq!(nodefs.min_reclaim, Some(Amount::Quantity(500 << 20)));
    }

    #[test]
    fn soft_thresholds_need_grace_periods_and_grace_periods_need_soft_thresholds() {
        let soft_only = RawEviction {
            soft: map(&[("memory.available", "1.5Gi")]),
            ..Default::default()
        };
        let e = soft_only.validate().unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.value.as_str()),
            ("evictionSoft", "memory.available=1.5Gi")
        );
        let grace_only = RawEviction {
            soft_grace_period: map(&[("memory.available", "1m30s")]),
            ..Default::default()
        };
        assert_eq!(
            grace_only.validate().unwrap_err().key,
            "evictionSoftGracePeriod"
        );
        let both = RawEviction {
            soft: map(&[("memory.available", "1.5Gi")]),
            soft_grace_period: map(&[("memory.available", "1m30s")]),
            ..Default::default()
        };
        assert_eq!(
            both.validate().unwrap().soft[0].grace_period,
            Some(Duration::from_secs(90))
        );
    }

    #[test]
    fn every_bad_value_is_named() {
        let cases: Vec<(RawEviction, &str, &str)> = vec![
            (
                RawEviction {
                    hard: Some(map(&[("memory.free", "1Gi")])),
                    ..Default::default()
                },
                "evictionHard",
                "memory.free",
            ),
            (
                RawEviction {
                    hard: Some(map(&[("memory.available", "lots")])),
                    ..Default::default()
                },
                "evictionHard",
                "memory.available=lots",
            ),
            (
                RawEviction {
                    hard: Some(map(&[("nodefs.available", "0%")])),
                    ..Default::default()
                },
                "evictionHard",
                "nodefs.available=0%",
            ),
            (
                RawEviction {
                    hard: Some(map(&[("nodefs.available", "150%")])),
                    ..Default::default()
                },
                "evictionHard",
                "nodefs.available=150%",
            ),
            (
                RawEviction {
                    hard: Some(map(&[("memory.available", "9223372036854775808")])),
                    ..Default::default()
                },
                "evictionHard",
                "memory.available=9223372036854775808",
            ),
            (
                RawEviction {
                    minimum_reclaim: map(&[("nodefs.available", "1e30")]),
                    ..Default::default()
                },
                "evictionMinimumReclaim",
                "nodefs.available=1e30",
            ),
            (
                RawEviction {
                    max_pod_grace_period: Some(-1),
                    ..Default::default()
                },
                "evictionMaxPodGracePeriod",
                "-1",
            ),
            (
                RawEviction {
                    pressure_transition_period: Some("-5m".into()),
                    ..Default::default()
                },
                "evictionPressureTransitionPeriod",
                "-5m",
            ),
            (
                RawEviction {
                    minimum_reclaim: map(&[("memory.available", "-1Mi")]),
                    ..Default::default()
                },
                "evictionMinimumReclaim",
                "memory.available=-1Mi",
            ),
        ];
        for (raw, key, value) in cases {
            let e = raw.validate().unwrap_err();
            assert_eq!((e.key.as_str(), e.value.as_str()), (key, value), "{e}");
        }
    }

    #[test]
    fn flags_override_the_file_key_by_key() {
        let file = RawEviction {
            hard: Some(map(&[("memory.available", "1Gi")])),
            housekeeping_interval: Some("30s".into()),
            ..Default::default()
        };
        let flags = RawEviction {
            hard: Some(map(&[("memory.available", "200Mi")])),
            ..Default::default()
        };
        let c = file.merge(flags).validate().unwrap();
        assert_eq!(c.hard[0].amount, Amount::Quantity(200 << 20));
        assert_eq!(c.housekeeping_interval, Duration::from_secs(30));
    }
}
