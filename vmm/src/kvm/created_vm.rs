//! A VM created before its description was known (by the launch's head start,
//! `launch::head_start`): no memory, no irqchip yet.

use kvm_ioctls::{Kvm, VmFd};

use super::dirty_tracking::DirtyTracking;
use super::Capabilities;

/// A VM created before its description was known: no memory, no irqchip yet.
pub struct CreatedVm {
    pub fd: VmFd,
    pub caps: Capabilities,
    /// How it tracks dirty pages (the ring is enabled here, before any vCPU).
    pub dirty: DirtyTracking,
}

impl CreatedVm {
    /// Creates an empty VM on `kvm`, probes its capabilities and sets its dirty tracking up.
    pub fn create(kvm: &Kvm) -> Result<Self, super::KvmError> {
        let fd = kvm.create_vm().map_err(super::KvmError::CreateVm)?;
        let caps = Capabilities::probe(kvm);
        let dirty = DirtyTracking::set_up(kvm, &fd)?;
        Ok(CreatedVm { fd, caps, dirty })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_created_vm_takes_kvm_s_capabilities() {
        let Ok(kvm) = super::super::open() else {
            crate::test_skip::skip("a_created_vm_takes_kvm_s_capabilities", "no /dev/kvm");
            return;
        };
        let vm = CreatedVm::create(&kvm).expect("create a VM");
        assert_eq!(vm.caps.max_vcpus, kvm.get_max_vcpus());
        assert!(vm.caps.irqchip, "x86 KVM has an in-kernel irqchip");
        // The VM is usable: a memory-less vCPU can be created on it.
        vm.fd.create_vcpu(0).expect("a vCPU on the created VM");
    }
}
