//! The builder's restore: a VM made from saved state instead of a kernel. Its vCPUs may be
//! made ahead of the state ([`VmBuilder::vcpus_ahead`]: a migration's destination makes them
//! when Config arrives, outside the downtime); whatever the state needs beyond them is made
//! when it is put back, and every check (the host's CPU against the saved one) runs then.

use kvm_bindings::kvm_cpuid_entry2;
use kvm_ioctls::VcpuFd;

use super::{assemble, create_vcpu_fd, join_set_up, BuildError, BuiltVm, VcpuOptions, VmBuilder};
use crate::boot::cpuid;
use crate::kvm::{self, KvmError};
use crate::startup::mark;
use crate::vm::Vm;

/// The restore's moments inside the build (`-v`: the restore's timeline).
const CHECKED: &str = "restore: vCPUs not made ahead created, the host's CPU checked";
const VM_SET: &str = "restore: irqchip, PIT and clock set (the PIT's thread done)";
const ASSEMBLED: &str = "restore: buses frozen";

/// vCPUs of a VM to be restored, made before its saved state is known: their KVM fds
/// (KVM_CREATE_VCPU) and the CPUID table a vCPU booted on this host sees (what the saved
/// CPU is checked against once the state comes). Dropped, they go with the VM.
#[derive(Default)]
pub struct VcpusAhead {
    fds: Vec<(u8, VcpuFd)>,
    seen: Option<Vec<kvm_cpuid_entry2>>,
}

impl VcpusAhead {
    /// The ids of the vCPUs made.
    pub fn ids(&self) -> Vec<u8> {
        self.fds.iter().map(|(id, _)| *id).collect()
    }
}

/// What the host check and the restore are given.
type CheckCpu<'a> = &'a dyn Fn(&[kvm_cpuid_entry2]) -> Result<(), BuildError>;

impl VmBuilder {
    /// vCPUs the guest's CPU topology counts (the most the VM may have).
    fn topology(&self) -> u8 {
        self.spec.max_cpus.max(self.spec.cpus)
    }

    /// Creates vCPUs `ids` of the VM (not configured: a restore sets their state) and reads
    /// the CPUID a guest booted here would see through the first. The PIT's thread is
    /// waited for here too (its end is a thread wake-up and exit), not when the state is
    /// set.
    pub fn vcpus_ahead(&mut self, ids: &[u8]) -> Result<VcpusAhead, BuildError> {
        join_set_up(self.set_up.take())?;
        let fds = ids
            .iter()
            .map(|&id| Ok((id, create_vcpu_fd(&self.vm, id)?)))
            .collect::<Result<Vec<_>, BuildError>>()?;
        let seen = match fds.first() {
            Some((_, fd)) => Some(cpuid_seen_here(&self.vm, fd, self.topology())?),
            None => None,
        };
        Ok(VcpusAhead { fds, seen })
    }

    /// Like [`VmBuilder::build`] for a VM restored from a snapshot: guest memory already holds
    /// the kernel and its tables, so nothing is loaded; the irqchip, PIT and clock get `vm`'s
    /// saved state and each vCPU its own (`vcpus[i]` is vCPU `i`'s), in the order KVM needs
    /// (see [`kvm::state::restore_vcpu`]). First `check_cpu` is shown the CPUID a vCPU booted
    /// here would see (to refuse a host that lacks what the guest saw).
    pub fn build_restored(
        self,
        opts: &VcpuOptions,
        vm_state: &kvm::state::VmKvmState,
        vcpus: &[kvm::state::VcpuKvmState],
        check_cpu: CheckCpu<'_>,
    ) -> Result<BuiltVm, BuildError> {
        let ids: Vec<u8> = (0..self.spec.cpus).collect();
        self.build_restored_ids(opts, vm_state, &ids, vcpus, check_cpu)
    }

    /// [`VmBuilder::build_restored`] for vCPUs `ids` (ascending, one per state in `vcpus`:
    /// vCPUs added or removed while the saved VM ran leave gaps).
    pub fn build_restored_ids(
        self,
        opts: &VcpuOptions,
        vm_state: &kvm::state::VmKvmState,
        ids: &[u8],
        vcpus: &[kvm::state::VcpuKvmState],
        check_cpu: CheckCpu<'_>,
    ) -> Result<BuiltVm, BuildError> {
        let none = VcpusAhead::default();
        self.build_restored_ahead(none, opts, vm_state, ids, vcpus, check_cpu)
    }

    /// [`VmBuilder::build_restored_ids`] onto the vCPUs made `ahead`: each must be one of
    /// `ids` (else the VM is refused: a made vCPU cannot be taken back from KVM); the vCPUs
    /// of `ids` not made ahead (added while the saved VM ran) are created here.
    pub fn build_restored_ahead(
        self,
        ahead: VcpusAhead,
        opts: &VcpuOptions,
        vm_state: &kvm::state::VmKvmState,
        ids: &[u8],
        vcpus: &[kvm::state::VcpuKvmState],
        check_cpu: CheckCpu<'_>,
    ) -> Result<BuiltVm, BuildError> {
        let topology = self.topology();
        let VmBuilder {
            spec,
            vm,
            devices,
            event_loop,
            set_up,
            ..
        } = self;
        let VcpusAhead {
            fds: mut made,
            seen,
        } = ahead;
        if let Some((id, _)) = made.iter().find(|(id, _)| !ids.contains(id)) {
            return Err(BuildError::VcpuNotSaved(*id));
        }
        let mut fds = Vec::with_capacity(ids.len());
        for &id in ids {
            match made.iter().position(|(m, _)| *m == id) {
                Some(i) => fds.push(made.swap_remove(i).1),
                None => fds.push(create_vcpu_fd(&vm, id)?),
            }
        }
        let seen = match (seen, fds.first()) {
            (Some(seen), _) => Some(seen),
            (None, Some(fd)) => Some(cpuid_seen_here(&vm, fd, topology)?),
            (None, None) => None,
        };
        if let Some(seen) = seen {
            check_cpu(&seen)?;
        }
        mark(CHECKED);
        join_set_up(set_up)?;
        kvm::state::restore_vm(&vm.fd, vm_state)?;
        mark(VM_SET);
        let xsave_size = kvm::state::xsave_size(&vm.fd);
        let (mut built, template) = assemble(vm, event_loop, devices, &spec, opts)?;
        mark(ASSEMBLED);
        for ((&id, fd), state) in ids.iter().zip(fds).zip(vcpus) {
            kvm::state::restore_vcpu(&fd, state, xsave_size)?;
            built.add_vcpu(&template, fd, id)?;
        }
        built.finish(template)
    }
}

