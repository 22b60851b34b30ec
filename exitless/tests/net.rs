//! virtio-net end to end, driven by the bench guest's own driver: under exitless on a tap in a
//! network namespace of the test's own (a raw packet socket plays the host), and under
//! QEMU's virtio-net-pci with a UDP socket backend (the driver is right).

mod common;

use std::net::UdpSocket;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{device_count, exitless, export_guest, qemu};
use vmm::devices::virtio::net::private_net::{PacketSocket, PrivateNet};

const ETHERTYPE: u16 = 0x88b5;
const GUEST_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0xaa, 0xbb, 0xcc];
const HOST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const ECHOES: usize = 3;

/// A frame from the host to `to` carrying "host frame K" and padding.
fn host_frame(to: &[u8], k: usize) -> Vec<u8> {
    let mut f = to.to_vec();
    f.extend_from_slice(&HOST_MAC);
    f.extend_from_slice(&ETHERTYPE.to_be_bytes());
    f.extend_from_slice(format!("host frame {k}").as_bytes());
    f.resize(100 + k, 0x77);
    f
}

/// The guest's first frame: to everyone, from `mac`, saying so.
fn check_hello(hello: &[u8], mac: &[u8]) {
    assert_eq!(hello.len(), 60, "{hello:02x?}");
    assert_eq!(&hello[..6], &[0xff; 6], "broadcast");
    assert_eq!(&hello[6..12], mac, "from the guest's MAC");
    assert_eq!(&hello[12..14], &ETHERTYPE.to_be_bytes());
    assert!(
        hello[14..].starts_with(b"exitless guest frame"),
        "{hello:02x?}"
    );
}

/// The guest's echo of `sent`: back to the sender, from `mac`, the payload unchanged.
fn check_echo(echo: &[u8], sent: &[u8], mac: &[u8]) {
    assert_eq!(&echo[..6], &sent[6..12], "to the sender");
    assert_eq!(&echo[6..12], mac, "from the guest");
    assert_eq!(&echo[12..], &sent[12..], "the payload");
}

fn check_console(out: &str) {
    assert_eq!(
        out.matches("EXITLESS NET echoed bytes=").count(),
        ECHOES,
        "{out}"
    );
    assert!(out.contains("EXITLESS NET sent bytes=60"), "{out}");
    assert!(!out.contains("EXITLESS ERROR"), "{out}");
}

#[test]
fn frames_cross_the_tap_both_ways_and_the_profile_counts_them() {
    let test = "virtio_net_tap";
    if !Path::new("/dev/kvm").exists() {
        return vmm::test_skip::skip(test, "/dev/kvm is missing on this host");
    }
    let net = match PrivateNet::create().and_then(|n| n.add_tap("exl0").map(|_| n)) {
        Ok(n) => n,
        Err(e) => {
            let why = format!("cannot make a network namespace with a tap (needs root): {e}");
            return vmm::test_skip::skip(test, &why);
        }
    };
    let guest = export_guest("net-tap");
    for bin in common::builds() {
        frames_both_ways(&bin, &net, &guest);
    }
    std::fs::remove_file(&guest).ok();
}

/// The guest's frame out through the tap and the host's frames echoed back, with `bin`.
fn frames_both_ways(bin: &Path, net: &PrivateNet, guest: &Path) {
    let json = guest.with_extension("profile.json");
    let (child, sock) = net
        .run(|| {
            let sock = PacketSocket::bind("exl0", ETHERTYPE).unwrap();
            let child = Command::new(bin)
                .args(["run", "--kernel"])
                .arg(guest)
                .args(["--memory", "64M", "--timeout", "60"])
                .args(["--net", "tap=exl0,mac=52:54:00:aa:bb:cc"])
                .args(["--cmdline", &format!("case=net_check iters={ECHOES}")])
                .arg("--profile-json")
                .arg(&json)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (child, sock)
        })
        .unwrap();
    let wait = Duration::from_secs(30);
    let hello = sock.recv(wait).expect("the guest's frame reaches the tap");
    check_hello(&hello, &GUEST_MAC);
    for k in 0..ECHOES {
        let sent = host_frame(&GUEST_MAC, k);
        sock.send(&sent).unwrap();
        let echo = sock.recv(wait).expect("the guest echoes the host's frame");
        check_echo(&echo, &sent, &GUEST_MAC);
    }
    let o = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    check_console(&out);
    let profile: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).ok();
    let dev = &profile["virtio"][0];
    assert_eq!(dev["device"], "virtio-net0", "{profile:#}");
    let count = |name: &str| device_count(dev, name);
    assert_eq!(count("tx_frames"), 1 + ECHOES as u64, "{dev:#}");
    assert!(count("rx_frames") >= ECHOES as u64, "{dev:#}");
    assert_eq!((count("tx_errors"), count("rx_dropped")), (0, 0), "{dev:#}");
}

