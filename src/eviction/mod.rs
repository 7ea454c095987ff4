//! Eviction: the kubelet's node-pressure eviction, at the runtime layer.
//!
//! - [`manager`]: the eviction manager, its loop and its rounds (observe,
//!   decide, reclaim at node level, stop the right pod, observe again);
//! - [`seams`]: the manager's collaborators as traits (observing signals,
//!   ranking, node-level reclaim, stopping a pod, reporting, the clock),
//!   with [`killer`] the real pod killer ([`stop_retry`] retries a stop the runtime did not answer,
//!   [`unfinished`] takes up the stops an earlier process left);
//! - [`message`]: the kubelet's eviction message;
//! - [`metrics`]: what the manager and admission count;
//! - [`pressure`]: the pressure memory kept across restarts;
//! - [`status`]: what the manager shares with admission and the admin API;
//! - [`records`]: the evicted pods (never admitted again), pure;
//!   [`store`]: their state files;
//! - [`admission`]: the RunPodSandbox admission the proxy's observer asks.
//!
//!
//! The decisions are pure functions over plain data, beside them:
//! [`thresholds`] (the threshold state machine: grace and transition
//! periods, minimum reclaim), [`reclaim`] (the reclaim plan: node-level
//! actions first, then victims), [`local_storage`] (the ephemeral-storage
//! limits), and [`rank::order`] (the kubelet's orderings); [`rank`] reads
//! the usage they rank by.

pub mod admission;
pub mod killer;
pub mod local_storage;
pub mod manager;
pub mod message;
pub mod metrics;
mod pressure;
pub mod rank;
pub mod ready;
pub mod reclaim;
pub mod records;
pub mod seams;
pub mod status;
mod stop_retry;
pub mod store;
pub mod thresholds;
mod unfinished;

pub use manager::{EvictionManager, Reloadable, Seams};
pub use message::eviction_message;
pub use status::{Eviction, NodeStatus};
pub use stop_retry::stop_retry_wait;
