//! Cloud Hypervisor's operations on a running VM (issue 43), each sent with `ch-remote` as an
//! operator would (through the API client where `ch-remote` is not on PATH: a skip line says
//! so), against every shipped build, the bench guest's own drivers seeing the result:
//! `power-button` (the guest powers off through ACPI S5: the VMM ends with 0), `nmi` (the
//! guest's NMI handler counts it), `resize-disk` (the image grows, the guest gets the
//! configuration-change interrupt and reads the new capacity; shrinking is refused by name),
//! `coredump` (an ELF core gdb reads: the guest's registers and variables).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::api_vmm::{bench_vm_body, json, ok, Vmm};
use common::{builds, export_guest, kvm_available, wait_serial, Image};
use exitless_control::api::client::Reply;
use serde_json::Value;

const GUEST_WAIT: Duration = Duration::from_secs(90);

/// Sends one operation: with `ch-remote` (its arguments) if there is one, else the same
/// request through the API client. Returns (success, what was said).
fn operate(
    vmm: &Vmm,
    ch: Option<&Path>,
    args: &[&str],
    endpoint: &str,
    body: Option<Value>,
) -> (bool, String) {
    if let Some(ch) = ch {
        return common::ch_remote::run(ch, &vmm.socket, args);
    }
    let body = body.map(|b| b.to_string());
    let r: Reply = vmm
        .client()
        .request("PUT", endpoint, body.as_deref())
        .unwrap();
    (
        r.status == 204 || r.status == 200,
        format!("{} {}", r.status, r.body),
    )
}

fn scratch(tag: &str, ext: &str) -> PathBuf {
    std::env::temp_dir().join(format!("exitless-ops-{tag}-{}.{ext}", std::process::id()))
}

/// Creates and boots the bench guest in `cmdline` with `extra` (disks...) on `vcpus` vCPUs.
fn boot(vmm: &Vmm, kernel: &Path, serial: &Path, cmdline: &str, vcpus: u8, mut extra: Value) {
    extra["cpus"] = serde_json::json!({"boot_vcpus": vcpus, "max_vcpus": vcpus});
    let body = bench_vm_body(kernel, cmdline, serial, extra);
    let mut c = vmm.client();
    ok(
        c.request("PUT", "vm.create", Some(&body.to_string()))
            .unwrap(),
        "vm.create",
    );
    ok(c.request("PUT", "vm.boot", None).unwrap(), "vm.boot");
}

fn status(vmm: &Vmm, endpoint: &str, body: Option<&str>) -> Reply {
    vmm.client().request("PUT", endpoint, body).unwrap()
}

/// Each of `refusals` (a body, the status it gets, what the answer names) sent to `endpoint`
/// and refused so.
fn assert_refused(vmm: &Vmm, endpoint: &str, refusals: &[(&str, u16, &str)]) {
    for &(body, code, why) in refusals {
        let r = status(vmm, endpoint, Some(body));
        assert_eq!(r.status, code, "{body}: {}", r.body);
        assert!(r.body.contains(why), "{body}: {}", r.body);
    }
}

