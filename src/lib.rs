//! criguard: a CRI proxy that guards a node against resource pressure.
//!
//! The kubelet talks to criguard's socket as if it were containerd's; criguard
//! forwards every call to containerd ([`cri`]) and, standing in that path,
//! handles memory, disk and pid pressure at the runtime layer.

pub mod accept;
pub mod admin;
pub mod backoff;
pub mod cgroup;
pub mod clock;
pub mod config;
pub mod cri;
pub mod eviction;
pub mod intercept;
pub mod kube;
#[cfg(any(test, feature = "test-pods"))]
pub mod kubelet;
#[cfg(test)]
mod layers;
pub mod limits;
pub mod listen;
pub mod lock;
pub mod lograte;
pub mod metrics;
pub mod model;
pub mod pidfd;
pub mod policy;
pub mod quantity;
pub mod reclaim;
pub mod runtime;
pub mod signal;
pub mod signals;
pub mod statefile;
