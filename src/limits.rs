//! Process limits criguard sets for itself at start.
//!
//! The open-file limit: systemd and login sessions give processes a soft
//! limit of 1 024 descriptors and a much higher hard limit, leaving the
//! program to raise the soft one if it needs more (Go programs do it at
//! start). criguard holds a descriptor per kubelet connection, per runtime
//! connection, per metrics or admin connection and per memory event, so it
//! raises its soft limit to the hard limit before it serves; the unit sets
//! `LimitNOFILE` too.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// The open-file limit before and after [`raise_nofile`]: (soft, hard).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoFile {
    /// The soft limit found at start.
    pub before: u64,
    /// The soft limit now (the hard limit).
    pub after: u64,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit.
pub fn raise_nofile() -> nix::Result<NoFile> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok(NoFile {
        before: soft,
        after: getrlimit(Resource::RLIMIT_NOFILE)?.0,
    })
}

/// Locks criguard's pages in memory as they are touched (`mlockall` with
/// `MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT`, as earlyoom does): under
/// memory pressure the kernel would otherwise evict criguard's own code and
/// data, and the process that must act would stall on page faults in the
/// thrashing it is there to end. `MCL_ONFAULT` locks only pages in use, so
/// thread stacks and untouched code cost nothing. Needs `CAP_IPC_LOCK` or a
/// `RLIMIT_MEMLOCK` above criguard's size (the unit sets both).
pub fn lock_memory() -> std::io::Result<()> {
    // SAFETY: mlockall takes flags only and changes no memory contents.
    let r = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE | libc::MCL_ONFAULT) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_ends_at_the_hard_limit() {
        let n = raise_nofile().unwrap();
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        assert_eq!((n.after, soft), (hard, hard));
        assert!(n.before <= n.after);
    }
}
