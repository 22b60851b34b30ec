//! vhost-user-blk and the generic vhost-user device end to end against qemu-storage-daemon,
//! driven by the bench guest's own virtio-blk driver (the guest sees plain virtio-blk): the
//! pattern written, flushed and read back through the daemon, the image on the host changed,
//! no userspace exit per request; refusals in one line; the API's `disks[]` with
//! `vhost_user`, and `add-disk` and `add-generic-vhost-user` through Cloud Hypervisor's
//! `ch-remote`.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;

use common::api_vmm::{bench_vm_body, json, kvm_or_skip, ok, Vmm};
use common::{export_guest, guest_pattern, kvm_available, wait_serial, Image};
use vmm::devices::virtio::vhost_user_device::storage_daemon::{self, StorageDaemon};

const SEED: u64 = 7;

/// qemu-storage-daemon exporting `image` on a socket of the test's own; None (said as a skip)
/// where it is not installed.
fn daemon(test: &str, image: &Path) -> Option<StorageDaemon> {
    let Some(path) = storage_daemon::find() else {
        vmm::test_skip::skip(
            test,
            "qemu-storage-daemon is not installed (apt-get install qemu-system-common)",
        );
        return None;
    };
    let socket = std::env::temp_dir().join(format!("exitless-{test}-{}.sock", std::process::id()));
    Some(StorageDaemon::start(&path, image, &socket, true).unwrap())
}

/// Bytes of the first `blocks` 4 KiB blocks of `image` that differ from the guest's pattern.
fn pattern_mismatches(image: &Path, blocks: usize) -> usize {
    seeded_mismatches(image, blocks, SEED)
}

/// [`pattern_mismatches`] for the pattern of `seed`.
fn seeded_mismatches(image: &Path, blocks: usize, seed: u64) -> usize {
    let data = std::fs::read(image).unwrap();
    (0..blocks * 4096)
        .filter(|&n| data[n] != guest_pattern(seed, (n / 4096) as u64, (n % 4096) as u64))
        .count()
}

/// Userspace exits by reason and device from a `--profile-json` report, the console's left
/// out (the guest prints the same lines whatever it did).
fn exits_but_console(profile: &serde_json::Value) -> BTreeMap<String, u64> {
    let mut exits = BTreeMap::new();
    for reason in profile["totals"]["reasons"].as_array().unwrap() {
        let name = reason["reason"].as_str().unwrap();
        match reason["devices"].as_array().filter(|d| !d.is_empty()) {
            Some(devices) => {
                for d in devices.iter().filter(|d| d["device"] != "com1") {
                    let key = format!("{name} {}", d["device"].as_str().unwrap());
                    exits.insert(key, d["count"].as_u64().unwrap());
                }
            }
            None => {
                exits.insert(name.to_string(), reason["count"].as_u64().unwrap());
            }
        }
    }
    exits
}

/// `exitless run` (build `bin`) of the guest's disk check over `blocks` blocks on the
/// vhost-user disk at `socket`; its console, stderr and profile.
fn run_check(
    bin: &Path,
    guest: &Path,
    socket: &Path,
    blocks: u64,
) -> (String, String, serde_json::Value) {
    let json = guest.with_extension(format!("{blocks}.profile.json"));
    let o = std::process::Command::new(bin)
        .args(["run", "--kernel"])
        .arg(guest)
        .args(["--memory", "size=64M,shared=on", "--timeout", "60"])
        .arg("--disk")
        .arg(format!("vhost_user=on,socket={}", socket.display()))
        .args([
            "--cmdline",
            &format!("case=virtio_check iters={blocks} seed={SEED}"),
        ])
        .arg("--profile-json")
        .arg(&json)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    assert!(o.status.success(), "{out}\n{err}");
    let profile = std::fs::read_to_string(&json).expect("profile written");
    std::fs::remove_file(&json).ok();
    (out, err, serde_json::from_str(&profile).unwrap())
}

