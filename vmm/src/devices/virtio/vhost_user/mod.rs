//! vhost-user: a device whose queues another process serves (the back end, e.g. virtiofsd),
//! over a Unix socket (QEMU's `docs/interop/vhost-user.rst`). exitless is the front end: it
//! hands the back end guest memory (one memfd per region, so memory must be shared), each
//! queue's rings, the eventfd KVM signals when the guest notifies the queue (its ioeventfd:
//! the notify never reaches exitless) and the irqfd of the queue's MSI-X vector (the back end
//! interrupts the guest through KVM, not through exitless).
//!
//! [`Frontend`] is the protocol as a state machine, testable against a fake back end on a
//! socketpair (`tests.rs`):
//!
//! ```text
//!  connect --> SET_OWNER, GET_FEATURES, SET_FEATURES(PROTOCOL_FEATURES, VERSION_1),
//!              GET/SET_PROTOCOL_FEATURES, [GET_QUEUE_NUM]                  --> Ready
//!  Ready --start--> SET_FEATURES, SET_MEM_TABLE, per queue SET_VRING_NUM/ADDR/BASE/CALL/
//!                   KICK/ENABLE                                            --> Running
//!  Running --stop--> per queue GET_VRING_BASE                              --> Ready
//!  any failure (closed socket, wrong reply, no reply in time) --> Broken (every request fails)
//! ```
//!
//! [`fs`] is virtio-fs on it.

pub mod connection;
pub mod device_state;
pub mod fs;
pub(crate) mod start;
#[cfg(test)]
mod tests;
pub mod virtiofsd;

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread::ThreadId;
use std::time::Duration;

use thiserror::Error;
use vhost::vhost_user::message::{
    FrontendReq, VhostUserConfig, VhostUserConfigFlags, VhostUserLog, VhostUserMemory,
    VhostUserMemoryRegion, VhostUserProtocolFeatures, VhostUserSingleMemoryRegion, VhostUserU64,
    VhostUserVirtioFeatures, VhostUserVringAddr, VhostUserVringAddrFlags, VhostUserVringState,
    MAX_ATTACHED_FD_ENTRIES,
};
use vm_memory::{
    ByteValued, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap,
};

use vmm_sys_util::eventfd::EventFd;

use crate::devices::virtio::dirty_log::shared::SharedLog;
use crate::devices::virtio::VIRTIO_F_VERSION_1;
use crate::memory;
pub use connection::Connection;

/// How long a back end may take to answer one request.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(2);
/// The protocol features exitless uses when the back end offers them: REPLY_ACK (every
/// request acknowledged, so a refused one is seen), MQ (the back end says how many queues it
/// serves), CONFIGURE_MEM_SLOTS (memory regions added one at a time, for memory hotplug),
/// DEVICE_STATE (the back end's own state saved and loaded: snapshots, migration), LOG_SHMFD
/// (the back end logs its writes to guest memory in a region exitless shares: migration).
pub const WANTED_PROTOCOL_FEATURES: VhostUserProtocolFeatures = VhostUserProtocolFeatures::MQ
    .union(VhostUserProtocolFeatures::REPLY_ACK)
    .union(VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS)
    .union(VhostUserProtocolFeatures::DEVICE_STATE)
    .union(VhostUserProtocolFeatures::LOG_SHMFD);

