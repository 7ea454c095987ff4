//! The kubelet's flag syntax: `--eviction-hard=memory.available<100Mi,nodefs.available<10%`
//! for thresholds and `--eviction-soft-grace-period=memory.available=1m30s`
//! for per-signal values. `--eviction-hard=none` turns every hard threshold
//! off; an empty `--eviction-hard=` is refused (see [`hard_thresholds`]).

use std::collections::BTreeMap;

use super::ConfigError;
use crate::signals::table::Signal;

/// Parses `signal<amount,…` (the only operator the kubelet supports is `<`;
/// criguard's stall signals take `>`: `memory.pressure.some>20%`).
pub fn thresholds(key: &str, text: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut out = BTreeMap::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some(at) = entry.find(['<', '>', '=', '!']) else {
            return Err(ConfigError::new(
                key,
                entry,
                "expected signal<amount, e.g. memory.available<100Mi",
            ));
        };
        let (name, rest) = entry.split_at(at);
        let op_len = rest
            .find(|c: char| !"<>=!".contains(c))
            .unwrap_or(rest.len());
        let (op, value) = rest.split_at(op_len);
        let stall = Signal::parse(name.trim()).is_some_and(Signal::is_stall);
        match (op, stall) {
            ("<", false) | (">", true) => {}
            (_, false) => {
                return Err(ConfigError::new(
                    key,
                    entry,
                    format!("unsupported operator {op:?}; the kubelet supports only <"),
                ));
            }
            (_, true) => {
                return Err(ConfigError::new(
                    key,
                    entry,
                    format!(
                        "unsupported operator {op:?}; a stall signal is met above its line: {}>20%",
                        name.trim()
                    ),
                ));
            }
        }
        insert_once(key, entry, &mut out, name, value)?;
    }
    Ok(out)
}

/// The word that says "no hard threshold at all" (flag and file).
pub const NONE: &str = "none";

/// Parses `--eviction-hard`: thresholds as [`thresholds`] does, or [`NONE`]
/// for no hard threshold at all (an empty map). A value with no threshold
/// in it (`--eviction-hard=`, `--eviction-hard=,`) is refused: the kubelet
/// reads it as "none", which silently turns off every hard threshold.
pub fn hard_thresholds(key: &str, text: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    if text.trim() == NONE {
        return Ok(BTreeMap::new());
    }
    let parsed = thresholds(key, text)?;
    if parsed.is_empty() {
        return Err(ConfigError::new(
            key,
            text,
            format!(
                "no threshold given, which would turn off every hard threshold; \
                 write {key}={NONE} to mean that, or leave the flag out for the kubelet's defaults"
            ),
        ));
    }
    Ok(parsed)
}

/// Parses `signal=value,…`.
pub fn pairs(key: &str, text: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut out = BTreeMap::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((name, value)) = entry.split_once('=') else {
            return Err(ConfigError::new(
                key,
                entry,
                "expected signal=value, e.g. memory.available=1m30s",
            ));
        };
        insert_once(key, entry, &mut out, name, value)?;
    }
    Ok(out)
}

fn insert_once(
    key: &str,
    entry: &str,
    out: &mut BTreeMap<String, String>,
    name: &str,
    value: &str,
) -> Result<(), ConfigError> {
    if out.insert(name.to_owned(), value.to_owned()).is_some() {
        return Err(ConfigError::new(
            key,
            entry,
            format!("{name} is given twice (a quantity and a percentage cannot both be set)"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_flag_examples_parse() {
        let t = thresholds(
            "--eviction-hard",
            "memory.available<500Mi,nodefs.available<1Gi,imagefs.available<100Gi",
        )
        .unwrap();
        assert_eq!(t["nodefs.available"], "1Gi");
        let p = pairs(
            "--eviction-minimum-reclaim",
            "memory.available=0Mi,nodefs.available=500Mi",
        )
        .unwrap();
        assert_eq!(p["nodefs.available"], "500Mi");
        assert!(thresholds("--eviction-soft", "").unwrap().is_empty());
    }

    #[test]
    fn an_empty_hard_list_is_refused_and_none_is_explicit() {
        for empty in ["", ",", " , ,"] {
            let e = hard_thresholds("--eviction-hard", empty).unwrap_err();
            assert_eq!(e.key, "--eviction-hard");
            assert!(e.rule.contains("--eviction-hard=none"), "{e}");
        }
        assert!(
            hard_thresholds("--eviction-hard", "none")
                .unwrap()
                .is_empty()
        );
        let t = hard_thresholds("--eviction-hard", "memory.available<1Gi").unwrap();
        assert_eq!(t["memory.available"], "1Gi");
    }

    #[test]
    fn unsupported_operators_and_duplicates_are_refused_by_name() {
        for (text, needle) in [
            ("memory.available>100Mi", "\">\""),
            ("memory.available<=100Mi", "\"<=\""),
            ("memory.available=100Mi", "\"=\""),
            ("memory.available100Mi", "expected signal<amount"),
            ("memory.available<1Gi,memory.available<10%", "given twice"),
        ] {
            let e = thresholds("--eviction-hard", text).unwrap_err();
            assert_eq!(e.key, "--eviction-hard");
            assert!(e.to_string().contains(needle), "{text}: {e}");
        }
        assert!(pairs("--eviction-soft-grace-period", "memory.available").is_err());
    }

    #[test]
    fn stall_signals_take_greater_than_and_no_other_operator() {
        let t = thresholds(
            "--eviction-hard",
            "memory.pressure.some>20%,memory.available<1Gi",
        );
        assert_eq!(t.unwrap()["memory.pressure.some"], "20%");
        let e = thresholds("--eviction-hard", "memory.pressure.full<20%").unwrap_err();
        assert!(e.to_string().contains("memory.pressure.full>20%"), "{e}");
    }
}
