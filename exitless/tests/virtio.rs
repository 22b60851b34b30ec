//! virtio-blk and virtio-rng end to end, driven by the bench guest's own virtio-pci driver:
//! under exitless (the data reaches the image, read-only is enforced, a SIGKILL after the
//! guest's flush loses nothing) and under QEMU's reference devices (the driver is right).

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{exitless, export_guest, guest_pattern, kvm_available, qemu, Image, Stream};

const BLOCKS: usize = 16;
const SEED: u64 = 7;

/// Bytes of `image` that differ from the guest's pattern in the first BLOCKS blocks.
fn pattern_mismatches(image: &Image) -> usize {
    let data = std::fs::read(&image.0).unwrap();
    (0..BLOCKS * 4096)
        .filter(|&n| data[n] != guest_pattern(SEED, (n / 4096) as u64, (n % 4096) as u64))
        .count()
}

fn check_cmdline(extra: &str) -> String {
    format!("case=virtio_check iters={BLOCKS} seed={SEED}{extra}")
}

/// Runs the guest's check; returns its console and the run's profile (JSON).
fn run_check(guest: &Path, disk: &str, rng: bool) -> (String, serde_json::Value) {
    run_check_with(&common::exitless_path(), guest, disk, rng)
}

/// [`run_check`] with build `bin`.
fn run_check_with(bin: &Path, guest: &Path, disk: &str, rng: bool) -> (String, serde_json::Value) {
    let json = guest.with_extension("profile.json");
    let mut cmd = std::process::Command::new(bin);
    cmd.args(["run", "--kernel"])
        .arg(guest)
        .args(["--memory", "64M", "--timeout", "60", "--disk", disk])
        .args(["--cmdline", &check_cmdline("")])
        .arg("--profile-json")
        .arg(&json);
    if rng {
        cmd.arg("--rng");
    }
    let o = cmd.stdin(Stdio::null()).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let profile = std::fs::read_to_string(&json).expect("profile written");
    std::fs::remove_file(&json).ok();
    (out, serde_json::from_str(&profile).expect("profile parses"))
}

#[test]
fn the_guest_writes_flushes_and_reads_back_its_disk_and_gets_random_bytes() {
    if !kvm_available("virtio_check") {
        return;
    }
    let guest = export_guest("virtio-check");
    for bin in common::builds() {
        check_disk_and_rng(&bin, &guest);
    }
    std::fs::remove_file(&guest).ok();
}

fn check_disk_and_rng(bin: &Path, guest: &Path) {
    let image = Image::new("virtio-check", 16);
    let (out, profile) = run_check_with(bin, guest, &image.disk_arg(false), true);
    // The profile shows each device's queue work: the requests the guest made, all served.
    let devices = profile["virtio"].as_array().expect("virtio in the profile");
    let names: Vec<&str> = devices
        .iter()
        .filter_map(|d| d["device"].as_str())
        .collect();
    assert_eq!(names, ["virtio-blk0", "virtio-rng"], "{profile:#}");
    let blk = &devices[0]["queues"][0];
    assert!(blk["completed"].as_u64() > Some(BLOCKS as u64), "{blk}");
    assert_eq!(blk["malformed"], 0, "{blk}");
    assert_eq!(devices[1]["queues"][0]["completed"], 1, "{profile:#}");
    assert!(
        out.contains(&format!(
            "EXITLESS VIRTIO blk flushed blocks={BLOCKS} seed={SEED}"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "EXITLESS VIRTIO blk verified bytes={}",
            BLOCKS * 4096
        )),
        "{out}"
    );
    assert!(out.contains("EXITLESS VIRTIO rng bytes=64 "), "{out}");
    assert!(!out.contains("EXITLESS ERROR"), "{out}");
    assert_eq!(
        pattern_mismatches(&image),
        0,
        "the image holds what the guest wrote"
    );
}

#[test]
fn a_read_only_disk_refuses_the_guest_write_and_stays_unchanged() {
    if !kvm_available("virtio_read_only") {
        return;
    }
    let guest = export_guest("virtio-ro");
    let image = Image::new("virtio-ro", 1);
    let (out, _) = run_check(&guest, &image.disk_arg(true), false);
    std::fs::remove_file(&guest).ok();
    // VIRTIO_BLK_S_IOERR is 1.
    assert!(
        out.contains("EXITLESS VIRTIO blk readonly write_status=1"),
        "{out}"
    );
    assert!(out.contains("EXITLESS VIRTIO rng absent"), "{out}");
    let data = std::fs::read(&image.0).unwrap();
    assert!(
        data.iter().all(|&b| b == 0),
        "a read-only image was written"
    );
}

#[test]
fn a_vmm_killed_right_after_the_guest_flushed_loses_nothing() {
    if !kvm_available("virtio_sigkill_after_flush") {
        return;
    }
    let guest = export_guest("virtio-kill");
    let image = Image::new("virtio-kill", 16);
    let mut child = exitless()
        .args(["run", "--kernel"])
        .arg(&guest)
        .args([
            "--memory",
            "64M",
            "--timeout",
            "60",
            "--disk",
            &image.disk_arg(false),
        ])
        .args(["--cmdline", &check_cmdline(" hold")])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = Stream::spawn(child.stdout.take().unwrap());
    let flushed = out.wait_for(Duration::from_secs(60), |t| t.contains("blk flushed"));
    child.kill().unwrap();
    child.wait().unwrap();
    std::fs::remove_file(&guest).ok();
    assert!(flushed, "{}", out.text);
    assert_eq!(
        pattern_mismatches(&image),
        0,
        "data the guest flushed was lost"
    );
}

#[test]
fn qemu_devices_pass_the_guest_driver_check() {
    let Some(qemu) = qemu("qemu_virtio_devices") else {
        return;
    };
    let guest = export_guest("virtio-qemu");
    let image = Image::new("virtio-qemu", 16);
    let drive = format!("file={},if=none,id=d0,format=raw", image.0.display());
    // KVM where QEMU can use it, else TCG.
    let o = Command::new("timeout")
        .args([
            "120",
            qemu,
            "-accel",
            "kvm",
            "-accel",
            "tcg",
            "-M",
            "pc",
            "-nodefaults",
        ])
        .args(["-m", "128M", "-kernel"])
        .arg(&guest)
        .args([
            "-serial",
            "stdio",
            "-display",
            "none",
            "-monitor",
            "none",
            "-no-reboot",
        ])
        .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=4"])
        .args([
            "-device",
            "virtio-blk-pci,disable-legacy=on,drive=d0",
            "-drive",
            &drive,
        ])
        .args(["-device", "virtio-rng-pci,disable-legacy=on"])
        .args(["-append", &check_cmdline("")])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    std::fs::remove_file(&guest).ok();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    // isa-debug-exit makes QEMU exit with (status << 1) | 1; the guest reports status 0.
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains(&format!(
            "EXITLESS VIRTIO blk verified bytes={}",
            BLOCKS * 4096
        )),
        "{out}"
    );
    assert!(out.contains("EXITLESS VIRTIO rng bytes=64 "), "{out}");
    assert_eq!(
        pattern_mismatches(&image),
        0,
        "QEMU's image holds what the guest wrote"
    );
}
