//! A hostile guest driver (the bench guest's bench-guest/virtio_hostile.c, issue 24) against
//! exitless's virtio devices:
//! - a vsock receive ring that announces more buffers than it holds (or lies at guest address
//!   0) while a host program sends to the guest: the device gives up on the ring (NEEDS_RESET,
//!   counted), its thread does not spin, the disk and the rng still work, and `--timeout`,
//!   SIGTERM and SIGINT each end the VM at once, its socket file removed;
//! - a thousand DRIVER_OK toggles on blk, rng, net and vsock: clearing DRIVER_OK without a reset
//!   is refused, no host fd or memory is left behind, and a restarted disk does not serve
//!   completed writes again (the guest changes their buffers after completion);
//! - a hundred thousand writes of every slot's bit to the PCI eject register (issue 37): the
//!   one disk is ejected once, empty slots are only counted, the VMM's memory stays flat under
//!   `run` and under the API, and an ejected disk leaves the API's configuration.

mod common;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::api_vmm::{json, ok, Vmm};
use common::{
    builds, device_count, exitless, export_guest, guest_pattern, kvm_available, private_tap, Image,
    Stream,
};

const GUEST_WAIT: Duration = Duration::from_secs(120);

/// Fields of /proc/PID/stat after the command name: utime + stime (in clock ticks).
fn stat_ticks(stat: &str) -> u64 {
    let rest = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// CPU time (clock ticks) of process `pid` and of its thread named `devices` (the event loop).
fn cpu_ticks(pid: u32) -> (u64, u64) {
    let process = stat_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap());
    let mut devices = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim() == "devices" {
            devices = stat_ticks(&std::fs::read_to_string(dir.join("stat")).unwrap());
        }
    }
    (process, devices)
}

