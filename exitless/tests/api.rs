//! `exitless --api-socket`: the process Kata Containers starts, driven over its socket as Kata
//! drives it (control/src/api/fixtures/kata_clh_sandbox.json), and hotplug proven with the bench guest's
//! own driver (a disk added, used and ejected; a CPU added and started).

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::api_vmm::{json, kvm_or_skip, ok, Vmm};
use common::{exitless, export_guest};
use exitless_control::api::client::ApiClient;
use serde_json::Value;

fn info(c: &mut ApiClient) -> Value {
    json(&ok(c.request("GET", "vm.info", None).unwrap(), "vm.info"))
}

/// Waits until the serial log at `path` holds `line`.
fn wait_serial(path: &Path, line: &str) -> String {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(line) {
            return text;
        }
        assert!(!text.contains("EXITLESS ERROR"), "{text}");
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "no '{line}' in:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `vm.create` body of a bench-guest VM with its serial console in a file.
fn create_body(kernel: &Path, cmdline: &str, serial: &Path, max_vcpus: u8) -> String {
    serde_json::json!({
        "cpus": {"boot_vcpus": 1, "max_vcpus": max_vcpus},
        "memory": {"size": 128u64 << 20},
        "payload": {"kernel": kernel, "cmdline": cmdline},
        "serial": {"mode": "File", "file": serial},
        "console": {"mode": "Off"},
    })
    .to_string()
}

fn scratch(tag: &str, ext: &str) -> PathBuf {
    std::env::temp_dir().join(format!("exitless-api-{tag}-{}.{ext}", std::process::id()))
}

/// The guest's driver finds a disk added while it runs, writes and reads it back, gives it
/// back when asked, and its slot reads empty after the eject; the VMM holds no more file
/// descriptors afterwards than before.
#[test]
fn a_disk_is_hot_added_used_and_ejected() {
    if !kvm_or_skip("api_hotplug_disk") {
        return;
    }
    let kernel = export_guest("api-hpdisk");
    let (serial, image) = (scratch("hpdisk", "log"), scratch("hpdisk", "img"));
    std::fs::write(&image, vec![0u8; 1 << 20]).unwrap();
    let vmm = Vmm::start("hpdisk");
    let mut c = vmm.client();
    let body = create_body(&kernel, "case=hotplug_disk iters=4 hold", &serial, 1);
    ok(
        c.request("PUT", "vm.create", Some(&body)).unwrap(),
        "vm.create",
    );
    ok(c.request("PUT", "vm.boot", None).unwrap(), "vm.boot");
    wait_serial(&serial, "EXITLESS HOTPLUG ready");
    let fds_before = vmm.fds();
    let disk = serde_json::json!({"path": image, "id": "hp0"}).to_string();
    let added = json(&ok(
        c.request("PUT", "vm.add-disk", Some(&disk)).unwrap(),
        "add-disk",
    ));
    assert_eq!(added["id"], "hp0");
    let bdf = added["bdf"].as_str().unwrap().to_string();
    assert!(bdf.starts_with("0000:00:") && bdf.ends_with(".0"), "{bdf}");
    let slot = u64::from_str_radix(&bdf[8..10], 16).unwrap();
    let text = wait_serial(&serial, "EXITLESS HOTPLUG waiting for removal");
    assert!(
        text.contains(&format!("EXITLESS HOTPLUG added slot={slot}")),
        "{text}"
    );
    assert!(
        text.contains("EXITLESS VIRTIO blk verified bytes=16384"),
        "{text}"
    );
    let counters = json(&ok(
        c.request("GET", "vm.counters", None).unwrap(),
        "counters",
    ));
    assert!(
        counters["hp0"]["queue0_completed"].as_u64().unwrap() > 0,
        "{counters}"
    );
    let remove = serde_json::json!({"id": "hp0"}).to_string();
    ok(
        c.request("PUT", "vm.remove-device", Some(&remove)).unwrap(),
        "remove-device",
    );
    wait_serial(&serial, &format!("EXITLESS HOTPLUG removed slot={slot}"));
    let start = Instant::now();
    while vmm.fds() > fds_before && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        vmm.fds(),
        fds_before,
        "every descriptor of the removed disk is closed"
    );
    let counters = json(&ok(
        c.request("GET", "vm.counters", None).unwrap(),
        "counters",
    ));
    assert!(counters.get("hp0").is_none(), "{counters}");
    assert!(
        info(&mut c)["config"]["disks"].is_null()
            || info(&mut c)["config"]["disks"] == serde_json::json!([])
    );
    let written = std::fs::read(&image).unwrap();
    assert!(
        written[..4096].iter().any(|&b| b != 0),
        "the guest's pattern reached the image"
    );
    ok(
        c.request("PUT", "vmm.shutdown", None).unwrap(),
        "vmm.shutdown",
    );
    for f in [&kernel, &serial, &image] {
        let _ = std::fs::remove_file(f);
    }
}

