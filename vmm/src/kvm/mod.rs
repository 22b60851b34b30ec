//! The KVM layer: opening /dev/kvm, capabilities, memory slots, quirks and binary stats.
//! This is the only module with `unsafe` KVM calls.

mod created_vm;
pub mod dirty_log;
pub mod dirty_ring;
pub mod dirty_tracking;
pub mod kick;
pub mod raw_run;
pub mod ring;
pub mod state;
pub mod stats;
mod supported_cpuid;
pub use created_vm::CreatedVm;
pub use supported_cpuid::SupportedCpuid;

use kvm_bindings::{
    kvm_enable_cap, kvm_userspace_memory_region, KVM_CAP_DISABLE_QUIRKS2, KVM_CAP_SPLIT_IRQCHIP,
    KVM_X86_QUIRK_FIX_HYPERCALL_INSN,
};
use kvm_ioctls::{Cap, Kvm, VmFd};
use serde::Serialize;
use std::io;
use thiserror::Error;
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap};

pub use stats::{StatsFd, StatsSchema, StatsSnapshot};

/// Errors from the KVM layer.
#[derive(Debug, Error)]
pub enum KvmError {
    #[error("/dev/kvm does not exist: this host has no KVM (load kvm_intel/kvm_amd or run on a KVM-capable host)")]
    Missing,
    #[error("Permission denied opening /dev/kvm: run as root or add your user to the 'kvm' group")]
    NoPermission,
    #[error("Cannot open /dev/kvm: {0}")]
    Open(io::Error),
    #[error("KVM API version {0} is not supported (need 12): is this a KVM device?")]
    ApiVersion(i32),
    #[error("Cannot create VM: {0}")]
    CreateVm(kvm_ioctls::Error),
    #[error("Cannot register guest memory: {0}")]
    Memory(kvm_ioctls::Error),
    #[error("KVM lacks {0}")]
    MissingCap(&'static str),
    #[error("KVM ioctl {0} failed: {1}")]
    Ioctl(&'static str, kvm_ioctls::Error),
    #[error("Cannot read KVM stats: {0}")]
    Stats(io::Error),
    #[error("Cannot map the coalesced MMIO ring: {0}")]
    Ring(io::Error),
    #[error("Cannot install the vCPU kick signal handler: {0}")]
    Signal(io::Error),
    #[error("KVM refused {0}")]
    Refused(String),
}

/// Environment variable naming another KVM device node than /dev/kvm (used by tests).
pub const KVM_DEVICE_ENV: &str = "EXITLESS_KVM_DEVICE";

/// Opens /dev/kvm (or `$EXITLESS_KVM_DEVICE`) with errors a user can act on.
pub fn open() -> Result<Kvm, KvmError> {
    let path = std::env::var_os(KVM_DEVICE_ENV).unwrap_or_else(|| "/dev/kvm".into());
    let path = std::ffi::CString::new(path.as_encoded_bytes())
        .map_err(|_| KvmError::Open(io::Error::from(io::ErrorKind::InvalidInput)))?;
    let kvm = Kvm::new_with_path(&path).map_err(|e| match e.errno() {
        libc::ENOENT | libc::ENXIO | libc::ENODEV => KvmError::Missing,
        libc::EACCES | libc::EPERM => KvmError::NoPermission,
        errno => KvmError::Open(io::Error::from_raw_os_error(errno)),
    })?;
    match kvm.get_api_version() {
        12 => Ok(kvm),
        v => Err(KvmError::ApiVersion(v)),
    }
}

/// The KVM capabilities exitless uses or reports.
#[derive(Debug, Clone, Serialize)]
pub struct Capabilities {
    pub sync_regs: u32,
    pub ioeventfd: bool,
    pub ioeventfd_any_length: bool,
    pub coalesced_mmio: bool,
    pub coalesced_pio: bool,
    pub irqchip: bool,
    pub split_irqchip: bool,
    pub immediate_exit: bool,
    pub binary_stats_fd: bool,
    pub disable_quirks2: bool,
    pub x86_disable_exits: u32,
    pub max_vcpus: usize,
}

impl Capabilities {
    pub fn probe(kvm: &Kvm) -> Self {
        let raw = |c: u32| kvm.check_extension_raw(c as libc::c_ulong);
        Capabilities {
            sync_regs: kvm.check_extension_int(Cap::SyncRegs).max(0) as u32,
            ioeventfd: kvm.check_extension(Cap::Ioeventfd),
            ioeventfd_any_length: raw(kvm_bindings::KVM_CAP_IOEVENTFD_ANY_LENGTH) > 0,
            coalesced_mmio: kvm.check_extension(Cap::CoalescedMmio),
            coalesced_pio: raw(kvm_bindings::KVM_CAP_COALESCED_PIO) > 0,
            irqchip: kvm.check_extension(Cap::Irqchip),
            split_irqchip: raw(KVM_CAP_SPLIT_IRQCHIP) > 0,
            immediate_exit: kvm.check_extension(Cap::ImmediateExit),
            binary_stats_fd: raw(kvm_bindings::KVM_CAP_BINARY_STATS_FD) > 0,
            disable_quirks2: raw(KVM_CAP_DISABLE_QUIRKS2) > 0,
            x86_disable_exits: raw(kvm_bindings::KVM_CAP_X86_DISABLE_EXITS).max(0) as u32,
            max_vcpus: kvm.get_max_vcpus(),
        }
    }
}

/// Registers every region of `mem` as a KVM memory slot (slots 0, 1, ...).
pub fn register_memory(vm: &VmFd, mem: &GuestMemoryMmap) -> Result<(), KvmError> {
    for (slot, region) in mem.iter().enumerate() {
        register_region(vm, slot as u32, region)?;
    }
    Ok(())
}

/// Registers `region` as KVM memory slot `slot` (a region added while the VM runs too).
/// The caller keeps the region mapped for as long as the VM lives; `slot` is not in use.
pub fn register_region(vm: &VmFd, slot: u32, region: &GuestRegionMmap) -> Result<(), KvmError> {
    let desc = kvm_userspace_memory_region {
        slot,
        flags: 0,
        guest_phys_addr: region.start_addr().0,
        memory_size: region.len(),
        userspace_addr: region.as_ptr() as u64,
    };
    // SAFETY: the region is a live mmap of `memory_size` bytes that the VM's guest memory
    // holds for as long as the VM runs (regions are never removed); the slot is new.
    unsafe { vm.set_user_memory_region(desc) }.map_err(KvmError::Memory)
}

/// Registers `len` bytes of this process's memory at `host` as KVM memory slot `slot` at
/// guest address `gpa` (a virtio-pmem file's mapping). The caller keeps the range mapped for
/// as long as the VM lives (were it unmapped, KVM would fail the guest's access, not touch
/// freed memory: it maps through this process's page tables); `slot` is not in use.
pub fn register_mapping(
    vm: &VmFd,
    slot: u32,
    gpa: u64,
    len: u64,
    host: *mut u8,
) -> Result<(), KvmError> {
    let desc = kvm_userspace_memory_region {
        slot,
        flags: 0,
        guest_phys_addr: gpa,
        memory_size: len,
        userspace_addr: host as u64,
    };
    // SAFETY: `host` is a live mapping of `len` bytes that the caller keeps for the VM's
    // lifetime; the slot is new and the range overlaps no other slot (the caller's placement).
    unsafe { vm.set_user_memory_region(desc) }.map_err(KvmError::Memory)
}

/// Makes `vmcall`/`vmmcall` in the guest fail with #UD instead of being rewritten and re-run
/// (on PVM the rewrite loops forever). Returns false when KVM cannot disable the quirk.
pub fn disable_hypercall_rewrite(vm: &VmFd) -> bool {
    let mut cap = kvm_enable_cap {
        cap: KVM_CAP_DISABLE_QUIRKS2,
        ..Default::default()
    };
    cap.args[0] = KVM_X86_QUIRK_FIX_HYPERCALL_INSN as u64;
    vm.enable_cap(&cap).is_ok()
}

/// Creates the in-kernel split irqchip (LAPIC in the kernel, IOAPIC/PIC in userspace).
pub fn enable_split_irqchip(vm: &VmFd, ioapic_pins: u64) -> Result<(), KvmError> {
    let mut cap = kvm_enable_cap {
        cap: KVM_CAP_SPLIT_IRQCHIP,
        ..Default::default()
    };
    cap.args[0] = ioapic_pins;
    vm.enable_cap(&cap)
        .map_err(|e| KvmError::Ioctl("KVM_ENABLE_CAP(SPLIT_IRQCHIP)", e))
}

vmm_sys_util::ioctl_iow_nr!(
    KVM_IOEVENTFD,
    kvm_bindings::KVMIO,
    0x79,
    kvm_bindings::kvm_ioeventfd
);

/// Where and how an ioeventfd fires: `len` bytes exactly (0: any length, KVM's "fast MMIO"
/// path for MMIO), optionally only for writes of `datamatch`. kvm-ioctls ties the length to the
/// datamatch type, which cannot express a 4-byte ioeventfd without datamatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoEvent {
    pub pio: bool,
    pub addr: u64,
    pub len: u32,
    pub datamatch: Option<u64>,
}

/// Assigns (or with `assign` false, removes) an ioeventfd. Only the device manager's
/// `IoEvents` calls this, so that one place knows every ioeventfd of the VM (hotplug and BAR
/// moves withdraw them there).
pub(crate) fn ioeventfd(
    vm: &VmFd,
    evt: &vmm_sys_util::eventfd::EventFd,
    event: &IoEvent,
    assign: bool,
) -> Result<(), KvmError> {
    use std::os::fd::AsRawFd;
    let mut flags = 0;
    if event.datamatch.is_some() {
        flags |= 1 << kvm_bindings::kvm_ioeventfd_flag_nr_datamatch;
    }
    if event.pio {
        flags |= 1 << kvm_bindings::kvm_ioeventfd_flag_nr_pio;
    }
    if !assign {
        flags |= 1 << kvm_bindings::kvm_ioeventfd_flag_nr_deassign;
    }
    let req = kvm_bindings::kvm_ioeventfd {
        datamatch: event.datamatch.unwrap_or(0),
        addr: event.addr,
        len: event.len,
        fd: evt.as_raw_fd(),
        flags,
        ..Default::default()
    };
    // SAFETY: `vm` is a VM fd and `req` a fully initialised kvm_ioeventfd that KVM only reads;
    // the return value is checked.
    let ret = unsafe { vmm_sys_util::ioctl::ioctl_with_ref(vm, KVM_IOEVENTFD(), &req) };
    if ret == 0 {
        Ok(())
    } else {
        Err(KvmError::Ioctl("KVM_IOEVENTFD", kvm_ioctls::Error::last()))
    }
}

/// Reads RIP and RAX from the kvm_run sync-regs area (valid when KVM_SYNC_X86_REGS is set).
pub fn sync_rip_rax(fd: &mut kvm_ioctls::VcpuFd) -> (u64, u64) {
    let run = fd.get_kvm_run();
    // SAFETY: on x86 the `s` union of kvm_run holds `kvm_sync_regs`; KVM fills `regs` on every
    // exit when KVM_SYNC_X86_REGS is in kvm_valid_regs, and the plain integers are valid for
    // any bit pattern.
    let regs = unsafe { &run.s.regs.regs };
    (regs.rip, regs.rax)
}

/// Whether /dev/kvm is PVM (module `kvm_pvm`): software nested virtualization that runs guest
/// user code natively but emulates guest kernel code one instruction at a time.
pub fn is_pvm_host() -> bool {
    std::path::Path::new("/sys/module/kvm_pvm").exists()
}
