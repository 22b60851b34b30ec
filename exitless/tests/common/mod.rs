//! Shared by the integration tests: a child's output read as it comes, waited on with a limit;
//! the exitless binary, the exported bench guest and QEMU.
// Each test file uses its own part of this module.
#![allow(dead_code)]

pub mod api_vmm;
pub mod ch_remote;
pub mod host_echo;
pub mod kata;
pub mod snapshot;
pub mod virtiofsd;

use std::io::Read;
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// The output of a pipe, read by a thread of its own, so a test can wait for what it expects.
pub struct Stream {
    chunks: Receiver<String>,
    /// Everything read so far.
    pub text: String,
}

impl Stream {
    /// Starts reading `pipe` until it ends. The pipe is drained to its end even after the
    /// `Stream` is dropped, so a child never finds its output closed under it (a test that
    /// stops listening must not change how the child runs).
    pub fn spawn(mut pipe: impl Read + Send + 'static) -> Self {
        let (tx, chunks) = channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = pipe.read(&mut buf) {
                // Nobody listens any more: keep reading, discard.
                let _ = tx.send(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        });
        Stream {
            chunks,
            text: String::new(),
        }
    }

    /// Reads until `done(text)` holds (true), the pipe ends or `limit` passes (false).
    pub fn wait_for(&mut self, limit: Duration, done: impl Fn(&str) -> bool) -> bool {
        let deadline = Instant::now() + limit;
        while !done(&self.text) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.chunks.recv_timeout(left) {
                Ok(chunk) => self.text.push_str(&chunk),
                Err(_) => return false,
            }
        }
        true
    }

    /// Reads until the pipe ends or `limit` passes.
    pub fn read_to_end(&mut self, limit: Duration) {
        self.wait_for(limit, |_| false);
    }
}

/// The exitless binary under test: the one `EXITLESS_BIN` names (scripts/test.sh points it at
/// the release binary built as the README builds it: what ships), else the test build's.
pub fn exitless_path() -> std::path::PathBuf {
    std::env::var_os("EXITLESS_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_exitless").into())
}

/// Every build the end-to-end tests of each device, of `run` and of the Kata sequence run
/// against: [`exitless_path`], and the VMM-only build that `EXITLESS_VMM_BIN` names (the
/// README's `--no-default-features` release build; scripts/test.sh sets both).
pub fn builds() -> Vec<std::path::PathBuf> {
    let mut all = vec![exitless_path()];
    all.extend(std::env::var_os("EXITLESS_VMM_BIN").map(std::path::PathBuf::from));
    all
}

/// A command running the exitless binary under test ([`exitless_path`]).
pub fn exitless() -> std::process::Command {
    std::process::Command::new(exitless_path())
}

/// The embedded bench guest written to a file of its own (`tag` keeps tests apart).
pub fn export_guest(tag: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("exitless-{tag}-{}.elf", std::process::id()));
    let o = exitless()
        .args(["bench", "--export-guest"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    path
}

/// QEMU's x86-64 system emulator, if installed (else `test` is reported skipped).
pub fn qemu(test: &str) -> Option<&'static str> {
    let found = std::process::Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        vmm::test_skip::skip(
            test,
            "qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)",
        );
    }
    found.then_some("qemu-system-x86_64")
}

/// Whether /dev/kvm exists; where it does not, says that `test` skipped and why.
pub fn kvm_available(test: &str) -> bool {
    let ok = std::path::Path::new("/dev/kvm").exists();
    if !ok {
        vmm::test_skip::skip(test, "/dev/kvm is missing on this host");
    }
    ok
}

/// What the guest's disk drivers (guest/virtio_cases.c, bench-guest/virtio_hostile.c) write to
/// byte `i` of 4 KiB block `block`.
pub fn guest_pattern(seed: u64, block: u64, i: u64) -> u8 {
    ((seed * 131 + block * 31 + i * 7 + (i >> 9)) & 0xff) as u8
}

/// Waits for `line` in the serial console file `path` (a guest's `EXITLESS ERROR` or `SKIP`
/// fails at once; 90 s at most); returns the console so far.
pub fn wait_serial(path: &std::path::Path, line: &str) -> String {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(line) {
            return text;
        }
        assert!(
            !text.contains("EXITLESS ERROR") && !text.contains("EXITLESS SKIP"),
            "{text}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "no '{line}' in:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A zero-filled raw disk image in the temp folder (`tag` keeps tests apart), removed when
/// dropped.
pub struct Image(pub std::path::PathBuf);

impl Image {
    pub fn new(tag: &str, mib: u64) -> Self {
        let path = std::env::temp_dir().join(format!("exitless-{tag}-{}.img", std::process::id()));
        let file = std::fs::File::create(&path).expect("image created");
        file.set_len(mib << 20).expect("image sized");
        Image(path)
    }

    /// The value of `exitless run --disk` for this image.
    pub fn disk_arg(&self, readonly: bool) -> String {
        let ro = if readonly { ",readonly=on" } else { "" };
        format!("path={}{ro}", self.0.display())
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// One of a virtio device's own counters in a `--profile-json` report's device entry.
pub fn device_count(device: &serde_json::Value, name: &str) -> u64 {
    device["counters"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == name))
        .and_then(|c| c["value"].as_u64())
        .unwrap_or_else(|| panic!("{name} in {device:#}"))
}

/// A network namespace of the test's own with tap `tap` in it. None only where this host
/// cannot have one (not root, or no /dev/net/tun): then `test` is reported skipped with the
/// reason. Anywhere else a failure is exitless's and panics.
pub fn private_tap(
    test: &str,
    tap: &str,
) -> Option<vmm::devices::virtio::net::private_net::PrivateNet> {
    // SAFETY: geteuid reads the caller's id; no memory is involved.
    let root = unsafe { libc::geteuid() } == 0;
    let tun = std::path::Path::new("/dev/net/tun").exists();
    if !root || !tun {
        let why = if root {
            "/dev/net/tun is missing on this host"
        } else {
            "a tap in a network namespace needs root"
        };
        vmm::test_skip::skip(test, why);
        return None;
    }
    let made = vmm::devices::virtio::net::private_net::PrivateNet::create()
        .and_then(|n| n.add_tap(tap).map(|_| n));
    Some(made.unwrap_or_else(|e| panic!("{test}: a tap in a private network namespace: {e}")))
}