/// Errors talking to a vhost-user back end.
#[derive(Debug, Error)]
pub enum VhostUserError {
    #[error("Cannot connect to the vhost-user back end at {}: {error}", path.display())]
    Connect {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("Cannot send {request} to the back end: {error}")]
    Send {
        request: String,
        error: std::io::Error,
    },
    #[error("Cannot read the back end's reply to {request}: {error}")]
    Receive {
        request: String,
        error: std::io::Error,
    },
    #[error("The back end closed its socket (before answering {0})")]
    Closed(String),
    #[error("The back end did not answer {request} within {after:?}")]
    Timeout { request: String, after: Duration },
    #[error("The back end answered {request} with {got} (flags {flags:#x})")]
    WrongReply {
        request: String,
        got: String,
        flags: u32,
    },
    #[error("The back end's reply to {request} has {got} bytes, not {want}")]
    WrongSize {
        request: String,
        want: usize,
        got: u32,
    },
    #[error("The back end refused {request} (status {status})")]
    Refused { request: String, status: u64 },
    #[error("The connection to the back end is broken: {0}")]
    Broken(String),
    #[error("The back end does not offer {0}")]
    Missing(&'static str),
    #[error("The back end serves {have} queues; the device has {want}")]
    QueueCount { have: u64, want: usize },
    #[error("Guest memory at {0:#x} is private: a vhost-user device needs shared memory (memory.shared=true, --memory size=SIZE,shared=on)")]
    PrivateMemory(u64),
    #[error("Guest memory has {0} regions; one message carries at most {MAX_ATTACHED_FD_ENTRIES}")]
    TooManyRegions(usize),
    #[error("Queue {0}'s ring is outside guest memory")]
    RingOutside(u16),
    #[error("Cannot set up the back end's socket: {0}")]
    Socket(std::io::Error),
    #[error("The queues' interrupts cannot be handed to the back end: {0}")]
    NoIrqfd(std::io::Error),
    #[error("Cannot make the eventfd a polled queue's back end signals: {0}")]
    PolledCall(std::io::Error),
    #[error("The back end's state cannot be moved: {0}")]
    State(String),
}

/// One queue as the back end gets it.
#[derive(Debug, Clone)]
pub struct Vring {
    pub index: u16,
    pub size: u16,
    /// Guest addresses of the descriptor table, available and used rings.
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
    /// Where the back end starts in the available ring.
    pub base: u16,
    /// The eventfd KVM signals on the guest's notify.
    pub kick: RawFd,
    /// The irqfd of the queue's vector; None when the driver polls the queue (the back end
    /// then signals an eventfd nobody reads).
    pub call: Option<RawFd>,
}

/// The front end of one vhost-user connection.
#[derive(Debug)]
pub struct Frontend {
    conn: Connection,
    /// The back end's socket path (log lines).
    path: PathBuf,
    /// The virtio features the back end offers (without vhost-user's own bits).
    offered: u64,
    protocol: VhostUserProtocolFeatures,
    /// Queues handed to the back end since the last start.
    started: Vec<u16>,
    /// The back end offers VHOST_F_LOG_ALL (it can log its writes to guest memory).
    log_all: bool,
    /// The features the last start acked (logging turns VHOST_F_LOG_ALL on and off on them).
    acked: u64,
    /// The back end logs its writes ([`Frontend::set_logging`]): a start keeps it logging.
    logging: bool,
    /// The thread that started them (the devices event loop): only it talks to the back end
    /// afterwards, so a reset a vCPU thread completes (the loop gone) does no socket I/O.
    owner: Option<ThreadId>,
}

impl Frontend {
    /// Connects to the back end at `path` and negotiates features for a device of `queues`
    /// queues.
    pub fn connect(path: &Path, queues: usize, timeout: Duration) -> Result<Self, VhostUserError> {
        Self::connect_wanting(path, queues, timeout, WANTED_PROTOCOL_FEATURES)
    }

    /// [`Frontend::connect`] using the protocol features of `wanted` the back end offers
    /// (a device reading its configuration from the back end adds CONFIG).
    pub fn connect_wanting(
        path: &Path,
        queues: usize,
        timeout: Duration,
        wanted: VhostUserProtocolFeatures,
    ) -> Result<Self, VhostUserError> {
        let sock = UnixStream::connect(path).map_err(|error| VhostUserError::Connect {
            path: path.to_path_buf(),
            error,
        })?;
        Self::handshake_wanting(sock, path, queues, timeout, wanted)
    }

    /// The negotiation on an open socket: SET_OWNER, the virtio features, the protocol
    /// features, and the queue count when the back end can say it.
    pub fn handshake(
        sock: UnixStream,
        path: &Path,
        queues: usize,
        timeout: Duration,
    ) -> Result<Self, VhostUserError> {
        Self::handshake_wanting(sock, path, queues, timeout, WANTED_PROTOCOL_FEATURES)
    }

