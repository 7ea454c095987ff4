//! criguard's admin API: what it knows and decides, for `criguard pods`,
//! `evictions`, `rank`, `usage` and for node agents.
//!
//! gRPC (`proto/criguard/admin/v1/admin.proto`, service
//! `criguard.admin.v1.Admin`) on a unix socket of its own, mode 0660 like
//! the CRI socket: the node-agent convention of the kubelet's
//! pod-resources API. Reading criguard's state never competes with the
//! kubelet's calls, which have a socket and a thread of their own.
//!
//! | rpc | answer |
//! | --- | --- |
//! | `Pods` | the node model, synced with the runtime first |
//! | `Evictions` | every eviction since start, oldest first |
//! | `KernelOomKills` | every kernel OOM kill in a pod since start, oldest first |
//! | `Rank` | the eviction order for each ranked signal, read now (model synced first) |
//! | `Usage` | per-pod disk and process usage, read now (model synced first) |
//! | `Conditions` | node conditions, the last observations and when they were read |
//! | `WatchEvictions` | each eviction as it is made (a server stream), the earlier ones first on request |
//! | `Status` | the configuration: valid or failing open (and why), the settings and thresholds in effect, reloads; the sockets served, the runtime forwarded to, the API report's writes |
//!
//! The messages stay at the edge: [`convert`] is the one place that maps
//! them to criguard's own types; [`server`] answers from those types and
//! [`client`] hands them back, so the CLI's tables and `--json` print the
//! domain types as before.

pub mod client;
pub mod config;
pub mod convert;
pub mod server;

/// The messages, server and client generated from `admin.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("criguard.admin.v1");
}

pub use client::{
    ClientError, EvictionsReport, get_conditions, get_evictions, get_evictions_report,
    get_oom_kills, get_pods, get_rank, get_rank_report, get_usage, watch_evictions,
};
pub use config::{ApiWrites, ConfigStatus, NriLink, Serving, get_status};
pub use convert::{ConditionsReport, ConvertError, Observed};
pub use server::{AdminState, serve};
