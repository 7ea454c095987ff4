//! Eviction: the kubelet's node-pressure eviction, at the runtime layer.
//!
//! - [`manager`]: the eviction manager, its loop and its rounds (observe,
//!   decide, reclaim at node level, stop the right pod, observe again);
//! - [`seams`]: the manager's collaborators as traits (observing signals,
//!   ranking, node-level reclaim, stopping a pod, reporting, the clock),
//!   with [`collectors`] and [`killer`] the real node-level reclaim and pod
//!   killer ([`stop_retry`] retries a stop the runtime did not answer,
//!   [`unfinished`] takes up the stops an earlier process left);
//! - [`message`]: the kubelet's eviction message;
//! - [`metrics`]: what the manager and admission count;
//! - [`pressure`]: the pressure memory kept across restarts;
//! - [`status`]: what the manager shares with admission and the admin API;
//! - [`records`]: the evicted pods (never admitted again), pure;
//!   [`store`]: their state files;
//! - [`admission`]: the RunPodSandbox admission the proxy's observer asks.
//!
//! The decisions themselves (thresholds, grace and transition periods,
//! minimum reclaim, rankings) are pure functions in [`crate::policy`].

pub mod admission;
pub mod collectors;
pub mod killer;
pub mod manager;
pub mod message;
pub mod metrics;
mod pressure;
pub mod records;
pub mod seams;
pub mod status;
mod stop_retry;
pub mod store;
mod unfinished;

pub use manager::{EvictionManager, Reloadable, Seams};
pub use message::eviction_message;
pub use status::{Eviction, NodeStatus};
pub use stop_retry::stop_retry_wait;
