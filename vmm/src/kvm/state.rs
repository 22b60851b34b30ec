//! A vCPU's and a VM's KVM state, read for a snapshot and set on restore in the order KVM
//! needs (docs/snapshot.md, "What is saved"). Only the KVM side is here: the snapshot module
//! turns these values into `state.json` and back.
//!
//! Probed on this PVM host (2026-11-28): every ioctl used here works except
//! KVM_GET_NESTED_STATE (EINVAL, and KVM_CAP_NESTED_STATE is 0) and KVM_KVMCLOCK_CTRL (EINVAL
//! until the guest has registered a kvmclock page). Nested state is saved only where KVM has
//! the capability and the guest was offered VMX or SVM: PVM offers neither.

use kvm_bindings::{
    kvm_clock_data, kvm_cpuid_entry2, kvm_debugregs, kvm_irqchip, kvm_lapic_state, kvm_mp_state,
    kvm_msr_entry, kvm_pit_state2, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave,
    CpuId, Msrs, Xsave, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE,
};
use kvm_ioctls::{Cap, Kvm, KvmNestedStateBuffer, VcpuFd, VmFd};
use zerocopy::IntoBytes;

use super::KvmError;

/// Time stamp counter.
pub const MSR_IA32_TSC: u32 = 0x10;
/// TSC deadline of the LAPIC timer: set after the TSC and the LAPIC (its timer mode), or
/// KVM drops it.
pub const MSR_IA32_TSC_DEADLINE: u32 = 0x6e0;
/// MTRRs: not in KVM's index list on every kernel, but a guest reads back what it wrote.
const MTRR_MSRS: [u32; 28] = [
    0x2ff, 0x250, 0x258, 0x259, 0x268, 0x269, 0x26a, 0x26b, 0x26c, 0x26d, 0x26e, 0x26f, 0x200,
    0x201, 0x202, 0x203, 0x204, 0x205, 0x206, 0x207, 0x208, 0x209, 0x20a, 0x20b, 0x20c, 0x20d,
    0x20e, 0x20f,
];
/// Bytes of the legacy XSAVE area (KVM_GET_XSAVE).
pub const XSAVE_LEGACY_SIZE: usize = std::mem::size_of::<kvm_xsave>();
/// CPUID.1:ECX.VMX and CPUID.80000001h:ECX.SVM: a guest offered either may hold nested state.
const LEAF1_ECX_VMX: u32 = 1 << 5;
const EXT_ECX_SVM: u32 = 1 << 2;

/// What capturing a vCPU needs to know about this KVM, asked once per VM.
#[derive(Debug, Clone)]
pub struct StateProbe {
    /// The MSRs to save: KVM's index list and the MTRRs, TSC first, TSC deadline last.
    pub msr_indices: Vec<u32>,
    /// Bytes of KVM_GET_XSAVE2's area (KVM_CAP_XSAVE2), or the legacy 4 KiB.
    pub xsave_size: usize,
    /// KVM can save nested (VMX/SVM) state.
    pub nested: bool,
}

impl StateProbe {
    /// Asks `kvm` and `vm`.
    pub fn new(kvm: &Kvm, vm: &VmFd) -> Result<Self, KvmError> {
        let list = kvm
            .get_msr_index_list()
            .map_err(|e| KvmError::Ioctl("KVM_GET_MSR_INDEX_LIST", e))?;
        let mut indices: Vec<u32> = list.as_slice().to_vec();
        indices.extend(MTRR_MSRS);
        Ok(StateProbe {
            msr_indices: order_msrs(indices),
            xsave_size: xsave_size(vm),
            nested: kvm.check_extension_int(Cap::NestedState) > 0,
        })
    }
}

/// The bytes KVM_GET_XSAVE2 and KVM_SET_XSAVE2 take for `vm` (KVM_CAP_XSAVE2), at least
/// the legacy 4 KiB.
pub fn xsave_size(vm: &VmFd) -> usize {
    (vm.check_extension_int(Cap::Xsave2).max(0) as usize).max(XSAVE_LEGACY_SIZE)
}

/// `indices` without repeats, the TSC first and the TSC deadline last (see
/// [`MSR_IA32_TSC_DEADLINE`]); the rest in KVM's order.
pub fn order_msrs(indices: Vec<u32>) -> Vec<u32> {
    let mut ordered = Vec::with_capacity(indices.len());
    let mut deadline = false;
    for i in indices {
        if i == MSR_IA32_TSC_DEADLINE {
            deadline = true;
        } else if !ordered.contains(&i) {
            ordered.push(i);
        }
    }
    if let Some(at) = ordered.iter().position(|&i| i == MSR_IA32_TSC) {
        ordered.remove(at);
        ordered.insert(0, MSR_IA32_TSC);
    }
    if deadline {
        ordered.push(MSR_IA32_TSC_DEADLINE);
    }
    ordered
}

