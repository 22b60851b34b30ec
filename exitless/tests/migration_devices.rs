//! Live migration on one host of a VM whose every kind of device is busy (docs/migration.md,
//! "Devices on one host"): the bench guest's `case=snapshot virtio=4 blkcheck=4 net=1` reads
//! and writes its disk, sends a frame on its tap (in a network namespace of the test's own,
//! the host's side echoing it) and makes a vsock connection every round. Moved mid-loop with
//! `exitless remote receive-migration` / `send-migration`, it finishes on the destination
//! with every check passing: the source let go of the disk's lock, the tap and the vsock
//! socket's path before the state went, and did not remove the socket the destination
//! listens on when it ended. A destination that refuses the state leaves the source with
//! all three taken back, its rounds going on. A card on a tap given as a file descriptor
//! moves to the one the destination is given (`net_fds`). With virtio-fs on the Rust virtiofsd (`fs=1`:
//! a file held open through FUSE), the back end logs its writes to guest memory and its
//! state goes with the VM's to a second virtiofsd: every record arrives.

mod common;

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::api_vmm::{ok, Vmm};
use common::host_echo::{echo_frames, Stop, VsockEcho};
use common::private_tap;
use common::snapshot::{last_tick, wait_file, SnapTest};
use serde_json::json;
use vmm::devices::virtio::net::private_net::{PrivateNet, KATA_TAP_FLAGS};

const TAP: &str = "exlmig0";
const TICKS: u64 = 12;

/// The test's VM: its guest, namespace, disk, vsock socket and the host's echoes.
struct Rig {
    t: SnapTest,
    net: PrivateNet,
    _frames: Stop,
    echoed: Arc<AtomicU64>,
    socket: PathBuf,
    image: PathBuf,
}

fn rig(test: &str, tag: &str) -> Option<Rig> {
    let t = SnapTest::start(test, tag)?;
    let net = private_tap(test, TAP)?;
    let (frames, echoed) = echo_frames(&net, TAP);
    let socket = t.scratch.join("v.sock");
    VsockEcho::start(&socket);
    let image = t.scratch.join("d.img");
    let disk = std::fs::File::create(&image).unwrap();
    disk.set_len(TICKS * 4 * 4096).unwrap();
    Some(Rig {
        t,
        net,
        _frames: frames,
        echoed,
        socket,
        image,
    })
}

impl Rig {
    /// An API VMM inside the namespace.
    fn vmm(&self, tag: &str) -> Vmm {
        self.net.run(|| Vmm::start(tag)).unwrap()
    }

    /// The source: the VM with a disk (locked, the default), the tap and vsock, in its
    /// second round.
    fn source(&self, tag: &str) -> (Vmm, PathBuf) {
        self.source_on(tag, None)
    }

    /// [`Rig::source`], its card on the tap `tap_fd` is open on (sent with `vm.add-net`,
    /// as Kata sends its taps) if given, else on the tap by name.
    fn source_on(&self, tag: &str, tap_fd: Option<RawFd>) -> (Vmm, PathBuf) {
        let serial = self.t.scratch.join(&format!("{tag}.log"));
        let cmdline = format!(
            "case=snapshot ticks={TICKS} iters=2000 touch_mib=8 virtio=4 blkcheck=4 net=1 hold"
        );
        let body = json!({
            "cpus": {"boot_vcpus": 1, "max_vcpus": 1},
            "memory": {"size": 256u64 << 20},
            "payload": {"kernel": self.t.guest, "cmdline": cmdline},
            "serial": {"mode": "File", "file": serial},
            "disks": [{"path": self.image}],
            "vsock": {"cid": 7, "socket": self.socket},
        });
        let mut body = body;
        let card = json!({"mac": "52:54:00:aa:bb:cd"});
        if tap_fd.is_none() {
            body["net"] = json!([{"tap": TAP, "mac": card["mac"]}]);
        }
        let vmm = self.vmm(tag);
        let mut c = vmm.client();
        ok(
            c.request("PUT", "vm.create", Some(&body.to_string()))
                .unwrap(),
            "vm.create",
        );
        if let Some(fd) = tap_fd {
            let r = c.request_with_fds("PUT", "vm.add-net", Some(&card.to_string()), &[fd]);
            ok(r.unwrap(), "vm.add-net with the tap's fd");
        }
        ok(c.request("PUT", "vm.boot", None).unwrap(), "vm.boot");
        let text = wait_file(&serial, "TICK n=1 ");
        assert!(text.contains("EXITLESS SNAPNET n=0 "), "{text}");
        (vmm, serial)
    }
}

