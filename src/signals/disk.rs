//! Disk usage of a directory tree, the way `du -x` and containerd count it.
//!
//! Bytes are allocated blocks (`st_blocks × 512`), not file lengths, so a
//! sparse file counts what it really takes and a directory counts its own
//! blocks. Every inode counts once: a file with several hard links inside
//! the tree is counted at its first name only. The walk stays on the
//! filesystem of its root, like `du -x`: a mount point below the root (a
//! tmpfs, a bind mount) is neither counted nor entered.
//!
//! Trees change while they are walked (a container writes, the kubelet
//! rotates a log), so an entry that vanishes between being listed and being
//! read is skipped, not an error; so is one that cannot be read for another
//! reason, counted in [`Walk::skipped`]. Only a root that cannot be read is an
//! error. The walk keeps an explicit stack of directories, reads each fully
//! before going on, and holds one directory open at a time.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Space and inodes a tree takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskUsage {
    /// Allocated bytes (`st_blocks × 512`), each inode once.
    pub bytes: u64,
    /// Inodes, the root included, each once.
    pub inodes: u64,
}

impl DiskUsage {
    /// This usage when `counted`, else nothing.
    pub fn only(self, counted: bool) -> DiskUsage {
        if counted { self } else { DiskUsage::default() }
    }
}

impl std::ops::Add for DiskUsage {
    type Output = DiskUsage;
    fn add(self, o: DiskUsage) -> DiskUsage {
        DiskUsage {
            bytes: self.bytes + o.bytes,
            inodes: self.inodes + o.inodes,
        }
    }
}

impl std::ops::AddAssign for DiskUsage {
    fn add_assign(&mut self, o: DiskUsage) {
        *self = *self + o;
    }
}

impl std::iter::Sum for DiskUsage {
    fn sum<I: Iterator<Item = DiskUsage>>(iter: I) -> DiskUsage {
        iter.fold(DiskUsage::default(), |a, b| a + b)
    }
}

/// What a walk found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Walk {
    /// The usage of everything read.
    pub usage: DiskUsage,
    /// Entries that could not be read for a reason other than having
    /// vanished (permissions, I/O errors): left out of `usage`.
    pub skipped: u64,
    /// Entries listed that were gone when read (deleted meanwhile).
    pub vanished: u64,
}

/// The root of a walk could not be read.
#[derive(Debug, thiserror::Error)]
#[error("walk {path}: {source}")]
pub struct WalkError {
    /// The root.
    pub path: PathBuf,
    /// The error.
    pub source: std::io::Error,
}

impl WalkError {
    /// True when the root does not exist (nothing to count).
    pub fn is_not_found(&self) -> bool {
        self.source.kind() == std::io::ErrorKind::NotFound
    }
}

/// Walks `root` on its own filesystem (see the module docs).
pub fn walk(root: &Path) -> Result<Walk, WalkError> {
    let meta = std::fs::symlink_metadata(root).map_err(|source| WalkError {
        path: root.to_owned(),
        source,
    })?;
    Ok(walk_from(root, &meta, meta.dev()))
}

/// Walks `root`, counting only what lies on filesystem `device` (an
/// `st_dev`): a root on another filesystem counts nothing. Used where the
/// filesystem that matters is the parent's, as for emptyDir volumes, some of
/// which are tmpfs mounts that take no disk.
pub fn walk_on(root: &Path, device: u64) -> Result<Walk, WalkError> {
    let meta = std::fs::symlink_metadata(root).map_err(|source| WalkError {
        path: root.to_owned(),
        source,
    })?;
    if meta.dev() != device {
        return Ok(Walk::default());
    }
    Ok(walk_from(root, &meta, device))
}

/// The `st_dev` of the filesystem holding `path`.
pub fn device_of(path: &Path) -> Result<u64, WalkError> {
    std::fs::symlink_metadata(path)
        .map(|m| m.dev())
        .map_err(|source| WalkError {
            path: path.to_owned(),
            source,
        })
}

