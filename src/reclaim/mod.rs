//! Acting on decisions: adjusting the kernel, reclaiming, evicting.

pub mod container_gc;
pub mod image_gc;
pub mod image_uses;
pub mod metrics;
pub mod oom_adjust;
pub mod oom_kills;
pub mod rank;

#[cfg(test)]
mod cgroup_drivers_tests;
