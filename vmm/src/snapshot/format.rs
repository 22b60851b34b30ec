//! `state.json`: what a snapshot holds besides the config and the memory (docs/snapshot.md,
//! "The files"). It is read as hostile input: its size is bounded, every field is checked
//! (structures at their exact size, counts within KVM's limits, memory regions inside the
//! layout), and a CRC-32 over its content catches a damaged or edited file. Any failure is one
//! line, never a panic (the `snapshot_state` fuzz target).

use std::collections::BTreeMap;

use kvm_bindings::{kvm_cpuid_entry2, kvm_msr_entry};
use kvm_ioctls::KvmNestedStateBuffer;
use serde::{Deserialize, Serialize};

use super::blob::Blob;
use super::SnapshotError;
use crate::kvm::state::{VcpuKvmState, VmKvmState, XSAVE_LEGACY_SIZE};

/// The layout of `state.json` this exitless writes and reads; any change that an older
/// exitless could misread takes a new number.
pub const FORMAT_VERSION: u32 = 1;
/// The largest `state.json` read (a 254-vCPU VM's is well under it).
pub const MAX_STATE_BYTES: u64 = 64 << 20;
/// Most CPUID entries (KVM_MAX_CPUID_ENTRIES), MSRs and XSAVE bytes a vCPU may carry.
const MAX_CPUID_ENTRIES: usize = kvm_bindings::KVM_MAX_CPUID_ENTRIES;
const MAX_MSRS: usize = 1024;
const MAX_XSAVE: usize = 1 << 20;
const MAX_REGIONS: usize = 64;
const MAX_DEVICES: usize = 256;

/// `version`: the format, and the exitless that wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Version {
    pub format: u32,
    pub exitless: String,
}

impl Version {
    pub fn current() -> Self {
        Version {
            format: FORMAT_VERSION,
            exitless: env!("CARGO_PKG_VERSION").to_string(),
        }
    }
}

/// A CPUID register.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Register {
    Eax,
    Ebx,
    Ecx,
    Edx,
}

/// One CPUID feature word the guest saw: the bits of `register` of `leaf`.`subleaf`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureWord {
    pub leaf: u32,
    pub subleaf: u32,
    pub register: Register,
    pub bits: u32,
}

/// `cpu`: the host CPU as the guest saw it, checked against a restoring host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuSection {
    /// CPUID leaf 0's vendor string.
    pub vendor: String,
    pub features: Vec<FeatureWord>,
}

/// One CPUID entry (KVM's `kvm_cpuid_entry2` without its padding).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuidEntry {
    pub function: u32,
    pub index: u32,
    pub flags: u32,
    pub eax: u32,
    pub ebx: u32,
    pub ecx: u32,
    pub edx: u32,
}

/// One MSR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Msr {
    pub index: u32,
    pub value: u64,
}

/// One vCPU (`vcpus[]`): KVM's structures as [`Blob`]s, CPUID and MSRs as lists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VcpuState {
    pub id: u8,
    pub cpuid: Vec<CpuidEntry>,
    pub regs: Blob,
    pub sregs: Blob,
    pub xsave: Blob,
    pub xcrs: Blob,
    pub debugregs: Blob,
    pub lapic: Blob,
    pub msrs: Vec<Msr>,
    pub mp_state: u32,
    pub events: Blob,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tsc_khz: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nested: Option<Blob>,
}

/// `vm`: the in-kernel irqchip, PIT and clock, and the vCPU topology.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmSection {
    /// vCPUs the guest's topology counts (its ACPI tables list that many).
    pub max_vcpus: u8,
    pub pic_master: Blob,
    pub pic_slave: Blob,
    pub ioapic: Blob,
    pub pit: Blob,
    pub clock: Blob,
}

/// Where a region's bytes are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "in", rename_all = "snake_case", deny_unknown_fields)]
pub enum RegionSource {
    /// In the snapshot's memory file ([`super::MEMORY_FILE`]) from `offset`.
    SnapshotFile { offset: u64 },
    /// In the file of memory zone `zone` of the config (a VM template's memory, shared with
    /// its file), from `offset`.
    Zone { zone: String, offset: u64 },
}