/// True when `imagefs` is on a filesystem of its own, not the one holding
/// `nodefs` (symlinks followed, as `statvfs` follows them); false when
/// either cannot be read.
pub fn dedicated_imagefs(nodefs: &Path, imagefs: &Path) -> bool {
    match (std::fs::metadata(nodefs), std::fs::metadata(imagefs)) {
        (Ok(n), Ok(i)) => n.dev() != i.dev(),
        _ => false,
    }
}

/// Counts one inode unless a hard link to it was counted already.
struct Counter {
    usage: DiskUsage,
    skipped: u64,
    vanished: u64,
    linked: HashSet<(u64, u64)>,
}

impl Counter {
    fn count(&mut self, meta: &std::fs::Metadata) {
        // Only multiply-linked non-directories can be met twice; remembering
        // just those keeps the set small (du does the same).
        if !meta.is_dir() && meta.nlink() > 1 && !self.linked.insert((meta.dev(), meta.ino())) {
            return;
        }
        self.usage.bytes += meta.blocks() * 512;
        self.usage.inodes += 1;
    }
}

fn walk_from(root: &Path, meta: &std::fs::Metadata, device: u64) -> Walk {
    let mut c = Counter {
        usage: DiskUsage::default(),
        skipped: 0,
        vanished: 0,
        linked: HashSet::new(),
    };
    c.count(meta);
    let mut dirs = Vec::new();
    if meta.is_dir() {
        dirs.push(root.to_owned());
    }
    while let Some(dir) = dirs.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) => {
                skip(&mut c, &dir, &e);
                continue;
            }
        };
        for entry in entries {
            let entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    skip(&mut c, &dir, &e);
                    break;
                }
            };
            // fstatat relative to the open directory, not following links.
            let meta = match entry.metadata() {
                Ok(m) => m,
                Err(e) => {
                    skip(&mut c, &entry.path(), &e);
                    continue;
                }
            };
            if meta.dev() != device {
                continue;
            }
            c.count(&meta);
            if meta.is_dir() {
                dirs.push(entry.path());
            }
        }
    }
    Walk {
        usage: c.usage,
        skipped: c.skipped,
        vanished: c.vanished,
    }
}

