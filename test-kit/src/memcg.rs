//! Cgroups made by a test (a v1 memcg, a v2 cgroup in the unified
//! hierarchy) and processes placed in them: on drop, the processes are
//! killed by PID and the directory removed.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use super::containerd::unique;

/// The v1 memory hierarchy.
pub const MEMORY: &str = "/sys/fs/cgroup/memory";
/// The v2 (unified) hierarchy of a hybrid host.
pub const UNIFIED: &str = "/sys/fs/cgroup/unified";

/// A fresh cgroup `<hierarchy>/<prefix>-<unique>`.
pub struct TestCgroup {
    /// Its directory.
    pub dir: PathBuf,
}

impl TestCgroup {
    /// Creates it; panics when the hierarchy is missing or not writable.
    pub fn create(hierarchy: &str, prefix: &str) -> Self {
        let dir = Path::new(hierarchy).join(unique(prefix));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        Self { dir }
    }

    /// The cgroup's path below its hierarchy, e.g. `/criguard-ev-12-ab`.
    pub fn name(&self) -> String {
        format!("/{}", self.dir.file_name().unwrap().to_str().unwrap())
    }

    /// One of its files.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// A file holding one number.
    pub fn read_u64(&self, name: &str) -> u64 {
        let p = self.file(name);
        let t = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        t.trim().parse().unwrap()
    }

    /// Writes a control file.
    pub fn write(&self, name: &str, value: &str) {
        let p = self.file(name);
        std::fs::write(&p, value).unwrap_or_else(|e| panic!("{} <- {value}: {e}", p.display()));
    }

    /// The pids in it now.
    pub fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.file("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // Only processes this test put here can be in it.
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            for pid in self.pids() {
                // A pid read from our own cgroup.
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            match std::fs::remove_dir(&self.dir) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(e) if Instant::now() > end => {
                    eprintln!("could not remove {}: {e}", self.dir.display());
                    return;
                }
                // Killed processes leave the cgroup when they are reaped.
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

/// A `sh -c` script that first moves itself into each of `cgroups`.
pub fn in_cgroups(cgroups: &[&TestCgroup], script: &str) -> Command {
    let mut join = String::new();
    for c in cgroups {
        join.push_str(&format!(
            "echo $$ > {} && ",
            c.file("cgroup.procs").display()
        ));
    }
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(format!("{join}{script}"));
    cmd
}

/// A child process killed by PID (and reaped) on drop.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A shell in a memcg that grows its heap on request, 1 MiB per variable,
/// using shell builtins only (no fork, so nothing but the growth is charged),
/// and allocates nothing while it waits for the next request.
pub struct Filler {
    proc: Proc,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

const FILLER: &str = "c=x; i=0; while [ $i -lt 20 ]; do c=$c$c; i=$((i+1)); done; n=0; echo ready; \
     while read want; do while [ $n -lt $want ]; do n=$((n+1)); eval \"v$n=\\$c\"; done; echo $n; done";

impl Filler {
    /// Starts one in `cgroups` and waits until it holds its 1 MiB seed.
    pub fn start(cgroups: &[&TestCgroup]) -> Self {
        let mut child = in_cgroups(cgroups, FILLER)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn sh");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut me = Self {
            proc: Proc(child),
            stdin,
            stdout,
        };
        assert_eq!(me.reply(), "ready");
        me
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.proc.0.id()
    }

    fn reply(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().to_owned()
    }

    /// Grows to `mib` MiB of variables (it never shrinks) and returns once
    /// they are all written.
    pub fn grow_to(&mut self, mib: u64) {
        writeln!(self.stdin, "{mib}").unwrap();
        let got = self.reply();
        assert!(
            got.parse::<u64>().unwrap() >= mib,
            "filler answered {got:?}"
        );
    }
}

/// Makes `path` (below each hierarchy's root, e.g. `/criguard-kube-…/kubepods`)
/// with cgroups-rs, in the memory controller limited to `memory_bytes` and
/// in the pids controller limited to `pids_max`, whichever is given. Each
/// limit is read back from its file: cgroups-rs ignores a failed memory
/// write. The caller removes the tree (e.g. with `pods::CgroupRoot`).
pub fn limited(path: &str, memory_bytes: Option<i64>, pids_max: Option<i64>) {
    use cgroups_rs::fs::{MaxValue, cgroup_builder::CgroupBuilder, hierarchies};
    let hier = hierarchies::auto();
    let v2 = hier.v2();
    let root = hier.root();
    // cgroups-rs joins the name onto each controller's mount: relative.
    let mut b = CgroupBuilder::new(path.trim_start_matches('/'));
    let mut controllers = Vec::new();
    let mut expect = Vec::new();
    if let Some(m) = memory_bytes {
        b = b.memory().memory_hard_limit(m).done();
        controllers.push("memory".to_owned());
        let file = if v2 {
            "memory.max"
        } else {
            "memory/memory.limit_in_bytes"
        };
        expect.push((file, m));
    }
    if let Some(n) = pids_max {
        b = b
            .pid()
            .maximum_number_of_processes(MaxValue::Value(n))
            .done();
        controllers.push("pids".to_owned());
        expect.push((if v2 { "pids.max" } else { "pids/pids.max" }, n));
    }
    b.set_specified_controllers(controllers)
        .build(hier)
        .unwrap_or_else(|e| panic!("cgroups-rs: make {path}: {e}"));
    for (file, want) in expect {
        let (dir, name) = file.rsplit_once('/').unwrap_or(("", file));
        let p = root.join(dir).join(path.trim_start_matches('/')).join(name);
        let got = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert_eq!(got.trim(), want.to_string(), "{}", p.display());
    }
}

/// Processes left in cgroup `dir` and every cgroup below it.
pub fn procs_below(dir: &Path) -> usize {
    let own = std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| s.lines().count())
        .unwrap_or(0);
    let sub: usize = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| procs_below(&e.path()))
        .sum();
    own + sub
}