/// `exitless remote --api-socket SOCKET ARGS...`.
fn remote(socket: &Path, args: &[&str]) -> std::process::Command {
    let mut c = common::exitless();
    c.arg("remote").arg("--api-socket").arg(socket).args(args);
    c
}

/// The value of `key=` in a console line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split(' ').find_map(|w| w.strip_prefix(key))
}

/// Every round once, in order, each with its disk, entropy and network work, the checks at
/// the end passing; the vsock transport reset seen once, from round `reset` on (None: never).
fn assert_every_round(text: &str, reset: Option<u64>) {
    assert!(!text.contains("EXITLESS ERROR"), "{text}");
    let ticks: Vec<&str> = text.lines().filter(|l| l.contains("TICK")).collect();
    let want: Vec<String> = (0..TICKS)
        .map(|n| format!("EXITLESS TICK n={n} count={}", n + 1))
        .collect();
    assert_eq!(ticks, want, "{text}");
    let result = text.lines().find(|l| l.contains("RESULT")).unwrap();
    for want in ["bad=0 ", "ok=1", " io_errors=0", " blkcheck_bad=0"] {
        assert!(result.contains(want), "{want}: {text}");
    }
    let rounds: Vec<&str> = text.lines().filter(|l| l.contains("SNAPNET")).collect();
    assert_eq!(rounds.len() as u64, TICKS, "{text}");
    for (n, l) in rounds.iter().enumerate() {
        assert_eq!(field(l, "n="), Some(n.to_string().as_str()), "{l}");
        assert_eq!(field(l, "cid="), Some("7"), "{l}");
        let resets = match reset.is_some_and(|r| n as u64 >= r) {
            true => "1",
            false => "0",
        };
        assert_eq!(
            field(l, "resets="),
            Some(resets),
            "reset at {reset:?}: {text}"
        );
    }
}