/// `power-button`: the guest (waiting for the GED's power button bit) powers off through the
/// FADT's sleep register (S5): the VMM ends with 0, as it does on any guest power-off. Not
/// running: 405.
#[test]
fn power_button_powers_the_guest_off_cleanly() {
    if !kvm_available("api_ops_power_button") {
        return;
    }
    let ch = common::ch_remote::find(
        "api_ops_power_button",
        "the requests go through the API client",
    );
    let kernel = export_guest("ops-power");
    for bin in builds() {
        let serial = scratch("power", "log");
        let _ = std::fs::remove_file(&serial);
        let mut vmm = Vmm::start_build(&bin, "ops-power");
        let r = status(&vmm, "vm.power-button", None);
        assert_eq!(r.status, 404, "no VM yet: {}", r.body);
        boot(
            &vmm,
            &kernel,
            &serial,
            "case=power_button iters=1",
            1,
            Value::Null,
        );
        wait_serial(&serial, "EXITLESS POWER ready");
        ok(status(&vmm, "vm.pause", None), "vm.pause");
        let r = status(&vmm, "vm.power-button", None);
        assert_eq!(r.status, 405, "{}", r.body);
        assert!(r.body.contains("Paused"), "{}", r.body);
        ok(status(&vmm, "vm.resume", None), "vm.resume");
        let (done, said) = operate(
            &vmm,
            ch.as_deref(),
            &["power-button"],
            "vm.power-button",
            None,
        );
        assert!(done, "power-button: {said}");
        let exit = vmm
            .wait_exit(GUEST_WAIT)
            .expect("the VMM ends once the guest powers off");
        assert_eq!(
            exit.code(),
            Some(0),
            "{}: {}",
            bin.display(),
            vmm.stderr.text
        );
        let text = std::fs::read_to_string(&serial).unwrap();
        assert!(
            text.contains("EXITLESS POWER button pressed, powering off (S5)"),
            "{text}"
        );
        assert!(!text.contains("EXITLESS ERROR"), "{text}");
        assert!(!vmm.socket.exists(), "the API socket is removed");
        let _ = std::fs::remove_file(&serial);
    }
    let _ = std::fs::remove_file(&kernel);
}

/// `nmi`: the guest's NMI handler counts one; a VM not booted: 405.
#[test]
fn nmi_reaches_the_guests_handler() {
    if !kvm_available("api_ops_nmi") {
        return;
    }
    let ch = common::ch_remote::find("api_ops_nmi", "the requests go through the API client");
    let kernel = export_guest("ops-nmi");
    for bin in builds() {
        let serial = scratch("nmi", "log");
        let _ = std::fs::remove_file(&serial);
        let vmm = Vmm::start_build(&bin, "ops-nmi");
        boot(
            &vmm,
            &kernel,
            &serial,
            "case=nmi_check iters=1 hold",
            2,
            Value::Null,
        );
        wait_serial(&serial, "EXITLESS NMI ready");
        let (done, said) = operate(&vmm, ch.as_deref(), &["nmi"], "vm.nmi", None);
        assert!(done, "nmi: {said}");
        let text = wait_serial(&serial, "EXITLESS DONE");
        assert!(text.contains("EXITLESS NMI count=1\n"), "{text}");
        assert!(text.contains("EXITLESS RESULT case=nmi_check"), "{text}");
        ok(status(&vmm, "vm.shutdown", None), "vm.shutdown");
        let r = status(&vmm, "vm.nmi", None);
        assert_eq!(r.status, 405, "{}", r.body);
        let _ = std::fs::remove_file(&serial);
    }
    let _ = std::fs::remove_file(&kernel);
}

/// `resize-disk`: 16 MiB grow to 32 MiB: the file, and the capacity the guest reads after
/// the configuration-change interrupt under a new generation; shrinking, an unknown id and
/// unaligned sizes are refused, each saying why.
#[test]
fn resize_disk_grows_the_image_and_tells_the_guest() {
    if !kvm_available("api_ops_resize_disk") {
        return;
    }
    let ch = common::ch_remote::find(
        "api_ops_resize_disk",
        "the requests go through the API client",
    );
    let kernel = export_guest("ops-resize");
    for bin in builds() {
        let image = Image::new("ops-resize", 16);
        let serial = scratch("resize", "log");
        let _ = std::fs::remove_file(&serial);
        let vmm = Vmm::start_build(&bin, "ops-resize");
        let disks = serde_json::json!({"disks": [{"path": image.0}]});
        boot(
            &vmm,
            &kernel,
            &serial,
            "case=resize_check iters=1 hold",
            1,
            disks,
        );
        wait_serial(&serial, "EXITLESS RESIZE ready sectors=32768\n");
        let size = (32u64 << 20).to_string();
        let body = serde_json::json!({"id": "_disk0", "desired_size": 32u64 << 20});
        let args = ["resize-disk", "--disk", "_disk0", "--size", &size];
        let (done, said) = operate(&vmm, ch.as_deref(), &args, "vm.resize-disk", Some(body));
        assert!(done, "resize-disk: {said}");
        let text = wait_serial(&serial, "EXITLESS DONE");
        let want = "EXITLESS RESIZE changed sectors=65536 generation_changed=1 isr_config=1 irqs=1";
        assert!(text.contains(want), "{text}");
        assert_eq!(std::fs::metadata(&image.0).unwrap().len(), 32 << 20);
        assert_refused(
            &vmm,
            "vm.resize-disk",
            &[
                (
                    r#"{"id":"_disk0","desired_size":8388608}"#,
                    400,
                    "shrinking is not supported",
                ),
                (
                    r#"{"id":"_disk0","desired_size":33554433}"#,
                    400,
                    "512-byte sectors",
                ),
                (
                    r#"{"id":"nothing","desired_size":33554432}"#,
                    404,
                    "nothing",
                ),
            ],
        );
        assert_eq!(
            std::fs::metadata(&image.0).unwrap().len(),
            32 << 20,
            "refusals change nothing"
        );
        let counters = json(&vmm.client().request("GET", "vm.counters", None).unwrap());
        assert!(counters["_disk0"].is_object(), "{counters}");
        let _ = std::fs::remove_file(&serial);
    }
    let _ = std::fs::remove_file(&kernel);
}

