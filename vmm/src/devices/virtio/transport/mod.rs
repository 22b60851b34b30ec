//! virtio-pci, modern (virtio 1.x only): a [`VirtioDevice`] behind a PCI function with one
//! 64-bit memory BAR holding the common configuration, ISR, device configuration, one notify
//! slot per queue (each its own zero-length ioeventfd) and the MSI-X table and PBA.
//!
//! BAR 0 layout:
//!
//! | offset | what |
//! |---|---|
//! | 0x0000 | common configuration (0x38 bytes) |
//! | 0x1000 | ISR (1 byte, read to clear) |
//! | 0x2000 | device configuration |
//! | 0x3000 | notify: queue q at 0x3000 + 4 q (notify_off_multiplier 4) |
//! | 0x4000 | MSI-X table (16 bytes per vector) |
//! | 0x5000 | MSI-X pending-bit array |

pub mod common;
pub mod interrupt;
mod snapshot;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use event_manager::{SubscriberId, SubscriberOps};

use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestAddressSpace, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::devices::pci::config::{PciConfig, PciIds};
use crate::devices::pci::{msix, BarChange, BarKind, PciDevice};
use crate::devices::virtio::{
    Activation, ActiveQueue, DeviceDirtyLog, DeviceHealth, QueueCounters, SharedGuestMemory,
    VirtioDevice, TYPE_BLOCK, VIRTIO_RING_F_EVENT_IDX,
};
use crate::event_loop::{EventLoopHandle, Subscriber};
use crate::kvm::IoEvent;
use common::{CommonCfg, CommonEvent, COMMON_LEN, STATUS_NEEDS_RESET};
pub use interrupt::{MsiRoutes, MsixInterrupt};

/// Size of BAR 0.
pub const BAR_SIZE: u64 = 0x8000;
const COMMON: u64 = 0x0000;
const ISR: u64 = 0x1000;
const DEVICE_CFG: u64 = 0x2000;
const NOTIFY: u64 = 0x3000;
const NOTIFY_MULTIPLIER: u32 = 4;
const MSIX_TABLE: u64 = 0x4000;
const MSIX_PBA: u64 = 0x5000;
const REGION: u64 = 0x1000;
/// PCI vendor ID of virtio devices.
pub const VIRTIO_VENDOR: u16 = 0x1af4;
const VIRTIO_CAP_ID: u8 = 0x09;

/// Where the device is in its life, as the transport drives it. Starting and resetting are
/// handed to the device event loop (as work that runs there in order), so that the vCPU
/// thread that wrote DRIVER_OK or 0 to the status register returns at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not started: after power-on, or a reset that completed.
    Idle,
    /// DRIVER_OK was written; the start runs on the event loop.
    Starting,
    /// The queue work runs on the event loop under this id.
    Running(SubscriberId),
    /// 0 was written; the reset runs on the event loop. The status register reads as before
    /// until it has (a driver waits for it to read 0).
    Resetting,
}

/// The driver-facing state, locked for a register access and for starting or resetting the
/// device on the event loop (never across anything slow).
struct Transport {
    common: CommonCfg,
    device: Box<dyn VirtioDevice>,
    phase: Phase,
}

