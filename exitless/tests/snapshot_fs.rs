//! virtio-fs in a snapshot, against the real virtiofsd: the bench guest holds a file of the
//! shared directory open through FUSE (`case=snapshot fs=1`: every round writes a record
//! through that one file handle and reads all records back through it), is paused,
//! snapshotted (virtiofsd's state through vhost-user's device-state protocol, beside
//! state.json), and restored in a fresh VMM in front of a fresh virtiofsd: it goes on with the
//! same handle and writes a new file; the host sees every byte. QEMU's C virtiofsd, which
//! cannot hand over its state, is refused by name with nothing written.

mod common;

use std::path::Path;

use common::api_vmm::Vmm;
use common::snapshot::{
    assert_saved_running, boot_to_second_round, last_tick, pause_and_snapshot, restored_in,
    saved_state, try_snapshot, wait_file, SnapTest,
};
use common::virtiofsd::Virtiofsd;
use serde_json::Value;
use vmm::devices::virtio::vhost_user::virtiofsd::{Daemon, Flavour};

const TICKS: u64 = 5;
const CMDLINE: &str = "case=snapshot ticks=5 iters=20000 touch_mib=8 fs=1 hold";

/// A `vm.create` body of the bench guest on shared memory with a virtio-fs device on
/// `socket`, its console in `serial`.
fn create_body(guest: &Path, serial: &Path, socket: &Path) -> String {
    serde_json::json!({
        "cpus": {"boot_vcpus": 1, "max_vcpus": 1},
        "memory": {"size": 268435456, "shared": true},
        "payload": {"kernel": guest, "cmdline": CMDLINE},
        "serial": {"mode": "File", "file": serial},
        "fs": [{"tag": "kataShared", "socket": socket}],
    })
    .to_string()
}

/// The records the guest writes in `rounds` rounds: byte i of round t's 16.
fn records(rounds: u64) -> Vec<u8> {
    (0..rounds * 16)
        .map(|i| ((i / 16 * 31 + i % 16 * 7 + 1) & 0xff) as u8)
        .collect()
}

/// What Kata (or any client) does before restoring: the console where it wants it, the
/// virtio-fs socket where it started the new virtiofsd.
fn edit_config(dir: &Path, serial: &Path, socket: &Path) {
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config["serial"]["file"] = serde_json::json!(serial);
    config["fs"][0]["socket"] = serde_json::json!(socket);
    std::fs::write(&path, config.to_string()).unwrap();
}

