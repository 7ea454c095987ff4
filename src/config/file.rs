//! The TOML configuration file, with KubeletConfiguration's key names:
//!
//! ```toml
//! evictionHard = { "memory.available" = "100Mi", "nodefs.available" = "10%" }
//! evictionSoft = { "memory.available" = "300Mi" }
//! evictionSoftGracePeriod = { "memory.available" = "1m30s" }
//! evictionMaxPodGracePeriod = 60
//! evictionMinimumReclaim = { "memory.available" = "50Mi" }
//! evictionPressureTransitionPeriod = "5m"
//! housekeepingInterval = "10s"
//! imageGCHighThresholdPercent = 85
//! imageGCLowThresholdPercent = 80
//! imageMinimumGCAge = "2m"
//! imageMaximumGCAge = "0s"
//! dryRun = false          # true: decide and log evictions, stop nothing
//! kubeconfig = "/etc/criguard/kubeconfig"  # optional: report to the API
//! nodeName = "worker-1"   # default: the hostname
//! kubeStatusTimeout = "250ms"
//! nodeTaints = true
//! ```
//!
//! Unknown keys are refused, naming the key, so a typo never silently
//! falls back to a default; every parse error names the file, line and
//! column. `evictionHard = "none"` turns every hard threshold off; an empty
//! table is refused. Only a regular file of at most [`MAX_FILE_BYTES`] is
//! read: a device, FIFO or directory given by mistake is refused by name
//! instead of read until memory runs out.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

use super::image_gc::RawImageGc;
use super::kube::RawKube;
use super::{ConfigError, RawEviction};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FileConfig {
    #[serde(default, deserialize_with = "hard_table")]
    eviction_hard: Option<BTreeMap<String, String>>,
    #[serde(default)]
    eviction_soft: BTreeMap<String, String>,
    #[serde(default)]
    eviction_soft_grace_period: BTreeMap<String, String>,
    eviction_max_pod_grace_period: Option<i64>,
    #[serde(default)]
    eviction_minimum_reclaim: BTreeMap<String, String>,
    eviction_pressure_transition_period: Option<String>,
    housekeeping_interval: Option<String>,
    #[serde(rename = "imageGCHighThresholdPercent")]
    image_gc_high_threshold_percent: Option<i64>,
    #[serde(rename = "imageGCLowThresholdPercent")]
    image_gc_low_threshold_percent: Option<i64>,
    #[serde(rename = "imageMinimumGCAge")]
    image_minimum_gc_age: Option<String>,
    #[serde(rename = "imageMaximumGCAge")]
    image_maximum_gc_age: Option<String>,
    #[serde(alias = "dry_run")]
    dry_run: Option<bool>,
    kubeconfig: Option<String>,
    node_name: Option<String>,
    kube_status_timeout: Option<String>,
    node_taints: Option<bool>,
}

/// `evictionHard`: a table of signal = amount, or `"none"` (an empty map).
fn hard_table<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    struct Hard;
    impl<'de> Visitor<'de> for Hard {
        type Value = BTreeMap<String, String>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(
                f,
                "a table of signal = amount, or \"{}\"",
                super::flags::NONE
            )
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            if v == super::flags::NONE {
                Ok(BTreeMap::new())
            } else {
                Err(E::invalid_value(de::Unexpected::Str(v), &self))
            }
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some((k, v)) = m.next_entry::<String, String>()? {
                out.insert(k, v);
            }
            if out.is_empty() {
                return Err(de::Error::custom(format!(
                    "an empty evictionHard would turn off every hard threshold; write \
                     evictionHard = \"{}\" to mean that, or leave the key out for the kubelet's defaults",
                    super::flags::NONE
                )));
            }
            Ok(out)
        }
    }
    d.deserialize_any(Hard).map(Some)
}

/// The largest configuration file criguard reads (the annotated example is
/// about 3 KiB).
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// Everything a configuration file sets, before validation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RawFile {
    /// The eviction keys.
    pub eviction: RawEviction,
    /// The image GC keys.
    pub image_gc: RawImageGc,
    /// `dryRun` (also `dry_run`): decide and log evictions, stop nothing.
    pub dry_run: Option<bool>,
    /// The Kubernetes API report's keys.
    pub kube: RawKube,
}

/// Parses the file's text; `origin` names it in errors.
pub fn parse(origin: &str, text: &str) -> Result<RawFile, ConfigError> {
    let f: FileConfig = toml::from_str(text).map_err(|e| {
        let span = e.span().unwrap_or(text.len()..text.len());
        let (line, column) = line_column(text, span.start);
        // The text the parser points at (the unknown key, the bad value),
        // else the line where it stopped.
        let value = match text.get(span.clone()).map(str::trim) {
            Some(t) if !t.is_empty() => t.to_owned(),
            _ => text.lines().nth(line - 1).unwrap_or("").trim().to_owned(),
        };
        ConfigError {
            key: format!("{origin}, line {line}, column {column}"),
            value,
            rule: e.message().trim().to_owned(),
        }
    })?;
    let eviction = RawEviction {
        hard: f.eviction_hard,
        soft: f.eviction_soft,
        soft_grace_period: f.eviction_soft_grace_period,
        max_pod_grace_period: f.eviction_max_pod_grace_period,
        minimum_reclaim: f.eviction_minimum_reclaim,
        pressure_transition_period: f.eviction_pressure_transition_period,
        housekeeping_interval: f.housekeeping_interval,
    };
    let image_gc = RawImageGc {
        high_percent: f.image_gc_high_threshold_percent,
        low_percent: f.image_gc_low_threshold_percent,
        min_age: f.image_minimum_gc_age,
        max_age: f.image_maximum_gc_age,
    };
    let kube = RawKube {
        kubeconfig: f.kubeconfig,
        node_name: f.node_name,
        status_timeout: f.kube_status_timeout,
        taints: f.node_taints,
    };
    Ok(RawFile {
        eviction,
        image_gc,
        dry_run: f.dry_run,
        kube,
    })
}

