//! Moving the bytes of one connection: the relay's I/O loop.
//!
//! Each kubelet connection and its runtime connection are owned by one
//! thread of their own, which blocks in poll(2) on both sockets and on an
//! eventfd; no locks and no channels between the directions. A read takes
//! what the socket holds (up to 64 KiB), the engine turns it into slices
//! for the other side, and one vectored write sends them: per call, about
//! one read and one write each way, as for a plain byte relay, and the
//! thread is woken by the kernel directly (an async runtime adds a
//! readiness round trip through its reactor per direction per call,
//! measured by `hack/bench-proxy.sh`). Reading from a side pauses while
//! more than [`HIGH_WATER`] bytes wait for the other, and reading from the
//! client also while as much waits for the client itself (criguard's own
//! answers to it: refusals, credit, acknowledgements), or while the engine
//! asks ([`Engine::client_paused`]): back-pressure reaches the client as
//! it reaches a client of the runtime itself, and a flood reaches the
//! runtime no harder than direct.
//!
//! The async side ([`relay`]) only passes on what the thread must hear of
//! (the node model ready, a drain, a stop when the drain period is over)
//! through flags and the eventfd, and learns when the thread is done.
//!
//! When either peer closes, what is queued for the other is written (for
//! at most [`FINAL_FLUSH`]) and the connection ends, as a plain relay
//! ends: a kubelet sees its runtime connection close when the runtime's
//! closes. A runtime that stops taking bytes (it closed after a GOAWAY,
//! e.g. ENHANCE_YOUR_CALM for a PING flood) is still read to its end, so
//! its last frames reach the client.

use std::io::{ErrorKind, Read};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::eventfd::{EfdFlags, EventFd};
use tokio::sync::{oneshot, watch};

use super::conn::{Conn, Io};
use super::out::write_out;

/// Bytes waiting for a peer above which the other peer is not read. The
/// kernel's socket buffers hold about as much again; more only absorbs
/// the back-pressure a flood should meet (4 MiB let a SETTINGS flood put
/// 200 000 frames into containerd where 14 000 got in directly).
pub const HIGH_WATER: usize = 64 << 10;
/// Read buffer growth step.
const READ_CHUNK: usize = 64 << 10;
/// How long queued bytes may take to leave once a peer has closed.
const FINAL_FLUSH: Duration = Duration::from_secs(1);

/// What turns each side's bytes into the other side's.
pub trait Engine {
    /// Consumes what it can of `input` (bytes from the client).
    fn on_client(&mut self, input: &mut BytesMut, io: &mut Io);
    /// Consumes what it can of `input` (bytes from the runtime).
    fn on_server(&mut self, input: &mut BytesMut, io: &mut Io);
    /// Whether the connection should end once its queues are written.
    fn done(&self) -> bool {
        false
    }
    /// Whether the client's bytes must wait (e.g. for memory to hold a
    /// header block); [`Engine::deadline`] says when to try again.
    fn client_paused(&self) -> bool {
        false
    }
    /// When [`Engine::on_deadline`] wants to run.
    fn deadline(&self) -> Option<Instant> {
        None
    }
    /// The deadline passed.
    fn on_deadline(&mut self, _io: &mut Io) {}
    /// Whether the engine waits for the node model.
    fn wants_ready(&self) -> bool {
        false
    }
    /// The node model is ready.
    fn on_ready(&mut self, _io: &mut Io) {}
    /// criguard is shutting down: no new calls.
    fn drain(&mut self, _io: &mut Io) {}
}

impl Engine for Conn {
    fn on_client(&mut self, input: &mut BytesMut, io: &mut Io) {
        Conn::on_client(self, input, io)
    }
    fn on_server(&mut self, input: &mut BytesMut, io: &mut Io) {
        Conn::on_server(self, input, io)
    }
    fn done(&self) -> bool {
        Conn::done(self)
    }
    fn client_paused(&self) -> bool {
        Conn::client_paused(self)
    }
    fn deadline(&self) -> Option<Instant> {
        Conn::deadline(self)
    }
    fn on_deadline(&mut self, io: &mut Io) {
        Conn::on_deadline(self, io)
    }
    fn wants_ready(&self) -> bool {
        Conn::wants_ready(self)
    }
    fn on_ready(&mut self, io: &mut Io) {
        Conn::on_ready(self, io)
    }
    fn drain(&mut self, io: &mut Io) {
        Conn::drain(self, io)
    }
}

/// An engine that passes every byte as it is: a plain relay on the same
/// loop, the floor criguard's overhead is measured against.
#[derive(Debug, Default)]
pub struct Bytes;

impl Engine for Bytes {
    fn on_client(&mut self, input: &mut BytesMut, io: &mut Io) {
        io.to_server.push(input.split().freeze());
    }
    fn on_server(&mut self, input: &mut BytesMut, io: &mut Io) {
        io.to_client.push(input.split().freeze());
    }
}

