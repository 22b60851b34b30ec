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
use exitless_control::api::client::ApiClient;

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
    assert!(daemon.wait_connected(), "{}", daemon.log_text());
    // exitless ended: the connection closed with it, and virtiofsd saw that.
    assert!(daemon.wait_disconnected(), "{}", daemon.log_text());
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
    assert!(boot_fs.wait_connected());
    let add =
        serde_json::json!({"tag": "second", "socket": hot_fs.socket, "id": "myfs"}).to_string();
    let (status, added) = vmm.call("PUT", "vm.add-fs", Some(&add));
    assert_eq!(status, 200, "{added}");
    let added: serde_json::Value = serde_json::from_str(&added).unwrap();
    assert_eq!(added["id"], "myfs");
    let bdf = added["bdf"].as_str().unwrap();
    assert!(bdf.starts_with("0000:00:") && bdf.ends_with(".0"), "{bdf}");
    assert!(hot_fs.wait_connected());
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
    assert!(boot_fs.wait_disconnected(), "{}", boot_fs.log_text());
    assert!(hot_fs.wait_disconnected(), "{}", hot_fs.log_text());
    std::fs::remove_file(&kernel).ok();
}

/// The devices thread (`devices`) of process `pid`: its tid.
fn devices_thread(pid: u32) -> Option<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .filter_map(|t| t.ok())
        .find(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "devices")
        })?
        .file_name()
        .to_str()?
        .parse()
        .ok()
}

/// Times thread `tid` of `pid` went to sleep (voluntary context switches: one per wake-up),
/// read once it sleeps in epoll (its loop's wait), so that no wake-up is half counted.
fn devices_sleeps(pid: u32, tid: u32) -> u64 {
    let dir = format!("/proc/{pid}/task/{tid}");
    // epoll_wait, epoll_pwait, epoll_pwait2 (x86-64 numbers).
    let in_epoll = || {
        let s = std::fs::read_to_string(format!("{dir}/syscall")).unwrap_or_default();
        matches!(s.split_whitespace().next(), Some("232" | "281" | "441"))
    };
    let start = Instant::now();
    while !in_epoll() {
        assert!(
            std::path::Path::new(&dir).exists(),
            "the devices thread ended before it was read"
        );
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the devices thread never waited in epoll"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let status = std::fs::read_to_string(format!("{dir}/status")).unwrap();
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .unwrap();
    line.trim().parse().unwrap()
}

/// Userspace exits by reason and device from a `--profile-json` file, the console's left out
/// (the guest prints more or less as its chains went).
fn exits_but_console(json: &Path) -> std::collections::BTreeMap<String, u64> {
    let text = std::fs::read_to_string(json).expect("profile written");
    std::fs::remove_file(json).ok();
    let profile: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut exits = std::collections::BTreeMap::new();
    for reason in profile["totals"]["reasons"].as_array().unwrap() {
        let name = reason["reason"].as_str().unwrap();
        match reason["devices"].as_array().filter(|d| !d.is_empty()) {
            Some(devices) => {
                for d in devices.iter().filter(|d| d["device"] != "com1") {
                    let key = format!("{name} {}", d["device"].as_str().unwrap());
                    exits.insert(key, d["count"].as_u64().unwrap());
                }
            }
            None => {
                exits.insert(name.to_string(), reason["count"].as_u64().unwrap());
            }
        }
    }
    exits
}

/// What one run of the guest's `fs_hostile` case showed on the host.
struct HostileRun {
    out: String,
    err: String,
    status: Option<i32>,
    socket: PathBuf,
    /// Userspace exits but the console's, by reason and device.
    exits: std::collections::BTreeMap<String, u64>,
    /// Wake-ups of exitless's devices thread from the end of set-up to the guest's last chain.
    devices_woke: u64,
    /// Whether virtiofsd had ended by the time the guest was done with its chains.
    daemon_died: bool,
    daemon_log: String,
    flavour: vmm::devices::virtio::vhost_user::virtiofsd::Flavour,
}

/// A pseudo-terminal: its master (read and typed on by the test) and its slave (exitless's stdin and stdout). On a
/// terminal exitless writes the console byte by byte; on a pipe it holds partial lines and
/// its devices thread flushes them on a timer, which would wake it while the guest prints.
fn pty() -> (std::fs::File, std::fs::File) {
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    // SAFETY: posix_openpt opens a new descriptor (or fails); no memory of ours is involved.
    let master = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY) };
    assert!(master >= 0, "{}", std::io::Error::last_os_error());
    // SAFETY: master is a valid descriptor this function owns; from here it is the File's.
    let master_file = unsafe { std::fs::File::from_raw_fd(master) };
    let mut name = [0 as libc::c_char; 128];
    // SAFETY: unlockpt takes the descriptor; ptsname_r writes at most name.len() bytes.
    let named = unsafe {
        libc::unlockpt(master) == 0 && libc::ptsname_r(master, name.as_mut_ptr(), name.len()) == 0
    };
    assert!(named, "{}", std::io::Error::last_os_error());
    // SAFETY: ptsname_r succeeded, so name holds a NUL-terminated path.
    let path = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) };
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(path.to_str().unwrap())
        .unwrap();
    (master_file, slave)
}

