//! The kernel's own record of its OOM kills, from `/dev/kmsg`: the memory
//! cgroup of each process the OOM killer took (its `oom-kill:` summary
//! line, the one the kubelet's OOM watcher reads through cAdvisor's
//! `oomparser`).
//!
//! On cgroup v1 a victim's cgroup, and with it the only counter of its
//! kill, can be removed before containerd's notification reaches criguard
//! (containerd deletes the task as soon as its exit is handled, and on a
//! loaded node the notifications queue behind each other). The log names
//! the cgroup whatever happened to it since. The kernel rate-limits the
//! summary (10 per 5 s): in a storm some kills are named only by their
//! counters.

use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom};

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

/// The longest record read (the kernel's limit is 1 KiB of text plus its
/// dictionary).
const RECORD_MAX: usize = 8192;

/// The `task_memcg` of the OOM kill `record` (a `/dev/kmsg` record:
/// `prio,seq,usec,flags;message`, dictionary lines after it), if it is
/// one.
pub fn killed_in(record: &str) -> Option<&str> {
    let message = record.split_once(';')?.1.lines().next()?;
    let fields = message.split_once("oom-kill:")?.1;
    let memcg = fields
        .split(',')
        .find_map(|f| f.strip_prefix("task_memcg="))?;
    (!memcg.is_empty()).then_some(memcg)
}

/// The task id a container's (or sandbox's) cgroup path ends in: the
/// cgroupfs driver's `…/<id>`, the systemd driver's
/// `…/cri-containerd-<id>.scope`.
pub fn task_of(memcg: &str) -> &str {
    let last = memcg.rsplit('/').next().unwrap_or(memcg);
    last.strip_prefix("cri-containerd-")
        .and_then(|s| s.strip_suffix(".scope"))
        .unwrap_or(last)
}

/// Follows the kernel's log from its end on a thread of its own, sending
/// the `task_memcg` of every OOM kill it records; an error when
/// `/dev/kmsg` cannot be read. The thread ends when the receiver is gone
/// (at its next record) or the log fails.
pub fn follow() -> std::io::Result<UnboundedReceiver<String>> {
    let mut kmsg = File::open("/dev/kmsg")?;
    kmsg.seek(SeekFrom::End(0))?;
    let (tx, rx) = unbounded_channel();
    std::thread::Builder::new()
        .name("criguard-kmsg".into())
        .spawn(move || read_kills(kmsg, &tx))?;
    Ok(rx)
}

fn read_kills(mut kmsg: File, tx: &UnboundedSender<String>) {
    let mut record = vec![0u8; RECORD_MAX];
    loop {
        match kmsg.read(&mut record) {
            Ok(0) => return,
            Ok(n) => {
                let text = String::from_utf8_lossy(&record[..n]);
                if let Some(memcg) = killed_in(&text)
                    && tx.send(memcg.to_owned()).is_err()
                {
                    return;
                }
            }
            // Records overwritten before they were read: skipped.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(err) => {
                tracing::warn!(%err, "kernel log no longer readable: OOM kills are read from their counters only");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oom_killers_summary_names_the_cgroup() {
        let r = "6,9876,76180406930,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=4caf,mems_allowed=0,oom_memcg=/kubepods,task_memcg=/kubepods/besteffort/podx/4cafcb6f,task=awk,pid=21681,uid=0\n";
        assert_eq!(killed_in(r), Some("/kubepods/besteffort/podx/4cafcb6f"));
        let with_dict = "6,1,2,-;oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg=/a/b,task=sh,pid=1,uid=0\n SUBSYSTEM=x\n";
        assert_eq!(killed_in(with_dict), Some("/a/b"));
        for other in [
            "3,1,2,-;Memory cgroup out of memory: Killed process 21681 (awk)\n",
            "6,1,2,-;eth0: link up, task_memcg=/not/a/kill\n",
            "6,1,2,-;oom-kill:constraint=CONSTRAINT_NONE,task_memcg=,task=sh\n",
            "no separator",
        ] {
            assert_eq!(killed_in(other), None, "{other}");
        }
    }

    #[test]
    fn a_cgroup_path_names_its_task_under_either_driver() {
        assert_eq!(task_of("/kubepods/besteffort/podx/4caf"), "4caf");
        assert_eq!(
            task_of("/kubepods.slice/kubepods-pod1.slice/cri-containerd-4caf.scope"),
            "4caf"
        );
    }
}
