//! KVM_GET_SUPPORTED_CPUID, asked once per VM and kept for every vCPU (also hot-added ones, so
//! only while the VM can add one). On a PVM host it takes ~0.65 ms (KVM runs CPUID for every
//! leaf, each trapping to the hypervisor below), the largest single step of creating a vCPU,
//! so the builder hands [`SupportedCpuid::fetch_task`] to its set-up thread (the one that
//! created the PIT: at launch, vCPU 0's thread before it takes its vCPU) while the main
//! thread writes the ACPI tables and loads the kernel.

use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex, OnceLock};

use kvm_bindings::{CpuId, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::Kvm;

use super::KvmError;

type Answer = Result<CpuId, kvm_ioctls::Error>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The CPUID entries KVM supports, asked on a set-up thread or at the first vCPU.
#[derive(Debug, Default)]
pub struct SupportedCpuid {
    value: OnceLock<CpuId>,
    /// Where the answer of a [`SupportedCpuid::fetch_task`] arrives.
    pending: Mutex<Option<Receiver<Answer>>>,
}

impl SupportedCpuid {
    /// The entries of a new VM: asked by a [`SupportedCpuid::fetch_task`], else when first
    /// needed.
    pub fn for_new_vm() -> Self {
        Self::default()
    }

    /// A task that asks `kvm` and hands the answer to [`SupportedCpuid::get`], for a thread
    /// other than the caller's; `None` once the entries are kept or an answer is on its way.
    /// Not to be run while the VM, its memory slot or its irqchip is being created: a CPU
    /// inside this long ioctl delays the SRCU grace periods and TLB-flush IPIs those wait for
    /// (measured: memory slot 0.4 -> 1.1 ms, irqchip 0.03 -> 0.84 ms; see
    /// docs/performance.md). Dropped unrun, `get` asks itself.
    pub fn fetch_task(&self, kvm: &Arc<Kvm>) -> Option<impl FnOnce() + Send + 'static> {
        if self.value.get().is_some() || self.pending_lock().is_some() {
            return None;
        }
        let (answer, pending) = mpsc::sync_channel(1);
        *self.pending_lock() = Some(pending);
        let kvm = kvm.clone();
        Some(move || {
            let _ = answer.send(kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES));
        })
    }

    /// The entries: the answer asked ahead, or asked of `kvm` the first time.
    pub fn get(&self, kvm: &Kvm) -> Result<CpuId, KvmError> {
        if let Some(v) = self.value.get() {
            return Ok(v.clone());
        }
        let pending = self.pending_lock().take();
        let fetched = match pending.map(|p| p.recv()) {
            Some(Ok(Ok(entries))) => entries,
            // Not asked ahead, the task dropped unrun, or asking ahead failed: ask here.
            _ => kvm
                .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
                .map_err(|e| KvmError::Ioctl("KVM_GET_SUPPORTED_CPUID", e))?,
        };
        Ok(self.value.get_or_init(|| fetched).clone())
    }

    /// Lets the entries go (a VM that can add no vCPU never asks again): ~8-12 kB of heap
    /// that would otherwise stay private dirty memory for the VM's life.
    pub fn forget(&mut self) {
        self.value.take();
    }

    fn pending_lock(&self) -> std::sync::MutexGuard<'_, Option<Receiver<Answer>>> {
        lock(&self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keeps the test thread, and the threads it starts, on the CPU it runs on: KVM's answer
    /// carries the APIC ID of the CPU that asked (leaf 1 EBX, leaf 0xB EDX), so answers asked
    /// on two threads are equal only if both ran on one CPU.
    fn stay_on_this_cpu() {
        let cpu = crate::profile::current_cpu().expect("sched_getcpu");
        crate::vcpu::pin_current_thread(cpu).expect("pin the test thread");
    }

    #[test]
    fn kept_entries_equal_what_kvm_says() {
        let Ok(kvm) = Kvm::new() else {
            crate::test_skip::skip("kept_entries_equal_what_kvm_says", "/dev/kvm is missing");
            return;
        };
        stay_on_this_cpu();
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
        stay_on_this_cpu();
        let kvm = Arc::new(kvm);
        let direct = kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).unwrap();
        let kept = SupportedCpuid::default();
        let task = kept.fetch_task(&kvm).expect("nothing kept yet");
        assert!(kept.pending_lock().is_some(), "an answer is awaited");
        std::thread::spawn(task).join().unwrap();
        assert_eq!(kept.get(&kvm).unwrap().as_slice(), direct.as_slice());
        assert!(kept.pending_lock().is_none(), "the answer was taken");
        // Kept: no more task.
        assert!(kept.fetch_task(&kvm).is_none());
        assert_eq!(kept.get(&kvm).unwrap().as_slice(), direct.as_slice());
        // A task dropped unrun: the entries are asked directly.
        let unrun = SupportedCpuid::default();
        drop(unrun.fetch_task(&kvm));
        assert_eq!(unrun.get(&kvm).unwrap().as_slice(), direct.as_slice());
    }
}