/// Waits until `path` exists (a receiver listens there).
fn wait_path(path: &Path) {
    let start = Instant::now();
    while !path.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "nothing listens at {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Moves the VM of `src` to `dest` (a VMM with none) with `exitless remote
/// receive-migration` / `send-migration` over `unix:` at `m`; checks both succeeded and the
/// source ended. `said` is what a failure adds (a back end's log).
fn move_with_remote(src: &mut Vmm, dest: &Vmm, m: &Path, said: impl Fn() -> String) {
    let receiver_url = format!("receiver_url=unix:{}", m.display());
    let mut receiving = remote(&dest.socket, &["receive-migration", &receiver_url])
        .spawn()
        .unwrap();
    wait_path(m);
    let destination = format!("destination_url=unix:{},downtime_ms=50", m.display());
    let sent = remote(&src.socket, &["send-migration", &destination])
        .output()
        .unwrap();
    if !sent.status.success() {
        src.stderr.wait_for(Duration::from_millis(200), |_| false);
    }
    assert!(
        sent.status.success(),
        "{} {} {}",
        String::from_utf8_lossy(&sent.stderr),
        src.stderr.text,
        said()
    );
    assert!(receiving.wait().unwrap().success());
    let ended = src.wait_exit(Duration::from_secs(10));
    assert!(
        ended.is_some_and(|s| s.success()),
        "the source ends: {ended:?}"
    );
}

#[test]
fn a_guest_with_disk_tap_and_vsock_busy_migrated_on_one_host_finishes_on_the_destination() {
    let test = "devices_migrated_on_one_host";
    let Some(r) = rig(test, "migdev") else {
        return;
    };
    let (mut src, serial) = r.source("migdev-src");
    let dest = r.vmm("migdev-dst");
    let before = last_tick(&std::fs::read_to_string(&serial).unwrap()).unwrap();
    let echoed_before = r.echoed.load(Ordering::Relaxed);
    let m = r.t.scratch.join("m.sock");
    move_with_remote(&mut src, &dest, &m, String::new);
    let after = last_tick(&std::fs::read_to_string(&serial).unwrap()).unwrap();
    // The source ended without removing the socket the destination listens on.
    assert!(r.socket.exists(), "the destination's vsock socket is gone");
    UnixStream::connect(&r.socket).expect("the destination listens on the vsock socket");
    let text = wait_file(&serial, "EXITLESS DONE");
    // The transport reset reaches the guest on the destination: in the round it moved in
    // or the next.
    let reset = first_reset(&text);
    assert!(
        reset.is_some_and(|n| n > before && n <= after + 1),
        "one transport reset once moved (rounds {before}..={after}): {text}"
    );
    assert_every_round(&text, reset);
    assert!(r.echoed.load(Ordering::Relaxed) > echoed_before + 1);
    drop(dest);
}

/// A card whose tap came as a file descriptor (as Kata gives its taps): the destination
/// takes the one `vm.receive-migration` brings (`net_fds`, here another descriptor of the
/// same open tap, as whoever gave the source its own would give it); the source stops
/// reading its own at the hand-over, so the frames for the guest wait for the destination.
#[test]
fn a_card_on_a_tap_given_as_an_fd_moves_to_the_fd_the_destination_is_given() {
    let test = "tap_fd_migrated_on_one_host";
    let Some(r) = rig(test, "migdev-fd") else {
        return;
    };
    let tap = r.net.open_foreign_tap(TAP, KATA_TAP_FLAGS).unwrap();
    let (mut src, serial) = r.source_on("migdev-fd-src", Some(tap.as_raw_fd()));
    let dest = r.vmm("migdev-fd-dst");
    let m = r.t.scratch.join("m.sock");
    let body = json!({
        "receiver_url": format!("unix:{}", m.display()),
        "net_fds": [{"id": "_net0", "num_fds": 1}],
    });
    let mut c = dest.client();
    let receiving = std::thread::spawn(move || {
        let fd = tap.as_raw_fd();
        let r = c.request_with_fds(
            "PUT",
            "vm.receive-migration",
            Some(&body.to_string()),
            &[fd],
        );
        (r.unwrap(), tap)
    });
    wait_path(&m);
    let echoed_before = r.echoed.load(Ordering::Relaxed);
    let destination = format!("destination_url=unix:{}", m.display());
    let sent = remote(&src.socket, &["send-migration", &destination])
        .output()
        .unwrap();
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    let (received, _tap) = receiving.join().unwrap();
    assert_eq!(received.status, 204, "{}", received.body);
    let ended = src.wait_exit(Duration::from_secs(10));
    assert!(
        ended.is_some_and(|s| s.success()),
        "the source ends: {ended:?}"
    );
    let text = wait_file(&serial, "EXITLESS DONE");
    assert_every_round(&text, first_reset(&text));
    assert!(first_reset(&text).is_some(), "{text}");
    assert!(r.echoed.load(Ordering::Relaxed) > echoed_before + 1);
    drop(dest);
}

/// The first round that saw the vsock transport reset.
fn first_reset(text: &str) -> Option<u64> {
    text.lines()
        .filter(|l| l.contains("SNAPNET") && field(l, "resets=") == Some("1"))
        .find_map(|l| field(l, "n=")?.parse().ok())
}

/// A fake destination that takes Start, Config and Memory as exitless's does (reading the
/// bytes) and answers State with an Error: the source lets go of its host resources before
/// State and must take them back.
fn state_refusing_destination(path: &Path) -> JoinHandle<()> {
    let listener = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let answer = |s: &mut UnixStream, status: u8| {
            let mut a = [0u8; 16];
            a[0] = status;
            s.write_all(&a).unwrap();
        };
        loop {
            let mut h = [0u8; 16];
            s.read_exact(&mut h).unwrap();
            let command = u16::from_le_bytes([h[0], h[1]]);
            let len = u64::from_le_bytes(h[8..].try_into().unwrap());
            let mut payload = vec![0u8; len as usize];
            s.read_exact(&mut payload).unwrap();
            if command == 4 {
                let bytes: u64 = payload
                    .chunks_exact(16)
                    .map(|e| u64::from_le_bytes(e[8..].try_into().unwrap()))
                    .sum();
                std::io::copy(&mut (&mut s).take(bytes), &mut std::io::sink()).unwrap();
            }
            match command {
                3 => return answer(&mut s, 2),
                _ => answer(&mut s, 1),
            }
        }
    })
}

#[test]
fn a_destination_refusing_the_state_leaves_the_source_its_disk_tap_and_vsock() {
    let test = "state_refused_devices_taken_back";
    let Some(r) = rig(test, "migdev-back") else {
        return;
    };
    let (mut src, serial) = r.source("migdev-back-src");
    let m = r.t.scratch.join("m.sock");
    let refusing = state_refusing_destination(&m);
    let body = json!({"destination_url": format!("unix:{}", m.display())});
    let sent = src
        .client()
        .request("PUT", "vm.send-migration", Some(&body.to_string()))
        .unwrap();
    refusing.join().unwrap();
    assert!(sent.status >= 400, "{} {}", sent.status, sent.body);
    assert!(sent.body.contains("State"), "{}", sent.body);
    let echoed_before = r.echoed.load(Ordering::Relaxed);
    // The vsock socket is the source's again: listened on, and still there.
    UnixStream::connect(&r.socket).expect("the source listens on its vsock socket again");
    let text = wait_file(&serial, "EXITLESS DONE");
    src.stderr.wait_for(Duration::from_millis(200), |_| false);
    let text = format!("{text}\n(the source's stderr)\n{}", src.stderr.text);
    assert_every_round(&text, None);
    assert!(r.echoed.load(Ordering::Relaxed) > echoed_before + 1);
    // The disk's lock is the source's again: a second VMM cannot take it.
    let other = r.vmm("migdev-back-other");
    let body = json!({
        "payload": {"kernel": r.t.guest, "cmdline": "case=snapshot ticks=1"},
        "disks": [{"path": r.image}],
    });
    let created = other
        .client()
        .request("PUT", "vm.create", Some(&body.to_string()))
        .unwrap();
    let booted = other.client().request("PUT", "vm.boot", None).unwrap();
    assert!(
        created.status >= 400 || booted.status >= 400,
        "a second VMM took the disk: {} {}",
        created.body,
        booted.body
    );
    drop(src);
}

