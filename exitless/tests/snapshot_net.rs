//! Snapshot and restore of a VM whose driver set up a network card and vsock (what every Kata
//! VM has), end to end with the binary that ships: the bench guest's `case=snapshot net=1`
//! sends a frame and reads the host's echo, and makes a vsock connection with a line and its
//! echo, every round; paused mid-run, snapshotted, restored in a fresh process, it goes on
//! with both (frames in flight are sent again, the vsock transport reset ends its connection
//! and it connects anew). A card whose tap came as file descriptors is restored on the fds
//! `vm.restore` brings (`net_fds`), refused by name without them. See docs/snapshot.md.

mod common;

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::Ordering;

use common::api_vmm::{ok, Vmm};
use common::host_echo::{echo_frames, VsockEcho};
use common::private_tap;
use common::snapshot::{
    assert_saved_running, boot_to_second_round, last_tick, pause_and_snapshot, restored_in,
    saved_state, shutdown, wait_file, SnapTest,
};
use serde_json::Value;
use vmm::devices::virtio::net::private_net::{PrivateNet, KATA_TAP_FLAGS};
use vmm::snapshot::SnapshotState;

const TICKS: u64 = 5;
/// Through the API the guest halts once done: its reset would reboot the VM.
const CMDLINE: &str = "case=snapshot ticks=5 iters=20000 touch_mib=8 net=1 hold";
const TAP: &str = "exlsnap0";

/// The value of `key=` in a console line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split(' ').find_map(|w| w.strip_prefix(key))
}

/// A VMM inside the test's network namespace (where the tap is).
fn vmm_in(net: &PrivateNet, tag: &str) -> Vmm {
    net.run(|| Vmm::start(tag)).unwrap()
}

/// The VM made through the API with the card and vsock, paused in its second round while its
/// vsock connection waits for the host's echo (held), snapshotted into `dir`, resumed (it
/// goes on, the echo let go) and ended; the last round it printed before the snapshot.
fn snapshot_of_a_vm(net: &PrivateNet, guest: &Path, echo: &VsockEcho, dir: &Path) -> u64 {
    let socket = dir.with_extension("v.sock");
    let serial = dir.with_extension("serial.log");
    let body = serde_json::json!({
        "cpus": {"boot_vcpus": 1, "max_vcpus": 1},
        "memory": {"size": 268435456},
        "payload": {"kernel": guest, "cmdline": CMDLINE},
        "serial": {"mode": "File", "file": serial},
        "net": [{"tap": TAP, "mac": "52:54:00:aa:bb:cd"}],
        "vsock": {"cid": 7, "socket": socket},
    });
    let vmm = vmm_in(net, "snap-net");
    let mut c = vmm.client();
    let text = boot_to_second_round(&mut c, &body.to_string(), &serial);
    assert!(text.contains("EXITLESS SNAPNET n=0 "), "{text}");
    echo.hold.store(true, Ordering::Relaxed);
    echo.wait_held();
    pause_and_snapshot(&mut c, dir);
    let last = last_tick(&std::fs::read_to_string(&serial).unwrap()).unwrap();
    // The VM snapshotted goes on with both devices, its connection too.
    echo.hold.store(false, Ordering::Relaxed);
    ok(c.request("PUT", "vm.resume", None).unwrap(), "vm.resume");
    let text = wait_file(&serial, &format!("TICK n={} ", last + 1));
    let went_on = format!(
        "SNAPNET n={} net_tries=1 vsock_tries=1 resets=0 cid=7",
        last + 1
    );
    assert!(text.contains(&went_on), "{text}");
    shutdown(&mut c);
    last
}

#[test]
fn a_guest_using_its_network_card_and_vsock_goes_on_with_both_once_restored() {
    let test = "a_guest_using_its_network_card_and_vsock";
    let Some(t) = SnapTest::start(test, "net") else {
        return;
    };
    let Some(net) = private_tap(test, TAP) else {
        return;
    };
    let (scratch, guest, dir) = (&t.scratch, &t.guest, &t.dir);
    let (_frames, echoed) = echo_frames(&net, TAP);
    let echo = VsockEcho::start(&dir.with_extension("v.sock"));
    let accepted = echo.accepted.clone();
    let last = snapshot_of_a_vm(&net, guest, &echo, dir);
    let state = saved_state(dir);
    assert_saved_running(
        &state,
        &[("_net0", "virtio-net"), ("_vsock0", "virtio-vsock")],
    );
    let before = (
        echoed.load(Ordering::Relaxed),
        accepted.load(Ordering::Relaxed),
    );
    assert!(before.0 >= 2 && before.1 >= 2, "{before:?}");

    // Restored in a fresh VMM: its console to a new file.
    let config = dir.join("config.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    c["serial"]["file"] = serde_json::json!(scratch.join("restored.log"));
    std::fs::write(&config, c.to_string()).unwrap();
    let vmm = restored_in(vmm_in(&net, "snap-net-2"), dir);
    check_goes_on(
        &wait_file(&scratch.join("restored.log"), "EXITLESS DONE"),
        last,
    );
    let after = (
        echoed.load(Ordering::Relaxed),
        accepted.load(Ordering::Relaxed),
    );
    assert!(
        after.0 > before.0 && after.1 > before.1,
        "{before:?} {after:?}"
    );
    drop(vmm);
    // As Kata sends its taps: a card with no tap name in config.json.
    c["net"][0].as_object_mut().unwrap().remove("tap");
    c["serial"]["file"] = serde_json::json!(scratch.join("again.log"));
    std::fs::write(&config, c.to_string()).unwrap();
    let _vmm = restore_on_tap_fds(&net, dir);
    check_goes_on(
        &wait_file(&scratch.join("again.log"), "EXITLESS DONE"),
        last,
    );
}

/// A 400 of one line holding `what`.
fn refused_in_one_line(r: std::io::Result<exitless_control::api::client::Reply>, what: &str) {
    let r = r.unwrap();
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.body.trim().lines().count(), 1, "{}", r.body);
    assert!(r.body.contains(what), "{}", r.body);
}

