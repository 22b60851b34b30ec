//! A running VM's memory hotplug (`vm.resize {"desired_ram": N}`): guest RAM grows by one
//! region of the hotplug area ([`HotplugRam`]), mapped as the VM's RAM is (shared memory
//! stays shared, so a vhost-user back end can map it too), registered as a new KVM memory
//! slot, put in the map the devices see, given to the memory listeners, then to the guest
//! through the ACPI memory hotplug controller and the GED's interrupt.

use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use super::{LaunchError, LaunchedVm};
use crate::memory::hotplug::MemoryListener;
use crate::memory::hotplug::{HotplugRegion, MemoryHotplugError};
use crate::memory::{self};

impl LaunchedVm {
    /// Bytes of RAM the guest has now: at boot and hot-added.
    pub fn memory_size(&self) -> u64 {
        self.vm.memory().iter().map(|r| r.len()).sum()
    }

    /// The region that brings guest RAM to `desired` bytes, None if the VM has that much
    /// already (a smaller size is ignored: memory is never taken back), or why it cannot
    /// grow (no hotplug area, beyond it, not whole blocks, no slot left).
    pub fn plan_memory(&self, desired: u64) -> Result<Option<HotplugRegion>, MemoryHotplugError> {
        match &self.hotplug_ram {
            Some(ram) => ram.plan(desired),
            None if desired <= self.memory_size() => Ok(None),
            None => Err(MemoryHotplugError::NotEnabled),
        }
    }

    /// Grows guest RAM to `desired` bytes and tells the guest; returns the bytes added (0:
    /// nothing to do). Refusals are [`LaunchError::MemoryHotplug`] (see
    /// [`LaunchedVm::plan_memory`]); anything else is the host failing.
    pub fn resize_memory(&mut self, desired: u64) -> Result<u64, LaunchError> {
        let Some(region) = self.plan_memory(desired)? else {
            return Ok(0);
        };
        let mapped = memory::create_region(region.start, region.len, &self.memory_backing)?;
        let added = self.vm.add_memory_region(mapped)?;
        // Guest memory from here on, whether or not the guest is told of it.
        if let Some(ram) = self.hotplug_ram.as_mut() {
            ram.commit(&region);
        }
        self.devices.memory_added(region.slot, &added)?;
        Ok(region.len)
    }

    /// `listener` is told of every region added from now on (before the guest is).
    pub fn add_memory_listener(&mut self, listener: Box<dyn MemoryListener>) {
        self.devices.add_memory_listener(listener);
    }

    /// The VM's guest memory (every region, hot-added ones too), as the devices share it.
    pub fn guest_memory(&self) -> &crate::devices::virtio::SharedGuestMemory {
        &self.vm.mem
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use vm_memory::{Bytes, GuestAddress, GuestMemoryRegion, GuestRegionMmap};

    use crate::builder::{KernelImage, VcpuOptions, VmBuilder, VmSpec};
    use crate::config::IrqchipMode;
    use crate::device_manager::DeviceManagerError;
    use crate::memory::hotplug::HotplugRam;
    use crate::memory::hotplug::MemoryListener;

    /// Keeps what it is told, or refuses.
    struct Recording(Arc<Mutex<Vec<(u64, u64)>>>, bool);

    impl MemoryListener for Recording {
        fn name(&self) -> &str {
            "recording"
        }

        fn region_added(&mut self, region: &Arc<GuestRegionMmap>) -> Result<(), String> {
            if self.1 {
                return Err("refused".into());
            }
            let mut seen = self.0.lock().unwrap();
            seen.push((region.start_addr().0, region.len()));
            Ok(())
        }
    }

    /// A region added to a built VM: a KVM slot, the devices' map, the listeners told, the
    /// controller's slot filled; the DSDT has the controller's slots.
    #[test]
    fn a_region_joins_kvm_the_devices_map_and_the_listeners() {
        if std::fs::metadata("/dev/kvm").is_err() {
            return crate::test_skip::skip("memory_region_added", "/dev/kvm is missing");
        }
        let spec = VmSpec {
            kernel: KernelImage::Embedded(exitless_guest::BENCH_GUEST),
            initrd: None,
            cmdline: String::new(),
            memory: 256 << 20,
            memory_backing: crate::memory::Backing::default(),
            cpus: 1,
            max_cpus: 1,
            irqchip: IrqchipMode::Kernel,
        };
        let mut ram = HotplugRam::new(256 << 20, 1 << 30, None).unwrap();
        let mut builder = VmBuilder::new(crate::kvm::open().unwrap(), spec).unwrap();
        builder.enable_hotplug(ram.slots()).unwrap();
        let mut built = builder.build(&VcpuOptions::default()).unwrap();
        let dsdt = built.devices.acpi_platform().dsdt_aml;
        assert!(dsdt.windows(4).any(|w| w == b"M007"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        built
            .devices
            .add_memory_listener(Box::new(Recording(seen.clone(), false)));
        let region = ram.plan(512 << 20).unwrap().unwrap();
        let mapped =
            crate::memory::create_region(region.start, region.len, &Default::default()).unwrap();
        let added = built.vm.add_memory_region(mapped).unwrap();
        ram.commit(&region);
        built.devices.memory_added(region.slot, &added).unwrap();
        assert_eq!(*seen.lock().unwrap(), vec![(1 << 32, 256 << 20)]);
        let top = GuestAddress((1 << 32) + (256 << 20) - 4);
        built.vm.memory().write_obj(0x5a5a_5a5au32, top).unwrap();
        assert_eq!(
            added
                .read_obj::<u32>(vm_memory::MemoryRegionAddress((256 << 20) - 4))
                .unwrap(),
            0x5a5a_5a5a
        );
        // A region overlapping one there is refused before KVM sees it.
        let again =
            crate::memory::create_region(region.start, region.len, &Default::default()).unwrap();
        assert!(built.vm.add_memory_region(again).is_err());
        // A slot past the last is an error, told to no listener.
        let e = built.devices.memory_added(8, &added).unwrap_err();
        assert!(matches!(e, DeviceManagerError::NoMemorySlot(8)), "{e}");
        assert_eq!(seen.lock().unwrap().len(), 1);
        // A listener that refuses stops the hot-add.
        built
            .devices
            .add_memory_listener(Box::new(Recording(seen.clone(), true)));
        let e = built.devices.memory_added(1, &added).unwrap_err();
        assert!(matches!(e, DeviceManagerError::MemoryListener(..)), "{e}");
    }
}
