//! The CPU features a guest saw (its CPUID feature words), saved with a snapshot and checked
//! against the host that restores it: a guest that found AVX2 at boot uses it without asking
//! again, so a host without it is refused, naming what it lacks.

use kvm_bindings::kvm_cpuid_entry2;

use super::format::{CpuSection, FeatureWord, Register};

/// The words compared, and bits in them KVM changes while the guest runs (they follow the
/// guest's own CR4 and MSR writes, so they say nothing about the host): OSXSAVE, OSPKE,
/// MONITOR (IA32_MISC_ENABLE), APIC (the APIC base MSR).
const WORDS: [(u32, u32, Register, u32); 13] = [
    (0x1, 0, Register::Ecx, 1 << 27 | 1 << 3),
    (0x1, 0, Register::Edx, 1 << 9),
    (0x7, 0, Register::Ebx, 0),
    (0x7, 0, Register::Ecx, 1 << 4),
    (0x7, 0, Register::Edx, 0),
    (0x7, 1, Register::Eax, 0),
    (0xd, 0, Register::Eax, 0),
    (0xd, 1, Register::Eax, 0),
    (0x8000_0001, 0, Register::Ecx, 0),
    (0x8000_0001, 0, Register::Edx, 0),
    (0x8000_0007, 0, Register::Edx, 0),
    (0x8000_0008, 0, Register::Ebx, 0),
    (0x4000_0001, 0, Register::Eax, 0),
];

/// Names of the best-known bits, by (leaf, subleaf, register, bit).
const NAMES: &[(u32, u32, Register, u32, &str)] = &[
    (1, 0, Register::Ecx, 0, "sse3"),
    (1, 0, Register::Ecx, 1, "pclmulqdq"),
    (1, 0, Register::Ecx, 5, "vmx"),
    (1, 0, Register::Ecx, 9, "ssse3"),
    (1, 0, Register::Ecx, 12, "fma"),
    (1, 0, Register::Ecx, 13, "cx16"),
    (1, 0, Register::Ecx, 19, "sse4_1"),
    (1, 0, Register::Ecx, 20, "sse4_2"),
    (1, 0, Register::Ecx, 21, "x2apic"),
    (1, 0, Register::Ecx, 22, "movbe"),
    (1, 0, Register::Ecx, 23, "popcnt"),
    (1, 0, Register::Ecx, 24, "tsc_deadline_timer"),
    (1, 0, Register::Ecx, 25, "aes"),
    (1, 0, Register::Ecx, 26, "xsave"),
    (1, 0, Register::Ecx, 28, "avx"),
    (1, 0, Register::Ecx, 29, "f16c"),
    (1, 0, Register::Ecx, 30, "rdrand"),
    (1, 0, Register::Ecx, 31, "hypervisor"),
    (1, 0, Register::Edx, 0, "fpu"),
    (1, 0, Register::Edx, 4, "tsc"),
    (1, 0, Register::Edx, 5, "msr"),
    (1, 0, Register::Edx, 6, "pae"),
    (1, 0, Register::Edx, 8, "cx8"),
    (1, 0, Register::Edx, 15, "cmov"),
    (1, 0, Register::Edx, 19, "clflush"),
    (1, 0, Register::Edx, 23, "mmx"),
    (1, 0, Register::Edx, 24, "fxsr"),
    (1, 0, Register::Edx, 25, "sse"),
    (1, 0, Register::Edx, 26, "sse2"),
    (1, 0, Register::Edx, 28, "ht"),
    (7, 0, Register::Ebx, 0, "fsgsbase"),
    (7, 0, Register::Ebx, 3, "bmi1"),
    (7, 0, Register::Ebx, 5, "avx2"),
    (7, 0, Register::Ebx, 7, "smep"),
    (7, 0, Register::Ebx, 8, "bmi2"),
    (7, 0, Register::Ebx, 9, "erms"),
    (7, 0, Register::Ebx, 10, "invpcid"),
    (7, 0, Register::Ebx, 16, "avx512f"),
    (7, 0, Register::Ebx, 18, "rdseed"),
    (7, 0, Register::Ebx, 19, "adx"),
    (7, 0, Register::Ebx, 20, "smap"),
    (7, 0, Register::Ebx, 23, "clflushopt"),
    (7, 0, Register::Ebx, 24, "clwb"),
    (7, 0, Register::Ebx, 29, "sha_ni"),
    (7, 0, Register::Ecx, 2, "umip"),
    (7, 0, Register::Ecx, 3, "pku"),
    (7, 0, Register::Ecx, 9, "vaes"),
    (7, 0, Register::Ecx, 10, "vpclmulqdq"),
    (7, 0, Register::Ecx, 22, "rdpid"),
    (7, 0, Register::Edx, 10, "md_clear"),
    (7, 0, Register::Edx, 26, "spec_ctrl"),
    (7, 0, Register::Edx, 29, "arch_capabilities"),
    (0x8000_0001, 0, Register::Ecx, 0, "lahf_lm"),
    (0x8000_0001, 0, Register::Ecx, 2, "svm"),
    (0x8000_0001, 0, Register::Ecx, 5, "abm"),
    (0x8000_0001, 0, Register::Ecx, 8, "3dnowprefetch"),
    (0x8000_0001, 0, Register::Edx, 11, "syscall"),
    (0x8000_0001, 0, Register::Edx, 20, "nx"),
    (0x8000_0001, 0, Register::Edx, 26, "pdpe1gb"),
    (0x8000_0001, 0, Register::Edx, 27, "rdtscp"),
    (0x8000_0001, 0, Register::Edx, 29, "lm"),
    (0x8000_0007, 0, Register::Edx, 8, "constant_tsc"),
];