/// Runs gdb on the guest's ELF and `core` with `commands`; its output.
fn gdb(elf: &Path, core: &Path, commands: &[&str]) -> String {
    let mut cmd = Command::new("gdb");
    cmd.args(["-nx", "-batch"]);
    for c in commands {
        cmd.args(["-ex", c]);
    }
    let o = cmd.arg(elf).arg(core).output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `coredump` of a paused two-vCPU guest that took an NMI (sent while it was paused): gdb
/// reads the guest's ELF with the core: two threads, the boot vCPU halted in `bench_main` at
/// CPL0, and the guest's variables (its NMI count). A running VM: 405; a URL that is not a
/// file: 400.
#[test]
fn coredump_of_a_paused_guest_reads_in_gdb() {
    if !kvm_available("api_ops_coredump") {
        return;
    }
    let has_gdb = Command::new("gdb")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_gdb {
        vmm::test_skip::skip(
            "api_ops_coredump",
            "gdb is not installed (apt-get install gdb)",
        );
        return;
    }
    let ch = common::ch_remote::find("api_ops_coredump", "the requests go through the API client");
    let kernel = export_guest("ops-core");
    for bin in builds() {
        let serial = scratch("core", "log");
        let core = scratch("core", "core");
        let _ = std::fs::remove_file(&serial);
        let vmm = Vmm::start_build(&bin, "ops-core");
        boot(
            &vmm,
            &kernel,
            &serial,
            "case=nmi_check iters=1 hold",
            2,
            Value::Null,
        );
        wait_serial(&serial, "EXITLESS NMI ready");
        // An NMI sent while paused is queued and taken once the VM runs.
        ok(status(&vmm, "vm.pause", None), "vm.pause");
        ok(status(&vmm, "vm.nmi", None), "vm.nmi while paused");
        ok(status(&vmm, "vm.resume", None), "vm.resume");
        wait_serial(&serial, "EXITLESS DONE");
        let url = format!("file://{}", core.display());
        let body = serde_json::json!({"destination_url": url}).to_string();
        let r = status(&vmm, "vm.coredump", Some(&body));
        assert_eq!(r.status, 405, "running: {}", r.body);
        ok(status(&vmm, "vm.pause", None), "vm.pause");
        let r = status(
            &vmm,
            "vm.coredump",
            Some(r#"{"destination_url":"/no/scheme"}"#),
        );
        assert_eq!(r.status, 400, "{}", r.body);
        let body = Some(serde_json::json!({"destination_url": url}));
        let (done, said) = operate(
            &vmm,
            ch.as_deref(),
            &["coredump", &url],
            "vm.coredump",
            body,
        );
        assert!(done, "coredump: {said}");
        let out = gdb(
            &kernel,
            &core,
            &[
                "info threads",
                // Cast: the guest's ELF may carry symbols without debug info (CI's build).
                "print *(unsigned long *)&nmi_count",
                "print/x $cs",
                "info symbol $pc",
                "print/x *(unsigned long *)&user_rflags",
            ],
        );
        assert!(out.contains("$1 = 1"), "nmi_count: {out}");
        assert!(out.contains("$2 = 0x8"), "CPL0 code segment: {out}");
        assert!(out.contains("bench_main"), "halted in bench_main: {out}");
        assert!(
            out.contains("$3 = 0x2\n"),
            "user_rflags back to 0x2 after the case: {out}"
        );
        assert!(
            out.contains("LWP 1") && out.contains("LWP 2"),
            "two vCPUs: {out}"
        );
        ok(status(&vmm, "vm.resume", None), "vm.resume");
        let _ = std::fs::remove_file(&serial);
        let _ = std::fs::remove_file(&core);
    }
    let _ = std::fs::remove_file(&kernel);
}

/// `resize-zone`: a VM of two zones, `mem0` with a 512 MiB `hotplug_size`, grows `mem0` by
/// 256 MiB: the bench guest's memory hotplug driver finds, maps and verifies the new memory;
/// `vm.info` shows the zone's `hotplugged_size`; beyond the zone's limit, a zone without
/// `hotplug_size`, an unknown zone: refused; a smaller size changes nothing.
#[test]
fn resize_zone_grows_a_zone_the_guest_uses() {
    if !kvm_available("api_ops_resize_zone") {
        return;
    }
    let ch = common::ch_remote::find(
        "api_ops_resize_zone",
        "the requests go through the API client",
    );
    let kernel = export_guest("ops-zone");
    for bin in builds() {
        let serial = scratch("zone", "log");
        let _ = std::fs::remove_file(&serial);
        let vmm = Vmm::start_build(&bin, "ops-zone");
        let zones = serde_json::json!({"memory": {"size": 0, "zones": [
            {"id": "mem0", "size": 128u64 << 20, "hotplug_size": 512u64 << 20},
            {"id": "mem1", "size": 128u64 << 20},
        ]}});
        boot(
            &vmm,
            &kernel,
            &serial,
            "case=memory_hotplug_check hold",
            1,
            zones,
        );
        wait_serial(&serial, "EXITLESS MEMORY ready");
        assert_refused(
            &vmm,
            "vm.resize-zone",
            &[
                (
                    r#"{"id":"mem0","desired_ram":805306368}"#,
                    400,
                    "limit of 671088640 bytes",
                ),
                (
                    r#"{"id":"mem1","desired_ram":268435456}"#,
                    400,
                    "has no hotplug_size",
                ),
                (
                    r#"{"id":"nothing","desired_ram":268435456}"#,
                    404,
                    "nothing",
                ),
            ],
        );
        ok(
            status(
                &vmm,
                "vm.resize-zone",
                Some(r#"{"id":"mem0","desired_ram":134217728}"#),
            ),
            "same size",
        );
        let body = serde_json::json!({"id": "mem0", "desired_ram": 384u64 << 20});
        let args = ["resize-zone", "--id", "mem0", "--size", "384M"];
        let (done, said) = operate(&vmm, ch.as_deref(), &args, "vm.resize-zone", Some(body));
        assert!(done, "resize-zone: {said}");
        let text = wait_serial(&serial, "EXITLESS MEMORY hotplug");
        let want = "EXITLESS MEMORY hotplug slot=0 base=0x0000000100000000 bytes=268435456 \
                    verified=268435456";
        assert!(text.contains(want), "{text}");
        let info = json(&vmm.client().request("GET", "vm.info", None).unwrap());
        assert_eq!(info["memory_actual_size"], 512u64 << 20, "{info}");
        let zone = &info["config"]["memory"]["zones"][0];
        assert_eq!(zone["hotplugged_size"], 256u64 << 20, "{info}");
        assert_eq!(info["config"]["memory"]["size"], 0, "{info}");
        let r = status(&vmm, "vm.resize", Some(r#"{"desired_ram":1073741824}"#));
        assert_eq!(r.status, 400, "{}", r.body);
        assert!(r.body.contains("use vm.resize-zone"), "{}", r.body);
        let _ = std::fs::remove_file(&serial);
    }
    let _ = std::fs::remove_file(&kernel);
}
