//! virtio-fs (virtio 1.2, 5.11) on a vhost-user back end such as virtiofsd: exitless offers
//! the device (configuration space, queues, features the back end offers) and hands the
//! queues to the back end when the driver sets DRIVER_OK; the FUSE requests never pass
//! through exitless.
//!
//! Queue 0 is the high-priority queue, queues 1..=N the request queues. The configuration
//! space is the tag (36 bytes, NUL-padded) and `num_request_queues` (le32).

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use vm_memory::GuestAddressSpace;

use super::start::{Backend, StartCounters};
use super::{Frontend, VhostUserError, Vring, REPLY_TIMEOUT};
use crate::config::fs::MAX_TAG_LEN;
use crate::config::FsConfig;
use crate::devices::virtio::{
    Activation, BackendLog, DeviceHealth, QueueCounters, VirtioDevice, VirtioError, TYPE_FS,
    VIRTIO_F_VERSION_1, VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};
use crate::event_loop::{EventLoopHandle, Subscriber};
use crate::memory::hotplug::MemoryListener;

/// The virtio features exitless passes on to the driver when the back end offers them.
const PASSED_FEATURES: u64 =
    VIRTIO_F_VERSION_1 | VIRTIO_RING_F_EVENT_IDX | VIRTIO_RING_F_INDIRECT_DESC;
/// Size of the configuration space: the tag and `num_request_queues`.
const CONFIG_LEN: usize = MAX_TAG_LEN + 4;

/// A virtio-fs device served by a vhost-user back end.
pub struct Fs {
    /// Shared with the device's [`FsRegions`] listener, which adds hot-added memory to the
    /// back end's table; both use it on the devices thread only.
    frontend: Arc<Mutex<Frontend>>,
    config_space: [u8; CONFIG_LEN],
    queue_sizes: Vec<u16>,
    features: u64,
    /// A second handle on the socket, made at connect (not on the devices thread): what the
    /// watch of a running device registers.
    watch_socket: Arc<UnixStream>,
    /// Set by the watch when the back end closed its socket: nothing more is asked of it.
    gone: Arc<AtomicBool>,
    counters: Arc<StartCounters>,
    /// What the last start handed the back end, to start it again after a snapshot stopped
    /// its queues to read its state.
    last_start: Option<LastStart>,
}

/// A start's memory, features and queues (their fds are the transport's, alive while it
/// runs), and whether a snapshot stopped them.
struct LastStart {
    mem: crate::devices::virtio::memory_view::SharedGuestMemory,
    features: u64,
    vrings: Vec<Vring>,
    health: Arc<DeviceHealth>,
    /// What keeps the vrings' kick eventfds and call irqfds open.
    _kicks: Vec<Arc<vmm_sys_util::eventfd::EventFd>>,
    _interrupt: Arc<dyn crate::devices::virtio::VirtioInterrupt>,
    /// Where each queue stopped (GET_VRING_BASE) while a snapshot read the back end's state.
    stopped_at: Option<Vec<(u16, u32)>>,
}

impl Fs {
    /// Connects to the back end `config.socket` names and negotiates with it.
    pub fn connect(config: &FsConfig) -> Result<Self, VhostUserError> {
        let queues = 1 + usize::from(config.num_queues);
        let frontend = Frontend::connect(&config.socket, queues, REPLY_TIMEOUT)?;
        Self::new(config, frontend)
    }

    /// The device on a back end already connected.
    pub fn new(config: &FsConfig, frontend: Frontend) -> Result<Self, VhostUserError> {
        let mut config_space = [0u8; CONFIG_LEN];
        let tag = config.tag.as_bytes();
        let n = tag.len().min(MAX_TAG_LEN);
        config_space[..n].copy_from_slice(&tag[..n]);
        config_space[MAX_TAG_LEN..].copy_from_slice(&u32::from(config.num_queues).to_le_bytes());
        let watch_socket = frontend
            .socket()
            .try_clone()
            .map_err(VhostUserError::Socket)?;
        Ok(Fs {
            features: frontend.offered_features() & PASSED_FEATURES,
            frontend: Arc::new(Mutex::new(frontend)),
            config_space,
            queue_sizes: vec![config.queue_size; 1 + usize::from(config.num_queues)],
            watch_socket: Arc::new(watch_socket),
            gone: Arc::default(),
            counters: Arc::default(),
            last_start: None,
        })
    }

