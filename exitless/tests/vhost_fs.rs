//! virtio-fs end to end against the real virtiofsd: `exitless run --fs` with shared memory
//! (the handshake, seen in both processes' logs, and the bench guest's FUSE driver reading a
//! host file and writing one through the device), refusals that are one line, and the API's
//! `vm.create` with `fs`, `vm.add-fs` and `vm.remove-device`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::virtiofsd::{pattern, Virtiofsd};
use common::{exitless, export_guest, kvm_available};
use vmm::api::client::ApiClient;

#[test]
fn the_guest_reaches_virtiofsd_through_exitless() {
    if !kvm_available("virtio_fs_end_to_end") {
        return;
    }
    let Some(daemon) = Virtiofsd::start("fs_e2e") else {
        return;
    };
    let data: Vec<u8> = (0..65536).map(pattern).collect();
    std::fs::write(daemon.shared().join("in.bin"), &data).unwrap();
    let guest = export_guest("vhost-fs");
    let o = exitless()
        .args(["run", "--kernel"])
        .arg(&guest)
        .args(["--memory", "size=64M,shared=on", "--timeout", "60"])
        .args(["--fs", &daemon.fs_arg(), "--cmdline", "case=fs_check"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    std::fs::remove_file(&guest).ok();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{out}\n{err}");
    // The handshake, in both logs: exitless connected and negotiated, virtiofsd served it.
    let connected = format!(
        "vhost-user back end at {} connected",
        daemon.socket.display()
    );
    assert!(err.contains(&connected), "{err}");
    assert!(
        daemon.wait_log("Client connected, servicing requests"),
        "{}",
        daemon.log_text()
    );
    // exitless ended: the connection closed with it, and virtiofsd saw that.
    assert!(
        daemon.wait_log("Client disconnected"),
        "{}",
        daemon.log_text()
    );
    // The whole data path: the guest's FUSE driver read the host's file and wrote one.
    assert!(
        out.contains("EXITLESS VIRTIO fs tag=kataShared matches"),
        "{out}"
    );
    assert!(out.contains("EXITLESS VIRTIO fs result=pass"), "{out}");
    let written = std::fs::read(daemon.shared().join("out.bin")).unwrap();
    assert!(written == data, "the guest's file holds the pattern");
}

#[test]
fn virtio_fs_on_private_memory_or_without_a_back_end_is_one_line() {
    let kernel = std::env::temp_dir().join("exitless-no-such-kernel-needed");
    std::fs::write(&kernel, b"not read").unwrap();
    let run = |memory: &str, fs: &str| {
        let o = exitless()
            .args(["run", "--kernel"])
            .arg(&kernel)
            .args(["--memory", memory, "--fs", fs])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1));
        String::from_utf8_lossy(&o.stderr).trim().to_string()
    };
    let e = run("64M", "tag=t,socket=/nonexistent/fs.sock");
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.contains("needs shared guest memory") && e.contains("shared=on"),
        "{e}"
    );
    if kvm_available("virtio_fs_no_back_end") {
        let e = run("size=64M,shared=on", "tag=t,socket=/nonexistent/fs.sock");
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(
            e.contains("Cannot connect to the vhost-user back end at /nonexistent/fs.sock"),
            "{e}"
        );
    }
    std::fs::remove_file(&kernel).ok();
}

/// `exitless --api-socket`, killed when dropped.
struct ApiVmm {
    child: Child,
    socket: PathBuf,
}

impl ApiVmm {
    fn start(tag: &str) -> Self {
        let socket =
            std::env::temp_dir().join(format!("exitless-fsapi-{tag}-{}.sock", std::process::id()));
        let child = exitless()
            .args(["--api-socket"])
            .arg(&socket)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while ApiClient::connect(&socket, Duration::from_secs(5)).is_err() {
            assert!(start.elapsed() < Duration::from_secs(10), "no API socket");
            std::thread::sleep(Duration::from_millis(10));
        }
        ApiVmm { child, socket }
    }

    fn call(&self, method: &str, endpoint: &str, body: Option<&str>) -> (u16, String) {
        let mut c = ApiClient::connect(&self.socket, Duration::from_secs(30)).unwrap();
        let r = c.request(method, endpoint, body);
        let r = r.unwrap_or_else(|e| panic!("{method} {endpoint}: {e}"));
        (r.status, r.body)
    }
}

