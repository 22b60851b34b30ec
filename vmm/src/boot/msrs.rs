//! Model-specific register values a vCPU starts Linux with. The vCPU code passes them to
//! KVM_SET_MSRS.

use kvm_bindings::kvm_msr_entry;

/// SYSENTER code segment selector.
pub const MSR_IA32_SYSENTER_CS: u32 = 0x174;
/// SYSENTER stack pointer.
pub const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
/// SYSENTER instruction pointer.
pub const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
/// Miscellaneous feature enables.
pub const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
/// MTRR default memory type.
pub const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
/// SYSCALL segment selectors.
pub const MSR_STAR: u32 = 0xc000_0081;
/// 64-bit SYSCALL target.
pub const MSR_LSTAR: u32 = 0xc000_0082;
/// Compatibility-mode SYSCALL target.
pub const MSR_CSTAR: u32 = 0xc000_0083;
/// RFLAGS mask applied on SYSCALL.
pub const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
/// GS base swapped in by SWAPGS.
pub const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;

/// IA32_MISC_ENABLE bit 0: fast string operations.
pub const MISC_ENABLE_FAST_STRING: u64 = 1;
/// MTRRdefType bit 11: MTRRs enabled.
pub const MTRR_ENABLE: u64 = 1 << 11;
/// Memory type 6: write-back.
pub const MTRR_MEM_TYPE_WB: u64 = 6;

fn msr(index: u32, data: u64) -> kvm_msr_entry {
    kvm_msr_entry {
        index,
        data,
        ..Default::default()
    }
}

/// The MSRs to set on every vCPU before booting Linux: SYSENTER/SYSCALL state cleared, fast
/// strings on, MTRRs on with write-back as the default memory type.
pub fn boot_msr_entries() -> Vec<kvm_msr_entry> {
    vec![
        msr(MSR_IA32_SYSENTER_CS, 0),
        msr(MSR_IA32_SYSENTER_ESP, 0),
        msr(MSR_IA32_SYSENTER_EIP, 0),
        msr(MSR_STAR, 0),
        msr(MSR_CSTAR, 0),
        msr(MSR_KERNEL_GS_BASE, 0),
        msr(MSR_SYSCALL_MASK, 0),
        msr(MSR_LSTAR, 0),
        msr(MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
        msr(MSR_MTRR_DEF_TYPE, MTRR_ENABLE | MTRR_MEM_TYPE_WB),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value_of(index: u32) -> Option<u64> {
        boot_msr_entries()
            .iter()
            .find(|e| e.index == index)
            .map(|e| e.data)
    }

    #[test]
    fn syscall_and_sysenter_msrs_are_zero() {
        for index in [0x174, 0x175, 0x176, 0xc000_0081, 0xc000_0082, 0xc000_0083] {
            assert_eq!(value_of(index), Some(0), "{index:#x}");
        }
        assert_eq!(value_of(0xc000_0084), Some(0));
        assert_eq!(value_of(0xc000_0102), Some(0));
    }

    #[test]
    fn fast_strings_and_write_back_mtrr_default() {
        assert_eq!(value_of(0x1a0), Some(1));
        assert_eq!(value_of(0x2ff), Some(0x806));
    }

    #[test]
    fn tsc_is_not_set_and_indices_are_unique() {
        let entries = boot_msr_entries();
        assert!(entries.iter().all(|e| e.index != 0x10));
        let mut indices: Vec<u32> = entries.iter().map(|e| e.index).collect();
        indices.sort_unstable();
        indices.dedup();
        assert_eq!(indices.len(), entries.len());
    }

    #[test]
    fn entries_fit_a_kvm_msrs_wrapper() {
        let msrs = kvm_bindings::Msrs::from_entries(&boot_msr_entries()).unwrap();
        assert_eq!(msrs.as_slice().len(), 10);
    }
}
