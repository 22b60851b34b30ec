use super::*;
use crate::kvm::state::{VcpuKvmState, VmKvmState};

/// A state as a 1-vCPU, 64 MiB VM's snapshot would have it (KVM's structures at their
/// defaults, plausible values where the checks look).
pub fn sample() -> SnapshotState {
    let vcpu = VcpuKvmState {
        cpuid: vec![kvm_cpuid_entry2 {
            function: 1,
            ecx: 1 << 31,
            ..Default::default()
        }],
        regs: kvm_bindings::kvm_regs {
            rip: 0x10_0000,
            ..Default::default()
        },
        sregs: Default::default(),
        xsave: vec![0; XSAVE_LEGACY_SIZE],
        xcrs: Default::default(),
        debugregs: Default::default(),
        lapic: Default::default(),
        msrs: vec![kvm_msr_entry {
            index: 0x10,
            data: 12345,
            ..Default::default()
        }],
        mp_state: Default::default(),
        events: Default::default(),
        tsc_khz: Some(2_100_000),
        nested: None,
    };
    let chip = |chip_id| kvm_bindings::kvm_irqchip {
        chip_id,
        ..Default::default()
    };
    let vm = VmKvmState {
        pic_master: chip(0),
        pic_slave: chip(1),
        ioapic: chip(2),
        pit: Default::default(),
        clock: Default::default(),
    };
    let mut devices = BTreeMap::new();
    devices.insert(
        "com1".to_string(),
        DeviceEntry {
            pci: None,
            kind: "serial".into(),
            state: serde_json::json!({"ier": 1}),
            data: None,
        },
    );
    SnapshotState {
        version: Version::current(),
        checksum: String::new(),
        cpu: crate::snapshot::cpu_features::features_of(&vcpu.cpuid),
        vcpus: vec![VcpuState::from_kvm(0, &vcpu)],
        vm: VmSection::from_kvm(1, &vm),
        memory: MemorySection {
            size: 64 << 20,
            hotplugged: 0,
            file_size: 64 << 20,
            regions: vec![RegionState {
                gpa: 0,
                size: 64 << 20,
                source: RegionSource::SnapshotFile { offset: 0 },
            }],
        },
        devices,
    }
}

fn err(bytes: &[u8]) -> String {
    SnapshotState::parse(bytes).unwrap_err().to_string()
}

#[test]
fn a_state_round_trips_with_its_checksum() {
    let mut s = sample();
    let text = s.to_json().unwrap();
    assert!(s.checksum.starts_with("crc32:"), "{}", s.checksum);
    let back = SnapshotState::parse(text.as_bytes()).unwrap();
    assert_eq!(back, s);
    let vcpu = back.vcpus[0].to_kvm().unwrap();
    assert_eq!(vcpu.regs.rip, 0x10_0000);
    assert_eq!((vcpu.msrs[0].index, vcpu.msrs[0].data), (0x10, 12345));
    // Formatting is not content: pretty-printed, it still checks.
    let pretty = serde_json::to_string_pretty(&back).unwrap();
    assert_eq!(SnapshotState::parse(pretty.as_bytes()).unwrap(), s);
}

#[test]
fn the_written_file_s_checksum_is_checked_on_its_bytes_and_a_reformatted_one_re_encoded() {
    let mut s = sample();
    let text = s.to_json().unwrap();
    assert!(written_checksum_matches(text.as_bytes(), &s.checksum));
    assert_eq!(checksum_of(&s).unwrap(), s.checksum);
    // Any byte changed, or the file reformatted: the bytes no longer match on their own.
    let at = text.find("\"regs\":\"").unwrap() + 8;
    let mut changed = text.clone().into_bytes();
    changed[at] = if changed[at] == b'0' { b'1' } else { b'0' };
    assert!(!written_checksum_matches(&changed, &s.checksum));
    let pretty = serde_json::to_string_pretty(&s).unwrap();
    assert!(!written_checksum_matches(pretty.as_bytes(), &s.checksum));
    assert!(!written_checksum_matches(text.as_bytes(), "crc32:00000000"));
    assert!(!written_checksum_matches(text.as_bytes(), ""));
}

#[test]
fn damaged_truncated_and_foreign_files_are_refused_in_one_line() {
    let text = sample().to_json().unwrap();
    // A changed digit inside the registers: the JSON parses, the checksum does not match.
    let at = text.find("\"regs\":\"").unwrap() + 8;
    let mut changed = text.clone().into_bytes();
    changed[at] = if changed[at] == b'0' { b'1' } else { b'0' };
    assert!(
        err(&changed).contains("checksum does not match"),
        "{}",
        err(&changed)
    );
    let cut = err(&text.as_bytes()[..text.len() / 2]);
    assert!(
        cut.starts_with("state.json is damaged: EOF while parsing"),
        "{cut}"
    );
    assert!(err(b"").contains("state.json is damaged"));
    assert!(err(b"\x00\xff garbage").contains("state.json is damaged"));
    let other = text.replacen("\"format\":1", "\"format\":7", 1);
    assert_eq!(
        err(other.as_bytes()),
        format!(
            "The snapshot is format version 7 (written by exitless {}); this exitless reads \
             version 1",
            env!("CARGO_PKG_VERSION")
        )
    );
    for e in [cut, err(&changed)] {
        assert_eq!(e.lines().count(), 1, "{e}");
    }
}

