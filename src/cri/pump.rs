//! Moving the bytes of one connection: the relay's I/O loop.
//!
//! One task per kubelet connection owns both sockets and the connection's
//! state; it waits on whichever side is readable or writable, with no
//! locks and no channels between the directions. A read takes what the
//! socket holds (up to 64 KiB), the engine turns it into slices for the
//! other side, and one vectored write sends them: per call, about one
//! read and one write each way, as for a plain byte relay. Reading from a
//! side pauses while more than [`HIGH_WATER`] bytes wait for the other.
//!
//! When either peer closes, what is queued for the other is written (for
//! at most [`FINAL_FLUSH`]) and the connection ends, as a plain relay
//! ends: a kubelet sees its runtime connection close when the runtime's
//! closes.

use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;
use tokio::sync::watch;

use super::conn::{Conn, Io};
use super::out::write_some;

/// Bytes waiting for a peer above which the other peer is not read.
pub const HIGH_WATER: usize = 4 << 20;
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

fn make_room(buf: &mut BytesMut) {
    if buf.capacity() - buf.len() < READ_CHUNK / 4 {
        buf.reserve(READ_CHUNK);
    }
}

/// Sleeps until `deadline`; never returns without one. The timer is made
/// only when polled, so the common case (no deadline) costs nothing.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

async fn ready_or_gone(ready: &mut Option<watch::Receiver<bool>>) {
    if let Some(r) = ready {
        // An error means the sender is gone: nothing to wait for.
        let _ = r.wait_for(|v| *v).await;
    }
}

/// Relays between `client` and `server` through `engine` until either
/// closes or the engine is done. `drain` turning true starts a drain.
pub async fn pump<E: Engine>(
    engine: &mut E,
    mut client: UnixStream,
    mut server: UnixStream,
    mut ready: Option<watch::Receiver<bool>>,
    mut drain: watch::Receiver<bool>,
) {
    let mut io = Io::default();
    let (mut cr, mut cw) = client.split();
    let (mut sr, mut sw) = server.split();
    let mut cin = BytesMut::new();
    let mut sin = BytesMut::new();
    let (mut client_open, mut server_open) = (true, true);
    let mut draining = *drain.borrow_and_update();
    if draining {
        engine.drain(&mut io);
    }
    while client_open && server_open && !engine.done() {
        make_room(&mut cin);
        make_room(&mut sin);
        let deadline = engine.deadline();
        tokio::select! {
            biased;
            r = cr.read_buf(&mut cin), if io.to_server.len() < HIGH_WATER => match r {
                Ok(n) if n > 0 => engine.on_client(&mut cin, &mut io),
                _ => client_open = false,
            },
            r = sr.read_buf(&mut sin), if io.to_client.len() < HIGH_WATER => match r {
                Ok(n) if n > 0 => engine.on_server(&mut sin, &mut io),
                _ => server_open = false,
            },
            r = write_some(&mut sw, &mut io.to_server), if !io.to_server.is_empty() => {
                server_open = r.is_ok();
            }
            r = write_some(&mut cw, &mut io.to_client), if !io.to_client.is_empty() => {
                client_open = r.is_ok();
            }
            () = until(deadline), if deadline.is_some() => engine.on_deadline(&mut io),
            () = ready_or_gone(&mut ready), if engine.wants_ready() => engine.on_ready(&mut io),
            _ = drain.changed(), if !draining => {
                draining = true;
                engine.drain(&mut io);
            }
        }
    }
    // What is queued for a peer still open goes out, briefly.
    let flush = async {
        while client_open && !io.to_client.is_empty() {
            client_open = write_some(&mut cw, &mut io.to_client).await.is_ok();
        }
        while server_open && !io.to_server.is_empty() {
            server_open = write_some(&mut sw, &mut io.to_server).await.is_ok();
        }
    };
    let _ = tokio::time::timeout(FINAL_FLUSH, flush).await;
}