/// One region of guest RAM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegionState {
    pub gpa: u64,
    pub size: u64,
    pub source: RegionSource,
}

/// `memory`: the RAM's size and where each region's bytes are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemorySection {
    pub size: u64,
    /// Of `size`, the bytes hot-added while the VM ran (`vm.resize desired_ram`): regions
    /// above the RAM the VM booted with, in its hotplug area (0 and absent when none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hotplugged: u64,
    /// The memory file's length (0 when every region is in a zone's file).
    pub file_size: u64,
    pub regions: Vec<RegionState>,
}

/// One device's saved state (`devices[id]`), written and read by the device itself
/// ([`super::Snapshottable`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceEntry {
    pub kind: String,
    pub state: serde_json::Value,
    /// What the device saved beside its state ([`super::Snapshottable::take_data`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<DeviceData>,
    /// A PCI function's place (slot and BAR window), where the restored VM puts it: devices
    /// added and removed while the VM ran leave places that the config's order does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci: Option<PciPlace>,
}

/// A device's bytes beyond its JSON state, in a file of the snapshot's directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceData {
    /// The file's name in the snapshot's directory (`device-<id>.bin`).
    pub file: String,
    pub size: u64,
    /// `crc32:` and 8 hex digits of the bytes.
    pub crc32: String,
    /// The bytes, between the device and the file (not in `state.json`).
    #[serde(skip)]
    pub bytes: Vec<u8>,
}

/// Where a PCI function was: its slot on bus 0 and the BAR address it was given (the guest
/// may have moved the BAR since: its saved state says where to).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PciPlace {
    pub slot: u8,
    pub bar: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// The whole of `state.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotState {
    pub version: Version,
    /// `crc32:` and 8 hex digits over the file written with this field empty.
    pub checksum: String,
    pub cpu: CpuSection,
    pub vcpus: Vec<VcpuState>,
    pub vm: VmSection,
    pub memory: MemorySection,
    /// Each device's state by its id.
    pub devices: BTreeMap<String, DeviceEntry>,
}

/// Only the version, read first: a file of another format need not parse as this one.
#[derive(Deserialize)]
struct VersionOnly {
    version: Version,
}

fn corrupt(reason: impl Into<String>) -> SnapshotError {
    SnapshotError::Corrupt(reason.into())
}

impl SnapshotState {
    /// The file's text, with its checksum filled in: encoded once with the checksum empty,
    /// whose CRC-32 then goes in its place (what [`written_checksum_matches`] reads back).
    pub fn to_json(&mut self) -> Result<String, SnapshotError> {
        self.checksum.clear();
        let mut text =
            serde_json::to_string(self).map_err(|e| SnapshotError::Encode(e.to_string()))?;
        // The first such field is the file's own: it follows `version`, exitless's strings.
        let field = "\"checksum\":\"\"";
        let at = text
            .find(field)
            .ok_or_else(|| SnapshotError::Encode("no checksum field".into()))?;
        self.checksum = format!("crc32:{:08x}", crc32fast::hash(text.as_bytes()));
        text.insert_str(at + field.len() - 1, &self.checksum);
        Ok(text)
    }

    /// Parses and checks `state.json`'s bytes: its version, its shape, its checksum and
    /// every field. A file that does not parse is read for its version alone (a file of
    /// another format need not parse as this one), which is refused first.
    pub fn parse(bytes: &[u8]) -> Result<Self, SnapshotError> {
        if bytes.len() as u64 > MAX_STATE_BYTES {
            return Err(corrupt(format!(
                "it is {} bytes, more than the {MAX_STATE_BYTES} a state file may have",
                bytes.len()
            )));
        }
        let state = match serde_json::from_slice::<SnapshotState>(bytes) {
            Ok(state) => state,
            Err(e) => {
                let version: VersionOnly =
                    serde_json::from_slice(bytes).map_err(|e| json_error(&e))?;
                check_version(&version.version)?;
                return Err(json_error(&e));
            }
        };
        check_version(&state.version)?;
        if !written_checksum_matches(bytes, &state.checksum)
            && checksum_of(&state)? != state.checksum
        {
            return Err(SnapshotError::Checksum);
        }
        state.validate()?;
        Ok(state)
    }