/// A virtio device on PCI.
pub struct VirtioPciDevice {
    name: String,
    config: Mutex<PciConfig>,
    msix_cap: usize,
    transport: Mutex<Transport>,
    irq: Arc<MsixInterrupt>,
    notify: Vec<Arc<EventFd>>,
    mem: SharedGuestMemory,
    event_loop: EventLoopHandle,
    health: Arc<DeviceHealth>,
    /// The VM's log of the pages devices write (see [`DeviceDirtyLog`]).
    dirty: Arc<DeviceDirtyLog>,
    /// The device's queue counters (read by the profile without the transport's lock).
    counters: Arc<[QueueCounters]>,
    /// This device, for the work it hands to the event loop.
    me: Weak<VirtioPciDevice>,
    /// The guest wrote its configuration space or its BAR: its driver has started setting it
    /// up, so it is no longer in its power-on state (what a snapshot can save of it today).
    touched: AtomicBool,
    /// A back end's state (`VirtioDevice::has_backend_state`) between a snapshot reading it
    /// and the device manager taking it, or between a restore handing it over and the
    /// device's restore loading it.
    backend_state: Mutex<Option<Vec<u8>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The body of a virtio vendor capability (after its ID and next pointer).
fn virtio_cap(cfg_type: u8, offset: u64, length: u64, extra: Option<u32>) -> Vec<u8> {
    let cap_len: u8 = if extra.is_some() { 20 } else { 16 };
    let mut b = vec![cap_len, cfg_type, 0, 0, 0, 0];
    b.extend_from_slice(&(offset as u32).to_le_bytes());
    b.extend_from_slice(&(length as u32).to_le_bytes());
    if let Some(x) = extra {
        b.extend_from_slice(&x.to_le_bytes());
    }
    b
}

/// The PCI configuration space of a virtio-pci function for `device` with `vectors` MSI-X
/// vectors; returns it and the MSI-X capability's offset.
fn pci_config(device: &dyn VirtioDevice, bar_addr: u64, vectors: u16) -> (PciConfig, usize) {
    let queues = device.queue_max_sizes().len();
    let kind = device.device_type();
    let class = if kind == TYPE_BLOCK {
        (0x01, 0x80, 0)
    } else {
        (0xff, 0, 0)
    };
    let mut config = PciConfig::new(PciIds {
        vendor: VIRTIO_VENDOR,
        device: 0x1040 + kind as u16,
        revision: 1,
        class,
        subsystem_vendor: VIRTIO_VENDOR,
        subsystem: 0x40,
    });
    config.set_bar(0, BarKind::Mem64, BAR_SIZE, bar_addr);
    config.add_capability(VIRTIO_CAP_ID, &virtio_cap(1, COMMON, COMMON_LEN, None));
    let notify_len = (queues as u64 * u64::from(NOTIFY_MULTIPLIER)).max(4);
    let notify_cap = virtio_cap(2, NOTIFY, notify_len, Some(NOTIFY_MULTIPLIER));
    config.add_capability(VIRTIO_CAP_ID, &notify_cap);
    config.add_capability(VIRTIO_CAP_ID, &virtio_cap(3, ISR, 1, None));
    config.add_capability(VIRTIO_CAP_ID, &virtio_cap(4, DEVICE_CFG, REGION, None));
    // The PCI configuration access capability is presented as the spec asks; exitless
    // does not serve accesses through its window (drivers use the BAR).
    config.add_capability(
        VIRTIO_CAP_ID,
        &[virtio_cap(5, 0, 0, None), vec![0; 4]].concat(),
    );
    let body = msix::Msix::capability_body(vectors, 0, MSIX_TABLE as u32, MSIX_PBA as u32);
    let msix_cap = config.add_capability(msix::CAP_ID, &body);
    (config, msix_cap)
}

impl VirtioPciDevice {
    /// Wraps `device`, BAR 0 placed at `bar_addr` (the guest may move it), with a device
    /// dirty log of its own (nothing harvests it: for a device outside a VM's device manager).
    pub fn new(
        name: &str,
        device: Box<dyn VirtioDevice>,
        bar_addr: u64,
        mem: SharedGuestMemory,
        event_loop: EventLoopHandle,
    ) -> std::io::Result<Arc<Self>> {
        Self::with_dirty_log(name, device, bar_addr, (mem, Arc::default()), event_loop)
    }

