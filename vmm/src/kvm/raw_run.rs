//! KVM_RUN as one `syscall` instruction, its exit read straight from kvm_run: what the floor
//! VMM does (`lab/floor/floor.c`), in place of kvm-ioctls' `VcpuFd::run` (libc's `ioctl`
//! wrapper, `__syscall_ret` and errno, then its match over every exit reason). Its use is
//! where the code sits: inlined into the vCPU loop, the exit path's section
//! (exitless/build.rs), it adds no page of code or data far from the loop to an exit, where
//! `VcpuFd::run`, `ioctl` and `__syscall_ret` are three pages wherever the link puts them. The
//! exit-path ablation measures the two side by side (`exitless bench --ablation`).
//!
//! Port and MMIO accesses are read inline; every other exit (rare by nature: the VM's end, a
//! halt without an in-kernel irqchip, an exit exitless does not handle) in a cold function
//! that gives the same `VcpuExit` kvm-ioctls' `VcpuFd::run` gives.

use std::os::fd::AsRawFd;

use kvm_bindings::*;
use kvm_ioctls::{HypercallExit, MsrExitReason, ReadMsrExit, VcpuExit, VcpuFd, WriteMsrExit};

/// `_IO(KVMIO, 0x80)`.
const KVM_RUN: u64 = 0xae80;

/// Runs the vCPU once, as `VcpuFd::run` does (the same `VcpuExit` for the same exit, `Err` with
/// KVM_RUN's errno: EINTR after a kick).
#[inline(always)]
pub fn run(fd: &mut VcpuFd) -> Result<VcpuExit<'_>, kvm_ioctls::Error> {
    let raw = fd.as_raw_fd();
    let ret: i64;
    // SAFETY: ioctl(fd, KVM_RUN, 0) on this vCPU's own fd, which `fd` keeps open: the kernel
    // reads and writes only the vCPU's kvm_run mapping (owned by `fd`, borrowed mutably here)
    // and the registers the syscall ABI names (rax, rcx, r11 clobbered); no stack, no other
    // memory of this process.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") libc::SYS_ioctl => ret,
            in("rdi") raw,
            in("rsi") KVM_RUN,
            in("rdx") 0u64,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    let run = fd.get_kvm_run();
    if ret < 0 {
        let errno = i32::try_from(-ret).unwrap_or(libc::EIO);
        return memory_fault(run, errno);
    }
    match run.exit_reason {
        KVM_EXIT_IO => io(run),
        KVM_EXIT_MMIO => Ok(mmio(run)),
        _ => other(run),
    }
}

/// A port access: its data is `size * count` bytes at `data_offset` in the kvm_run mapping.
#[inline(always)]
fn io(run: &mut kvm_run) -> Result<VcpuExit<'_>, kvm_ioctls::Error> {
    // SAFETY: the exit reason says `io` is the union's live field (plain integers).
    let io = unsafe { run.__bindgen_anon_1.io };
    let len = usize::from(io.size) * io.count as usize;
    let start = std::ptr::from_mut(run).cast::<u8>();
    // SAFETY: KVM puts the access's `size * count` bytes at `data_offset` inside the vCPU's
    // kvm_run mapping (the page after the structure; KVM bounds string I/O to it), mapped for as
    // long as the VcpuFd whose kvm_run `run` borrows; the slice lives no longer than that
    // borrow. kvm-ioctls' `VcpuFd::run` makes the same slice.
    let data = unsafe { std::slice::from_raw_parts_mut(start.add(io.data_offset as usize), len) };
    match u32::from(io.direction) {
        KVM_EXIT_IO_OUT => Ok(VcpuExit::IoOut(io.port, data)),
        KVM_EXIT_IO_IN => Ok(VcpuExit::IoIn(io.port, data)),
        _ => Err(kvm_ioctls::Error::new(libc::EINVAL)),
    }
}

