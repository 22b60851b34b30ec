//! Per-vCPU fix-ups of the CPUID table from KVM_GET_SUPPORTED_CPUID: APIC IDs, topology, cache
//! sharing, the hypervisor bit. KVM's paravirtual leaves are passed through untouched.

use kvm_bindings::{kvm_cpuid_entry2, CpuId};

/// First KVM paravirtual leaf ("KVMKVMKVM\0\0\0" signature).
pub const KVM_CPUID_SIGNATURE: u32 = 0x4000_0000;
/// KVM paravirtual feature leaf (EAX = feature bits), relative to the signature leaf.
const KVM_FEATURES_OFFSET: u32 = 1;
/// Hypervisor leaves may sit at any 0x100 step up to 0x4000_ff00 (e.g. after Hyper-V's).
const HYPERVISOR_LEAF_END: u32 = 0x4001_0000;
const KVM_SIGNATURE: [u8; 12] = *b"KVMKVMKVM\0\0\0";

const LEAF_FEATURES: u32 = 0x1;
const LEAF_CACHE_PARAMS: u32 = 0x4;
const LEAF_THERMAL_POWER: u32 = 0x6;
const LEAF_EXT_TOPOLOGY: u32 = 0xb;
const LEAF_EXT_TOPOLOGY_V2: u32 = 0x1f;

const LEAF1_ECX_HYPERVISOR: u32 = 1 << 31;
const LEAF1_EDX_HTT: u32 = 1 << 28;
const LEAF1_EBX_APIC_ID_SHIFT: u32 = 24;
const LEAF1_EBX_LOGICAL_COUNT_SHIFT: u32 = 16;

const TOPOLOGY_LEVEL_SMT: u32 = 1;
const TOPOLOGY_LEVEL_CORE: u32 = 2;

/// Names of the KVM paravirtual feature bits (leaf 0x40000001 EAX).
const KVM_FEATURE_NAMES: [(u32, &str); 18] = [
    (0, "KVM_FEATURE_CLOCKSOURCE"),
    (1, "KVM_FEATURE_NOP_IO_DELAY"),
    (2, "KVM_FEATURE_MMU_OP"),
    (3, "KVM_FEATURE_CLOCKSOURCE2"),
    (4, "KVM_FEATURE_ASYNC_PF"),
    (5, "KVM_FEATURE_STEAL_TIME"),
    (6, "KVM_FEATURE_PV_EOI"),
    (7, "KVM_FEATURE_PV_UNHALT"),
    (9, "KVM_FEATURE_PV_TLB_FLUSH"),
    (10, "KVM_FEATURE_ASYNC_PF_VMEXIT"),
    (11, "KVM_FEATURE_PV_SEND_IPI"),
    (12, "KVM_FEATURE_POLL_CONTROL"),
    (13, "KVM_FEATURE_PV_SCHED_YIELD"),
    (14, "KVM_FEATURE_ASYNC_PF_INT"),
    (15, "KVM_FEATURE_MSI_EXT_DEST_ID"),
    (16, "KVM_FEATURE_HC_MAP_GPA_RANGE"),
    (17, "KVM_FEATURE_MIGRATION_CONTROL"),
    (24, "KVM_FEATURE_CLOCKSOURCE_STABLE_BIT"),
];

/// Number of APIC ID bits needed to number `count` logical processors.
fn id_bits(count: u8) -> u32 {
    let highest = u32::from(count.max(1)) - 1;
    u32::BITS - highest.leading_zeros()
}

fn fix_features_leaf(entry: &mut kvm_cpuid_entry2, vcpu_id: u8, nr_vcpus: u8) {
    entry.ebx = (entry.ebx & 0x0000_ffff)
        | (u32::from(vcpu_id) << LEAF1_EBX_APIC_ID_SHIFT)
        | (u32::from(nr_vcpus) << LEAF1_EBX_LOGICAL_COUNT_SHIFT);
    entry.ecx |= LEAF1_ECX_HYPERVISOR;
    entry.edx |= LEAF1_EDX_HTT;
}

/// Cache parameters: all vCPUs are cores of one package, each with private L1/L2 caches and a
/// shared L3.
fn fix_cache_leaf(entry: &mut kvm_cpuid_entry2, nr_vcpus: u8) {
    const CORES_SHIFT: u32 = 26;
    const SHARING_SHIFT: u32 = 14;
    const SHARING_MASK: u32 = 0xfff << SHARING_SHIFT;
    let cache_type = entry.eax & 0x1f;
    if cache_type == 0 {
        return;
    }
    let level = (entry.eax >> 5) & 0x7;
    let others = u32::from(nr_vcpus.max(1)) - 1;
    let sharing = if level >= 3 { others.min(0xfff) } else { 0 };
    entry.eax = (entry.eax & !(0x3f << CORES_SHIFT) & !SHARING_MASK)
        | (others.min(0x3f) << CORES_SHIFT)
        | (sharing << SHARING_SHIFT);
}