/// The CPUID table a guest booted here sees, as KVM reads it back from vCPU `fd` once it is
/// set: on some hosts more than KVM_GET_SUPPORTED_CPUID says (PVM hands the guest the host
/// CPU's own features, which its user code meets natively). A restore sets the saved table
/// on every vCPU afterwards (before its first KVM_RUN, which KVM allows).
fn cpuid_seen_here(vm: &Vm, fd: &VcpuFd, cpus: u8) -> Result<Vec<kvm_cpuid_entry2>, BuildError> {
    let mut cpuid = vm.supported_cpuid.get(&vm.kvm)?;
    cpuid::fixup_cpuid(&mut cpuid, 0, cpus);
    fd.set_cpuid2(&cpuid)
        .map_err(|e| KvmError::Ioctl("KVM_SET_CPUID2", e))?;
    let seen = fd
        .get_cpuid2(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
        .map_err(|e| KvmError::Ioctl("KVM_GET_CPUID2", e))?;
    Ok(seen.as_slice().to_vec())
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::builder::{KernelImage, VmSpec};
    use crate::config::IrqchipMode;

    fn builder(cpus: u8, max_cpus: u8) -> VmBuilder {
        let spec = VmSpec {
            kernel: KernelImage::Embedded(exitless_guest::BENCH_GUEST),
            initrd: None,
            cmdline: String::new(),
            memory: 64 << 20,
            memory_backing: crate::memory::Backing::default(),
            cpus,
            max_cpus,
            irqchip: IrqchipMode::Kernel,
        };
        VmBuilder::new(crate::kvm::open().unwrap(), spec).unwrap()
    }

    /// The irqchip, PIT and clock of a VM built (its PIT created).
    fn saved_vm() -> kvm::state::VmKvmState {
        let built = builder(1, 1).build(&VcpuOptions::default()).unwrap();
        kvm::state::capture_vm(&built.vm.fd).unwrap()
    }

    /// A vCPU made ahead that the saved state lacks (its vCPUs changed meanwhile) refuses
    /// the restore before any state is set: KVM cannot take a vCPU back.
    #[test]
    fn vcpus_made_ahead_must_all_be_in_the_saved_state() {
        if std::fs::metadata("/dev/kvm").is_err() {
            return crate::test_skip::skip("vcpus_ahead", "/dev/kvm is missing");
        }
        let mut b = builder(2, 3);
        let ahead = b.vcpus_ahead(&[0, 1]).unwrap();
        assert_eq!(ahead.ids(), [0, 1]);
        let vm_state = saved_vm();
        let checked = Cell::new(0);
        let check = |_: &[kvm_cpuid_entry2]| {
            checked.set(checked.get() + 1);
            Ok(())
        };
        let opts = VcpuOptions::default();
        let e = b.build_restored_ahead(ahead, &opts, &vm_state, &[0, 2], &[], &check);
        assert!(matches!(e, Err(BuildError::VcpuNotSaved(1))));
        assert_eq!(checked.get(), 0);
    }

    /// The host is checked against the CPUID read ahead (a refusal refuses the restore), and
    /// a vCPU the state has beyond those made ahead (hot-added) is created at the restore.
    #[test]
    fn the_host_is_checked_and_vcpus_beyond_those_made_ahead_are_created() {
        if std::fs::metadata("/dev/kvm").is_err() {
            return crate::test_skip::skip("vcpus_ahead", "/dev/kvm is missing");
        }
        let mut b = builder(1, 2);
        let ahead = b.vcpus_ahead(&[0]).unwrap();
        let vm_state = saved_vm();
        let seen = Cell::new(0);
        let check = |cpuid: &[kvm_cpuid_entry2]| {
            seen.set(cpuid.len());
            Ok(())
        };
        let opts = VcpuOptions::default();
        let built = b.build_restored_ahead(ahead, &opts, &vm_state, &[0, 1], &[], &check);
        let built = built.unwrap_or_else(|e| panic!("{e}"));
        assert!(seen.get() > 0);
        // Both exist in KVM now: creating either again fails.
        assert!(built.vm.fd.create_vcpu(0).is_err());
        assert!(built.vm.fd.create_vcpu(1).is_err());

        let mut b = builder(1, 1);
        let ahead = b.vcpus_ahead(&[0]).unwrap();
        let vm_state = saved_vm();
        let refuse = |_: &[kvm_cpuid_entry2]| Err(BuildError::NoPvhEntry);
        let e = b.build_restored_ahead(ahead, &opts, &vm_state, &[0], &[], &refuse);
        assert!(matches!(e, Err(BuildError::NoPvhEntry)));
    }
}