/// What the async side tells a connection's thread, and how it wakes it.
#[derive(Debug)]
struct Signals {
    ready: AtomicBool,
    drain: AtomicBool,
    stop: AtomicBool,
    wake: EventFd,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        Ok(Self {
            ready: AtomicBool::new(false),
            drain: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            wake: EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?,
        })
    }

    fn raise(&self, flag: &AtomicBool) {
        flag.store(true, Ordering::Release);
        // A full counter (never, at one write per signal) still wakes.
        let _ = self.wake.write(1);
    }
}

/// Tells the thread to stop when the async side goes away (the drain
/// period ended and the connection's task was aborted).
struct StopOnDrop(Arc<Signals>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.raise(&self.0.stop);
    }
}

/// Relays between `client` and `server` through `engine`, on a thread of
/// the connection's own, until either closes or the engine is done.
/// `ready` (if any) turning true lets held calls go on; `drain` turning
/// true starts a drain; dropping the returned future stops the thread.
pub async fn relay<E: Engine + Send + 'static>(
    engine: E,
    client: tokio::net::UnixStream,
    server: tokio::net::UnixStream,
    ready: Option<watch::Receiver<bool>>,
    drain: watch::Receiver<bool>,
) {
    if let Err((err, _)) = try_relay(engine, client, server, ready, drain).await {
        tracing::error!(%err, "could not relay a connection");
    }
}

/// [`relay`], handing the client back when the connection cannot be
/// relayed at all (no eventfd: out of descriptors), so that it can be
/// answered.
pub async fn try_relay<E: Engine + Send + 'static>(
    mut engine: E,
    client: tokio::net::UnixStream,
    server: tokio::net::UnixStream,
    mut ready: Option<watch::Receiver<bool>>,
    mut drain: watch::Receiver<bool>,
) -> Result<(), (std::io::Error, tokio::net::UnixStream)> {
    let signals = match Signals::new() {
        Ok(s) => Arc::new(s),
        Err(err) => return Err((err, client)),
    };
    let (client, server) = match (client.into_std(), server.into_std()) {
        (Ok(c), Ok(s)) => (c, s),
        (Err(err), _) | (_, Err(err)) => {
            tracing::error!(%err, "could not take over a relayed connection");
            return Ok(());
        }
    };
    let (done_tx, mut done) = oneshot::channel::<()>();
    let theirs = signals.clone();
    let spawned = std::thread::Builder::new()
        .name("criguard-conn".into())
        .spawn(move || {
            pump(&mut engine, &client, &server, &theirs);
            let _ = done_tx.send(());
        });
    if let Err(err) = spawned {
        tracing::error!(%err, "no thread for a relayed connection");
        return Ok(());
    }
    let _stop = StopOnDrop(signals.clone());
    let (mut ready_told, mut drain_told) = (false, false);
    loop {
        tokio::select! {
            _ = &mut done => return Ok(()),
            () = ready_or_gone(&mut ready), if !ready_told => {
                ready_told = true;
                signals.raise(&signals.ready);
            }
            // A drain already under way counts; a sender gone is a drain
            // too: criguard is stopping.
            _ = drain.wait_for(|d| *d), if !drain_told => {
                drain_told = true;
                signals.raise(&signals.drain);
            }
        }
    }
}

async fn ready_or_gone(ready: &mut Option<watch::Receiver<bool>>) {
    if let Some(r) = ready {
        // An error means the sender is gone: nothing to wait for.
        let _ = r.wait_for(|v| *v).await;
    }
}

/// One side of a relayed connection.
struct Side<'a> {
    stream: &'a UnixStream,
    input: BytesMut,
    open: bool,
}

impl Side<'_> {
    /// Reads what the socket holds into `input` through `scratch`; false
    /// once the peer closed or failed.
    fn read(&mut self, scratch: &mut [u8]) -> bool {
        match (&*self.stream).read(scratch) {
            Ok(0) => false,
            Ok(n) => {
                self.input.extend_from_slice(&scratch[..n]);
                true
            }
            Err(e) => matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted),
        }
    }
}

/// Milliseconds to wait for `deadline` in poll(2), rounded up.
fn timeout_for(deadline: Option<Instant>) -> PollTimeout {
    match deadline {
        None => PollTimeout::NONE,
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            let ms = left.as_micros().div_ceil(1000);
            PollTimeout::try_from(ms.min(i32::MAX as u128) as i32).unwrap_or(PollTimeout::MAX)
        }
    }
}

fn interest(reading: bool, writing: bool) -> PollFlags {
    let mut f = PollFlags::empty();
    if reading {
        f |= PollFlags::POLLIN;
    }
    if writing {
        f |= PollFlags::POLLOUT;
    }
    f
}

