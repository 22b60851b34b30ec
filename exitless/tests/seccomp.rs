//! Seccomp filters: every thread of a running `exitless run` (main, vCPUs, the device event
//! loop) is filtered, and `--seccomp off` leaves them unfiltered. The guest is the bench
//! guest's virtio check holding after its flush, so that every thread exists and is idle.
//! Needs /dev/kvm (skipped with a printed reason without it).

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{exitless, export_guest, Image, Stream};

/// Each thread's name and its `Seccomp:` mode (0 none, 2 filter) from /proc, without the
/// kernel's own workers in the process (io_uring's `iou-*`, KVM's `kvm-*`).
fn thread_modes(pid: u32) -> Vec<(String, String)> {
    let mut threads = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        let mode = status
            .lines()
            .find_map(|l| l.strip_prefix("Seccomp:"))
            .unwrap_or("?")
            .trim()
            .to_string();
        let name = name.trim().to_string();
        if !name.starts_with("iou-") && !name.starts_with("kvm-") {
            threads.push((name, mode));
        }
    }
    threads.sort();
    threads
}

/// Runs the held guest with `extra` arguments; returns each thread's seccomp mode, after
/// stopping the VM with SIGTERM (exit code 130 expected).
fn modes_while_running(tag: &str, extra: &[&str]) -> Vec<(String, String)> {
    let guest = export_guest(tag);
    let image = Image::new(tag, 1);
    let mut child = exitless()
        .arg("run")
        .args(extra)
        .arg("--kernel")
        .arg(&guest)
        .args(["--memory", "64M", "--timeout", "60", "--cpus", "2"])
        .args(["--disk", &image.disk_arg(false)])
        .args(["--cmdline", "case=virtio_check iters=4 hold"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut console = Stream::spawn(child.stdout.take().unwrap());
    let mut errs = Stream::spawn(child.stderr.take().unwrap());
    let held = console.wait_for(Duration::from_secs(30), |t| t.contains("blk flushed"));
    let modes = thread_modes(child.id());
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait().unwrap();
    errs.read_to_end(Duration::from_secs(10));
    std::fs::remove_file(&guest).ok();
    assert!(held, "the guest did not reach its flush: {}", console.text);
    assert_eq!(status.code(), Some(130), "{}", errs.text);
    assert!(!errs.text.contains("seccomp"), "{}", errs.text);
    modes
}

#[test]
fn every_thread_of_a_running_vm_is_filtered_and_off_means_off() {
    if std::fs::metadata("/dev/kvm").is_err() {
        vmm::test_skip::skip("seccomp_threads", "/dev/kvm is missing on this host");
        return;
    }
    let names = |modes: &[(String, String)]| -> Vec<String> {
        modes.iter().map(|(n, _)| n.clone()).collect()
    };
    let on = modes_while_running("seccomp-on", &[]);
    assert_eq!(
        names(&on),
        ["devices", "exitless", "vcpu0", "vcpu1"],
        "{on:?}"
    );
    assert!(on.iter().all(|(_, mode)| mode == "2"), "{on:?}");
    let off = modes_while_running("seccomp-off", &["--seccomp", "off"]);
    assert_eq!(names(&off), names(&on));
    assert!(off.iter().all(|(_, mode)| mode == "0"), "{off:?}");
}