/// Extended topology (leaves 0xb and 0x1f): one thread per core, `nr_vcpus` cores per package.
fn fix_topology_leaf(entry: &mut kvm_cpuid_entry2, vcpu_id: u8, nr_vcpus: u8) {
    let level = entry.index;
    let (shift, count, level_type) = match level {
        0 => (0, 1, TOPOLOGY_LEVEL_SMT),
        1 => (id_bits(nr_vcpus), u32::from(nr_vcpus), TOPOLOGY_LEVEL_CORE),
        _ => (0, 0, 0),
    };
    entry.eax = shift;
    entry.ebx = count;
    entry.ecx = (level_type << 8) | (level & 0xff);
    entry.edx = u32::from(vcpu_id);
}

/// Adjusts `cpuid` (KVM's supported CPUID) for vCPU `vcpu_id` of `nr_vcpus`.
///
/// Leaves 0x40000000 and 0x40000001 (KVM paravirt signature and features: PV TLB flush, PV
/// send-IPI, PV EOI, steal time...) are deliberately left as KVM reported them.
pub fn fixup_cpuid(cpuid: &mut CpuId, vcpu_id: u8, nr_vcpus: u8) {
    for entry in cpuid.as_mut_slice() {
        match entry.function {
            LEAF_FEATURES => fix_features_leaf(entry, vcpu_id, nr_vcpus),
            LEAF_CACHE_PARAMS => fix_cache_leaf(entry, nr_vcpus),
            LEAF_THERMAL_POWER => {
                entry.eax = 0;
                entry.ebx = 0;
                entry.ecx = 0;
                entry.edx = 0;
            }
            LEAF_EXT_TOPOLOGY | LEAF_EXT_TOPOLOGY_V2 => fix_topology_leaf(entry, vcpu_id, nr_vcpus),
            _ => {}
        }
    }
}

fn find_leaf(cpuid: &CpuId, function: u32) -> Option<&kvm_cpuid_entry2> {
    cpuid.as_slice().iter().find(|e| e.function == function)
}

fn has_kvm_signature(entry: &kvm_cpuid_entry2) -> bool {
    let mut signature = [0u8; 12];
    signature[..4].copy_from_slice(&entry.ebx.to_le_bytes());
    signature[4..8].copy_from_slice(&entry.ecx.to_le_bytes());
    signature[8..].copy_from_slice(&entry.edx.to_le_bytes());
    signature == KVM_SIGNATURE
}

/// Base of the KVM paravirtual leaves (usually 0x40000000), if present.
pub fn kvm_cpuid_base(cpuid: &CpuId) -> Option<u32> {
    (KVM_CPUID_SIGNATURE..HYPERVISOR_LEAF_END)
        .step_by(0x100)
        .find(|base| find_leaf(cpuid, *base).is_some_and(has_kvm_signature))
}

