//! Kata Containers' request sequences (control/src/api/fixtures/kata_clh_*.json) replayed
//! against `exitless --api-socket` as Kata's clh driver sends them, tap fd included.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use vmm::devices::virtio::net::private_net::{PrivateNet, KATA_TAP_FLAGS};

use super::api_vmm::{json, ok, Vmm};

/// A tap opened as Kata opens it (multi-queue, vnet header), in a network namespace of the
/// test's own; None (the test said it skipped) without root.
pub fn tap(test: &str) -> Option<(PrivateNet, OwnedFd)> {
    let made = PrivateNet::create().and_then(|ns| {
        let fd = ns.open_foreign_tap("kata-tap0", KATA_TAP_FLAGS)?;
        Ok((ns, fd))
    });
    match made {
        Ok(t) => Some(t),
        Err(e) => {
            let why = format!("cannot open a tap as Kata does (needs root): {e}");
            vmm::test_skip::skip(test, &why);
            None
        }
    }
}

/// Where a sequence runs: its fixture, a scratch folder for @TMP@ and @VMDIR@ (holding
/// rootfs.img and hotplug.img, made here), the kernel for @KERNEL@, and what to wait for
/// before Kata stops the VM (the pod's life: the guest's own work).
pub struct Sandbox<'a> {
    pub fixture: &'a str,
    pub dir: &'a Path,
    pub kernel: &'a Path,
    pub before_stop: Option<&'a dyn Fn()>,
}

/// Sends every request of the sandbox's sequence to build `bin`, checking each answer as
/// Kata would need it; ends with the process gone within 3 s of `vmm.shutdown`, its API and
/// vsock sockets removed. Returns the VMM's stderr.
pub fn walk(bin: &Path, sandbox: &Sandbox, tap: &impl AsRawFd) -> String {
    std::fs::create_dir_all(sandbox.dir).unwrap();
    std::fs::write(sandbox.dir.join("rootfs.img"), vec![0u8; 1 << 20]).unwrap();
    std::fs::write(sandbox.dir.join("hotplug.img"), vec![0u8; 1 << 20]).unwrap();
    let dir = sandbox.dir.to_str().unwrap();
    let seq = sandbox
        .fixture
        .replace("@TMP@", dir)
        .replace("@VMDIR@", dir)
        .replace("@KERNEL@", sandbox.kernel.to_str().unwrap());
    let seq: Value = serde_json::from_str(&seq).unwrap();
    let mut vmm = Vmm::start_build(bin, "kata");
    let mut c = vmm.client();
    let mut disk_id = String::new();
    let mut booted = false;
    for r in seq["requests"].as_array().unwrap() {
        let (method, path) = (r["method"].as_str().unwrap(), r["path"].as_str().unwrap());
        let endpoint = path.trim_start_matches("/api/v1/");
        let body =
            (!r["body"].is_null()).then(|| r["body"].to_string().replace("@DISK_ID@", &disk_id));
        if endpoint == "vmm.shutdown" {
            if let Some(wait) = sandbox.before_stop {
                wait();
            }
        }
        let fds: Vec<i32> = if r["fds"].as_u64() == Some(1) {
            vec![tap.as_raw_fd()]
        } else {
            vec![]
        };
        let reply = c
            .request_with_fds(method, endpoint, body.as_deref(), &fds)
            .unwrap();
        let reply = ok(reply, endpoint);
        match endpoint {
            "vm.boot" => booted = true,
            "vm.info" if !booted => assert_eq!(json(&reply)["state"], "Created"),
            "vm.info" => {
                let i = json(&reply);
                assert_eq!(i["state"], "Running");
                assert!(i["memory_actual_size"].as_u64().unwrap() > 0);
                assert!(vmm.threads().iter().any(|t| t == "vcpu0"));
            }
            "vm.add-disk" => {
                let added = json(&reply);
                disk_id = added["id"].as_str().unwrap().to_string();
                let bdf = added["bdf"].as_str().unwrap();
                assert!(bdf.starts_with("0000:00:") && bdf.ends_with(".0"), "{bdf}");
            }
            "vm.resize" => check_resize(&vmm, &r["body"]),
            _ => {}
        }
    }
    let status = vmm
        .wait_exit(Duration::from_secs(3))
        .expect("exitless ends within 3 s of vmm.shutdown");
    assert!(status.success(), "{status:?}");
    assert!(!vmm.socket.exists(), "the API socket is removed");
    assert!(
        !sandbox.dir.join("clh.sock").exists(),
        "the vsock socket is removed"
    );
    vmm.stderr.read_to_end(Duration::from_secs(1));
    assert!(
        vmm.stderr.text.contains("api: vm.add-net -> 204"),
        "{}",
        vmm.stderr.text
    );
    vmm.stderr.text.clone()
}

/// After a resize: the vCPUs' threads are there, the memory is what was asked (vm.info's
/// `config.memory.size`, which Kata reads back, and `memory_actual_size`).
fn check_resize(vmm: &Vmm, body: &Value) {
    if let Some(n) = body["desired_vcpus"].as_u64() {
        let thread = format!("vcpu{}", n - 1);
        assert!(vmm.threads().contains(&thread), "{:?}", vmm.threads());
    }
    if let Some(ram) = body["desired_ram"].as_u64() {
        let mut c = vmm.client();
        let i = json(&ok(c.request("GET", "vm.info", None).unwrap(), "vm.info"));
        assert_eq!(i["config"]["memory"]["size"].as_u64(), Some(ram), "{i}");
        assert_eq!(i["memory_actual_size"].as_u64(), Some(ram), "{i}");
    }
}