    /// The checks beyond the shape: counts, ids, sizes, the memory layout ([`Self::parse`]
    /// makes them after the checksum's).
    pub fn validate(&self) -> Result<(), SnapshotError> {
        let n = self.vcpus.len();
        if n == 0 || n > crate::config::MAX_VCPUS {
            return Err(corrupt(format!("it has {n} vCPUs")));
        }
        if usize::from(self.vm.max_vcpus) < n {
            return Err(corrupt("vm.max_vcpus is below the vCPUs it has"));
        }
        // Ids ascend and stay below the topology's (vCPUs added or removed leave gaps).
        let mut next = 0u8;
        for (i, v) in self.vcpus.iter().enumerate() {
            if v.id < next || v.id >= self.vm.max_vcpus {
                return Err(corrupt(format!("vcpus[{i}] has id {}", v.id)));
            }
            next = v.id.saturating_add(1);
            v.to_kvm()
                .map_err(|e| corrupt(format!("vcpus[{i}]: {e}")))?;
        }
        self.vm.to_kvm().map_err(|e| corrupt(format!("vm: {e}")))?;
        self.memory
            .validate()
            .map_err(|e| corrupt(format!("memory: {e}")))?;
        let slots = self.devices.values().filter_map(|d| d.pci.map(|p| p.slot));
        let mut seen = 0u32;
        for slot in slots {
            if slot == 0 || slot >= 32 || seen & (1 << slot) != 0 {
                return Err(corrupt(format!("a device in PCI slot {slot}")));
            }
            seen |= 1 << slot;
        }
        if self.devices.len() > MAX_DEVICES {
            return Err(corrupt(format!("it has {} devices", self.devices.len())));
        }
        if let Some(id) = self
            .devices
            .keys()
            .find(|id| id.is_empty() || id.len() > 256)
        {
            return Err(corrupt(format!("a device id of {} bytes", id.len())));
        }
        Ok(())
    }
}

/// A state of another format is refused by its version.
fn check_version(v: &Version) -> Result<(), SnapshotError> {
    match v.format == FORMAT_VERSION {
        true => Ok(()),
        false => Err(SnapshotError::Version {
            found: v.format,
            by: v.exitless.clone(),
        }),
    }
}

/// serde's message, with where in the file.
fn json_error(e: &serde_json::Error) -> SnapshotError {
    corrupt(format!(
        "{} (line {}, column {})",
        e.to_string()
            .split(" at line ")
            .next()
            .unwrap_or("invalid JSON"),
        e.line(),
        e.column()
    ))
}

/// Whether `bytes` are the file as exitless writes it (compact, fields in order) and hold
/// `checksum`: their CRC-32 with the checksum's value blanked is `checksum`. This is what
/// [`checksum_of`] computes without encoding the parsed state again (0.3 ms of a restore's
/// CPU on the development host, for a 23 KB file). A file reformatted since, or damaged,
/// does not match and is checked by [`checksum_of`].
fn written_checksum_matches(bytes: &[u8], checksum: &str) -> bool {
    let field = format!("\"checksum\":\"{checksum}\"");
    // A substring search, not a comparison at every byte offset (this runs in a migration's
    // downtime).
    let Some(at) = std::str::from_utf8(bytes).ok().and_then(|t| t.find(&field)) else {
        return false;
    };
    let value = at + "\"checksum\":\"".len();
    let mut crc = crc32fast::Hasher::new();
    crc.update(&bytes[..value]);
    crc.update(&bytes[value + checksum.len()..]);
    format!("crc32:{:08x}", crc.finalize()) == checksum
}

