//! Several vCPUs share KVM's one coalesced ring: with every vCPU writing to one coalesced zone
//! at once, each write reaches the device exactly once and each vCPU's writes in its order.
//! Needs /dev/kvm (skipped with a printed reason without it).

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvm_ioctls::IoEventAddress;

use super::guest;
use super::runner::add_bench_ports;
use crate::bench::console::LineCapture;
use vmm::builder::{KernelImage, VcpuOptions, VmBuilder, VmSpec};
use vmm::bus::{BusDevice, DeviceEvent};
use vmm::config::IrqchipMode;
use vmm::device_manager::BusKind;
use vmm::kvm;

/// The device behind the zone: records every value written, in delivery order.
#[derive(Default)]
struct Recorder(Mutex<Vec<u32>>);

impl BusDevice for Recorder {
    fn read(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }
    fn write(&self, _offset: u64, data: &[u8]) -> io::Result<DeviceEvent> {
        let mut bytes = [0u8; 4];
        let n = data.len().min(4);
        bytes[..n].copy_from_slice(&data[..n]);
        self.0.lock().unwrap().push(u32::from_le_bytes(bytes));
        Ok(DeviceEvent::None)
    }
}

#[test]
fn writes_of_several_vcpus_through_one_coalesced_ring_arrive_once_and_in_order() {
    const CPUS: u8 = 2;
    const WRITES: u32 = 3000;
    if std::fs::metadata("/dev/kvm").is_err() {
        vmm::test_skip::skip("coalesced_smp", "/dev/kvm is missing on this host");
        return;
    }
    let spec = VmSpec {
        kernel: KernelImage::Embedded(guest::BENCH_GUEST),
        initrd: None,
        cmdline: format!("smp={CPUS} coalesced={WRITES}"),
        memory: 64 << 20,
        memory_backing: vmm::memory::Backing::default(),
        cpus: CPUS,
        max_cpus: CPUS,
        irqchip: IrqchipMode::Kernel,
    };
    let mut builder = VmBuilder::new(kvm::open().unwrap(), spec).unwrap();
    let console = LineCapture::default();
    add_bench_ports(&mut builder, &console).unwrap();
    let recorder = Arc::new(Recorder::default());
    let devices = builder.devices();
    devices
        .add(
            BusKind::Mmio,
            "recorder",
            guest::BENCH_MMIO,
            4,
            recorder.clone(),
        )
        .unwrap();
    devices
        .register_coalesced(IoEventAddress::Mmio(guest::BENCH_MMIO), 4)
        .unwrap();
    let built = builder.build(&VcpuOptions::default()).unwrap();
    let running = built.vm.start(built.vcpus).unwrap();
    running.wait(Some(Duration::from_secs(120))).unwrap();
    let lines = console.take_lines().join("\n");
    assert!(
        lines.contains(&format!("EXITLESS SMP cpus={CPUS} up={CPUS}")),
        "{lines}"
    );
    let values = recorder.0.lock().unwrap().clone();
    assert_eq!(values.len() as u32, u32::from(CPUS) * WRITES, "{lines}");
    for cpu in 0..u32::from(CPUS) {
        let own: Vec<u32> = values
            .iter()
            .filter(|v| *v >> 24 == cpu)
            .map(|v| v & 0xff_ffff)
            .collect();
        assert!(
            own.iter().copied().eq(0..WRITES),
            "vCPU {cpu}'s writes: {} values, out of order or repeated",
            own.len()
        );
    }
}
