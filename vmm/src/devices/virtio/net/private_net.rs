//! A network namespace of one's own with a tap in it, for the bench and the tests: frames the
//! guest sends go nowhere else, and a raw packet socket on the tap plays the host's side.
//! Needs CAP_SYS_ADMIN and CAP_NET_ADMIN (root); callers skip with the error's reason.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use super::tap::Tap;

/// A network namespace held open by an fd; entered by short-lived threads only, so the
/// process's own threads stay where they were.
pub struct PrivateNet {
    ns: File,
}

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

impl PrivateNet {
    /// A new, empty network namespace.
    pub fn create() -> io::Result<PrivateNet> {
        std::thread::spawn(|| {
            // SAFETY: unshare takes flags only; CLONE_NEWNET moves just this thread.
            check(unsafe { libc::unshare(libc::CLONE_NEWNET) })?;
            let ns = File::open("/proc/thread-self/ns/net")?;
            Ok(PrivateNet { ns })
        })
        .join()
        .map_err(|_| io::Error::other("the namespace thread panicked"))?
    }

    /// Runs `f` on a thread inside the namespace (processes it spawns are inside too).
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> io::Result<T> {
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: setns takes an fd of a network namespace and moves just this thread.
                check(unsafe { libc::setns(self.ns.as_raw_fd(), libc::CLONE_NEWNET) })?;
                Ok(f())
            })
            .join()
            .map_err(|_| io::Error::other("the namespace thread panicked"))?
        })
    }

    /// Creates tap `name` in the namespace, up, kept after its fd closes (it goes with the
    /// namespace); returns the open tap.
    pub fn add_tap(&self, name: &str) -> io::Result<Tap> {
        self.run(|| {
            let tap = Tap::open(name).map_err(io::Error::other)?;
            tap.set_persistent(true)?;
            set_link_up(name)?;
            Ok(tap)
        })?
    }

    /// Opens a new tap `name` in the namespace the way another program (Kata) does, with
    /// `flags` for TUNSETIFF (e.g. IFF_TAP | IFF_NO_PI | IFF_VNET_HDR), and returns its fd.
    pub fn open_foreign_tap(&self, name: &str, flags: libc::c_short) -> io::Result<OwnedFd> {
        self.run(|| {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/net/tun")?;
            let mut req = if_request(name);
            req.flags = flags;
            // SAFETY: TUNSETIFF reads and writes an ifreq, which `req` is, owned here.
            let r = unsafe {
                libc::ioctl(
                    file.as_raw_fd(),
                    TUNSETIFF as _,
                    &mut req as *mut IfReqFlags,
                )
            };
            check(r)?;
            set_link_up(name)?;
            Ok(OwnedFd::from(file))
        })?
    }
}

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
/// TUNSETIFF flags a tap for virtio-net needs: a tap, no packet information, the header.
pub const KATA_TAP_FLAGS: libc::c_short = 0x0002 | 0x1000 | 0x4000;

#[repr(C)]
struct IfReqFlags {
    name: [u8; 16],
    flags: libc::c_short,
    _pad: [u8; 22],
}

fn if_request(name: &str) -> IfReqFlags {
    let mut req = IfReqFlags {
        name: [0; 16],
        flags: 0,
        _pad: [0; 22],
    };
    let n = name.len().min(15);
    req.name[..n].copy_from_slice(&name.as_bytes()[..n]);
    req
}

/// Sets interface `name` (of the calling thread's namespace) up.
pub fn set_link_up(name: &str) -> io::Result<()> {
    // SAFETY: plain socket creation; the fd is owned at once.
    let fd =
        check(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` is a new socket that nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut req = if_request(name);
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write one `struct ifreq` (40 bytes: the
    // name, then the flags at the start of the union), which `req` is laid out as.
    unsafe {
        check(libc::ioctl(
            sock.as_raw_fd(),
            libc::SIOCGIFFLAGS as _,
            &mut req,
        ))?;
        req.flags |= libc::IFF_UP as libc::c_short;
        check(libc::ioctl(
            sock.as_raw_fd(),
            libc::SIOCSIFFLAGS as _,
            &mut req,
        ))?;
    }
    Ok(())
}

/// A raw packet socket on one interface for one ethertype: the host's end of a tap.
pub struct PacketSocket {
    fd: OwnedFd,
}

impl PacketSocket {
    /// Bound to interface `name` (in the calling thread's namespace), frames of `ethertype`.
    pub fn bind(name: &str, ethertype: u16) -> io::Result<PacketSocket> {
        let proto = ethertype.to_be();
        // SAFETY: plain socket creation; the fd is owned at once.
        let fd = check(unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                proto.into(),
            )
        })?;
        // SAFETY: `fd` is a new socket that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let cname = std::ffi::CString::new(name).map_err(io::Error::other)?;
        // SAFETY: `cname` is a NUL-terminated string.
        let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if index == 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: all-zero is a valid sockaddr_ll; the fields that matter are set below.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = proto;
        addr.sll_ifindex = index as i32;
        let len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: `addr` is a sockaddr_ll of `len` bytes.
        check(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast(),
                len,
            )
        })?;
        Ok(PacketSocket { fd })
    }

    /// Sends one whole Ethernet frame out of the interface (to whoever reads the tap).
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: reads `frame.len()` bytes from the valid slice.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        check(n as libc::c_int).map(drop)
    }

    /// The next frame that came in on the interface (from the tap's writer, not our own
    /// sends), or a `TimedOut` error after `timeout`.
    pub fn recv(&self, timeout: Duration) -> io::Result<Vec<u8>> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().min(i32::MAX as u128) as i32;
            // SAFETY: one valid pollfd.
            if check(unsafe { libc::poll(&mut pfd, 1, ms) })? == 0 {
                return Err(io::ErrorKind::TimedOut.into());
            }
            let mut buf = vec![0u8; 65_536];
            // SAFETY: all-zero is a valid sockaddr_ll for recvfrom to fill.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            // SAFETY: `buf` and `from` are valid for the lengths given.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                    (&mut from as *mut libc::sockaddr_ll).cast(),
                    &mut len,
                )
            };
            let n = check(n as libc::c_int)? as usize;
            if from.sll_pkttype != libc::PACKET_OUTGOING {
                buf.truncate(n);
                return Ok(buf);
            }
        }
    }
}