    /// [`Frontend::handshake`] using the protocol features of `wanted` the back end offers.
    pub fn handshake_wanting(
        sock: UnixStream,
        path: &Path,
        queues: usize,
        timeout: Duration,
        wanted: VhostUserProtocolFeatures,
    ) -> Result<Self, VhostUserError> {
        let conn = Connection::new(sock, timeout).map_err(VhostUserError::Socket)?;
        let mut f = Frontend {
            conn,
            path: path.to_path_buf(),
            offered: 0,
            protocol: VhostUserProtocolFeatures::empty(),
            started: Vec::new(),
            log_all: false,
            acked: 0,
            logging: false,
            owner: None,
        };
        f.conn.send(FrontendReq::SET_OWNER, &[], &[])?;
        let offered = f
            .conn
            .ask::<VhostUserU64>(FrontendReq::GET_FEATURES, &[])?
            .value;
        let protocol_bit = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        if offered & VIRTIO_F_VERSION_1 == 0 {
            return Err(VhostUserError::Missing("VIRTIO_F_VERSION_1"));
        }
        if offered & protocol_bit == 0 {
            return Err(VhostUserError::Missing("VHOST_USER_F_PROTOCOL_FEATURES"));
        }
        f.offered = offered & !protocol_bit & !VhostUserVirtioFeatures::LOG_ALL.bits();
        f.log_all = offered & VhostUserVirtioFeatures::LOG_ALL.bits() != 0;
        // VERSION_1 too: QEMU's C virtiofsd (libvhost-user) ends the connection on a
        // SET_FEATURES without it ("virtio legacy devices aren't supported"). The driver's
        // features replace these when the device starts.
        f.conn.send_u64(
            FrontendReq::SET_FEATURES,
            protocol_bit | VIRTIO_F_VERSION_1,
            &[],
        )?;
        let theirs = f
            .conn
            .ask::<VhostUserU64>(FrontendReq::GET_PROTOCOL_FEATURES, &[])?
            .value;
        f.protocol = VhostUserProtocolFeatures::from_bits_truncate(theirs) & wanted;
        let chosen = f.protocol.bits();
        f.conn
            .send_u64(FrontendReq::SET_PROTOCOL_FEATURES, chosen, &[])?;
        f.conn
            .set_reply_ack(f.protocol.contains(VhostUserProtocolFeatures::REPLY_ACK));
        if f.protocol.contains(VhostUserProtocolFeatures::MQ) {
            let have = f
                .conn
                .ask::<VhostUserU64>(FrontendReq::GET_QUEUE_NUM, &[])?
                .value;
            if have < queues as u64 {
                return Err(VhostUserError::QueueCount { have, want: queues });
            }
        }
        Ok(f)
    }

    /// The virtio features the back end offers (vhost-user's own bits taken out).
    pub fn offered_features(&self) -> u64 {
        self.offered
    }

    /// The protocol features in use.
    pub fn protocol_features(&self) -> VhostUserProtocolFeatures {
        self.protocol
    }

    /// Whether memory regions can be added one at a time (CONFIGURE_MEM_SLOTS).
    pub fn can_add_regions(&self) -> bool {
        self.protocol
            .contains(VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS)
    }

    /// The first `size` bytes of the device's configuration space, read from the back end
    /// (GET_CONFIG; needs the CONFIG protocol feature). Ok(None): the back end has none that
    /// large (it answered with an empty body, libvhost-user's refusal).
    pub fn get_config(&mut self, size: u32) -> Result<Option<Vec<u8>>, VhostUserError> {
        if !self.protocol.contains(VhostUserProtocolFeatures::CONFIG) {
            return Err(VhostUserError::Missing("CONFIG"));
        }
        let head = VhostUserConfig::new(0, size, VhostUserConfigFlags::empty());
        let mut body = head.as_slice().to_vec();
        body.resize(body.len() + size as usize, 0);
        let request = FrontendReq::GET_CONFIG;
        let reply = self.conn.ask_sized(request, &body, body.len())?;
        if reply.is_empty() {
            return Ok(None);
        }
        let head_len = head.as_slice().len();
        let payload = reply.get(head_len..).unwrap_or_default();
        if reply.len() != body.len() || reply[..head_len] != body[..head_len] {
            return Err(VhostUserError::WrongSize {
                request: connection::request_name(request),
                want: body.len(),
                got: reply.len() as u32,
            });
        }
        Ok(Some(payload.to_vec()))
    }

