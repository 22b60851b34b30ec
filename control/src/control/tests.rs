use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::serve::status;
use super::*;
use crate::api::ApiRequest as R;

/// A `vm.create` body as Kata shapes it (trimmed), booting `kernel`.
fn create_body(kernel: &str, cmdline: &str) -> Box<schema::VmConfig> {
    let body = serde_json::json!({
        "cpus": {"boot_vcpus": 1, "max_vcpus": 2},
        "memory": {"size": 64u64 << 20, "hotplug_size": 1u64 << 30},
        "payload": {"kernel": kernel, "cmdline": cmdline},
        "serial": {"mode": "Off"},
        "console": {"mode": "Off"},
        "platform": {"num_pci_segments": 2},
    });
    Box::new(serde_json::from_value(body).expect("a Kata-shaped body parses"))
}

fn message(r: &ApiResponse) -> String {
    match r {
        ApiResponse::Error(e) => e.message.clone(),
        ApiResponse::Json(body) => body.clone(),
        ApiResponse::NoContent => String::new(),
    }
}

fn info(vmm: &mut Vmm) -> serde_json::Value {
    match vmm.handle(R::VmInfo) {
        ApiResponse::Json(body) => serde_json::from_str(&body).unwrap(),
        other => panic!("vm.info answered {} {}", status(&other), message(&other)),
    }
}

fn disk(body: serde_json::Value) -> schema::DiskConfig {
    serde_json::from_value(body).unwrap()
}

#[test]
fn requests_in_the_wrong_state_are_refused_with_the_state_named() {
    let mut vmm = Vmm::new();
    assert_eq!(status(&vmm.handle(R::VmInfo)), 404);
    assert_eq!(status(&vmm.handle(R::VmBoot)), 404);
    assert_eq!(status(&vmm.handle(R::VmPause)), 404);
    assert_eq!(status(&vmm.handle(R::VmCreate(create_body("/k", "")))), 204);
    let again = vmm.handle(R::VmCreate(create_body("/k", "")));
    assert_eq!(status(&again), 405, "{}", message(&again));
    let pause = vmm.handle(R::VmPause);
    assert_eq!(status(&pause), 405);
    assert!(message(&pause).contains("Created"), "{}", message(&pause));
    for r in [R::VmResume, R::VmShutdown, R::VmReboot] {
        let a = vmm.handle(r);
        assert_eq!(status(&a), 405);
        assert!(message(&a).contains("Created"), "{}", message(&a));
    }
    let i = info(&mut vmm);
    assert_eq!(i["state"], "Created");
    assert!(i["memory_actual_size"].as_u64().unwrap() > 0);
    assert_eq!(i["config"]["cpus"]["boot_vcpus"], 1);
    assert_eq!(i["config"]["cpus"]["max_vcpus"], 2);
    assert_eq!(status(&vmm.handle(R::VmDelete)), 204);
    assert_eq!(status(&vmm.handle(R::VmInfo)), 404);
    assert!(vmm.exit().is_none());
    assert_eq!(status(&vmm.handle(R::VmmShutdown)), 204);
    assert_eq!(vmm.exit(), Some(VmmExit(0)));
}

