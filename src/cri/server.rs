//! Accepting kubelet connections.
//!
//! Each accepted connection gets its own connection to the runtime and its
//! own task ([`super::pump`]); when the runtime cannot be dialled the
//! connection is served by the stand-in ([`super::standin`]). On shutdown
//! the listener closes, every connection gets GOAWAY, calls in flight
//! finish for at most `drain`, and what is left is dropped.

use std::future::Future;
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::conn::Conn;
use super::proxy::Proxy;
use super::{pump, standin};

/// Serves `proxy` on `listener` until `shutdown` resolves, then drains.
pub async fn serve(
    listener: UnixListener,
    proxy: Proxy,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) {
    let (drain_tx, drain_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    conns.spawn(connection(stream, proxy.clone(), drain_rx.clone()));
                }
                Err(err) => {
                    // EMFILE and the like: back off briefly, keep serving.
                    tracing::warn!(%err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    let _ = drain_tx.send(true);
    let drained =
        tokio::time::timeout(drain, async { while conns.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(
            ?drain,
            "calls still in flight after the drain period; dropping them"
        );
        conns.shutdown().await;
    }
}

/// Relays one kubelet connection to a fresh runtime connection.
async fn connection(client: UnixStream, proxy: Proxy, drain: watch::Receiver<bool>) {
    match UnixStream::connect(proxy.endpoint().path()).await {
        Ok(server) => {
            let ready = proxy.ready();
            let mut conn = Conn::new(proxy);
            pump::pump(&mut conn, client, server, ready, drain).await;
        }
        Err(err) => standin::serve(client, proxy, err, drain).await,
    }
}
