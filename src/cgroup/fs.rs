//! Memory usage of a cgroup, cgroup v1 or v2, read from cgroupfs.
//!
//! Working set is the kubelet's measure (`usage − inactive_file`, cAdvisor's
//! `container_memory_working_set_bytes`): v1 `memory.usage_in_bytes` minus
//! `total_inactive_file` of `memory.stat`; v2 `memory.current` minus
//! `inactive_file`. The layout is detected per root: a v2 (unified) root has
//! `cgroup.controllers`; a v1 root has one directory per controller and
//! memory lives under `memory/`.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::path::{self as cgroup_path, Controller};
use super::{ReadError, read};

pub use super::path::Layout;

/// Memory figures of one cgroup, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    /// Total usage (page cache included).
    pub usage: u64,
    /// `usage − inactive_file`, floored at 0.
    pub working_set: u64,
    /// The hard limit, `None` when unlimited.
    pub limit: Option<u64>,
}

/// A cgroup hierarchy at a root.
#[derive(Clone, Debug)]
pub struct CgroupFs {
    root: PathBuf,
    layout: Layout,
}

/// v1 reports "no limit" as a huge page-aligned number; anything above this is unlimited.
const V1_UNLIMITED: u64 = 1 << 62;

/// A value of a `key value` line in `memory.stat`.
pub fn stat_value(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

fn parse_u64(path: &Path, text: &str) -> Result<u64, ReadError> {
    text.trim().parse().map_err(|_| ReadError {
        path: path.to_owned(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not a number: {:?}", text.trim()),
        ),
    })
}

/// One cgroup file held open and read again with `pread(2)` at offset 0,
/// which makes the kernel generate it afresh: one system call a reading,
/// where opening it by path each time costs a lookup of every directory on
/// the way (most of the cost of reading a small cgroup file).
#[derive(Debug)]
pub struct CgroupFile {
    file: File,
    path: PathBuf,
}

impl CgroupFile {
    /// Opens `path` for reading.
    pub fn open(path: PathBuf) -> Result<Self, ReadError> {
        match File::open(&path) {
            Ok(file) => Ok(Self { file, path }),
            Err(source) => Err(ReadError { path, source }),
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's text now (cgroup counters and limits: a few bytes). A
    /// removed cgroup's file reads as an error (`ENODEV`).
    pub fn read(&self) -> Result<String, ReadError> {
        let mut buf = [0u8; 64];
        let n = self.file.read_at(&mut buf, 0).map_err(|source| ReadError {
            path: self.path.clone(),
            source,
        })?;
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    }

    /// The file's number now (`max`: `None`, as a v2 limit says "no limit").
    pub fn number(&self) -> Result<Option<u64>, ReadError> {
        match self.read()?.trim() {
            "max" => Ok(None),
            t => parse_u64(&self.path, t).map(Some),
        }
    }
}

impl CgroupFs {
    /// The hierarchy at `root` (normally `/sys/fs/cgroup`), layout detected.
    pub fn detect(root: &Path) -> Self {
        let layout = if root.join("cgroup.controllers").exists() {
            Layout::V2
        } else {
            Layout::V1
        };
        Self {
            root: root.to_owned(),
            layout,
        }
    }

    /// The layout in use.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The directory of `cgroup` (a path from the root, see
    /// [`cgroup_path`]) for `controller`.
    pub fn dir(&self, controller: Controller, cgroup: &str) -> PathBuf {
        cgroup_path::dir(&self.root, self.layout, controller, cgroup)
    }

    /// The pods' cgroup named `name` on this node: the first of
    /// [`cgroup_path::kubepods_candidates`] whose memory directory exists,
    /// else the first. Checked at each reading, so a kubelet that creates
    /// it after criguard started is found.
    pub fn kubepods_in(&self, name: &str) -> String {
        let mut candidates = cgroup_path::kubepods_candidates(name);
        let found = candidates
            .iter()
            .position(|c| self.dir(Controller::Memory, c).is_dir())
            .unwrap_or(0);
        candidates.swap_remove(found)
    }

    /// The directory of `cgroup` (a path like `/kubepods/burstable/pod…`) for memory.
    pub fn memory_dir(&self, cgroup: &str) -> PathBuf {
        self.dir(Controller::Memory, cgroup)
    }

    /// Usage, working set and limit of `cgroup`.
    pub fn memory(&self, cgroup: &str) -> Result<MemoryUsage, ReadError> {
        let dir = self.memory_dir(cgroup);
        let (usage_file, limit_file, inactive_key) = match self.layout {
            Layout::V1 => (
                "memory.usage_in_bytes",
                "memory.limit_in_bytes",
                "total_inactive_file",
            ),
            Layout::V2 => ("memory.current", "memory.max", "inactive_file"),
        };
        let usage_path = dir.join(usage_file);
        let usage = match read(&usage_path) {
            Ok(text) => parse_u64(&usage_path, &text)?,
            // The v2 root has no memory.current nor memory.max: its usage
            // is anon + file from its memory.stat, as runc (and so the
            // kubelet's cAdvisor) reads it, and it has no limit.
            Err(e) if is_root_v2(self.layout, cgroup, &e) => {
                let stat = read(&dir.join("memory.stat"))?;
                let usage =
                    stat_value(&stat, "anon").unwrap_or(0) + stat_value(&stat, "file").unwrap_or(0);
                let inactive = stat_value(&stat, inactive_key).unwrap_or(0);
                return Ok(MemoryUsage {
                    usage,
                    working_set: usage.saturating_sub(inactive),
                    limit: None,
                });
            }
            Err(e) => return Err(e),
        };
        let stat = read(&dir.join("memory.stat"))?;
        let inactive = stat_value(&stat, inactive_key).unwrap_or(0);
        let limit_path = dir.join(limit_file);
        let limit_text = read(&limit_path)?;
        let limit = match limit_text.trim() {
            "max" => None,
            t => Some(parse_u64(&limit_path, t)?).filter(|l| *l < V1_UNLIMITED),
        };
        Ok(MemoryUsage {
            usage,
            working_set: usage.saturating_sub(inactive),
            limit,
        })
    }

    /// `cgroup`'s usage counter (v1 `memory.usage_in_bytes`, v2
    /// `memory.current`), held open for cheap readings.
    pub fn usage_file(&self, cgroup: &str) -> Result<CgroupFile, ReadError> {
        let file = match self.layout {
            Layout::V1 => "memory.usage_in_bytes",
            Layout::V2 => "memory.current",
        };
        CgroupFile::open(self.memory_dir(cgroup).join(file))
    }

    /// `cgroup`'s memory limit file (v1 `memory.limit_in_bytes`, v2
    /// `memory.max`), held open; read it with [`limit_of`].
    pub fn limit_file(&self, cgroup: &str) -> Result<CgroupFile, ReadError> {
        CgroupFile::open(self.limit_file_path(cgroup))
    }

    /// The path of `cgroup`'s memory limit file.
    pub fn limit_file_path(&self, cgroup: &str) -> PathBuf {
        let file = match self.layout {
            Layout::V1 => "memory.limit_in_bytes",
            Layout::V2 => "memory.max",
        };
        self.memory_dir(cgroup).join(file)
    }

    /// The working set of `cgroup` (`usage − inactive_file`): two files
    /// read, where [`CgroupFs::memory`] reads the limit too.
    pub fn working_set(&self, cgroup: &str) -> Result<u64, ReadError> {
        let file = match self.layout {
            Layout::V1 => "memory.usage_in_bytes",
            Layout::V2 => "memory.current",
        };
        let path = self.memory_dir(cgroup).join(file);
        let usage = parse_u64(&path, &read(&path)?)?;
        self.working_set_from(cgroup, usage)
    }

    /// The working set of `cgroup` whose usage was just read as `usage`:
    /// `usage − inactive_file` from its `memory.stat` (the one file read).
    pub fn working_set_from(&self, cgroup: &str, usage: u64) -> Result<u64, ReadError> {
        let key = match self.layout {
            Layout::V1 => "total_inactive_file",
            Layout::V2 => "inactive_file",
        };
        let stat = read(&self.memory_dir(cgroup).join("memory.stat"))?;
        Ok(usage.saturating_sub(stat_value(&stat, key).unwrap_or(0)))
    }

    /// `cgroup`'s memory stall: `some avg10` of its v2 `memory.pressure`, in
    /// basis points of time; v1 has no PSI per cgroup (an error).
    pub fn memory_stall(&self, cgroup: &str) -> Result<u64, ReadError> {
        let path = self.memory_dir(cgroup).join("memory.pressure");
        let unsupported = |path: PathBuf, why: &str| ReadError {
            path,
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_owned()),
        };
        match self.layout {
            Layout::V1 => Err(unsupported(path, "no PSI per cgroup on cgroup v1")),
            Layout::V2 => {
                let text = read(&path)?;
                psi_avg10(&text, "some").ok_or_else(|| unsupported(path, &text))
            }
        }
    }

    /// Swap `cgroup` uses: v2 `memory.swap.current`; v1 has no swap of its
    /// own to read (the kubelet gives pods no swap there), an error.
    pub fn swap_current(&self, cgroup: &str) -> Result<u64, ReadError> {
        let path = self.memory_dir(cgroup).join("memory.swap.current");
        match self.layout {
            Layout::V2 => parse_u64(&path, read(&path)?.trim()),
            Layout::V1 => Err(ReadError {
                path,
                source: std::io::Error::new(
                    std::io::ErrorKind::Unsupported,
                    "no swap accounting per cgroup on cgroup v1",
                ),
            }),
        }
    }

    /// The kernel's count of processes its OOM killer took from `cgroup`:
    /// `oom_kill` of v1 `memory.oom_control` (counted in the victim's own
    /// cgroup only) or of v2 `memory.events` (the cgroup and below).
    pub fn oom_kills(&self, cgroup: &str) -> Result<u64, ReadError> {
        let file = match self.layout {
            Layout::V1 => "memory.oom_control",
            Layout::V2 => "memory.events",
        };
        let path = self.memory_dir(cgroup).join(file);
        let text = read(&path)?;
        stat_value(&text, "oom_kill").ok_or_else(|| ReadError {
            path,
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "no oom_kill line (kernel before 4.13?)",
            ),
        })
    }

    /// `pids.current` (tasks, threads included) and `pids.max` (None:
    /// unlimited) of `cgroup`, from the pids controller.
    pub fn pids_counter(&self, cgroup: &str) -> Result<(u64, Option<u64>), ReadError> {
        let dir = self.dir(Controller::Pids, cgroup);
        let cur_path = dir.join("pids.current");
        let current = parse_u64(&cur_path, read(&cur_path)?.trim())?;
        let max_path = dir.join("pids.max");
        let max = match read(&max_path)?.trim() {
            "max" => None,
            t => Some(parse_u64(&max_path, t)?),
        };
        Ok((current, max))
    }

    /// `pids.current` (tasks, threads included) of `cgroup`: one file, for
    /// ranking, where [`CgroupFs::pids_counter`] reads the limit too.
    pub fn pids_current(&self, cgroup: &str) -> Result<u64, ReadError> {
        let path = self.dir(Controller::Pids, cgroup).join("pids.current");
        parse_u64(&path, read(&path)?.trim())
    }

    /// The pids in `cgroup` and its descendants (memory hierarchy). A
    /// descendant removed while it is read (a container exiting) is skipped;
    /// only an unreadable `cgroup` itself is an error.
    pub fn pids(&self, cgroup: &str) -> Result<Vec<i32>, ReadError> {
        let mut out = Vec::new();
        let top = self.memory_dir(cgroup);
        let mut dirs = vec![top.clone()];
        while let Some(dir) = dirs.pop() {
            let procs = match read(&dir.join("cgroup.procs")) {
                Ok(p) => p,
                Err(e) if dir != top && e.source.kind() == std::io::ErrorKind::NotFound => {
                    continue;
                }
                Err(e) => return Err(e),
            };
            out.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            if let Ok(entries) = std::fs::read_dir(&dir) {
                dirs.extend(
                    entries
                        .flatten()
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| e.path()),
                );
            }
        }
        Ok(out)
    }
}

