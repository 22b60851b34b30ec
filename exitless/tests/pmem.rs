//! virtio-pmem end to end with the bench guest's own driver: the file mapped into guest
//! memory, the guest's stores reaching it, its flush answered from the devices thread, hostile
//! requests counted; `discard_writes` keeping the file as it was; `ch-remote add-pmem`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use common::api_vmm::{ok, Vmm};
use common::{device_count, export_guest, kvm_available};

const KIB: usize = 64;

/// What the guest's driver (bench-guest/virtio_pmem.c) writes to byte `i` of the region.
fn pattern(i: usize) -> u8 {
    ((i * 7 + 3) ^ (i >> 12)) as u8
}

fn scratch(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("exitless-pmem-{tag}-{}.img", std::process::id()))
}

/// `exitless run` (build `bin`) of `case=pmem_check` on `--pmem PMEM`; console and profile.
fn run(bin: &Path, guest: &Path, pmem: &str, extra: &str) -> (String, serde_json::Value) {
    let json = guest.with_extension("profile.json");
    let o = std::process::Command::new(bin)
        .args(["run", "--kernel"])
        .arg(guest)
        .args(["--memory", "64M", "--timeout", "60", "--pmem", pmem])
        .args(["--cmdline", &format!("case=pmem_check iters={KIB}{extra}")])
        .arg("--profile-json")
        .arg(&json)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(!err.contains("panicked"), "{err}");
    let profile = std::fs::read_to_string(&json).expect("profile written");
    std::fs::remove_file(&json).ok();
    (out, serde_json::from_str(&profile).unwrap())
}

#[test]
fn the_guest_s_stores_and_flush_reach_the_file_and_hostile_requests_are_counted() {
    if !kvm_available("virtio_pmem") {
        return;
    }
    let guest = export_guest("pmem");
    for bin in common::builds() {
        let file = scratch("run");
        std::fs::remove_file(&file).ok();
        let arg = format!("file={},size=2M", file.display());
        let (out, profile) = run(&bin, &guest, &arg, " hostile");
        assert!(out.contains("EXITLESS PMEM region start=0x"), "{out}");
        assert!(out.contains("size=2097152"), "{out}");
        assert!(out.contains("EXITLESS PMEM hostile unknown_ret=1"), "{out}");
        let flushed = format!("EXITLESS PMEM flushed bytes={} ret=0 used=4", KIB * 1024);
        assert!(out.contains(&flushed), "{out}");
        assert!(
            out.contains(&format!("EXITLESS PMEM verified bytes={}", KIB * 1024)),
            "{out}"
        );
        let data = std::fs::read(&file).unwrap();
        assert_eq!(data.len(), 2 << 20);
        let wrong = (0..KIB * 1024).filter(|&i| data[i] != pattern(i)).count();
        assert_eq!(wrong, 0, "the file holds what the guest stored");
        let dev = profile["virtio"]
            .as_array()
            .and_then(|d| d.iter().find(|d| d["device"] == "virtio-pmem0"))
            .unwrap_or_else(|| panic!("{profile:#}"));
        assert_eq!(device_count(dev, "flushes"), 1, "{dev:#}");
        assert_eq!(device_count(dev, "unknown_requests"), 1, "{dev:#}");
        assert_eq!(dev["queues"][0]["malformed"], 2, "{dev:#}");
        // discard_writes: the same run, the file left as it was.
        std::fs::write(&file, vec![0u8; 2 << 20]).unwrap();
        let arg = format!("file={},discard_writes=on", file.display());
        let (out, _) = run(&bin, &guest, &arg, "");
        assert!(out.contains("EXITLESS PMEM verified bytes="), "{out}");
        assert!(std::fs::read(&file).unwrap().iter().all(|&b| b == 0));
        std::fs::remove_file(&file).ok();
    }
    std::fs::remove_file(&guest).ok();
}

