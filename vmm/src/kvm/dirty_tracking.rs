//! How a VM tracks the pages its vCPUs write, for migration: KVM's dirty ring where KVM
//! offers it (`kvm/dirty_ring.rs`), else the bitmap with manual protect (`kvm/dirty_log.rs`);
//! `--dirty-log bitmap|ring|auto` chooses ([`prefer`], default auto). Chosen when the VM is
//! created (the ring must be on before any vCPU); nothing is logged, mapped or allocated until
//! a migration starts tracking.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::str::FromStr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use kvm_ioctls::{Kvm, VmFd};
use thiserror::Error;
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use super::dirty_log::{self, Protect};
use super::dirty_ring::{self, Marks, VcpuRing};
use super::KvmError;

/// Memory slots the ring's marks have room for (KVM's slots 0, 1, ...: the boot regions and
/// those hot-added).
const MAX_SLOTS: usize = 256;

/// A `--dirty-log` value that is not one.
#[derive(Debug, Error)]
#[error("'{0}' is no dirty log mode: expected auto, ring or bitmap")]
pub struct ModeError(String);

/// How dirty pages are tracked, as asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirtyLogMode {
    /// The ring where KVM offers it, else the bitmap.
    #[default]
    Auto,
    /// KVM's dirty ring; a VM cannot be made without it.
    Ring,
    /// The bitmap (with manual protect where offered).
    Bitmap,
}

impl FromStr for DirtyLogMode {
    type Err = ModeError;

    fn from_str(s: &str) -> Result<Self, ModeError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "ring" => Ok(Self::Ring),
            "bitmap" => Ok(Self::Bitmap),
            _ => Err(ModeError(s.to_string())),
        }
    }
}

static PREFERRED: AtomicU8 = AtomicU8::new(0);

/// Sets how the VMs this process makes from now on track dirty pages (`--dirty-log`).
pub fn prefer(mode: DirtyLogMode) {
    PREFERRED.store(mode as u8, Ordering::Relaxed);
}

/// What [`prefer`] set (auto unless said).
pub fn preferred() -> DirtyLogMode {
    match PREFERRED.load(Ordering::Relaxed) {
        1 => DirtyLogMode::Ring,
        2 => DirtyLogMode::Bitmap,
        _ => DirtyLogMode::Auto,
    }
}

/// A VM's dirty tracking: the rings of its vCPUs, or the bitmap's protect mode.
pub struct DirtyTracking {
    /// Entries per vCPU ring, when the ring is on.
    ring_entries: Option<u32>,
    /// What was asked for when the VM was made (a head start's VM made before the command
    /// line was read is replaced when it does not match).
    asked: DirtyLogMode,
    rings: Mutex<Vec<Arc<VcpuRing>>>,
    /// Made when tracking first starts (nothing allocated before).
    marks: OnceLock<Marks>,
    protect: Protect,
}

impl DirtyTracking {
    /// Sets `vm` (no vCPU yet) up as [`preferred`] says.
    pub fn set_up(kvm: &Kvm, vm: &VmFd) -> Result<Self, KvmError> {
        let asked = preferred();
        let ring_entries = match (asked, dirty_ring::offered(kvm)) {
            (DirtyLogMode::Bitmap, _) => None,
            (DirtyLogMode::Ring, None) => {
                return Err(KvmError::MissingCap(
                    "KVM_CAP_DIRTY_LOG_RING, which --dirty-log ring needs: use auto or bitmap",
                ))
            }
            (_, Some(cap)) => Some(dirty_ring::enable(kvm, vm, cap)?),
            (DirtyLogMode::Auto, None) => None,
        };
        Ok(DirtyTracking {
            ring_entries,
            asked,
            rings: Mutex::new(Vec::new()),
            marks: OnceLock::new(),
            protect: Protect::default(),
        })
    }

    /// Whether this VM was set up as [`preferred`] says now.
    pub fn as_preferred(&self) -> bool {
        self.asked == preferred()
    }

