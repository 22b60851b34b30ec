//! Live migration end to end (docs/migration.md), with the bench guest's `case=snapshot
//! dirty=2`: it writes 8 MiB, then each round exits to the VMM `iters` times, checks every
//! page of it (the last round's value: a page the migration lost is counted, though the
//! round rewrites it) and writes it again, and at the end checks them all and its round
//! counter. Migrated mid-loop over `unix:` and `tcp:` (and `local`, shared memory as fds;
//! paused, it arrives paused), it finishes on the destination with every check passing and
//! the source process gone; a destination that dies midway leaves the source running and
//! correct; a receiver fed garbage answers an error and stays up; with its disk and entropy
//! device busy every round (`virtio=8 blkcheck=1`), what the devices wrote arrives and every
//! check passes; Cloud Hypervisor's `ch-remote` drives both ends; a `vm.resize` sent while a
//! migration runs waits for its end; a VM of two vCPUs arrives with both, made at Config.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::api_vmm::{json, ok, Vmm};
use common::snapshot::{wait_file, SnapTest};
use exitless_control::api::client::Reply;
use serde_json::{json, Value};

const TICKS: u64 = 200;
const CMDLINE: &str = "case=snapshot ticks=200 iters=200 touch_mib=8 dirty=2 hold";

/// What the source runs: the guest's command line and its disks.
struct Guest<'a> {
    cmdline: &'a str,
    disks: Value,
    /// vCPUs at boot (the bench guest runs on the first; the others wait for an INIT/SIPI
    /// it never sends).
    cpus: u8,
}

const PLAIN: Guest<'static> = Guest {
    cmdline: CMDLINE,
    disks: Value::Null,
    cpus: 1,
};

/// The source: an API VMM running the guest until its second round.
fn source(t: &SnapTest, tag: &str, memory: Value, guest: &Guest) -> (Vmm, PathBuf) {
    source_with(t, tag, (memory, guest), &[])
}

/// [`source`], the VMM started with `args` too.
fn source_with(
    t: &SnapTest,
    tag: &str,
    (memory, guest): (Value, &Guest),
    args: &[&str],
) -> (Vmm, PathBuf) {
    let serial = t.scratch.join(&format!("{tag}.log"));
    let bin = common::exitless_path();
    let vmm = Vmm::start_with_args(&bin, tag, std::process::Stdio::null(), args);
    let mut body = json!({
        "cpus": {"boot_vcpus": guest.cpus, "max_vcpus": guest.cpus},
        "memory": memory,
        "payload": {"kernel": t.guest, "cmdline": guest.cmdline},
        "serial": {"mode": "File", "file": serial},
    });
    if !guest.disks.is_null() {
        body["disks"] = guest.disks.clone();
    }
    vmm.create_and_boot(&body);
    wait_file(&serial, "TICK n=1 ");
    (vmm, serial)
}

/// `vm.receive-migration` on `url`, answered when the migration ends.
fn receive(dest: &Vmm, url: &str) -> JoinHandle<Reply> {
    let mut c = dest.client();
    let body = json!({ "receiver_url": url }).to_string();
    std::thread::spawn(move || {
        c.request("PUT", "vm.receive-migration", Some(&body))
            .unwrap()
    })
}

