//! Accepting kubelet connections.
//!
//! Each accepted connection gets its own connection to the runtime and a
//! thread of its own that relays between them ([`super::pump`]); when the
//! runtime cannot be dialled the connection is served by the stand-in
//! ([`super::standin`]). On shutdown the listener closes, every
//! connection gets GOAWAY, calls in flight finish for at most `drain`, and
//! what is left is dropped.
//!
//! [`ProxyThread`] runs the accepting, the stand-in and each connection's
//! signals on a thread and a single-threaded runtime of its own, and each
//! relayed connection runs on its own thread, so nothing else criguard does
//! (filesystem walks, statvfs of a hung mount, cgroup reads, state files)
//! can delay a relayed frame: a relay thread only moves bytes and takes
//! the model's lock briefly to observe a call.

use std::future::Future;
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;

use super::conn::Conn;
use super::proxy::Proxy;
use super::{pump, standin};
use crate::accept::Acceptor;

/// Serves `proxy` on `listener` until `shutdown` resolves, then drains.
pub async fn serve(
    listener: UnixListener,
    proxy: Proxy,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) {
    let (drain_tx, drain_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    // EMFILE and the like: the shared loop backs off and keeps serving.
    let mut acceptor = Acceptor::new(listener, "cri");
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            stream = acceptor.accept() => {
                conns.spawn(connection(stream, proxy.clone(), drain_rx.clone()));
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            () = &mut shutdown => break,
        }
    }
    drop(acceptor);
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
            pump::relay(Conn::new(proxy), client, server, ready, drain).await;
        }
        Err(err) => standin::serve(client, proxy, err, drain).await,
    }
}

/// The proxy serving on a thread of its own.
#[derive(Debug)]
pub struct ProxyThread {
    stop: oneshot::Sender<()>,
    done: oneshot::Receiver<()>,
}

impl ProxyThread {
    /// Serves `proxy` on `listener` on a new thread; [`ProxyThread::stop`]
    /// drains it for at most `drain`.
    pub fn spawn(
        listener: std::os::unix::net::UnixListener,
        proxy: Proxy,
        drain: Duration,
    ) -> std::io::Result<Self> {
        let (stop, stopped) = oneshot::channel::<()>();
        let (finished, done) = oneshot::channel();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        listener.set_nonblocking(true)?;
        std::thread::Builder::new()
            .name("criguard-proxy".into())
            .spawn(move || {
                rt.block_on(async move {
                    match UnixListener::from_std(listener) {
                        Ok(l) => {
                            let stopped = async {
                                let _ = stopped.await;
                            };
                            serve(l, proxy, stopped, drain).await;
                        }
                        Err(err) => tracing::error!(%err, "proxy listener unusable"),
                    }
                });
                let _ = finished.send(());
            })?;
        Ok(Self { stop, done })
    }

    /// Stops accepting, drains and waits for the thread to finish.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.done.await;
    }
}
