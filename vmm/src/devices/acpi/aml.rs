//! The hotplug controllers' part of the DSDT, through `acpi_tables`' AML:
//!
//! - `\_SB_.GED_` (ACPI0013) with its interrupt and `_EVT`, which reads the GED register and
//!   calls the CPU, PCI and (with memory hotplug) memory scans;
//! - `\_SB_.PHPR`, the PCI hotplug controller's registers, `PCEJ` (eject) and `PSCN` (scan);
//! - in `\_SB_.PCI0`, a device per slot (`Sxx_`: `_ADR`, `_SUN`, `_EJ0`) and `PCNT`, which
//!   notifies slots that came up (1, device check) and that are to go (3, eject request);
//! - `\_SB_.CPUS` (ACPI0010) with a device per possible CPU (ACPI0007: `_UID`, `_STA` and
//!   `_EJ0` through the CPU controller, `_MAT` its MADT entry) and `CSCN`, the CPU scan;
//! - with memory hotplug, `\_SB_.MHPC` ([`super::memory_aml`]).

use acpi_tables::aml::{
    self, Acquire, And, BufferData, Device, EISAName, Field, FieldAccessType, FieldEntry,
    FieldLockRule, FieldUpdateRule, If, Interrupt, Method, MethodCall, Mutex, Name, Notify,
    OpRegion, OpRegionSpace, Package, Path, Release, ResourceTemplate, Return, ShiftLeft, Store,
};
use acpi_tables::Aml;

use super::aml_encoding::{bytes, Encoded};
use super::cpu_hotplug::{EJECT, INSERTING, PRESENT, REMOVING};
use super::ged::{CPU_CHANGED, MEMORY_CHANGED, PCI_CHANGED, POWER_BUTTON};
use super::sleep::S5_SLEEP_TYPE;
use super::{CPU_HOTPLUG_ADDR, CPU_HOTPLUG_LEN, GED_ADDR, GED_GSI, PCI_HOTPLUG_ADDR};

fn encoded(parts: Vec<Vec<u8>>) -> Vec<Encoded> {
    parts.into_iter().map(Encoded).collect()
}

/// The GED: its interrupt, its register and `_EVT` (which scans memory slots too if
/// `memory` is set).
fn ged(memory: bool) -> Vec<u8> {
    let irq = Interrupt::new(true, true, false, false, GED_GSI);
    let crs = ResourceTemplate::new(vec![&irq]);
    let region = OpRegion::new(
        "GDST".into(),
        OpRegionSpace::SystemMemory,
        &(GED_ADDR as usize),
        &1usize,
    );
    let field = Field::new(
        "GDST".into(),
        FieldAccessType::Byte,
        FieldLockRule::NoLock,
        FieldUpdateRule::WriteAsZeroes,
        vec![FieldEntry::Named(*b"GDAT", 8)],
    );
    let cpu = And::new(&aml::ZERO, &aml::Local(0), &CPU_CHANGED);
    let pci = And::new(&aml::ZERO, &aml::Local(0), &PCI_CHANGED);
    let cscn = MethodCall::new("\\_SB_.CPUS.CSCN".into(), vec![]);
    let pscn = MethodCall::new("\\_SB_.PHPR.PSCN".into(), vec![]);
    let gdat = Path::new("GDAT");
    let read = Store::new(&aml::Local(0), &gdat);
    let (if_cpu, if_pci) = (If::new(&cpu, vec![&cscn]), If::new(&pci, vec![&pscn]));
    let mem = And::new(&aml::ZERO, &aml::Local(0), &MEMORY_CHANGED);
    let mscn = MethodCall::new("\\_SB_.MHPC.MSCN".into(), vec![]);
    let if_mem = If::new(&mem, vec![&mscn]);
    let button = And::new(&aml::ZERO, &aml::Local(0), &POWER_BUTTON);
    let pwrb = Path::new("\\_SB_.PWRB");
    let press = Notify::new(&pwrb, &0x80u8);
    let if_button = If::new(&button, vec![&press]);
    let mut body: Vec<&dyn Aml> = vec![&read, &if_cpu, &if_pci, &if_button];
    if memory {
        body.push(&if_mem);
    }
    let evt = Method::new("_EVT".into(), 1, true, body);
    let hid = Name::new("_HID".into(), &"ACPI0013");
    let (uid, crs) = (
        Name::new("_UID".into(), &aml::ZERO),
        Name::new("_CRS".into(), &crs),
    );
    bytes(&Device::new(
        "\\_SB_.GED_".into(),
        vec![&hid, &uid, &crs, &region, &field, &evt],
    ))
}

