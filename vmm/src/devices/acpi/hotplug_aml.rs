//! The hotplug controllers' AML, built with `acpi_tables` (the layout in [`super::layout`]):
//!
//! - `\_SB_.GED_` (ACPI0013) with its interrupt and `_EVT`, which reads the GED register and
//!   calls the CPU, PCI and (with memory hotplug) memory scans;
//! - `\_SB_.PWRB` and `\_S5_`;
//! - `\_SB_.PHPR`, the PCI hotplug controller's registers, `PCEJ` (eject) and `PSCN` (scan);
//! - `\_SB_.CPUS` (ACPI0010) with a device per possible CPU (ACPI0007: `_UID`, `_STA` and
//!   `_EJ0` through the CPU controller, `_MAT` its MADT entry) and `CSCN`, the CPU scan.
//!
//! Self-contained (it stands on `acpi_tables`, [`super::aml_encoding`] and [`super::layout`]
//! only): `vmm/build.rs` includes it to build the DSDT of the common VMs when exitless is
//! compiled ([`super::aml`] holds them), and [`super::aml`] calls it for the others.

use acpi_tables::aml::{
    self, Acquire, And, BufferData, Device, EISAName, Field, FieldAccessType, FieldEntry,
    FieldLockRule, FieldUpdateRule, If, Interrupt, Method, MethodCall, Mutex, Name, Notify,
    OpRegion, OpRegionSpace, Package, Path, Release, ResourceTemplate, Return, ShiftLeft, Store,
};
use acpi_tables::Aml;

use super::aml_encoding::{bytes, Encoded};
use super::layout::{CPU_CHANGED, MEMORY_CHANGED, PCI_CHANGED, POWER_BUTTON};
use super::layout::{CPU_HOTPLUG_ADDR, CPU_HOTPLUG_LEN, GED_ADDR, GED_GSI, PCI_HOTPLUG_ADDR};
use super::layout::{EJECT, INSERTING, PRESENT, REMOVING, S5_SLEEP_TYPE};

fn encoded(parts: Vec<Vec<u8>>) -> Vec<Encoded> {
    parts.into_iter().map(Encoded).collect()
}

/// The GED: its interrupt, its register and `_EVT` (which scans memory slots too if
/// `memory` is set).
pub fn ged(memory: bool) -> Vec<u8> {
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
pub fn power() -> Vec<u8> {
    let hid = Name::new("_HID".into(), &EISAName::new("PNP0C0C"));
    let uid = Name::new("_UID".into(), &aml::ZERO);
    let mut out = bytes(&Device::new("\\_SB_.PWRB".into(), vec![&hid, &uid]));
    let s5 = Package::new(vec![&S5_SLEEP_TYPE]);
    out.extend(bytes(&Name::new("_S5_".into(), &s5)));
    out
}

/// The PCI hotplug controller: registers, eject and scan.
pub fn pci_controller() -> Vec<u8> {
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

fn cpu_name(id: u8) -> String {
    format!("C{id:03X}")
}

/// `\_SB_.CPUS`: the CPU controller's registers, `CSTS` (a CPU's `_STA`), `CEJ0` (eject),
/// `CSCN` (the scan) and a device per possible CPU.
pub fn cpus(max: u8) -> Vec<u8> {
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
