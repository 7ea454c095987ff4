//! A plain byte relay between unix sockets: the floor `hack/bench-proxy.sh`
//! measures criguard against. Each accepted connection gets its own
//! connection to the upstream, and bytes are copied both ways as they come,
//! never looked at.
//!
//! Usage: `byte_relay --listen PATH --upstream PATH [--mode threads|splice|tokio]`
//!
//! Modes (the default is the fastest measured here, see the README):
//! - `threads`: two threads per connection, each blocked in read(2) and
//!   writing what it got at once: one wake-up and two syscalls per chunk,
//!   no reactor between the kernel and the copy.
//! - `splice`: the same threads moving bytes with splice(2) through a pipe,
//!   so they never enter user space (two splices per chunk).
//! - `tokio`: `copy_bidirectional` on a current-thread runtime, one task
//!   per connection (what a tokio proxy does without thinking).

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

const CHUNK: usize = 256 * 1024;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Threads,
    Splice,
    Tokio,
}

struct Args {
    listen: PathBuf,
    upstream: PathBuf,
    mode: Mode,
}

fn parse() -> Result<Args, String> {
    let (mut listen, mut upstream, mut mode) = (None, None, Mode::Threads);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--listen" => listen = Some(PathBuf::from(value()?)),
            "--upstream" => upstream = Some(PathBuf::from(value()?)),
            "--mode" => {
                mode = match value()?.as_str() {
                    "threads" => Mode::Threads,
                    "splice" => Mode::Splice,
                    "tokio" => Mode::Tokio,
                    other => {
                        return Err(format!(
                            "--mode {other:?}: expected threads, splice or tokio"
                        ));
                    }
                }
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Args {
        listen: listen.ok_or("--listen PATH is required")?,
        upstream: upstream.ok_or("--upstream PATH is required")?,
        mode,
    })
}

fn main() {
    let args = parse().unwrap_or_else(|e| {
        eprintln!("byte_relay: {e}\nusage: byte_relay --listen PATH --upstream PATH [--mode threads|splice|tokio]");
        std::process::exit(2);
    });
    let _ = std::fs::remove_file(&args.listen);
    let listener = UnixListener::bind(&args.listen).unwrap_or_else(|e| {
        eprintln!("byte_relay: bind {}: {e}", args.listen.display());
        std::process::exit(1);
    });
    if args.mode == Mode::Tokio {
        return tokio_relay(listener, args.upstream);
    }
    for client in listener.incoming() {
        let Ok(client) = client else { continue };
        let upstream = match UnixStream::connect(&args.upstream) {
            Ok(u) => u,
            Err(e) => {
                eprintln!("byte_relay: connect {}: {e}", args.upstream.display());
                continue;
            }
        };
        let (c2, u2) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
        let pump = if args.mode == Mode::Splice {
            splice_pump
        } else {
            copy_pump
        };
        std::thread::spawn(move || pump(client, upstream));
        std::thread::spawn(move || pump(u2, c2));
    }
}

/// Copies `from` to `to` until EOF, then half-closes `to`.
fn copy_pump(mut from: UnixStream, mut to: UnixStream) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// [`copy_pump`] through a pipe with splice(2): no copy to user space.
fn splice_pump(from: UnixStream, to: UnixStream) {
    let mut pipe = [0; 2];
    // SAFETY: pipe2 writes two fds into the array it is given.
    if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return copy_pump(from, to);
    }
    // SAFETY: a larger pipe only needs a valid pipe fd; failure is harmless.
    unsafe { libc::fcntl(pipe[1], libc::F_SETPIPE_SZ, CHUNK as libc::c_int) };
    let (src, dst) = (from.as_raw_fd(), to.as_raw_fd());
    'outer: loop {
        // SAFETY: splice between fds we own, no offsets.
        let n = unsafe {
            libc::splice(
                src,
                std::ptr::null_mut(),
                pipe[1],
                std::ptr::null_mut(),
                CHUNK,
                libc::SPLICE_F_MOVE,
            )
        };
        if n <= 0 {
            break;
        }
        let mut left = n as usize;
        while left > 0 {
            // SAFETY: as above.
            let m = unsafe {
                libc::splice(
                    pipe[0],
                    std::ptr::null_mut(),
                    dst,
                    std::ptr::null_mut(),
                    left,
                    libc::SPLICE_F_MOVE,
                )
            };
            if m <= 0 {
                break 'outer;
            }
            left -= m as usize;
        }
    }
    // SAFETY: closing the pipe fds we created.
    unsafe {
        libc::close(pipe[0]);
        libc::close(pipe[1]);
    }
    let _ = to.shutdown(Shutdown::Write);
}

fn tokio_relay(listener: UnixListener, upstream: PathBuf) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    rt.block_on(async move {
        listener.set_nonblocking(true).unwrap();
        let listener = tokio::net::UnixListener::from_std(listener).unwrap();
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                continue;
            };
            let upstream = upstream.clone();
            tokio::spawn(async move {
                if let Ok(mut up) = tokio::net::UnixStream::connect(&upstream).await {
                    let _ = tokio::io::copy_bidirectional_with_sizes(
                        &mut client,
                        &mut up,
                        CHUNK,
                        CHUNK,
                    )
                    .await;
                }
            });
        }
    });
}
