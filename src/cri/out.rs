//! Bytes waiting to be written to one peer.
//!
//! Forwarded frames are kept as the slices they were read as (no copy) and
//! written with one vectored write; a run of frames read together leaves as
//! one slice.

use std::collections::VecDeque;
use std::io::{ErrorKind, IoSlice, Write};
use std::os::unix::net::UnixStream;

use bytes::{Buf, Bytes};

/// Bytes waiting for a peer above which the relay stops adding to them:
/// the other peer is not read (the pump) and no more of a body criguard
/// sends is framed (the runtime's side). The kernel's socket buffers hold
/// about as much again; more only absorbs the back-pressure a flood should
/// meet (4 MiB let a SETTINGS flood put 200 000 frames into containerd
/// where 14 000 got in directly).
pub const HIGH_WATER: usize = 64 << 10;
/// The most slices handed to one vectored write.
const MAX_SLICES: usize = 64;

/// A queue of byte chunks for one peer, written in order.
#[derive(Debug, Default)]
pub struct Out {
    chunks: VecDeque<Bytes>,
    len: usize,
}

impl Out {
    /// Appends `b` (nothing if empty).
    pub fn push(&mut self, b: Bytes) {
        if !b.is_empty() {
            self.len += b.len();
            self.chunks.push_back(b);
        }
    }

    /// Bytes waiting.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Fills `slices` with the first chunks; returns how many it filled.
    pub fn slices<'a>(&'a self, slices: &mut [IoSlice<'a>; MAX_SLICES]) -> usize {
        let mut n = 0;
        for (slot, chunk) in slices.iter_mut().zip(&self.chunks) {
            *slot = IoSlice::new(chunk);
            n += 1;
        }
        n
    }

    /// Drops the first `n` bytes, which were written.
    pub fn consume(&mut self, mut n: usize) {
        self.len -= n;
        while n > 0 {
            let front = self.chunks.front_mut().expect("consumed more than queued");
            if front.len() > n {
                front.advance(n);
                return;
            }
            n -= front.len();
            self.chunks.pop_front();
        }
    }

    /// Everything queued, as one buffer (tests).
    pub fn take_all(&mut self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        for c in self.chunks.drain(..) {
            v.extend_from_slice(&c);
        }
        self.len = 0;
        v
    }
}

/// Writes as much of `out` as `w` takes in one vectored write.
pub async fn write_some<W>(w: &mut W, out: &mut Out) -> std::io::Result<()>
where
    W: tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncWriteExt;
    let written = {
        let mut slices = [IoSlice::new(&[]); MAX_SLICES];
        let n = out.slices(&mut slices);
        w.write_vectored(&slices[..n]).await?
    };
    if written == 0 {
        return Err(std::io::ErrorKind::WriteZero.into());
    }
    out.consume(written);
    Ok(())
}

/// Writes what `out` holds to `stream` until it would block; false once
/// the peer is gone.
pub fn write_out(stream: &UnixStream, out: &mut Out) -> bool {
    while !out.is_empty() {
        let written = {
            let mut slices = [IoSlice::new(&[]); MAX_SLICES];
            let n = out.slices(&mut slices);
            (&*stream).write_vectored(&slices[..n])
        };
        match written {
            Ok(0) => return false,
            Ok(n) => out.consume(n),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consume_across_chunks_keeps_the_rest_in_order() {
        let mut out = Out::default();
        out.push(Bytes::from_static(b"abc"));
        out.push(Bytes::new());
        out.push(Bytes::from_static(b"defg"));
        assert_eq!(out.len(), 7);
        out.consume(4);
        assert_eq!(out.len(), 3);
        assert_eq!(out.take_all(), b"efg");
        assert!(out.is_empty());
    }
}
