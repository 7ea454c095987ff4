//! Process file descriptors (`pidfd_open(2)`, `pidfd_send_signal(2)`):
//! a handle that pins one process, so a signal sent through it cannot
//! reach another that reused the pid, and that polls readable once the
//! process has exited.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A pidfd on `pid`; `Ok(None)` when no such process exists (any more).
pub fn open(pid: i32) -> io::Result<Option<OwnedFd>> {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        let err = io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::ESRCH) => Ok(None),
            _ => Err(err),
        };
    }
    // SAFETY: the fd was just returned by pidfd_open and is owned by no one else.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd as i32) }))
}

/// Sends `signal` to the process `pidfd` pins; `Ok(false)` when it has
/// already exited.
pub fn send_signal(pidfd: &OwnedFd, signal: i32) -> io::Result<bool> {
    // SAFETY: pidfd_send_signal(2) with a valid pidfd, a signal number, no
    // siginfo (null) and flags 0.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r < 0 {
        let err = io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::ESRCH) => Ok(false),
            _ => Err(err),
        };
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pidfd_signals_its_process_and_not_a_gone_one() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let fd = open(child.id() as i32).unwrap().expect("the child exists");
        assert!(send_signal(&fd, libc::SIGKILL).unwrap());
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        // Reaped: the pidfd still names it, and it is gone.
        assert!(!send_signal(&fd, libc::SIGKILL).unwrap());
        assert!(open(i32::MAX).unwrap().is_none(), "no such pid");
    }
}