#[test]
fn devices_added_before_boot_join_the_config_with_ids() {
    let mut vmm = Vmm::new();
    vmm.handle(R::VmCreate(create_body("/k", "")));
    let a = vmm.handle(R::VmAddDisk(disk(serde_json::json!({"path": "/a.img"}))));
    assert_eq!(status(&a), 204, "{}", message(&a));
    let b = vmm.handle(R::VmAddDisk(disk(
        serde_json::json!({"path": "/b.img", "id": "mine"}),
    )));
    assert_eq!(status(&b), 204);
    let dup = vmm.handle(R::VmAddDisk(disk(
        serde_json::json!({"path": "/c.img", "id": "mine"}),
    )));
    assert_eq!(status(&dup), 409, "{}", message(&dup));
    let i = info(&mut vmm);
    let ids: Vec<_> = i["config"]["disks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].clone())
        .collect();
    assert_eq!(ids, vec!["_disk0", "mine"]);
    let gone = vmm.handle(R::VmRemoveDevice(
        serde_json::from_value(serde_json::json!({"id": "_disk0"})).unwrap(),
    ));
    assert_eq!(status(&gone), 204);
    let unknown = vmm.handle(R::VmRemoveDevice(
        serde_json::from_value(serde_json::json!({"id": "_disk0"})).unwrap(),
    ));
    assert_eq!(status(&unknown), 404);
    assert_eq!(
        info(&mut vmm)["config"]["disks"].as_array().unwrap().len(),
        1
    );
}

#[test]
fn resize_checks_its_bounds_and_sets_memory_before_boot() {
    let mut vmm = Vmm::new();
    vmm.handle(R::VmCreate(create_body("/k", "")));
    let resize = |v: serde_json::Value| R::VmResize(serde_json::from_value(v).unwrap());
    // Before boot the size joins the config, as Cloud Hypervisor does (the VM boots with it).
    let ram = vmm.handle(resize(serde_json::json!({"desired_ram": 1u64 << 30})));
    assert_eq!(status(&ram), 204, "{}", message(&ram));
    let shown = info(&mut vmm);
    assert_eq!(shown["config"]["memory"]["size"], 1u64 << 30);
    assert_eq!(shown["memory_actual_size"], 1u64 << 30);
    for (bad, why) in [
        ((1u64 << 30) + 1, "not a whole number of MiB"),
        (1 << 20, "below the minimum"),
    ] {
        let r = vmm.handle(resize(serde_json::json!({ "desired_ram": bad })));
        assert_eq!(status(&r), 400);
        assert!(message(&r).contains(why), "{}", message(&r));
    }
    assert_eq!(info(&mut vmm)["config"]["memory"]["size"], 1u64 << 30);
    let balloon = vmm.handle(resize(serde_json::json!({"desired_balloon": 0})));
    assert_eq!(status(&balloon), 400);
    assert_eq!(
        status(&vmm.handle(resize(serde_json::json!({"desired_vcpus": 3})))),
        400
    );
    assert_eq!(
        status(&vmm.handle(resize(serde_json::json!({"desired_vcpus": 0})))),
        400
    );
    assert_eq!(
        status(&vmm.handle(resize(serde_json::json!({"desired_vcpus": 2})))),
        204
    );
    assert_eq!(info(&mut vmm)["config"]["cpus"]["boot_vcpus"], 2);
}

/// `vm.resize` works from the vCPU ids present, not their count: after the guest ejected a CPU
/// on its own (a hole in the ids) growing fills the hole instead of adding an id that is
/// already there, and shrinking removes the highest ids present.
#[test]
fn resize_fills_the_hole_a_guest_eject_left_and_removes_the_highest_ids() {
    use super::devices::vcpu_changes;
    assert_eq!(vcpu_changes(&[0, 1], 4), (vec![2, 3], vec![]));
    assert_eq!(vcpu_changes(&[0, 1, 2, 3], 2), (vec![], vec![3, 2]));
    // The guest ejected CPU 1 of four.
    assert_eq!(vcpu_changes(&[0, 2, 3], 4), (vec![1], vec![]));
    assert_eq!(vcpu_changes(&[0, 2, 3], 2), (vec![], vec![3]));
    assert_eq!(vcpu_changes(&[3, 0, 2], 1), (vec![], vec![3, 2]));
    assert_eq!(vcpu_changes(&[0, 2], 2), (vec![], vec![]));
}

#[test]
fn balloon_resize_needs_a_balloon_that_fits_and_the_balloon_stays() {
    let mut vmm = Vmm::new();
    vmm.handle(R::VmCreate(create_body("/k", "")));
    let resize = |v: serde_json::Value| R::VmResize(serde_json::from_value(v).unwrap());
    let none = vmm.handle(resize(serde_json::json!({"desired_balloon": 4096})));
    assert_eq!(status(&none), 400);
    assert!(
        message(&none).contains("needs a balloon"),
        "{}",
        message(&none)
    );
    vmm.handle(R::VmDelete);
    let mut body = create_body("/k", "");
    body.balloon = Some(serde_json::from_value(serde_json::json!({"size": 0})).unwrap());
    assert_eq!(status(&vmm.handle(R::VmCreate(body))), 204);
    assert_eq!(info(&mut vmm)["config"]["balloon"]["id"], "_balloon0");
    let big = vmm.handle(resize(serde_json::json!({"desired_balloon": 1u64 << 30})));
    assert_eq!(status(&big), 400, "more than the guest's memory");
    let ok = vmm.handle(resize(serde_json::json!({"desired_balloon": 8u64 << 20})));
    assert_eq!(status(&ok), 204, "{}", message(&ok));
    assert_eq!(info(&mut vmm)["config"]["balloon"]["size"], 8u64 << 20);
    let rm = R::VmRemoveDevice(schema::VmRemoveDevice {
        id: Some("_balloon0".into()),
    });
    assert_eq!(status(&vmm.handle(rm)), 400);
    assert!(info(&mut vmm)["config"]["balloon"].is_object());
}

/// The bench guest as a kernel file (it is a PVH ELF).
fn bench_kernel(test: &str) -> PathBuf {
    let name = format!("exitless-control-{test}-{}.elf", std::process::id());
    let path = std::env::temp_dir().join(name);
    std::fs::write(&path, exitless_guest::BENCH_GUEST).unwrap();
    path
}

fn exits(vmm: &mut Vmm) -> u64 {
    let report: serde_json::Value = match vmm.handle(R::VmProfile) {
        ApiResponse::Json(body) => serde_json::from_str(&body).unwrap(),
        other => panic!("vm.profile answered {} {}", status(&other), message(&other)),
    };
    report["totals"]["exits"].as_u64().unwrap()
}

fn vcpu_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| c.trim().starts_with("vcpu"))
        .count()
}

fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_vm_boots_pauses_resumes_shuts_down_and_boots_again() {
    if std::fs::metadata("/dev/kvm").is_err() {
        vmm::test_skip::skip("control_lifecycle", "/dev/kvm is missing on this host");
        return;
    }
    let kernel = bench_kernel("lifecycle");
    let mut vmm = Vmm::new();
    let body = create_body(kernel.to_str().unwrap(), "case=pio_out iters=100000000");
    assert_eq!(status(&vmm.handle(R::VmCreate(body))), 204);
    let boot = vmm.handle(R::VmBoot);
    assert_eq!(status(&boot), 204, "{}", message(&boot));
    assert_eq!(info(&mut vmm)["state"], "Running");
    assert!(vcpu_threads() >= 1, "a thread named vcpu0 runs");
    wait_for("the guest's first exits", || exits(&mut vmm) > 100);

    assert_eq!(status(&vmm.handle(R::VmPause)), 204);
    assert_eq!(info(&mut vmm)["state"], "Paused");
    let held = exits(&mut vmm);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(exits(&mut vmm), held, "a paused guest makes no exits");
    assert_eq!(status(&vmm.handle(R::VmPause)), 405);

    assert_eq!(status(&vmm.handle(R::VmResume)), 204);
    wait_for("exits after resume", || exits(&mut vmm) > held + 100);

    assert_eq!(status(&vmm.handle(R::VmShutdown)), 204);
    assert_eq!(info(&mut vmm)["state"], "Shutdown");
    assert_eq!(status(&vmm.handle(R::VmProfile)), 405);
    let again = vmm.handle(R::VmBoot);
    assert_eq!(status(&again), 204, "{}", message(&again));
    wait_for("exits after the second boot", || exits(&mut vmm) > 100);
    vmm.poll();
    assert!(vmm.exit().is_none(), "a running guest keeps the VMM up");
    assert_eq!(status(&vmm.handle(R::VmmShutdown)), 204);
    assert_eq!(vmm.exit(), Some(VmmExit(0)));
    let _ = std::fs::remove_file(kernel);
}

/// One of device `id`'s own counters (`vm.counters`), 0 before the VM runs it.
fn device_counter(vmm: &mut Vmm, id: &str, name: &str) -> u64 {
    let counters: serde_json::Value = match vmm.handle(R::VmCounters) {
        ApiResponse::Json(body) => serde_json::from_str(&body).unwrap(),
        other => panic!(
            "vm.counters answered {} {}",
            status(&other),
            message(&other)
        ),
    };
    counters[id][name].as_u64().unwrap_or(0)
}

#[test]
fn a_balloon_target_set_by_resize_reaches_the_running_guest_and_back() {
    if std::fs::metadata("/dev/kvm").is_err() {
        vmm::test_skip::skip("control_balloon", "/dev/kvm is missing on this host");
        return;
    }
    let kernel = bench_kernel("balloon");
    let mut vmm = Vmm::new();
    // The guest reports 1 MiB, inflates and deflates 16 pages, then follows the host's target.
    let mut body = create_body(
        kernel.to_str().unwrap(),
        "case=balloon_check iters=1 follow",
    );
    body.memory.size = 256 << 20;
    let balloon = serde_json::json!({"size": 0, "free_page_reporting": true});
    body.balloon = Some(serde_json::from_value(balloon).unwrap());
    assert_eq!(status(&vmm.handle(R::VmCreate(body))), 204);
    let boot = vmm.handle(R::VmBoot);
    assert_eq!(status(&boot), 204, "{}", message(&boot));
    let id = "_balloon0";
    wait_for("the guest's own inflate and deflate", || {
        device_counter(&mut vmm, id, "deflated_pages") == 16
    });
    assert_eq!(device_counter(&mut vmm, id, "reported_pages"), 256);
    assert_eq!(info(&mut vmm)["memory_actual_size"], 256u64 << 20);
    let resize = |bytes: u64| {
        R::VmResize(schema::VmResize {
            desired_balloon: Some(bytes),
            ..schema::VmResize::default()
        })
    };
    assert_eq!(status(&vmm.handle(resize(8 << 20))), 204);
    assert_eq!(device_counter(&mut vmm, id, "target_pages"), 2048);
    wait_for("the guest to put 8 MiB in the balloon", || {
        info(&mut vmm)["memory_actual_size"] == 248u64 << 20
    });
    assert_eq!(device_counter(&mut vmm, id, "inflated_pages"), 16 + 2048);
    assert_eq!(info(&mut vmm)["config"]["balloon"]["size"], 8u64 << 20);
    assert_eq!(status(&vmm.handle(resize(0))), 204);
    wait_for("the guest to take them back", || {
        info(&mut vmm)["memory_actual_size"] == 256u64 << 20
    });
    assert_eq!(device_counter(&mut vmm, id, "deflated_pages"), 16 + 2048);
    vmm.stop();
    let _ = std::fs::remove_file(kernel);
}