    /// The back end's socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The socket, to watch for the back end closing it.
    pub fn socket(&self) -> &UnixStream {
        self.conn.socket()
    }

    /// Why the connection broke, if it did.
    pub fn broken(&self) -> Option<&str> {
        self.conn.broken()
    }

    /// The queues the back end serves now.
    pub fn started(&self) -> &[u16] {
        &self.started
    }

    /// Hands the back end the driver's `features`, guest memory and the queues, each enabled.
    pub fn start(
        &mut self,
        mem: &GuestMemoryMmap,
        features: u64,
        vrings: &[Vring],
    ) -> Result<(), VhostUserError> {
        // Checked before anything is sent: private memory is refused with nothing started.
        let (table, fds) = mem_table(mem)?;
        self.owner = Some(std::thread::current().id());
        let acked = features | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        let log_all = match self.logging {
            true => VhostUserVirtioFeatures::LOG_ALL.bits(),
            false => 0,
        };
        self.conn
            .send_u64(FrontendReq::SET_FEATURES, acked | log_all, &[])?;
        self.acked = acked;
        self.conn.send(FrontendReq::SET_MEM_TABLE, &table, &fds)?;
        for v in vrings {
            self.start_vring(mem, v)?;
            self.started.push(v.index);
        }
        Ok(())
    }

    fn start_vring(&mut self, mem: &GuestMemoryMmap, v: &Vring) -> Result<(), VhostUserError> {
        let index = u32::from(v.index);
        let host = |gpa: u64| {
            mem.get_host_address(vm_memory::GuestAddress(gpa))
                .map(|p| p as u64)
                .map_err(|_| VhostUserError::RingOutside(v.index))
        };
        let addr = VhostUserVringAddr::new(
            index,
            VhostUserVringAddrFlags::empty(),
            host(v.desc)?,
            host(v.used)?,
            host(v.avail)?,
            0,
        );
        let state = |n: u32| VhostUserVringState::new(index, n);
        let c = &mut self.conn;
        c.send(
            FrontendReq::SET_VRING_NUM,
            state(v.size.into()).as_slice(),
            &[],
        )?;
        c.send(FrontendReq::SET_VRING_ADDR, addr.as_slice(), &[])?;
        c.send(
            FrontendReq::SET_VRING_BASE,
            state(v.base.into()).as_slice(),
            &[],
        )?;
        match v.call {
            Some(fd) => c.send_u64(FrontendReq::SET_VRING_CALL, index.into(), &[fd])?,
            None => {
                // A polled queue still gets an eventfd (one nobody reads; the back end holds
                // the only copy once sent), as QEMU gives: QEMU's C virtiofsd (libvhost-user)
                // ends the connection when it has a completion to signal and no call fd.
                let sink = EventFd::new(libc::EFD_NONBLOCK).map_err(VhostUserError::PolledCall)?;
                c.send_u64(
                    FrontendReq::SET_VRING_CALL,
                    index.into(),
                    &[sink.as_raw_fd()],
                )?
            }
        }
        c.send_u64(FrontendReq::SET_VRING_KICK, index.into(), &[v.kick])?;
        c.send(FrontendReq::SET_VRING_ENABLE, state(1).as_slice(), &[])
    }