#[test]
fn a_tap_that_cannot_be_opened_is_one_line() {
    let o = exitless()
        .args(["run", "--kernel", "/nonexistent", "--net", "tap=a/b"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("Invalid --net 'tap=a/b'"), "{err}");
}

/// In a user namespace of its own, root has no CAP_NET_ADMIN over the host's network: making
/// a tap there fails, and says what would work.
#[test]
fn a_tap_this_process_may_not_create_is_one_line_that_says_what_is_needed() {
    let test = "virtio_net_no_permission";
    if !Path::new("/dev/kvm").exists() {
        return vmm::test_skip::skip(test, "/dev/kvm is missing on this host");
    }
    let probe = Command::new("unshare")
        .args(["--user", "--map-root-user", "true"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        return vmm::test_skip::skip(test, "cannot make a user namespace (unshare --user)");
    }
    let guest = export_guest("net-noperm");
    let o = Command::new("unshare")
        .args(["--user", "--map-root-user"])
        .arg(common::exitless_path())
        .args(["run", "--kernel"])
        .arg(&guest)
        .args(["--net", "tap=exl-noperm", "--timeout", "10"])
        .output()
        .unwrap();
    std::fs::remove_file(&guest).ok();
    let err = String::from_utf8_lossy(&o.stderr);
    if err.contains("/dev/kvm") {
        return vmm::test_skip::skip(test, "/dev/kvm cannot be opened in a user namespace here");
    }
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("Cannot open tap 'exl-noperm': needs CAP_NET_ADMIN or an existing tap"),
        "{err}"
    );
}

#[test]
fn qemu_virtio_net_passes_the_guest_driver_check() {
    let Some(qemu) = qemu("qemu_virtio_net") else {
        return;
    };
    let guest = export_guest("net-qemu");
    // QEMU sends each frame as a UDP datagram to `host` and takes frames on `qemu_port`.
    let host = UdpSocket::bind("127.0.0.1:0").unwrap();
    host.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let qemu_port = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let netdev = format!(
        "socket,id=n0,udp={},localaddr=127.0.0.1:{qemu_port}",
        host.local_addr().unwrap()
    );
    let child = Command::new("timeout")
        .args(["120", qemu, "-accel", "kvm", "-accel", "tcg", "-M", "pc"])
        .args(["-nodefaults", "-m", "128M", "-kernel"])
        .arg(&guest)
        .args(["-serial", "stdio", "-display", "none", "-monitor", "none"])
        .args([
            "-no-reboot",
            "-device",
            "isa-debug-exit,iobase=0xf4,iosize=4",
        ])
        .args(["-netdev", &netdev])
        .args([
            "-device",
            "virtio-net-pci,disable-legacy=on,netdev=n0,mac=52:54:00:aa:bb:cc",
        ])
        .args(["-append", &format!("case=net_check iters={ECHOES}")])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut buf = [0u8; 2048];
    let (n, _) = host.recv_from(&mut buf).expect("the guest's frame");
    check_hello(&buf[..n], &GUEST_MAC);
    for k in 0..ECHOES {
        let sent = host_frame(&GUEST_MAC, k);
        host.send_to(&sent, ("127.0.0.1", qemu_port)).unwrap();
        let (n, _) = host.recv_from(&mut buf).expect("the echo");
        check_echo(&buf[..n], &sent, &GUEST_MAC);
    }
    let o = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    // isa-debug-exit makes QEMU exit with (status << 1) | 1; the guest reports status 0.
    assert_eq!(o.status.code(), Some(1), "{out}");
    check_console(&out);
}
