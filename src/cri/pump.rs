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
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::conn::{Conn, Io};
pub use super::out::HIGH_WATER;
use super::out::write_out;
use super::proxy::Ready;

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
    /// The runtime's queue has room below [`HIGH_WATER`] after a write.
    fn on_server_room(&mut self, _io: &mut Io) {}
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
    fn on_server_room(&mut self, io: &mut Io) {
        Conn::on_server_room(self, io)
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
/// (Named `Plain` rather than `Bytes`, which would shadow `bytes::Bytes`.)
#[derive(Debug, Default)]
pub struct Plain;

impl Engine for Plain {
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
    ready: Option<Ready>,
    drain: CancellationToken,
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
    ready: Option<Ready>,
    drain: CancellationToken,
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
            () = ready_or_none(&ready), if !ready_told => {
                ready_told = true;
                signals.raise(&signals.ready);
            }
            // A drain already under way counts.
            () = drain.cancelled(), if !drain_told => {
                drain_told = true;
                signals.raise(&signals.drain);
            }
        }
    }
}

/// Resolves once `ready` is set, at once without one.
async fn ready_or_none(ready: &Option<Ready>) {
    if let Some(r) = ready {
        r.wait().await;
    }
}

/// One side of a relayed connection.
struct Side<'a> {
    stream: &'a UnixStream,
    input: BytesMut,
    open: bool,
}

impl<'a> Side<'a> {
    fn new(stream: &'a UnixStream) -> Self {
        Self {
            stream,
            input: BytesMut::new(),
            open: true,
        }
    }

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
    let mut p = Pump {
        engine,
        signals,
        io: Io::default(),
        scratch: vec![0u8; READ_CHUNK],
        c: Side::new(client),
        s: Side::new(server),
        draining: false,
        server_gone: None,
        was_paused: false,
    };
    loop {
        match p.turn() {
            Turn::Again => {}
            Turn::Flush => return p.flush(),
            Turn::Stop => return,
        }
    }
}

/// What the relay loop does after a turn.
enum Turn {
    /// Another turn.
    Again,
    /// The connection ends: what is queued goes out, briefly.
    Flush,
    /// [`relay`] went away: the thread ends at once.
    Stop,
}

/// Which sockets a turn of the loop waits on, for reading and writing.
#[derive(Debug, PartialEq, Eq)]
struct Interest {
    read_client: bool,
    write_client: bool,
    read_server: bool,
    write_server: bool,
}

/// What a turn waits on: the client is read only while the runtime takes
/// bytes, the engine does not pause it and neither queue is above
/// [`HIGH_WATER`]; the runtime while the client's queue is not; each is
/// written while bytes wait for it (the runtime only while it takes them).
fn interest_of(server_gone: bool, paused: bool, to_server: usize, to_client: usize) -> Interest {
    Interest {
        read_client: !server_gone && !paused && to_server < HIGH_WATER && to_client < HIGH_WATER,
        write_client: to_client > 0,
        read_server: to_client < HIGH_WATER,
        write_server: !server_gone && to_server > 0,
    }
}

/// When a turn's poll must return at the latest: the engine's deadline,
/// or the end of the final flush once the runtime is gone, whichever
/// comes first.
fn wake_at(engine: Option<Instant>, server_gone: Option<Instant>) -> Option<Instant> {
    let flush_end = server_gone.map(|t| t + FINAL_FLUSH);
    match (engine, flush_end) {
        (Some(d), Some(f)) => Some(d.min(f)),
        (d, f) => d.or(f),
    }
}

/// The state of one connection's relay loop.
struct Pump<'a, E> {
    engine: &'a mut E,
    signals: &'a Signals,
    io: Io,
    scratch: Vec<u8>,
    c: Side<'a>,
    s: Side<'a>,
    draining: bool,
    /// Since when the runtime takes no more bytes (it is closing).
    server_gone: Option<Instant>,
    was_paused: bool,
}

