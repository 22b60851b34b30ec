//! A VM changed while it ran, as Kata changes one for each container (shared memory, memory
//! grown with `vm.resize`, a disk hot-added, a vCPU added, the balloon inflated), paused,
//! snapshotted and restored in a fresh VMM: the bench guest's `case=snapshot hotplug=1`
//! (bench-guest/snapshot_hotplug.c) goes on checking its grown memory, reading its hot-added
//! disk and waking its added vCPU every round, its balloon still inflated.

mod common;

use std::path::Path;

use common::api_vmm::{json, ok, Vmm};
use common::snapshot::{
    pause_and_snapshot, restored_in, saved_state, shutdown, wait_file, SnapTest,
};
use common::Image;
use exitless_control::api::client::ApiClient;
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;
const CMDLINE: &str = "case=snapshot ticks=10 iters=20000 touch_mib=8 hotplug=1 balloon=1 hold";
/// The balloon's target: 1024 pages of 4 KiB.
const BALLOON: u64 = 4 * MIB;

fn request(c: &mut ApiClient, path: &str, body: Value) -> Value {
    let r = c.request("PUT", path, Some(&body.to_string())).unwrap();
    let r = ok(r, path);
    if r.body.trim().is_empty() {
        return Value::Null;
    }
    json(&r)
}

/// Rounds of the restored guest (`EXITLESS SNAPHP n=...` lines), each checked clean; the
/// number of them.
fn clean_rounds(text: &str) -> usize {
    let rounds: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("EXITLESS SNAPHP n="))
        .collect();
    for l in &rounds {
        assert!(l.contains(" mem_bad=0 disk_bad=0 "), "{l}\n{text}");
        assert!(l.ends_with(&format!(" balloon={}", BALLOON / 4096)), "{l}");
    }
    rounds.len()
}

/// Points config.json's console at `serial`.
fn console_to(dir: &Path, serial: &Path) -> Value {
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config["serial"]["file"] = json!(serial);
    std::fs::write(&path, config.to_string()).unwrap();
    config
}

/// Boots the VM, gives it memory, a disk and a vCPU as Kata does (waiting for the guest to
/// take each), then asks a second disk and the vCPU back; pauses and snapshots it into `dir`.
/// The rounds the guest ran.
fn change_and_snapshot(t: &SnapTest, serial: &Path, images: [&Image; 2]) -> usize {
    let body = json!({
        "cpus": {"boot_vcpus": 1, "max_vcpus": 2},
        "memory": {"size": 256 * MIB, "shared": true, "hotplug_size": 512 * MIB},
        "payload": {"kernel": t.guest, "cmdline": CMDLINE},
        "serial": {"mode": "File", "file": serial},
        "balloon": {"size": BALLOON, "free_page_reporting": true},
    });
    let vmm = Vmm::start("snap-hotplug");
    let mut c = vmm.client();
    request(&mut c, "vm.create", body);
    ok(c.request("PUT", "vm.boot", None).unwrap(), "vm.boot");
    // Kata's order: memory, then the container's disk, then its vCPUs.
    wait_file(serial, "EXITLESS SNAPHP ready");
    request(&mut c, "vm.resize", json!({"desired_ram": 384 * MIB}));
    wait_file(serial, "EXITLESS SNAPHP memory");
    let added = request(&mut c, "vm.add-disk", json!({"path": images[0].0}));
    assert_eq!(added["id"], "_disk0", "{added}");
    wait_file(serial, "EXITLESS SNAPHP disk");
    request(&mut c, "vm.resize", json!({"desired_vcpus": 2}));
    let text = wait_file(serial, "EXITLESS SNAPHP n=1 ");
    assert!(text.contains("EXITLESS SNAPHP cpu id=1"), "{text}");
    // Removals the guest is asked for and has not done (the bench guest never ejects): a
    // second disk, and the vCPU again. The VM still has both; the config does not.
    let added = request(&mut c, "vm.add-disk", json!({"path": images[1].0}));
    assert_eq!(added["id"], "_disk1", "{added}");
    request(&mut c, "vm.remove-device", json!({"id": "_disk1"}));
    request(&mut c, "vm.resize", json!({"desired_vcpus": 1}));
    pause_and_snapshot(&mut c, &t.dir);
    let rounds = clean_rounds(&std::fs::read_to_string(serial).unwrap());
    shutdown(&mut c);
    rounds
}

