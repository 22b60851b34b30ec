//! The host side of the vsock device, Firecracker's "hybrid" convention: host programs reach
//! guest ports through one Unix socket (`CONNECT <port>\n`, answered `OK <hostport>\n`), and
//! a guest connection to host port P is joined to a connection to the Unix socket `PATH_P`.
//! The muxer turns the guest's packets into socket work and socket events into packets for
//! the guest; it never blocks and holds bounded state whatever the guest sends.

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use super::connection::{Connection, Refusal, State, BUF_ALLOC};
use super::packet::*;
use super::VsockCounters;
use crate::devices::virtio::QueueCounters;

/// Connections (and accepted sockets still sending their CONNECT line) at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Packets without payload waiting for receive buffers; more are dropped and counted.
pub const MAX_CONTROL: usize = 1024;
const MAX_CONNECT_LINE: usize = 32;
/// Host ports given to connections host programs open (the guest sees them as the source).
const FIRST_HOST_PORT: u32 = 1 << 30;

/// (host port, guest port).
type Key = (u32, u32);

/// An fd the event loop should watch (readable and writable, edge-triggered) or forget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FdChange {
    Watch(RawFd),
    Forget(RawFd),
}

/// Sockets to close once their fds left the watch list.
pub type Closing = (Vec<UnixStream>, Option<UnixListener>);

/// An accepted host socket that has not finished its `CONNECT <port>\n` line.
struct Accepted {
    stream: UnixStream,
    line: Vec<u8>,
}

pub struct Muxer {
    guest_cid: u64,
    path: PathBuf,
    /// None while let go of for a live migration's destination on this host.
    listener: Option<UnixListener>,
    /// The listener let go of, closed once its fd left the watch list.
    closing_listener: Option<UnixListener>,
    conns: HashMap<Key, Connection>,
    by_fd: HashMap<RawFd, Key>,
    accepted: HashMap<RawFd, Accepted>,
    control: VecDeque<Header>,
    next_host_port: u32,
    /// What the event loop must change in its watch list (taken by the worker).
    fd_changes: Vec<FdChange>,
    /// Sockets whose fds must leave the watch list before they close (a closed fd cannot be
    /// taken out of epoll, and its number comes back with the next socket).
    closing: Vec<UnixStream>,
    counters: Arc<VsockCounters>,
}

fn add(counter: &AtomicU64, n: u64) {
    QueueCounters::add(counter, n);
}