    /// As [`VirtioPciDevice::new`], the device's writes logged in the VM's `dirty` log.
    pub fn with_dirty_log(
        name: &str,
        device: Box<dyn VirtioDevice>,
        bar_addr: u64,
        (mem, dirty): (SharedGuestMemory, Arc<DeviceDirtyLog>),
        event_loop: EventLoopHandle,
    ) -> std::io::Result<Arc<Self>> {
        let queues = device.queue_max_sizes().len();
        let vectors = queues as u16 + 1;
        let (config, msix_cap) = pci_config(device.as_ref(), bar_addr, vectors);
        let common = CommonCfg::new(device.features(), device.queue_max_sizes(), vectors);
        let notify = (0..queues)
            .map(|_| EventFd::new(EFD_NONBLOCK).map(Arc::new))
            .collect::<std::io::Result<Vec<_>>>()?;
        let irq = Arc::new(MsixInterrupt::new(vectors, queues)?);
        let health = Arc::new(DeviceHealth::new(name, irq.clone()));
        let counters = device.counters();
        Ok(Arc::new_cyclic(|me| VirtioPciDevice {
            name: name.to_string(),
            config: Mutex::new(config),
            msix_cap,
            transport: Mutex::new(Transport {
                common,
                device,
                phase: Phase::Idle,
            }),
            irq,
            notify,
            mem,
            event_loop,
            health,
            dirty,
            counters,
            me: me.clone(),
            touched: AtomicBool::new(false),
            backend_state: Mutex::default(),
        }))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Lets go of or takes back the device's host file locks ([`VirtioDevice::image_lock`]).
    pub fn image_lock(&self, held: bool) -> Result<(), String> {
        lock(&self.transport).device.image_lock(held)
    }

    /// The interrupt side: its irqfds to connect as MSI routes.
    pub fn interrupt(&self) -> &Arc<MsixInterrupt> {
        &self.irq
    }

    /// BAR 0's address now (None while the guest has memory decoding off).
    pub fn bar_address(&self) -> Option<u64> {
        lock(&self.config).bar_address(0)
    }

    /// The ioeventfds that take queue notifications in KVM, for BAR 0 at `bar_addr`: one
    /// zero-length (any width, "fast MMIO") eventfd per queue.
    pub fn notify_events(&self, bar_addr: u64) -> Vec<(IoEvent, &EventFd)> {
        self.notify
            .iter()
            .enumerate()
            .map(|(q, evt)| {
                let addr = bar_addr + NOTIFY + q as u64 * u64::from(NOTIFY_MULTIPLIER);
                let event = IoEvent {
                    pio: false,
                    addr,
                    len: 0,
                    datamatch: None,
                };
                (event, evt.as_ref())
            })
            .collect()
    }

    /// Guest accesses that were not valid register accesses.
    pub fn faults(&self) -> u64 {
        self.health.faults.load(Ordering::Relaxed)
    }

    /// Whether the device's queue work runs.
    pub fn is_running(&self) -> bool {
        matches!(lock(&self.transport).phase, Phase::Running(_))
    }

    /// The device's health: broken rings, refused starts and status writes, faults.
    pub fn health(&self) -> &Arc<DeviceHealth> {
        &self.health
    }

    /// The device's per-queue counters.
    pub fn counters(&self) -> Arc<[crate::devices::virtio::QueueCounters]> {
        self.counters.clone()
    }

    /// Grows the device to `bytes` (`vm.resize-disk`); when its configuration changed, the
    /// driver is told: a new configuration generation (a driver reading the 64-bit capacity
    /// in two halves reads again), then the configuration-change interrupt. Ok(false): the
    /// size it has. Err: why the device cannot.
    pub fn resize(&self, bytes: u64) -> Result<bool, String> {
        {
            let mut t = lock(&self.transport);
            if !t.device.resize(bytes)? {
                return Ok(false);
            }
            t.common.generation = t.common.generation.wrapping_add(1);
        }
        crate::devices::virtio::VirtioInterrupt::signal_config(self.irq.as_ref())
            .map_err(|e| format!("the guest cannot be told: {e}"))?;
        Ok(true)
    }

    /// What the device counts beyond its queues, and what its driver did wrong.
    pub fn device_counters(&self) -> Vec<(&'static str, u64)> {
        let mut all = lock(&self.transport).device.device_counters();
        all.extend(self.health.counters());
        all
    }

    fn fault(&self) {
        let n = self.health.faults.fetch_add(1, Ordering::Relaxed);
        if n == 0 {
            self.health.log.log(|| {
                format!(
                    "{}: guest access to no register ignored (further ones are only counted)",
                    self.name
                )
            });
        }
    }

    fn common_read(&self, offset: u64, data: &mut [u8]) {
        let mut t = lock(&self.transport);
        if self.health.needs_reset() {
            t.common.status |= STATUS_NEEDS_RESET;
        }
        t.common.read(offset, data);
    }

    fn common_write(&self, offset: u64, data: &[u8]) {
        let mut t = lock(&self.transport);
        match t.common.write(offset, data) {
            CommonEvent::None => {}
            CommonEvent::Fault => self.fault(),
            CommonEvent::Vector(queue, vector) => self.irq.set_vector(queue, vector),
            CommonEvent::Reset => self.reset(&mut t),
            CommonEvent::DriverOk => self.start(&mut t),
            CommonEvent::StatusRefused => {
                self.health.refused_status.fetch_add(1, Ordering::Relaxed);
                self.health.log.log(|| {
                    format!(
                        "{}: the driver tried to clear a status bit without a reset; refused",
                        self.name
                    )
                });
            }
        }
    }

    /// DRIVER_OK: the start is handed to the event loop (the vCPU returns at once). A start
    /// while the device runs, starts or resets is refused.
    fn start(&self, t: &mut Transport) {
        if t.phase != Phase::Idle {
            self.health.refused_starts.fetch_add(1, Ordering::Relaxed);
            let name = &self.name;
            self.health
                .log
                .log(|| format!("{name}: a start while the device is not idle; refused"));
            return;
        }
        t.phase = Phase::Starting;
        let me = self.me.clone();
        let handed = self.event_loop.fire(move |ops| {
            if let Some(dev) = me.upgrade() {
                dev.finish_start(ops);
            }
        });
        if handed.is_err() {
            t.phase = Phase::Idle;
            self.health.fail("the device event loop is gone");
        }
    }

    /// On the event loop: the queues as the driver programmed them, resumed from the ring's
    /// state, handed to the device; its queue work joins the loop.
    fn finish_start(&self, ops: &mut dyn SubscriberOps<Subscriber = Subscriber>) {
        let mut t = lock(&self.transport);
        if t.phase != Phase::Starting {
            return; // reset meanwhile
        }
        let started = self
            .activation(&t)
            .and_then(|a| t.device.activate(a).map_err(|e| e.to_string()));
        match started {
            Ok(worker) => t.phase = Phase::Running(ops.add_subscriber(worker)),
            Err(why) => {
                t.phase = Phase::Idle;
                self.health.refused_starts.fetch_add(1, Ordering::Relaxed);
                self.health.fail(&format!("cannot start the device: {why}"));
            }
        }
    }

    /// The enabled queues, each built from the driver's registers and checked in guest memory.
    fn activation(&self, t: &Transport) -> Result<Activation, String> {
        let event_idx = t.common.driver_features & VIRTIO_RING_F_EVENT_IDX != 0;
        let mut queues = Vec::new();
        for (index, regs) in t.common.queues.iter().enumerate() {
            if !regs.enabled {
                continue;
            }
            let queue = build_queue(regs, event_idx, &self.mem.memory())
                .ok_or_else(|| format!("queue {index} is not usable"))?;
            queues.push(ActiveQueue {
                index: index as u16,
                queue,
                notify: self.notify[index].clone(),
            });
            self.dirty
                .add_ring(&self.name, index as u16, regs.device, regs.size);
        }
        Ok(Activation {
            mem: self.mem.clone(),
            features: t.common.driver_features,
            queues,
            interrupt: self.irq.clone(),
            health: self.health.clone(),
            dirty: self.dirty.clone(),
        })
    }

    /// Status 0: a device that runs or starts is reset on the event loop (its queue work
    /// removed, which drops it and its descriptors); an idle one at once.
    fn reset(&self, t: &mut Transport) {
        let id = match std::mem::replace(&mut t.phase, Phase::Resetting) {
            Phase::Idle => return self.finish_reset(t),
            Phase::Resetting => return,
            Phase::Starting => None,
            Phase::Running(id) => Some(id),
        };
        let me = self.me.clone();
        let handed = self.event_loop.fire(move |ops| {
            if let Some(dev) = me.upgrade() {
                dev.reset_on_loop(ops, id);
            }
        });
        if handed.is_err() {
            self.finish_reset(t);
        }
    }

    fn reset_on_loop(
        &self,
        ops: &mut dyn SubscriberOps<Subscriber = Subscriber>,
        id: Option<SubscriberId>,
    ) {
        if let Some(id) = id {
            // Dropping the queue work ends the device's I/O: a disk's in-flight operations are
            // cancelled and reaped there (virtio-blk's worker), before the status reads 0.
            drop(ops.remove_subscriber(id));
        }
        self.finish_reset(&mut lock(&self.transport));
    }

    /// Back to the state after power-on.
    fn finish_reset(&self, t: &mut Transport) {
        t.device.reset();
        t.common.reset();
        self.irq.reset();
        self.health.reset();
        t.phase = Phase::Idle;
    }

    /// Whether stopping the VM should [`VirtioPciDevice::shut_down`] this device first.
    pub fn resets_on_stop(&self) -> bool {
        lock(&self.transport).device.resets_on_stop()
    }

    /// Stops the device for good (it is being taken off the VM) and waits until it has: its
    /// queue work leaves the event loop. Not for a vCPU thread.
    pub fn shut_down(&self) {
        let id = {
            let mut t = lock(&self.transport);
            match std::mem::replace(&mut t.phase, Phase::Resetting) {
                Phase::Running(id) => Some(id),
                _ => None,
            }
        };
        let me = self.me.clone();
        let done = self.event_loop.call(move |ops| {
            if let Some(dev) = me.upgrade() {
                dev.reset_on_loop(ops, id);
            }
        });
        if done.is_err() {
            self.finish_reset(&mut lock(&self.transport));
        }
    }

    fn notify_write(&self, offset: u64) {
        // Reached without ioeventfds (`Notify::MmioExit`), or while a moved BAR's ioeventfds
        // are not yet where the guest put it.
        let q = (offset / u64::from(NOTIFY_MULTIPLIER)) as usize;
        match self.notify.get(q) {
            Some(evt) => {
                let _ = evt.write(1);
            }
            None => self.fault(),
        }
    }
}

fn aligned(offset: usize, len: usize) -> bool {
    matches!(len, 1 | 2 | 4) && offset % len == 0
}

/// A `virtio_queue::Queue` as the driver programmed it, if it is valid in `mem`. It resumes
/// where the used ring says the device left off: a driver that resets the device and sets the
/// same ring up again never gets a completed request executed twice.
fn build_queue(regs: &common::QueueRegs, event_idx: bool, mem: &GuestMemoryMmap) -> Option<Queue> {
    let mut q = Queue::new(regs.max_size).ok()?;
    q.set_size(regs.size);
    let halves = |a: u64| (Some(a as u32), Some((a >> 32) as u32));
    let (lo, hi) = halves(regs.desc);
    q.set_desc_table_address(lo, hi);
    let (lo, hi) = halves(regs.driver);
    q.set_avail_ring_address(lo, hi);
    let (lo, hi) = halves(regs.device);
    q.set_used_ring_address(lo, hi);
    q.set_event_idx(event_idx);
    q.set_ready(true);
    if !q.is_valid(mem) {
        return None;
    }
    let done = q
        .used_idx(mem, std::sync::atomic::Ordering::Acquire)
        .ok()?
        .0;
    q.set_next_avail(done);
    q.set_next_used(done);
    Some(q)
}

impl PciDevice for VirtioPciDevice {
    fn config_read(&self, offset: usize, data: &mut [u8]) {
        let config = lock(&self.config);
        config.read(offset, data);
        // The MSI-X message control word (bytes 2-3 of the capability's first dword) is live
        // state; `PciConfig` already refused unaligned or odd-width accesses.
        let dword = offset & !3;
        if dword != self.msix_cap || !aligned(offset, data.len()) {
            return;
        }
        let mut bytes = [0u8; 4];
        config.read(dword, &mut bytes);
        bytes[2..4].copy_from_slice(&self.irq.control().to_le_bytes());
        let start = offset - dword;
        data.copy_from_slice(&bytes[start..start + data.len()]);
    }

