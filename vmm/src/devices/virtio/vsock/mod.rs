//! virtio-vsock without a host kernel module: the guest's stream sockets are joined to Unix
//! sockets on the host ([`muxer`], Firecracker's "hybrid vsock", which Kata Containers also
//! speaks). The receive, transmit and event queues are served on the device event loop; with
//! ioeventfd notifies and MSI-X no packet costs an exit to userspace.

pub mod connection;
pub mod muxer;
pub mod packet;
#[cfg(test)]
mod tests;
mod worker;

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use thiserror::Error;

use super::running::RunningWorker;
use super::{
    Activation, QueueCounters, VirtioDevice, VirtioError, TYPE_VSOCK, VIRTIO_F_VERSION_1,
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};
use crate::config::VsockConfig;
use crate::event_loop::Subscriber;
use muxer::Muxer;
use worker::VsockWorker;

const QUEUE_SIZE: u16 = 256;
pub const RX: u16 = 0;
pub const TX: u16 = 1;
pub const EVENT: u16 = 2;

/// Errors setting up the host socket.
#[derive(Debug, Error)]
pub enum VsockError {
    #[error("Cannot listen on vsock socket {path}: {error}")]
    Listen { path: String, error: io::Error },
    #[error("Vsock socket {0} is in use by a running program")]
    InUse(String),
    #[error("Vsock socket {0} exists and is not a socket; not removing it")]
    NotSocket(String),
}

/// What the device counted beyond its queues, written on the event loop only.
#[derive(Debug, Default)]
pub struct VsockCounters {
    pub opened: AtomicU64,
    pub closed: AtomicU64,
    /// Connections refused: no listener at `PATH_P`, a bad CONNECT line, the limit reached.
    pub refused: AtomicU64,
    /// RST packets sent to the guest.
    pub resets: AtomicU64,
    /// Packets with a wrong address, type, length or operation.
    pub bad_packets: AtomicU64,
    /// Connections reset because the guest sent more than its credit.
    pub credit_overruns: AtomicU64,
    /// Control packets dropped because the guest gave no receive buffers for them.
    pub control_dropped: AtomicU64,
    pub rx_bytes: AtomicU64,
    pub tx_bytes: AtomicU64,
}

impl VsockCounters {
    fn list(&self) -> Vec<(&'static str, u64)> {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("connections", l(&self.opened)),
            ("open", l(&self.opened).saturating_sub(l(&self.closed))),
            ("refused", l(&self.refused)),
            ("resets", l(&self.resets)),
            ("bad_packets", l(&self.bad_packets)),
            ("credit_overruns", l(&self.credit_overruns)),
            ("control_dropped", l(&self.control_dropped)),
            ("rx_bytes", l(&self.rx_bytes)),
            ("tx_bytes", l(&self.tx_bytes)),
        ]
    }
}

/// The virtio-vsock device model.
pub struct Vsock {
    cid: u64,
    muxer: Arc<Mutex<Muxer>>,
    counters: Arc<[QueueCounters]>,
    vsock: Arc<VsockCounters>,
    /// The queue work while the device runs (the event loop owns it), for a snapshot.
    worker: RunningWorker<VsockWorker>,
    /// Restored from a snapshot: the next start owes the guest a transport reset.
    owe_reset: bool,
    /// The socket's path, and whether its file is this device's (see [`SocketFile`]).
    socket: PathBuf,
    socket_ours: Arc<AtomicBool>,
}

/// Binds `path`, replacing a socket file no program listens on any more.
fn listen(path: &Path) -> Result<UnixListener, VsockError> {
    let shown = path.display().to_string();
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(VsockError::NotSocket(shown));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(VsockError::InUse(shown));
        }
        let _ = std::fs::remove_file(path);
    }
    let listener = UnixListener::bind(path).map_err(|error| VsockError::Listen {
        path: shown.clone(),
        error,
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|error| VsockError::Listen { path: shown, error })?;
    Ok(listener)
}

/// The device's listening socket file, removed when this is dropped (the VMM ends) unless
/// a live migration handed it to its destination on this host (which then owns the path).
#[derive(Debug)]
pub struct SocketFile(PathBuf, Arc<AtomicBool>);

