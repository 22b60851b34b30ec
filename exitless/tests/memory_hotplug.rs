//! Memory hotplug through the API, as Kata Containers asks it of Cloud Hypervisor
//! (`vm.resize {"desired_ram": N}` with `hotplug_method` Acpi): the bench guest's own driver
//! (bench-guest/memory_hotplug.c) finds the new memory through the ACPI memory hotplug
//! controller, maps it and writes and reads back every byte of it.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{exitless, export_guest, kvm_available};
use exitless_control::api::client::{ApiClient, Reply};
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// `exitless --api-socket`, killed when dropped.
struct ApiVmm {
    child: Child,
    socket: PathBuf,
}

impl ApiVmm {
    fn start(tag: &str) -> Self {
        let socket = scratch(tag, "sock");
        let child = exitless()
            .arg("--api-socket")
            .arg(&socket)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let vmm = ApiVmm { child, socket };
        let start = Instant::now();
        while ApiClient::connect(&vmm.socket, Duration::from_secs(30)).is_err() {
            assert!(start.elapsed() < Duration::from_secs(10), "no API socket");
            std::thread::sleep(Duration::from_millis(10));
        }
        vmm
    }

    fn client(&self) -> ApiClient {
        ApiClient::connect(&self.socket, Duration::from_secs(60)).unwrap()
    }

    /// Mappings of guest RAM files (memfds) in the VMM.
    fn ram_files(&self) -> usize {
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", self.child.id()));
        maps.unwrap_or_default()
            .lines()
            .filter(|l| l.contains("memfd:exitless-guest-ram"))
            .count()
    }
}

impl Drop for ApiVmm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn scratch(tag: &str, ext: &str) -> PathBuf {
    std::env::temp_dir().join(format!("exitless-memhp-{tag}-{}.{ext}", std::process::id()))
}

fn request(c: &mut ApiClient, method: &str, path: &str, body: Option<Value>) -> Reply {
    let body = body.map(|b| b.to_string());
    c.request(method, path, body.as_deref()).unwrap()
}

fn ok(r: Reply, what: &str) -> Reply {
    assert!(
        r.status == 200 || r.status == 204,
        "{what}: {} {}",
        r.status,
        r.body
    );
    r
}

fn resize(c: &mut ApiClient, bytes: u64) -> Reply {
    let body = serde_json::json!({ "desired_ram": bytes });
    request(c, "PUT", "vm.resize", Some(body))
}

/// (`memory_actual_size`, `config.memory.size`) from `vm.info`.
fn sizes(c: &mut ApiClient) -> (u64, u64) {
    let r = ok(request(c, "GET", "vm.info", None), "vm.info");
    let info: Value = serde_json::from_str(&r.body).unwrap();
    let actual = info["memory_actual_size"].as_u64().unwrap();
    (actual, info["config"]["memory"]["size"].as_u64().unwrap())
}

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

/// Creates and boots the bench guest in `memory_hotplug_check` with `memory`.
fn boot(c: &mut ApiClient, kernel: &Path, serial: &Path, memory: Value) {
    let body = serde_json::json!({
        "cpus": {"boot_vcpus": 1, "max_vcpus": 1},
        "memory": memory,
        "payload": {"kernel": kernel, "cmdline": "case=memory_hotplug_check hold"},
        "serial": {"mode": "File", "file": serial},
        "console": {"mode": "Off"},
    });
    ok(request(c, "PUT", "vm.create", Some(body)), "vm.create");
    ok(request(c, "PUT", "vm.boot", None), "vm.boot");
    wait_serial(serial, "EXITLESS MEMORY ready");
}

/// 256 MiB of shared memory (Kata's virtio-fs default) grows to 512 MiB: the guest finds,
/// maps and verifies every new byte; `vm.info` follows; over the limit, unaligned growth
/// and a VM without `hotplug_size` are refused, shrinking changes nothing.
#[test]
fn desired_ram_adds_memory_the_guest_uses() {
    if !kvm_available("memory_hotplug_api") {
        return;
    }
    let kernel = export_guest("memhp");
    let serial = scratch("run", "log");
    let vmm = ApiVmm::start("run");
    let mut c = vmm.client();
    let memory = serde_json::json!({"size": 256 * MIB, "hotplug_size": 1024 * MIB,
        "hotplug_method": "Acpi", "shared": true});
    boot(&mut c, &kernel, &serial, memory);
    let files = vmm.ram_files();
    for (bytes, why) in [
        (2048 * MIB, "above the VM's limit of 1342177280 bytes"),
        (320 * MIB, "whole blocks of 134217728 bytes"),
        (256 * MIB + 1, "not a whole number of MiB"),
    ] {
        let r = resize(&mut c, bytes);
        assert_eq!(r.status, 400, "{bytes}: {}", r.body);
        assert!(r.body.contains(why), "{bytes}: {}", r.body);
    }
    ok(resize(&mut c, 128 * MIB), "shrinking");
    assert_eq!(
        sizes(&mut c),
        (256 * MIB, 256 * MIB),
        "shrinking changes nothing"
    );
    ok(resize(&mut c, 512 * MIB), "vm.resize");
    let text = wait_serial(&serial, "EXITLESS MEMORY hotplug");
    let want = "EXITLESS MEMORY hotplug slot=0 base=0x0000000100000000 bytes=268435456 \
                verified=268435456";
    assert!(text.contains(want), "{text}");
    assert_eq!(sizes(&mut c), (512 * MIB, 512 * MIB));
    assert_eq!(
        vmm.ram_files(),
        files + 1,
        "the new region is shared memory too"
    );
    ok(resize(&mut c, 256 * MIB), "shrinking");
    assert_eq!(sizes(&mut c), (512 * MIB, 512 * MIB));
    ok(request(&mut c, "PUT", "vm.delete", None), "vm.delete");

    // Without hotplug_size: what Kata's driver never asks (it caps at hotplug_size).
    let serial2 = scratch("plain", "log");
    boot(
        &mut c,
        &kernel,
        &serial2,
        serde_json::json!({"size": 256 * MIB}),
    );
    let r = resize(&mut c, 512 * MIB);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.body.contains("memory hotplug not supported"),
        "{}",
        r.body
    );
    ok(resize(&mut c, 256 * MIB), "the size it has");
    ok(request(&mut c, "PUT", "vmm.shutdown", None), "vmm.shutdown");
    for f in [&kernel, &serial, &serial2] {
        let _ = std::fs::remove_file(f);
    }
}