fn skip(c: &mut Counter, path: &Path, e: &std::io::Error) {
    if e.kind() == std::io::ErrorKind::NotFound {
        c.vanished += 1;
    } else {
        c.skipped += 1;
        tracing::debug!(path = %path.display(), err = %e, "disk usage: entry not counted");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// `du -s -B1 -x` and `du -s -x --inodes` of `p`: the independent reading.
    fn du(p: &Path) -> DiskUsage {
        let num = |args: &[&str]| -> u64 {
            let out = Command::new("du").args(args).arg(p).output().unwrap();
            assert!(out.status.success(), "du {args:?} {}", p.display());
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap()
        };
        DiskUsage {
            bytes: num(&["-s", "-x", "-B1"]),
            inodes: num(&["-s", "-x", "--inodes"]),
        }
    }

    fn tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("a/b/c")).unwrap();
        std::fs::write(t.path().join("a/one"), vec![7u8; 10_000]).unwrap();
        std::fs::write(t.path().join("a/b/two"), vec![7u8; 100_000]).unwrap();
        std::fs::write(t.path().join("a/b/c/three"), b"x").unwrap();
        std::os::unix::fs::symlink("one", t.path().join("a/link")).unwrap();
        t
    }

    #[test]
    fn agrees_with_du_on_a_plain_tree() {
        let t = tree();
        let w = walk(t.path()).unwrap();
        assert_eq!(w.usage, du(t.path()));
        assert_eq!(w.usage.inodes, 8, "root, a, b, c, one, two, three, link");
        assert_eq!(w.skipped, 0);
    }

    #[test]
    fn hard_links_count_once() {
        let t = tree();
        let before = walk(t.path()).unwrap().usage;
        std::fs::hard_link(t.path().join("a/b/two"), t.path().join("two-again")).unwrap();
        std::fs::hard_link(t.path().join("a/b/two"), t.path().join("a/two-thrice")).unwrap();
        let after = walk(t.path()).unwrap().usage;
        assert_eq!(after, before, "new names, no new inodes or blocks");
        assert_eq!(after, du(t.path()));
    }

    #[test]
    fn sparse_files_count_allocated_blocks() {
        let t = tempfile::tempdir().unwrap();
        let f = std::fs::File::create(t.path().join("sparse")).unwrap();
        f.set_len(64 << 20).unwrap();
        let w = walk(t.path()).unwrap().usage;
        assert!(w.bytes < 1 << 20, "a 64 MiB hole takes no blocks: {w:?}");
        assert_eq!(w, du(t.path()));
    }

    #[test]
    fn a_missing_root_is_an_error_naming_it() {
        let t = tempfile::tempdir().unwrap();
        let gone = t.path().join("gone");
        let err = walk(&gone).unwrap_err();
        assert!(err.is_not_found());
        assert!(err.to_string().contains("gone"), "{err}");
    }

    #[test]
    fn files_vanishing_mid_walk_are_not_errors() {
        // One thread keeps creating and deleting files and directories while
        // the walk runs again and again, until some walk met an entry that
        // vanished: every walk succeeds, skips nothing else and counts no
        // more than the tree could ever hold.
        let t = tree();
        let churn = t.path().join("churn");
        std::fs::create_dir(&churn).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (churn, stop) = (churn.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let d = churn.join(format!("d{}", i % 8));
                    let _ = std::fs::create_dir_all(d.join("sub"));
                    let _ = std::fs::write(d.join("sub/f"), b"data");
                    let _ = std::fs::remove_dir_all(churn.join(format!("d{}", (i + 4) % 8)));
                    i += 1;
                }
            })
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut vanished = 0;
        while vanished == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "no entry vanished mid-walk in 30 s"
            );
            let w = walk(t.path()).expect("a churning tree still walks");
            assert_eq!(w.skipped, 0, "vanished entries are not skips");
            assert!(w.usage.inodes >= 9 && w.usage.inodes <= 9 + 8 * 3);
            vanished += w.vanished;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().unwrap();
    }

    #[test]
    fn a_mount_below_the_root_is_not_crossed() {
        // Needs root to mount; skipped (with a note) otherwise.
        if !nix::unistd::geteuid().is_root() {
            eprintln!("not root: mount test skipped");
            return;
        }
        let t = tree();
        let before = walk(t.path()).unwrap().usage;
        let mnt = t.path().join("a/mnt");
        std::fs::create_dir(&mnt).unwrap();
        let with_dir = walk(t.path()).unwrap().usage;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=8m", "criguard-walk-test"])
            .arg(&mnt)
            .status()
            .unwrap();
        assert!(ok.success());
        // Unmount whatever happens below.
        struct Unmount(PathBuf);
        impl Drop for Unmount {
            fn drop(&mut self) {
                let _ = Command::new("umount").arg(&self.0).status();
            }
        }
        let _u = Unmount(mnt.clone());
        std::fs::write(mnt.join("big"), vec![1u8; 4 << 20]).unwrap();
        let w = walk(t.path()).unwrap().usage;
        assert_eq!(w, before, "the mount point and its contents are skipped");
        assert_eq!(w, du(t.path()), "as du -x skips them");
        assert!(with_dir.inodes == before.inodes + 1);
        // Walking the mount itself counts it; walking it on the parent's
        // filesystem counts nothing.
        assert!(walk(&mnt).unwrap().usage.bytes >= 4 << 20);
        let parent = device_of(t.path()).unwrap();
        assert_eq!(walk_on(&mnt, parent).unwrap().usage, DiskUsage::default());
    }
}