/// 1-based line and column (in characters) of byte `at` in `text`.
fn line_column(text: &str, at: usize) -> (usize, usize) {
    let before = text.get(..at).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[start..].chars().count() + 1)
}

/// Reads and parses a configuration file: a regular file of at most
/// [`MAX_FILE_BYTES`], UTF-8.
pub fn load(path: &Path) -> Result<RawFile, ConfigError> {
    let origin = path.display().to_string();
    let fail = |rule: String| ConfigError::new(&origin, "", rule);
    // Non-blocking, so that opening a FIFO does not wait for a writer.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)
        .map_err(|e| fail(e.to_string()))?;
    let kind = file
        .metadata()
        .map_err(|e| fail(e.to_string()))?
        .file_type();
    if !kind.is_file() {
        let what = if kind.is_dir() {
            "a directory"
        } else if kind.is_char_device() {
            "a character device"
        } else if kind.is_block_device() {
            "a block device"
        } else if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "not a file"
        };
        return Err(fail(format!(
            "not a regular file ({what}); --config takes a TOML file"
        )));
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| fail(e.to_string()))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(fail(format!(
            "larger than {} MiB; a configuration file is a few KiB",
            MAX_FILE_BYTES >> 20
        )));
    }
    let text = String::from_utf8(bytes).map_err(|e| fail(format!("not UTF-8 text: {e}")))?;
    parse(&origin, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_parses_and_validates() {
        let text = r#"
            evictionHard = { "memory.available" = "100Mi", "nodefs.available" = "10%" }
            evictionSoft = { "memory.available" = "300Mi" }
            evictionSoftGracePeriod = { "memory.available" = "1m30s" }
            evictionMaxPodGracePeriod = 60
            evictionMinimumReclaim = { "memory.available" = "50Mi" }
            evictionPressureTransitionPeriod = "5m"
            housekeepingInterval = "10s"
            imageGCHighThresholdPercent = 90
            imageGCLowThresholdPercent = 70
            imageMinimumGCAge = "5m"
            imageMaximumGCAge = "168h"
            dry_run = true
            kubeconfig = "/etc/criguard/kubeconfig"
            nodeName = "worker-1"
            kubeStatusTimeout = "300ms"
            nodeTaints = false
        "#;
        let f = parse("config.toml", text).unwrap();
        assert_eq!(f.dry_run, Some(true));
        let k = f.kube.clone().validate("host").unwrap().unwrap();
        assert_eq!(k.node_name, "worker-1");
        assert_eq!(k.status_timeout, std::time::Duration::from_millis(300));
        assert!(!k.taints);
        let g = f.image_gc.validate().unwrap();
        assert_eq!((g.high_percent, g.low_percent), (90, 70));
        assert_eq!(g.max_age, Some(std::time::Duration::from_secs(7 * 86400)));
        let c = f.eviction.validate().unwrap();
        assert_eq!(c.hard.len(), 2);
        assert_eq!(c.soft.len(), 1);
        assert_eq!(
            c.max_pod_grace_period,
            Some(std::time::Duration::from_secs(60))
        );
    }

    #[test]
    fn unknown_keys_and_wrong_types_are_named() {
        let e = parse("config.toml", "evictionHardd = {}\n").unwrap_err();
        assert!(e.rule.contains("evictionHardd"), "{e}");
        assert_eq!(e.key, "config.toml, line 1, column 1");
        let e = parse(
            "config.toml",
            "evictionHard = { \"memory.available\" = 100 }\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("100"), "{e}");
    }

    #[test]
    fn a_syntax_error_names_line_and_column() {
        let text = "dryRun = true\nevictionHard = { \"memory.available\" = \"1Gi\" \nx = 1\n";
        let e = parse("c.toml", text).unwrap_err();
        assert_eq!(e.key, "c.toml, line 3, column 1", "{e}");
        assert_eq!(e.value, "x = 1");
        assert!(!e.to_string().contains("\"\""), "{e}");
        assert_eq!(line_column("ab\ncdé\nf", 7), (2, 4));
        assert_eq!(line_column("", 0), (1, 1));
    }

    #[test]
    fn eviction_hard_none_is_explicit_and_an_empty_table_is_refused() {
        let f = parse("c.toml", "evictionHard = \"none\"\n").unwrap();
        assert_eq!(f.eviction.hard, Some(BTreeMap::new()));
        assert!(f.eviction.validate().unwrap().hard.is_empty());
        let e = parse("c.toml", "evictionHard = {}\n").unwrap_err();
        assert!(e.rule.contains("evictionHard = \"none\""), "{e}");
        let e = parse("c.toml", "evictionHard = \"off\"\n").unwrap_err();
        assert!(e.to_string().contains("off"), "{e}");
    }

    #[test]
    fn only_a_small_regular_file_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let e = load(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(e.key, "/dev/zero");
        assert!(e.rule.contains("character device"), "{e}");
        let e = load(dir.path()).unwrap_err();
        assert!(e.rule.contains("a directory"), "{e}");
        let big = dir.path().join("big.toml");
        std::fs::write(&big, vec![b'#'; MAX_FILE_BYTES as usize + 1]).unwrap();
        assert!(load(&big).unwrap_err().rule.contains("larger than"));
        let ok = dir.path().join("ok.toml");
        std::fs::write(&ok, "dryRun = true\n").unwrap();
        assert_eq!(load(&ok).unwrap().dry_run, Some(true));
    }
}
