//! The HTTP/2 server on the kubelet-facing socket.
//!
//! Each accepted connection is served on its own task; each call on a
//! connection is its own HTTP/2 stream, so calls never wait for each other.
//! On shutdown the server stops accepting, lets calls in flight finish for at
//! most `drain`, then drops what is left.

use std::future::Future;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::UnixListener;

use super::Proxy;

/// Serves `proxy` on `listener` until `shutdown` resolves, then drains.
pub async fn serve(
    listener: UnixListener,
    proxy: Proxy,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) {
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    // grpc-go (containerd) sets no stream limit; neither do we, so that the
    // proxy never queues calls the runtime would have taken.
    builder.max_concurrent_streams(None);
    // The runtime's response headers pass as they are; add none of our own.
    builder.auto_date_header(false);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(err) => {
                        // EMFILE and the like: back off briefly, keep serving.
                        tracing::warn!(%err, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let proxy = proxy.clone();
                let service = service_fn(move |req| {
                    let proxy = proxy.clone();
                    async move { proxy.forward(req).await }
                });
                let conn = builder.serve_connection(TokioIo::new(stream), service);
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(err) = conn.await {
                        tracing::debug!(%err, "kubelet connection ended with an error");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            ?drain,
            "calls still in flight after the drain period; dropping them"
        );
    }
}
