//! The `virtio_status` fuzz target: device status and queue register sequences (virtio 1.x
//! 2.1 and 4.1.4.3) against a virtio-pci function with virtio-rng or virtio-blk (on a file of
//! its own) behind it, whose start and reset run on a device event loop as in a VM. Besides
//! never panicking or hanging, the status must keep the spec's promises:
//! - DRIVER_OK is never cleared except by a reset;
//! - the status shows only bits the driver wrote since the last reset (and NEEDS_RESET);
//! - a device whose queue work runs has DRIVER_OK and FEATURES_OK set.

use std::sync::Arc;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::{small_memory, Input};
use vmm::config::disk::DiskConfig;
use vmm::devices::pci::PciDevice;
use vmm::devices::virtio::blk::Block;
use vmm::devices::virtio::rng::Rng;
use vmm::devices::virtio::transport::common::{
    STATUS_ACKNOWLEDGE, STATUS_DRIVER, STATUS_DRIVER_OK, STATUS_FEATURES_OK, STATUS_NEEDS_RESET,
};
use vmm::devices::virtio::transport::VirtioPciDevice;
use vmm::devices::virtio::VirtioDevice;
use vmm::event_loop::EventLoop;

const STATUS: u64 = 0x14;
const QUEUE_SELECT: u64 = 0x16;
const QUEUE_SIZE: u64 = 0x18;
const QUEUE_ENABLE: u64 = 0x1c;
/// queue_desc, queue_driver, queue_device: low and high halves.
const QUEUE_ADDRESSES: [u64; 6] = [0x20, 0x24, 0x28, 0x2c, 0x30, 0x34];
const NOTIFY: u64 = 0x3000;

/// A virtio-blk on a file of its own: made, opened, then unlinked (the open file lives on).
fn blk_device() -> Option<Box<dyn VirtioDevice>> {
    let path = std::env::temp_dir().join(format!(
        "exitless-fuzz-status-{}-{:?}.img",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::File::create(&path).ok()?.set_len(64 << 10).ok()?;
    let disk = DiskConfig {
        path: path.clone(),
        ..Default::default()
    };
    let block = Block::open(&disk);
    let _ = std::fs::remove_file(&path);
    Some(Box::new(block.ok()?))
}

fn function(
    mem: &GuestMemoryMmap,
    blk: bool,
) -> Option<(Arc<VirtioPciDevice>, EventLoop, &'static str)> {
    // A fuzzing process is not a VMM (see `rng_function`).
    vmm::seccomp::disable();
    let (device, name): (Box<dyn VirtioDevice>, _) = if blk {
        (blk_device()?, "virtio-blk0")
    } else {
        (Box::new(Rng::new()), "virtio-rng")
    };
    let event_loop = EventLoop::start().ok()?;
    let shared = vmm::devices::virtio::SharedGuestMemory::new(mem.clone());
    let dev = VirtioPciDevice::new(name, device, 0xc000_0000, shared, event_loop.handle()).ok()?;
    Some((dev, event_loop, name))
}

/// What the driver may expect of the status register, from what it wrote.
struct StatusModel {
    /// The last status read.
    last: u8,
    /// Bits that may show: written since the last reset that is known to be done.
    allowed: u8,
    /// Bits written since the last reset was written (that reset may not be done yet).
    since_reset: u8,
    /// A reset was written and may complete before the next read.
    reset_pending: bool,
}

impl StatusModel {
    fn wrote(&mut self, v: u8) {
        if v == 0 {
            self.reset_pending = true;
            self.since_reset = 0;
        } else {
            self.allowed |= v;
            self.since_reset |= v;
        }
    }

    /// Checks a status read (`name` for the message).
    fn check(&mut self, name: &str, status: u8) {
        let shown = status & !STATUS_NEEDS_RESET;
        assert_eq!(
            shown & !self.allowed,
            0,
            "{name}: status {status:#x} shows bits never written (allowed {:#x})",
            self.allowed
        );
        let cleared = self.last & STATUS_DRIVER_OK != 0 && status & STATUS_DRIVER_OK == 0;
        assert!(
            !cleared || self.reset_pending,
            "{name}: DRIVER_OK cleared without a reset ({:#x} -> {status:#x})",
            self.last
        );
        self.last = status;
    }

    /// Every reset written so far is done (the event loop ran all it was handed).
    fn settled(&mut self) {
        if self.reset_pending {
            self.allowed = self.since_reset;
            self.reset_pending = false;
        }
    }
}

struct Driver<'a> {
    dev: &'a VirtioPciDevice,
    model: StatusModel,
    name: &'static str,
}

impl Driver<'_> {
    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset == STATUS && data.len() == 1 {
            self.model.wrote(data[0]);
        }
        self.dev.bar_write(0, offset, data);
    }

    fn status(&mut self) -> u8 {
        let mut s = [0u8];
        self.dev.bar_read(0, STATUS, &mut s);
        s[0]
    }

    fn check(&mut self) {
        let s = self.status();
        self.model.check(self.name, s);
    }

    /// The whole initialisation of queue 0 at `base` (a page in guest memory) up to DRIVER_OK.
    fn init(&mut self, base: u32, size: u16) {
        self.write(STATUS, &[STATUS_ACKNOWLEDGE | STATUS_DRIVER]);
        self.write(0x08, &1u32.to_le_bytes());
        self.write(0x0c, &1u32.to_le_bytes()); // VIRTIO_F_VERSION_1
        let negotiated = STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK;
        self.write(STATUS, &[negotiated]);
        self.write(QUEUE_SELECT, &0u16.to_le_bytes());
        self.write(QUEUE_SIZE, &size.to_le_bytes());
        for (i, &at) in QUEUE_ADDRESSES.iter().enumerate() {
            let v = if i % 2 == 0 {
                base + 0x400 * i as u32
            } else {
                0
            };
            self.write(at, &v.to_le_bytes());
        }
        self.write(QUEUE_ENABLE, &1u16.to_le_bytes());
        self.write(STATUS, &[negotiated | STATUS_DRIVER_OK]);
    }

    /// Waits for the event loop to do what it was handed; then the status must be consistent
    /// with the queue work: running means DRIVER_OK and FEATURES_OK.
    fn settle(&mut self, event_loop: &EventLoop) {
        let _ = event_loop.handle().call(|_| {});
        self.check();
        self.model.settled();
        let ok = STATUS_DRIVER_OK | STATUS_FEATURES_OK;
        if self.dev.is_running() && !self.model.reset_pending {
            let s = self.status();
            assert_eq!(s & ok, ok, "{}: runs with status {s:#x}", self.name);
        }
    }
}