impl<E: Engine> Pump<'_, E> {
    /// One turn: hear the async side, write what waits, wait for the
    /// sockets, read what came.
    fn turn(&mut self) -> Turn {
        if self.signals.stop.load(Ordering::Acquire) {
            return Turn::Stop;
        }
        self.hear();
        if !self.write() {
            return Turn::Flush;
        }
        let want = interest_of(
            self.server_gone.is_some(),
            self.was_paused,
            self.io.to_server.len(),
            self.io.to_client.len(),
        );
        match self.wait(&want) {
            Some(revents) => {
                self.read(&want, revents);
                Turn::Again
            }
            None => Turn::Flush,
        }
    }

    /// Passes on what the async side said (drain, node model ready), runs
    /// the engine's deadline, and feeds the engine what was read before
    /// its pause once the pause is over.
    fn hear(&mut self) {
        let (engine, io) = (&mut *self.engine, &mut self.io);
        if !self.draining && self.signals.drain.load(Ordering::Acquire) {
            self.draining = true;
            engine.drain(io);
        }
        if engine.wants_ready() && self.signals.ready.load(Ordering::Acquire) {
            engine.on_ready(io);
        }
        if engine.deadline().is_some_and(|d| d <= Instant::now()) {
            engine.on_deadline(io);
        }
        if self.was_paused && !engine.client_paused() && !self.c.input.is_empty() {
            // What was read before the pause goes on now.
            engine.on_client(&mut self.c.input, io);
        }
        self.was_paused = engine.client_paused();
    }

    /// Writes what waits for each peer; false when the connection ends (a
    /// peer closed, the runtime's final flush is over, or the engine is
    /// done).
    fn write(&mut self) -> bool {
        let io = &mut self.io;
        if self.server_gone.is_none() && !write_out(self.s.stream, &mut io.to_server) {
            // The runtime closed its side: what it sent before (a GOAWAY)
            // is still to be read and passed on.
            self.server_gone = Some(Instant::now());
        }
        if self.server_gone.is_some() {
            io.to_server = Default::default();
        } else if io.to_server.len() < HIGH_WATER {
            self.engine.on_server_room(io);
        }
        self.c.open &= write_out(self.c.stream, &mut io.to_client);
        let server_done = self.server_gone.is_some_and(|t| t.elapsed() >= FINAL_FLUSH);
        self.c.open && self.s.open && !server_done && !self.engine.done()
    }

    /// Waits in poll(2) for what `want` asks, a wake-up or the next
    /// deadline; the sockets' and the eventfd's results, or `None` when
    /// poll failed.
    fn wait(&mut self, want: &Interest) -> Option<[Option<PollFlags>; 3]> {
        let mut fds = [
            PollFd::new(
                self.c.stream.as_fd(),
                interest(want.read_client, want.write_client),
            ),
            PollFd::new(
                self.s.stream.as_fd(),
                interest(want.read_server, want.write_server),
            ),
            PollFd::new(self.signals.wake.as_fd(), PollFlags::POLLIN),
        ];
        let deadline = wake_at(self.engine.deadline(), self.server_gone);
        match poll(&mut fds, timeout_for(deadline)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(err) => {
                tracing::error!(%err, "poll failed on a relayed connection");
                return None;
            }
        }
        Some([fds[0].revents(), fds[1].revents(), fds[2].revents()])
    }

    /// Reads what poll reported and hands it to the engine.
    fn read(&mut self, want: &Interest, [rc, rs, rw]: [Option<PollFlags>; 3]) {
        let (engine, io) = (&mut *self.engine, &mut self.io);
        // A hang-up or an error is read even while reading is paused, so
        // a gone client never spins the loop.
        let hup = rc.is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR));
        if wants_read(rc) && (want.read_client || hup) {
            self.c.open = self.c.read(&mut self.scratch);
            if !self.c.input.is_empty() && !engine.client_paused() {
                engine.on_client(&mut self.c.input, io);
            }
        }
        if wants_read(rs) {
            self.s.open = self.s.read(&mut self.scratch);
            if !self.s.input.is_empty() {
                engine.on_server(&mut self.s.input, io);
            }
        }
        if rw.is_some_and(|r| r.contains(PollFlags::POLLIN)) {
            let _ = self.signals.wake.read();
        }
    }

    /// What is queued for a peer still open goes out, briefly.
    fn flush(mut self) {
        let end = Instant::now() + FINAL_FLUSH;
        let (c, s, io) = (&mut self.c, &mut self.s, &mut self.io);
        s.open &= self.server_gone.is_none();
        loop {
            c.open = c.open && write_out(c.stream, &mut io.to_client);
            s.open = s.open && write_out(s.stream, &mut io.to_server);
            let c_waits = c.open && !io.to_client.is_empty();
            let s_waits = s.open && !io.to_server.is_empty();
            if !(c_waits || s_waits)
                || Instant::now() >= end
                || self.signals.stop.load(Ordering::Acquire)
            {
                return;
            }
            let mut fds = [
                PollFd::new(c.stream.as_fd(), interest(false, c_waits)),
                PollFd::new(s.stream.as_fd(), interest(false, s_waits)),
            ];
            let _ = poll(&mut fds, timeout_for(Some(end)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_is_read_only_while_everything_downstream_has_room() {
        let all = Interest {
            read_client: true,
            write_client: false,
            read_server: true,
            write_server: false,
        };
        assert_eq!(interest_of(false, false, 0, 0), all);
        assert!(!interest_of(true, false, 0, 0).read_client);
        assert!(!interest_of(false, true, 0, 0).read_client);
        assert!(!interest_of(false, false, HIGH_WATER, 0).read_client);
        let full_client = interest_of(false, false, 0, HIGH_WATER);
        assert!(!full_client.read_client && !full_client.read_server);
        assert!(full_client.write_client);
        assert!(interest_of(false, false, 1, 0).write_server);
        assert!(!interest_of(true, false, 1, 0).write_server);
    }

    #[test]
    fn a_turn_wakes_for_the_earlier_of_the_deadline_and_the_final_flush() {
        let now = Instant::now();
        let soon = now + Duration::from_millis(10);
        assert_eq!(wake_at(None, None), None);
        assert_eq!(wake_at(Some(soon), None), Some(soon));
        assert_eq!(wake_at(None, Some(now)), Some(now + FINAL_FLUSH));
        assert_eq!(wake_at(Some(soon), Some(now)), Some(soon));
        let late = now + 2 * FINAL_FLUSH;
        assert_eq!(wake_at(Some(late), Some(now)), Some(now + FINAL_FLUSH));
    }
}