/// The guest writes its pattern through exitless and qemu-storage-daemon, flushes, reads it
/// back; the image holds it. Four times as many requests make not one userspace exit more
/// (kick and call go through KVM's ioeventfd and irqfd to and from the daemon).
#[test]
fn the_guest_writes_and_reads_a_vhost_user_disk_with_no_exit_per_request() {
    if !kvm_available("vhost_user_blk") {
        return;
    }
    let image = Image::new("vublk-run", 16);
    let Some(d) = daemon("vhost_user_blk", &image.0) else {
        return;
    };
    let guest = export_guest("vublk-run");
    for bin in common::builds() {
        let mut exits = Vec::new();
        for blocks in [16u64, 64] {
            let (out, err, profile) = run_check(&bin, &guest, &d.socket, blocks);
            let connected = format!("vhost-user back end at {} connected", d.socket.display());
            assert!(err.contains(&connected), "{err}");
            assert!(
                out.contains(&format!(
                    "EXITLESS VIRTIO blk flushed blocks={blocks} seed={SEED}"
                )),
                "{out}"
            );
            let verified = format!("EXITLESS VIRTIO blk verified bytes={}", blocks * 4096);
            assert!(out.contains(&verified), "{out}");
            assert!(!out.contains("EXITLESS ERROR"), "{out}");
            assert_eq!(pattern_mismatches(&image.0, blocks as usize), 0);
            exits.push(exits_but_console(&profile));
        }
        // 16 blocks are 32 requests and a flush, 64 are 128 and a flush: the same exits.
        assert!(exits[0].values().sum::<u64>() > 0, "{:?}", exits[0]);
        assert_eq!(exits[0], exits[1], "no userspace exit per request");
        std::fs::write(&image.0, vec![0u8; 16 << 20]).unwrap();
    }
    std::fs::remove_file(&guest).ok();
}

#[test]
fn a_vhost_user_disk_on_private_memory_or_without_a_back_end_is_one_line() {
    let kernel = std::env::temp_dir().join("exitless-vublk-no-kernel-needed");
    std::fs::write(&kernel, b"not read").unwrap();
    let run = |memory: &str, extra: &[&str]| {
        let o = common::exitless()
            .args(["run", "--kernel"])
            .arg(&kernel)
            .args(["--memory", memory])
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1));
        String::from_utf8_lossy(&o.stderr).trim().to_string()
    };
    let disk = ["--disk", "vhost_user=on,socket=/nonexistent/blk.sock"];
    let e = run("64M", &disk);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.contains("A vhost-user disk needs shared guest memory"),
        "{e}"
    );
    let generic = [
        "--generic-vhost-user",
        "socket=/nonexistent/g.sock,device_type=2,queue_sizes=[128]",
    ];
    let e = run("64M", &generic);
    assert!(
        e.contains("A generic vhost-user device needs shared guest memory"),
        "{e}"
    );
    let e = run("64M", &["--disk", "vhost_user=on,socket=/s,readonly=on"]);
    assert!(e.contains("the vhost-user back end's to set"), "{e}");
    if kvm_available("vhost_user_blk_no_back_end") {
        for args in [&disk[..], &generic[..]] {
            let e = run("size=64M,shared=on", args);
            assert_eq!(e.lines().count(), 1, "{e}");
            assert!(
                e.contains("Cannot connect to the vhost-user back end at /nonexistent/"),
                "{e}"
            );
        }
    }
    std::fs::remove_file(&kernel).ok();
}

/// The `vm.create` body of a bench-guest VM on 128 MiB of shared memory with `disks`, its
/// console in a file.
fn create_body(kernel: &Path, cmdline: &str, serial: &Path, disks: serde_json::Value) -> String {
    let memory = serde_json::json!({"size": 128u64 << 20, "shared": true});
    let extra = serde_json::json!({"memory": memory, "disks": disks});
    bench_vm_body(kernel, cmdline, serial, extra).to_string()
}

/// `vm.create` with a `disks[]` entry `{"vhost_user": true, "vhost_socket"}`: the guest's
/// check passes at boot, `vm.info` shows the disk as it was given.
#[test]
fn vm_create_boots_with_a_vhost_user_disk() {
    if !kvm_or_skip("api_vhost_user_blk_boot") {
        return;
    }
    let image = Image::new("vublk-create", 16);
    let Some(d) = daemon("api_vhost_user_blk_boot", &image.0) else {
        return;
    };
    let kernel = export_guest("vublk-create");
    let serial = kernel.with_extension("log");
    for bin in common::builds() {
        // The console is appended to: each build's run reads its own.
        std::fs::remove_file(&serial).ok();
        let vmm = Vmm::start_build(&bin, "vublk-create");
        let mut c = vmm.client();
        let disks =
            serde_json::json!([{"vhost_user": true, "vhost_socket": d.socket, "id": "vu0"}]);
        let cmdline = format!("case=virtio_check iters=8 seed={SEED}");
        let body = create_body(&kernel, &cmdline, &serial, disks);
        ok(
            c.request("PUT", "vm.create", Some(&body)).unwrap(),
            "vm.create",
        );
        let info = json(&ok(c.request("GET", "vm.info", None).unwrap(), "vm.info"));
        let disk = &info["config"]["disks"][0];
        assert_eq!(
            (&disk["vhost_user"], &disk["id"]),
            (&serde_json::json!(true), &serde_json::json!("vu0")),
            "{info}"
        );
        ok(c.request("PUT", "vm.boot", None).unwrap(), "vm.boot");
        wait_serial(&serial, "EXITLESS VIRTIO blk verified bytes=32768");
        assert_eq!(pattern_mismatches(&image.0, 8), 0);
        ok(
            c.request("PUT", "vmm.shutdown", None).unwrap(),
            "vmm.shutdown",
        );
        std::fs::write(&image.0, vec![0u8; 16 << 20]).unwrap();
    }
    for f in [&kernel, &serial] {
        std::fs::remove_file(f).ok();
    }
}