/// Names of the KVM paravirtual features set in `cpuid` (empty without KVM's leaves).
///
/// One of the lab's entry points (the bench reports the host's PV features).
pub fn kvm_pv_features(cpuid: &CpuId) -> Vec<&'static str> {
    let Some(base) = kvm_cpuid_base(cpuid) else {
        return Vec::new();
    };
    let Some(features) = find_leaf(cpuid, base + KVM_FEATURES_OFFSET) else {
        return Vec::new();
    };
    KVM_FEATURE_NAMES
        .iter()
        .filter(|(bit, _)| features.eax & (1 << bit) != 0)
        .map(|(_, name)| *name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(function: u32, index: u32, regs: [u32; 4]) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            eax: regs[0],
            ebx: regs[1],
            ecx: regs[2],
            edx: regs[3],
            ..Default::default()
        }
    }

    fn kvm_signature_leaf(base: u32) -> kvm_cpuid_entry2 {
        // "KVMK" "VMKV" "M\0\0\0" in EBX, ECX, EDX.
        leaf(base, 0, [base + 1, 0x4b4d_564b, 0x564b_4d56, 0x0000_004d])
    }

    /// A host-like table: leaf 1, three caches, thermal, topology, KVM leaves.
    fn host_cpuid() -> CpuId {
        let pv_features = (1 << 3) | (1 << 5) | (1 << 6) | (1 << 9) | (1 << 11) | (1 << 24);
        CpuId::from_entries(&[
            leaf(0x1, 0, [0x000a_06a4, 0x2a10_0800, 0x7ffa_fbff, 0x0fab_fbff]),
            leaf(0x4, 0, [0x1c00_4121, 0x01c0_003f, 0x3f, 0]),
            leaf(0x4, 2, [0x1c00_4143, 0x03c0_003f, 0x3ff, 0]),
            leaf(0x4, 3, [0x1c03_c163, 0x0380_003f, 0x7fff, 4]),
            leaf(0x4, 4, [0, 0, 0, 0]),
            leaf(0x6, 0, [0x77, 2, 9, 0]),
            leaf(0xb, 0, [1, 2, 0x100, 0x2a]),
            leaf(0xb, 1, [7, 64, 0x201, 0x2a]),
            leaf(0xb, 2, [0, 0, 2, 0x2a]),
            kvm_signature_leaf(0x4000_0000),
            leaf(0x4000_0001, 0, [pv_features, 0, 0, 0]),
        ])
        .unwrap()
    }

    fn get(cpuid: &CpuId, function: u32, index: u32) -> kvm_cpuid_entry2 {
        *cpuid
            .as_slice()
            .iter()
            .find(|e| e.function == function && e.index == index)
            .unwrap()
    }

    #[test]
    fn leaf_1_gets_apic_id_count_htt_and_hypervisor() {
        let mut cpuid = host_cpuid();
        fixup_cpuid(&mut cpuid, 3, 4);
        let l1 = get(&cpuid, 1, 0);
        assert_eq!(l1.ebx >> 24, 3);
        assert_eq!((l1.ebx >> 16) & 0xff, 4);
        assert_eq!(l1.ebx & 0xffff, 0x0800, "CLFLUSH size and brand index kept");
        assert_ne!(l1.ecx & (1 << 31), 0);
        assert_ne!(l1.edx & (1 << 28), 0);
        assert_eq!(l1.eax, 0x000a_06a4);
    }

    #[test]
    fn topology_leaf_describes_one_package_of_cores() {
        let mut cpuid = host_cpuid();
        fixup_cpuid(&mut cpuid, 5, 6);
        let smt = get(&cpuid, 0xb, 0);
        let core = get(&cpuid, 0xb, 1);
        let invalid = get(&cpuid, 0xb, 2);
        assert_eq!([smt.eax, smt.ebx, smt.ecx, smt.edx], [0, 1, 0x100, 5]);
        assert_eq!([core.eax, core.ebx, core.ecx, core.edx], [3, 6, 0x201, 5]);
        assert_eq!(
            [invalid.eax, invalid.ebx, invalid.ecx, invalid.edx],
            [0, 0, 2, 5]
        );
    }

    #[test]
    fn cache_leaf_counts_cores_and_shares_only_l3() {
        let mut cpuid = host_cpuid();
        fixup_cpuid(&mut cpuid, 0, 4);
        let l1d = get(&cpuid, 4, 0);
        let l3 = get(&cpuid, 4, 3);
        assert_eq!(l1d.eax >> 26, 3);
        assert_eq!((l1d.eax >> 14) & 0xfff, 0);
        assert_eq!(l1d.eax & 0x3fff, 0x0121, "type and level kept");
        assert_eq!(l3.eax >> 26, 3);
        assert_eq!((l3.eax >> 14) & 0xfff, 3);
        assert_eq!(get(&cpuid, 4, 4).eax, 0, "terminator untouched");
    }

    #[test]
    fn thermal_leaf_is_cleared() {
        let mut cpuid = host_cpuid();
        fixup_cpuid(&mut cpuid, 0, 1);
        let l6 = get(&cpuid, 6, 0);
        assert_eq!([l6.eax, l6.ebx, l6.ecx, l6.edx], [0; 4]);
    }

    #[test]
    fn kvm_paravirt_leaves_pass_through() {
        let original = host_cpuid();
        let mut cpuid = host_cpuid();
        fixup_cpuid(&mut cpuid, 1, 2);
        for function in [0x4000_0000, 0x4000_0001] {
            assert_eq!(get(&cpuid, function, 0), get(&original, function, 0));
        }
    }

    #[test]
    fn pv_features_are_named() {
        let mut cpuid = host_cpuid();
        fixup_cpuid(&mut cpuid, 0, 2);
        assert_eq!(
            kvm_pv_features(&cpuid),
            [
                "KVM_FEATURE_CLOCKSOURCE2",
                "KVM_FEATURE_STEAL_TIME",
                "KVM_FEATURE_PV_EOI",
                "KVM_FEATURE_PV_TLB_FLUSH",
                "KVM_FEATURE_PV_SEND_IPI",
                "KVM_FEATURE_CLOCKSOURCE_STABLE_BIT",
            ]
        );
    }

    #[test]
    fn pv_features_found_at_shifted_base() {
        let cpuid = CpuId::from_entries(&[
            leaf(
                0x4000_0000,
                0,
                [0x4000_0005, 0x7263_694d, 0x666f_736f, 0x7648_2074],
            ),
            kvm_signature_leaf(0x4000_0100),
            leaf(0x4000_0101, 0, [1 << 16, 0, 0, 0]),
        ])
        .unwrap();
        assert_eq!(kvm_cpuid_base(&cpuid), Some(0x4000_0100));
        assert_eq!(kvm_pv_features(&cpuid), ["KVM_FEATURE_HC_MAP_GPA_RANGE"]);
    }

    #[test]
    fn no_kvm_leaves_means_no_features() {
        let cpuid = CpuId::from_entries(&[leaf(0x1, 0, [0; 4])]).unwrap();
        assert!(kvm_pv_features(&cpuid).is_empty());
    }

    #[test]
    fn id_bits_rounds_up_to_a_power_of_two() {
        assert_eq!([1, 2, 3, 4, 5, 8, 9].map(id_bits), [0, 1, 2, 2, 3, 3, 4]);
    }
}
