//! virtio-vsock end to end, driven by the bench guest's own driver under exitless: the guest
//! connects to a host port (a Unix socket at PATH_1234 that echoes), then a host program
//! connects through PATH with `CONNECT 52` and the guest echoes what it sends. (QEMU's vsock
//! needs the host's vhost-vsock module, so there is no reference run here.)

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{device_count, exitless, export_guest};

const MESSAGES: usize = 3;

#[test]
fn the_guest_reaches_a_host_port_and_a_host_program_reaches_a_guest_port() {
    if !Path::new("/dev/kvm").exists() {
        return vmm::test_skip::skip("virtio_vsock", "/dev/kvm is missing on this host");
    }
    let guest = export_guest("vsock");
    for bin in common::builds() {
        round_trips(&bin, &guest);
    }
    std::fs::remove_file(&guest).ok();
}

/// The guest's connection to a host port and a host program's to a guest port, with `bin`.
fn round_trips(bin: &Path, guest: &Path) {
    let path = guest.with_extension("vsock.sock");
    let echo = UnixListener::bind(format!("{}_1234", path.display())).unwrap();
    let echo_thread = std::thread::spawn(move || {
        let (mut c, _) = echo.accept().unwrap();
        let mut buf = [0u8; 4096];
        let mut total = 0;
        loop {
            match c.read(&mut buf) {
                Ok(0) | Err(_) => return total,
                Ok(n) => {
                    total += n;
                    c.write_all(&buf[..n]).unwrap();
                }
            }
        }
    });
    let json = guest.with_extension("profile.json");
    let child = std::process::Command::new(bin)
        .args(["run", "--kernel"])
        .arg(guest)
        .args(["--memory", "64M", "--timeout", "60", "--vsock"])
        .arg(format!("cid=7,socket={}", path.display()))
        .args([
            "--cmdline",
            &format!("case=vsock_check iters={MESSAGES} listen=52"),
        ])
        .arg("--profile-json")
        .arg(&json)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The socket exists once the VM is built; the guest answers once it listens.
    let start = Instant::now();
    let mut host = loop {
        match UnixStream::connect(&path) {
            Ok(s) => break s,
            Err(e) => {
                assert!(start.elapsed() < Duration::from_secs(30), "{e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    host.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    host.write_all(b"CONNECT 52\n").unwrap();
    let mut reader = BufReader::new(host.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(line.starts_with("OK ") && line.ends_with('\n'), "{line:?}");
    let port: u32 = line[3..].trim().parse().unwrap();
    assert!(
        port >= 1 << 30,
        "a host port outside the well-known range: {port}"
    );
    for k in 0..MESSAGES {
        let msg = format!("message {k}");
        host.write_all(msg.as_bytes()).unwrap();
        let mut back = vec![0u8; msg.len()];
        reader.read_exact(&mut back).unwrap();
        assert_eq!(back, msg.as_bytes());
    }
    drop((host, reader));
    let o = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        echo_thread.join().unwrap(),
        20,
        "the guest's line reached the host port"
    );
    assert!(out.contains("EXITLESS VSOCK cid=7"), "{out}");
    assert!(
        out.contains("EXITLESS VSOCK connected port=1234 echoed bytes=20"),
        "{out}"
    );
    assert!(
        out.contains("EXITLESS VSOCK accepted port=52 echoed bytes=27"),
        "{out}"
    );
    assert!(
        !Path::new(&path).exists(),
        "the socket file is removed at exit"
    );
    let profile: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).ok();
    std::fs::remove_file(format!("{}_1234", path.display())).ok();
    let dev = &profile["virtio"][0];
    assert_eq!(dev["device"], "virtio-vsock", "{profile:#}");
    let count = |name: &str| device_count(dev, name);
    assert_eq!((count("connections"), count("open")), (2, 0), "{dev:#}");
    assert_eq!((count("bad_packets"), count("refused")), (0, 0), "{dev:#}");
    assert_eq!(count("tx_bytes"), 20 + 27, "{dev:#}");
}

#[test]
fn a_socket_path_in_use_or_not_a_socket_is_one_line() {
    let file = std::env::temp_dir().join(format!("exitless-vsock-file-{}", std::process::id()));
    std::fs::write(&file, "x").unwrap();
    let o = exitless()
        .args(["run", "--kernel", "/bin/true", "--vsock"])
        .arg(format!("cid=3,socket={}", file.display()))
        .output()
        .unwrap();
    std::fs::remove_file(&file).ok();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("exists and is not a socket"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let o = exitless()
        .args([
            "run",
            "--kernel",
            "/bin/true",
            "--vsock",
            "cid=2,socket=/tmp/x",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("Invalid --vsock 'cid=2,socket=/tmp/x'"),
        "{err}"
    );
}