    fn config_write(&self, offset: usize, data: &[u8]) -> Vec<BarChange> {
        self.touched.store(true, Ordering::Relaxed);
        let dword = offset & !3;
        if dword != self.msix_cap || !aligned(offset, data.len()) {
            return lock(&self.config).write(offset, data);
        }
        // Overlay the written bytes on the capability's first dword; bytes 2-3 are control.
        let mut bytes = [0u8; 4];
        self.config_read(dword, &mut bytes);
        let start = offset - dword;
        bytes[start..start + data.len()].copy_from_slice(data);
        if start + data.len() > 2 {
            self.irq
                .write_control(u16::from_le_bytes([bytes[2], bytes[3]]));
        }
        Vec::new()
    }

    fn bar_read(&self, bar: u8, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if bar != 0 || !(1..=8).contains(&data.len()) {
            return self.fault();
        }
        match offset {
            o if o < COMMON_LEN => self.common_read(o, data),
            ISR => data[0] = self.irq.take_isr(),
            o if (DEVICE_CFG..DEVICE_CFG + REGION).contains(&o) => lock(&self.transport)
                .device
                .read_config(o - DEVICE_CFG, data),
            o if (MSIX_TABLE..MSIX_PBA).contains(&o) => self.irq.table_read(o - MSIX_TABLE, data),
            o if (MSIX_PBA..MSIX_PBA + REGION).contains(&o) => {
                self.irq.pba_read(o - MSIX_PBA, data)
            }
            _ => {}
        }
    }

    fn bar_write(&self, bar: u8, offset: u64, data: &[u8]) {
        self.touched.store(true, Ordering::Relaxed);
        if bar != 0 || !(1..=8).contains(&data.len()) {
            return self.fault();
        }
        match offset {
            o if o < COMMON_LEN => self.common_write(o, data),
            o if (DEVICE_CFG..DEVICE_CFG + REGION).contains(&o) => lock(&self.transport)
                .device
                .write_config(o - DEVICE_CFG, data),
            o if (NOTIFY..NOTIFY + REGION).contains(&o) => self.notify_write(o - NOTIFY),
            o if (MSIX_TABLE..MSIX_PBA).contains(&o) => self.irq.table_write(o - MSIX_TABLE, data),
            _ => self.fault(),
        }
    }
}

#[cfg(test)]
mod tests;
