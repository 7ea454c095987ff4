//! One accept loop for every server criguard runs: the CRI socket, the
//! admin socket and the metrics port.
//!
//! `accept(2)` fails when the process is out of descriptors (`EMFILE`),
//! the system is (`ENFILE`) or the kernel is short of memory (`ENOBUFS`,
//! `ENOMEM`). The pending connection then stays in the backlog and the
//! listener stays readable, so a loop that simply tries again spins a core
//! and starves every other task on its thread. [`Acceptor`] backs off
//! instead: 5 ms after the first failure, doubling up to 1 s, back to
//! nothing on the next success; it logs the first failure of a streak and
//! then one line per [`LOG_EVERY`] saying how many followed. Errors that
//! concern only the connection being accepted (`ECONNABORTED`, a reset,
//! `EINTR`) are retried at once.
//!
//! [`Acceptor::accept`] is cancel-safe, for `tokio::select!`; the
//! acceptor is also a `Stream` of connections for tonic's
//! `serve_with_incoming`.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use crate::backoff::Backoff;

/// The first pause after a failed accept.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(5);
/// The longest pause between accepts while they keep failing.
pub const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// While accepts keep failing, at most one log line per this period.
pub const LOG_EVERY: Duration = Duration::from_secs(30);

/// A listening socket: tokio's unix and TCP listeners.
pub trait Listen {
    /// The accepted connection.
    type Conn;
    /// Polls for the next connection.
    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Self::Conn>>;
}

impl Listen for tokio::net::UnixListener {
    type Conn = tokio::net::UnixStream;
    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Self::Conn>> {
        tokio::net::UnixListener::poll_accept(self, cx).map_ok(|(s, _)| s)
    }
}

impl Listen for tokio::net::TcpListener {
    type Conn = tokio::net::TcpStream;
    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Self::Conn>> {
        tokio::net::TcpListener::poll_accept(self, cx).map_ok(|(s, _)| s)
    }
}

/// Whether a failed accept concerns only that connection (retry at once)
/// rather than the process or the system (back off).
fn per_connection(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    ) || err.raw_os_error() == Some(nix::libc::EPROTO)
}

/// Accepts connections on a listener, backing off while accepts fail.
#[derive(Debug)]
pub struct Acceptor<L> {
    listener: L,
    name: &'static str,
    backoff: Backoff,
    pause: Option<Pin<Box<Sleep>>>,
    failures: u64,
    logged_at: Option<Instant>,
}

impl<L: Listen> Acceptor<L> {
    /// Accepts on `listener`; `name` (`cri`, `admin`, `metrics`) names it in logs.
    pub fn new(listener: L, name: &'static str) -> Self {
        Self {
            listener,
            name,
            backoff: Backoff::new(FIRST_BACKOFF, MAX_BACKOFF),
            pause: None,
            failures: 0,
            logged_at: None,
        }
    }

    /// The next connection; never fails (failures are paused over and logged).
    pub async fn accept(&mut self) -> L::Conn {
        std::future::poll_fn(|cx| self.poll_next_conn(cx)).await
    }

    /// Polls for the next connection, pausing after failures.
    pub fn poll_next_conn(&mut self, cx: &mut Context<'_>) -> Poll<L::Conn> {
        loop {
            if let Some(pause) = self.pause.as_mut() {
                ready!(pause.as_mut().poll(cx));
                self.pause = None;
            }
            match ready!(self.listener.poll_accept(cx)) {
                Ok(conn) => {
                    if self.failures > 0 {
                        tracing::info!(
                            server = self.name,
                            failed = self.failures,
                            "accepting again"
                        );
                    }
                    self.backoff.reset();
                    self.failures = 0;
                    // `logged_at` stays: descriptors that run out, free
                    // up and run out again log once per LOG_EVERY.
                    return Poll::Ready(conn);
                }
                Err(err) if per_connection(&err) => {
                    tracing::debug!(server = self.name, %err, "accept: connection gone before it was accepted");
                }
                Err(err) => {
                    self.failures += 1;
                    let wait = self.backoff.next_wait();
                    let now = Instant::now();
                    if self.logged_at.is_none_or(|t| now - t >= LOG_EVERY) {
                        self.logged_at = Some(now);
                        tracing::warn!(
                            server = self.name, %err, failed = self.failures, backoff = ?wait,
                            "accept failed; pausing before the next (out of file descriptors?)"
                        );
                    }
                    self.pause = Some(Box::pin(tokio::time::sleep(wait)));
                }
            }
        }
    }

    /// The listener.
    pub fn get_ref(&self) -> &L {
        &self.listener
    }
}

impl<L: Listen + Unpin> futures::Stream for Acceptor<L> {
    type Item = io::Result<L::Conn>;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_next_conn(cx).map(|c| Some(Ok(c)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// A listener that answers from a script: each entry is one accept.
    struct Scripted {
        script: VecDeque<io::Result<u32>>,
        polls: usize,
    }

    impl Listen for Scripted {
        type Conn = u32;
        fn poll_accept(&mut self, _: &mut Context<'_>) -> Poll<io::Result<u32>> {
            self.polls += 1;
            match self.script.pop_front() {
                Some(r) => Poll::Ready(r),
                None => Poll::Pending,
            }
        }
    }

    fn emfile() -> io::Result<u32> {
        Err(io::Error::from_raw_os_error(nix::libc::EMFILE))
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_doubling_to_a_second_and_a_success_resets() {
        let mut script: VecDeque<_> = (0..12).map(|_| emfile()).collect();
        script.push_back(Ok(7));
        script.push_back(emfile());
        script.push_back(Ok(8));
        let mut a = Acceptor::new(Scripted { script, polls: 0 }, "test");
        let start = Instant::now();
        assert_eq!(a.accept().await, 7);
        // 5 + 10 + … + 640 ms, then 1 s five times: no spinning.
        let want: Duration = (0..12)
            .map(|i| (FIRST_BACKOFF * 2u32.pow(i)).min(MAX_BACKOFF))
            .sum();
        assert_eq!(start.elapsed(), want);
        assert_eq!(a.get_ref().polls, 13);
        let again = Instant::now();
        assert_eq!(a.accept().await, 8);
        assert_eq!(
            again.elapsed(),
            FIRST_BACKOFF,
            "the success reset the back-off"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_aborted_before_accept_is_skipped_at_once() {
        let script = VecDeque::from([
            Err(io::Error::from(io::ErrorKind::ConnectionAborted)),
            Ok(1),
        ]);
        let mut a = Acceptor::new(Scripted { script, polls: 0 }, "test");
        let start = Instant::now();
        assert_eq!(a.accept().await, 1);
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test]
    async fn real_listeners_accept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let mut a = Acceptor::new(tokio::net::UnixListener::bind(&path).unwrap(), "unix");
        let (_c, _s) = tokio::join!(tokio::net::UnixStream::connect(&path), a.accept());
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let mut a = Acceptor::new(tcp, "tcp");
        let (c, s) = tokio::join!(tokio::net::TcpStream::connect(addr), a.accept());
        assert_eq!(c.unwrap().local_addr().unwrap(), s.peer_addr().unwrap());
    }
}
