//! KVM_GET_SUPPORTED_CPUID, asked once per VM and kept for every vCPU (also hot-added ones, so
//! only while the VM can add one). On a PVM host it takes ~0.65 ms (KVM runs CPUID for every
//! leaf, each trapping to the hypervisor below), the largest single step of creating a vCPU,
//! so the builder asks it on a short-lived thread ([`SupportedCpuid::fetch_ahead`]) while the
//! main thread writes the ACPI tables and loads the kernel.

use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use kvm_bindings::{CpuId, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::Kvm;

use super::KvmError;

type Pending = JoinHandle<Result<CpuId, kvm_ioctls::Error>>;

/// The CPUID entries KVM supports, asked ahead or at the first vCPU.
#[derive(Debug, Default)]
pub struct SupportedCpuid {
    value: OnceLock<CpuId>,
    pending: Mutex<Option<Pending>>,
}

impl SupportedCpuid {
    /// Starts asking `kvm` on a thread of its own; [`SupportedCpuid::get`] waits for the
    /// answer (or asks itself if no thread could start). Not while the VM, its memory slot
    /// or its irqchip is being created: a CPU inside this long ioctl delays the SRCU grace
    /// periods and TLB-flush IPIs those wait for (measured: memory slot 0.4 -> 1.1 ms,
    /// irqchip 0.03 -> 0.84 ms; see docs/performance.md).
    pub fn fetch_ahead(&self, kvm: &Arc<Kvm>) {
        if self.value.get().is_some() {
            return;
        }
        let kvm = kvm.clone();
        let spawned = std::thread::Builder::new()
            .name("cpuid-query".into())
            .stack_size(64 * 1024)
            .spawn(move || kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES));
        *self.pending_lock() = spawned.ok();
    }

    /// The entries: the answer asked ahead, or asked of `kvm` the first time.
    pub fn get(&self, kvm: &Kvm) -> Result<CpuId, KvmError> {
        if let Some(v) = self.value.get() {
            return Ok(v.clone());
        }
        let pending = self.pending_lock().take();
        let fetched = match pending.map(JoinHandle::join) {
            Some(Ok(answer)) => answer,
            // No thread, or it died without an answer: ask here.
            Some(Err(_)) | None => kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES),
        }
        .map_err(|e| KvmError::Ioctl("KVM_GET_SUPPORTED_CPUID", e))?;
        Ok(self.value.get_or_init(|| fetched).clone())
    }

    /// Lets the entries go (a VM that can add no vCPU never asks again): ~8-12 kB of heap
    /// that would otherwise stay private dirty memory for the VM's life.
    pub fn forget(&mut self) {
        self.value.take();
    }

    fn pending_lock(&self) -> std::sync::MutexGuard<'_, Option<Pending>> {
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_entries_equal_what_kvm_says() {
        let Ok(kvm) = Kvm::new() else {
            crate::test_skip::skip("kept_entries_equal_what_kvm_says", "/dev/kvm is missing");
            return;
        };
        let direct = kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).unwrap();
        let kept = SupportedCpuid::default();
        assert_eq!(kept.get(&kvm).unwrap().as_slice(), direct.as_slice());
        // A second vCPU gets the same from the cache.
        assert_eq!(kept.get(&kvm).unwrap().as_slice(), direct.as_slice());
        assert!(kept.value.get().is_some());
        let mut kept = kept;
        kept.forget();
        assert!(kept.value.get().is_none());
        assert_eq!(kept.get(&kvm).unwrap().as_slice(), direct.as_slice());
    }

    #[test]
    fn entries_asked_ahead_equal_what_kvm_says() {
        let Ok(kvm) = Kvm::new() else {
            crate::test_skip::skip(
                "entries_asked_ahead_equal_what_kvm_says",
                "/dev/kvm is missing",
            );
            return;
        };
        let kvm = Arc::new(kvm);
        let direct = kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).unwrap();
        let kept = SupportedCpuid::default();
        kept.fetch_ahead(&kvm);
        assert!(kept.pending_lock().is_some(), "a thread asks");
        assert_eq!(kept.get(&kvm).unwrap().as_slice(), direct.as_slice());
        assert!(kept.pending_lock().is_none(), "its answer was taken");
        // Kept: asking ahead again starts no thread.
        kept.fetch_ahead(&kvm);
        assert!(kept.pending_lock().is_none());
        assert_eq!(kept.get(&kvm).unwrap().as_slice(), direct.as_slice());
    }
}
