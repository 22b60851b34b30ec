//! A Linux tap device opened through `/dev/net/tun` with the virtio-net header on every frame
//! (`IFF_VNET_HDR`, 12 bytes: `virtio_net_hdr_v1`), non-blocking. No crate of the field does
//! this for a VMM, so the three ioctls are here.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::config::net::valid_tap_name;

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNGETIFF: libc::c_ulong = 0x8004_54d2;
const TUNSETPERSIST: libc::c_ulong = 0x4004_54cb;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
const IFF_PERSIST: libc::c_short = 0x0800;

/// Offloads the reader of the tap (the guest) accepts: `TUNSETOFFLOAD` flags.
pub const TUN_F_CSUM: u32 = 0x01;
pub const TUN_F_TSO4: u32 = 0x02;
pub const TUN_F_TSO6: u32 = 0x04;
pub const TUN_F_TSO_ECN: u32 = 0x08;

/// Bytes of the virtio-net header on each frame (`virtio_net_hdr_v1`, with `num_buffers`).
pub const VNET_HDR_LEN: usize = 12;

/// Errors opening a tap.
#[derive(Debug, Error)]
pub enum TapError {
    #[error("Cannot open /dev/net/tun: {0}")]
    OpenTun(io::Error),
    #[error("Cannot open tap '{0}': needs CAP_NET_ADMIN or an existing tap this user may use")]
    Permission(String),
    #[error("Cannot open tap '{name}': {error}")]
    SetIff { name: String, error: io::Error },
    #[error("Tap '{0}' does not take the 12-byte virtio-net header: {1}")]
    VnetHeader(String, io::Error),
    #[error("Invalid tap name '{0}': 1 to 15 characters, no '/', whitespace or NUL")]
    Name(String),
    #[error("The file descriptor given for a tap is not one: {0}")]
    NotTap(io::Error),
    #[error(
        "Tap '{0}' was opened without IFF_VNET_HDR|IFF_NO_PI; exitless needs the virtio-net header"
    )]
    TapFlags(String),
}

/// `struct ifreq` as far as the tun ioctls look: the name and the flags.
#[repr(C)]
struct IfReq {
    name: [u8; 16],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// An open tap.
#[derive(Debug)]
pub struct Tap {
    file: File,
    name: String,
    /// Whether the kernel took every offload flag when probed at open.
    offloads: bool,
    /// Opened by name (it can be opened again after [`Tap::release`]), not given as an fd.
    by_name: bool,
    /// Let go of for a live migration's destination ([`Tap::release`]): not read nor written.
    released: AtomicBool,
    /// A live migration asked to let go of the tap: the device no longer watches, reads
    /// nor writes it ([`Tap::ask_release`]).
    handed_over: AtomicBool,
    /// The device's worker took the tap out of its watch list after that ask.
    unwatched: AtomicBool,
    /// The `TUNSETOFFLOAD` flags last set, set again on a tap opened anew.
    offload_flags: AtomicU32,
    /// [`Tap::release`] made the interface persistent; [`Tap::retake`] undoes it.
    made_persistent: AtomicBool,
}

fn ioctl_int(fd: RawFd, request: libc::c_ulong, value: libc::c_ulong) -> io::Result<()> {
    // SAFETY: these tun ioctls take an integer argument by value and touch no memory of ours.
    let r = unsafe { libc::ioctl(fd, request as _, value) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Tap {
    /// Opens tap `name` (creating it when this process may), non-blocking, with the virtio-net
    /// header on every frame.
    pub fn open(name: &str) -> Result<Tap, TapError> {
        if !valid_tap_name(name) {
            return Err(TapError::Name(name.to_string()));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(TapError::OpenTun)?;
        let mut req = IfReq {
            name: [0; 16],
            flags: IFF_TAP | IFF_NO_PI | IFF_VNET_HDR,
            _pad: [0; 22],
        };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: TUNSETIFF reads and writes one `struct ifreq`; `req` is one, laid out as the
        // kernel's (16-byte name, then the union whose first member is the flags; 40 bytes).
        let r = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF as _, &mut req as *mut IfReq) };
        if r < 0 {
            let error = io::Error::last_os_error();
            return Err(match error.raw_os_error() {
                Some(libc::EPERM) | Some(libc::EACCES) => TapError::Permission(name.into()),
                _ => TapError::SetIff {
                    name: name.into(),
                    error,
                },
            });
        }
        let mut tap = Self::with_header(file, name.to_string())?;
        tap.by_name = true;
        Ok(tap)
    }

    /// A tap another program opened (Kata sends its fds with `vm.add-net`): it must be a tap
    /// with the virtio-net header and no packet information; it is made non-blocking and
    /// given the 12-byte header like one exitless opens.
    pub fn from_fd(fd: std::os::fd::OwnedFd) -> Result<Tap, TapError> {
        let file = File::from(fd);
        let mut req = IfReq {
            name: [0; 16],
            flags: 0,
            _pad: [0; 22],
        };
        // SAFETY: TUNGETIFF writes an ifreq into `req`, which is one, and owned here.
        let r = unsafe { libc::ioctl(file.as_raw_fd(), TUNGETIFF as _, &mut req as *mut IfReq) };
        if r < 0 {
            return Err(TapError::NotTap(io::Error::last_os_error()));
        }
        let len = req
            .name
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(req.name.len());
        let name = String::from_utf8_lossy(&req.name[..len]).into_owned();
        let wanted = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
        if req.flags & wanted != wanted {
            return Err(TapError::TapFlags(name));
        }
        // SAFETY: F_GETFL on an fd this function owns; no memory is passed.
        let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        let nonblocking = flags | libc::O_NONBLOCK;
        // SAFETY: F_SETFL on the same fd, with flags only.
        if flags < 0 || unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, nonblocking) } < 0 {
            return Err(TapError::NotTap(io::Error::last_os_error()));
        }
        Self::with_header(file, name)
    }