fn find(table: &[kvm_cpuid_entry2], leaf: u32, subleaf: u32) -> Option<&kvm_cpuid_entry2> {
    table.iter().find(|e| {
        e.function == leaf
            && (e.index == subleaf || e.flags & kvm_bindings::KVM_CPUID_FLAG_SIGNIFCANT_INDEX == 0)
    })
}

fn register(e: &kvm_cpuid_entry2, r: Register) -> u32 {
    match r {
        Register::Eax => e.eax,
        Register::Ebx => e.ebx,
        Register::Ecx => e.ecx,
        Register::Edx => e.edx,
    }
}

/// CPUID leaf 0's vendor string ("GenuineIntel", "AuthenticAMD").
fn vendor(table: &[kvm_cpuid_entry2]) -> String {
    let Some(e) = find(table, 0, 0) else {
        return String::new();
    };
    let bytes: Vec<u8> = [e.ebx, e.edx, e.ecx]
        .iter()
        .flat_map(|r| r.to_le_bytes())
        .collect();
    String::from_utf8_lossy(&bytes)
        .trim_end_matches('\0')
        .to_string()
}

/// The features of CPUID `table` (a vCPU's), without the bits KVM changes at run time.
pub fn features_of(table: &[kvm_cpuid_entry2]) -> CpuSection {
    let features = WORDS
        .iter()
        .map(|&(leaf, subleaf, reg, dynamic)| FeatureWord {
            leaf,
            subleaf,
            register: reg,
            bits: find(table, leaf, subleaf).map_or(0, |e| register(e, reg)) & !dynamic,
        })
        .collect();
    CpuSection {
        vendor: vendor(table),
        features,
    }
}

/// The name of bit `bit` of a word.
fn bit_name(w: &FeatureWord, bit: u32) -> String {
    let known = NAMES
        .iter()
        .find(|n| (n.0, n.1, n.2, n.3) == (w.leaf, w.subleaf, w.register, bit));
    match known {
        Some(n) => n.4.to_string(),
        None => format!(
            "cpuid {:#x}.{} {:?} bit {bit}",
            w.leaf, w.subleaf, w.register
        )
        .to_lowercase(),
    }
}

/// Why `host` cannot run a guest that saw `guest`: another vendor, or the features it lacks
/// by name. None when it can.
pub fn missing(guest: &CpuSection, host: &CpuSection) -> Option<String> {
    if guest.vendor != host.vendor {
        return Some(format!(
            "the guest ran on a {} CPU, this host's is {}",
            guest.vendor, host.vendor
        ));
    }
    let mut lacking = Vec::new();
    for w in &guest.features {
        let have = host
            .features
            .iter()
            .find(|h| (h.leaf, h.subleaf, h.register) == (w.leaf, w.subleaf, w.register))
            .map_or(0, |h| h.bits);
        let absent = w.bits & !have;
        lacking.extend(
            (0..32)
                .filter(|b| absent & (1 << b) != 0)
                .map(|b| bit_name(w, b)),
        );
    }
    (!lacking.is_empty()).then(|| {
        format!(
            "this host lacks CPU features the guest saw: {}",
            lacking.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(function: u32, ecx: u32, edx: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            ecx,
            edx,
            ..Default::default()
        }
    }

    fn intel() -> kvm_cpuid_entry2 {
        let word = |s: &[u8]| u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        let v = b"GenuineIntel";
        kvm_cpuid_entry2 {
            function: 0,
            ebx: word(&v[0..4]),
            edx: word(&v[4..8]),
            ecx: word(&v[8..12]),
            ..Default::default()
        }
    }

    #[test]
    fn a_host_with_fewer_features_is_named_what_it_lacks() {
        let avx2 = kvm_cpuid_entry2 {
            function: 7,
            ebx: 1 << 5 | 1 << 30,
            ..Default::default()
        };
        let guest = features_of(&[intel(), entry(1, 1 << 28 | 1 << 27, 0), avx2]);
        assert_eq!(guest.vendor, "GenuineIntel");
        let host = features_of(&[intel(), entry(1, 0, 0)]);
        let why = missing(&guest, &host).unwrap();
        assert_eq!(
            why,
            "this host lacks CPU features the guest saw: avx, avx2, cpuid 0x7.0 ebx bit 30"
        );
        // OSXSAVE (bit 27) follows the guest's CR4: never asked of the host.
        assert!(missing(&guest, &guest).is_none());
        let mut amd = host.clone();
        amd.vendor = "AuthenticAMD".into();
        assert!(missing(&guest, &amd).unwrap().contains("AuthenticAMD"));
    }
}
