//! Kata Containers' shipped request sequence (control/src/api/fixtures/kata_clh_virtiofs.json,
//! the `kata_shipped` fixture): shared memory, virtio-fs (`kataShared`, on a Rust virtiofsd),
//! a read-only root disk, a tap sent as an fd, vsock, the balloon with free page reporting,
//! then memory grown, a disk hot-added and asked back, a vCPU added, and the pause. Where Kata
//! would resume, the VM is snapshotted and restored in a fresh VMM (the tap sent again with
//! `net_fds`, a fresh virtiofsd on the same directory, as Kata starts its own): the bench
//! guest's `case=snapshot hotplug=1 fs=1` goes on using its grown memory, the hot-added disk,
//! the added vCPU and the file it holds open through `kataShared`. Without a Rust virtiofsd
//! the sequence runs without its virtio-fs device (said in a skip line).

mod common;

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use common::api_vmm::{json, ok, Vmm};
use common::builds;
use common::kata::tap;
use common::snapshot::{saved_state, shutdown, wait_file, SnapTest};
use common::virtiofsd::Virtiofsd;
use exitless_control::api::client::ApiClient;
use serde_json::{json, Value};
use vmm::devices::virtio::vhost_user::virtiofsd::Flavour;

const CMDLINE: &str = "case=snapshot ticks=10 iters=20000 touch_mib=8 hotplug=1 balloon=1 hold";

/// Sends one request of the sequence (with the tap's fd where Kata sends it); its reply.
fn send(c: &mut ApiClient, r: &Value, fds: &[i32]) -> Value {
    let endpoint = r["path"].as_str().unwrap().trim_start_matches("/api/v1/");
    let body = (!r["body"].is_null()).then(|| r["body"].to_string());
    let method = r["method"].as_str().unwrap();
    let reply = c.request_with_fds(method, endpoint, body.as_deref(), fds);
    let reply = ok(reply.unwrap(), endpoint);
    serde_json::from_str(&reply.body).unwrap_or(Value::Null)
}

/// The fixture's requests up to its pause, for `dir` and `kernel`, with the console in a file
/// and the virtio-fs device on `fs` (none without).
fn sequence(dir: &Path, kernel: &Path, serial: &Path, fs: Option<&Path>) -> Vec<Value> {
    let fixture = include_str!("../../control/src/api/fixtures/kata_clh_virtiofs.json")
        .replace("@TMP@", dir.to_str().unwrap())
        .replace("@VMDIR@", dir.to_str().unwrap())
        .replace("@KERNEL@", kernel.to_str().unwrap());
    let fixture: Value = serde_json::from_str(&fixture).unwrap();
    let mut requests = fixture["requests"].as_array().unwrap().clone();
    let pause = requests
        .iter()
        .position(|r| r["path"] == "/api/v1/vm.pause");
    requests.truncate(pause.unwrap());
    let create = &mut requests[1]["body"];
    match fs {
        Some(socket) => {
            create["fs"][0]["socket"] = json!(socket);
            create["payload"]["cmdline"] = json!(format!("{CMDLINE} fs=1"));
        }
        None => {
            create.as_object_mut().unwrap().remove("fs");
            create["payload"]["cmdline"] = json!(CMDLINE);
        }
    }
    create["serial"] = json!({"mode": "File", "file": serial});
    requests
}

/// The line the guest prints once it took what `r` adds (None: nothing to wait for).
fn taken_after(r: &Value) -> Option<&'static str> {
    match r["path"].as_str().unwrap() {
        "/api/v1/vm.boot" => Some("EXITLESS SNAPHP ready"),
        "/api/v1/vm.resize" if r["body"]["desired_ram"].is_u64() => Some("EXITLESS SNAPHP memory"),
        "/api/v1/vm.add-disk" => Some("EXITLESS SNAPHP disk"),
        "/api/v1/vm.resize" => Some("EXITLESS SNAPHP n=1 "),
        _ => None,
    }
}