/// `exitless run` of `case=fs_hostile fs_bad=BAD` against a virtiofsd of its own; None when
/// the host cannot run it (said as a skip).
fn hostile_run(guest: &Path, bad: &str) -> Option<HostileRun> {
    let mut daemon = Virtiofsd::start(&format!("fs_hostile_{bad}"))?;
    let json = daemon.dir.join("profile.json");
    let (console, terminal) = pty();
    let mut keyboard = console.try_clone().unwrap();
    let mut child = exitless()
        .args(["run", "--kernel"])
        .arg(guest)
        .args(["--memory", "size=64M,shared=on", "--timeout", "60"])
        .args(["--fs", &daemon.fs_arg()])
        .args([
            "--cmdline",
            &format!("case=fs_hostile fs_bad={bad} fs_hold=1"),
        ])
        .arg("--profile-json")
        .arg(&json)
        .stdin(terminal.try_clone().unwrap())
        .stdout(terminal)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut out = common::Stream::spawn(console);
    let mut err = common::Stream::spawn(child.stderr.take().unwrap());
    let limit = Duration::from_secs(60);
    let set_up = out.wait_for(limit, |t| {
        t.contains("EXITLESS VIRTIO fs device tag=") || t.contains("EXITLESS ERROR")
    });
    assert!(set_up && !out.text.contains("ERROR"), "{}", out.text);
    let tid = devices_thread(pid).expect("exitless has a devices thread");
    let before = devices_sleeps(pid, tid);
    let done = out.wait_for(limit, |t| t.contains("EXITLESS FS hostile done"));
    assert!(done, "{}", out.text);
    // The guest waited ~2 s for each chain virtiofsd died on: a dead one has gone by now.
    let daemon_died = daemon.has_ended();
    let devices_woke = devices_sleeps(pid, tid) - before;
    // The guest holds (fs_hold=1) until a byte comes on its console: the figures are read.
    std::io::Write::write_all(&mut keyboard, b"g").unwrap();
    let released = out.wait_for(limit, |t| t.contains("EXITLESS FS released"));
    assert!(released, "{}", out.text);
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code();
        }
        assert!(start.elapsed() < limit, "the VM did not end");
        std::thread::sleep(Duration::from_millis(10));
    };
    out.read_to_end(Duration::from_secs(5));
    err.read_to_end(Duration::from_secs(5));
    Some(HostileRun {
        out: out.text,
        err: err.text,
        status,
        socket: daemon.socket.clone(),
        exits: exits_but_console(&json),
        devices_woke,
        daemon_died,
        daemon_log: daemon.log_text(),
        flavour: daemon.flavour(),
    })
}

/// The guest's malformed FUSE chains reach virtiofsd only: whatever virtiofsd does with them
/// (answers an error, or dies; the Rust daemon's choice for each is asserted, QEMU's C one's
/// is its own), exitless makes no exit for them (every userspace exit but the
/// console's is the same as a run with only the valid request), its devices thread is not
/// woken by them, the guest ends normally and the VM exits 0. When virtiofsd dies, the
/// device goes DEVICE_NEEDS_RESET with one line naming it: the one wake-up of the devices
/// thread, for the socket's hang-up.
#[test]
fn a_guest_s_malformed_fuse_chains_reach_virtiofsd_only() {
    if !kvm_available("virtio_fs_hostile") {
        return;
    }
    let guest = export_guest("vhost-fs-hostile");
    // fs_bad names no chain: only the valid GETATTR.
    let Some(baseline) = hostile_run(&guest, "none") else {
        std::fs::remove_file(&guest).ok();
        return;
    };
    assert_eq!(
        baseline.status,
        Some(0),
        "{}\n{}",
        baseline.out,
        baseline.err
    );
    assert!(
        baseline
            .out
            .contains("chain=valid answer_for=valid used_len=120 error=0"),
        "{}",
        baseline.out
    );
    assert!(
        baseline.exits.values().sum::<u64>() > 0,
        "{:?}",
        baseline.exits
    );
    for (bad, dies) in [
        ("len", false),
        ("no_writable", true),
        ("huge", true),
        ("outside", true),
    ] {
        let r = hostile_run(&guest, bad).expect("virtiofsd ran for the baseline");
        let all = format!("{bad}:\n{}\n{}\n{}", r.out, r.err, r.daemon_log);
        assert_eq!(r.status, Some(0), "{all}");
        assert!(r.out.contains("EXITLESS DONE"), "{all}");
        assert!(!r.err.contains("panicked"), "{all}");
        assert_eq!(r.exits, baseline.exits, "no exit for a bad chain: {all}");
        // Which chains end the daemon is the daemon's business: the Rust one's are known;
        // QEMU's C one answers some it dies on. exitless's side holds either way.
        if r.flavour == vmm::devices::virtio::vhost_user::virtiofsd::Flavour::Rust {
            assert_eq!(r.daemon_died, dies, "{all}");
        }
        let dies = r.daemon_died;
        let needs_reset = format!(
            "the vhost-user back end at {} closed its socket; the device needs a reset",
            r.socket.display()
        );
        if dies {
            assert_eq!(r.err.matches(&needs_reset).count(), 1, "{all}");
            assert_eq!(r.err.matches("needs a reset").count(), 1, "{all}");
            assert!(r.out.contains(&format!("chain={bad} timeout")), "{all}");
            // The hang-up of the socket, or nothing if it came before set-up was sampled.
            assert!(r.devices_woke <= 1, "woke {} times: {all}", r.devices_woke);
        } else {
            assert!(!r.err.contains("needs a reset"), "{all}");
            let answered = format!("chain={bad} answer_for={bad}");
            assert!(r.out.contains(&answered), "{all}");
            assert!(
                r.out
                    .contains("chain=valid answer_for=valid used_len=120 error=0"),
                "{all}"
            );
            assert_eq!(r.devices_woke, 0, "{all}");
        }
    }
    std::fs::remove_file(&guest).ok();
}