#[test]
fn a_file_held_open_through_virtio_fs_goes_on_in_a_restored_vm_with_a_fresh_virtiofsd() {
    let test = "snapshot_fs";
    let Some(t) = SnapTest::start(test, "fs") else {
        return;
    };
    let Some(daemon) = Virtiofsd::find(test) else {
        return;
    };
    if daemon.flavour != Flavour::Rust {
        let why = "the virtiofsd found is QEMU's C one, which has no device state";
        return vmm::test_skip::skip(test, why);
    }
    let first = Virtiofsd::spawn("snapfs-a", daemon.clone(), None, true);
    let shared = first.shared();
    std::fs::write(shared.join("snap.bin"), b"").unwrap();
    let serial = t.scratch.join("fs.log");
    let vmm = Vmm::start("snap-fs");
    let mut c = vmm.client();
    boot_to_second_round(
        &mut c,
        &create_body(&t.guest, &serial, &first.socket),
        &serial,
    );
    pause_and_snapshot(&mut c, &t.dir);
    let text = std::fs::read_to_string(&serial).unwrap();
    let last = last_tick(&text).unwrap();
    assert!(text.contains("EXITLESS SNAPFS n=1 bytes=32"), "{text}");
    // Saved as the other virtio devices, with virtiofsd's state in a file beside state.json.
    let state = saved_state(&t.dir);
    assert_saved_running(&state, &[("_fs0", "virtio-fs")]);
    let data = state.devices["_fs0"]
        .data
        .clone()
        .expect("virtiofsd's state");
    assert_eq!(data.file, "device-_fs0.bin");
    let saved = std::fs::read(t.dir.join(&data.file)).unwrap();
    assert!(!saved.is_empty() && saved.len() as u64 == data.size);
    // The first VMM goes, and its virtiofsd with it; the file keeps what was written.
    drop(c);
    drop(vmm);
    assert!(first.wait_disconnected(), "{}", first.log_text());
    assert_eq!(
        std::fs::read(shared.join("snap.bin")).unwrap(),
        records(last + 1)
    );
    // A fresh virtiofsd on the same directory, its socket named in config.json.
    let second = Virtiofsd::spawn("snapfs-b", daemon, Some(shared.clone()), true);
    let restored = t.scratch.join("restored.log");
    edit_config(&t.dir, &restored, &second.socket);
    let restored_vmm = restored_in(Vmm::start("snap-fs-2"), &t.dir);
    let text = wait_file(&restored, "EXITLESS DONE");
    assert!(!text.contains("EXITLESS ERROR"), "{text}");
    assert!(
        text.contains(&format!("EXITLESS TICK n={} ", last + 1)),
        "{text}"
    );
    let all = format!("EXITLESS SNAPFS n={} bytes={}", TICKS - 1, TICKS * 16);
    assert!(text.contains(&all), "{text}");
    assert!(text.contains("ok=1"), "{text}");
    assert!(second.wait_connected(), "{}", second.log_text());
    // The host sees every round's record, through the old handle, and the new file.
    assert_eq!(
        std::fs::read(shared.join("snap.bin")).unwrap(),
        records(TICKS)
    );
    assert_eq!(
        std::fs::read(shared.join("snap-new.bin")).unwrap(),
        records(TICKS)
    );
    // The restored VM is snapshotted again: its back end's state is saved as the first was.
    let again = t.scratch.join("again");
    std::fs::create_dir(&again).unwrap();
    pause_and_snapshot(&mut restored_vmm.client(), &again);
    let data = saved_state(&again).devices["_fs0"].data.clone().unwrap();
    assert!(std::fs::metadata(again.join(data.file)).unwrap().len() > 0);
}

#[test]
fn qemu_s_c_virtiofsd_cannot_hand_over_its_state_and_is_refused_by_name() {
    let test = "snapshot_fs_c";
    let Some(t) = SnapTest::start(test, "fs-c") else {
        return;
    };
    let path = Path::new("/usr/lib/qemu/virtiofsd");
    let daemon = match path.is_file().then(|| Daemon::ask(path)) {
        Some(Ok(d)) if d.flavour == Flavour::C => d,
        _ => return vmm::test_skip::skip(test, "QEMU's C virtiofsd is not installed"),
    };
    let Some(_root) = Virtiofsd::find(test) else {
        return; // not root
    };
    let c_daemon = Virtiofsd::spawn("snapfs-c", daemon, None, true);
    std::fs::write(c_daemon.shared().join("snap.bin"), b"").unwrap();
    let serial = t.scratch.join("fs.log");
    let vmm = Vmm::start("snap-fs-c");
    let mut c = vmm.client();
    let body = create_body(&t.guest, &serial, &c_daemon.socket);
    boot_to_second_round(&mut c, &body, &serial);
    common::api_vmm::ok(c.request("PUT", "vm.pause", None).unwrap(), "vm.pause");
    let (status, text) = try_snapshot(&mut c, &t.dir);
    assert_eq!(status, 400, "{text}");
    let want = "vm.snapshot: device _fs0 (virtio-fs) cannot be snapshotted yet: its driver \
                has set it up, and its vhost-user back end at ";
    assert!(text.starts_with(want), "{text}");
    assert!(
        text.contains("does not offer VHOST_USER_PROTOCOL_F_DEVICE_STATE"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        std::fs::read_dir(&t.dir).unwrap().next().is_none(),
        "nothing written"
    );
    // The VM goes on: its back end was not stopped.
    common::api_vmm::ok(c.request("PUT", "vm.resume", None).unwrap(), "vm.resume");
    let text = wait_file(&serial, "EXITLESS DONE");
    assert!(
        text.contains("ok=1") && !text.contains("EXITLESS ERROR"),
        "{text}"
    );
}