    /// The way in use, as logs and the bench name it.
    pub fn kind(&self) -> &'static str {
        match (self.ring_entries, self.protect.manual()) {
            (Some(_), _) => "ring",
            (None, Some(_)) => "bitmap (manual protect)",
            (None, None) => "bitmap",
        }
    }

    /// The ring of vCPU fd `fd` of VM `vm`, when the ring is on: the vCPU harvests it on
    /// `KVM_EXIT_DIRTY_RING_FULL` ([`OwnRing`]), the migration on each pass.
    pub fn vcpu_ring(
        self: &Arc<Self>,
        vm: &Arc<VmFd>,
        fd: &impl AsRawFd,
    ) -> Result<Option<OwnRing>, KvmError> {
        let Some(entries) = self.ring_entries else {
            return Ok(None);
        };
        // SAFETY: the vCPU's fd is open for the whole call (the caller holds its owner).
        let fd = unsafe { BorrowedFd::borrow_raw(fd.as_raw_fd()) };
        let fd: OwnedFd = fd.try_clone_to_owned().map_err(KvmError::Ring)?;
        let ring = Arc::new(VcpuRing::new(fd, entries));
        self.rings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ring.clone());
        Ok(Some(OwnRing {
            ring,
            tracking: self.clone(),
            vm: vm.clone(),
        }))
    }

    /// Readies tracking of `mem` before its slots log: maps the rings and makes the marks,
    /// or turns the bitmap's manual protect on.
    pub fn start(&self, kvm: &Kvm, vm: &VmFd, mem: &GuestMemoryMmap) -> Result<(), KvmError> {
        if self.ring_entries.is_none() {
            dirty_log::enable_manual_protect(kvm, vm, &self.protect);
            return Ok(());
        }
        for (slot, r) in (0u32..).zip(mem.iter()) {
            if !self
                .marks()
                .prepare(slot, r.len().div_ceil(dirty_log::PAGE))
            {
                return Err(KvmError::Refused(format!(
                    "dirty ring: memory slot {slot} beyond the {MAX_SLOTS} tracked"
                )));
            }
        }
        for ring in self.rings.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            ring.map()?;
        }
        Ok(())
    }

    /// Harvests every vCPU's ring and hands the entries back to KVM (the ring only; the
    /// bitmap is read per slot by [`DirtyTracking::take`]).
    pub fn harvest(&self, vm: &VmFd) -> Result<(), KvmError> {
        if self.ring_entries.is_none() {
            return Ok(());
        }
        let rings = self.rings.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for ring in rings {
            ring.harvest(self.marks())?;
        }
        dirty_ring::reset(vm).map(drop)
    }

    /// Slot `slot`'s (`len` bytes) pages written since the last take, as a bitmap of 64 pages
    /// a word, cleared; after [`DirtyTracking::harvest`] for the ring.
    pub fn take(&self, vm: &VmFd, slot: u32, len: u64) -> Result<Vec<u64>, KvmError> {
        match self.ring_entries {
            Some(_) => {
                let mut bitmap = self.marks().take(slot);
                bitmap.resize(len.div_ceil(dirty_log::PAGE).div_ceil(64) as usize, 0);
                Ok(bitmap)
            }
            None => dirty_log::take(vm, slot, len, &self.protect),
        }
    }

    /// The marks the rings harvest into, made on first use.
    fn marks(&self) -> &Marks {
        self.marks.get_or_init(|| Marks::new(MAX_SLOTS))
    }
}

/// A vCPU's own ring, which its thread harvests when KVM says it is full
/// (`KVM_EXIT_DIRTY_RING_FULL`): without a lock (the entries are claimed one by one, the
/// marks are atomic), so the vCPU goes on at once whatever the migration thread is doing.
pub struct OwnRing {
    ring: Arc<VcpuRing>,
    tracking: Arc<DirtyTracking>,
    vm: Arc<VmFd>,
}

impl OwnRing {
    /// Harvests the ring into the VM's marks and hands its entries back to KVM; returns the
    /// entries taken.
    #[cold]
    pub fn harvest_full(&self) -> Result<u32, KvmError> {
        let n = self.ring.harvest(self.tracking.marks())?;
        dirty_ring::reset(&self.vm)?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_a_wrong_one_is_named() {
        assert_eq!("auto".parse::<DirtyLogMode>().unwrap(), DirtyLogMode::Auto);
        assert_eq!("Ring".parse::<DirtyLogMode>().unwrap(), DirtyLogMode::Ring);
        assert_eq!(
            "bitmap".parse::<DirtyLogMode>().unwrap(),
            DirtyLogMode::Bitmap
        );
        let e = "pml".parse::<DirtyLogMode>().unwrap_err().to_string();
        assert!(
            e.contains("'pml'") && e.contains("auto, ring or bitmap"),
            "{e}"
        );
    }
}