/// The power button (`\_SB_.PWRB`, PNP0C0C, notified 0x80 by `_EVT` when pressed) and
/// `\_S5_`, the sleep type a guest writes to the sleep control register to power off
/// ([`super::sleep`]).
fn power() -> Vec<u8> {
    let hid = Name::new("_HID".into(), &EISAName::new("PNP0C0C"));
    let uid = Name::new("_UID".into(), &aml::ZERO);
    let mut out = bytes(&Device::new("\\_SB_.PWRB".into(), vec![&hid, &uid]));
    let s5 = Package::new(vec![&S5_SLEEP_TYPE]);
    out.extend(bytes(&Name::new("_S5_".into(), &s5)));
    out
}

/// The PCI hotplug controller: registers, eject and scan.
fn pci_controller() -> Vec<u8> {
    let region = OpRegion::new(
        "PCST".into(),
        OpRegionSpace::SystemMemory,
        &(PCI_HOTPLUG_ADDR as usize),
        &16usize,
    );
    let field = Field::new(
        "PCST".into(),
        FieldAccessType::DWord,
        FieldLockRule::NoLock,
        FieldUpdateRule::WriteAsZeroes,
        vec![
            FieldEntry::Named(*b"PCIU", 32),
            FieldEntry::Named(*b"PCID", 32),
            FieldEntry::Named(*b"B0EJ", 32),
            FieldEntry::Named(*b"PSEG", 32),
        ],
    );
    let (pseg, b0ej) = (Path::new("PSEG"), Path::new("B0EJ"));
    let acquire = Acquire::new("BLCK".into(), 0xffff);
    let segment = Store::new(&pseg, &aml::Arg(1));
    let eject = ShiftLeft::new(&b0ej, &aml::ONE, &aml::Arg(0));
    let release = Release::new("BLCK".into());
    let done = Return::new(&aml::ZERO);
    let pcej = Method::new(
        "PCEJ".into(),
        2,
        true,
        vec![&acquire, &segment, &eject, &release, &done],
    );
    let hid = EISAName::new("PNP0A06");
    let lock = Mutex::new("BLCK".into(), 0);
    let scan = MethodCall::new("\\_SB_.PCI0.PCNT".into(), vec![]);
    let pscn = Method::new("PSCN".into(), 0, true, vec![&scan]);
    let (hid, uid) = (
        Name::new("_HID".into(), &hid),
        Name::new("_UID".into(), &"PCI Hotplug Controller"),
    );
    let sta = Name::new("_STA".into(), &0x0bu8);
    bytes(&Device::new(
        "\\_SB_.PHPR".into(),
        vec![&hid, &uid, &sta, &lock, &region, &field, &pcej, &pscn],
    ))
}

/// The slots' part of the DSDT (a device per slot in `\_SB_.PCI0`, and `PCNT`, which notifies
/// them), the same for every VM: built when exitless is compiled (`vmm/build.rs` runs
/// [`super::pci_slots_aml`]); built at run time it cost 0.10-0.2 ms of CPU a start, on the head
/// start's thread or the main thread (docs/performance.md).
static PCI_SLOTS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/pci_slots.aml"));

fn pci_slots() -> &'static [u8] {
    PCI_SLOTS
}

fn cpu_name(id: u8) -> String {
    format!("C{id:03X}")
}