/// A state edited as `edit` says and sealed again (a valid checksum over bad content).
fn resealed(edit: impl FnOnce(&mut SnapshotState)) -> String {
    let mut s = sample();
    edit(&mut s);
    let text = s.to_json().unwrap();
    err(text.as_bytes())
}

#[test]
fn fields_are_checked_beyond_their_shape() {
    let e = resealed(|s| s.vcpus[0].regs.0.truncate(100));
    assert!(
        e.contains("vcpus[0]: regs is 100 bytes, not the 144"),
        "{e}"
    );
    let e = resealed(|s| s.vcpus[0].id = 3);
    assert!(e.contains("vcpus[0] has id 3"), "{e}");
    let e = resealed(|s| s.vcpus.clear());
    assert!(e.contains("it has 0 vCPUs"), "{e}");
    let e = resealed(|s| s.vcpus[0].xsave.0.truncate(12));
    assert!(e.contains("an XSAVE area of 12 bytes"), "{e}");
    let e = resealed(|s| s.vm.ioapic = s.vm.pic_master.clone());
    assert!(e.contains("an irqchip saved as chip 0"), "{e}");
    let e = resealed(|s| s.memory.regions[0].size = 32 << 20);
    assert!(e.contains("regions of 33554432 bytes"), "{e}");
    let e = resealed(|s| s.memory.file_size = 4096);
    assert!(e.contains("past the file's end"), "{e}");
    let e = resealed(|s| s.memory.regions[0].gpa = 0xc000_0000);
    assert!(e.contains("outside guest RAM"), "{e}");
    let e = resealed(|s| s.memory.size = 1);
    assert!(e.contains("a size of 1 bytes"), "{e}");
    let e = resealed(|s| s.vm.max_vcpus = 0);
    assert!(e.contains("max_vcpus"), "{e}");
}

#[test]
fn unknown_fields_are_refused() {
    let text = sample().to_json().unwrap();
    let extra = text.replacen("{\"version\"", "{\"surprise\":1,\"version\"", 1);
    assert!(err(extra.as_bytes()).contains("unknown field `surprise`"));
}

/// 128 MiB hot-added at 4 GiB (the hotplug area of a 64 MiB VM), in the memory file after
/// boot RAM.
fn hot_added(s: &mut SnapshotState) {
    s.memory.size += 128 << 20;
    s.memory.hotplugged = 128 << 20;
    s.memory.file_size += 128 << 20;
    s.memory.regions.push(RegionState {
        gpa: 4 << 30,
        size: 128 << 20,
        source: RegionSource::SnapshotFile { offset: 64 << 20 },
    });
}

#[test]
fn vcpu_ids_may_have_gaps_and_hot_added_memory_lies_above_boot_ram() {
    // vCPUs 0 and 2 of a topology of 3 (vCPU 1 was removed), memory hot-added.
    let mut s = sample();
    let mut third = s.vcpus[0].clone();
    third.id = 2;
    s.vcpus.push(third);
    s.vm.max_vcpus = 3;
    hot_added(&mut s);
    let text = s.to_json().unwrap();
    assert_eq!(SnapshotState::parse(text.as_bytes()).unwrap(), s);
    let e = resealed(|s| {
        let again = s.vcpus[0].clone();
        s.vcpus.push(again);
        s.vm.max_vcpus = 2;
    });
    assert!(e.contains("vcpus[1] has id 0"), "{e}");
    let e = resealed(|s| {
        hot_added(s);
        s.memory.hotplugged = 0;
    });
    assert!(
        e.contains("a region at 0x100000000 outside guest RAM"),
        "{e}"
    );
    let e = resealed(|s| {
        hot_added(s);
        s.memory.regions[1].gpa = 0x3000_0000;
    });
    assert!(e.contains("outside guest RAM"), "{e}");
    let e = resealed(|s| {
        hot_added(s);
        s.memory.hotplugged = 1 << 40;
    });
    assert!(e.contains("1099511627776 bytes hot-added of"), "{e}");
}

#[test]
fn pci_places_are_slots_of_bus_0_each_held_once() {
    let place = |slot| {
        Some(crate::snapshot::format::PciPlace {
            slot,
            bar: 0xc000_0000,
        })
    };
    let entry = |slot| DeviceEntry {
        kind: "virtio-rng".into(),
        state: serde_json::json!({}),
        data: None,
        pci: place(slot),
    };
    let mut s = sample();
    s.devices.insert("a".into(), entry(3));
    s.devices.insert("b".into(), entry(5));
    let text = s.to_json().unwrap();
    assert_eq!(SnapshotState::parse(text.as_bytes()).unwrap(), s);
    for slots in [[3, 3], [0, 5], [3, 32]] {
        let e = resealed(|s| {
            s.devices.insert("a".into(), entry(slots[0]));
            s.devices.insert("b".into(), entry(slots[1]));
        });
        assert!(e.contains("a device in PCI slot"), "{slots:?}: {e}");
    }
}
