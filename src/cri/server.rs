//! Accepting kubelet connections.
//!
//! Each accepted connection gets its own connection to the runtime and a
//! thread of its own that relays between them ([`super::pump`]); when the
//! runtime cannot be dialled the connection is served by the unavailable responder
//! ([`super::unavailable`]). On shutdown the listener closes, every
//! connection gets GOAWAY, calls in flight finish for at most `drain`, and
//! what is left is dropped.
//!
//! [`ProxyThread`] runs the accepting, the unavailable responder and each connection's
//! signals on a thread and a single-threaded runtime of its own, and each
//! relayed connection runs on its own thread, so nothing else criguard does
//! (filesystem walks, statvfs of a hung mount, cgroup reads, state files)
//! can delay a relayed frame: a relay thread only moves bytes and takes
//! the model's lock briefly to observe a call.
//!
//! At most [`Proxy::max_connections`] connections are served at once
//! (relayed or answered unavailable). A client past the limit, or one that arrives
//! while criguard is out of file descriptors, is refused as what it is:
//! its first call is answered `UNAVAILABLE` naming the reason (`criguard:
//! connection limit N reached`, `criguard: out of file descriptors`), a
//! warning is logged (at most once per [`budget::LOG_EVERY`], with the
//! count since) and `criguard_cri_connections_refused_total` counts it.
//! At most [`MAX_REFUSING`] refusals are answered at once; past that a
//! connection is closed at once.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::budget::{self, CONNECTIONS, REFUSED, RefusedLabels};
use super::conn::Conn;
use super::proxy::Proxy;
use super::{pump, unavailable};
use crate::accept::Acceptor;
use crate::lograte::LogRate;

/// Refused connections answered at once; past this they are closed.
pub const MAX_REFUSING: usize = 64;

/// Complaints about connections past the limit.
static LIMIT_LOG: LogRate = budget::complaint();
/// Complaints about a runtime that cannot be reached.
static DOWN_LOG: LogRate = budget::complaint();
/// Complaints about running out of descriptors.
static FDS_LOG: LogRate = budget::complaint();

/// Why a connection is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnLimit {
    /// At the connection limit.
    Limit(usize),
    /// Out of file descriptors.
    Fds,
}

impl ConnLimit {
    /// The message the client's call gets.
    pub fn message(self) -> String {
        match self {
            ConnLimit::Limit(n) => format!("criguard: connection limit {n} reached"),
            ConnLimit::Fds => "criguard: out of file descriptors (Too many open files); \
                 the connection cannot be relayed to the runtime"
                .to_owned(),
        }
    }

    fn label(self) -> &'static str {
        match self {
            ConnLimit::Limit(_) => "limit",
            ConnLimit::Fds => "fds",
        }
    }

    /// Counts the refusal and logs it (rate-limited).
    fn report(self) {
        REFUSED
            .get_or_create(&RefusedLabels {
                reason: self.label(),
            })
            .inc();
        let throttle = match self {
            ConnLimit::Limit(_) => &LIMIT_LOG,
            ConnLimit::Fds => &FDS_LOG,
        };
        if let Some(skipped) = throttle.allow(Instant::now()) {
            tracing::warn!(
                not_logged = skipped,
                "{}; a client connection was refused",
                self.message()
            );
        }
    }
}

/// Whether an error means the process or the system is out of descriptors.
pub fn out_of_fds(err: &std::io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(nix::libc::EMFILE | nix::libc::ENFILE)
    )
}

/// Serves `proxy` on `listener` until `shutdown` resolves, then drains.
pub async fn serve(
    listener: UnixListener,
    proxy: Proxy,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) {
    budget::tune_allocator();
    // Cancelled when serving ends, however it ends: each connection then
    // drains.
    let draining = CancellationToken::new();
    let _drain_on_drop = draining.clone().drop_guard();
    let mut conns = JoinSet::new();
    let slots = Arc::new(Semaphore::new(proxy.max_connections()));
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    // EMFILE and the like: the shared loop backs off and keeps serving.
    let mut acceptor = Acceptor::new(listener, "cri");
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            stream = acceptor.accept() => {
                match slots.clone().try_acquire_owned() {
                    Ok(slot) => {
                        conns.spawn(connection(stream, proxy.clone(), draining.clone(), slot));
                    }
                    Err(_) => {
                        let why = ConnLimit::Limit(proxy.max_connections());
                        if let Ok(permit) = refusing.clone().try_acquire_owned() {
                            conns.spawn(refuse(stream, proxy.clone(), why, draining.clone(), permit));
                        } else {
                            why.report();
                        }
                    }
                }
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            () = &mut shutdown => break,
        }
    }
    drop(acceptor);
    draining.cancel();
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

/// Counts a connection served while it lives.
struct Served {
    _slot: OwnedSemaphorePermit,
}

impl Served {
    fn new(slot: OwnedSemaphorePermit) -> Self {
        CONNECTIONS.inc();
        Self { _slot: slot }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        CONNECTIONS.dec();
    }
}

/// Relays one kubelet connection to a fresh runtime connection.
async fn connection(
    client: UnixStream,
    proxy: Proxy,
    drain: CancellationToken,
    slot: OwnedSemaphorePermit,
) {
    let _served = Served::new(slot);
    let client = match dial(&proxy).await {
        Ok(server) => {
            let ready = proxy.ready();
            let relayed = pump::try_relay(
                Conn::new(proxy.clone()),
                client,
                server,
                ready,
                drain.clone(),
            );
            match relayed.await {
                Ok(()) => return,
                Err((err, client)) if out_of_fds(&err) => client,
                Err((err, _)) => {
                    tracing::error!(%err, "could not relay a connection");
                    return;
                }
            }
        }
        Err(err) if out_of_fds(&err) => client,
        Err(err) => {
            if let Some(skipped) = DOWN_LOG.allow(Instant::now()) {
                tracing::warn!(%err, not_logged = skipped, "runtime unreachable; answering calls UNAVAILABLE");
            }
            return unavailable::serve(client, proxy, err, drain).await;
        }
    };
    ConnLimit::Fds.report();
    unavailable::refuse(client, proxy, ConnLimit::Fds.message(), drain).await;
}

/// How long a dial that finds the runtime's accept queue full is retried.
const DIAL_BUSY: Duration = Duration::from_secs(5);

/// Connects to the runtime. A full accept queue (`EAGAIN` on a unix
/// socket, a burst of connections) is retried for at most [`DIAL_BUSY`]:
/// it is not a runtime that is down.
async fn dial(proxy: &Proxy) -> std::io::Result<UnixStream> {
    let give_up = tokio::time::Instant::now() + DIAL_BUSY;
    let mut pause = Duration::from_millis(1);
    loop {
        match UnixStream::connect(proxy.endpoint().path()).await {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if tokio::time::Instant::now() + pause > give_up {
                    return Err(e);
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// Answers a connection criguard does not relay.
async fn refuse(
    client: UnixStream,
    proxy: Proxy,
    why: ConnLimit,
    drain: CancellationToken,
    _permit: OwnedSemaphorePermit,
) {
    why.report();
    unavailable::refuse(client, proxy, why.message(), drain).await;
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