/// Register sequences from `data` (see the module's documentation).
pub fn virtio_status(data: &[u8]) {
    let Some(mem) = small_memory() else {
        return;
    };
    // The rings hold what the input's first bytes say (requests to serve, or garbage).
    let _ = mem.write_slice(&data[..data.len().min(1 << 16)], GuestAddress(0x1_0000));
    let mut input = Input::new(data);
    let Some((dev, event_loop, name)) = function(&mem, input.u8() & 1 == 1) else {
        return;
    };
    let model = StatusModel {
        last: 0,
        allowed: 0,
        since_reset: 0,
        reset_pending: false,
    };
    let mut d = Driver {
        dev: &dev,
        model,
        name,
    };
    while input.more() {
        match input.u8() % 10 {
            0 => d.write(STATUS, &[input.u8()]),
            1 => {
                let v = d.status() | 1 << (input.u8() % 8);
                d.write(STATUS, &[v]);
            }
            2 => d.write(STATUS, &[0]),
            3 => d.write(QUEUE_SELECT, &u16::from(input.u8() % 3).to_le_bytes()),
            4 => d.write(QUEUE_SIZE, &(1u16 << (input.u8() % 10)).to_le_bytes()),
            5 => d.write(QUEUE_ENABLE, &u16::from(input.u8() % 3).to_le_bytes()),
            6 => {
                let at = QUEUE_ADDRESSES[usize::from(input.u8()) % 6];
                let v = u32::from(input.u16()) << (input.u8() % 8);
                d.write(at, &v.to_le_bytes());
            }
            7 => d.write(NOTIFY + 4 * u64::from(input.u8() % 2), &[0, 0]),
            8 => d.settle(&event_loop),
            _ => {
                let base = 0x1_0000 + (u32::from(input.u8()) << 12) % 0xe_0000;
                d.init(base, 1 << (input.u8() % 8));
            }
        }
        d.check();
    }
    d.settle(&event_loop);
}