/// ch-remote's `add-disk vhost_user=true,socket=…` and `add-generic-vhost-user
/// socket=…,device_type=2,queue_sizes=[128]`: each a disk the running guest finds (PCI
/// hotplug), writes, reads back and ejects on `remove-device`; the image changed.
#[test]
fn ch_remote_hot_adds_a_vhost_user_disk_and_a_generic_vhost_user_device() {
    if !kvm_or_skip("ch_remote_vhost_user") {
        return;
    }
    let Some(remote) = common::ch_remote::find("ch_remote_vhost_user", "not run") else {
        return;
    };
    let image = Image::new("vublk-hp", 16);
    let Some(d) = daemon("ch_remote_vhost_user", &image.0) else {
        return;
    };
    let kernel = export_guest("vublk-hp");
    let serial = kernel.with_extension("log");
    let socket = d.socket.display().to_string();
    let adds = [
        (
            "add-disk",
            format!("vhost_user=true,socket={socket},id=vu1"),
        ),
        (
            "add-generic-vhost-user",
            format!("socket={socket},device_type=2,queue_sizes=[128],id=vu1"),
        ),
    ];
    for (command, spec) in adds {
        std::fs::remove_file(&serial).ok();
        let vmm = Vmm::start(&format!("vublk-hp-{command}"));
        let mut c = vmm.client();
        let body = create_body(
            &kernel,
            "case=hotplug_disk iters=4 hold",
            &serial,
            serde_json::json!([]),
        );
        ok(
            c.request("PUT", "vm.create", Some(&body)).unwrap(),
            "vm.create",
        );
        ok(c.request("PUT", "vm.boot", None).unwrap(), "vm.boot");
        wait_serial(&serial, "EXITLESS HOTPLUG ready");
        let (done, said) = common::ch_remote::run(&remote, &vmm.socket, &[command, &spec]);
        assert!(done, "{command}: {said}");
        assert!(said.contains("\"id\":\"vu1\""), "{command}: {said}");
        let text = wait_serial(&serial, "EXITLESS HOTPLUG waiting for removal");
        assert!(
            text.contains("EXITLESS VIRTIO blk verified bytes=16384"),
            "{text}"
        );
        // The hotplug case writes the pattern of seed 1.
        assert_eq!(seeded_mismatches(&image.0, 4, 1), 0, "{command}");
        let (done, said) = common::ch_remote::run(&remote, &vmm.socket, &["remove-device", "vu1"]);
        assert!(done, "{said}");
        wait_serial(&serial, "EXITLESS HOTPLUG removed slot=");
        ok(
            c.request("PUT", "vmm.shutdown", None).unwrap(),
            "vmm.shutdown",
        );
        std::fs::write(&image.0, vec![0u8; 16 << 20]).unwrap();
    }
    for f in [&kernel, &serial] {
        std::fs::remove_file(f).ok();
    }
}

/// The guest's hostile requests (65,024 segments in one indirect table, far past seg_max)
/// reach qemu-storage-daemon only: it ends the connection (libvhost-user's "too many
/// descriptors in indirect table"), exitless says so in one line and puts the device in
/// DEVICE_NEEDS_RESET, never panics, and the VM ends as the guest ends it.
#[test]
fn a_guest_s_hostile_requests_reach_the_daemon_only() {
    if !kvm_available("vhost_user_blk_hostile") {
        return;
    }
    let image = Image::new("vublk-hostile", 16);
    let Some(d) = daemon("vhost_user_blk_hostile", &image.0) else {
        return;
    };
    let guest = export_guest("vublk-hostile");
    let o = common::exitless()
        .args(["run", "--kernel"])
        .arg(&guest)
        .args(["--memory", "size=64M,shared=on", "--timeout", "90"])
        .arg("--disk")
        .arg(format!("vhost_user=on,socket={}", d.socket.display()))
        .args(["--cmdline", "case=virtio_blk_hostile iters=4"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    std::fs::remove_file(&guest).ok();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    let all = format!("{out}\n{err}");
    assert_eq!(o.status.code(), Some(0), "{all}");
    assert!(!err.contains("panicked"), "{all}");
    assert!(out.contains("EXITLESS BLK hostile ready"), "{all}");
    let gone = format!(
        "the vhost-user back end at {} closed its socket; the device needs a reset",
        d.socket.display()
    );
    assert_eq!(err.matches(&gone).count(), 1, "{all}");
    assert_eq!(err.matches("needs a reset").count(), 1, "{all}");
}
