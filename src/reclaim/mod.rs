//! Acting on decisions: adjusting the kernel, reclaiming, evicting.

pub mod container_gc;
pub mod evict;
pub mod oom_adjust;