/// One vCPU's state as KVM holds it.
#[derive(Clone)]
pub struct VcpuKvmState {
    /// The CPUID table the vCPU was given (KVM_GET_CPUID2).
    pub cpuid: Vec<kvm_cpuid_entry2>,
    pub regs: kvm_regs,
    pub sregs: kvm_sregs,
    /// The XSAVE area, [`StateProbe::xsave_size`] bytes (FPU, SSE, AVX... state).
    pub xsave: Vec<u8>,
    pub xcrs: kvm_xcrs,
    pub debugregs: kvm_debugregs,
    pub lapic: kvm_lapic_state,
    /// The MSRs KVM could read, in [`StateProbe::msr_indices`] order.
    pub msrs: Vec<kvm_msr_entry>,
    pub mp_state: kvm_mp_state,
    /// Pending exceptions, interrupts, NMIs, SMIs and the interrupt shadow.
    pub events: kvm_vcpu_events,
    /// The guest TSC's frequency in kHz, where KVM says.
    pub tsc_khz: Option<u32>,
    /// Nested virtualization state (only for a guest offered VMX or SVM, where KVM saves it).
    pub nested: Option<KvmNestedStateBuffer>,
}

fn ioctl(name: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> KvmError {
    move |e| KvmError::Ioctl(name, e)
}

/// Whether `cpuid` offers VMX or SVM.
pub fn offers_nested(cpuid: &[kvm_cpuid_entry2]) -> bool {
    cpuid.iter().any(|e| {
        (e.function == 1 && e.ecx & LEAF1_ECX_VMX != 0)
            || (e.function == 0x8000_0001 && e.ecx & EXT_ECX_SVM != 0)
    })
}

/// Reads vCPU `fd`'s state. Call on a parked vCPU whose pending I/O is complete (KVM_RUN
/// with `immediate_exit` set since its last exit), from the thread that runs it.
pub fn capture_vcpu(fd: &VcpuFd, probe: &StateProbe) -> Result<VcpuKvmState, KvmError> {
    let cpuid = fd
        .get_cpuid2(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
        .map_err(ioctl("KVM_GET_CPUID2"))?
        .as_slice()
        .to_vec();
    let nested = match probe.nested && offers_nested(&cpuid) {
        true => capture_nested(fd)?,
        false => None,
    };
    Ok(VcpuKvmState {
        regs: fd.get_regs().map_err(ioctl("KVM_GET_REGS"))?,
        sregs: fd.get_sregs().map_err(ioctl("KVM_GET_SREGS"))?,
        xsave: capture_xsave(fd, probe.xsave_size)?,
        xcrs: fd.get_xcrs().map_err(ioctl("KVM_GET_XCRS"))?,
        debugregs: fd.get_debug_regs().map_err(ioctl("KVM_GET_DEBUGREGS"))?,
        lapic: fd.get_lapic().map_err(ioctl("KVM_GET_LAPIC"))?,
        msrs: capture_msrs(fd, &probe.msr_indices)?,
        mp_state: fd.get_mp_state().map_err(ioctl("KVM_GET_MP_STATE"))?,
        events: fd.get_vcpu_events().map_err(ioctl("KVM_GET_VCPU_EVENTS"))?,
        tsc_khz: fd.get_tsc_khz().ok(),
        nested,
        cpuid,
    })
}

fn capture_nested(fd: &VcpuFd) -> Result<Option<KvmNestedStateBuffer>, KvmError> {
    let mut buffer = KvmNestedStateBuffer::empty();
    let size = fd
        .nested_state(&mut buffer)
        .map_err(ioctl("KVM_GET_NESTED_STATE"))?;
    Ok(size.map(|_| buffer))
}

/// The XSAVE area: KVM_GET_XSAVE2 with the size KVM reports, or KVM_GET_XSAVE.
fn capture_xsave(fd: &VcpuFd, size: usize) -> Result<Vec<u8>, KvmError> {
    if size <= XSAVE_LEGACY_SIZE {
        let x = fd.get_xsave().map_err(ioctl("KVM_GET_XSAVE"))?;
        return Ok(x.region.as_bytes().to_vec());
    }
    let mut x = xsave_buffer(size)?;
    // SAFETY: `x` holds `size` bytes, the size KVM_CAP_XSAVE2 reported for this VM.
    unsafe { fd.get_xsave2(&mut x) }.map_err(ioctl("KVM_GET_XSAVE2"))?;
    let mut bytes = x.as_fam_struct_ref().xsave.region.as_bytes().to_vec();
    bytes.extend_from_slice(x.as_slice().as_bytes());
    bytes.truncate(size);
    Ok(bytes)
}

fn xsave_buffer(size: usize) -> Result<Xsave, KvmError> {
    let words = (size - XSAVE_LEGACY_SIZE).div_ceil(4);
    Xsave::new(words).map_err(|_| KvmError::MissingCap("an XSAVE area of that size"))
}

/// The MSRs of `indices` KVM can read: KVM_GET_MSRS stops at the first it cannot, which is
/// left out, and the rest are asked again.
fn capture_msrs(fd: &VcpuFd, indices: &[u32]) -> Result<Vec<kvm_msr_entry>, KvmError> {
    let mut read = Vec::with_capacity(indices.len());
    let mut rest = indices;
    while !rest.is_empty() {
        let entries: Vec<kvm_msr_entry> = rest
            .iter()
            .map(|&index| kvm_msr_entry {
                index,
                ..Default::default()
            })
            .collect();
        let mut msrs = Msrs::from_entries(&entries)
            .map_err(|_| KvmError::MissingCap("room for that many MSRs"))?;
        let n = fd.get_msrs(&mut msrs).map_err(ioctl("KVM_GET_MSRS"))?;
        read.extend_from_slice(&msrs.as_slice()[..n.min(rest.len())]);
        rest = rest.get(n + 1..).unwrap_or(&[]);
    }
    Ok(read)
}

/// Why a vCPU's saved state could not be set: the ioctl, or an MSR KVM refused.
fn msr_refused(index: u32) -> KvmError {
    KvmError::Refused(format!(
        "MSR {index:#x} (KVM_SET_MSRS took the ones before it)"
    ))
}

/// Sets a vCPU's saved state on `fd` (a new vCPU of a new VM): CPUID first, then the
/// registers, the XSAVE area, XCRs and debug registers, the LAPIC after the special
/// registers (its base is in them), the MSRs after the LAPIC (the TSC deadline needs its timer
/// mode), the multiprocessing state, and the pending events last.
/// `xsave_size` is the new VM's [`xsave_size`]: a larger saved area is refused (this host
/// lacks state components the guest used), a smaller one is padded (components in their
/// initial state).
pub fn restore_vcpu(fd: &VcpuFd, s: &VcpuKvmState, xsave_size: usize) -> Result<(), KvmError> {
    let cpuid = CpuId::from_entries(&s.cpuid)
        .map_err(|_| KvmError::Refused("a CPUID table of that many entries".into()))?;
    fd.set_cpuid2(&cpuid).map_err(ioctl("KVM_SET_CPUID2"))?;
    if let Some(khz) = s.tsc_khz {
        set_tsc_khz(fd, khz)?;
    }
    fd.set_sregs(&s.sregs).map_err(ioctl("KVM_SET_SREGS"))?;
    fd.set_regs(&s.regs).map_err(ioctl("KVM_SET_REGS"))?;
    restore_xsave(fd, &s.xsave, xsave_size)?;
    fd.set_xcrs(&s.xcrs).map_err(ioctl("KVM_SET_XCRS"))?;
    fd.set_debug_regs(&s.debugregs)
        .map_err(ioctl("KVM_SET_DEBUGREGS"))?;
    fd.set_lapic(&s.lapic).map_err(ioctl("KVM_SET_LAPIC"))?;
    restore_msrs(fd, &s.msrs)?;
    if let Some(nested) = &s.nested {
        fd.set_nested_state(nested)
            .map_err(ioctl("KVM_SET_NESTED_STATE"))?;
    }
    fd.set_mp_state(s.mp_state)
        .map_err(ioctl("KVM_SET_MP_STATE"))?;
    fd.set_vcpu_events(&s.events)
        .map_err(ioctl("KVM_SET_VCPU_EVENTS"))
}

/// The guest's TSC runs at the saved frequency: unchanged when this host's is the same,
/// scaled where KVM can (KVM_CAP_TSC_CONTROL), else refused (the guest's clock would drift).
fn set_tsc_khz(fd: &VcpuFd, khz: u32) -> Result<(), KvmError> {
    match fd.get_tsc_khz() {
        Ok(now) if now == khz => Ok(()),
        now => fd.set_tsc_khz(khz).map_err(|_| {
            let here = now.map_or("unknown".to_string(), |k| format!("{k} kHz"));
            KvmError::Refused(format!(
                "the guest's TSC frequency ({khz} kHz): this host's is {here} and its KVM \
                 cannot scale it"
            ))
        }),
    }
}

fn restore_xsave(fd: &VcpuFd, bytes: &[u8], size: usize) -> Result<(), KvmError> {
    if bytes.len() > size {
        return Err(KvmError::Refused(format!(
            "an XSAVE area of {} bytes (this host's holds {size})",
            bytes.len()
        )));
    }
    if size <= XSAVE_LEGACY_SIZE {
        let mut x = kvm_xsave::default();
        x.region.as_mut_bytes()[..bytes.len()].copy_from_slice(bytes);
        // SAFETY: `x` is a whole legacy kvm_xsave, and KVM reads no more than 4 KiB of it:
        // `size`, this VM's KVM_CAP_XSAVE2, is 4 KiB.
        return unsafe { fd.set_xsave(&x) }.map_err(ioctl("KVM_SET_XSAVE"));
    }
    let mut x = xsave_buffer(size)?;
    let (region, extra) = bytes.split_at(bytes.len().min(XSAVE_LEGACY_SIZE));
    // SAFETY: only plain integers are written, within the buffer's own length.
    unsafe { x.as_mut_fam_struct() }.xsave.region.as_mut_bytes()[..region.len()]
        .copy_from_slice(region);
    x.as_mut_slice().as_mut_bytes()[..extra.len()].copy_from_slice(extra);
    // SAFETY: `x` holds `size` bytes, this VM's KVM_CAP_XSAVE2 size, all KVM reads.
    unsafe { fd.set_xsave2(&x) }.map_err(ioctl("KVM_SET_XSAVE2"))
}

fn restore_msrs(fd: &VcpuFd, msrs: &[kvm_msr_entry]) -> Result<(), KvmError> {
    let list = Msrs::from_entries(msrs)
        .map_err(|_| KvmError::Refused(format!("{} MSRs at once", msrs.len())))?;
    let set = fd.set_msrs(&list).map_err(ioctl("KVM_SET_MSRS"))?;
    match msrs.get(set) {
        Some(refused) => Err(msr_refused(refused.index)),
        None => Ok(()),
    }
}

/// The in-kernel irqchip (both PICs, the I/O APIC), the PIT and the KVM clock.
#[derive(Clone)]
pub struct VmKvmState {
    pub pic_master: kvm_irqchip,
    pub pic_slave: kvm_irqchip,
    pub ioapic: kvm_irqchip,
    pub pit: kvm_pit_state2,
    pub clock: kvm_clock_data,
}

fn get_chip(vm: &VmFd, chip_id: u32) -> Result<kvm_irqchip, KvmError> {
    let mut chip = kvm_irqchip {
        chip_id,
        ..Default::default()
    };
    vm.get_irqchip(&mut chip)
        .map_err(ioctl("KVM_GET_IRQCHIP"))?;
    Ok(chip)
}

/// Reads the VM's irqchip, PIT and clock (its vCPUs parked).
pub fn capture_vm(vm: &VmFd) -> Result<VmKvmState, KvmError> {
    Ok(VmKvmState {
        pic_master: get_chip(vm, KVM_IRQCHIP_PIC_MASTER)?,
        pic_slave: get_chip(vm, KVM_IRQCHIP_PIC_SLAVE)?,
        ioapic: get_chip(vm, KVM_IRQCHIP_IOAPIC)?,
        pit: vm.get_pit2().map_err(ioctl("KVM_GET_PIT2"))?,
        clock: vm.get_clock().map_err(ioctl("KVM_GET_CLOCK"))?,
    })
}

/// Sets saved irqchip, PIT and clock state on a new VM (made with the in-kernel irqchip and
/// PIT). The clock continues from its saved value: guest time does not jump over the time
/// the snapshot sat on disk.
pub fn restore_vm(vm: &VmFd, s: &VmKvmState) -> Result<(), KvmError> {
    for chip in [&s.pic_master, &s.pic_slave, &s.ioapic] {
        vm.set_irqchip(chip).map_err(ioctl("KVM_SET_IRQCHIP"))?;
    }
    vm.set_pit2(&s.pit).map_err(ioctl("KVM_SET_PIT2"))?;
    // Only the value: the flags KVM_GET_CLOCK returns (host TSC, realtime) ask KVM to
    // correct for time that passed, which a restore does not want.
    let clock = kvm_clock_data {
        clock: s.clock.clock,
        ..Default::default()
    };
    vm.set_clock(&clock).map_err(ioctl("KVM_SET_CLOCK"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A VM with the in-kernel irqchip and PIT, and its vCPU 0 given KVM's CPUID.
    fn vm_and_vcpu(kvm: &Kvm) -> (VmFd, VcpuFd) {
        let vm = kvm.create_vm().unwrap();
        vm.create_irq_chip().unwrap();
        let pit = kvm_bindings::kvm_pit_config::default();
        vm.create_pit2(pit).unwrap();
        let vcpu = vm.create_vcpu(0).unwrap();
        let cpuid = kvm
            .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
            .unwrap();
        vcpu.set_cpuid2(&cpuid).unwrap();
        (vm, vcpu)
    }

    #[test]
    fn a_vcpu_and_its_vm_carry_over_to_a_new_vm() {
        let Ok(kvm) = Kvm::new() else {
            crate::test_skip::skip("a_vcpu_and_its_vm_carry_over", "/dev/kvm is missing");
            return;
        };
        let (vm, vcpu) = vm_and_vcpu(&kvm);
        let mut regs = vcpu.get_regs().unwrap();
        (regs.rip, regs.rax, regs.rflags) = (0x1234, 42, 0x202);
        vcpu.set_regs(&regs).unwrap();
        let mut sregs = vcpu.get_sregs().unwrap();
        sregs.cr3 = 0x9000;
        vcpu.set_sregs(&sregs).unwrap();
        let sysenter = kvm_msr_entry {
            index: 0x174,
            data: 0x10,
            ..Default::default()
        };
        vcpu.set_msrs(&Msrs::from_entries(&[sysenter]).unwrap())
            .unwrap();
        let probe = StateProbe::new(&kvm, &vm).unwrap();
        assert_eq!(probe.msr_indices.first(), Some(&MSR_IA32_TSC));
        let saved = capture_vcpu(&vcpu, &probe).unwrap();
        let saved_vm = capture_vm(&vm).unwrap();
        assert_eq!(saved.xsave.len(), probe.xsave_size);
        let msr = |s: &VcpuKvmState, i| s.msrs.iter().find(|m| m.index == i).map(|m| m.data);
        assert_eq!(msr(&saved, 0x174), Some(0x10));
        assert!(msr(&saved, MSR_IA32_TSC).is_some(), "the TSC is saved");

        let (vm2, vcpu2) = vm_and_vcpu(&kvm);
        restore_vm(&vm2, &saved_vm).unwrap();
        restore_vcpu(&vcpu2, &saved, xsave_size(&vm2)).unwrap();
        let again = capture_vcpu(&vcpu2, &StateProbe::new(&kvm, &vm2).unwrap()).unwrap();
        assert_eq!((again.regs.rip, again.regs.rax), (0x1234, 42));
        assert_eq!(again.sregs.cr3, 0x9000);
        assert_eq!(msr(&again, 0x174), Some(0x10));
        assert_eq!(again.lapic.regs, saved.lapic.regs);
        assert_eq!(again.xsave, saved.xsave);
        assert_eq!(again.cpuid.len(), saved.cpuid.len());
        let chip = capture_vm(&vm2).unwrap();
        assert_eq!(chip.ioapic.as_bytes(), saved_vm.ioapic.as_bytes());
        // A larger XSAVE area than this VM holds is refused, not read past.
        let mut big = saved.clone();
        big.xsave.resize(xsave_size(&vm2) + 64, 0);
        let e = restore_vcpu(&vcpu2, &big, xsave_size(&vm2)).unwrap_err();
        assert!(e.to_string().contains("an XSAVE area of"), "{e}");
        // An MSR KVM refuses is named.
        let mut odd = saved;
        odd.msrs.push(kvm_msr_entry {
            index: 0xdead_0000,
            ..Default::default()
        });
        let e = restore_vcpu(&vcpu2, &odd, xsave_size(&vm2)).unwrap_err();
        assert!(e.to_string().contains("MSR 0xdead0000"), "{e}");
    }

    #[test]
    fn the_tsc_comes_first_and_its_deadline_last() {
        let got = order_msrs(vec![0x174, 0x6e0, 0x10, 0x174, 0x4b56_4d01]);
        assert_eq!(got, vec![0x10, 0x174, 0x4b56_4d01, 0x6e0]);
        assert_eq!(order_msrs(vec![0x174]), vec![0x174]);
    }

    #[test]
    fn nested_state_is_wanted_only_for_vmx_or_svm() {
        let mut e = kvm_cpuid_entry2 {
            function: 1,
            ..Default::default()
        };
        assert!(!offers_nested(&[e]));
        e.ecx = LEAF1_ECX_VMX;
        assert!(offers_nested(&[e]));
        let svm = kvm_cpuid_entry2 {
            function: 0x8000_0001,
            ecx: EXT_ECX_SVM,
            ..Default::default()
        };
        assert!(offers_nested(&[svm]));
    }
}
