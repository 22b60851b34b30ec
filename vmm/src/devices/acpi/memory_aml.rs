//! The memory hotplug controller's part of the DSDT: `\_SB_.MHPC` with the controller's
//! registers, a memory device per slot (`M000`...: PNP0C80, `_STA` and `_CRS` read from the
//! controller) and the methods Linux's `acpi_memhotplug` reaches through them:
//!
//! - `MSTS(slot)`: the slot's `_STA` (0xF once it holds memory, else 0);
//! - `MCRS(slot)`: the slot's `_CRS`, one QWordMemory range of its base and length;
//! - `MSCN`: the scan the GED's `_EVT` calls, which notifies each slot being inserted with 1
//!   (device check: the OS evaluates `_STA` and `_CRS` and adds the memory) and
//!   acknowledges it;
//! - `MTFY(slot, event)`: `Notify` of slot `slot`'s device.
//!
//! There is no `_EJ0`: memory is never taken back.

use acpi_tables::aml::{
    self, Acquire, Add, AddressSpace, AddressSpaceCacheable, And, CreateQWordField, Device,
    EISAName, Equal, Field, FieldAccessType, FieldEntry, FieldLockRule, FieldUpdateRule, If,
    LessThan, Method, MethodCall, Mutex, Name, Notify, OpRegion, OpRegionSpace, Or, Path, Release,
    ResourceTemplate, Return, ShiftLeft, Store, Subtract, While,
};
use acpi_tables::Aml;

use super::memory_hotplug::{ENABLED, INSERTING, MEMORY_HOTPLUG_LEN};
use super::MEMORY_HOTPLUG_ADDR;

fn bytes(item: &dyn Aml) -> Vec<u8> {
    let mut out = Vec::new();
    item.to_aml_bytes(&mut out);
    out
}

/// AML already encoded.
struct Encoded(Vec<u8>);

impl Aml for Encoded {
    fn to_aml_bytes(&self, sink: &mut dyn acpi_tables::AmlSink) {
        sink.vec(&self.0);
    }
}

fn slot_name(slot: usize) -> String {
    format!("M{slot:03X}")
}

/// The OperationRegion on the controller and its fields.
fn registers() -> Vec<u8> {
    let region = OpRegion::new(
        "MHPR".into(),
        OpRegionSpace::SystemMemory,
        &(MEMORY_HOTPLUG_ADDR as usize),
        &(MEMORY_HOTPLUG_LEN as usize),
    );
    let dwords = Field::new(
        "MHPR".into(),
        FieldAccessType::DWord,
        FieldLockRule::NoLock,
        FieldUpdateRule::WriteAsZeroes,
        vec![
            FieldEntry::Named(*b"MSEL", 32),
            FieldEntry::Reserved(32),
            FieldEntry::Named(*b"MCNT", 32),
            FieldEntry::Reserved(32),
            FieldEntry::Named(*b"MHBL", 32),
            FieldEntry::Named(*b"MHBH", 32),
            FieldEntry::Named(*b"MHLL", 32),
            FieldEntry::Named(*b"MHLH", 32),
        ],
    );
    let status = Field::new(
        "MHPR".into(),
        FieldAccessType::Byte,
        FieldLockRule::NoLock,
        FieldUpdateRule::WriteAsZeroes,
        vec![FieldEntry::Reserved(32), FieldEntry::Named(*b"MSTA", 8)],
    );
    let mut out = bytes(&region);
    dwords.to_aml_bytes(&mut out);
    status.to_aml_bytes(&mut out);
    out
}

/// `MSTS(slot)`: 0xF if the slot holds memory, else 0.
fn status_method() -> Vec<u8> {
    let (acquire, release) = (
        Acquire::new("MLCK".into(), 0xffff),
        Release::new("MLCK".into()),
    );
    let (msel, msta) = (Path::new("MSEL"), Path::new("MSTA"));
    let select = Store::new(&msel, &aml::Arg(0));
    let absent = Store::new(&aml::Local(0), &aml::ZERO);
    let enabled = And::new(&aml::ZERO, &msta, &ENABLED);
    let on = Store::new(&aml::Local(0), &0x0fu8);
    let if_enabled = If::new(&enabled, vec![&on]);
    let result = Return::new(&aml::Local(0));
    bytes(&Method::new(
        "MSTS".into(),
        1,
        true,
        vec![&acquire, &select, &absent, &if_enabled, &release, &result],
    ))
}