/// `vm.resize` adds a vCPU (thread `vcpu1`) that the guest finds through the CPU hotplug
/// controller and starts with INIT/SIPI; it runs guest code.
#[test]
fn a_vcpu_added_by_resize_runs_guest_code() {
    if !kvm_or_skip("api_hotplug_cpu") {
        return;
    }
    let kernel = export_guest("api-hpcpu");
    let serial = scratch("hpcpu", "log");
    let vmm = Vmm::start("hpcpu");
    let mut c = vmm.client();
    let body = create_body(&kernel, "case=hotplug_cpu hold", &serial, 2);
    ok(
        c.request("PUT", "vm.create", Some(&body)).unwrap(),
        "vm.create",
    );
    ok(c.request("PUT", "vm.boot", None).unwrap(), "vm.boot");
    wait_serial(&serial, "EXITLESS HOTPLUG cpu ready");
    assert!(!vmm.threads().contains(&"vcpu1".to_string()));
    let resize = r#"{"desired_vcpus":2}"#;
    ok(
        c.request("PUT", "vm.resize", Some(resize)).unwrap(),
        "vm.resize",
    );
    assert!(
        vmm.threads().contains(&"vcpu1".to_string()),
        "{:?}",
        vmm.threads()
    );
    let text = wait_serial(&serial, "EXITLESS HOTPLUG cpu started id=1");
    assert!(text.contains("EXITLESS CPU ap=1 apic=1 up"), "{text}");
    assert_eq!(info(&mut c)["config"]["cpus"]["boot_vcpus"], 2);
    let too_many = c
        .request("PUT", "vm.resize", Some(r#"{"desired_vcpus":3}"#))
        .unwrap();
    assert_eq!(too_many.status, 400, "{}", too_many.body);
    ok(
        c.request("PUT", "vmm.shutdown", None).unwrap(),
        "vmm.shutdown",
    );
    let _ = std::fs::remove_file(&kernel);
    let _ = std::fs::remove_file(&serial);
}

/// Every request Kata's runtime sent for one sandbox, in order, with the bodies it sent (the
/// tap's fd with vm.add-net, in one sendmsg): each answered as Kata expects, and the process
/// gone within 3 s of vmm.shutdown with its sockets removed.
#[test]
fn the_kata_request_sequence_is_answered_as_kata_expects() {
    if !kvm_or_skip("api_kata_sequence") {
        return;
    }
    let Some((_ns, tap)) = common::kata::tap("api_kata_sequence") else {
        return;
    };
    let kernel = export_guest("api-kata");
    let dir = std::env::temp_dir().join(format!("exitless-kata-{}", std::process::id()));
    let sandbox = common::kata::Sandbox {
        fixture: include_str!("../../control/src/api/fixtures/kata_clh_sandbox.json"),
        dir: &dir,
        kernel: &kernel,
        before_stop: None,
    };
    for bin in common::builds() {
        common::kata::walk(&bin, &sandbox, &tap);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&kernel);
}

fn remote(socket: &Path, args: &[&str]) -> std::process::Output {
    exitless()
        .args(["remote", "--api-socket"])
        .arg(socket)
        .args(args)
        .output()
        .unwrap()
}

/// `exitless remote` drives a VM through its life, prints JSON answers, and says in one line
/// (exit code 1) why a request was refused.
#[test]
fn remote_drives_a_vm_and_reports_refusals() {
    if !kvm_or_skip("api_remote") {
        return;
    }
    let kernel = export_guest("api-remote");
    let serial = scratch("remote", "log");
    let body_file = scratch("remote", "json");
    let body = create_body(&kernel, "case=pio_out iters=100000000", &serial, 1);
    std::fs::write(&body_file, body).unwrap();
    let mut vmm = Vmm::start("remote");
    let run = |args: &[&str]| {
        let o = remote(&vmm.socket, args);
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        (
            o.status.code(),
            text,
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    assert_eq!(run(&["create", body_file.to_str().unwrap()]).0, Some(0));
    assert_eq!(run(&["boot"]).0, Some(0));
    let (code, out, _) = run(&["info"]);
    assert_eq!(code, Some(0));
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()["state"],
        "Running"
    );
    assert_eq!(run(&["pause"]).0, Some(0));
    let (code, _, err) = run(&["pause"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("405") && err.contains("Paused"), "{err}");
    assert_eq!(run(&["resume"]).0, Some(0));
    let (code, out, _) = run(&["profile"]);
    assert_eq!(code, Some(0));
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()["schema"],
        "exitless.profile/1"
    );
    let (code, _, err) = run(&["remove-device", "nope"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("404"), "{err}");
    assert_eq!(run(&["shutdown-vmm"]).0, Some(0));
    assert!(vmm.wait_exit(Duration::from_secs(3)).is_some());
    for f in [&kernel, &serial, &body_file] {
        let _ = std::fs::remove_file(f);
    }
}

/// SIGTERM ends an API VMM with a running VM within a second and removes its socket; a
/// socket another VMM serves is refused in one line.
#[test]
fn sigterm_ends_the_vmm_and_a_busy_socket_is_refused() {
    if !kvm_or_skip("api_sigterm") {
        return;
    }
    let kernel = export_guest("api-term");
    let serial = scratch("term", "log");
    let mut vmm = Vmm::start("term");
    let mut c = vmm.client();
    let body = create_body(&kernel, "case=pio_out iters=100000000", &serial, 1);
    ok(
        c.request("PUT", "vm.create", Some(&body)).unwrap(),
        "vm.create",
    );
    ok(c.request("PUT", "vm.boot", None).unwrap(), "vm.boot");
    let second = exitless()
        .arg("--api-socket")
        .arg(&vmm.socket)
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(1));
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("in use") && err.lines().count() == 1, "{err}");
    // SAFETY: kill sends a signal to the child this test started; no memory is involved.
    unsafe { libc::kill(vmm.pid() as i32, libc::SIGTERM) };
    let status = vmm
        .wait_exit(Duration::from_secs(1))
        .expect("gone within a second");
    assert_eq!(status.code(), Some(130));
    assert!(!vmm.socket.exists());
    let _ = std::fs::remove_file(&kernel);
    let _ = std::fs::remove_file(&serial);
}
