//! Device models: state machines behind the bus, testable without KVM.

pub mod acpi;
pub mod console_input;
pub mod i8042;
pub mod partial_line_watch;
pub mod pci;
pub mod serial;
pub mod serial_idle_flush;
pub mod virtio;

/// Counts guest-caused faults of one device (bad offsets, wrong access widths) and logs the
/// first one; later ones are only counted.
#[derive(Debug)]
pub struct GuestFaults {
    device: &'static str,
    count: u64,
}

impl GuestFaults {
    pub const fn new(device: &'static str) -> Self {
        GuestFaults { device, count: 0 }
    }

    /// How many faults the guest has caused.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Counts (and the first time logs) a guest access at `offset` of `width` bytes that is
    /// no register.
    pub fn record(&mut self, op: &str, offset: u64, width: usize) {
        self.count += 1;
        if self.count == 1 {
            eprintln!(
                "{}: Guest {op} of {width} bytes at offset {offset:#x} ignored \
                 (further faults are only counted)",
                self.device
            );
        }
    }

    /// Checks a single-byte register access at `offset` of a device `len` registers long;
    /// returns the register index, or counts (and the first time logs) a fault.
    pub fn check_byte_access(
        &mut self,
        op: &str,
        offset: u64,
        width: usize,
        len: u64,
    ) -> Option<u8> {
        if width == 1 && offset < len {
            return u8::try_from(offset).ok();
        }
        self.record(op, offset, width);
        None
    }
}