/// An MMIO access: up to 8 bytes inside kvm_run itself.
#[inline(always)]
fn mmio(run: &mut kvm_run) -> VcpuExit<'_> {
    // SAFETY: the exit reason says `mmio` is the union's live field (plain integers).
    let mmio = unsafe { &mut run.__bindgen_anon_1.mmio };
    let len = (mmio.len as usize).min(mmio.data.len());
    let (addr, data) = (mmio.phys_addr, &mut mmio.data[..len]);
    match mmio.is_write {
        0 => VcpuExit::MmioRead(addr, data),
        _ => VcpuExit::MmioWrite(addr, data),
    }
}

/// KVM_RUN failed: with EFAULT or EHWPOISON and KVM_EXIT_MEMORY_FAULT, the one exit KVM
/// reports with an error; else the error.
#[cold]
fn memory_fault(run: &mut kvm_run, errno: i32) -> Result<VcpuExit<'_>, kvm_ioctls::Error> {
    let fault_errno = errno == libc::EFAULT || errno == libc::EHWPOISON;
    if !fault_errno || run.exit_reason != KVM_EXIT_MEMORY_FAULT {
        return Err(kvm_ioctls::Error::new(errno));
    }
    // SAFETY: the exit reason says `memory_fault` is the union's live field (plain integers).
    let fault = unsafe { run.__bindgen_anon_1.memory_fault };
    Ok(VcpuExit::MemoryFault {
        flags: fault.flags,
        gpa: fault.gpa,
        size: fault.size,
    })
}

/// Every exit but a port or MMIO access, as kvm-ioctls reads it.
#[cold]
#[inline(never)]
fn other(run: &mut kvm_run) -> Result<VcpuExit<'_>, kvm_ioctls::Error> {
    let reason = run.exit_reason;
    let exit = match reason {
        KVM_EXIT_UNKNOWN => VcpuExit::Unknown,
        KVM_EXIT_EXCEPTION => VcpuExit::Exception,
        KVM_EXIT_HLT => VcpuExit::Hlt,
        KVM_EXIT_IRQ_WINDOW_OPEN => VcpuExit::IrqWindowOpen,
        KVM_EXIT_SHUTDOWN => VcpuExit::Shutdown,
        KVM_EXIT_INTR => VcpuExit::Intr,
        KVM_EXIT_SET_TPR => VcpuExit::SetTpr,
        KVM_EXIT_TPR_ACCESS => VcpuExit::TprAccess,
        KVM_EXIT_NMI => VcpuExit::Nmi,
        KVM_EXIT_INTERNAL_ERROR => VcpuExit::InternalError,
        KVM_EXIT_HYPERV => VcpuExit::Hyperv,
        _ => return Ok(with_payload(run)),
    };
    Ok(exit)
}

