//! The admin API's answers as tables for people (`criguard pods`,
//! `evictions`, `rank`, `usage`); `--json` prints the same data as JSON
//! instead.

use crate::eviction::rank::RankEntry;
use crate::signals::table::Signal;
use crate::signals::usage::NodeUsage;

/// The ranking as a table: one line per pod and signal, first victim first.
pub fn rank_table(entries: &[RankEntry]) -> String {
    let mut out = format!(
        "{:<28} {:>4}  {:<40} {:<10} {:>9} {:>12} {:>12}\n",
        "SIGNAL", "RANK", "POD", "QOS", "PRIORITY", "USAGE", "REQUEST"
    );
    for e in entries {
        let bytes = Signal::parse(&e.signal).is_some_and(|s| s.is_bytes());
        let show = |v: i64| {
            if bytes {
                crate::quantity::format_bytes(v.max(0) as u64)
            } else {
                v.to_string()
            }
        };
        out.push_str(&format!(
            "{:<28} {:>4}  {:<40} {:<10} {:>9} {:>12} {:>12}\n",
            e.signal,
            e.rank,
            e.pod,
            e.qos,
            e.priority,
            e.usage.map_or("?".to_owned(), show),
            show(e.request)
        ));
    }
    out
}

/// Per-pod usage as a table for people: one line per pod, then the node's
/// filesystems and image store.
pub fn usage_table(u: &NodeUsage) -> String {
    use crate::quantity::format_bytes;
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<36} {:>10} {:>8} {:>10} {:>8} {:>10} {:>8} {:>6}",
        "NAMESPACE/POD", "ROOTFS", "INODES", "LOGS", "INODES", "VOLUMES", "INODES", "PROCS"
    );
    for p in &u.pods {
        let procs = p.processes.map_or("-".into(), |n| n.to_string());
        let _ = writeln!(
            out,
            "{:<36} {:>10} {:>8} {:>10} {:>8} {:>10} {:>8} {:>6}",
            format!("{}/{}", p.namespace, p.name),
            format_bytes(p.rootfs.bytes),
            p.rootfs.inodes,
            format_bytes(p.logs.bytes),
            p.logs.inodes,
            format_bytes(p.volumes.bytes),
            p.volumes.inodes,
            procs
        );
        for e in &p.errors {
            let _ = writeln!(out, "  not read: {e}");
        }
    }
    for (name, fs) in [("nodefs", u.nodefs), ("imagefs", u.imagefs)] {
        if let Some(fs) = fs {
            let _ = writeln!(
                out,
                "{name}: {} of {} available, {} of {} inodes free",
                format_bytes(fs.available),
                format_bytes(fs.capacity),
                fs.inodes_free,
                fs.inodes
            );
        }
    }
    let _ = writeln!(
        out,
        "dedicated imagefs: {}; image content store: {}; read in {} µs",
        if u.dedicated_imagefs { "yes" } else { "no" },
        u.images.map_or("-".into(), |i| format!(
            "{} in {} inodes",
            format_bytes(i.bytes),
            i.inodes
        )),
        u.read_us
    );
    out
}
