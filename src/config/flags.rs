//! The kubelet's flag syntax: `--eviction-hard=memory.available<100Mi,nodefs.available<10%`
//! for thresholds and `--eviction-soft-grace-period=memory.available=1m30s`
//! for per-signal values.

use std::collections::BTreeMap;

use super::ConfigError;

/// Parses `signal<amount,…` (the only operator the kubelet supports is `<`).
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
        if op != "<" {
            return Err(ConfigError::new(
                key,
                entry,
                format!("unsupported operator {op:?}; the kubelet supports only <"),
            ));
        }
        insert_once(key, entry, &mut out, name, value)?;
    }
    Ok(out)
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
        assert!(thresholds("--eviction-hard", "").unwrap().is_empty());
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
}