fn ticks_per_second() -> u64 {
    // SAFETY: sysconf takes a constant and reads no memory of ours.
    let n = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(n).unwrap_or(100)
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// The process's peak resident memory (VmHWM), KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The VM under test, killed if the test ends early (a failed assertion).
struct Vm(Child);

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits up to `limit` for the child to end; its exit code (None if killed by a signal) and
/// how long it took, or None if it did not end.
fn wait_end(child: &mut Child, limit: Duration) -> Option<(Option<i32>, Duration)> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(status) = child.try_wait().unwrap() {
            return Some((status.code(), start.elapsed()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// One of a profile's virtio devices, by name.
fn profile_device<'a>(profile: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    profile["virtio"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["device"] == name))
        .unwrap_or_else(|| panic!("{name} in {profile:#}"))
}

fn read_profile(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).expect("profile written");
    std::fs::remove_file(path).ok();
    serde_json::from_str(&text).expect("profile parses")
}

/// A host program that connects to guest port 52 through the vsock socket and then keeps
/// sending (without blocking) until dropped.
struct HostSender {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<usize>>,
}

impl HostSender {
    fn start(socket: &Path) -> Self {
        let mut s = UnixStream::connect(socket).expect("the vsock socket takes connections");
        s.write_all(b"CONNECT 52\n").unwrap();
        s.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let chunk = [0x5au8; 4096];
            let mut sent = 0;
            while !flag.load(Ordering::Relaxed) {
                if let Ok(n) = s.write(&chunk) {
                    sent += n;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            sent
        });
        HostSender {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for HostSender {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How a run with the broken ring is ended.
#[derive(Debug, Clone, Copy)]
enum Ending {
    Timeout(u64),
    Signal(i32),
}

/// Figures of one broken-ring run, for the report.
struct BrokenRingRun {
    cpu_ticks: u64,
    devices_ticks: u64,
    end: Duration,
}

/// Runs the guest with vsock ring `ring` broken while a host program sends, checks the
/// console and the CPU time the VM takes meanwhile, ends it as `ending` says; checks the exit
/// code, the socket file's removal and the profile's counters.
fn broken_ring_run(guest: &Path, ring: &str, ending: Ending) -> BrokenRingRun {
    let tag = format!("hostile-{ring}-{ending:?}").replace(['(', ')'], "");
    let image = Image::new(&tag, 16);
    let socket = std::env::temp_dir().join(format!("exitless-{tag}-{}.sock", std::process::id()));
    let json = socket.with_extension("json");
    let timeout = match ending {
        Ending::Timeout(t) => t,
        Ending::Signal(_) => 120,
    };
    let spawned = Instant::now();
    let child = exitless()
        .args(["run", "--kernel"])
        .arg(guest)
        .args([
            "--memory",
            "64M",
            "--rng",
            "--timeout",
            &timeout.to_string(),
        ])
        .args(["--disk", &image.disk_arg(false), "--vsock"])
        .arg(format!("cid=7,socket={}", socket.display()))
        .args(["--cmdline", &format!("case=hostile_vsock ring={ring} hold")])
        .arg("--profile-json")
        .arg(&json)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut vm = Vm(child);
    let child = &mut vm.0;
    let pid = child.id();
    let mut out = Stream::spawn(child.stdout.take().unwrap());
    let mut err = Stream::spawn(child.stderr.take().unwrap());
    let set = out.wait_for(GUEST_WAIT, |t| t.contains(" set\n") || t.contains("ERROR"));
    assert!(set, "{}", out.text);
    let sender = HostSender::start(&socket);
    let done = out.wait_for(GUEST_WAIT, |t| {
        t.contains("EXITLESS DONE") || t.contains("EXITLESS ERROR")
    });
    assert!(done && !out.text.contains("EXITLESS ERROR"), "{}", out.text);
    assert!(
        out.text
            .contains("EXITLESS HOSTILE vsock needs_reset status="),
        "{}",
        out.text
    );
    assert!(
        out.text
            .contains("EXITLESS VIRTIO blk verified bytes=16384"),
        "the disk works beside the broken vsock: {}",
        out.text
    );
    assert!(
        out.text.contains("EXITLESS VIRTIO rng bytes=64 "),
        "{}",
        out.text
    );
    // The guest halts; the host keeps sending. Nothing of the VM may spin.
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(1));
    let after = cpu_ticks(pid);
    let (cpu, devices) = (after.0 - before.0, after.1 - before.1);
    let hz = ticks_per_second();
    assert!(
        cpu * 2 < hz,
        "the VM took {cpu} of {hz} ticks over a second while idle (the devices thread {devices})"
    );
    let ended = match ending {
        Ending::Timeout(t) => {
            let left = Duration::from_secs(t + 30).saturating_sub(spawned.elapsed());
            let end = wait_end(child, left);
            end.map(|(code, _)| {
                (
                    code,
                    spawned.elapsed().saturating_sub(Duration::from_secs(t)),
                )
            })
        }
        Ending::Signal(sig) => {
            // SAFETY: kill takes a pid of our own child and a signal number; no memory.
            assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
            wait_end(child, Duration::from_secs(30))
        }
    };
    drop(sender);
    err.read_to_end(Duration::from_secs(5));
    let Some((code, end)) = ended else {
        panic!("the VM did not end ({ending:?}): {}", err.text);
    };
    let want = if matches!(ending, Ending::Timeout(_)) {
        124
    } else {
        130
    };
    assert_eq!(code, Some(want), "{ending:?}: {}", err.text);
    // A second is the aim (vCPUs get 500 ms); slack for a shared, loaded machine.
    assert!(
        end < Duration::from_secs(3),
        "{ending:?} took {end:?} to end the VM"
    );
    assert!(!socket.exists(), "the vsock socket file is removed at exit");
    let profile = read_profile(&json);
    let vsock = profile_device(&profile, "virtio-vsock");
    assert_eq!(device_count(vsock, "broken_rings"), 1, "{vsock:#}");
    assert!(
        vsock["queues"][0]["malformed"].as_u64() >= Some(1),
        "{vsock:#}"
    );
    let blk = profile_device(&profile, "virtio-blk0");
    assert_eq!(device_count(blk, "broken_rings"), 0, "{blk:#}");
    BrokenRingRun {
        cpu_ticks: cpu * 1000 / hz,
        devices_ticks: devices * 1000 / hz,
        end,
    }
}

#[test]
fn a_broken_vsock_receive_ring_is_counted_and_neither_spins_nor_delays_the_end() {
    if !kvm_available("hostile_vsock") {
        return;
    }
    let guest = export_guest("hostile-vsock");
    let runs = [
        ("idx", Ending::Timeout(20)),
        ("zero", Ending::Signal(libc::SIGTERM)),
        ("idx", Ending::Signal(libc::SIGINT)),
    ];
    for (ring, ending) in runs {
        let r = broken_ring_run(&guest, ring, ending);
        eprintln!(
            "hostile_vsock ring={ring} {ending:?}: CPU over 1 s idle {} ms (devices thread {} ms), \
             ended {} ms after the {}",
            r.cpu_ticks,
            r.devices_ticks,
            r.end.as_millis(),
            if matches!(ending, Ending::Timeout(_)) { "timeout" } else { "signal" }
        );
    }
    std::fs::remove_file(&guest).ok();
}

const TOGGLES: u64 = 1000;
const SEED: u64 = 5;

/// Spawns the toggle guest with blk, rng, vsock and (with `net`) a net card.
fn spawn_toggles(guest: &Path, image: &Image, socket: &Path, json: &Path, net: bool) -> Child {
    let mut cmd = exitless();
    cmd.args(["run", "--kernel"])
        .arg(guest)
        .args(["--memory", "64M", "--rng", "--timeout", "600"])
        .args(["--disk", &image.disk_arg(false), "--vsock"])
        .arg(format!("cid=9,socket={}", socket.display()))
        .args([
            "--cmdline",
            &format!("case=hostile_toggle iters={TOGGLES} seed={SEED} sync hold"),
        ])
        .arg("--profile-json")
        .arg(json)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if net {
        cmd.args(["--net", "tap=exl0,mac=52:54:00:aa:bb:cc"]);
    }
    cmd.spawn().unwrap()
}

fn wait_line(out: &mut Stream, line: &str) {
    let found = out.wait_for(GUEST_WAIT * 2, |t| {
        t.contains(line) || t.contains("EXITLESS ERROR")
    });
    assert!(
        found && !out.text.contains("EXITLESS ERROR"),
        "{}",
        out.text
    );
}

/// Blocks of `image` that differ from what the guest wrote: `writes` pattern blocks, then
/// zeros.
fn disk_mismatches(image: &Image, writes: u64) -> Vec<u64> {
    let data = std::fs::read(&image.0).unwrap();
    let expected = |n: usize| {
        let (block, i) = ((n / 4096) as u64, (n % 4096) as u64);
        if block < writes {
            guest_pattern(SEED, block, i)
        } else {
            0
        }
    };
    let mut bad: Vec<u64> = (0..data.len())
        .filter(|&n| data[n] != expected(n))
        .map(|n| (n / 4096) as u64)
        .collect();
    bad.dedup();
    bad
}

#[test]
fn a_thousand_driver_ok_toggles_leave_no_fd_memory_or_replayed_write_behind() {
    let test = "hostile_toggle";
    if !kvm_available(test) {
        return;
    }
    let net = private_tap(&format!("{test} (network card)"), "exl0");
    let guest = export_guest("hostile-toggle");
    let image = Image::new("hostile-toggle", 16);
    let socket: PathBuf = std::env::temp_dir().join(format!(
        "exitless-hostile-toggle-{}.sock",
        std::process::id()
    ));
    let json = socket.with_extension("json");
    let mut vm = Vm(match &net {
        Some(n) => n
            .run(|| spawn_toggles(&guest, &image, &socket, &json, true))
            .unwrap(),
        None => spawn_toggles(&guest, &image, &socket, &json, false),
    });
    let child = &mut vm.0;
    let pid = child.id();
    let mut out = Stream::spawn(child.stdout.take().unwrap());
    let mut err = Stream::spawn(child.stderr.take().unwrap());
    wait_line(&mut out, "EXITLESS HOSTILE toggles begin");
    let (fds_before, hwm_before) = (fd_count(pid), peak_rss_kib(pid));
    let started = Instant::now();
    child.stdin.as_mut().unwrap().write_all(b"g").unwrap();
    wait_line(&mut out, "EXITLESS DONE");
    let took = started.elapsed();
    let (fds_after, hwm_after) = (fd_count(pid), peak_rss_kib(pid));
    // SAFETY: kill takes a pid of our own child and a signal number; no memory.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    let ended = wait_end(child, Duration::from_secs(30));
    err.read_to_end(Duration::from_secs(5));
    std::fs::remove_file(&guest).ok();
    assert_eq!(ended.map(|e| e.0), Some(Some(130)), "{}", err.text);
    let present = if net.is_some() {
        "blk=1 rng=1 net=1 vsock=1"
    } else {
        "blk=1 rng=1 net=0 vsock=1"
    };
    assert!(out.text.contains(present), "{}", out.text);
    let writes = TOGGLES.div_ceil(100);
    let done = format!(
        "EXITLESS HOSTILE toggles done n={TOGGLES} writes={writes} rng_reads={} seed={SEED}",
        writes + 1
    );
    assert!(out.text.contains(&done), "{}", out.text);
    eprintln!(
        "{test}: {TOGGLES} toggles in {took:?}: fds {fds_before} -> {fds_after}, \
         VmHWM {hwm_before} -> {hwm_after} KiB"
    );
    assert!(
        fds_after <= fds_before + 2,
        "host fds {fds_before} before the toggles, {fds_after} after"
    );
    assert!(
        hwm_after <= hwm_before + 4096,
        "peak RSS {hwm_before} KiB before the toggles, {hwm_after} KiB after"
    );
    assert_eq!(
        disk_mismatches(&image, writes),
        Vec::<u64>::new(),
        "blocks that differ from what the guest wrote (a replayed write?)"
    );
    let profile = read_profile(&json);
    let mut names = vec!["virtio-blk0", "virtio-rng", "virtio-vsock"];
    if net.is_some() {
        names.push("virtio-net0");
    }
    for name in names {
        let dev = profile_device(&profile, name);
        assert_eq!(
            device_count(dev, "refused_status_writes"),
            TOGGLES,
            "{dev:#}"
        );
        assert_eq!(device_count(dev, "broken_rings"), 0, "{dev:#}");
    }
    let blk = &profile_device(&profile, "virtio-blk0")["queues"][0];
    assert_eq!(blk["completed"], writes, "each write served once: {blk}");
    let rng = &profile_device(&profile, "virtio-rng")["queues"][0];
    assert_eq!(rng["completed"], writes + 1, "each read served once: {rng}");
}

/// Writes of the eject register by the hostile_eject guest (before issue 37 each one cost the
/// VMM about 520 bytes under `run`: 100,000 grew it by 52 MB).
const EJECTS: u64 = 100_000;
/// What the writes may add to the VMM's peak RSS (KiB): a bound with headroom.
const EJECT_GROWTH_KIB: u64 = 8 * 1024;

/// `exitless run` (each shipped build) of a guest writing every slot's bit to B0EJ EJECTS
/// times: its disk is ejected once and removed, the empty slots are logged once, and the
/// VMM's peak memory does not grow with the writes.
#[test]
fn a_guest_looping_on_the_pci_eject_register_grows_no_memory_under_run() {
    let test = "hostile_eject";
    if !kvm_available(test) {
        return;
    }
    let guest = export_guest("hostile-eject");
    for bin in builds() {
        let image = Image::new("hostile-eject", 16);
        let child = std::process::Command::new(&bin)
            .args(["run", "--kernel"])
            .arg(&guest)
            .args(["--memory", "64M", "--disk", &image.disk_arg(false)])
            .args([
                "--cmdline",
                &format!("case=hostile_eject iters={EJECTS} sync hold"),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut vm = Vm(child);
        let child = &mut vm.0;
        let pid = child.id();
        let mut out = Stream::spawn(child.stdout.take().unwrap());
        let mut err = Stream::spawn(child.stderr.take().unwrap());
        wait_line(&mut out, "EXITLESS HOSTILE eject begin");
        let before = peak_rss_kib(pid);
        child.stdin.as_mut().unwrap().write_all(b"g").unwrap();
        wait_line(&mut out, "EXITLESS DONE");
        let after = peak_rss_kib(pid);
        // SAFETY: kill takes a pid of our own child and a signal number; no memory.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
        let ended = wait_end(child, Duration::from_secs(30));
        err.read_to_end(Duration::from_secs(5));
        let build = bin.display();
        eprintln!("{test} ({build}): {EJECTS} ejects, VmHWM {before} -> {after} KiB");
        assert_eq!(ended.map(|e| e.0), Some(Some(130)), "{build}: {}", err.text);
        let done = format!("EXITLESS HOSTILE eject done n={EJECTS} slots_left=0");
        assert!(out.text.contains(&done), "{build}: {}", out.text);
        assert!(
            after <= before + EJECT_GROWTH_KIB,
            "{build}: peak RSS {before} KiB before the ejects, {after} KiB after"
        );
        let removed = err.text.matches("the guest ejected device").count();
        assert_eq!(removed, 1, "{build}: the disk, once: {}", err.text);
        let ignored = err.text.matches("that hold no device; ignored").count();
        assert_eq!(ignored, 1, "{build}: logged once: {}", err.text);
    }
    std::fs::remove_file(&guest).ok();
}

/// Through the API: the same loop ejects the VM's disk; the disk leaves the configuration
/// (it would come back at a reboot) and its id can be added again; memory stays flat.
#[test]
fn a_disk_the_guest_ejects_leaves_the_api_config_and_its_id_is_free() {
    let test = "hostile_eject_api";
    if !kvm_available(test) {
        return;
    }
    let guest = export_guest("hostile-eject-api");
    let image = Image::new("hostile-eject-api", 16);
    let serial = std::env::temp_dir().join(format!(
        "exitless-hostile-eject-api-{}.log",
        std::process::id()
    ));
    let vmm = Vmm::start("hostile-eject");
    let mut c = vmm.client();
    let body = serde_json::json!({
        "cpus": {"boot_vcpus": 1, "max_vcpus": 1},
        "memory": {"size": 64u64 << 20},
        "payload": {"kernel": guest, "cmdline": format!("case=hostile_eject iters={EJECTS} hold")},
        "disks": [{"path": image.0, "id": "d0"}],
        "serial": {"mode": "File", "file": serial},
        "console": {"mode": "Off"},
    })
    .to_string();
    ok(
        c.request("PUT", "vm.create", Some(&body)).unwrap(),
        "vm.create",
    );
    ok(c.request("PUT", "vm.boot", None).unwrap(), "vm.boot");
    let start = Instant::now();
    let mut before = None;
    let text = loop {
        let text = std::fs::read_to_string(&serial).unwrap_or_default();
        if before.is_none() && text.contains("EXITLESS HOSTILE eject begin") {
            before = Some(peak_rss_kib(vmm.pid()));
        }
        if text.contains("EXITLESS DONE") || text.contains("EXITLESS ERROR") {
            break text;
        }
        assert!(start.elapsed() < GUEST_WAIT * 2, "{text}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let after = peak_rss_kib(vmm.pid());
    let before = before.unwrap_or(after);
    eprintln!("{test}: {EJECTS} ejects, VmHWM {before} -> {after} KiB");
    let done = format!("EXITLESS HOSTILE eject done n={EJECTS} slots_left=0");
    assert!(text.contains(&done), "{text}");
    assert!(
        after <= before + EJECT_GROWTH_KIB,
        "peak RSS {before} KiB at the first eject, {after} KiB after"
    );
    let info = json(&ok(c.request("GET", "vm.info", None).unwrap(), "vm.info"));
    let disks = &info["config"]["disks"];
    assert!(
        disks.is_null() || disks == &serde_json::json!([]),
        "the ejected disk is still configured: {info}"
    );
    let again = serde_json::json!({"path": image.0, "id": "d0"}).to_string();
    let added = json(&ok(
        c.request("PUT", "vm.add-disk", Some(&again)).unwrap(),
        "vm.add-disk of the ejected disk's id",
    ));
    assert_eq!(added["id"], "d0");
    ok(
        c.request("PUT", "vmm.shutdown", None).unwrap(),
        "vmm.shutdown",
    );
    for f in [&guest, &serial] {
        let _ = std::fs::remove_file(f);
    }
}