/// The exits that carry data in kvm_run's union (each arm reads the field its reason names).
#[cold]
fn with_payload(run: &mut kvm_run) -> VcpuExit<'_> {
    let reason = run.exit_reason;
    let union = &mut run.__bindgen_anon_1;
    // Each union read below: the exit reason, checked by the arm, says which field of the
    // union KVM filled; all are plain integers, valid for any bit pattern.
    match reason {
        KVM_EXIT_FAIL_ENTRY => {
            // SAFETY: see above (`fail_entry`).
            let f = unsafe { union.fail_entry };
            VcpuExit::FailEntry(f.hardware_entry_failure_reason, f.cpu)
        }
        KVM_EXIT_SYSTEM_EVENT => {
            // SAFETY: see above (`system_event`, its `data` as kvm-ioctls reads it).
            let (type_, ndata, data) = unsafe {
                let event = &union.system_event;
                (event.type_, event.ndata, &event.__bindgen_anon_1.data)
            };
            VcpuExit::SystemEvent(type_, &data[..(ndata as usize).min(data.len())])
        }
        // SAFETY: see above (`eoi`).
        KVM_EXIT_IOAPIC_EOI => VcpuExit::IoapicEoi(unsafe { union.eoi.vector }),
        // SAFETY: see above (`debug`).
        KVM_EXIT_DEBUG => VcpuExit::Debug(unsafe { union.debug.arch }),
        KVM_EXIT_HYPERCALL => {
            // SAFETY: see above (`hypercall`, its `longmode` as kvm-ioctls reads it).
            let (h, longmode) = unsafe {
                let h = &mut union.hypercall;
                let longmode = h.__bindgen_anon_1.longmode;
                (h, longmode)
            };
            VcpuExit::Hypercall(HypercallExit {
                nr: h.nr,
                args: h.args,
                ret: &mut h.ret,
                longmode,
            })
        }
        KVM_EXIT_X86_RDMSR => {
            // SAFETY: see above (`msr`).
            let msr = unsafe { &mut union.msr };
            VcpuExit::X86Rdmsr(ReadMsrExit {
                error: &mut msr.error,
                reason: MsrExitReason::from_bits_truncate(msr.reason),
                index: msr.index,
                data: &mut msr.data,
            })
        }
        KVM_EXIT_X86_WRMSR => {
            // SAFETY: see above (`msr`).
            let msr = unsafe { &mut union.msr };
            VcpuExit::X86Wrmsr(WriteMsrExit {
                error: &mut msr.error,
                reason: MsrExitReason::from_bits_truncate(msr.reason),
                index: msr.index,
                data: msr.data,
            })
        }
        other => VcpuExit::Unsupported(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh() -> Box<kvm_run> {
        // SAFETY: kvm_run is plain data (integers and unions of them): all zeroes is valid.
        Box::new(unsafe { std::mem::zeroed() })
    }

    #[test]
    fn mmio_accesses_are_read_from_kvm_run_with_their_length_bounded() {
        let mut run = fresh();
        run.exit_reason = KVM_EXIT_MMIO;
        run.__bindgen_anon_1.mmio = kvm_run__bindgen_ty_1__bindgen_ty_6 {
            phys_addr: 0xd000_0010,
            data: [7; 8],
            len: 4,
            is_write: 1,
        };
        assert!(matches!(mmio(&mut run), VcpuExit::MmioWrite(0xd000_0010, d) if d == [7; 4]));
        (
            run.__bindgen_anon_1.mmio.len,
            run.__bindgen_anon_1.mmio.is_write,
        ) = (99, 0);
        assert!(matches!(mmio(&mut run), VcpuExit::MmioRead(_, d) if d.len() == 8));
    }

    #[test]
    fn the_rare_exits_read_as_kvm_ioctls_reads_them() {
        let mut run = fresh();
        for (reason, name) in [
            (KVM_EXIT_HLT, "Hlt"),
            (KVM_EXIT_SHUTDOWN, "Shutdown"),
            (KVM_EXIT_IRQ_WINDOW_OPEN, "IrqWindowOpen"),
            (KVM_EXIT_INTERNAL_ERROR, "InternalError"),
            (KVM_EXIT_EXCEPTION, "Exception"),
        ] {
            run.exit_reason = reason;
            let exit = other(&mut run).unwrap();
            assert!(format!("{exit:?}").starts_with(name), "{exit:?}");
        }
        run.exit_reason = KVM_EXIT_SYSTEM_EVENT;
        run.__bindgen_anon_1.system_event.type_ = KVM_SYSTEM_EVENT_RESET;
        run.__bindgen_anon_1.system_event.ndata = 1000;
        let exit = other(&mut run).unwrap();
        assert!(matches!(exit, VcpuExit::SystemEvent(KVM_SYSTEM_EVENT_RESET, d) if d.len() == 16));
        run.exit_reason = KVM_EXIT_IOAPIC_EOI;
        run.__bindgen_anon_1.eoi.vector = 0x30;
        assert!(matches!(other(&mut run), Ok(VcpuExit::IoapicEoi(0x30))));
        run.exit_reason = 4242;
        assert!(matches!(other(&mut run), Ok(VcpuExit::Unsupported(4242))));
    }

    #[test]
    fn an_error_is_an_error_but_for_a_memory_fault() {
        let mut run = fresh();
        run.exit_reason = KVM_EXIT_MEMORY_FAULT;
        assert!(matches!(
            memory_fault(&mut run, libc::EFAULT),
            Ok(VcpuExit::MemoryFault { .. })
        ));
        let e = memory_fault(&mut run, libc::EINTR).unwrap_err();
        assert_eq!(e.errno(), libc::EINTR);
        run.exit_reason = KVM_EXIT_IO;
        assert!(memory_fault(&mut run, libc::EFAULT).is_err());
    }
}