impl Drop for SocketFile {
    fn drop(&mut self) {
        if self.1.load(Ordering::Acquire) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

impl Vsock {
    /// Listens on the config's socket; the socket file goes when the [`SocketFile`] does.
    pub fn new(config: &VsockConfig) -> Result<(Self, SocketFile), VsockError> {
        let listener = listen(&config.socket)?;
        let vsock = Arc::new(VsockCounters::default());
        let cid = u64::from(config.cid);
        let muxer = Muxer::new(cid, config.socket.clone(), listener, vsock.clone());
        let socket_ours = Arc::new(AtomicBool::new(true));
        let device = Vsock {
            cid,
            muxer: Arc::new(Mutex::new(muxer)),
            counters: Arc::from((0..3).map(|_| QueueCounters::default()).collect::<Vec<_>>()),
            vsock,
            worker: RunningWorker::default(),
            owe_reset: false,
            socket: config.socket.clone(),
            socket_ours: socket_ours.clone(),
        };
        Ok((device, SocketFile(config.socket.clone(), socket_ours)))
    }
}

impl VirtioDevice for Vsock {
    fn device_type(&self) -> u32 {
        TYPE_VSOCK
    }
    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE, QUEUE_SIZE, QUEUE_SIZE]
    }
    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1 | VIRTIO_RING_F_EVENT_IDX | VIRTIO_RING_F_INDIRECT_DESC
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // guest_cid (le64).
        let config = self.cid.to_le_bytes();
        for (i, b) in data.iter_mut().enumerate() {
            *b = usize::try_from(offset)
                .ok()
                .and_then(|o| config.get(o.checked_add(i)?))
                .copied()
                .unwrap_or(0);
        }
    }
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn activate(&mut self, a: Activation) -> Result<Subscriber, VirtioError> {
        let mut queues = a.queues;
        queues.sort_by_key(|q| q.index);
        let indexes: Vec<u16> = queues.iter().map(|q| q.index).collect();
        // The event queue is only for transport resets (after a restore).
        if indexes.len() < 2 || indexes[..2] != [RX, TX] {
            return Err(VirtioError::QueueCount {
                device: "virtio-vsock".into(),
                want: 3,
                got: indexes.len(),
            });
        }
        queues.truncate(3);
        self.muxer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drop_all();
        let event = match queues.last() {
            Some(q) if q.index == EVENT => queues.pop(),
            _ => None,
        };
        let tx = queues.pop().expect("two queues");
        let rx = queues.pop().expect("two queues");
        let worker = VsockWorker::new(
            (rx, tx, event),
            self.muxer.clone(),
            a.mem,
            a.interrupt,
            self.counters.clone(),
            (a.health, a.dirty),
            std::mem::take(&mut self.owe_reset),
        );
        Ok(self.worker.start(worker))
    }

    /// The CID comes from the config, the socket is listened on anew; transmit chains drain,
    /// receive buffers are given back (the worker's
    /// [`quiesce`](super::running::QuiesceWorker::quiesce)). Connections do not survive: a
    /// restore tells the guest with a transport reset.
    fn snapshot_support(&self) -> Result<(), String> {
        Ok(())
    }

    fn prefilled_queues(&self) -> &[u16] {
        &[RX, EVENT]
    }

    fn quiesce(&mut self) -> Result<(), String> {
        self.worker.quiesce()
    }

    fn unquiesce(&mut self) {
        self.worker.unquiesce();
    }

    fn restored(&mut self) {
        self.owe_reset = true;
    }

    fn reset(&mut self) {
        self.worker.stop();
        self.muxer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drop_all();
    }

    fn counters(&self) -> Arc<[QueueCounters]> {
        self.counters.clone()
    }

    /// The host socket, handed to a live migration's destination on this host: the
    /// listener closed and its file removed (the destination listens at the path; this VMM
    /// no longer removes it when it ends), or listened on again when the migration failed.
    /// Connections stay until the source ends; the destination's guest sees the transport
    /// reset a restore gives.
    fn image_lock(&self, held: bool) -> Result<(), String> {
        // The worker's lock before the muxer's, as the event loop takes them.
        let running = self.worker.with(|_| ()).is_some();
        let mut muxer = self.muxer.lock().unwrap_or_else(|e| e.into_inner());
        match held {
            false if self.socket_ours.swap(false, Ordering::AcqRel) => {
                let _ = std::fs::remove_file(&self.socket);
                muxer.release_listener(running);
            }
            true if !self.socket_ours.load(Ordering::Acquire) => {
                let listener = listen(&self.socket).map_err(|e| e.to_string())?;
                muxer.retake_listener(listener, running);
                self.socket_ours.store(true, Ordering::Release);
            }
            _ => return Ok(()),
        }
        drop(muxer);
        self.worker.with(|w| w.wake());
        Ok(())
    }

    fn device_counters(&self) -> Vec<(&'static str, u64)> {
        self.vsock.list()
    }
}