/// Whether a side's poll result asks for a read: data, or a hang-up or an
/// error that only a read can show (also when reading was paused, so a
/// gone peer never spins the loop).
fn wants_read(revents: Option<PollFlags>) -> bool {
    revents
        .is_some_and(|r| r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR))
}

/// The relay loop of one connection; returns when either peer closed, the
/// engine is done or [`relay`] went away.
fn pump<E: Engine>(engine: &mut E, client: &UnixStream, server: &UnixStream, signals: &Signals) {
    let mut io = Io::default();
    let mut scratch = vec![0u8; READ_CHUNK];
    let mut c = Side {
        stream: client,
        input: BytesMut::new(),
        open: true,
    };
    let mut s = Side {
        stream: server,
        input: BytesMut::new(),
        open: true,
    };
    let mut draining = false;
    // Since when the runtime takes no more bytes (it is closing).
    let mut server_gone: Option<Instant> = None;
    let mut was_paused = false;
    loop {
        if signals.stop.load(Ordering::Acquire) {
            return;
        }
        if !draining && signals.drain.load(Ordering::Acquire) {
            draining = true;
            engine.drain(&mut io);
        }
        if engine.wants_ready() && signals.ready.load(Ordering::Acquire) {
            engine.on_ready(&mut io);
        }
        if engine.deadline().is_some_and(|d| d <= Instant::now()) {
            engine.on_deadline(&mut io);
        }
        if was_paused && !engine.client_paused() && !c.input.is_empty() {
            // What was read before the pause goes on now.
            engine.on_client(&mut c.input, &mut io);
        }
        was_paused = engine.client_paused();
        if server_gone.is_none() && !write_out(server, &mut io.to_server) {
            // The runtime closed its side: what it sent before (a GOAWAY)
            // is still to be read and passed on.
            server_gone = Some(Instant::now());
        }
        if server_gone.is_some() {
            io.to_server = Default::default();
        }
        c.open &= write_out(client, &mut io.to_client);
        let server_done = server_gone.is_some_and(|t| t.elapsed() >= FINAL_FLUSH);
        if !(c.open && s.open) || server_done || engine.done() {
            break;
        }
        let read_c = server_gone.is_none()
            && !was_paused
            && io.to_server.len() < HIGH_WATER
            && io.to_client.len() < HIGH_WATER;
        let read_s = io.to_client.len() < HIGH_WATER;
        let write_s = server_gone.is_none() && !io.to_server.is_empty();
        let mut fds = [
            PollFd::new(client.as_fd(), interest(read_c, !io.to_client.is_empty())),
            PollFd::new(server.as_fd(), interest(read_s, write_s)),
            PollFd::new(signals.wake.as_fd(), PollFlags::POLLIN),
        ];
        let deadline = match (engine.deadline(), server_gone) {
            (Some(d), Some(t)) => Some(d.min(t + FINAL_FLUSH)),
            (d, t) => d.or(t.map(|t| t + FINAL_FLUSH)),
        };
        match poll(&mut fds, timeout_for(deadline)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(err) => {
                tracing::error!(%err, "poll failed on a relayed connection");
                break;
            }
        }
        let (rc, rs, rw) = (fds[0].revents(), fds[1].revents(), fds[2].revents());
        // A hang-up or an error is read even while reading is paused, so
        // a gone client never spins the loop.
        let hup = rc.is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR));
        if wants_read(rc) && (read_c || hup) {
            c.open = c.read(&mut scratch);
            if !c.input.is_empty() && !engine.client_paused() {
                engine.on_client(&mut c.input, &mut io);
            }
        }
        if wants_read(rs) {
            s.open = s.read(&mut scratch);
            if !s.input.is_empty() {
                engine.on_server(&mut s.input, &mut io);
            }
        }
        if rw.is_some_and(|r| r.contains(PollFlags::POLLIN)) {
            let _ = signals.wake.read();
        }
    }
    // What is queued for a peer still open goes out, briefly.
    let end = Instant::now() + FINAL_FLUSH;
    s.open &= server_gone.is_none();
    loop {
        c.open = c.open && write_out(client, &mut io.to_client);
        s.open = s.open && write_out(server, &mut io.to_server);
        let c_waits = c.open && !io.to_client.is_empty();
        let s_waits = s.open && !io.to_server.is_empty();
        if !(c_waits || s_waits) || Instant::now() >= end || signals.stop.load(Ordering::Acquire) {
            return;
        }
        let mut fds = [
            PollFd::new(client.as_fd(), interest(false, c_waits)),
            PollFd::new(server.as_fd(), interest(false, s_waits)),
        ];
        let _ = poll(&mut fds, timeout_for(Some(end)));
    }
}