    /// The 12-byte virtio-net header on an open tap, and which offloads it takes.
    fn with_header(file: File, name: String) -> Result<Tap, TapError> {
        let hdr_len = VNET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads one int from the pointer, which points at `hdr_len`.
        let r = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETVNETHDRSZ as _, &hdr_len) };
        if r < 0 {
            return Err(TapError::VnetHeader(name, io::Error::last_os_error()));
        }
        let all = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN;
        let offloads = ioctl_int(file.as_raw_fd(), TUNSETOFFLOAD, all.into()).is_ok()
            && ioctl_int(file.as_raw_fd(), TUNSETOFFLOAD, 0).is_ok();
        Ok(Tap {
            file,
            name,
            offloads,
            by_name: false,
            released: AtomicBool::new(false),
            handed_over: AtomicBool::new(false),
            unwatched: AtomicBool::new(false),
            offload_flags: AtomicU32::new(0),
            made_persistent: AtomicBool::new(false),
        })
    }

    /// The interface's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the tap can hand the guest checksum-less and segmentation-offloaded frames.
    pub fn supports_offloads(&self) -> bool {
        self.offloads
    }

    /// Tells the kernel which offloads the reader accepts (`TUN_F_*`); nothing to say when
    /// the tap takes none and none are asked.
    pub fn set_offloads(&self, flags: u32) -> io::Result<()> {
        if !self.offloads && flags == 0 {
            return Ok(());
        }
        ioctl_int(self.file.as_raw_fd(), TUNSETOFFLOAD, flags.into())?;
        self.offload_flags.store(flags, Ordering::Relaxed);
        Ok(())
    }

    /// A stand-in for a tap in tests: one end of a datagram socket pair (one frame per
    /// datagram, as a tap reads and writes), non-blocking, without offloads.
    #[cfg(test)]
    pub fn from_socket(socket: std::os::unix::net::UnixDatagram) -> Tap {
        socket.set_nonblocking(true).unwrap();
        Tap {
            file: File::from(std::os::fd::OwnedFd::from(socket)),
            name: "test".into(),
            offloads: false,
            by_name: false,
            released: AtomicBool::new(false),
            handed_over: AtomicBool::new(false),
            unwatched: AtomicBool::new(false),
            offload_flags: AtomicU32::new(0),
            made_persistent: AtomicBool::new(false),
        }
    }

    /// Keeps the interface after the last fd closes (`persist`), or not. Tests and the bench
    /// make one in a network namespace of their own, which removes it when the namespace goes.
    pub fn set_persistent(&self, persist: bool) -> io::Result<()> {
        ioctl_int(self.file.as_raw_fd(), TUNSETPERSIST, persist.into())
    }

    /// Whether the interface outlives its last fd (`IFF_PERSIST`).
    fn persistent(&self) -> io::Result<bool> {
        let mut req = IfReq {
            name: [0; 16],
            flags: 0,
            _pad: [0; 22],
        };
        let fd = self.file.as_raw_fd();
        // SAFETY: TUNGETIFF writes an ifreq into `req`, which is one, and owned here.
        if unsafe { libc::ioctl(fd, TUNGETIFF as _, &mut req as *mut IfReq) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(req.flags & IFF_PERSIST != 0)
    }

    /// Puts the file `from` behind this tap's fd (the old one closes). Whoever watched the
    /// fd in epoll stopped first: a closed file leaves epoll on its own, and the event
    /// loop's own record of the fd would then be stale.
    fn replace_file(&self, from: RawFd) -> io::Result<()> {
        // SAFETY: dup3 takes two fds this tap owns (`from` is open for the call's length)
        // and no memory; the fd number stays this tap's, now on `from`'s file.
        if unsafe { libc::dup3(from, self.file.as_raw_fd(), libc::O_CLOEXEC) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// A live migration to this host hands the interface to its destination, which opens
    /// it by name (a tap without `IFF_MULTI_QUEUE` takes one opener at a time): from now on
    /// the device neither reads nor writes the tap, and its worker takes it out of its watch
    /// list (on the devices thread, [`Tap::unwatch`]) before [`Tap::release`] closes it.
    pub fn ask_release(&self) {
        self.unwatched.store(false, Ordering::Release);
        self.handed_over.store(true, Ordering::Release);
    }

    /// Whether a migration asked to let go of the tap (not taken back since).
    pub fn handed_over(&self) -> bool {
        self.handed_over.load(Ordering::Acquire)
    }

    /// The worker took the tap out of its watch list (after [`Tap::ask_release`]).
    pub fn unwatch(&self) {
        self.unwatched.store(true, Ordering::Release);
    }

    /// Whether the worker has yet to take the tap out of its watch list.
    pub fn watched(&self) -> bool {
        self.handed_over() && !self.unwatched.load(Ordering::Acquire)
    }

    /// Waits (at most `limit`) until the worker took the tap out of its watch list.
    pub fn wait_unwatched(&self, limit: Duration) -> io::Result<()> {
        let start = Instant::now();
        while self.watched() {
            if start.elapsed() > limit {
                return Err(io::Error::other(format!(
                    "the devices thread did not stop watching it within {limit:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Lets go of the interface once nothing watches it ([`Tap::ask_release`]): a tap
    /// opened by name is closed (made persistent first if it was not, or the interface would
    /// go with its last fd; its fd then holds an eventfd that never reads); a tap given as
    /// an fd is kept open (whoever gave it gives the destination its own), unread: frames
    /// for the guest wait in the tap.
    pub fn release(&self) -> io::Result<()> {
        if !self.by_name || self.released() {
            self.released.store(true, Ordering::Release);
            return Ok(());
        }
        if !self.persistent()? {
            self.set_persistent(true)?;
            self.made_persistent.store(true, Ordering::Relaxed);
        }
        // SAFETY: eventfd takes flags only; the fd it returns is owned below.
        let placeholder = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if placeholder < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `placeholder` was just opened and is owned by nothing else.
        let placeholder = unsafe { std::os::fd::OwnedFd::from_raw_fd(placeholder) };
        self.replace_file(placeholder.as_raw_fd())?;
        self.released.store(true, Ordering::Release);
        Ok(())
    }

    /// The migration failed: a tap opened by name is opened anew (with the offloads it had,
    /// and its persistence as before), then the device may watch it again.
    pub fn retake(&self) -> Result<(), TapError> {
        if self.by_name && self.released() {
            let again = Tap::open(&self.name)?;
            let error = |error| TapError::SetIff {
                name: self.name.clone(),
                error,
            };
            self.replace_file(again.as_raw_fd()).map_err(error)?;
            let flags = self.offload_flags.load(Ordering::Relaxed);
            if flags != 0 {
                ioctl_int(self.file.as_raw_fd(), TUNSETOFFLOAD, flags.into()).map_err(error)?;
            }
            if self.made_persistent.swap(false, Ordering::Relaxed) {
                self.set_persistent(false).map_err(error)?;
            }
        }
        self.released.store(false, Ordering::Release);
        self.handed_over.store(false, Ordering::Release);
        Ok(())
    }

    /// Whether the tap is let go of ([`Tap::release`]).
    fn released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    /// Reads one frame (header first); `WouldBlock` when none is waiting.
    pub fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize> {
        (&self.file).read(buf)
    }

    /// Writes one frame (header first).
    pub fn write_frame(&self, frame: &[u8]) -> io::Result<usize> {
        (&self.file).write(frame)
    }
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_before_any_ioctl() {
        for bad in ["", "sixteen-chars-xx", "a/b", "a b", "a\0"] {
            let e = Tap::open(bad).unwrap_err().to_string();
            assert!(e.starts_with("Invalid tap name"), "{e}");
        }
    }

    #[test]
    fn the_ifreq_is_the_kernels_size() {
        assert_eq!(std::mem::size_of::<IfReq>(), 40);
    }
}