impl ApiVmm {
    /// `vmm.shutdown` (204), then the process ends (status 0) within 5 s.
    fn shut_down(mut self) {
        let mut c = ApiClient::connect(&self.socket, Duration::from_secs(30)).unwrap();
        let r = c.request("PUT", "vmm.shutdown", None).unwrap();
        assert_eq!(r.status, 204, "{}", r.body);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(status)) = self.child.try_wait() {
                assert!(status.success(), "{status}");
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("the VMM did not end after vmm.shutdown");
    }
}

impl Drop for ApiVmm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn create_body(kernel: &Path, shared: bool, fs: Option<&Virtiofsd>) -> String {
    let mut body = serde_json::json!({
        "cpus": {"boot_vcpus": 1, "max_vcpus": 1},
        "memory": {"size": 64u64 << 20, "shared": shared, "hugepages": false},
        "payload": {"kernel": kernel, "cmdline": "case=pio_out iters=100000000"},
        "serial": {"mode": "Off"},
        "platform": {"num_pci_segments": 2},
    });
    if let Some(d) = fs {
        body["fs"] = serde_json::json!([{"tag": "kataShared", "socket": d.socket,
            "num_queues": 1, "queue_size": 1024, "pci_segment": 1}]);
    }
    body.to_string()
}

#[test]
fn the_api_creates_hot_adds_and_removes_virtio_fs() {
    if !kvm_available("virtio_fs_api") {
        return;
    }
    let Some(boot_fs) = Virtiofsd::start("fs_api_boot") else {
        return;
    };
    let Some(hot_fs) = Virtiofsd::start("fs_api_hot") else {
        return;
    };
    let kernel = export_guest("vhost-fs-api");
    let vmm = ApiVmm::start("fs");
    // Kata's body on private memory: 400 naming memory.shared.
    let (status, why) = vmm.call(
        "PUT",
        "vm.create",
        Some(&create_body(&kernel, false, Some(&boot_fs))),
    );
    assert_eq!(status, 400, "{why}");
    assert!(why.contains("memory.shared"), "{why}");
    let (status, why) = vmm.call(
        "PUT",
        "vm.create",
        Some(&create_body(&kernel, true, Some(&boot_fs))),
    );
    assert_eq!(status, 204, "{why}");
    let (status, why) = vmm.call("PUT", "vm.boot", None);
    assert_eq!(status, 204, "{why}");
    assert!(boot_fs.wait_log("Client connected, servicing requests"));
    let add =
        serde_json::json!({"tag": "second", "socket": hot_fs.socket, "id": "myfs"}).to_string();
    let (status, added) = vmm.call("PUT", "vm.add-fs", Some(&add));
    assert_eq!(status, 200, "{added}");
    let added: serde_json::Value = serde_json::from_str(&added).unwrap();
    assert_eq!(added["id"], "myfs");
    let bdf = added["bdf"].as_str().unwrap();
    assert!(bdf.starts_with("0000:00:") && bdf.ends_with(".0"), "{bdf}");
    assert!(hot_fs.wait_log("Client connected, servicing requests"));
    let (_, info) = vmm.call("GET", "vm.info", None);
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["config"]["memory"]["shared"], true);
    let tags: Vec<&str> = info["config"]["fs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["tag"].as_str())
        .collect();
    assert_eq!(tags, ["kataShared", "second"]);
    let (_, counters) = vmm.call("GET", "vm.counters", None);
    let counters: serde_json::Value = serde_json::from_str(&counters).unwrap();
    assert_eq!(
        counters["_fs0"]["backend_starts"], 0,
        "no driver started it: {counters}"
    );
    let (status, why) = vmm.call("PUT", "vm.remove-device", Some(r#"{"id": "myfs"}"#));
    assert_eq!(status, 204, "{why}");
    let (_, info) = vmm.call("GET", "vm.info", None);
    assert!(!info.contains("\"second\""), "{info}");
    // The VMM ends: both connections close with it.
    vmm.shut_down();
    assert!(
        boot_fs.wait_log("Client disconnected"),
        "{}",
        boot_fs.log_text()
    );
    assert!(
        hot_fs.wait_log("Client disconnected"),
        "{}",
        hot_fs.log_text()
    );
    std::fs::remove_file(&kernel).ok();
}
