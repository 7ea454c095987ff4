//! Acting on decisions: adjusting the kernel, reclaiming, evicting.

pub mod oom_adjust;
