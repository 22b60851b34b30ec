//! virtio-blk durability and a hostile driver, end to end with the bench guest's driver: a
//! driver that does not accept FLUSH gets every write durable at completion (issue 19);
//! direct=on serves the guest; a driver filling every queue slot with a chain far longer than
//! seg_max costs the host no memory to speak of, and a refused request holds back no other
//! (issue 24 #3-4).

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::{device_count, exitless, export_guest, kvm_available, Image, Stream};
use vmm::devices::virtio::blk::io::dirty_pages;

const BLOCKS: u64 = 16;

/// Runs the guest's pattern check on `disk` with `extra` options; returns its console and the
/// disk's entry in the profile.
fn run_check(guest: &Path, disk: &str, extra: &str) -> (String, serde_json::Value) {
    let json = guest.with_extension("profile.json");
    let o = exitless()
        .args(["run", "--kernel"])
        .arg(guest)
        .args(["--memory", "64M", "--timeout", "60", "--disk", disk])
        .args([
            "--cmdline",
            &format!("case=virtio_check iters={BLOCKS} seed=3{extra}"),
        ])
        .arg("--profile-json")
        .arg(&json)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let profile: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("profile written")).unwrap();
    std::fs::remove_file(&json).ok();
    let blk = profile["virtio"][0].clone();
    assert_eq!(blk["device"], "virtio-blk0", "{profile:#}");
    assert!(
        out.contains(&format!(
            "EXITLESS VIRTIO blk verified bytes={}",
            BLOCKS * 4096
        )),
        "{out}"
    );
    (out, blk)
}

#[test]
fn a_driver_without_flush_gets_every_write_durable_when_it_completes() {
    if !kvm_available("blk_write_through") {
        return;
    }
    let guest = export_guest("blk-wt");
    let image = Image::new("blk-wt", 16);
    let (_, blk) = run_check(&guest, &image.disk_arg(false), " flush=off");
    std::fs::remove_file(&guest).ok();
    // Each write was submitted write-through, none to the page cache only, no flush made...
    assert_eq!(device_count(&blk, "writes_durable"), BLOCKS, "{blk:#}");
    assert_eq!(device_count(&blk, "writes_cached"), 0, "{blk:#}");
    assert_eq!(device_count(&blk, "flushes"), 0, "{blk:#}");
    // ...and nothing of the image waits in the host's page cache (the VMM is gone; the
    // kernel has not written anything back in between unless we made it).
    let file = std::fs::File::open(&image.0).unwrap();
    assert_eq!(
        dirty_pages(&file).unwrap(),
        0,
        "completed writes not durable"
    );
}

#[test]
fn a_driver_with_flush_gets_cached_writes_and_its_flush() {
    if !kvm_available("blk_write_back") {
        return;
    }
    let guest = export_guest("blk-wb");
    let image = Image::new("blk-wb", 16);
    let (_, blk) = run_check(&guest, &image.disk_arg(false), "");
    std::fs::remove_file(&guest).ok();
    assert_eq!(device_count(&blk, "writes_cached"), BLOCKS, "{blk:#}");
    assert_eq!(device_count(&blk, "writes_durable"), 0, "{blk:#}");
    assert_eq!(device_count(&blk, "flushes"), 1, "{blk:#}");
}

#[test]
fn direct_on_serves_the_guest_driver() {
    if !kvm_available("blk_direct") {
        return;
    }
    let guest = export_guest("blk-direct");
    let image = Image::new("blk-direct", 16);
    let disk = format!("{},direct=on", image.disk_arg(false));
    let (_, blk) = run_check(&guest, &disk, " flush=off");
    std::fs::remove_file(&guest).ok();
    assert_eq!(device_count(&blk, "writes_durable"), BLOCKS, "{blk:#}");
    // The driver's buffers are page-aligned: no bounce.
    assert_eq!(device_count(&blk, "bounced"), 0, "{blk:#}");
}

/// The peak resident memory of process `pid`, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

/// How long the hostile run may take before it counts as hung: the device walks 2 x 128
/// tables of 65,026 descriptors, tens of seconds for the dev build on a loaded host. Nothing
/// waits for it to pass: the guest waits for each completion and the test for the guest's
/// line or exitless's end (its `--timeout` is this).
const HOSTILE_HANG_GUARD: Duration = Duration::from_secs(600);

/// Issue 24 #3-4: every queue slot holds a read through one indirect table of 65,026
/// descriptors (seg_max is 254), twice; the host's peak memory grew by 2 MiB a request
/// before. Then a read of 1,536 buffers beside a normal one, one notify: both complete.
#[test]
fn chains_past_seg_max_on_every_slot_cost_no_host_memory_and_hold_back_nothing() {
    if !kvm_available("blk_hostile_seg_max") {
        return;
    }
    let guest = export_guest("blk-hostile");
    let image = Image::new("blk-hostile", 16);
    let mut child = exitless()
        .args(["run", "--kernel"])
        .arg(&guest)
        .args(["--memory", "64M", "--timeout"])
        .arg(HOSTILE_HANG_GUARD.as_secs().to_string())
        .arg("--disk")
        .arg(image.disk_arg(false))
        .args(["--cmdline", "case=virtio_blk_hostile iters=2 hold"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut out = Stream::spawn(child.stdout.take().unwrap());
    // Either line, or the pipe's end (exitless ended: its --timeout, or the guest failed).
    let ready = out.wait_for(HOSTILE_HANG_GUARD, |t| t.contains("hostile ready"));
    let before = ready.then(|| peak_rss_kib(pid));
    let done = ready && out.wait_for(HOSTILE_HANG_GUARD, |t| t.contains("hostile done"));
    let after = done.then(|| peak_rss_kib(pid));
    child.kill().unwrap();
    child.wait().unwrap();
    std::fs::remove_file(&guest).ok();
    assert!(done, "{}", out.text);
    let (before, after) = (before.unwrap(), after.unwrap());
    eprintln!("exitless peak RSS: {before} KiB when the guest was ready, {after} KiB after");
    let line = out
        .text
        .lines()
        .find(|l| l.contains("hostile done"))
        .unwrap();
    assert!(
        line.contains(" served=0 "),
        "a chain past seg_max was served: {line}"
    );
    assert!(
        line.contains("long_then_normal_served=1 normal_status=0"),
        "{line}"
    );
    assert!(
        after - before < 16 << 10,
        "peak RSS grew from {before} KiB to {after} KiB"
    );
}
