//! The DSDT's PCI slots: a device per slot in `\_SB_.PCI0` (`Sxx_`: `_ADR`, `_SUN`, `_EJ0`) and
//! `PCNT`, which notifies slots that came up (1, device check) and that are to go (3, eject
//! request). The same bytes for every VM, so they are built when exitless is compiled:
//! `vmm/build.rs` includes this file (it stands on `acpi_tables` and [`super::aml_encoding`]
//! only) and writes them where [`super::aml`] includes them; a test builds them again at run
//! time and compares.

use acpi_tables::aml::{self, Acquire, And, Device, If, Method, MethodCall, Name, Notify, Path};
use acpi_tables::aml::{Release, Scope, Store};
use acpi_tables::Aml;

use super::aml_encoding::{bytes, Encoded};

fn slot_name(slot: usize) -> String {
    format!("S{slot:02X}_")
}

/// A device per slot in `\_SB_.PCI0` and `PCNT`, which notifies them.
pub fn build(slots: usize) -> Vec<u8> {
    let mut children: Vec<Vec<u8>> = Vec::new();
    for slot in 1..slots {
        let adr = (slot << 16) as u32;
        let sun = slot as u32;
        let call = MethodCall::new("\\_SB_.PHPR.PCEJ".into(), vec![&sun, &aml::ZERO]);
        let ej0 = Method::new("_EJ0".into(), 1, false, vec![&call]);
        let (adr, sun) = (
            Name::new("_ADR".into(), &adr),
            Name::new("_SUN".into(), &sun),
        );
        let name: Path = slot_name(slot).as_str().into();
        children.push(bytes(&Device::new(name, vec![&adr, &sun, &ej0])));
    }
    children.push(notify_slots(slots));
    let children: Vec<Encoded> = children.into_iter().map(Encoded).collect();
    let refs: Vec<&dyn Aml> = children.iter().map(|c| c as &dyn Aml).collect();
    bytes(&Scope::new("\\_SB_.PCI0".into(), refs))
}

/// `DVNT(bits, event)`: notifies every slot whose bit is set; `PCNT`: slots up get 1
/// (device check), slots to go get 3 (eject request).
fn notify_slots(slots: usize) -> Vec<u8> {
    let masks: Vec<u32> = (1..slots).map(|s| 1u32 << s).collect();
    let tests: Vec<And> = masks
        .iter()
        .map(|m| And::new(&aml::ZERO, &aml::Arg(0), m))
        .collect();
    let names: Vec<Path> = (1..slots).map(|s| slot_name(s).as_str().into()).collect();
    let notifies: Vec<Notify> = names.iter().map(|n| Notify::new(n, &aml::Arg(1))).collect();
    let ifs: Vec<If> = tests
        .iter()
        .zip(&notifies)
        .map(|(t, n)| If::new(t, vec![n as &dyn Aml]))
        .collect();
    let dvnt = Method::new(
        "DVNT".into(),
        2,
        false,
        ifs.iter().map(|i| i as &dyn Aml).collect(),
    );
    let (pciu, pcid, three) = (
        Path::new("\\_SB_.PHPR.PCIU"),
        Path::new("\\_SB_.PHPR.PCID"),
        3u8,
    );
    let up = MethodCall::new("DVNT".into(), vec![&pciu, &aml::ONE]);
    let down = MethodCall::new("DVNT".into(), vec![&pcid, &three]);
    let acquire = Acquire::new("\\_SB_.PHPR.BLCK".into(), 0xffff);
    let pseg = Path::new("\\_SB_.PHPR.PSEG");
    let segment = Store::new(&pseg, &aml::ZERO);
    let release = Release::new("\\_SB_.PHPR.BLCK".into());
    let pcnt = Method::new(
        "PCNT".into(),
        0,
        true,
        vec![&acquire, &segment, &up, &down, &release],
    );
    let mut out = bytes(&dvnt);
    pcnt.to_aml_bytes(&mut out);
    out
}
