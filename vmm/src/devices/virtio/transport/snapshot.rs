//! What a snapshot saves of a virtio-pci device: nothing but its BAR address while its driver
//! never touched it (no configuration or BAR write since power-on: the device made anew from
//! the config on restore is the same); once its driver set it up, the transport's registers
//! (PCI command word, the common configuration with each queue's addresses, the MSI-X table
//! and pending bits, the ISR) for devices whose whole state that is ([`VirtioDevice`]'s
//! `snapshot_support`: virtio-blk, virtio-rng, virtio-net, virtio-vsock). Their rings are in
//! guest memory: a snapshot first lets the device drain them (every request the driver made
//! available is completed; receive and event buffers, which wait for something to come, are
//! given back by the device, `quiesce`), so the restored device resumes from the used ring
//! exactly. See
//! docs/snapshot.md, "Devices".
//!
//! [`VirtioDevice`]: crate::devices::virtio::VirtioDevice

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use vm_memory::{Bytes, GuestAddress, GuestAddressSpace};

use super::common::{CommonState, QueueRegs, STATUS_DRIVER_OK};
use super::interrupt::InterruptState;
use super::{lock, Phase, VirtioPciDevice, BAR_SIZE};
use crate::devices::pci::BarKind;
use crate::devices::virtio::{
    VirtioDevice, TYPE_BALLOON, TYPE_BLOCK, TYPE_FS, TYPE_NET, TYPE_RNG, TYPE_VSOCK,
};
use crate::snapshot::{from_state, to_state, Snapshottable};

/// How long a device has to finish a start or reset, and to drain its rings.
const SETTLE_TIME: Duration = Duration::from_secs(2);

/// The device's saved state: `untouched` with its BAR address, or its transport's state.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct VirtioState {
    untouched: bool,
    bar: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    transport: Option<TransportState>,
}

/// The registers a driver programs, and whether the device ran.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TransportState {
    command: u16,
    interrupt_line: u8,
    common: CommonState,
    interrupt: InterruptState,
    running: bool,
    /// The device's own state ([`VirtioDevice`]'s `save_state`: the balloon's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    device: Option<serde_json::Value>,
}

impl VirtioPciDevice {
    /// Whether the guest has written the device's configuration space or its BAR.
    pub fn touched(&self) -> bool {
        self.touched.load(Ordering::Relaxed)
    }

    /// The address BAR 0 holds (decoded or not).
    pub fn bar_base(&self) -> u64 {
        lock(&self.config).bar_base(0)
    }

    /// Waits until work handed to the event loop (a start or reset) has run and, for a
    /// running device, until every request in its rings is complete.
    fn settle(&self) -> Result<(), String> {
        let start = Instant::now();
        let wait = |what: &str| -> Result<(), String> {
            if start.elapsed() > SETTLE_TIME {
                return Err(format!("{what} after {} s", SETTLE_TIME.as_secs()));
            }
            std::thread::sleep(Duration::from_millis(1));
            Ok(())
        };
        loop {
            match lock(&self.transport).phase {
                Phase::Idle => return Ok(()),
                Phase::Running(_) => break,
                Phase::Starting | Phase::Resetting => wait("its start or reset has not run")?,
            }
        }
        if self.health.needs_reset() {
            return Err("it needs a reset (its driver broke a ring)".into());
        }
        let (queues, prefilled): (Vec<(usize, QueueRegs)>, Vec<u16>) = {
            let t = lock(&self.transport);
            let queues = t.common.queues.iter().copied().enumerate().collect();
            (queues, t.device.prefilled_queues().to_vec())
        };
        let queues: Vec<_> = queues.into_iter().filter(|(_, q)| q.enabled).collect();
        // The device takes what the driver made available even if the driver had yet to
        // notify it (a spurious notification is harmless: the device reads the ring).
        for (i, _) in &queues {
            let _ = self.notify[*i].write(1);
        }
        // Receive and event buffers stay available until something comes: the device says
        // it holds none of them (quiesce), the other queues drain.
        let must_drain: Vec<_> = queues
            .iter()
            .filter(|(i, _)| !prefilled.iter().any(|&p| usize::from(p) == *i))
            .collect();
        loop {
            let mem = self.mem.memory();
            let busy = must_drain.iter().find(|(_, q)| !drained(q, &mem));
            match busy {
                None => return lock(&self.transport).device.quiesce(),
                Some((i, _)) => wait(&format!("queue {i} still has requests in flight"))?,
            }
        }
    }
}

impl VirtioPciDevice {
    /// Runs `work` on the device on the devices thread and waits for it (not from that
    /// thread). The transport's lock is taken there, not here.
    fn on_loop<R: Send + 'static>(
        &self,
        work: impl FnOnce(&mut dyn VirtioDevice) -> R + Send + 'static,
    ) -> Result<R, String> {
        let me = self.me.upgrade().ok_or("the device is gone")?;
        let (tx, rx) = std::sync::mpsc::channel();
        self.event_loop
            .call(move |_| {
                let result = work(lock(&me.transport).device.as_mut());
                let _ = tx.send(result);
            })
            .map_err(|e| e.to_string())?;
        rx.recv()
            .map_err(|_| "the device event loop dropped the work".to_string())
    }

    /// [`VirtioDevice::backend_log`] on the devices thread (the thread that talks to a
    /// vhost-user back end once it runs).
    pub fn backend_log(&self, log: crate::devices::virtio::BackendLog) -> Result<bool, String> {
        self.on_loop(move |device| device.backend_log(log))?
    }
}

