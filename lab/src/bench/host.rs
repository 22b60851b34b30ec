//! What the bench records about the host: CPU, kernel, KVM flavour and capabilities.

use std::fs;

use serde::Serialize;

use vmm::boot::cpuid::kvm_pv_features;
use vmm::kvm::{self, Capabilities, KvmError};
use vmm::profile;

/// Host metadata written with every bench result.
#[derive(Debug, Clone, Serialize)]
pub struct HostInfo {
    pub hostname: String,
    pub kernel: String,
    pub cpu_model: String,
    pub host_cpus: usize,
    pub tsc_khz: u64,
    /// "pvm" when /dev/kvm is the PVM module (software nested virtualization), else "kvm".
    pub kvm_flavour: &'static str,
    pub capabilities: Capabilities,
    /// KVM paravirt features (CPUID 0x40000001) offered to guests.
    pub pv_features: Vec<&'static str>,
}

fn read_trimmed(path: &str) -> String {
    fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn cpu_model() -> String {
    read_trimmed("/proc/cpuinfo")
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|r| r.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Probes the host once: a throwaway VM and vCPU give the TSC rate and supported CPUID.
pub fn probe() -> Result<HostInfo, KvmError> {
    let kvm = kvm::open()?;
    let capabilities = Capabilities::probe(&kvm);
    let cpuid = kvm
        .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
        .map_err(|e| KvmError::Ioctl("KVM_GET_SUPPORTED_CPUID", e))?;
    let vm = kvm.create_vm().map_err(KvmError::CreateVm)?;
    let vcpu = vm
        .create_vcpu(0)
        .map_err(|e| KvmError::Ioctl("KVM_CREATE_VCPU", e))?;
    let tsc_khz = match vcpu.get_tsc_khz() {
        Ok(khz) if khz > 0 => u64::from(khz),
        _ => profile::estimate_tsc_khz(std::time::Duration::from_millis(100)),
    };
    let pvm = vmm::kvm::is_pvm_host();
    Ok(HostInfo {
        hostname: read_trimmed("/proc/sys/kernel/hostname"),
        kernel: read_trimmed("/proc/sys/kernel/osrelease"),
        cpu_model: cpu_model(),
        host_cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        tsc_khz,
        kvm_flavour: if pvm { "pvm" } else { "kvm" },
        capabilities,
        pv_features: kvm_pv_features(&cpuid),
    })
}
