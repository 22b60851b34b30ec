//! virtio-balloon end to end, driven by the bench guest's own driver (case balloon_check):
//! under exitless the pages the guest reports free leave the VMM's resident memory and read
//! back as zeros; under QEMU's virtio-balloon-pci the same driver gets the same answers (the
//! driver is right).

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{device_count, exitless, export_guest, kvm_available, qemu, Stream};

/// MiB the guest touches, then reports free.
const MIB: u64 = 64;
const PAGES: u64 = MIB * 256;
const GUEST_WAIT: Duration = Duration::from_secs(60);

/// The resident memory of process `pid`, in KiB (VmRSS).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn wait_line(out: &mut Stream, line: &str) {
    let found = out.wait_for(GUEST_WAIT, |t| {
        t.contains(line) || t.contains("EXITLESS ERROR") || t.contains("EXITLESS SKIP")
    });
    assert!(
        found && !out.text.contains("EXITLESS ERROR") && !out.text.contains("EXITLESS SKIP"),
        "waiting for {line}: {}",
        out.text
    );
}

fn spawn_check(guest: &Path, json: &Path, memory: &str) -> Child {
    exitless()
        .args(["run", "--kernel"])
        .arg(guest)
        .args(["--memory", memory, "--timeout", "120"])
        .args(["--balloon", "free_page_reporting=on"])
        .args(["--cmdline", &format!("case=balloon_check iters={MIB} sync")])
        .arg("--profile-json")
        .arg(json)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// What every run of balloon_check with `MIB` and the default 16 inflated pages prints.
fn assert_guest_saw_zeros_then_its_data(out: &str) {
    for line in [
        format!("EXITLESS BALLOON reported mib={MIB} chains=1"),
        format!("EXITLESS BALLOON after_report zero_pages={PAGES} of={PAGES}"),
        format!("EXITLESS BALLOON rewritten intact_pages={PAGES} of={PAGES}"),
        "EXITLESS BALLOON inflated pages=16 zero=16".to_string(),
        "EXITLESS RESULT case=balloon_check".to_string(),
    ] {
        assert!(out.contains(&line), "{line} in:\n{out}");
    }
    assert!(!out.contains("EXITLESS ERROR"), "{out}");
}

#[test]
fn pages_the_guest_reports_free_leave_the_vmms_memory_and_read_back_as_zeros() {
    if !kvm_available("balloon_free_page_reporting") {
        return;
    }
    let guest = export_guest("balloon");
    // Private memory gives pages back with madvise, shared (memfd) memory by punching holes.
    for memory in ["256M", "size=256M,shared=on"] {
        report_and_check(&guest, memory);
    }
    std::fs::remove_file(&guest).ok();
}

fn report_and_check(guest: &Path, memory: &str) {
    let json = guest.with_extension("json");
    let mut child = spawn_check(guest, &json, memory);
    let pid = child.id();
    let mut out = Stream::spawn(child.stdout.take().unwrap());
    let mut err = Stream::spawn(child.stderr.take().unwrap());
    let mut stdin = child.stdin.take().unwrap();
    wait_line(&mut out, &format!("EXITLESS BALLOON touched mib={MIB}"));
    let touched = rss_kib(pid);
    stdin.write_all(b"g").unwrap();
    wait_line(&mut out, "EXITLESS BALLOON reported");
    let reported = rss_kib(pid);
    stdin.write_all(b"g").unwrap();
    wait_line(&mut out, "EXITLESS BALLOON after_report");
    stdin.write_all(b"g").unwrap();
    wait_line(&mut out, "EXITLESS DONE");
    let status = child.wait().unwrap();
    err.read_to_end(Duration::from_secs(5));
    assert_eq!(status.code(), Some(0), "{memory}: {}", err.text);
    assert_guest_saw_zeros_then_its_data(&out.text);
    // Most of what the guest reported left the VMM's resident memory (the zero check only
    // reads, which maps the host's shared zero page).
    let fell = touched.saturating_sub(reported);
    assert!(
        fell >= MIB * 1024 * 3 / 4,
        "{memory}: RSS {touched} KiB after the guest touched {MIB} MiB, {reported} KiB after it reported them"
    );
    let profile: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("profile written")).unwrap();
    std::fs::remove_file(&json).ok();
    let balloon = &profile["virtio"][0];
    assert_eq!(balloon["device"], "virtio-balloon", "{profile:#}");
    assert_eq!(device_count(balloon, "reported_pages"), PAGES);
    assert_eq!(device_count(balloon, "inflated_pages"), 16);
    assert_eq!(device_count(balloon, "deflated_pages"), 16);
    assert_eq!(device_count(balloon, "refused_ranges"), 0);
    assert_eq!(device_count(balloon, "discard_errors"), 0);
    for q in balloon["queues"].as_array().unwrap() {
        assert_eq!(q["malformed"], 0, "{q}");
    }
}

