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

use super::aml_encoding::{bytes, Encoded};
use super::memory_hotplug::{ENABLED, INSERTING, MEMORY_HOTPLUG_LEN};
use super::MEMORY_HOTPLUG_ADDR;
use crate::memory::hotplug::MAX_MEMORY_SLOTS;

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

/// A slot number always encoded as BytePrefix and one byte (acpi_tables encodes 0 and 1 as
/// ZeroOp and OneOp): every slot's AML then has the same shape and length.
struct SlotNumber(u8);

const BYTE_PREFIX: u8 = 0x0a;

impl Aml for SlotNumber {
    fn to_aml_bytes(&self, sink: &mut dyn acpi_tables::AmlSink) {
        sink.byte(BYTE_PREFIX);
        sink.byte(self.0);
    }
}

/// Where a slot's name and number go in [`per_slot`]'s template.
const NAME_MARK: &str = "MXXX";
const NUMBER_MARK: u8 = 0xee;
const _: () = assert!(MAX_MEMORY_SLOTS < NUMBER_MARK as usize);

fn positions(haystack: &[u8], needle: &[u8]) -> Vec<usize> {
    let windows = haystack.windows(needle.len()).enumerate();
    windows
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| i)
        .collect()
}

/// `make`'s AML for every slot, one after the other: encoded once with marks, then each
/// slot's name and number put in their place. Every VM's start-up builds the DSDT; this keeps
/// 32 slots at the cost of one (a slot through acpi_tables costs ~7 us of CPU here).
fn per_slot(slots: usize, make: fn(&str, &SlotNumber) -> Vec<u8>) -> Vec<u8> {
    let template = make(NAME_MARK, &SlotNumber(NUMBER_MARK));
    let names = positions(&template, NAME_MARK.as_bytes());
    let numbers = positions(&template, &[BYTE_PREFIX, NUMBER_MARK]);
    let mut out = Vec::with_capacity(template.len() * slots);
    for slot in 0..slots.min(MAX_MEMORY_SLOTS) {
        let this = out.len();
        out.extend_from_slice(&template);
        for &at in &names {
            out[this + at..this + at + 4].copy_from_slice(slot_name(slot).as_bytes());
        }
        for &at in &numbers {
            out[this + at + 1] = slot as u8;
        }
    }
    out
}

/// `If (Arg0 == number) { Notify (name, Arg1) }`: one slot's part of `MTFY`.
fn notify_slot(name: &str, number: &SlotNumber) -> Vec<u8> {
    let path: Path = name.into();
    let notify = Notify::new(&path, &aml::Arg(1));
    bytes(&If::new(&Equal::new(&aml::Arg(0), number), vec![&notify]))
}

/// `MTFY(slot, event)`: notifies slot `slot`'s device.
fn notify_method(slots: usize) -> Vec<u8> {
    let ifs = Encoded(per_slot(slots, notify_slot));
    bytes(&Method::new("MTFY".into(), 2, true, vec![&ifs]))
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

/// Memory device `name`, slot `number`: PNP0C80, its `_STA` and `_CRS` from the controller.
fn slot_device(name: &str, number: &SlotNumber) -> Vec<u8> {
    let uid = number;
    let hid = EISAName::new("PNP0C80");
    let (hid, uid_name) = (
        Name::new("_HID".into(), &hid),
        Name::new("_UID".into(), uid),
    );
    let sta_call = MethodCall::new("MSTS".into(), vec![uid]);
    let sta_value = Return::new(&sta_call);
    let sta = Method::new("_STA".into(), 0, false, vec![&sta_value]);
    let crs_call = MethodCall::new("MCRS".into(), vec![uid]);
    let crs_value = Return::new(&crs_call);
    let crs = Method::new("_CRS".into(), 0, false, vec![&crs_value]);
    bytes(&Device::new(name.into(), vec![&hid, &uid_name, &sta, &crs]))
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
    children.push(per_slot(slots, slot_device));
    let children: Vec<Encoded> = children.into_iter().map(Encoded).collect();
    let refs: Vec<&dyn Aml> = children.iter().map(|c| c as &dyn Aml).collect();
    bytes(&Device::new("\\_SB_.MHPC".into(), refs))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The template's copies are exactly what encoding each slot on its own gives.
    #[test]
    fn every_slot_is_encoded_as_if_on_its_own() {
        for make in [slot_device as fn(&str, &SlotNumber) -> Vec<u8>, notify_slot] {
            let one_by_one: Vec<u8> = (0..MAX_MEMORY_SLOTS)
                .flat_map(|s| make(&slot_name(s), &SlotNumber(s as u8)))
                .collect();
            assert_eq!(per_slot(MAX_MEMORY_SLOTS, make), one_by_one);
        }
        assert!(per_slot(0, slot_device).is_empty());
    }
}
