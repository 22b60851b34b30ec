//! The hotplug controllers' part of the DSDT:
//!
//! - the GED, the power button and `\_S5_`, the PCI hotplug controller and `\_SB_.CPUS` with
//!   a device per possible CPU ([`super::hotplug_aml`]);
//! - in `\_SB_.PCI0`, a device per slot (`Sxx_`: `_ADR`, `_SUN`, `_EJ0`) and `PCNT`, which
//!   notifies slots that came up (1, device check) and that are to go (3, eject request);
//! - with memory hotplug, `\_SB_.MHPC` ([`super::memory_aml`]).
//!
//! What a VM of at most [`PREBUILT_VCPUS`] vCPUs without memory hotplug needs was built when
//! exitless was compiled (`vmm/build.rs`); other VMs build their own at run time.

use super::hotplug_aml::{cpus, ged, pci_controller, power};

/// The slots' part of the DSDT (a device per slot in `\_SB_.PCI0`, and `PCNT`, which notifies
/// them), the same for every VM: built when exitless is compiled (`vmm/build.rs` runs
/// [`super::pci_slots_aml`]); built at run time it cost 0.10-0.2 ms of CPU a start, on the head
/// start's thread or the main thread (docs/performance.md).
static PCI_SLOTS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/pci_slots.aml"));

fn pci_slots() -> &'static [u8] {
    PCI_SLOTS
}

/// The largest `max_vcpus` whose CPU part was built when exitless was compiled.
pub const PREBUILT_VCPUS: u8 = 8;

/// The GED (without memory hotplug), the power button and the PCI hotplug controller, as
/// `vmm/build.rs` built them; built at run time with `\_SB_.CPUS` they cost ~0.06 ms of a
/// start on the main thread (docs/performance.md).
static CONTROLLERS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hotplug_controllers.aml"));

/// `\_SB_.CPUS` for 1..=[`PREBUILT_VCPUS`] vCPUs, as `vmm/build.rs` built it.
static CPUS: [&[u8]; PREBUILT_VCPUS as usize] = [
    include_bytes!(concat!(env!("OUT_DIR"), "/cpus_1.aml")),
    include_bytes!(concat!(env!("OUT_DIR"), "/cpus_2.aml")),
    include_bytes!(concat!(env!("OUT_DIR"), "/cpus_3.aml")),
    include_bytes!(concat!(env!("OUT_DIR"), "/cpus_4.aml")),
    include_bytes!(concat!(env!("OUT_DIR"), "/cpus_5.aml")),
    include_bytes!(concat!(env!("OUT_DIR"), "/cpus_6.aml")),
    include_bytes!(concat!(env!("OUT_DIR"), "/cpus_7.aml")),
    include_bytes!(concat!(env!("OUT_DIR"), "/cpus_8.aml")),
];

/// Everything the hotplug controllers add to the DSDT, for a VM of up to `max_vcpus` and
/// `memory_slots` memory hotplug slots (0: no memory hotplug); the PCI parts go after
/// `\_SB_.PCI0` (its slots are added to it by scope).
pub fn dsdt_aml(max_vcpus: u8, memory_slots: usize) -> Vec<u8> {
    let prebuilt_cpus = usize::from(max_vcpus)
        .checked_sub(1)
        .and_then(|i| CPUS.get(i));
    match prebuilt_cpus {
        Some(cpus) if memory_slots == 0 => [CONTROLLERS, pci_slots(), cpus].concat(),
        _ => built_now(max_vcpus, memory_slots),
    }
}

