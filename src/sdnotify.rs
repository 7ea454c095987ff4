//! systemd's readiness protocol (`sd_notify(3)`): one datagram of
//! `KEY=VALUE` lines to the socket named in `NOTIFY_SOCKET`, a path or
//! (with a leading `@`) an abstract name. Without the variable (not run
//! by systemd as `Type=notify`) nothing is sent.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (e.g. `READY=1`, `MAINPID=42`); `Ok(false)` when not
/// run under a `Type=notify` unit.
pub fn notify(state: &str) -> std::io::Result<bool> {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let sock = UnixDatagram::unbound()?;
    let bytes = path.as_encoded_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        sock.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        sock.send_to(state.as_bytes(), &path)?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_reaches_the_socket_named_in_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        // SAFETY: this test alone reads or writes NOTIFY_SOCKET.
        unsafe { std::env::set_var("NOTIFY_SOCKET", &path) };
        let sent = notify("READY=1\nMAINPID=7");
        unsafe { std::env::remove_var("NOTIFY_SOCKET") };
        assert!(sent.unwrap());
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nMAINPID=7");
        assert!(
            !notify("READY=1").unwrap(),
            "no NOTIFY_SOCKET: nothing sent"
        );
    }
}
