//! Ports the bench guest talks to: the exit port (QEMU isa-debug-exit compatible) and the
//! marker port that brackets each measured loop.

use std::io;

use vmm::bus::{BusDevice, DeviceEvent};

fn le_value(data: &[u8]) -> u32 {
    let mut b = [0u8; 4];
    let n = data.len().min(4);
    b[..n].copy_from_slice(&data[..n]);
    u32::from_le_bytes(b)
}

/// A write powers the guest off with the written value as its status.
#[derive(Debug, Default)]
pub struct ExitPort;

impl BusDevice for ExitPort {
    fn read(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }
    fn write(&self, _offset: u64, data: &[u8]) -> io::Result<DeviceEvent> {
        Ok(DeviceEvent::Shutdown(le_value(data)))
    }
}

/// A write marks a moment (begin/end of a measured loop): the exit is shown to the vCPU's
/// observer, which keeps the vCPU's counters then.
#[derive(Debug, Default)]
pub struct MarkerPort;

impl BusDevice for MarkerPort {
    fn read(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }
    fn write(&self, _offset: u64, data: &[u8]) -> io::Result<DeviceEvent> {
        Ok(DeviceEvent::Observe(le_value(data)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_port_reports_the_status() {
        assert_eq!(
            ExitPort.write(0, &[3, 0, 0, 0]).unwrap(),
            DeviceEvent::Shutdown(3)
        );
        assert_eq!(
            ExitPort.write(0, &[0x01, 0x02]).unwrap(),
            DeviceEvent::Shutdown(0x201)
        );
    }

    #[test]
    fn marker_port_reports_the_marker() {
        assert_eq!(
            MarkerPort.write(0, &[2, 0, 0, 0]).unwrap(),
            DeviceEvent::Observe(2)
        );
    }
}
