//! The VM tier: what this host cannot show, run inside a Debian VM with
//! systemd as PID 1, cgroup v2 only (memory controller, PSI) and a root
//! holding every capability (`hack/vm.sh`).
//!
//! On the host, [`vm_tier_scenarios_pass_inside_the_vm`] boots the VM and
//! runs this same binary's ignored tests inside it, one at a time; it fails
//! when any of them fails there. Those tests (the eight scenarios: the units
//! under systemd, the systemd cgroup driver, v2 memory pressure, v2 memory
//! pressure with containerd frozen, the kubelet's real scores, the Debian
//! package installed, upgraded under load and removed, a node that swaps,
//! and a node whose page cache thrashes) reconfigure the machine they run on (containerd's
//! config, criguard's units, `kubepods.slice`), so they refuse to run
//! anywhere but in the VM (`CRIGUARD_VM_GUEST`, set by the guest's runner).
//!
//! `CRIGUARD_VM_FILTER` passes a test filter to the guest (e.g. `units`).

use criguard_test_kit as common;
mod frozen_runtime;
mod guest;
mod package;
mod pressure;
mod scores;
mod stall;
mod swap;
mod systemd_driver;
mod units;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

/// The VM's whole run (boot, six scenarios, power-off) must end within
/// this; each scenario has a watchdog of its own (`guest::Timer`).
const TIMEOUT_S: u32 = 900;

#[test]
fn vm_tier_scenarios_pass_inside_the_vm() {
    assert!(
        !guest::inside(),
        "the host-side test must not run inside the VM"
    );
    // SAFETY: geteuid has no preconditions.
    assert!(
        unsafe { libc::geteuid() } == 0,
        "the VM tier builds its image as root: run it with hack/test.sh"
    );
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/vm-<hash>: the target directory is shared too,
    // for this binary and criguard's (a no-op when it is in the repository).
    let target = exe.ancestors().nth(3).unwrap();
    let mut cmd = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/hack/vm.sh"));
    cmd.args(["run", "--timeout", &TIMEOUT_S.to_string(), "--share"])
        .arg(target)
        .arg("--")
        .arg(&exe)
        .args(["--ignored", "--test-threads=1"]);
    if let Ok(filter) = std::env::var("CRIGUARD_VM_FILTER") {
        cmd.arg(filter);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run hack/vm.sh");
    // The guest's results and timings go straight to stderr as they come
    // (not through the test harness's capture); everything is kept for the
    // failure message and in target/vm/runs/.
    let mut all = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if line.starts_with("test ") || line.starts_with("vm-tier:") || line.contains("panicked") {
            let _ = writeln!(std::io::stderr(), "  [vm] {line}");
        }
        all.push(line);
    }
    let status = child.wait().unwrap();
    // libtest's summary: "test result: ok. 4 passed; 0 failed; ...".
    let passed = all.iter().find_map(|l| {
        let rest = l.strip_prefix("test result: ok. ")?;
        rest.split(' ').next()?.parse::<u32>().ok()
    });
    assert!(
        status.success() && passed.is_some_and(|n| n >= 1),
        "the VM tier failed ({status}, scenarios passed: {passed:?}); the guest's output ends with:\n{}",
        all[all.len().saturating_sub(150)..].join("\n")
    );
}
