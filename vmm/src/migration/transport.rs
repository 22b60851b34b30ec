//! The migration's connection: `unix:PATH` (a Unix socket, which also carries the memory
//! fds of a `local` migration) or `tcp:HOST:PORT`. The receiver listens and takes one
//! connection; the sender connects.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::Duration;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use super::receiver::Channel;
use super::MigrationError;

/// Where a migration goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigrationUrl {
    Unix(PathBuf),
    Tcp(String),
}

impl MigrationUrl {
    /// `unix:PATH` (also `unix://PATH`) or `tcp:HOST:PORT`.
    pub fn parse(url: &str) -> Result<Self, MigrationError> {
        let bad = || MigrationError::Url(url.to_string());
        if let Some(path) = url.strip_prefix("unix:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() || path.contains('\0') {
                return Err(bad());
            }
            return Ok(MigrationUrl::Unix(PathBuf::from(path)));
        }
        let addr = url.strip_prefix("tcp:").ok_or_else(bad)?;
        let addr = addr.strip_prefix("//").unwrap_or(addr);
        match addr.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                Ok(MigrationUrl::Tcp(addr.to_string()))
            }
            _ => Err(bad()),
        }
    }

    fn name(&self) -> String {
        match self {
            MigrationUrl::Unix(p) => format!("unix:{}", p.display()),
            MigrationUrl::Tcp(a) => format!("tcp:{a}"),
        }
    }

    /// Listens on the URL and takes one connection (a Unix socket's file is removed once
    /// connected, and a stale socket before binding; any other file there is left and
    /// refused). Waits until a peer connects or `stop` says to give up (asked every 20 ms:
    /// the VMM's stop signals).
    pub fn accept(&self, stop: &dyn Fn() -> bool) -> Result<Stream, MigrationError> {
        let fail = |e| MigrationError::Connect("listen on", self.name(), e);
        let stream = match self {
            MigrationUrl::Unix(path) => {
                use std::os::unix::fs::FileTypeExt;
                let stale =
                    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket());
                if stale {
                    let _ = std::fs::remove_file(path);
                }
                let listener = UnixListener::bind(path).map_err(fail)?;
                listener.set_nonblocking(true).map_err(fail)?;
                let accepted =
                    until_connected(listener.as_fd(), stop, || listener.accept().map(|a| a.0));
                let _ = std::fs::remove_file(path);
                Stream::Unix(accepted.map_err(fail)?)
            }
            MigrationUrl::Tcp(addr) => {
                let listener = TcpListener::bind(addr.as_str()).map_err(fail)?;
                listener.set_nonblocking(true).map_err(fail)?;
                let s = until_connected(listener.as_fd(), stop, || listener.accept().map(|a| a.0))
                    .map_err(fail)?;
                let _ = s.set_nodelay(true);
                Stream::Tcp(s)
            }
        };
        stream.set_timeout().map_err(fail)?;
        Ok(stream)
    }

    pub fn connect(&self) -> Result<Stream, MigrationError> {
        let fail = |e| MigrationError::Connect("connect to", self.name(), e);
        let stream = match self {
            MigrationUrl::Unix(path) => Stream::Unix(UnixStream::connect(path).map_err(fail)?),
            MigrationUrl::Tcp(addr) => {
                let s = TcpStream::connect(addr.as_str()).map_err(fail)?;
                let _ = s.set_nodelay(true);
                Stream::Tcp(s)
            }
        };
        stream.set_timeout().map_err(fail)?;
        Ok(stream)
    }
}

/// How long either side waits for the other's next byte before giving up.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(60);

/// Calls a non-blocking `accept` (its listener, `fd`, set so) until a peer connects or
/// `stop`: between tries it waits in `poll` for the listener to become readable, up to 20 ms
/// at a time (so a connection is taken as it arrives, and `stop` is asked every 20 ms).
fn until_connected<S>(
    fd: BorrowedFd<'_>,
    stop: &dyn Fn() -> bool,
    mut accept: impl FnMut() -> io::Result<S>,
) -> io::Result<S> {
    loop {
        match accept() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if stop() {
                    return Err(io::Error::new(
                        io::ErrorKind::Interrupted,
                        "a stop signal arrived before the source connected",
                    ));
                }
                wait_readable(fd, 20);
            }
            other => return other,
        }
    }
}

/// Waits until `fd` is readable, at most `ms` milliseconds (an interrupted or failed wait
/// returns early: the caller tries again).
fn wait_readable(fd: BorrowedFd<'_>, ms: i32) {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `p` is one valid pollfd that outlives the call, and the count says one.
    unsafe { libc::poll(&mut p, 1, ms) };
}

/// A migration connection.
pub enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    /// Sends `buf` with `fd` attached (Unix sockets only).
    pub fn send_with_fd(&mut self, buf: &[u8], fd: RawFd) -> io::Result<()> {
        match self {
            Stream::Unix(s) => {
                let n = s.send_with_fd(buf, fd).map_err(io::Error::from)?;
                if n != buf.len() {
                    return Err(io::Error::new(io::ErrorKind::WriteZero, "short send"));
                }
                Ok(())
            }
            Stream::Tcp(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "file descriptors go over unix: connections only",
            )),
        }
    }

    /// Reads and writes fail after [`PEER_TIMEOUT`] without progress (a peer that hangs).
    fn set_timeout(&self) -> io::Result<()> {
        match self {
            Stream::Unix(s) => {
                s.set_nonblocking(false)?;
                s.set_read_timeout(Some(PEER_TIMEOUT))?;
                s.set_write_timeout(Some(PEER_TIMEOUT))
            }
            Stream::Tcp(s) => {
                s.set_nonblocking(false)?;
                s.set_read_timeout(Some(PEER_TIMEOUT))?;
                s.set_write_timeout(Some(PEER_TIMEOUT))
            }
        }
    }

    /// Whether file descriptors can go over it.
    pub fn carries_fds(&self) -> bool {
        matches!(self, Stream::Unix(_))
    }

    /// The connection's socket.
    pub fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Unix(s) => s.as_fd(),
            Stream::Tcp(s) => s.as_fd(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Channel for Stream {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(Stream::fd(self))
    }

    fn recv_with_fd(&mut self, buf: &mut [u8]) -> io::Result<Option<OwnedFd>> {
        let Stream::Unix(s) = self else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "file descriptors come over unix: connections only",
            ));
        };
        let (n, file) = s.recv_with_fd(buf).map_err(io::Error::from)?;
        if n != buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "a short MemoryFd payload",
            ));
        }
        Ok(file.map(OwnedFd::from))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_unix_paths_or_tcp_host_ports() {
        assert_eq!(
            MigrationUrl::parse("unix:/tmp/m").unwrap(),
            MigrationUrl::Unix("/tmp/m".into())
        );
        assert_eq!(
            MigrationUrl::parse("tcp:127.0.0.1:6000").unwrap(),
            MigrationUrl::Tcp("127.0.0.1:6000".into())
        );
        for bad in [
            "",
            "unix:",
            "tcp:1.2.3.4",
            "tcp::5",
            "tcp:h:99999",
            "file:///x",
        ] {
            assert!(MigrationUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