/// Whether the device has used every chain the driver made available (split ring: the
/// available and used indexes are 2 bytes into their rings).
fn drained(q: &QueueRegs, mem: &vm_memory::GuestMemoryMmap) -> bool {
    let index = |ring: u64| mem.read_obj::<u16>(GuestAddress(ring.wrapping_add(2))).ok();
    matches!((index(q.driver), index(q.device)), (Some(a), Some(u)) if a == u)
}

impl Snapshottable for VirtioPciDevice {
    fn kind(&self) -> &'static str {
        match lock(&self.transport).device.device_type() {
            TYPE_NET => "virtio-net",
            TYPE_BLOCK => "virtio-blk",
            TYPE_RNG => "virtio-rng",
            TYPE_VSOCK => "virtio-vsock",
            TYPE_FS => "virtio-fs",
            TYPE_BALLOON => "virtio-balloon",
            _ => "virtio",
        }
    }

    fn snapshot(&self) -> Result<serde_json::Value, String> {
        let bar = lock(&self.config).bar_base(0);
        if !self.touched() {
            let untouched = VirtioState {
                untouched: true,
                bar,
                transport: None,
            };
            return to_state(&untouched);
        }
        let support = lock(&self.transport).device.snapshot_support();
        support.map_err(|why| format!("its driver has set it up, and {why}"))?;
        self.settle()?;
        let (running, backend) = {
            let t = lock(&self.transport);
            let running = matches!(t.phase, Phase::Running(_));
            (running, t.device.has_backend_state())
        };
        if running && backend {
            // On the devices thread, where the back end's queues were started (nothing else
            // talks to it meanwhile); the transport's lock is not held while waiting.
            let state = self.on_loop(|device| device.save_backend_state())??;
            *lock(&self.backend_state) = Some(state);
        }
        let (command, interrupt_line) = lock(&self.config).guest_writable();
        let t = lock(&self.transport);
        let transport = TransportState {
            command,
            interrupt_line,
            common: t.common.save(),
            interrupt: match running && backend {
                true => self.irq.save_with_stopped_backend()?,
                false => self.irq.save()?,
            },
            running,
            device: t.device.save_state(),
        };
        to_state(&VirtioState {
            untouched: false,
            bar,
            transport: Some(transport),
        })
    }

    fn snapshot_ended(&self) {
        lock(&self.backend_state).take();
        if !lock(&self.transport).device.has_backend_state() {
            return lock(&self.transport).device.unquiesce();
        }
        // A back end's queues start again where they were stopped: on the devices thread.
        if let Err(e) = self.on_loop(|device| device.unquiesce()) {
            self.health
                .fail(&format!("its back end was not started again: {e}"));
        }
    }

    fn take_data(&self) -> Option<Vec<u8>> {
        lock(&self.backend_state).take()
    }

    fn put_data(&self, data: Vec<u8>) -> Result<(), String> {
        if !lock(&self.transport).device.has_backend_state() {
            return Err("it has no back end whose state could be saved beside it".into());
        }
        *lock(&self.backend_state) = Some(data);
        Ok(())
    }

    fn restore(&self, state: serde_json::Value) -> Result<(), String> {
        let s: VirtioState = from_state(state)?;
        let bar = self.bar_base();
        let Some(saved) = s.transport else {
            return match (s.untouched, s.bar == bar) {
                (false, _) => Err("a device its driver set up needs its transport state".into()),
                (true, false) => Err(format!(
                    "it was at BAR address {:#x}, the restored VM put it at {bar:#x}",
                    s.bar
                )),
                (true, true) => Ok(()),
            };
        };
        lock(&self.transport).device.snapshot_support()?;
        if s.bar == 0 || s.bar % BAR_SIZE != 0 {
            return Err(format!("BAR address {:#x} saved", s.bar));
        }
        // Where the guest put it (the device manager moves its range there).
        let mut config = lock(&self.config);
        config.set_bar(0, BarKind::Mem64, BAR_SIZE, s.bar);
        config.set_guest_writable(saved.command, saved.interrupt_line);
        drop(config);
        let mut t = lock(&self.transport);
        if let Some(own) = saved.device {
            t.device.load_state(own)?;
        }
        t.common.load(&saved.common)?;
        let vectors: Vec<u16> = t.common.queues.iter().map(|q| q.vector).collect();
        self.irq
            .restore(&saved.interrupt, t.common.config_vector, &vectors)?;
        self.touched.store(true, Ordering::Relaxed);
        if !saved.running {
            return Ok(());
        }
        if t.common.status & STATUS_DRIVER_OK == 0 {
            return Err("saved running without DRIVER_OK".into());
        }
        if t.device.has_backend_state() {
            // The new back end takes the old one's state before its queues start (here, on
            // the restoring thread: the device is not running, nothing watches its socket).
            let state = lock(&self.backend_state).take();
            let state = state.ok_or("the snapshot has no state of its back end")?;
            t.device
                .load_backend_state(&state)
                .map_err(|e| format!("its back end did not take its saved state: {e}"))?;
        }
        // Started on the event loop as a driver's DRIVER_OK starts it: the queues resume
        // from the used rings, which the snapshot drained.
        t.device.restored();
        self.start(&mut t);
        // Notifications the saved device had not read went with its eventfds: it looks.
        for (i, q) in t.common.queues.iter().enumerate() {
            if q.enabled {
                let _ = self.notify[i].write(1);
            }
        }
        Ok(())
    }
}