#[test]
fn a_bad_pmem_is_one_line() {
    let kernel = std::env::temp_dir().join("exitless-pmem-no-kernel-needed");
    std::fs::write(&kernel, b"not read").unwrap();
    for (pmem, why) in [
        ("file=/x,size=3M", "not a non-zero multiple of 2 MiB"),
        ("size=2M", "file=PATH is required"),
    ] {
        let o = common::exitless()
            .args(["run", "--kernel"])
            .arg(&kernel)
            .args(["--memory", "64M", "--pmem", pmem])
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&o.stderr).trim().to_string();
        assert_eq!((o.status.code(), e.lines().count()), (Some(1), 1), "{e}");
        assert!(e.contains(why), "{e}");
    }
    std::fs::remove_file(&kernel).ok();
}

/// `ch-remote add-pmem file=…,size=…` before boot: the device joins the VM's config, the
/// booted guest finds it and its stores reach the file.
#[test]
fn ch_remote_adds_a_pmem_device() {
    if !kvm_available("ch_remote_pmem") {
        return;
    }
    let Some(remote) = common::ch_remote::find("ch_remote_pmem", "not run") else {
        return;
    };
    let kernel = export_guest("pmem-api");
    let (serial, file) = (kernel.with_extension("log"), scratch("api"));
    std::fs::remove_file(&file).ok();
    let vmm = Vmm::start("pmem-api");
    let mut c = vmm.client();
    let body = serde_json::json!({
        "cpus": {"boot_vcpus": 1, "max_vcpus": 1},
        "memory": {"size": 128u64 << 20},
        "payload": {"kernel": kernel, "cmdline": format!("case=pmem_check iters={KIB}")},
        "serial": {"mode": "File", "file": serial},
        "console": {"mode": "Off"},
    })
    .to_string();
    ok(
        c.request("PUT", "vm.create", Some(&body)).unwrap(),
        "vm.create",
    );
    let o = std::process::Command::new(&remote)
        .arg("--api-socket")
        .arg(&vmm.socket)
        .args([
            "add-pmem",
            &format!("file={},size=4M,id=pm0", file.display()),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    ok(c.request("PUT", "vm.boot", None).unwrap(), "vm.boot");
    let start = std::time::Instant::now();
    let text = loop {
        let text = std::fs::read_to_string(&serial).unwrap_or_default();
        if text.contains("EXITLESS PMEM verified") || text.contains("EXITLESS ERROR") {
            break text;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "{text}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(
        text.contains("size=4194304") && text.contains("ret=0"),
        "{text}"
    );
    let data = std::fs::read(&file).unwrap();
    assert!(
        (0..KIB * 1024).all(|i| data[i] == pattern(i)),
        "the file holds the pattern"
    );
    ok(
        c.request("PUT", "vmm.shutdown", None).unwrap(),
        "vmm.shutdown",
    );
    // While the VM runs: hot-added (seccomp on, on the API's thread), answered with its bdf.
    std::fs::remove_file(&serial).ok();
    let vmm = Vmm::start("pmem-api-hot");
    let mut c = vmm.client();
    let body = body.replace(
        &format!("case=pmem_check iters={KIB}"),
        "case=hotplug_disk hold",
    );
    ok(
        c.request("PUT", "vm.create", Some(&body)).unwrap(),
        "vm.create",
    );
    ok(c.request("PUT", "vm.boot", None).unwrap(), "vm.boot");
    let start = std::time::Instant::now();
    while !std::fs::read_to_string(&serial)
        .unwrap_or_default()
        .contains("EXITLESS HOTPLUG ready")
    {
        assert!(start.elapsed() < std::time::Duration::from_secs(60));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let o = std::process::Command::new(&remote)
        .arg("--api-socket")
        .arg(&vmm.socket)
        .args(["add-pmem", &format!("file={},id=pm1", file.display())])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        said.contains("\"id\":\"pm1\"") && said.contains("0000:00:"),
        "{said}"
    );
    ok(
        c.request("PUT", "vmm.shutdown", None).unwrap(),
        "vmm.shutdown",
    );
    for f in [&kernel, &serial, &file] {
        std::fs::remove_file(f).ok();
    }
}