/// `\_SB_.CPUS`: the CPU controller's registers, `CSTS` (a CPU's `_STA`), `CEJ0` (eject),
/// `CSCN` (the scan) and a device per possible CPU.
fn cpus(max: u8) -> Vec<u8> {
    let region = OpRegion::new(
        "PRST".into(),
        OpRegionSpace::SystemMemory,
        &(CPU_HOTPLUG_ADDR as usize),
        &(CPU_HOTPLUG_LEN as usize),
    );
    let field = Field::new(
        "PRST".into(),
        FieldAccessType::Byte,
        FieldLockRule::NoLock,
        FieldUpdateRule::WriteAsZeroes,
        vec![
            FieldEntry::Named(*b"CSEL", 32),
            FieldEntry::Named(*b"CSTA", 8),
        ],
    );
    let (csta, csel, lock) = (Path::new("CSTA"), Path::new("CSEL"), "CPLK");
    let present = And::new(&aml::ZERO, &csta, &PRESENT);
    let (acquire, release) = (Acquire::new(lock.into(), 0xffff), Release::new(lock.into()));
    let select = Store::new(&csel, &aml::Arg(0));
    let absent = Store::new(&aml::Local(0), &aml::ZERO);
    let on = Store::new(&aml::Local(0), &0x0fu8);
    let if_present = If::new(&present, vec![&on]);
    let result = Return::new(&aml::Local(0));
    let sta = Method::new(
        "CSTS".into(),
        1,
        true,
        vec![&acquire, &select, &absent, &if_present, &release, &result],
    );
    let eject = Store::new(&csta, &EJECT);
    let ej0 = Method::new(
        "CEJ0".into(),
        1,
        true,
        vec![&acquire, &select, &eject, &release],
    );
    let cid = EISAName::new("PNP0A05");
    let mut children = vec![
        bytes(&Name::new("_HID".into(), &"ACPI0010")),
        bytes(&Name::new("_CID".into(), &cid)),
        bytes(&Mutex::new(lock.into(), 0)),
        bytes(&region),
        bytes(&field),
        bytes(&sta),
        bytes(&ej0),
        cpu_scan(max),
    ];
    children.extend((0..max).map(cpu_device));
    let children = encoded(children);
    let refs: Vec<&dyn Aml> = children.iter().map(|c| c as &dyn Aml).collect();
    bytes(&Device::new("\\_SB_.CPUS".into(), refs))
}

/// `CSCN`: for each CPU, an insert is notified (1) and acknowledged, a removal request
/// notified (3, eject request) and acknowledged.
fn cpu_scan(max: u8) -> Vec<u8> {
    let (csta, csel) = (Path::new("CSTA"), Path::new("CSEL"));
    let inserting = And::new(&aml::ZERO, &aml::Local(0), &INSERTING);
    let removing = And::new(&aml::ZERO, &aml::Local(0), &REMOVING);
    let mut body: Vec<Vec<u8>> = vec![bytes(&Acquire::new("CPLK".into(), 0xffff))];
    for id in 0..max {
        let name: Path = cpu_name(id).as_str().into();
        let (check, eject) = (Notify::new(&name, &aml::ONE), Notify::new(&name, &3u8));
        let ack_insert = Store::new(&csta, &INSERTING);
        let ack_remove = Store::new(&csta, &REMOVING);
        body.push(bytes(&Store::new(&csel, &id)));
        body.push(bytes(&Store::new(&aml::Local(0), &csta)));
        body.push(bytes(&If::new(&inserting, vec![&check, &ack_insert])));
        body.push(bytes(&If::new(&removing, vec![&eject, &ack_remove])));
    }
    body.push(bytes(&Release::new("CPLK".into())));
    let body = encoded(body);
    let refs: Vec<&dyn Aml> = body.iter().map(|c| c as &dyn Aml).collect();
    bytes(&Method::new("CSCN".into(), 0, true, refs))
}

/// One CPU: `_STA` and `_EJ0` through the controller, `_MAT` its MADT Local APIC entry.
fn cpu_device(id: u8) -> Vec<u8> {
    let uid = u32::from(id);
    let sta_call = MethodCall::new("CSTS".into(), vec![&uid]);
    let sta_value = Return::new(&sta_call);
    let sta = Method::new("_STA".into(), 0, false, vec![&sta_value]);
    let ej0_call = MethodCall::new("CEJ0".into(), vec![&uid]);
    let ej0 = Method::new("_EJ0".into(), 1, false, vec![&ej0_call]);
    // Type 0 (Processor Local APIC), length 8, UID, APIC ID, flags: enabled.
    let entry = BufferData::new(vec![0, 8, id, id, 1, 0, 0, 0]);
    let mat_value = Return::new(&entry);
    let mat = Method::new("_MAT".into(), 0, false, vec![&mat_value]);
    let (hid, uid) = (
        Name::new("_HID".into(), &"ACPI0007"),
        Name::new("_UID".into(), &uid),
    );
    bytes(&Device::new(
        cpu_name(id).as_str().into(),
        vec![&hid, &uid, &sta, &mat, &ej0],
    ))
}

/// Everything the hotplug controllers add to the DSDT, for a VM of up to `max_vcpus` and
/// `memory_slots` memory hotplug slots (0: no memory hotplug); the PCI parts go after
/// `\_SB_.PCI0` (its slots are added to it by scope).
pub fn dsdt_aml(max_vcpus: u8, memory_slots: usize) -> Vec<u8> {
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

    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        haystack.windows(needle.len()).any(|w| w == needle)
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
