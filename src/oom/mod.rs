//! The kernel OOM killer: the `oom_score_adj` criguard gives each container
//! so that the kernel's victim is the pod the eviction ranking puts first,
//! and the kernel's OOM kills, recorded and matched against that ranking.
//!
//! - [`scores`]: the dynamic scores from a memory ranking, pure;
//! - [`adjust`]: the loop that ranks running pods and writes those scores;
//! - [`history`]: the recent rankings a kill is matched against, pure;
//! - [`kills`]: the kernel's OOM kills, read from `memory.events` and
//!   `/dev/kmsg`, and their records.
//!
//! The kubelet's static score of a container (`pkg/kubelet/qos/policy.go`,
//! from its QoS class and the pod spec) is what the model derives
//! (`crate::model::qos`, `crate::model::spec::oom_score_adj`); the relay
//! checks it on CreateContainer (`crate::intercept`).

pub mod adjust;
pub mod history;
pub mod kills;
pub mod scores;

#[cfg(test)]
mod cgroup_drivers_tests;