/// `exitless remote --api-socket SOCKET ARGS`: its stdout, after checking it succeeded.
fn remote(socket: &Path, args: &[&str]) -> String {
    let o = exitless()
        .args(["remote", "--api-socket"])
        .arg(socket)
        .args(args)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{args:?}: {out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

#[test]
fn a_target_set_through_the_api_socket_reaches_the_guest_and_vm_info() {
    if !kvm_available("balloon_api_resize") {
        return;
    }
    let guest = export_guest("balloon-api");
    let socket = guest.with_extension("sock");
    let mut child = exitless()
        .args(["run", "--kernel"])
        .arg(&guest)
        .args(["--memory", "256M", "--timeout", "120"])
        .args(["--balloon", "free_page_reporting=on", "--api-socket"])
        .arg(&socket)
        .args(["--cmdline", "case=balloon_check iters=1 follow"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = Stream::spawn(child.stdout.take().unwrap());
    let mut err = Stream::spawn(child.stderr.take().unwrap());
    // The guest's own inflate and deflate are done: it follows the host's target now.
    wait_line(&mut out, "EXITLESS BALLOON inflated pages=16 zero=16");
    remote(&socket, &["resize", "--balloon", "8M"]);
    wait_line(&mut out, "EXITLESS BALLOON target actual=2048");
    let info: serde_json::Value =
        serde_json::from_str(&remote(&socket, &["info"])).expect("vm.info is JSON");
    assert_eq!(info["memory_actual_size"], 248u64 << 20, "{info:#}");
    assert_eq!(info["config"]["balloon"]["size"], 8u64 << 20, "{info:#}");
    assert_eq!(info["config"]["balloon"]["free_page_reporting"], true);
    let counters: serde_json::Value =
        serde_json::from_str(&remote(&socket, &["counters"])).unwrap();
    // With the API on, `run`'s devices go by the ids vm.info shows.
    let balloon = &counters["_balloon0"];
    assert_eq!(balloon["inflated_pages"], 16 + 2048, "{counters:#}");
    assert_eq!(balloon["actual_pages"], 2048, "{counters:#}");
    remote(&socket, &["resize", "--balloon", "0"]);
    // The guest deflates, ends the case and resets (the VMM boots it again: the API keeps
    // the VM).
    wait_line(&mut out, "EXITLESS DONE");
    remote(&socket, &["shutdown-vmm"]);
    let status = child.wait().unwrap();
    err.read_to_end(Duration::from_secs(5));
    std::fs::remove_file(&guest).ok();
    assert_eq!(status.code(), Some(0), "{}", err.text);
    assert!(
        out.text.contains("EXITLESS BALLOON target actual=0"),
        "{}",
        out.text
    );
}

#[test]
fn qemus_balloon_gives_the_guest_driver_the_same_answers() {
    let Some(qemu) = qemu("qemu_balloon") else {
        return;
    };
    let guest = export_guest("qemu-balloon");
    let o = Command::new("timeout")
        .args(["300", qemu, "-accel", "tcg", "-m", "256M", "-kernel"])
        .arg(&guest)
        .args(["-serial", "stdio", "-display", "none", "-monitor", "none"])
        .args([
            "-no-reboot",
            "-device",
            "isa-debug-exit,iobase=0xf4,iosize=4",
        ])
        .args([
            "-device",
            "virtio-balloon-pci,disable-legacy=on,free-page-reporting=on",
        ])
        .args(["-append", &format!("case=balloon_check iters={MIB}")])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    std::fs::remove_file(&guest).ok();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_guest_saw_zeros_then_its_data(&out);
}