/// The CRC-32 of `state` written with an empty checksum.
fn checksum_of(state: &SnapshotState) -> Result<String, SnapshotError> {
    let mut blank = state.clone();
    blank.checksum.clear();
    let text = serde_json::to_vec(&blank).map_err(|e| SnapshotError::Encode(e.to_string()))?;
    Ok(format!("crc32:{:08x}", crc32fast::hash(&text)))
}

impl From<&kvm_cpuid_entry2> for CpuidEntry {
    fn from(e: &kvm_cpuid_entry2) -> Self {
        CpuidEntry {
            function: e.function,
            index: e.index,
            flags: e.flags,
            eax: e.eax,
            ebx: e.ebx,
            ecx: e.ecx,
            edx: e.edx,
        }
    }
}

impl From<&CpuidEntry> for kvm_cpuid_entry2 {
    fn from(e: &CpuidEntry) -> Self {
        kvm_cpuid_entry2 {
            function: e.function,
            index: e.index,
            flags: e.flags,
            eax: e.eax,
            ebx: e.ebx,
            ecx: e.ecx,
            edx: e.edx,
            ..Default::default()
        }
    }
}

impl VcpuState {
    /// vCPU `id`'s saved form.
    pub fn from_kvm(id: u8, s: &VcpuKvmState) -> Self {
        VcpuState {
            id,
            cpuid: s.cpuid.iter().map(CpuidEntry::from).collect(),
            regs: Blob::of(&s.regs),
            sregs: Blob::of(&s.sregs),
            xsave: Blob(s.xsave.clone()),
            xcrs: Blob::of(&s.xcrs),
            debugregs: Blob::of(&s.debugregs),
            lapic: Blob::of(&s.lapic),
            msrs: s
                .msrs
                .iter()
                .map(|m| Msr {
                    index: m.index,
                    value: m.data,
                })
                .collect(),
            mp_state: s.mp_state.mp_state,
            events: Blob::of(&s.events),
            tsc_khz: s.tsc_khz,
            nested: s.nested.as_ref().map(Blob::of),
        }
    }

    /// KVM's structures back, each checked.
    pub fn to_kvm(&self) -> Result<VcpuKvmState, String> {
        if self.cpuid.is_empty() || self.cpuid.len() > MAX_CPUID_ENTRIES {
            return Err(format!("{} CPUID entries", self.cpuid.len()));
        }
        if self.msrs.len() > MAX_MSRS {
            return Err(format!("{} MSRs", self.msrs.len()));
        }
        let x = self.xsave.0.len();
        if !(XSAVE_LEGACY_SIZE..=MAX_XSAVE).contains(&x) || x % 4 != 0 {
            return Err(format!("an XSAVE area of {x} bytes"));
        }
        if self.mp_state > 10 {
            return Err(format!("multiprocessing state {}", self.mp_state));
        }
        Ok(VcpuKvmState {
            cpuid: self.cpuid.iter().map(kvm_cpuid_entry2::from).collect(),
            regs: self.regs.to("regs")?,
            sregs: self.sregs.to("sregs")?,
            xsave: self.xsave.0.clone(),
            xcrs: self.xcrs.to("xcrs")?,
            debugregs: self.debugregs.to("debugregs")?,
            lapic: self.lapic.to("lapic")?,
            msrs: self
                .msrs
                .iter()
                .map(|m| kvm_msr_entry {
                    index: m.index,
                    data: m.value,
                    ..Default::default()
                })
                .collect(),
            mp_state: kvm_bindings::kvm_mp_state {
                mp_state: self.mp_state,
            },
            events: self.events.to("events")?,
            tsc_khz: self.tsc_khz,
            nested: self.nested.as_ref().map(nested_state).transpose()?,
        })
    }
}

/// Nested state whose header does not claim more bytes than it has.
fn nested_state(blob: &Blob) -> Result<KvmNestedStateBuffer, String> {
    let state: KvmNestedStateBuffer = blob.to("nested")?;
    if state.size as usize > std::mem::size_of::<KvmNestedStateBuffer>() {
        return Err(format!("nested state claiming {} bytes", state.size));
    }
    Ok(state)
}