/// `avg10` of a PSI file's `line` (`some` or `full`), in basis points of
/// time.
pub fn psi_avg10(text: &str, line: &str) -> Option<u64> {
    let avg = text
        .lines()
        .find_map(|l| l.strip_prefix(line)?.strip_prefix(' '))?
        .split_whitespace()
        .find_map(|f| f.strip_prefix("avg10="))?;
    let pct: f64 = avg.parse().ok()?;
    (0.0..=100.0)
        .contains(&pct)
        .then(|| (pct * 100.0).round() as u64)
}

/// Whether `e` is the v2 root's missing `memory.current`.
fn is_root_v2(layout: Layout, cgroup: &str, e: &ReadError) -> bool {
    layout == Layout::V2
        && cgroup.trim_matches('/').is_empty()
        && e.source.kind() == std::io::ErrorKind::NotFound
}

/// A memory limit as its file says it: `None` when unlimited (v2 `max`,
/// v1's huge page-aligned number).
pub fn limit_of(file: &CgroupFile) -> Result<Option<u64>, ReadError> {
    Ok(file.number()?.filter(|l| *l < V1_UNLIMITED))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::cgroup::write_fixture as write;

    #[test]
    fn the_v2_root_has_no_memory_current_and_counts_anon_plus_file() {
        // As on a real v2 host: the root cgroup has memory.stat only.
        let t = tempfile::tempdir().unwrap();
        write(t.path(), "cgroup.controllers", "cpu memory pids\n");
        write(
            t.path(),
            "memory.stat",
            "anon 300000000\nfile 200000000\ninactive_file 50000000\n",
        );
        let fs = CgroupFs::detect(t.path());
        let want = MemoryUsage {
            usage: 500000000,
            working_set: 450000000,
            limit: None,
        };
        assert_eq!(fs.memory("/").unwrap(), want);
        assert_eq!(fs.memory("").unwrap(), want);
        // Any other cgroup without memory.current is an error still.
        write(t.path(), "kubepods/memory.stat", "anon 1\n");
        assert!(fs.memory("/kubepods").is_err());
    }

    #[test]
    fn v2_working_set_is_current_minus_inactive_file() {
        let t = tempfile::tempdir().unwrap();
        write(t.path(), "cgroup.controllers", "cpu memory pids\n");
        write(t.path(), "kubepods/podA/memory.current", "104857600\n");
        write(
            t.path(),
            "kubepods/podA/memory.stat",
            "anon 50000000\nfile 54857600\ninactive_file 4857600\nactive_file 50000000\n",
        );
        write(t.path(), "kubepods/podA/memory.max", "max\n");
        let fs = CgroupFs::detect(t.path());
        assert_eq!(fs.layout(), Layout::V2);
        let m = fs.memory("/kubepods/podA").unwrap();
        assert_eq!(
            m,
            MemoryUsage {
                usage: 104857600,
                working_set: 100000000,
                limit: None
            }
        );
    }

    #[test]
    fn v1_reads_the_memory_hierarchy_and_treats_huge_limits_as_none() {
        let t = tempfile::tempdir().unwrap();
        write(t.path(), "memory/kubepods/memory.usage_in_bytes", "2000\n");
        write(
            t.path(),
            "memory/kubepods/memory.stat",
            "cache 1500\nrss 500\ninactive_file 9\ntotal_inactive_file 700\n",
        );
        write(
            t.path(),
            "memory/kubepods/memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        write(t.path(), "memory/kubepods/cgroup.procs", "11\n12\n");
        write(t.path(), "memory/kubepods/pod1/cgroup.procs", "13\n");
        let fs = CgroupFs::detect(t.path());
        assert_eq!(fs.layout(), Layout::V1);
        let m = fs.memory("/kubepods").unwrap();
        assert_eq!(
            m,
            MemoryUsage {
                usage: 2000,
                working_set: 1300,
                limit: None
            }
        );
        let mut pids = fs.pids("/kubepods").unwrap();
        pids.sort();
        assert_eq!(pids, [11, 12, 13]);
    }

    #[test]
    fn a_pods_memory_stall_is_its_v2_psi_some_avg10() {
        let v2 = tempfile::tempdir().unwrap();
        write(v2.path(), "cgroup.controllers", "memory\n");
        write(
            v2.path(),
            "kubepods/pod1/memory.pressure",
            "some avg10=3.25 avg60=1.00 avg300=0.10 total=9\nfull avg10=1.00 avg60=0.00 avg300=0.00 total=1\n",
        );
        let fs = CgroupFs::detect(v2.path());
        assert_eq!(fs.memory_stall("/kubepods/pod1").unwrap(), 325);
        assert_eq!(
            psi_avg10("full avg10=100.00 avg60=0\n", "full"),
            Some(10_000)
        );
        assert_eq!(psi_avg10("full avg10=100.01\n", "full"), None);
        assert_eq!(psi_avg10("someone avg10=1.00\n", "some"), None);
        let v1 = tempfile::tempdir().unwrap();
        write(
            v1.path(),
            "memory/kubepods/pod1/memory.usage_in_bytes",
            "1\n",
        );
        assert!(
            CgroupFs::detect(v1.path())
                .memory_stall("/kubepods/pod1")
                .is_err()
        );
    }

    #[test]
    fn swap_is_read_on_v2_and_refused_on_v1() {
        let v2 = tempfile::tempdir().unwrap();
        write(v2.path(), "cgroup.controllers", "memory\n");
        write(v2.path(), "kubepods/pod1/memory.swap.current", "4096\n");
        let fs = CgroupFs::detect(v2.path());
        assert_eq!(fs.swap_current("/kubepods/pod1").unwrap(), 4096);
        assert!(fs.swap_current("/kubepods/pod2").is_err());
        let v1 = tempfile::tempdir().unwrap();
        write(
            v1.path(),
            "memory/kubepods/pod1/memory.usage_in_bytes",
            "1\n",
        );
        let err = CgroupFs::detect(v1.path())
            .swap_current("/kubepods/pod1")
            .unwrap_err();
        assert_eq!(err.source.kind(), std::io::ErrorKind::Unsupported);
    }

    #[test]
    fn oom_kill_counters_in_both_layouts() {
        let v1 = tempfile::tempdir().unwrap();
        write(
            v1.path(),
            "memory/kubepods/pod1/c1/memory.oom_control",
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        );
        let fs = CgroupFs::detect(v1.path());
        assert_eq!(fs.oom_kills("/kubepods/pod1/c1").unwrap(), 2);
        let v2 = tempfile::tempdir().unwrap();
        write(v2.path(), "cgroup.controllers", "memory\n");
        write(
            v2.path(),
            "kubepods/pod1/c1/memory.events",
            "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\noom_group_kill 0\n",
        );
        assert_eq!(
            CgroupFs::detect(v2.path())
                .oom_kills("/kubepods/pod1/c1")
                .unwrap(),
            1
        );
        // An old kernel without the counter: an error naming the file.
        write(
            v1.path(),
            "memory/old/memory.oom_control",
            "oom_kill_disable 0\nunder_oom 0\n",
        );
        let err = fs.oom_kills("/old").unwrap_err();
        assert!(err.to_string().contains("memory.oom_control"), "{err}");
    }

    #[test]
    fn a_held_file_reads_its_value_now_and_a_gone_one_names_itself() {
        let t = tempfile::tempdir().unwrap();
        write(t.path(), "memory/p/memory.usage_in_bytes", "2000\n");
        write(
            t.path(),
            "memory/p/memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        write(
            t.path(),
            "memory/p/memory.stat",
            "total_inactive_file 500\n",
        );
        let fs = CgroupFs::detect(t.path());
        let usage = fs.usage_file("/p").unwrap();
        assert_eq!(usage.number().unwrap(), Some(2000));
        write(t.path(), "memory/p/memory.usage_in_bytes", "31\n");
        assert_eq!(usage.number().unwrap(), Some(31), "read afresh, not cached");
        assert_eq!(limit_of(&fs.limit_file("/p").unwrap()).unwrap(), None);
        assert_eq!(fs.working_set_from("/p", 2000).unwrap(), 1500);
        assert_eq!(fs.working_set("/p").unwrap(), 0, "31 − 500 floors at 0");
        let err = fs.usage_file("/gone").unwrap_err();
        assert!(
            err.to_string().contains("gone/memory.usage_in_bytes"),
            "{err}"
        );
    }

    #[test]
    fn errors_name_the_file() {
        let t = tempfile::tempdir().unwrap();
        write(t.path(), "memory/x/memory.usage_in_bytes", "lots\n");
        let err = CgroupFs::detect(t.path()).memory("/x").unwrap_err();
        assert!(
            err.to_string().contains("memory.usage_in_bytes") && err.to_string().contains("lots"),
            "{err}"
        );
        let err = CgroupFs::detect(t.path()).memory("/missing").unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
    }
}