/// One shipped build's run of the sequence: its binary and its own folders.
struct Run<'a> {
    bin: &'a Path,
    guest: &'a Path,
    /// The sandbox's folder (Kata's @VMDIR@: its disk images).
    vm_dir: PathBuf,
    /// Where the snapshot goes.
    snap: PathBuf,
    scratch: PathBuf,
}

impl<'a> Run<'a> {
    fn new(t: &'a SnapTest, bin: &'a Path, n: usize) -> Self {
        let scratch = t.scratch.join(&format!("build{n}"));
        let (vm_dir, snap) = (scratch.join("vm"), scratch.join("snap"));
        for d in [&vm_dir, &snap] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(vm_dir.join("rootfs.img"), vec![0u8; 1 << 20]).unwrap();
        std::fs::write(vm_dir.join("hotplug.img"), vec![0u8; 1 << 20]).unwrap();
        Run {
            bin,
            guest: &t.guest,
            vm_dir,
            snap,
            scratch,
        }
    }
}

/// Walks the sequence to Kata's pause on a fresh VMM (the tap sent where Kata sends it),
/// then snapshots the VM into `run.snap`; the id of the disk Kata hot-added.
fn walk_and_snapshot(run: &Run, serial: &Path, tap: i32, fs: Option<&Path>) -> String {
    let vmm = Vmm::start_build(run.bin, "snap-kata");
    let mut c = vmm.client();
    let mut disk_id = String::new();
    for mut r in sequence(&run.vm_dir, run.guest, serial, fs) {
        if r["path"] == "/api/v1/vm.remove-device" {
            r["body"]["id"] = json!(disk_id);
        }
        let fds = match r["fds"].as_u64() {
            Some(1) => vec![tap],
            _ => vec![],
        };
        let reply = send(&mut c, &r, &fds);
        if r["path"] == "/api/v1/vm.add-disk" {
            disk_id = reply["id"].as_str().unwrap().to_string();
        }
        if let Some(line) = taken_after(&r) {
            let text = wait_file(serial, line);
            assert!(!text.contains("EXITLESS ERROR"), "{text}");
        }
    }
    ok(c.request("PUT", "vm.pause", None).unwrap(), "vm.pause");
    let url = json!({"destination_url": format!("file://{}", run.snap.display())});
    let r = c.request("PUT", "vm.snapshot", Some(&url.to_string()));
    ok(r.unwrap(), "vm.snapshot");
    shutdown(&mut c);
    disk_id
}

/// Restores the snapshot in `snap` in a fresh VMM, the tap sent again as Kata sends it, and
/// resumes it; the VMM.
fn restore_with_tap(bin: &Path, snap: &Path, tap: i32) -> Vmm {
    let vmm = Vmm::start_build(bin, "snap-kata-2");
    let mut c = vmm.client();
    let body = json!({
        "source_url": format!("file://{}", snap.display()),
        "net_fds": [{"id": "_net0", "num_fds": 1}],
    });
    let r = c.request_with_fds("PUT", "vm.restore", Some(&body.to_string()), &[tap]);
    ok(r.unwrap(), "vm.restore");
    ok(c.request("PUT", "vm.resume", None).unwrap(), "vm.resume");
    vmm
}

/// The Rust virtiofsd started as a snapshot needs it, serving `shared` (else a folder of its
/// own); None, said in a skip line, where there is none.
fn virtiofsd(tag: &str, shared: Option<std::path::PathBuf>) -> Option<Virtiofsd> {
    let test = "snapshot_kata_virtio_fs";
    let daemon = Virtiofsd::find(test)?;
    if daemon.flavour != Flavour::Rust {
        let why = "the virtiofsd found is QEMU's C one, which has no device state: no virtio-fs";
        vmm::test_skip::skip(test, why);
        return None;
    }
    Some(Virtiofsd::spawn(tag, daemon, shared, true))
}