    /// The front end (for tests and logs).
    pub fn frontend(&self) -> MutexGuard<'_, Frontend> {
        self.frontend.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What tells the back end of memory added while the VM runs (register it with the
    /// device manager); it does nothing once the device is gone.
    pub fn memory_listener(&self, name: &str, event_loop: EventLoopHandle) -> FsRegions {
        FsRegions {
            name: name.to_string(),
            frontend: Arc::downgrade(&self.frontend),
            gone: self.gone.clone(),
            event_loop,
        }
    }

    /// What activate and reset share with the other vhost-user devices.
    fn backend(&self) -> Backend<'_> {
        Backend {
            frontend: &self.frontend,
            watch_socket: &self.watch_socket,
            gone: &self.gone,
            counters: &self.counters,
        }
    }

    /// After a snapshot read the back end's state: its queues start again where they
    /// stopped, with the same memory, rings and eventfds.
    fn start_again(&mut self) -> Result<(), VhostUserError> {
        let Some(last) = self.last_start.as_mut() else {
            return Ok(());
        };
        let Some(stopped_at) = last.stopped_at.take() else {
            return Ok(());
        };
        let mut vrings = last.vrings.clone();
        for v in &mut vrings {
            if let Some(&(_, base)) = stopped_at.iter().find(|(q, _)| *q == v.index) {
                v.base = base as u16;
            }
        }
        let (mem, features) = (last.mem.memory(), last.features);
        self.frontend().start(&mem, features, &vrings)
    }
}

impl VirtioDevice for Fs {
    fn device_type(&self) -> u32 {
        TYPE_FS
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_sizes
    }

    fn features(&self) -> u64 {
        self.features
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let start = offset as usize;
        if let Some(src) = self.config_space.get(start..start + data.len()) {
            data.copy_from_slice(src);
        }
    }

    /// The configuration space is read-only.
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn activate(&mut self, a: Activation) -> Result<Subscriber, VirtioError> {
        let (watch, vrings) = self.backend().activate(&a)?;
        self.last_start = Some(LastStart {
            mem: a.mem.clone(),
            features: a.features,
            vrings,
            health: a.health.clone(),
            _kicks: a.queues.iter().map(|q| q.notify.clone()).collect(),
            _interrupt: a.interrupt.clone(),
            stopped_at: None,
        });
        Ok(watch)
    }

    fn snapshot_support(&self) -> Result<(), String> {
        let f = self.frontend();
        match f.has_device_state() {
            true => Ok(()),
            false => Err(format!(
                "its vhost-user back end at {} does not offer VHOST_USER_PROTOCOL_F_DEVICE_STATE, \
                 so its state (the files the guest has open) cannot be saved (virtiofsd 1.x can: \
                 the Rust one; QEMU's C virtiofsd cannot)",
                f.path().display()
            )),
        }
    }

    fn has_backend_state(&self) -> bool {
        true
    }

    fn save_backend_state(&mut self) -> Result<Vec<u8>, String> {
        if self.gone.load(Ordering::Acquire) {
            return Err("its vhost-user back end closed its socket".into());
        }
        let Some(last) = self.last_start.as_mut() else {
            return Err("it runs without having handed its queues to the back end".into());
        };
        let mut frontend = self.frontend.lock().unwrap_or_else(|e| e.into_inner());
        // The back end's queues stop first (the device-state protocol's "stopped" phase).
        let stopped = frontend.stop().map_err(|e| e.to_string())?;
        last.stopped_at = Some(stopped);
        frontend
            .save_device_state()
            .map_err(|e| format!("its vhost-user back end: {e}"))
    }

    fn load_backend_state(&mut self, state: &[u8]) -> Result<(), String> {
        self.frontend()
            .load_device_state(state)
            .map_err(|e| e.to_string())
    }

    fn unquiesce(&mut self) {
        if let Err(e) = self.start_again() {
            self.counters.failed_start();
            if let Some(last) = &self.last_start {
                last.health.fail(&format!(
                    "its back end did not start again after a snapshot: {e}"
                ));
            }
        }
    }

    fn reset(&mut self) {
        self.last_start = None;
        self.backend().reset();
    }

    /// virtiofsd writes the guest's buffers itself: for a migration its back end logs
    /// those writes (and its used rings') into the shared region, while the queues run.
    fn backend_log(&mut self, log: BackendLog) -> Result<bool, String> {
        if self.last_start.is_none() || self.gone.load(Ordering::Acquire) {
            return Ok(false);
        }
        let mut frontend = self.frontend();
        if !frontend.can_log() {
            return Err(format!(
                "it was set up by its driver and its vhost-user back end at {} does not \
                 offer to log its writes to guest memory (VHOST_USER_PROTOCOL_F_LOG_SHMFD \
                 and VHOST_F_LOG_ALL; the Rust virtiofsd does), which no dirty log sees",
                frontend.path().display()
            ));
        }
        let done = match &log {
            BackendLog::Check => Ok(()),
            BackendLog::Start(region) => frontend.set_logging(Some(region)),
            BackendLog::Stop => frontend.set_logging(None),
        };
        done.map_err(|e| format!("its vhost-user back end: {e}"))?;
        Ok(true)
    }