/// The snapshot in `dir`, whose card has no tap name (it came as file descriptors), in a fresh
/// VMM: refused naming the card without fds, and with a card state no driver could have
/// written (a queue of 3 entries, checksum right); restored on a tap fd sent with `net_fds`
/// (opened as Kata opens it) and resumed.
fn restore_on_tap_fds(net: &PrivateNet, dir: &Path) -> Vmm {
    let vmm = vmm_in(net, "snap-net-fds");
    let mut api = vmm.client();
    let url = format!("file://{}", dir.display());
    let plain = serde_json::json!({ "source_url": url }).to_string();
    let r = api.request("PUT", "vm.restore", Some(&plain));
    refused_in_one_line(
        r,
        "device _net0 (virtio-net) had its tap sent as file descriptors",
    );
    let info = api.request("GET", "vm.info", None).unwrap();
    assert_ne!(info.status, 200, "no VM: {}", info.body);
    let with_fds = serde_json::json!({
        "source_url": url,
        "net_fds": [{"id": "_net0", "num_fds": 1}],
    })
    .to_string();
    let state_file = dir.join("state.json");
    let good = std::fs::read(&state_file).unwrap();
    let mut bad = SnapshotState::parse(&good).unwrap();
    let card = &mut bad.devices.get_mut("_net0").unwrap().state;
    card["transport"]["common"]["queues"][0][0] = serde_json::json!(3);
    std::fs::write(&state_file, bad.to_json().unwrap()).unwrap();
    let tap = net.open_foreign_tap(TAP, KATA_TAP_FLAGS).unwrap();
    let r = api.request_with_fds("PUT", "vm.restore", Some(&with_fds), &[tap.as_raw_fd()]);
    refused_in_one_line(r, "The saved state of device _net0 (virtio-net) is invalid");
    std::fs::write(&state_file, good).unwrap();
    drop(tap);
    let tap = net.open_foreign_tap(TAP, KATA_TAP_FLAGS).unwrap();
    let r = api.request_with_fds("PUT", "vm.restore", Some(&with_fds), &[tap.as_raw_fd()]);
    ok(r.unwrap(), "vm.restore with net_fds");
    ok(api.request("PUT", "vm.resume", None).unwrap(), "vm.resume");
    vmm
}

/// The restored guest's console: its rounds go on from the one after `last`, each with a
/// frame echoed and a vsock round trip; the connection that waited for its echo at the
/// snapshot was reset (the device told the guest with one transport reset) and made again;
/// the guest's CID is still 7.
fn check_goes_on(text: &str, last: u64) {
    assert!(!text.contains("EXITLESS ERROR"), "{text}");
    let boots = text.contains("EXITLESS START");
    assert!(!boots, "a restore does not boot: {text}");
    let ticks: Vec<u64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("EXITLESS TICK n="))
        .filter_map(|n| n.split(' ').next()?.parse().ok())
        .collect();
    let want: Vec<u64> = (last + 1..TICKS).collect();
    assert!(ticks == want && !want.is_empty(), "{text}");
    let rounds: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("EXITLESS SNAPNET "))
        .collect();
    assert_eq!(rounds.len(), want.len(), "{text}");
    for (n, l) in want.iter().zip(&rounds) {
        assert_eq!(field(l, "n="), Some(n.to_string().as_str()), "{l}");
        assert_eq!(field(l, "cid="), Some("7"), "{l}");
        assert_eq!(field(l, "resets="), Some("1"), "one transport reset: {l}");
    }
    let tries = field(rounds[0], "vsock_tries=");
    assert_eq!(
        tries,
        Some("2"),
        "the connection open at the snapshot was reset: {text}"
    );
    let result = format!("EXITLESS RESULT case=snapshot pages=2048 bad=0 count={TICKS} ok=1");
    assert!(text.contains(&result), "{text}");
}