impl VmSection {
    pub fn from_kvm(max_vcpus: u8, s: &VmKvmState) -> Self {
        VmSection {
            max_vcpus,
            pic_master: Blob::of(&s.pic_master),
            pic_slave: Blob::of(&s.pic_slave),
            ioapic: Blob::of(&s.ioapic),
            pit: Blob::of(&s.pit),
            clock: Blob::of(&s.clock),
        }
    }

    /// KVM's structures back, each checked (each irqchip must be the chip it is saved as).
    pub fn to_kvm(&self) -> Result<VmKvmState, String> {
        let s = VmKvmState {
            pic_master: self.pic_master.to("pic_master")?,
            pic_slave: self.pic_slave.to("pic_slave")?,
            ioapic: self.ioapic.to("ioapic")?,
            pit: self.pit.to("pit")?,
            clock: self.clock.to("clock")?,
        };
        let chips = [
            (&s.pic_master, kvm_bindings::KVM_IRQCHIP_PIC_MASTER),
            (&s.pic_slave, kvm_bindings::KVM_IRQCHIP_PIC_SLAVE),
            (&s.ioapic, kvm_bindings::KVM_IRQCHIP_IOAPIC),
        ];
        if let Some((c, _)) = chips.iter().find(|(c, id)| c.chip_id != *id) {
            return Err(format!("an irqchip saved as chip {}", c.chip_id));
        }
        Ok(s)
    }
}

impl MemorySection {
    /// Regions page-aligned, in address order, not overlapping, adding up to the size and
    /// laid out as exitless lays out RAM of that size; memory-file ranges inside the file.
    pub fn validate(&self) -> Result<(), String> {
        let page = 4096;
        if self.size < crate::memory::MIN_MEMORY || self.size > crate::config::MAX_MEMORY {
            return Err(format!("a size of {} bytes", self.size));
        }
        if self.regions.is_empty() || self.regions.len() > MAX_REGIONS {
            return Err(format!("{} regions", self.regions.len()));
        }
        let boot = self
            .size
            .checked_sub(self.hotplugged)
            .filter(|b| *b >= crate::memory::MIN_MEMORY)
            .ok_or_else(|| format!("{} bytes hot-added of {}", self.hotplugged, self.size))?;
        let layout = crate::memory::ram_ranges(boot);
        // Hot-added regions are above boot RAM and the MMIO gap (the hotplug area).
        let boot_end = layout.last().map_or(0, |(start, len)| start.0 + len);
        let area = boot_end.max(crate::memory::MMIO_GAP_END);
        let mut total = 0u64;
        let mut last_end = 0u64;
        for r in &self.regions {
            let end = r.gpa.checked_add(r.size).ok_or("a region that wraps")?;
            if r.size == 0 || r.gpa % page != 0 || r.size % page != 0 || r.gpa < last_end {
                return Err(format!("a region at {:#x} of {:#x} bytes", r.gpa, r.size));
            }
            let inside = layout
                .iter()
                .any(|(start, len)| r.gpa >= start.0 && end <= start.0 + len)
                || (self.hotplugged > 0 && r.gpa >= area);
            if !inside {
                return Err(format!("a region at {:#x} outside guest RAM", r.gpa));
            }
            let offset = match &r.source {
                RegionSource::SnapshotFile { offset } => {
                    let file_end = offset
                        .checked_add(r.size)
                        .ok_or("a file range that wraps")?;
                    if file_end > self.file_size {
                        return Err(format!("a region at {:#x} past the file's end", r.gpa));
                    }
                    *offset
                }
                RegionSource::Zone { zone, offset } if zone.is_empty() || zone.len() > 256 => {
                    return Err(format!(
                        "a zone id of {} bytes at offset {offset}",
                        zone.len()
                    ))
                }
                RegionSource::Zone { offset, .. } => *offset,
            };
            if offset % page != 0 {
                return Err(format!("a region at {:#x} at an unaligned offset", r.gpa));
            }
            total += r.size;
            last_end = end;
        }
        if total != self.size {
            return Err(format!("regions of {total} bytes for {} of RAM", self.size));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
