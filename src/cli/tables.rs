//! The tables people read: `criguard pods`, `rank`, `usage` and the
//! signals of `status`, their columns as wide as their widest cell
//! (`tabwriter`, as kubectl's tables); `--json` prints the same data as
//! JSON instead.

use std::io::Write as _;

use criguard::eviction::rank::RankEntry;
use criguard::quantity::format_bytes;
use criguard::signals::table::Signal;
use criguard::signals::usage::NodeUsage;
use tabwriter::TabWriter;

/// A table being written: a header, then rows, each line starting with
/// `indent`, then notes.
pub struct Table {
    tw: TabWriter<Vec<u8>>,
    indent: &'static str,
    notes: Vec<String>,
}

impl Table {
    /// A table with `header`, each line starting with `indent`.
    pub fn new(indent: &'static str, header: &[&str]) -> Self {
        let mut t = Table {
            tw: TabWriter::new(Vec::new()).padding(2),
            indent,
            notes: Vec::new(),
        };
        t.row(header.iter().map(|h| h.to_string()));
        t
    }

    /// Adds a row of `cells`.
    pub fn row(&mut self, cells: impl IntoIterator<Item = String>) {
        let cells: Vec<String> = cells.into_iter().collect();
        // Writing to a Vec cannot fail.
        let _ = writeln!(self.tw, "{}{}", self.indent, cells.join("\t"));
    }

    /// Adds a line printed under the table: a line without cells between
    /// rows would split the columns in two.
    pub fn note(&mut self, line: String) {
        self.notes.push(line);
    }

    /// The table's text.
    pub fn finish(self) -> String {
        let bytes = self.tw.into_inner().unwrap_or_default();
        let mut out = String::from_utf8_lossy(&bytes).into_owned();
        for n in self.notes {
            out.push_str(&n);
            out.push('\n');
        }
        out
    }
}

/// The ranking as a table: one line per pod and signal, first victim first,
/// with each pod's memory stall (PSI `some avg10` of its cgroup, v2).
pub fn rank_table(entries: &[RankEntry]) -> String {
    let mut t = Table::new(
        "",
        &[
            "SIGNAL", "RANK", "POD", "QOS", "PRIORITY", "USAGE", "REQUEST", "STALL",
        ],
    );
    for e in entries {
        let bytes = Signal::parse(&e.signal).is_some_and(|s| s.ranks_bytes());
        let show = |v: i64| {
            if bytes {
                format_bytes(v.max(0) as u64)
            } else {
                v.to_string()
            }
        };
        t.row([
            e.signal.clone(),
            e.rank.to_string(),
            e.pod.clone(),
            e.qos.clone(),
            e.priority.to_string(),
            e.usage.map_or("?".to_owned(), show),
            show(e.request),
            e.stall
                .map_or("-".to_owned(), |bp| format!("{:.1}%", bp as f64 / 100.0)),
        ]);
    }
    t.finish()
}

/// Per-pod usage as a table for people: one line per pod, then the node's
/// filesystems and image store.
pub fn usage_table(u: &NodeUsage) -> String {
    use std::fmt::Write;
    let mut t = Table::new(
        "",
        &[
            "NAMESPACE/POD",
            "ROOTFS",
            "INODES",
            "LOGS",
            "INODES",
            "VOLUMES",
            "INODES",
            "PROCS",
        ],
    );
    for p in &u.pods {
        t.row([
            format!("{}/{}", p.namespace, p.name),
            format_bytes(p.rootfs.bytes),
            p.rootfs.inodes.to_string(),
            format_bytes(p.logs.bytes),
            p.logs.inodes.to_string(),
            format_bytes(p.volumes.bytes),
            p.volumes.inodes.to_string(),
            p.processes.map_or("-".into(), |n| n.to_string()),
        ]);
        for e in &p.errors {
            t.note(format!("{}/{} not read: {e}", p.namespace, p.name));
        }
    }
    let mut out = t.finish();
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