    fn resets_on_stop(&self) -> bool {
        true
    }

    fn counters(&self) -> Arc<[QueueCounters]> {
        Arc::from(Vec::new())
    }

    fn device_counters(&self) -> Vec<(&'static str, u64)> {
        self.counters.entries()
    }
}

/// Watches a running device's socket: nothing should arrive while no request is out, so a
/// readable socket is a back end that closed it (or one that sends what nobody asked for).
/// Either way the device goes to DEVICE_NEEDS_RESET with one line naming the back end; the
/// VM and other devices run on.
pub(crate) struct BackendWatch {
    socket: Arc<UnixStream>,
    path: PathBuf,
    health: Arc<DeviceHealth>,
    gone: Arc<AtomicBool>,
}

/// Whether a byte waits on `socket` (false for an end of file or an error), without taking it.
fn has_data(socket: &UnixStream) -> bool {
    let mut byte = 0u8;
    // SAFETY: a one-byte read into a local, on a socket this process owns; MSG_DONTWAIT makes
    // it return at once.
    let n = unsafe {
        libc::recv(
            socket.as_raw_fd(),
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n > 0
}

impl MutEventSubscriber for BackendWatch {
    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let closed = events
            .event_set()
            .intersects(EventSet::HANG_UP | EventSet::READ_HANG_UP | EventSet::ERROR)
            || !has_data(&self.socket);
        if closed {
            self.gone.store(true, Ordering::Release);
        }
        let why = if closed {
            "closed its socket"
        } else {
            "sent a message nobody asked for"
        };
        self.health.fail(&format!(
            "the vhost-user back end at {} {why}",
            self.path.display()
        ));
        let _ = ops.remove(events);
    }

    fn init(&mut self, ops: &mut EventOps) {
        let watched = EventSet::IN | EventSet::READ_HANG_UP;
        if let Err(e) = ops.add(Events::new(self.socket.as_ref(), watched)) {
            self.health.log.log(|| {
                format!(
                    "{}: the vhost-user socket is not watched ({e}); a back end that dies goes unnoticed until the next reset",
                    self.health.name()
                )
            });
        }
    }
}

/// A running virtio-fs device's part in memory hotplug: a region added to the guest is added
/// to the back end's memory table (ADD_MEM_REG, on the devices thread, where the queues were
/// started) before the guest is told, so the back end can reach buffers the guest puts there.
/// A device not started gets the whole table at its next start; a removed device, or one
/// whose back end is gone, is skipped.
pub struct FsRegions {
    name: String,
    frontend: Weak<Mutex<Frontend>>,
    gone: Arc<AtomicBool>,
    event_loop: EventLoopHandle,
}

impl MemoryListener for FsRegions {
    fn name(&self) -> &str {
        &self.name
    }

    fn region_added(&mut self, region: &Arc<vm_memory::GuestRegionMmap>) -> Result<(), String> {
        let Some(frontend) = self.frontend.upgrade() else {
            return Ok(());
        };
        if self.gone.load(Ordering::Acquire) {
            return Ok(());
        }
        let (region, (tx, rx)) = (region.clone(), std::sync::mpsc::channel());
        self.event_loop
            .call(move |_| {
                let mut f = frontend.lock().unwrap_or_else(|e| e.into_inner());
                let added = if f.started().is_empty() {
                    Ok(())
                } else {
                    f.add_region(&region)
                };
                let _ = tx.send(added);
            })
            .map_err(|e| e.to_string())?;
        match rx.recv() {
            Ok(added) => added.map_err(|e| format!("its vhost-user back end: {e}")),
            Err(_) => Ok(()),
        }
    }

    fn is_gone(&self) -> bool {
        self.frontend.strong_count() == 0
    }
}

impl BackendWatch {
    /// The watch of a device (virtio-fs or another vhost-user device) whose back end talks
    /// on `socket` (a second handle on it), at `path`.
    pub(crate) fn new(
        socket: Arc<UnixStream>,
        path: PathBuf,
        health: Arc<DeviceHealth>,
        gone: Arc<AtomicBool>,
    ) -> Self {
        BackendWatch {
            socket,
            path,
            health,
            gone,
        }
    }
}

impl FsRegions {
    /// The memory listener of any vhost-user device `name` (it is virtio-fs's, named so for
    /// the device it was first written for).
    pub(crate) fn new(
        name: &str,
        frontend: Weak<Mutex<Frontend>>,
        gone: Arc<AtomicBool>,
        event_loop: EventLoopHandle,
    ) -> Self {
        FsRegions {
            name: name.to_string(),
            frontend,
            gone,
            event_loop,
        }
    }
}