#[test]
fn a_guest_reset_reboots_the_vm() {
    if std::fs::metadata("/dev/kvm").is_err() {
        vmm::test_skip::skip("control_reset", "/dev/kvm is missing on this host");
        return;
    }
    let kernel = bench_kernel("reset");
    let mut vmm = Vmm::new();
    // The bench guest resets through the i8042 when it is done (there is no exit port).
    let body = create_body(kernel.to_str().unwrap(), "case=pio_out iters=10");
    vmm.handle(R::VmCreate(body));
    // A writable disk: each boot locks its image, so each reboot needs the last VM's devices
    // gone (a reference cycle once kept them, and their files, alive).
    let image = Scratch::new("reset", b"");
    let add = vmm.handle(R::VmAddDisk(disk(serde_json::json!({"path": image.0}))));
    assert_eq!(status(&add), 204, "{}", message(&add));
    assert_eq!(status(&vmm.handle(R::VmBoot)), 204);
    wait_for("two guest resets", || {
        vmm.poll();
        vmm.reboots() >= 2
    });
    assert!(
        vmm.exit().is_none(),
        "a reset does not end the VMM: {:?}",
        vmm.exit()
    );
    assert_eq!(info(&mut vmm)["state"], "Running");
    vmm.stop();
    let _ = std::fs::remove_file(kernel);
}