/// `vm.send-migration` to `url`, again while the receiver is not listening yet.
fn send(src: &Vmm, body: Value) -> Reply {
    let mut c = src.client();
    let start = Instant::now();
    loop {
        let r = c
            .request("PUT", "vm.send-migration", Some(&body.to_string()))
            .unwrap();
        if !r.body.contains("Cannot connect to") || start.elapsed() > Duration::from_secs(20) {
            return r;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every round once, in order, with its count; the final check passed.
fn assert_finished(text: &str) {
    assert_rounds(text, 2048);
}

/// Every round once, in order, with its count; the final check of `pages` passed.
fn assert_rounds(text: &str, pages: u64) {
    let ticks: Vec<&str> = text.lines().filter(|l| l.contains("TICK")).collect();
    let want: Vec<String> = (0..TICKS)
        .map(|n| format!("EXITLESS TICK n={n} count={}", n + 1))
        .collect();
    assert_eq!(ticks, want, "{text}");
    let result = format!("EXITLESS RESULT case=snapshot pages={pages} bad=0 count={TICKS} ok=1");
    assert!(text.contains(&result), "{text}");
}

/// Migrates a running source to a fresh VMM over `url`; checks that the source ended and
/// the guest finished on the destination.
fn migrate(t: &SnapTest, tag: &str, url: &str, memory: Value, local: bool) {
    let (src, serial) = source(t, &format!("{tag}-src"), memory, &PLAIN);
    let _dest = migrate_source(src, tag, url, local);
    let text = wait_file(&serial, "EXITLESS DONE");
    assert_finished(&text);
}

/// Migrates the running source `src` to a fresh VMM over `url`; checks that the source
/// ended and the destination runs. Returns the destination (which ends when dropped).
fn migrate_source(src: Vmm, tag: &str, url: &str, local: bool) -> Vmm {
    migrate_source_logged(src, tag, url, local).0
}

/// [`migrate_source`], also returning what the source logged.
fn migrate_source_logged(mut src: Vmm, tag: &str, url: &str, local: bool) -> (Vmm, String) {
    let dest = Vmm::start(&format!("{tag}-dst"));
    let receiving = receive(&dest, url);
    let body = json!({"destination_url": url, "local": local, "downtime_ms": 300});
    let sent = send(&src, body);
    let received = receiving.join().unwrap();
    let stderr = |v: &Vmm| v.stderr.text.clone();
    assert_eq!(sent.status, 204, "{} {}", sent.body, received.body);
    assert_eq!(received.status, 204, "{} {}", received.body, stderr(&dest));
    let status = src.wait_exit(Duration::from_secs(10));
    assert!(
        status.is_some_and(|s| s.success()),
        "the source goes on: {status:?}"
    );
    let info = json(&ok(
        dest.client().request("GET", "vm.info", None).unwrap(),
        "vm.info",
    ));
    assert_eq!(info["state"], "Running", "{info}");
    // The figures each side logs (-v), for docs/migration.md.
    src.stderr.read_to_end(Duration::from_secs(5));
    let mut dest = dest;
    let logged = |t: &str| t.contains("MiB of memory in");
    dest.stderr.wait_for(Duration::from_secs(1), logged);
    for line in [&src.stderr.text, &dest.stderr.text]
        .iter()
        .flat_map(|t| t.lines())
        .filter(|l| l.contains("-migration: ") && l.contains("MiB"))
    {
        eprintln!("{tag}: {line}");
    }
    (dest, src.stderr.text.clone())
}

fn memory() -> Value {
    json!({"size": 256u64 << 20})
}

#[test]
fn a_guest_migrated_mid_loop_over_unix_finishes_on_the_destination() {
    let Some(t) = SnapTest::start("migrated_over_unix", "mig-unix") else {
        return;
    };
    let url = format!("unix:{}", t.scratch.join("m.sock").display());
    migrate(&t, "mig-unix", &url, memory(), false);
}

#[test]
fn a_guest_migrated_mid_loop_over_tcp_finishes_on_the_destination() {
    let Some(t) = SnapTest::start("migrated_over_tcp", "mig-tcp") else {
        return;
    };
    let port = 20000 + std::process::id() % 20000;
    migrate(
        &t,
        "mig-tcp",
        &format!("tcp:127.0.0.1:{port}"),
        memory(),
        false,
    );
}

#[test]
fn local_migration_hands_shared_memory_over_as_fds() {
    let Some(t) = SnapTest::start("local_migration", "mig-local") else {
        return;
    };
    let url = format!("unix:{}", t.scratch.join("m.sock").display());
    let shared = json!({"size": 256u64 << 20, "shared": true});
    migrate(&t, "mig-local", &url, shared, true);
}

/// A VM of two vCPUs: the destination creates both when Config arrives (the ids Config
/// lists), outside the downtime, and puts their state back at State; the guest finishes
/// there and the destination's VM has both.
#[test]
fn a_guest_of_two_vcpus_migrates_with_both_made_at_config() {
    let Some(t) = SnapTest::start("migrated_two_vcpus", "mig-2cpu") else {
        return;
    };
    let guest = Guest {
        cmdline: CMDLINE,
        disks: Value::Null,
        cpus: 2,
    };
    let (src, serial) = source(&t, "mig-2cpu-src", memory(), &guest);
    let url = format!("unix:{}", t.scratch.join("m.sock").display());
    let mut dest = migrate_source(src, "mig-2cpu", &url, false);
    let text = wait_file(&serial, "EXITLESS DONE");
    assert_finished(&text);
    let made = |t: &str| t.contains("vCPUs created ahead");
    dest.stderr.wait_for(Duration::from_secs(5), made);
    assert!(made(&dest.stderr.text), "{}", dest.stderr.text);
    let info = json(&ok(
        dest.client().request("GET", "vm.info", None).unwrap(),
        "vm.info",
    ));
    assert_eq!(info["config"]["cpus"]["boot_vcpus"], 2, "{info}");
}

/// A fake destination that answers Start and Config, reads part of the first memory request
/// and dies (its socket closed, as the kernel closes a killed process's).
fn dying_destination(path: &Path) -> JoinHandle<()> {
    let listener = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let ok = [1u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        for _ in 0..2 {
            let mut h = [0u8; 16];
            s.read_exact(&mut h).unwrap();
            let len = u64::from_le_bytes(h[8..].try_into().unwrap());
            let mut payload = vec![0u8; len as usize];
            s.read_exact(&mut payload).unwrap();
            s.write_all(&ok).unwrap();
        }
        let mut part = [0u8; 4096];
        s.read_exact(&mut part).unwrap();
    })
}

#[test]
fn a_destination_that_dies_midway_leaves_the_source_running_and_correct() {
    let Some(t) = SnapTest::start("destination_dies", "mig-dies") else {
        return;
    };
    let (src, serial) = source(&t, "mig-dies-src", memory(), &PLAIN);
    let path = t.scratch.join("m.sock");
    let dying = dying_destination(&path);
    let url = format!("unix:{}", path.display());
    let r = send(&src, json!({"destination_url": url}));
    dying.join().unwrap();
    assert!(r.status >= 400, "{} {}", r.status, r.body);
    assert!(r.body.starts_with("vm.send-migration: "), "{}", r.body);
    assert!(!r.body.trim().contains('\n'), "{}", r.body);
    let info = json(&ok(
        src.client().request("GET", "vm.info", None).unwrap(),
        "vm.info",
    ));
    assert_eq!(info["state"], "Running", "{info}");
    let text = wait_file(&serial, "EXITLESS DONE");
    assert_finished(&text);
    let said = |t: &str| t.contains("(the VM goes on here)");
    let mut src = src;
    let heard = src.stderr.wait_for(Duration::from_secs(5), said);
    assert!(heard, "{}", src.stderr.text);
}

#[test]
fn a_receiver_fed_garbage_answers_an_error_and_stays_up() {
    if !common::api_vmm::kvm_or_skip("receiver_fed_garbage") {
        return;
    }
    let dest = Vmm::start("mig-garbage");
    let path =
        std::env::temp_dir().join(format!("exitless-mig-garbage-{}.sock", std::process::id()));
    let url = format!("unix:{}", path.display());
    for garbage in [
        &b"GARBAGE GARBAGE GARBAGE"[..],
        // Start, then a State request longer than any state file.
        &[
            1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            0, 0, 0x7f,
        ][..],
    ] {
        let receiving = receive(&dest, &url);
        let start = Instant::now();
        let mut s = loop {
            match UnixStream::connect(&path) {
                Ok(s) => break s,
                Err(_) if start.elapsed() < Duration::from_secs(10) => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => panic!("{e}"),
            }
        };
        s.write_all(garbage).unwrap();
        let mut answers = Vec::new();
        let _ = s.read_to_end(&mut answers);
        // The last answer is an Error (status 2).
        assert!(
            answers.len() >= 16 && answers.len() % 16 == 0,
            "{answers:?}"
        );
        assert_eq!(answers[answers.len() - 16], 2, "{answers:?}");
        let r = receiving.join().unwrap();
        assert_eq!(r.status, 400, "{}", r.body);
        assert!(r.body.contains("The peer broke the protocol"), "{}", r.body);
        assert!(!r.body.trim().contains('\n'), "{}", r.body);
    }
    let c = &mut dest.client();
    let info = c.request("GET", "vm.info", None).unwrap();
    assert_eq!(info.status, 404, "no VM was made: {}", info.body);
}

/// The guest's disk and entropy device busy every round (`virtio=4`: random reads and
/// writes; `blkcheck=16`: 16 blocks written and read back into pages of their own each
/// round, all checked at the end), short rounds while the first pass copies 128 MiB: what
/// the devices write into guest memory meanwhile (read data, status bytes, used rings)
/// arrives through the device dirty log, which KVM's does not see.
#[test]
fn a_guest_with_its_disk_busy_migrated_mid_loop_finishes_with_every_check_passing() {
    let Some(t) = SnapTest::start("devices_busy", "mig-devices") else {
        return;
    };
    let image = t.scratch.join("d.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let guest = Guest {
        cmdline: &format!(
            "case=snapshot ticks={TICKS} iters=20 touch_mib=128 virtio=4 blkcheck=16 hold"
        ),
        disks: json!([{ "path": image }]),
        cpus: 1,
    };
    let (src, serial) = source(&t, "mig-devices-src", memory(), &guest);
    let url = format!("unix:{}", t.scratch.join("m.sock").display());
    let _dest = migrate_source(src, "mig-devices", &url, false);
    let text = wait_file(&serial, "EXITLESS DONE");
    assert_rounds(&text, 128 << 8);
    let result = text.lines().find(|l| l.contains("RESULT")).unwrap();
    for want in [" io_errors=0", " blkcheck_bad=0"] {
        assert!(result.contains(want), "{want}: {text}");
    }
    let rounds = text.lines().filter(|l| l.contains("SNAPVIRTIO")).count();
    assert_eq!(rounds as u64, TICKS, "{text}");
    assert!(!text.contains("rng_nonzero=0 "), "{text}");
}

#[test]
fn ch_remote_drives_both_ends() {
    let Some(t) = SnapTest::start("ch_remote_migration", "mig-ch") else {
        return;
    };
    let Some(ch) = common::ch_remote::find("ch_remote_migration", "not run") else {
        return;
    };
    let (mut src, serial) = source(&t, "mig-ch-src", memory(), &PLAIN);
    let dest = Vmm::start("mig-ch-dst");
    let url = format!("unix:{}", t.scratch.join("m.sock").display());
    let mut receiving = std::process::Command::new(&ch)
        .arg("--api-socket")
        .arg(&dest.socket)
        .args(["receive-migration", &format!("receiver_url={url}")])
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !t.scratch.join("m.sock").exists() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the receiver listens"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let sent = std::process::Command::new(&ch)
        .arg("--api-socket")
        .arg(&src.socket)
        .args([
            "send-migration",
            &format!("destination_url={url},downtime_ms=50"),
        ])
        .output()
        .unwrap();
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    assert!(receiving.wait().unwrap().success());
    assert!(src
        .wait_exit(Duration::from_secs(10))
        .is_some_and(|s| s.success()));
    assert_finished(&wait_file(&serial, "EXITLESS DONE"));
}

#[test]
fn a_paused_vm_arrives_paused_and_goes_on_when_resumed() {
    let Some(t) = SnapTest::start("paused_migration", "mig-paused") else {
        return;
    };
    let (mut src, serial) = source(&t, "mig-paused-src", memory(), &PLAIN);
    ok(
        src.client().request("PUT", "vm.pause", None).unwrap(),
        "vm.pause",
    );
    let dest = Vmm::start("mig-paused-dst");
    let url = format!("unix:{}", t.scratch.join("m.sock").display());
    let receiving = receive(&dest, &url);
    let sent = send(&src, json!({"destination_url": url}));
    assert_eq!(sent.status, 204, "{}", sent.body);
    assert_eq!(receiving.join().unwrap().status, 204);
    assert!(src
        .wait_exit(Duration::from_secs(10))
        .is_some_and(|s| s.success()));
    let mut c = dest.client();
    let info = json(&ok(c.request("GET", "vm.info", None).unwrap(), "vm.info"));
    assert_eq!(info["state"], "Paused", "{info}");
    ok(c.request("PUT", "vm.resume", None).unwrap(), "vm.resume");
    assert_finished(&wait_file(&serial, "EXITLESS DONE"));
}

/// Each way of tracking the vCPUs' writes (`--dirty-log`, docs/migration.md), the guest
/// rewriting 32 MiB every round: more pages than a vCPU's 4096-entry ring holds, so the ring
/// fills and the vCPU harvests it itself while the passes run. Every page arrives: the guest
/// checks each page before rewriting it (`dirty=2`), so a write the migration lost is
/// counted even though a later round rewrites the page.
fn migrate_tracked(way: &str, tag: &str, logged: &str) {
    let Some(t) = SnapTest::start(tag, tag) else {
        return;
    };
    let url = format!("unix:{}", t.scratch.join("m.sock").display());
    let guest = Guest {
        cmdline: "case=snapshot ticks=200 iters=200 touch_mib=32 dirty=2 hold",
        disks: Value::Null,
        cpus: 1,
    };
    let args = ["--dirty-log", way];
    let (src, serial) = source_with(&t, &format!("{tag}-src"), (memory(), &guest), &args);
    let (_dest, src_log) = migrate_source_logged(src, tag, &url, false);
    assert!(
        src_log.contains(&format!("dirty pages by the {logged}")),
        "{src_log}"
    );
    let text = wait_file(&serial, "EXITLESS DONE");
    assert_rounds(&text, 8192);
}

#[test]
fn a_guest_tracked_by_the_dirty_ring_migrates_with_every_page() {
    migrate_tracked("ring", "mig-ring", "ring");
}

#[test]
fn a_guest_tracked_by_the_bitmap_migrates_with_every_page() {
    migrate_tracked("bitmap", "mig-bitmap", "bitmap");
}

/// A fake destination that answers Start, says so on `started`, then holds the migration
/// (the source waits for its answer to Config) until `release` says to end it.
fn held_destination(
    path: &Path,
    started: std::sync::mpsc::Sender<()>,
    release: std::sync::mpsc::Receiver<()>,
) -> JoinHandle<()> {
    let listener = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut h = [0u8; 16];
        s.read_exact(&mut h).unwrap();
        s.write_all(&[1u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
            .unwrap();
        started.send(()).unwrap();
        let _ = release.recv();
    })
}

/// A `vm.resize` that grows memory while a migration runs (docs/migration.md, "What is
/// refused"): the migration holds the owner thread, so the request waits for it rather than
/// adding memory the dirty log would not track; the migration failing, the source's VM
/// goes on and the request is served there.
#[test]
fn a_resize_sent_while_a_migration_runs_waits_for_its_end() {
    let Some(t) = SnapTest::start("resize_while_migrating", "mig-resize") else {
        return;
    };
    let memory = json!({"size": 256u64 << 20, "hotplug_size": 256u64 << 20});
    let (src, serial) = source(&t, "mig-resize-src", memory, &PLAIN);
    let path = t.scratch.join("m.sock");
    let (started, on_start) = std::sync::mpsc::channel();
    let (release, on_release) = std::sync::mpsc::channel();
    let held = held_destination(&path, started, on_release);
    let url = format!("unix:{}", path.display());
    let mut c = src.client();
    let sending = std::thread::spawn(move || {
        let body = json!({ "destination_url": url }).to_string();
        c.request("PUT", "vm.send-migration", Some(&body)).unwrap()
    });
    on_start.recv_timeout(Duration::from_secs(30)).unwrap();
    let mut c = src.client();
    let resizing = std::thread::spawn(move || {
        let body = json!({ "desired_ram": 512u64 << 20 }).to_string();
        c.request("PUT", "vm.resize", Some(&body)).unwrap()
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !resizing.is_finished(),
        "vm.resize answered while migrating"
    );
    release.send(()).unwrap();
    held.join().unwrap();
    let sent = sending.join().unwrap();
    assert!(sent.status >= 400, "{} {}", sent.status, sent.body);
    let resized = resizing.join().unwrap();
    assert_eq!(resized.status, 204, "{}", resized.body);
    let info = json(&ok(
        src.client().request("GET", "vm.info", None).unwrap(),
        "vm.info",
    ));
    assert_eq!(info["memory_actual_size"], 512u64 << 20, "{info}");
    assert_eq!(info["state"], "Running", "{info}");
    assert_finished(&wait_file(&serial, "EXITLESS DONE"));
}