/// What the restored VM's guest printed, and its VMM, once it finished.
fn check_saved(snap: &Path, disk_id: &str, fs: bool) {
    let state = saved_state(snap);
    assert_eq!(state.vcpus.len(), 2);
    assert_eq!(state.memory.hotplugged, 256 << 20);
    for id in ["_disk0", disk_id] {
        assert_eq!(state.devices[id].kind, "virtio-blk", "{id}");
    }
    assert_eq!(state.devices["_net0"].kind, "virtio-net");
    assert_eq!(state.devices["_balloon0"].kind, "virtio-balloon");
    if fs {
        let data = state.devices["_fs0"]
            .data
            .clone()
            .expect("virtiofsd's state");
        assert!(snap.join(data.file).is_file());
    }
}

#[test]
fn kata_s_shipped_sequence_is_snapshotted_and_goes_on_in_a_fresh_vmm_with_a_fresh_virtiofsd() {
    let Some(t) = SnapTest::start("snapshot_kata", "kata") else {
        return;
    };
    let Some((_ns, tap_fd)) = tap("snapshot_kata") else {
        return;
    };
    // Each shipped build (Kata runs the VMM-only one: EXITLESS_VMM_BIN in the suite).
    for (n, bin) in builds().iter().enumerate() {
        eprintln!("snapshot_kata: {}", bin.display());
        kata_round(&Run::new(&t, bin, n), tap_fd.as_raw_fd());
    }
}

/// The sequence, the snapshot and the restore with one build.
fn kata_round(run: &Run, tap: i32) {
    let first = virtiofsd("snapkata-a", None);
    if let Some(d) = &first {
        std::fs::write(d.shared().join("snap.bin"), b"").unwrap();
    }
    let serial = run.scratch.join("serial.log");
    let socket = first.as_ref().map(|d| d.socket.as_path());
    let disk_id = walk_and_snapshot(run, &serial, tap, socket);
    check_saved(&run.snap, &disk_id, first.is_some());
    // Kata's own virtiofsd for the restored sandbox: fresh, on the same directory (the
    // first ended with its VMM; kept until the end, it owns the directory).
    let shared = first.as_ref().map(Virtiofsd::shared);
    let second = shared.and_then(|dir| virtiofsd("snapkata-b", Some(dir)));
    let restored = run.scratch.join("restored.log");
    let path = run.snap.join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config["serial"]["file"] = json!(restored);
    if let Some(d) = &second {
        config["fs"][0]["socket"] = json!(d.socket);
    }
    std::fs::write(&path, config.to_string()).unwrap();

    let vmm = restore_with_tap(run.bin, &run.snap, tap);
    let text = wait_file(&restored, "EXITLESS DONE");
    assert!(!text.contains("EXITLESS ERROR"), "{text}");
    assert!(text.contains(" hotplug_ok=1"), "{text}");
    assert!(text.contains(" ok=1"), "{text}");
    assert!(text.contains(" mem_bad=0 disk_bad=0 "), "{text}");
    if let Some(d) = &second {
        // Every round's 16-byte record through the one FUSE handle, and the new file.
        assert!(text.contains("EXITLESS SNAPFS n=9 bytes=160"), "{text}");
        let old = std::fs::read(d.shared().join("snap.bin")).unwrap();
        assert_eq!(old.len(), 160);
        assert_eq!(std::fs::read(d.shared().join("snap-new.bin")).unwrap(), old);
    }
    let mut c = vmm.client();
    let info = json(&ok(c.request("GET", "vm.info", None).unwrap(), "vm.info"));
    assert_eq!(info["config"]["memory"]["size"], 512u64 << 20, "{info}");
    assert_eq!(info["config"]["cpus"]["boot_vcpus"], 2, "{info}");
    let disks = info["config"]["disks"].as_array().unwrap();
    assert!(disks.iter().all(|d| d["id"] != disk_id.as_str()), "{info}");
    shutdown(&mut c);
}
