//! KVM_GET_SUPPORTED_CPUID, asked once per VM and kept for every vCPU (also hot-added ones, so
//! only while the VM can add one):
//! on a PVM host it takes ~0.6 ms, the largest single step of creating a vCPU. (Asking it
//! ahead on a thread of its own was measured too: no faster to the first line on 2 cores,
//! and the thread's stack added ~140 kB of peak RSS.)

use std::sync::OnceLock;

use kvm_bindings::{CpuId, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::Kvm;

use super::KvmError;

/// The CPUID entries KVM supports, asked at the first vCPU.
#[derive(Debug, Default)]
pub struct SupportedCpuid {
    value: OnceLock<CpuId>,
}

impl SupportedCpuid {
    /// The entries, asked of `kvm` the first time.
    pub fn get(&self, kvm: &Kvm) -> Result<CpuId, KvmError> {
        if let Some(v) = self.value.get() {
            return Ok(v.clone());
        }
        let fetched = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(|e| KvmError::Ioctl("KVM_GET_SUPPORTED_CPUID", e))?;
        Ok(self.value.get_or_init(|| fetched).clone())
    }

    /// Lets the entries go (a VM that can add no vCPU never asks again): ~8-12 kB of heap
    /// that would otherwise stay private dirty memory for the VM's life.
    pub fn forget(&mut self) {
        self.value.take();
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
}