/// What [`dsdt_aml`] gives, built now.
fn built_now(max_vcpus: u8, memory_slots: usize) -> Vec<u8> {
    let mut out = ged(memory_slots > 0);
    out.extend(power());
    out.extend(pci_controller());
    out.extend_from_slice(pci_slots());
    out.extend(cpus(max_vcpus));
    if memory_slots > 0 {
        out.extend(super::memory_aml::memory_controller(memory_slots));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::acpi::GED_ADDR;

    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        haystack.windows(needle.len()).any(|w| w == needle)
    }

    #[test]
    fn the_parts_built_at_compile_time_are_those_built_now() {
        for vcpus in 1..=PREBUILT_VCPUS {
            assert_eq!(dsdt_aml(vcpus, 0), built_now(vcpus, 0), "{vcpus} vCPUs");
            assert_eq!(CPUS[usize::from(vcpus) - 1], &cpus(vcpus)[..]);
        }
        let with_memory = dsdt_aml(2, 4);
        assert_eq!(with_memory, built_now(2, 4));
        assert!(contains(&with_memory, b"MHPC"));
        let beyond = dsdt_aml(PREBUILT_VCPUS + 1, 0);
        assert!(contains(&beyond, b"C008") && !contains(&beyond, b"C009"));
    }

    #[test]
    fn the_pci_slots_built_at_compile_time_are_those_built_now() {
        let now = super::super::pci_slots_aml::build(crate::devices::pci::root::SLOTS);
        assert_eq!(pci_slots(), &now[..]);
        assert!(contains(pci_slots(), b"S1F_") && contains(pci_slots(), b"PCNT"));
    }

    #[test]
    fn the_methods_and_devices_are_there() {
        let aml = dsdt_aml(4, 0);
        for name in [
            &b"GED_"[..],
            b"_EVT",
            b"PHPR",
            b"PCEJ",
            b"PSCN",
            b"PCNT",
            b"DVNT",
            b"S01_",
            b"S1F_",
            b"CPUS",
            b"CSCN",
            b"CSTS",
            b"CEJ0",
            b"C000",
            b"C003",
            b"_EJ0",
            b"_MAT",
            b"ACPI0013",
            b"PWRB",
            b"_S5_",
        ] {
            assert!(contains(&aml, name), "{}", String::from_utf8_lossy(name));
        }
        assert!(!contains(&aml, b"C004"), "only max_vcpus CPUs");
        // The GED's register and interrupt: its address in the OperationRegion, IRQ 5 edge.
        assert!(contains(&aml, &(GED_ADDR as u32).to_le_bytes()));
        assert!(contains(
            &aml,
            &[0x89, 0x06, 0x00, 0x03, 0x01, 0x05, 0x00, 0x00, 0x00]
        ));
    }

    #[test]
    fn memory_slots_come_with_their_scan() {
        let without = dsdt_aml(2, 0);
        assert!(!contains(&without, b"MHPC") && !contains(&without, b"MSCN"));
        let with = dsdt_aml(2, 8);
        for name in [
            &b"MHPC"[..],
            b"MSCN",
            b"MCRS",
            b"MSTS",
            b"MTFY",
            b"M000",
            b"M007",
        ] {
            assert!(contains(&with, name), "{}", String::from_utf8_lossy(name));
        }
        assert!(!contains(&with, b"M008"), "only the slots asked for");
        let address = (super::super::MEMORY_HOTPLUG_ADDR as u32).to_le_bytes();
        assert!(contains(&with, &address));
    }

    /// `aml` in a DSDT, decompiled by ACPICA's iasl: its messages and the ASL, or None (the
    /// test skipped) where iasl is missing.
    fn decompile(aml: &[u8], tag: &str) -> Option<(std::process::ExitStatus, String, String)> {
        let found = std::process::Command::new("iasl")
            .arg("-v")
            .output()
            .is_ok();
        if !found {
            crate::test_skip::skip(tag, "iasl (acpica-tools) is not installed");
            return None;
        }
        let table = crate::boot::acpi::dsdt(aml);
        let dir = std::env::temp_dir().join(format!("exitless-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("dsdt.dat"), table).unwrap();
        let out = std::process::Command::new("iasl")
            .current_dir(&dir)
            .args(["-d", "dsdt.dat"])
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let dsl = std::fs::read_to_string(dir.join("dsdt.dsl")).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        Some((out.status, text, dsl))
    }

    /// The whole DSDT of a VM with PCI and hotplug decompiles with ACPICA's iasl without an
    /// error or a warning (what a guest OS's interpreter will load).
    #[test]
    fn the_dsdt_decompiles_cleanly_with_iasl() {
        let mut aml = crate::devices::pci::acpi::dsdt_aml();
        aml.extend(dsdt_aml(8, 0));
        let Some((status, text, dsl)) = decompile(&aml, "dsdt_iasl") else {
            return;
        };
        assert!(status.success(), "{text}");
        assert!(
            !text.contains("Error") && !text.contains("Warning"),
            "{text}"
        );
        for name in [
            "Device (\\_SB.GED)",
            "Method (_EVT",
            "Method (PCNT",
            "Device (S1F)",
            "Method (CSCN",
            "Device (C007)",
            "Device (\\_SB.PWRB)",
            "Notify (\\_SB.PWRB, 0x80)",
            "Name (_S5, Package (0x01)",
        ] {
            assert!(dsl.contains(name), "{name} missing from:\n{dsl}");
        }
        assert!(!dsl.contains("MHPC"), "no memory hotplug asked");
    }

    /// With memory hotplug: the controller, its slots and the GED's call of its scan.
    #[test]
    fn the_dsdt_with_memory_hotplug_decompiles_cleanly_with_iasl() {
        let mut aml = crate::devices::pci::acpi::dsdt_aml();
        aml.extend(dsdt_aml(2, 32));
        let Some((status, text, dsl)) = decompile(&aml, "dsdt_memory_iasl") else {
            return;
        };
        assert!(status.success(), "{text}");
        assert!(
            !text.contains("Error") && !text.contains("Warning"),
            "{text}"
        );
        for name in [
            "Device (\\_SB.MHPC)",
            "EisaId (\"PNP0C80\")",
            "Method (MSCN, 0, Serialized)",
            "Method (MCRS, 1, Serialized)",
            "QWordMemory",
            "CreateQWordField (MR64, \\_SB.MHPC.MCRS._Y00._MIN, MINA)",
            "While ((Local0 < 0x20))",
            "Device (M000)",
            "Device (M01F)",
            "\\_SB.MHPC.MSCN ()",
            "Notify (M01F, Arg1)",
        ] {
            assert!(dsl.contains(name), "{name} missing from:\n{dsl}");
        }
    }
}
