//! Initial vCPU register state for the boot protocols exitless uses.

use kvm_bindings::kvm_segment;
use kvm_ioctls::VcpuFd;

use super::VcpuError;

fn flat_segment(selector: u16, type_: u8, db: u8, l: u8) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_,
        present: 1,
        dpl: 0,
        db,
        s: 1,
        l,
        g: 1,
        ..Default::default()
    }
}

/// PVH entry: 32-bit flat protected mode, paging off, EBX = hvm_start_info, as the Xen PVH
/// boot ABI requires.
pub fn set_pvh_entry(fd: &VcpuFd, entry: u64, start_info: u64) -> Result<(), VcpuError> {
    let mut sregs = fd
        .get_sregs()
        .map_err(|e| VcpuError::Ioctl("KVM_GET_SREGS", e))?;
    sregs.cs = flat_segment(0x8, 0xb, 1, 0);
    let data = flat_segment(0x10, 0x3, 1, 0);
    (sregs.ds, sregs.es, sregs.fs, sregs.gs, sregs.ss) = (data, data, data, data, data);
    sregs.tr = kvm_segment {
        limit: 0x67,
        type_: 0xb,
        present: 1,
        ..Default::default()
    };
    sregs.cr0 = 0x11; // PE | ET
    sregs.cr3 = 0;
    sregs.cr4 = 0;
    sregs.efer = 0;
    fd.set_sregs(&sregs)
        .map_err(|e| VcpuError::Ioctl("KVM_SET_SREGS", e))?;
    let regs = kvm_bindings::kvm_regs {
        rip: entry,
        rbx: start_info,
        rflags: 0x2,
        ..Default::default()
    };
    fd.set_regs(&regs)
        .map_err(|e| VcpuError::Ioctl("KVM_SET_REGS", e))
}
