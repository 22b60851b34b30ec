//! A minimal i8042 (vm-superio) at ports 0x60..=0x64, there only for the guest's reset.
//!
//! Writing the "pulse reset line" command 0xfe to port 0x64 yields [`DeviceEvent::Reset`].
//! Port 0x60 (data) and 0x64 (status/command) read as 0. Ports 0x61..=0x63 are inside the
//! range but not emulated: they read as 0 and ignore writes (0x61, the PC speaker / NMI status
//! port, is normally served by KVM's in-kernel PIT).

use super::GuestFaults;
use std::cell::Cell;
use std::convert::Infallible;
use std::io;

use vm_superio::{I8042Device, Trigger};

use crate::bus::{DeviceEvent, MutBusDevice};
use crate::snapshot::{from_state, to_state, Snapshottable};

/// First I/O port of the i8042 range.
pub const I8042_BASE: u64 = 0x60;
/// Number of ports mapped (0x60..=0x64).
pub const I8042_LEN: u64 = 5;

/// Records that the guest asked for a reset; read back by the bus device after each write.
#[derive(Debug, Default)]
struct ResetLatch(Cell<bool>);

impl Trigger for ResetLatch {
    type E = Infallible;

    fn trigger(&self) -> Result<(), Infallible> {
        self.0.set(true);
        Ok(())
    }
}

/// The i8042 device: a [`MutBusDevice`] of [`I8042_LEN`] ports.
pub struct I8042 {
    dev: I8042Device<ResetLatch>,
    faults: GuestFaults,
}

impl Default for I8042 {
    fn default() -> Self {
        Self::new()
    }
}

impl I8042 {
    pub fn new() -> Self {
        Self {
            dev: I8042Device::new(ResetLatch::default()),
            faults: GuestFaults::new("i8042"),
        }
    }

    /// Number of guest accesses that were invalid (bad offset or width).
    pub fn faults(&self) -> u64 {
        self.faults.count()
    }

    /// Checks a guest access: the register index, or None for a counted fault.
    fn check(&mut self, op: &str, offset: u64, len: usize) -> Option<u8> {
        self.faults.check_byte_access(op, offset, len, I8042_LEN)
    }
}

impl MutBusDevice for I8042 {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        match self.check("read", offset, data.len()) {
            Some(port) => data[0] = self.dev.read(port),
            None => data.fill(0xff),
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<DeviceEvent> {
        let Some(port) = self.check("write", offset, data.len()) else {
            return Ok(DeviceEvent::None);
        };
        self.dev.write(port, data[0]).map_err(io::Error::other)?;
        if self.dev.reset_evt().0.replace(false) {
            Ok(DeviceEvent::Reset)
        } else {
            Ok(DeviceEvent::None)
        }
    }
}

/// The i8042's saved state: none (it only passes the reset command on). An empty object, so
/// that a later model with state has a place for it.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct I8042State {}

impl Snapshottable for std::sync::Mutex<I8042> {
    fn kind(&self) -> &'static str {
        "i8042"
    }

    fn snapshot(&self) -> Result<serde_json::Value, String> {
        to_state(&I8042State {})
    }

    fn restore(&self, state: serde_json::Value) -> Result<(), String> {
        from_state::<I8042State>(state).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_command_on_0x64_resets() {
        let mut d = I8042::new();
        assert_eq!(d.write(4, &[0xfe]).unwrap(), DeviceEvent::Reset);
        // The latch is cleared: an unrelated write does not reset again.
        assert_eq!(d.write(4, &[0xfd]).unwrap(), DeviceEvent::None);
        assert_eq!(d.write(0, &[0xfe]).unwrap(), DeviceEvent::None);
        assert_eq!(d.write(1, &[0xfe]).unwrap(), DeviceEvent::None);
        assert_eq!(d.faults(), 0);
    }

    #[test]
    fn reads_are_zero_and_bad_accesses_are_faults() {
        let mut d = I8042::new();
        let mut b = [0xaau8];
        d.read(0, &mut b);
        assert_eq!(b, [0]);
        d.read(4, &mut b);
        assert_eq!(b, [0]);
        let mut w = [0u8; 2];
        d.read(4, &mut w);
        assert_eq!(w, [0xff, 0xff]);
        assert_eq!(d.write(4, &[0xfe, 0]).unwrap(), DeviceEvent::None);
        assert_eq!(d.write(5, &[0xfe]).unwrap(), DeviceEvent::None);
        assert_eq!(d.faults(), 3);
    }
}
