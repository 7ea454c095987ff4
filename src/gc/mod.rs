//! Garbage collection: unused images and dead containers, the kubelet's
//! `pkg/kubelet/images/image_gc_manager.go` and
//! `pkg/kubelet/kuberuntime/kuberuntime_gc.go` at the runtime layer.
//!
//! - [`image_policy`], [`container_policy`]: what to remove, as pure
//!   functions over plain data;
//! - [`images`], [`containers`]: the collectors that list, decide with those
//!   policies and remove through the runtime; [`image_uses`] the last use of
//!   each image the relay saw;
//! - [`collectors`]: both collectors as the eviction manager's node-level
//!   reclaim (`eviction::seams::NodeReclaim`);
//! - [`metrics`]: what they count.
//!
//! Their settings, with the kubelet's names, are `crate::config::image_gc`
//! beside the other settings.

pub mod collectors;
pub mod container_policy;
pub mod containers;
pub mod image_policy;
pub mod image_uses;
pub mod images;
pub mod metrics;