    /// Adds one guest memory region to the back end's table (ADD_MEM_REG with its memfd):
    /// for memory added while the VM runs. Needs CONFIGURE_MEM_SLOTS and shared memory; on
    /// the thread that started the queues (the devices event loop).
    pub fn add_region(&mut self, region: &GuestRegionMmap) -> Result<(), VhostUserError> {
        if !self.can_add_regions() {
            return Err(VhostUserError::Missing("CONFIGURE_MEM_SLOTS"));
        }
        let start = region.start_addr().0;
        let (fd, offset) =
            memory::shared_file(region).ok_or(VhostUserError::PrivateMemory(start))?;
        let body =
            VhostUserSingleMemoryRegion::new(start, region.len(), region.as_ptr() as u64, offset);
        self.conn
            .send(FrontendReq::ADD_MEM_REG, body.as_slice(), &[fd])
    }

    /// Whether the back end can log its writes to guest memory (LOG_SHMFD and
    /// VHOST_F_LOG_ALL), for live migration.
    pub fn can_log(&self) -> bool {
        self.log_all && self.protocol.contains(VhostUserProtocolFeatures::LOG_SHMFD)
    }

    /// Has the running back end log its writes to guest memory into `log` (SET_LOG_BASE
    /// with the region's memfd, then SET_FEATURES with VHOST_F_LOG_ALL), or no more (None:
    /// SET_FEATURES without it). On the thread that started the queues.
    pub fn set_logging(&mut self, log: Option<&SharedLog>) -> Result<(), VhostUserError> {
        if !self.can_log() {
            return Err(VhostUserError::Missing("LOG_SHMFD and VHOST_F_LOG_ALL"));
        }
        let all = VhostUserVirtioFeatures::LOG_ALL.bits();
        let features = match log {
            Some(log) => {
                let body = VhostUserLog::new(log.size(), 0);
                let request = FrontendReq::SET_LOG_BASE;
                let _: VhostUserLog =
                    self.conn
                        .ask_with_fds(request, body.as_slice(), &[log.fd()])?;
                self.acked | all
            }
            None => self.acked & !all,
        };
        self.conn
            .send_u64(FrontendReq::SET_FEATURES, features, &[])?;
        self.logging = log.is_some();
        Ok(())
    }

    /// Whether the back end logs its writes now.
    pub fn logging(&self) -> bool {
        self.logging
    }

    /// Forgets the queues without asking the back end (it is gone).
    pub fn forget_queues(&mut self) {
        self.started.clear();
    }

    /// Stops every queue the back end serves (GET_VRING_BASE, which also makes it let go of
    /// the queue's eventfds); returns where each stopped. Only on the thread that started them:
    /// elsewhere the queues are only forgotten (the back end learns when the socket closes).
    pub fn stop(&mut self) -> Result<Vec<(u16, u32)>, VhostUserError> {
        let queues = std::mem::take(&mut self.started);
        if self.owner != Some(std::thread::current().id()) {
            return Ok(Vec::new());
        }
        let mut bases = Vec::new();
        for q in queues {
            let body = VhostUserVringState::new(q.into(), 0);
            let got: VhostUserVringState = self
                .conn
                .ask(FrontendReq::GET_VRING_BASE, body.as_slice())?;
            bases.push((q, got.num));
        }
        Ok(bases)
    }
}

/// SET_MEM_TABLE's body and one fd per region: every region must be shared memory.
fn mem_table(mem: &GuestMemoryMmap) -> Result<(Vec<u8>, Vec<RawFd>), VhostUserError> {
    let count = mem.num_regions();
    if count > MAX_ATTACHED_FD_ENTRIES {
        return Err(VhostUserError::TooManyRegions(count));
    }
    let mut body = VhostUserMemory::new(count as u32).as_slice().to_vec();
    let mut fds = Vec::with_capacity(count);
    for region in mem.iter() {
        let start = region.start_addr().0;
        let (fd, offset) =
            memory::shared_file(region).ok_or(VhostUserError::PrivateMemory(start))?;
        let host = region.as_ptr() as u64;
        let r = VhostUserMemoryRegion::new(start, region.len(), host, offset);
        body.extend_from_slice(r.as_slice());
        fds.push(fd);
    }
    Ok((body, fds))
}