/// The records the bench guest's `fs=1` writes in `rounds` rounds: byte i of round t's 16.
fn fs_records(rounds: u64) -> Vec<u8> {
    (0..rounds * 16)
        .map(|i| ((i / 16 * 31 + i % 16 * 7 + 1) & 0xff) as u8)
        .collect()
}

/// The source of the virtio-fs test: the bench guest on shared memory with `fs=1` on the
/// back end at `socket`, in its second round.
fn fs_source(t: &SnapTest, socket: &Path) -> (Vmm, PathBuf) {
    let serial = t.scratch.join("fs.log");
    let cmdline = format!("case=snapshot ticks={TICKS} iters=2000 touch_mib=8 fs=1 hold");
    let body = json!({
        "cpus": {"boot_vcpus": 1, "max_vcpus": 1},
        "memory": {"size": 256u64 << 20, "shared": true},
        "payload": {"kernel": t.guest, "cmdline": cmdline},
        "serial": {"mode": "File", "file": serial},
        "fs": [{"tag": "kataShared", "socket": socket}],
    });
    let src = Vmm::start("migfs-src");
    src.create_and_boot(&body);
    wait_file(&serial, "TICK n=1 ");
    (src, serial)
}

/// virtio-fs on the Rust virtiofsd, which logs its writes to guest memory into the region
/// exitless shares (LOG_SHMFD, VHOST_F_LOG_ALL): the guest holding a file open through
/// FUSE, writing a record through it and reading all back every round, is moved mid-loop to
/// a destination in front of a second virtiofsd on the same directory (at the same socket
/// path, as a host's orchestrator puts it), which gets the first's state; every round and
/// record arrives.
#[test]
fn a_guest_using_virtio_fs_migrated_mid_loop_goes_on_with_its_open_file() {
    let test = "virtio_fs_migrated";
    let Some(t) = SnapTest::start(test, "migfs") else {
        return;
    };
    let Some(daemon) = common::virtiofsd::Virtiofsd::find(test) else {
        return;
    };
    use vmm::devices::virtio::vhost_user::virtiofsd::Flavour;
    if daemon.flavour != Flavour::Rust {
        let why = "the virtiofsd found is QEMU's C one, which neither logs nor has device state";
        return vmm::test_skip::skip(test, why);
    }
    let spawn = common::virtiofsd::Virtiofsd::spawn;
    let first = spawn("migfs-a", daemon.clone(), None, true);
    let shared = first.shared();
    std::fs::write(shared.join("snap.bin"), b"").unwrap();
    let (mut src, serial) = fs_source(&t, &first.socket);
    // The second virtiofsd, on the same directory, takes over the first's socket path.
    let second = spawn("migfs-b", daemon, Some(shared.clone()), true);
    std::fs::rename(&second.socket, &first.socket).unwrap();
    let dest = Vmm::start("migfs-dst");
    let m = t.scratch.join("m.sock");
    let logs = || {
        format!(
            "{}\n(the second virtiofsd)\n{}",
            first.log_text(),
            second.log_text()
        )
    };
    move_with_remote(&mut src, &dest, &m, logs);
    let text = wait_file(&serial, "EXITLESS DONE");
    assert!(!text.contains("EXITLESS ERROR"), "{text}");
    let ticks = text.lines().filter(|l| l.contains("TICK")).count() as u64;
    assert_eq!(ticks, TICKS, "{text}");
    let all = format!("EXITLESS SNAPFS n={} bytes={}", TICKS - 1, TICKS * 16);
    assert!(text.contains(&all) && text.contains("ok=1"), "{text}");
    assert!(second.wait_connected(), "{}", second.log_text());
    assert_eq!(
        std::fs::read(shared.join("snap.bin")).unwrap(),
        fs_records(TICKS)
    );
    assert_eq!(
        std::fs::read(shared.join("snap-new.bin")).unwrap(),
        fs_records(TICKS)
    );
    drop(dest);
}