/// state.json: the vCPU added, the memory hot-added, each disk in its slot, the removals
/// asked, the balloon.
fn check_state(dir: &Path) {
    let state = saved_state(dir);
    let ids: Vec<u8> = state.vcpus.iter().map(|v| v.id).collect();
    assert_eq!(ids, [0, 1]);
    assert_eq!(
        (state.memory.size, state.memory.hotplugged),
        (384 * MIB, 128 * MIB)
    );
    let disk = &state.devices["_disk0"];
    assert_eq!(disk.kind, "virtio-blk");
    assert!(disk.pci.is_some(), "{disk:?}");
    assert_eq!(state.devices["_disk1"].kind, "virtio-blk");
    let asked = &state.devices["pci-hotplug"].state["asked"];
    let slot = state.devices["_disk1"].pci.unwrap().slot;
    assert_eq!(asked, &json!(1u32 << slot), "{asked}");
    assert_eq!(state.devices["cpu-hotplug"].state["asked"], json!([1]));
    let balloon = &state.devices["_balloon0"].state["transport"]["device"];
    assert_eq!(balloon["actual_pages"], BALLOON / 4096, "{balloon}");
    let slots = &state.devices["memory-hotplug"].state["regions"];
    assert_eq!(slots[0]["base"], 4u64 << 30, "{slots}");
}

/// The restored VM's API: the removals still asked of the guest (out of the config, a vCPU
/// resize refused meanwhile), and memory that still grows after what was added.
fn check_restored_api(c: &mut ApiClient) {
    let info = json(&ok(c.request("GET", "vm.info", None).unwrap(), "vm.info"));
    assert_eq!(info["config"]["cpus"]["boot_vcpus"], 1, "{info}");
    assert_eq!(info["config"]["memory"]["size"], 384 * MIB, "{info}");
    let disks = info["config"]["disks"].as_array().unwrap();
    assert_eq!(disks.len(), 1, "{info}");
    let resize = json!({"desired_vcpus": 2}).to_string();
    let r = c.request("PUT", "vm.resize", Some(&resize));
    assert_eq!(r.unwrap().status, 429, "a vCPU removal is still pending");
    request(c, "vm.resize", json!({"desired_ram": 512 * MIB}));
    let info = json(&ok(c.request("GET", "vm.info", None).unwrap(), "vm.info"));
    assert_eq!(info["config"]["memory"]["size"], 512 * MIB, "{info}");
}

#[test]
fn a_vm_resized_hot_plugged_and_ballooned_goes_on_from_its_snapshot_in_a_fresh_vmm() {
    let Some(t) = SnapTest::start("snapshot_hotplug", "hotplug") else {
        return;
    };
    let serial = t.scratch.join("serial.log");
    let images = [
        &Image::new("snap-hotplug-disk", 1),
        &Image::new("snap-hotplug-disk2", 1),
    ];
    let before = change_and_snapshot(&t, &serial, images);
    check_state(&t.dir);
    // config.json describes the VM as it is (what it was asked to give back included).
    let restored = t.scratch.join("restored.log");
    let config = console_to(&t.dir, &restored);
    assert_eq!(config["cpus"]["boot_vcpus"], 2, "{config}");
    assert_eq!(config["memory"]["size"], 384 * MIB, "{config}");
    assert_eq!(config["disks"][0]["id"], "_disk0", "{config}");
    assert_eq!(config["disks"][1]["id"], "_disk1", "{config}");

    let vmm = restored_in(Vmm::start("snap-hotplug-2"), &t.dir);
    let text = wait_file(&restored, "EXITLESS DONE");
    assert!(text.contains(" hotplug_ok=1"), "{text}");
    assert!(text.contains(" ok=1"), "{text}");
    let after = clean_rounds(&text);
    assert!(
        after >= 1 && before + after >= 9,
        "{before} + {after} rounds\n{text}"
    );
    let mut c = vmm.client();
    check_restored_api(&mut c);
    snapshot_again(c, &t);
}

/// The restored VM (grown again to 512 MiB) snapshotted again, its VMM shut down (it holds
/// its disks' locks), and restored in a third VMM: what the first restore took back (the
/// memory, the removals still asked) is saved again.
fn snapshot_again(mut c: ApiClient, t: &SnapTest) {
    let again = t.scratch.join("again");
    std::fs::create_dir(&again).unwrap();
    pause_and_snapshot(&mut c, &again);
    shutdown(&mut c);
    let state = saved_state(&again);
    assert_eq!(state.memory.hotplugged, 256 * MIB);
    assert_eq!(state.devices["cpu-hotplug"].state["asked"], json!([1]));
    let config = console_to(&again, &t.scratch.join("again.log"));
    assert_eq!(config["cpus"]["boot_vcpus"], 2, "{config}");
    assert_eq!(config["disks"][1]["id"], "_disk1", "{config}");
    let third = restored_in(Vmm::start("snap-hotplug-3"), &again);
    let mut c = third.client();
    let info = json(&ok(c.request("GET", "vm.info", None).unwrap(), "vm.info"));
    assert_eq!(info["config"]["cpus"]["boot_vcpus"], 1, "{info}");
    assert_eq!(info["config"]["memory"]["size"], 512 * MIB, "{info}");
    assert_eq!(
        info["config"]["disks"].as_array().unwrap().len(),
        1,
        "{info}"
    );
    shutdown(&mut c);
}
