//! The clients people point at a CRI socket, through criguard: tonic, grpc-go
//! dialling the bare socket path (kubelets and crictl before 2024:
//! `:authority` is the path), grpc-go dialling `unix://` (`localhost`),
//! grpcio (`unix:`, a percent-encoded authority) and grpcio with an odd
//! `grpc.default_authority`. Each runs the kubelet's pod lifecycle against a
//! private containerd and the byte-level checks against a grpc-go recording
//! upstream, and every answer through criguard must equal the one the same
//! client gets directly; then 1 000 concurrent calls over 10 connections.
//!
//! The clients are built by `hack/clients.sh` (called once per run).
//! `CRIGUARD_CLIENTS_SELFTEST=1` points the "through criguard" side at the
//! runtime too: every test must then pass, whatever criguard does.

use crate::common;

mod concurrency;
mod decoded;
mod lifecycle;
mod transparency;

use std::path::{Path, PathBuf};

use common::clients::Kind;
use common::containerd::CriguardProcess;

/// The socket the "through criguard" side dials: criguard's, or with
/// `CRIGUARD_CLIENTS_SELFTEST=1` the runtime's own, which turns every test
/// into direct-against-direct (a check of the clients and the harness).
pub fn through(guard: &CriguardProcess, runtime: &Path) -> PathBuf {
    if std::env::var_os("CRIGUARD_CLIENTS_SELFTEST").is_some() {
        runtime.to_owned()
    } else {
        guard.socket.clone()
    }
}

/// One module per client, each with the same tests.
macro_rules! per_client {
    ($($name:ident => $kind:expr),* $(,)?) => {$(
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn kubelet_lifecycle_matches_direct() {
                lifecycle::matches_direct($kind).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn bytes_metadata_errors_and_streams_pass_unchanged() {
                transparency::matches_direct($kind).await;
            }
        }
    )*};
}

per_client! {
    tonic => Kind::Tonic,
    grpc_go_passthrough => Kind::GoPassthrough,
    grpc_go_unix => Kind::GoUnix,
    grpcio_unix => Kind::PyUnix,
    grpcio_odd_authority => Kind::PyAuthority("odd authority %41/x".into()),
}
