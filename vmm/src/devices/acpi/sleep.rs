//! The sleep control and status register of a hardware-reduced ACPI platform (the FADT's
//! `SLEEP_CONTROL_REG` and `SLEEP_STATUS_REG`, both this one I/O port). A guest's ACPI
//! power-off (Linux's `poweroff`, after the power button's notification) writes `\_S5_`'s
//! sleep type with SLP_EN: the VM ends as a clean power-off. Clearing the status (WAK_STS)
//! is accepted silently; any other sleep state is refused: counted, said once.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::bus::{BusDevice, DeviceEvent};

/// The register's I/O port (one byte), as Cloud Hypervisor places its own.
pub const SLEEP_PORT: u16 = 0x600;
pub const SLEEP_LEN: u64 = 1;
/// `\_S5_`'s sleep type (SLP_TYPa): what the DSDT says and a guest writes back.
pub use super::layout::S5_SLEEP_TYPE;
/// SLP_TYP is bits 2..=4 of the control register, SLP_EN bit 5.
const SLEEP_TYPE_SHIFT: u8 = 2;
const SLEEP_TYPE_MASK: u8 = 0x7;
const SLEEP_ENABLE: u8 = 1 << 5;

/// What the guest's write asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SleepRequest {
    /// No SLP_EN: a status clear, or nothing.
    Nothing,
    /// S5: power off.
    PowerOff,
    /// A sleep state this platform does not have (S1-S4), or a wide access.
    Unsupported,
}

/// Decodes a write of `data` to the register.
pub fn decode(data: &[u8]) -> SleepRequest {
    let [value] = data else {
        return SleepRequest::Unsupported;
    };
    if value & SLEEP_ENABLE == 0 {
        return SleepRequest::Nothing;
    }
    match (value >> SLEEP_TYPE_SHIFT) & SLEEP_TYPE_MASK {
        S5_SLEEP_TYPE => SleepRequest::PowerOff,
        _ => SleepRequest::Unsupported,
    }
}

/// The register: its reads are 0 (no wake status), an S5 write powers the VM off.
#[derive(Debug, Default)]
pub struct SleepControl {
    refused: AtomicU64,
}

impl SleepControl {
    /// Writes that asked for a sleep state this platform does not have.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

impl BusDevice for SleepControl {
    fn read(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&self, _offset: u64, data: &[u8]) -> io::Result<DeviceEvent> {
        match decode(data) {
            SleepRequest::PowerOff => Ok(DeviceEvent::Shutdown(0)),
            SleepRequest::Nothing => Ok(DeviceEvent::None),
            SleepRequest::Unsupported => {
                if self.refused.fetch_add(1, Ordering::Relaxed) == 0 {
                    eprintln!(
                        "exitless: the guest asked for a sleep state other than S5 ({data:x?}); \
                         ignored (said once)"
                    );
                }
                Ok(DeviceEvent::None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s5_with_sleep_enable_powers_off_and_nothing_else_does() {
        let dev = SleepControl::default();
        let s5 = (S5_SLEEP_TYPE << SLEEP_TYPE_SHIFT) | SLEEP_ENABLE;
        assert_eq!(s5, 0x34, "Linux's hardware-reduced S5 write");
        assert_eq!(dev.write(0, &[s5]).unwrap(), DeviceEvent::Shutdown(0));
        // Clearing WAK_STS before sleeping, or S5's type without SLP_EN: nothing.
        assert_eq!(dev.write(0, &[0x80]).unwrap(), DeviceEvent::None);
        assert_eq!(
            dev.write(0, &[s5 & !SLEEP_ENABLE]).unwrap(),
            DeviceEvent::None
        );
        assert_eq!(dev.refused(), 0);
        // S3 with SLP_EN, a wide write: refused and counted, the guest goes on.
        assert_eq!(
            dev.write(0, &[(3 << SLEEP_TYPE_SHIFT) | SLEEP_ENABLE])
                .unwrap(),
            DeviceEvent::None
        );
        assert_eq!(dev.write(0, &[s5, 0]).unwrap(), DeviceEvent::None);
        assert_eq!(dev.refused(), 2);
        let mut b = [0xffu8; 2];
        dev.read(0, &mut b);
        assert_eq!(b, [0, 0]);
    }
}