/// A scratch file in the temp folder, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str, head: &[u8]) -> Scratch {
        let name = format!("exitless-control-{tag}-{}.img", std::process::id());
        let path = std::env::temp_dir().join(name);
        let mut bytes = head.to_vec();
        bytes.resize(1 << 20, 0);
        std::fs::write(&path, bytes).unwrap();
        Scratch(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn files_and_fds_a_client_names_wrongly_are_refused_400_with_the_reason() {
    if std::fs::metadata("/dev/kvm").is_err() {
        vmm::test_skip::skip("control_bad_files", "/dev/kvm is missing on this host");
        return;
    }
    let kernel = bench_kernel("bad-files");
    let mut vmm = Vmm::new();
    let body = create_body(kernel.to_str().unwrap(), "case=pio_out iters=100000000");
    vmm.handle(R::VmCreate(body));
    assert_eq!(status(&vmm.handle(R::VmBoot)), 204);
    let refused = |vmm: &mut Vmm, r: R, why: &str| {
        let a = vmm.handle(r);
        assert_eq!(status(&a), 400, "{}", message(&a));
        assert!(message(&a).contains(why), "{why}: {}", message(&a));
    };
    let missing = "/nonexistent/exitless-disk.img";
    let add = |body: serde_json::Value| R::VmAddDisk(disk(body));
    refused(&mut vmm, add(serde_json::json!({"path": missing})), missing);
    // One writable image, attached once: a second device on it is refused, naming the file.
    let image = Scratch::new("locked", b"");
    let path = image.0.to_str().unwrap();
    let first = vmm.handle(add(serde_json::json!({"path": path})));
    assert_eq!(status(&first), 200, "{}", message(&first));
    refused(
        &mut vmm,
        add(serde_json::json!({"path": path})),
        "is in use",
    );
    let ro = add(serde_json::json!({"path": path, "readonly": true}));
    refused(&mut vmm, ro, "this VM");
    // image_type Unknown (ch-remote's): raw goes on, any other format is named.
    let qcow = Scratch::new("qcow2", b"QFI\xfb\0\0\0\x03");
    let qcow2 = serde_json::json!({"path": qcow.0, "image_type": "Unknown"});
    refused(&mut vmm, add(qcow2), "qcow2");
    let raw = Scratch::new("raw", b"");
    let unknown = vmm.handle(add(
        serde_json::json!({"path": raw.0, "image_type": "Unknown"}),
    ));
    assert_eq!(status(&unknown), 200, "{}", message(&unknown));
    // A descriptor that is not a tap: refused, and closed.
    let (sent, mut peer) = std::os::unix::net::UnixStream::pair().unwrap();
    let net: schema::NetConfig = serde_json::from_value(serde_json::json!({})).unwrap();
    refused(&mut vmm, R::VmAddNet(net, vec![sent.into()]), "not");
    peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    use std::io::Read;
    assert_eq!(peer.read(&mut [0u8; 1]).unwrap(), 0, "the fd was closed");
    vmm.stop();
    let _ = std::fs::remove_file(kernel);
}

#[test]
fn snapshot_and_restore_are_refused_where_they_cannot_be_done() {
    let snap = |url: &str| {
        R::VmSnapshot(schema::VmSnapshotConfig {
            destination_url: url.into(),
        })
    };
    let restore = |url: &str| {
        R::VmRestore(
            schema::RestoreConfig {
                source_url: url.into(),
                ..Default::default()
            },
            Vec::new(),
        )
    };
    let mut vmm = Vmm::new();
    assert_eq!(status(&vmm.handle(snap("file:///tmp/x"))), 404);
    let r = vmm.handle(restore("http://elsewhere/x"));
    assert_eq!(status(&r), 400);
    assert_eq!(
        message(&r),
        "vm.restore: 'http://elsewhere/x' is not a file:// URL of a directory"
    );
    let r = vmm.handle(restore("file:///nonexistent/exitless-snap"));
    assert_eq!(status(&r), 400);
    assert!(
        message(&r).contains("/nonexistent/exitless-snap"),
        "{}",
        message(&r)
    );
    assert_eq!(status(&vmm.handle(R::VmCreate(create_body("/k", "")))), 204);
    let r = vmm.handle(snap("file:///tmp/x"));
    assert_eq!(status(&r), 405);
    assert_eq!(
        message(&r),
        "The VM is Created: vm.snapshot needs it Paused"
    );
    let r = vmm.handle(restore("file:///tmp/x"));
    assert_eq!(
        status(&r),
        405,
        "a VMM with a VM takes no restore: {}",
        message(&r)
    );
}

fn fs(body: serde_json::Value) -> schema::FsConfig {
    serde_json::from_value(body).unwrap()
}

#[test]
fn add_fs_needs_shared_memory_and_joins_the_config_before_boot() {
    let mut vmm = Vmm::new();
    assert_eq!(status(&vmm.handle(R::VmCreate(create_body("/k", "")))), 204);
    let body = serde_json::json!({"tag": "kataShared", "socket": "/run/fs.sock", "pci_segment": 1});
    let refused = vmm.handle(R::VmAddFs(fs(body.clone())));
    assert_eq!(status(&refused), 400);
    assert!(
        message(&refused).contains("memory.shared"),
        "{}",
        message(&refused)
    );
    assert!(
        info(&mut vmm)["config"].get("fs").is_none(),
        "nothing added"
    );

    assert_eq!(status(&vmm.handle(R::VmDelete)), 204);
    let mut shared = create_body("/k", "");
    shared.memory.shared = true;
    assert_eq!(status(&vmm.handle(R::VmCreate(shared))), 204);
    assert_eq!(
        status(&vmm.handle(R::VmAddFs(fs(body)))),
        204,
        "before boot: joins the config"
    );
    let i = info(&mut vmm);
    assert_eq!(i["config"]["memory"]["shared"], true);
    assert_eq!(i["config"]["fs"][0]["tag"], "kataShared");
    assert_eq!(i["config"]["fs"][0]["id"], "_fs0");
    let bad_segment = serde_json::json!({"tag": "t", "socket": "/s", "pci_segment": 2});
    let refused = vmm.handle(R::VmAddFs(fs(bad_segment)));
    assert!(
        message(&refused).contains("num_pci_segments 2"),
        "{}",
        message(&refused)
    );
    let remove = R::VmRemoveDevice(schema::VmRemoveDevice {
        id: Some("_fs0".into()),
    });
    assert_eq!(status(&vmm.handle(remove)), 204);
    assert!(info(&mut vmm)["config"]["fs"]
        .as_array()
        .unwrap()
        .is_empty());
}