/// A non-blocking connection to the Unix socket at `path`; fails at once rather than wait
/// when the listener's backlog is full.
fn connect_nonblocking(path: &Path) -> std::io::Result<UnixStream> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: all-zero is a valid sockaddr_un; the path is copied in below.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() {
        return Err(ErrorKind::InvalidInput.into());
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let kind = libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    // SAFETY: plain socket creation; the fd is owned at once.
    let fd = unsafe { libc::socket(libc::AF_UNIX, kind, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new socket that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: `addr` is a sockaddr_un of `len` bytes.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(UnixStream::from(fd))
}

impl Muxer {
    pub fn new(
        guest_cid: u64,
        path: PathBuf,
        listener: UnixListener,
        counters: Arc<VsockCounters>,
    ) -> Self {
        Muxer {
            guest_cid,
            path,
            listener: Some(listener),
            closing_listener: None,
            conns: HashMap::new(),
            by_fd: HashMap::new(),
            accepted: HashMap::new(),
            control: VecDeque::new(),
            next_host_port: FIRST_HOST_PORT,
            fd_changes: Vec::new(),
            closing: Vec::new(),
            counters,
        }
    }

    /// The listener's fd (-1 while there is none).
    pub fn listener_fd(&self) -> RawFd {
        self.listener.as_ref().map_or(-1, AsRawFd::as_raw_fd)
    }

    /// Lets go of the listener, for a live migration's destination on this host (which
    /// listens at the same path once the file is removed): closed at once if `watched` is
    /// false (the device does not run), else once the event loop took its fd out of the
    /// watch list ([`Muxer::take_fd_changes`]).
    pub fn release_listener(&mut self, watched: bool) {
        if let Some(listener) = self.listener.take() {
            if watched {
                self.fd_changes.push(FdChange::Forget(listener.as_raw_fd()));
                self.closing_listener = Some(listener);
            }
        }
    }

    /// Listens on `listener` again (the migration failed); the event loop watches it if
    /// `watched` (the device runs), else the next start does.
    pub fn retake_listener(&mut self, listener: UnixListener, watched: bool) {
        if watched {
            self.fd_changes.push(FdChange::Watch(listener.as_raw_fd()));
        }
        self.listener = Some(listener);
    }

    fn full(&self) -> bool {
        self.conns.len() + self.accepted.len() >= MAX_CONNECTIONS
    }

    /// A packet from the host to the guest on `key`, with our credit figures.
    fn header(&self, key: Key, op: u16, flags: u32) -> Header {
        let fwd_cnt = self.conns.get(&key).map_or(0, |c| c.fwd_cnt);
        Header {
            src_cid: HOST_CID,
            dst_cid: self.guest_cid,
            src_port: key.0,
            dst_port: key.1,
            len: 0,
            kind: TYPE_STREAM,
            op,
            flags,
            buf_alloc: BUF_ALLOC,
            fwd_cnt,
        }
    }

    fn queue_control(&mut self, h: Header) {
        if self.control.len() >= MAX_CONTROL {
            add(&self.counters.control_dropped, 1);
            return;
        }
        if h.op == OP_RST {
            add(&self.counters.resets, 1);
        }
        if let Some(c) = self.conns.get_mut(&(h.src_port, h.dst_port)) {
            c.fwd_cnt_sent = h.fwd_cnt;
        }
        self.control.push_back(h);
    }

    fn reset(&mut self, key: Key) {
        let h = self.header(key, OP_RST, 0);
        self.remove(key);
        self.queue_control(h);
    }

    fn remove(&mut self, key: Key) {
        if let Some(c) = self.conns.remove(&key) {
            let fd = c.stream.as_raw_fd();
            self.by_fd.remove(&fd);
            self.forget(c.stream);
            add(&self.counters.closed, 1);
        }
    }

    /// Takes `stream` off the watch list, then closes it.
    fn forget(&mut self, stream: UnixStream) {
        self.fd_changes.push(FdChange::Forget(stream.as_raw_fd()));
        self.closing.push(stream);
    }

    /// The watch-list changes to make, and the sockets (and a listener let go of) to close
    /// once they are made.
    pub fn take_fd_changes(&mut self) -> (Vec<FdChange>, Closing) {
        (
            std::mem::take(&mut self.fd_changes),
            (
                std::mem::take(&mut self.closing),
                self.closing_listener.take(),
            ),
        )
    }

    fn insert(&mut self, key: Key, conn: Connection) {
        let fd = conn.stream.as_raw_fd();
        self.by_fd.insert(fd, key);
        self.conns.insert(key, conn);
        self.fd_changes.push(FdChange::Watch(fd));
        add(&self.counters.opened, 1);
    }

    /// Accepts the host programs waiting on the listener.
    pub fn accept(&mut self) {
        while let Some(listener) = &self.listener {
            let stream = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            if self.full() || stream.set_nonblocking(true).is_err() {
                add(&self.counters.refused, 1);
                continue; // dropped: the host program sees EOF
            }
            let fd = stream.as_raw_fd();
            self.accepted.insert(
                fd,
                Accepted {
                    stream,
                    line: Vec::new(),
                },
            );
            self.fd_changes.push(FdChange::Watch(fd));
            self.read_connect_line(fd);
        }
    }

    /// Reads an accepted socket's `CONNECT <port>\n` a byte at a time (what follows it is the
    /// stream's data); a bad or overlong line closes the socket.
    fn read_connect_line(&mut self, fd: RawFd) {
        let Some(a) = self.accepted.get_mut(&fd) else {
            return;
        };
        let mut byte = [0u8; 1];
        let done = loop {
            match a.stream.read(&mut byte) {
                Ok(0) => break Err(()),
                Ok(_) if byte[0] == b'\n' => break Ok(()),
                Ok(_) if a.line.len() < MAX_CONNECT_LINE => a.line.push(byte[0]),
                Ok(_) => break Err(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(_) => break Err(()),
            }
        };
        let a = self.accepted.remove(&fd).expect("present above");
        let port = std::str::from_utf8(&a.line)
            .ok()
            .and_then(|l| l.strip_prefix("CONNECT "))
            .and_then(|p| p.trim().parse::<u32>().ok());
        let (Ok(()), Some(port)) = (done, port) else {
            self.forget(a.stream);
            add(&self.counters.refused, 1);
            return;
        };
        let key = (self.host_port(port), port);
        // Watched again as a connection.
        self.fd_changes.push(FdChange::Forget(fd));
        self.insert(key, Connection::new(a.stream, State::Connecting));
        let h = self.header(key, OP_REQUEST, 0);
        self.queue_control(h);
    }

    /// A host port no connection to `guest_port` uses.
    fn host_port(&mut self, guest_port: u32) -> u32 {
        loop {
            let p = self.next_host_port;
            self.next_host_port = p.checked_add(1).unwrap_or(FIRST_HOST_PORT);
            if !self.conns.contains_key(&(p, guest_port)) {
                return p;
            }
        }
    }

    /// A host socket became readable or writable.
    pub fn host_event(&mut self, fd: RawFd, readable: bool, writable: bool) {
        if self.accepted.contains_key(&fd) {
            self.read_connect_line(fd);
            return;
        }
        let Some(&key) = self.by_fd.get(&fd) else {
            return;
        };
        let c = self.conns.get_mut(&key).expect("by_fd follows conns");
        c.readable |= readable;
        if writable && c.flush().is_err() {
            self.reset(key);
            return;
        }
        if c.credit_update_due() && c.state != State::Connecting {
            let h = self.header(key, OP_CREDIT_UPDATE, 0);
            self.queue_control(h);
        }
    }

    /// A packet the guest sent (the payload is what its chain held, at most `hdr.len`).
    pub fn guest_packet(&mut self, h: &Header, payload: &[u8]) {
        if h.src_cid != self.guest_cid || h.dst_cid != HOST_CID {
            add(&self.counters.bad_packets, 1);
            return; // not ours to answer
        }
        let key = (h.dst_port, h.src_port);
        if h.kind != TYPE_STREAM || payload.len() != h.len as usize {
            add(&self.counters.bad_packets, 1);
            if h.op != OP_RST {
                self.reset(key);
            }
            return;
        }
        if h.op == OP_REQUEST {
            return self.guest_connect(key, h);
        }
        let Some(c) = self.conns.get_mut(&key) else {
            if h.op != OP_RST {
                self.reset(key);
            }
            return;
        };
        c.update_peer_credit(h);
        match (h.op, c.state) {
            (OP_RESPONSE, State::Connecting) => {
                c.state = State::Established;
                if c.tell_host(&format!("OK {}\n", key.0)).is_err() {
                    self.reset(key);
                }
            }
            (OP_RW, State::Established | State::HostClosed) => self.guest_data(key, payload),
            (OP_CREDIT_UPDATE, _) => {}
            (OP_CREDIT_REQUEST, _) => {
                let h = self.header(key, OP_CREDIT_UPDATE, 0);
                self.queue_control(h);
            }
            (OP_SHUTDOWN, _) => self.guest_shutdown(key, h.flags),
            (OP_RST, _) => self.remove(key),
            _ => {
                add(&self.counters.bad_packets, 1);
                self.reset(key);
            }
        }
    }

    fn guest_connect(&mut self, key: Key, h: &Header) {
        if self.conns.contains_key(&key) || self.full() {
            add(&self.counters.refused, 1);
            return self.reset(key);
        }
        let path = PathBuf::from(format!("{}_{}", self.path.display(), key.0));
        let Ok(stream) = connect_nonblocking(&path) else {
            add(&self.counters.refused, 1);
            return self.reset(key);
        };
        let mut conn = Connection::new(stream, State::Established);
        conn.update_peer_credit(h);
        self.insert(key, conn);
        let h = self.header(key, OP_RESPONSE, 0);
        self.queue_control(h);
    }

    fn guest_data(&mut self, key: Key, payload: &[u8]) {
        let c = self.conns.get_mut(&key).expect("checked by the caller");
        add(&self.counters.tx_bytes, payload.len() as u64);
        match c.from_guest(payload) {
            Ok(()) if c.credit_update_due() => {
                let h = self.header(key, OP_CREDIT_UPDATE, 0);
                self.queue_control(h);
            }
            Ok(()) => {}
            Err(Refusal::CreditOverrun) => {
                add(&self.counters.credit_overruns, 1);
                self.reset(key);
            }
            Err(Refusal::HostGone) => self.reset(key),
        }
    }

    /// The guest will send no more (its data is still written out), or is done altogether.
    fn guest_shutdown(&mut self, key: Key, flags: u32) {
        let c = self.conns.get_mut(&key).expect("checked by the caller");
        if flags & SHUTDOWN_SEND != 0 {
            c.guest_done_sending = true;
            if c.drained() {
                let _ = c.stream.shutdown(std::net::Shutdown::Write);
            }
        }
        let both = SHUTDOWN_RCV | SHUTDOWN_SEND;
        if flags & both == both || c.state == State::HostClosed {
            // Held data is lost only if the host socket cannot take it now.
            let _ = c.flush();
            self.reset(key);
        }
    }

    /// Whether there may be a packet for the guest (a receive buffer is worth taking).
    pub fn has_rx(&self) -> bool {
        !self.control.is_empty()
            || self
                .conns
                .values()
                .any(|c| c.state == State::Established && c.readable && c.peer_credit() > 0)
    }

    /// The next packet for the guest, written into `buf` (header, then payload up to the
    /// buffer's room and the guest's credit); its length, or None.
    pub fn next_rx(&mut self, buf: &mut [u8]) -> Option<usize> {
        if buf.len() < HDR_LEN {
            return None;
        }
        if let Some(h) = self.control.pop_front() {
            buf[..HDR_LEN].copy_from_slice(&h.bytes());
            return Some(HDR_LEN);
        }
        let room = buf.len() - HDR_LEN;
        let keys: Vec<Key> = self
            .conns
            .iter()
            .filter(|(_, c)| c.state == State::Established && c.readable && c.peer_credit() > 0)
            .map(|(k, _)| *k)
            .collect();
        for key in keys {
            if let Some(n) = self.read_host(key, buf, room) {
                return Some(n);
            }
        }
        None
    }

    /// Reads from `key`'s host socket into a RW packet; at EOF a SHUTDOWN instead.
    fn read_host(&mut self, key: Key, buf: &mut [u8], room: usize) -> Option<usize> {
        let c = self.conns.get_mut(&key)?;
        let want = room.min(c.peer_credit() as usize);
        if want == 0 {
            return None; // a receive buffer with room for the header only
        }
        let (op, flags, n) = loop {
            match c.stream.read(&mut buf[HDR_LEN..HDR_LEN + want]) {
                Ok(0) => {
                    // The host sends no more; it may still read what the guest sends.
                    c.state = State::HostClosed;
                    break (OP_SHUTDOWN, SHUTDOWN_SEND, 0);
                }
                Ok(n) => break (OP_RW, 0, n),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    c.readable = false;
                    return None;
                }
                Err(_) => {
                    self.reset(key);
                    return None;
                }
            }
        };
        c.rx_cnt = c.rx_cnt.wrapping_add(n as u32);
        c.fwd_cnt_sent = c.fwd_cnt;
        add(&self.counters.rx_bytes, n as u64);
        let mut h = self.header(key, op, flags);
        h.len = n as u32;
        buf[..HDR_LEN].copy_from_slice(&h.bytes());
        Some(HDR_LEN + n)
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Packets without payload waiting for receive buffers.
    pub fn pending_control(&self) -> usize {
        self.control.len()
    }

    /// The driver reset the device: every connection ends (the host programs see EOF).
    pub fn drop_all(&mut self) {
        add(&self.counters.closed, self.conns.len() as u64);
        self.conns.clear();
        self.by_fd.clear();
        self.accepted.clear();
        self.control.clear();
        self.fd_changes.clear();
        self.closing.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn muxer(tag: &str) -> (Muxer, PathBuf) {
        let path = std::env::temp_dir().join(format!("exitless-mux-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let m = Muxer::new(3, path.clone(), listener, Arc::default());
        (m, path)
    }

    fn request(src_port: u32, dst_port: u32) -> Header {
        Header {
            src_cid: 3,
            dst_cid: HOST_CID,
            src_port,
            dst_port,
            kind: TYPE_STREAM,
            op: OP_REQUEST,
            buf_alloc: 4096,
            ..Header::default()
        }
    }

    #[test]
    fn a_flood_of_requests_holds_bounded_state_and_counts_what_it_drops() {
        let (mut m, path) = muxer("flood");
        // 5000 requests to a port nobody listens on, and no receive buffers taken: each
        // earns an RST, held up to the bound; the rest are counted.
        for p in 0..5000 {
            m.guest_packet(&request(p, 77), &[]);
        }
        assert_eq!(m.control.len(), MAX_CONTROL);
        let c = &m.counters;
        assert_eq!(
            c.control_dropped.load(std::sync::atomic::Ordering::Relaxed),
            5000 - MAX_CONTROL as u64
        );
        assert_eq!(c.refused.load(std::sync::atomic::Ordering::Relaxed), 5000);
        assert_eq!(m.connections(), 0);
        let mut buf = [0u8; HDR_LEN];
        assert_eq!(m.next_rx(&mut buf), Some(HDR_LEN));
        assert_eq!(Header::parse(&buf).op, OP_RST);
        // Connections themselves stop at the limit: a listener that accepts nothing keeps
        // them pending in its backlog, or refuses them.
        let port_path = format!("{}_80", path.display());
        let _l = UnixListener::bind(&port_path).unwrap();
        for p in 0..(MAX_CONNECTIONS as u32 + 50) {
            m.guest_packet(&request(10_000 + p, 80), &[]);
        }
        assert!(m.connections() <= MAX_CONNECTIONS, "{}", m.connections());
        let _ = std::fs::remove_file(&port_path);
        let _ = std::fs::remove_file(&path);
    }
}
