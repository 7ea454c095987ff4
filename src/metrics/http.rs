//! The `/metrics` endpoint: HTTP/1.1 on a TCP port, bounded.
//!
//! Anyone who can reach the port can open connections to it (on the
//! loopback default, every local user), so a connection must never cost
//! criguard more than it can spare: at most [`MAX_CONNECTIONS`] are open at
//! once; a new one over that closes the oldest that has not sent a
//! request yet (else the oldest), so idle connections cannot lock a scraper
//! out; a request head must arrive within [`HEADER_TIMEOUT`], and every
//! connection ends after [`CONNECTION_LIFETIME`]. Accepting backs off while
//! it fails ([`crate::accept`]).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinSet};

use super::Metrics;
use crate::accept::Acceptor;

/// The most metrics connections open at once.
pub const MAX_CONNECTIONS: usize = 64;
/// A request head must arrive within this (the first on a connection too).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Every connection is closed after this, however busy (scrapers reconnect).
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

/// An open connection: its task, and whether it has sent a request.
struct Open {
    task: AbortHandle,
    served: Arc<AtomicBool>,
}

/// Serves `/metrics` on `listener` until `shutdown` resolves.
pub async fn serve(listener: TcpListener, metrics: Metrics, shutdown: impl Future<Output = ()>) {
    let mut acceptor = Acceptor::new(listener, "metrics");
    let mut tasks = JoinSet::new();
    let mut open: VecDeque<Open> = VecDeque::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            stream = acceptor.accept() => {
                open.retain(|o| !o.task.is_finished());
                if open.len() >= MAX_CONNECTIONS {
                    let oldest_idle = open.iter().position(|o| !o.served.load(Ordering::Relaxed));
                    if let Some(o) = open.remove(oldest_idle.unwrap_or(0)) {
                        o.task.abort();
                        // Let the aborted task drop (and close) its socket
                        // before another is accepted.
                        tokio::task::yield_now().await;
                    }
                }
                let served = Arc::new(AtomicBool::new(false));
                let task = tasks.spawn(connection(stream, metrics.clone(), served.clone()));
                open.push_back(Open { task, served });
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            () = &mut shutdown => break,
        }
    }
    tasks.shutdown().await;
}

/// Serves one connection for at most [`CONNECTION_LIFETIME`].
async fn connection(stream: TcpStream, metrics: Metrics, served: Arc<AtomicBool>) {
    let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
        served.store(true, Ordering::Relaxed);
        let metrics = metrics.clone();
        async move {
            let resp = if req.uri().path() == "/metrics" {
                http::Response::builder()
                    .header(
                        "content-type",
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )
                    .body(Full::new(Bytes::from(metrics.encode())))
            } else {
                http::Response::builder()
                    .status(404)
                    .body(Full::new(Bytes::from_static(b"try /metrics\n")))
            };
            Ok::<_, Infallible>(resp.expect("static response parts"))
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service);
    let _ = tokio::time::timeout(CONNECTION_LIFETIME, conn).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: std::net::SocketAddr) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn idle_connections_past_the_cap_make_room_for_a_scraper() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, Metrics::new(), async {
            let _ = stopped.await;
        }));
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS * 3 {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        // The oldest idle ones were closed to make room: reading them ends.
        let mut buf = [0u8; 1];
        let closed = idle[0].read(&mut buf).await.unwrap();
        assert_eq!(closed, 0, "the oldest idle connection is closed");
        let answer = tokio::time::timeout(Duration::from_secs(5), get(addr))
            .await
            .expect("a scraper is served despite the idle connections");
        assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
        let _ = stop.send(());
        server.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_sends_nothing_is_closed_after_the_header_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, Metrics::new(), std::future::pending()));
        let mut s = TcpStream::connect(addr).await.unwrap();
        let start = tokio::time::Instant::now();
        let mut buf = [0u8; 1];
        let n = s.read(&mut buf).await.unwrap_or(0);
        assert_eq!(n, 0);
        assert!(start.elapsed() >= HEADER_TIMEOUT, "{:?}", start.elapsed());
        assert!(
            start.elapsed() < CONNECTION_LIFETIME,
            "{:?}",
            start.elapsed()
        );
    }
}