/// `MCRS(slot)`: a QWordMemory descriptor of the slot's base and length (byte offsets 14, 22
/// and 38 of the descriptor hold its minimum, maximum and length).
fn resources_method() -> Vec<u8> {
    let (acquire, release) = (
        Acquire::new("MLCK".into(), 0xffff),
        Release::new("MLCK".into()),
    );
    let msel = Path::new("MSEL");
    let select = Store::new(&msel, &aml::Arg(0));
    let range = AddressSpace::new_memory(
        AddressSpaceCacheable::Cacheable,
        true,
        0u64,
        0xffff_ffff_ffff_fffeu64,
        None,
    );
    let template = ResourceTemplate::new(vec![&range]);
    let buffer = Name::new("MR64".into(), &template);
    let (mr64, min, max, len) = (
        Path::new("MR64"),
        Path::new("MINA"),
        Path::new("MAXA"),
        Path::new("LENA"),
    );
    let fields = [(&min, 14usize), (&max, 22), (&len, 38)];
    let creates: Vec<CreateQWordField> = fields
        .iter()
        .map(|(name, at)| CreateQWordField::new(*name, &mr64, at))
        .collect();
    let (high, low) = (Path::new("MHBH"), Path::new("MHBL"));
    let base_high = ShiftLeft::new(&aml::Local(0), &high, &32u8);
    let base = Or::new(&min, &aml::Local(0), &low);
    let (len_high, len_low) = (Path::new("MHLH"), Path::new("MHLL"));
    let length_high = ShiftLeft::new(&aml::Local(1), &len_high, &32u8);
    let length = Or::new(&len, &aml::Local(1), &len_low);
    let end = Add::new(&aml::Local(2), &min, &len);
    let last = Subtract::new(&max, &aml::Local(2), &aml::ONE);
    let result = Return::new(&mr64);
    let mut body: Vec<&dyn Aml> = vec![&acquire, &select, &buffer];
    body.extend(creates.iter().map(|c| c as &dyn Aml));
    body.extend([
        &base_high as &dyn Aml,
        &base,
        &length_high,
        &length,
        &end,
        &last,
        &release,
        &result,
    ]);
    bytes(&Method::new("MCRS".into(), 1, true, body))
}

/// `MTFY(slot, event)`: notifies slot `slot`'s device.
fn notify_method(slots: usize) -> Vec<u8> {
    let numbers: Vec<u32> = (0..slots as u32).collect();
    let names: Vec<Path> = (0..slots).map(|s| slot_name(s).as_str().into()).collect();
    let tests: Vec<Equal> = numbers
        .iter()
        .map(|n| Equal::new(&aml::Arg(0), n))
        .collect();
    let notifies: Vec<Notify> = names.iter().map(|n| Notify::new(n, &aml::Arg(1))).collect();
    let ifs: Vec<If> = tests
        .iter()
        .zip(&notifies)
        .map(|(t, n)| If::new(t, vec![n as &dyn Aml]))
        .collect();
    bytes(&Method::new(
        "MTFY".into(),
        2,
        true,
        ifs.iter().map(|i| i as &dyn Aml).collect(),
    ))
}

/// `MSCN`: every slot being inserted is notified (1, device check) and acknowledged.
fn scan_method(slots: usize) -> Vec<u8> {
    let (acquire, release) = (
        Acquire::new("MLCK".into(), 0xffff),
        Release::new("MLCK".into()),
    );
    let first = Store::new(&aml::Local(0), &aml::ZERO);
    let count = slots as u32;
    let more = LessThan::new(&aml::Local(0), &count);
    let (msel, msta) = (Path::new("MSEL"), Path::new("MSTA"));
    let select = Store::new(&msel, &aml::Local(0));
    let inserting = And::new(&aml::ZERO, &msta, &INSERTING);
    let check = MethodCall::new("MTFY".into(), vec![&aml::Local(0), &aml::ONE]);
    let ack = Store::new(&msta, &INSERTING);
    let if_inserting = If::new(&inserting, vec![&check, &ack]);
    let next = Add::new(&aml::Local(0), &aml::Local(0), &aml::ONE);
    let walk = While::new(&more, vec![&select, &if_inserting, &next]);
    bytes(&Method::new(
        "MSCN".into(),
        0,
        true,
        vec![&acquire, &first, &walk, &release],
    ))
}

/// Memory device `slot`: PNP0C80, its `_STA` and `_CRS` from the controller.
fn slot_device(slot: usize) -> Vec<u8> {
    let uid = slot as u32;
    let hid = EISAName::new("PNP0C80");
    let (hid, uid_name) = (
        Name::new("_HID".into(), &hid),
        Name::new("_UID".into(), &uid),
    );
    let sta_call = MethodCall::new("MSTS".into(), vec![&uid]);
    let sta_value = Return::new(&sta_call);
    let sta = Method::new("_STA".into(), 0, false, vec![&sta_value]);
    let crs_call = MethodCall::new("MCRS".into(), vec![&uid]);
    let crs_value = Return::new(&crs_call);
    let crs = Method::new("_CRS".into(), 0, false, vec![&crs_value]);
    bytes(&Device::new(
        slot_name(slot).as_str().into(),
        vec![&hid, &uid_name, &sta, &crs],
    ))
}

/// `\_SB_.MHPC` for a controller of `slots` slots.
pub fn memory_controller(slots: usize) -> Vec<u8> {
    let hid = EISAName::new("PNP0A06");
    let mut children = vec![
        bytes(&Name::new("_HID".into(), &hid)),
        bytes(&Name::new("_UID".into(), &"Memory Hotplug Controller")),
        bytes(&Name::new("_STA".into(), &0x0bu8)),
        bytes(&Mutex::new("MLCK".into(), 0)),
        registers(),
        status_method(),
        resources_method(),
        notify_method(slots),
        scan_method(slots),
    ];
    children.extend((0..slots).map(slot_device));
    let children: Vec<Encoded> = children.into_iter().map(Encoded).collect();
    let refs: Vec<&dyn Aml> = children.iter().map(|c| c as &dyn Aml).collect();
    bytes(&Device::new("\\_SB_.MHPC".into(), refs))
}
