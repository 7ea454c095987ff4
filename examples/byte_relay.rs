//! A plain byte relay between unix sockets: the floor `hack/bench-proxy.sh`
//! measures criguard against. Each accepted connection gets its own
//! connection to the upstream, and bytes are copied both ways as they come,
//! never looked at.
//!
//! Usage: `byte_relay --listen PATH --upstream PATH [--mode poll|threads|splice|tokio|pump]`
//!
//! Modes (measured against each other with grpc-go calls through an echo
//! upstream on the 2-core VM, `poll` was the fastest and cheapest: about
//! 20-35 µs of CPU per call against 30-90 µs for socat):
//! - `poll` (default): one thread per connection in poll(2) on both
//!   sockets, one read and a blocking write per wake-up: one wake-up per
//!   chunk, three syscalls, no reactor between the kernel and the copy.
//! - `threads`: two threads per connection, each blocked in read(2); the
//!   same syscalls minus poll, but each call wakes two different threads.
//! - `splice`: the `threads` layout moving bytes with splice(2) through a
//!   pipe, never entering user space (two splices per chunk).
//! - `tokio`: `copy_bidirectional` on a current-thread runtime, one task
//!   per connection (what a tokio proxy does without thinking).
//! - `pump`: criguard's own relay loop (`criguard::cri::pump`) with an
//!   engine that passes every byte: criguard's hot path without the frame
//!   handling, so the bench shows what the frames themselves cost.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

const CHUNK: usize = 256 * 1024;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Threads,
    Poll,
    Splice,
    Tokio,
    Pump,
}

struct Args {
    listen: PathBuf,
    upstream: PathBuf,
    mode: Mode,
}

fn parse() -> Result<Args, String> {
    let (mut listen, mut upstream, mut mode) = (None, None, Mode::Poll);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--listen" => listen = Some(PathBuf::from(value()?)),
            "--upstream" => upstream = Some(PathBuf::from(value()?)),
            "--mode" => {
                mode = match value()?.as_str() {
                    "threads" => Mode::Threads,
                    "poll" => Mode::Poll,
                    "splice" => Mode::Splice,
                    "tokio" => Mode::Tokio,
                    "pump" => Mode::Pump,
                    other => {
                        return Err(format!(
                            "--mode {other:?}: expected poll, threads, splice, tokio or pump"
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
        eprintln!("byte_relay: {e}\nusage: byte_relay --listen PATH --upstream PATH [--mode poll|threads|splice|tokio|pump]");
        std::process::exit(2);
    });
    let _ = std::fs::remove_file(&args.listen);
    let listener = UnixListener::bind(&args.listen).unwrap_or_else(|e| {
        eprintln!("byte_relay: bind {}: {e}", args.listen.display());
        std::process::exit(1);
    });
    if matches!(args.mode, Mode::Tokio | Mode::Pump) {
        return tokio_relay(listener, args.upstream, args.mode == Mode::Pump);
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
        if args.mode == Mode::Poll {
            std::thread::spawn(move || poll_pump(client, upstream));
            continue;
        }
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

/// Both directions on one thread: poll(2) on both sockets, then one read
/// and a blocking write of what it got.
fn poll_pump(mut a: UnixStream, mut b: UnixStream) {
    let mut buf = vec![0u8; CHUNK];
    let mut open = [true, true];
    while open[0] || open[1] {
        let mut fds = [
            libc::pollfd {
                fd: if open[0] { a.as_raw_fd() } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: if open[1] { b.as_raw_fd() } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll over an array of two pollfds we own.
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
            break;
        }
        for i in 0..2 {
            if fds[i].revents == 0 {
                continue;
            }
            let (from, to) = if i == 0 {
                (&mut a, &mut b)
            } else {
                (&mut b, &mut a)
            };
            match from.read(&mut buf) {
                Ok(n) if n > 0 && to.write_all(&buf[..n]).is_ok() => {}
                _ => {
                    open[i] = false;
                    let _ = to.shutdown(Shutdown::Write);
                }
            }
        }
    }
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

fn tokio_relay(listener: UnixListener, upstream: PathBuf, pump: bool) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
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
                let Ok(mut up) = tokio::net::UnixStream::connect(&upstream).await else {
                    return;
                };
                if pump {
                    let drain = tokio_util::sync::CancellationToken::new();
                    criguard::cri::pump::relay(criguard::cri::pump::Plain, client, up, None, drain)
                        .await;
                } else {
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
