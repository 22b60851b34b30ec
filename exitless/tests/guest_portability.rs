//! The embedded bench guest as a test guest: SMP bring-up through `exitless run` (every vCPU
//! reports in with its own APIC ID), and the very same exported file booted by QEMU.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{exitless, export_guest, kvm_available, qemu, Stream};

fn stdout_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn every_vcpu_of_an_smp_guest_reports_in_with_its_apic_id() {
    if !kvm_available("guest_portability") {
        return;
    }
    let guest = export_guest("smp");
    let o = exitless()
        .args(["run", "--kernel"])
        .arg(&guest)
        .args([
            "--cpus",
            "3",
            "--memory",
            "64M",
            "--cmdline",
            "smp=3",
            "--timeout",
            "60",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    std::fs::remove_file(&guest).ok();
    let out = stdout_of(&o);
    // The guest ends itself with an i8042 reset once every CPU has reported.
    assert_eq!(
        o.status.code(),
        Some(0),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // APs race for their index, so check the set of APIC IDs: each non-boot vCPU once.
    let mut apics: Vec<u32> = out
        .lines()
        .filter(|l| l.starts_with("EXITLESS CPU ap="))
        .filter_map(|l| l.split("apic=").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    apics.sort_unstable();
    assert_eq!(apics, vec![1, 2], "{out}");
    assert!(out.contains("EXITLESS SMP cpus=3 up=3 bsp_apic=0"), "{out}");
}

#[test]
fn qemu_boots_the_exported_guest_and_it_reports_results() {
    let Some(qemu) = qemu("qemu_boots_the_exported_guest") else {
        return;
    };
    let guest = export_guest("qemu");
    let o = Command::new("timeout")
        .args([
            "120", qemu, "-accel", "tcg", "-smp", "2", "-m", "128M", "-kernel",
        ])
        .arg(&guest)
        .args([
            "-serial",
            "stdio",
            "-display",
            "none",
            "-monitor",
            "none",
            "-no-reboot",
        ])
        .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=4"])
        .args(["-append", "smp=2 case=pio_out iters=50"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    std::fs::remove_file(&guest).ok();
    let out = stdout_of(&o);
    // isa-debug-exit makes QEMU exit with (status << 1) | 1; the guest reports status 0.
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("EXITLESS CPU ap=1 apic=1 up"), "{out}");
    assert!(
        out.contains("EXITLESS RESULT case=pio_out cpl=3 iters=50 "),
        "{out}"
    );
    assert!(out.contains("EXITLESS DONE"), "{out}");
}

#[test]
fn a_running_vm_reports_its_profile_on_sigusr1_and_at_intervals() {
    if !kvm_available("guest_portability") {
        return;
    }
    let guest = export_guest("usr1");
    // The bench guest in a long loop of userspace exits (unclaimed port), stopped by SIGTERM.
    let mut child = exitless()
        .args(["run", "--kernel"])
        .arg(&guest)
        .args([
            "--memory",
            "64M",
            "--cmdline",
            "case=pio_out iters=100000000",
        ])
        .args(["--profile", "--profile-interval", "0.5", "--timeout", "60"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let mut stderr = Stream::spawn(child.stderr.take().unwrap());
    let limit = Duration::from_secs(30);
    let summaries = |text: &str| text.lines().filter(|l| l.contains(" exits/s (")).count();
    // The first live summary shows the VM runs and the signal handlers are in place.
    let running = stderr.wait_for(limit, |text| summaries(text) >= 1);
    let kill = |signal: &str| {
        let status = Command::new("kill").args([signal, &pid]).status();
        assert!(status.unwrap().success(), "kill {signal}");
    };
    kill("-USR1");
    let reported = stderr.wait_for(limit, |text| text.contains("VM-exit profile: 1 vCPU(s)"));
    let more = stderr.wait_for(limit, |text| summaries(text) >= 3);
    kill("-TERM");
    stderr.read_to_end(limit);
    let status = child.wait().unwrap();
    std::fs::remove_file(&guest).ok();
    let err = &stderr.text;
    assert!(running && reported && more, "{err}");
    assert_eq!(status.code(), Some(130), "{err}");
    // One report on SIGUSR1, one when the VM ends.
    assert!(
        err.matches("VM-exit profile: 1 vCPU(s)").count() >= 2,
        "{err}"
    );
    let top = err.lines().filter(|l| l.contains(" exits/s ("));
    assert!(top.clone().any(|l| l.contains("top IO_OUT")), "{err}");
}

/// `exitless run ... | head`: the console reader goes away while the guest keeps printing.
/// The VM must run on to its normal end (the bench guest resets through the i8042: code 0),
/// its output dropped, counted and said once, and the serial log must still get all of it.
#[test]
fn a_closed_console_does_not_stop_the_vm() {
    if !kvm_available("guest_portability") {
        return;
    }
    let guest = export_guest("closed-console");
    let tmp = std::env::temp_dir();
    let log = tmp.join(format!(
        "exitless-closed-console-{}.log",
        std::process::id()
    ));
    let json = tmp.join(format!(
        "exitless-closed-console-{}.json",
        std::process::id()
    ));
    // ~1 s of userspace exits after the START line: the pipe is closed well before the result.
    let mut child = exitless()
        .args(["run", "--kernel"])
        .arg(&guest)
        .args(["--memory", "64M", "--cmdline", "case=pio_out iters=30000"])
        .args(["--timeout", "60", "--serial-log"])
        .arg(&log)
        .arg("--profile-json")
        .arg(&json)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = Stream::spawn(child.stderr.take().unwrap());
    let stdout = child.stdout.take().unwrap();
    // Read up to the START line, then close our end of the pipe.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        let mut lines = std::io::BufReader::new(stdout).lines();
        let started = lines.any(|l| l.is_ok_and(|l| l.starts_with("EXITLESS START")));
        let _ = tx.send(started);
    });
    let started = rx.recv_timeout(Duration::from_secs(30)).unwrap_or(false);
    stderr.read_to_end(Duration::from_secs(60));
    let status = child.wait().unwrap();
    let err = stderr.text.clone();
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    let profile = std::fs::read_to_string(&json).unwrap_or_default();
    for f in [&guest, &log, &json] {
        std::fs::remove_file(f).ok();
    }
    assert!(started, "the guest never started: {err}");
    assert_eq!(status.code(), Some(0), "{err}");
    assert_eq!(err.matches("console output lost").count(), 1, "{err}");
    assert!(logged.contains("EXITLESS RESULT case=pio_out"), "{logged}");
    assert!(logged.contains("EXITLESS DONE"), "{logged}");
    let profile: serde_json::Value = serde_json::from_str(&profile).expect("profile JSON");
    let dropped = profile["console"]["console_bytes"].as_u64().unwrap_or(0);
    assert!(dropped >= "EXITLESS DONE\n".len() as u64, "{profile:#}");
}

/// `exitless run` with the bench guest's default command line runs every case, the CPL0
/// hypercall included, and ends: the hypercall-instruction rewrite that livelocks on PVM is
/// off in every VM exitless builds, so the guest's vmcall ends in #UD, which it counts.
#[test]
fn the_bench_guest_runs_every_case_under_run_and_ends() {
    if !kvm_available("guest_portability") {
        return;
    }
    let guest = export_guest("all-cases");
    let o = exitless()
        .args(["run", "--kernel"])
        .arg(&guest)
        .args(["--memory", "64M", "--timeout", "120"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    std::fs::remove_file(&guest).ok();
    let out = stdout_of(&o);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("EXITLESS RESULT case=hypercall cpl=0"),
        "{out}"
    );
    assert!(out.contains("EXITLESS DONE"), "{out}");
}

/// What fs_check expects in the host file it reads and writes to the one it creates (see
/// bench-guest/virtio_fs.c): byte `i` of the file.
fn fs_pattern(i: u64) -> u8 {
    ((i * 7 + (i >> 8) * 13 + (i >> 16) * 29 + 3) & 0xff) as u8
}

/// virtiofsd (the Rust one or QEMU's C one) serving a directory of its own on a socket; killed and its
/// directory removed when dropped.
struct Virtiofsd {
    child: std::process::Child,
    daemon: vmm::devices::virtio::vhost_user::virtiofsd::Daemon,
    dir: std::path::PathBuf,
}

impl Virtiofsd {
    /// virtiofsd's binary, if this host can run it (as root), else `test` is reported skipped.
    fn find(test: &str) -> Option<vmm::devices::virtio::vhost_user::virtiofsd::Daemon> {
        // The bench's lookup (root, EXITLESS_VIRTIOFSD, PATH, ~/.cargo/bin, distributions').
        vmm::devices::virtio::vhost_user::virtiofsd::find()
            .map_err(|why| vmm::test_skip::skip(test, &why))
            .ok()
    }

    /// Starts `binary` on a fresh directory (`tag` keeps tests apart) holding `files`, and
    /// waits (up to 10 s) for its socket.
    fn start(
        binary: &vmm::devices::virtio::vhost_user::virtiofsd::Daemon,
        tag: &str,
        files: &[(&str, &[u8])],
    ) -> Self {
        let dir = std::env::temp_dir().join(format!("exitless-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("share")).unwrap();
        for (name, bytes) in files {
            std::fs::write(dir.join("share").join(name), bytes).unwrap();
        }
        let cache = vmm::devices::virtio::vhost_user::virtiofsd::Cache::Auto;
        let child = binary
            .command(&dir.join("vfs.sock"), &dir.join("share"), cache)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let daemon = binary.clone();
        let fsd = Virtiofsd { child, daemon, dir };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !fsd.socket().exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(fsd.socket().exists(), "virtiofsd made no socket");
        fsd
    }

    fn socket(&self) -> std::path::PathBuf {
        self.dir.join("vfs.sock")
    }

    fn shared(&self, name: &str) -> std::path::PathBuf {
        self.dir.join("share").join(name)
    }
}

impl Drop for Virtiofsd {
    fn drop(&mut self) {
        // It ends by itself once QEMU goes; kill it in case it did not.
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.daemon.clean_up(&self.socket());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The exported guest under QEMU (TCG, 120 s at most) with guest memory QEMU shares with
/// virtiofsd and a vhost-user-fs-pci device of tag kataShared on `fsd`'s socket.
fn qemu_with_virtio_fs(
    qemu: &str,
    guest: &std::path::Path,
    fsd: &Virtiofsd,
    cmdline: &str,
) -> Output {
    let chardev = format!("socket,id=vfs,path={}", fsd.socket().display());
    Command::new("timeout")
        .args(["120", qemu, "-accel", "tcg", "-m", "256M", "-kernel"])
        .arg(guest)
        .args(["-object", "memory-backend-memfd,id=mem,size=256M,share=on"])
        .args(["-numa", "node,memdev=mem"])
        .args(["-chardev", &chardev])
        .args([
            "-device",
            "vhost-user-fs-pci,chardev=vfs,tag=kataShared,queue-size=1024",
        ])
        .args(["-serial", "stdio", "-display", "none", "-monitor", "none"])
        .args([
            "-no-reboot",
            "-device",
            "isa-debug-exit,iobase=0xf4,iosize=4",
        ])
        .args(["-append", cmdline])
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The guest's virtio-fs driver against QEMU's vhost-user-fs-pci and the real virtiofsd:
/// it reads a host file and checks its pattern, then creates a file the host finds holding
/// exactly the same pattern.
#[test]
fn the_guest_virtio_fs_driver_reads_and_writes_host_files_through_qemu_and_virtiofsd() {
    const TEST: &str = "the_guest_virtio_fs_driver_reads_and_writes_host_files";
    let Some(qemu) = qemu(TEST) else {
        return;
    };
    let Some(binary) = Virtiofsd::find(TEST) else {
        return;
    };
    // 3 x 64 KiB + 100: several READs and WRITEs, the last one short.
    let len = 3 * 65536 + 100;
    let pattern: Vec<u8> = (0..len).map(fs_pattern).collect();
    // A longer out.bin already there: CREATE must truncate it.
    let old = vec![0xaa; len as usize + 5000];
    let fsd = Virtiofsd::start(
        &binary,
        "virtio-fs",
        &[("in.bin", &pattern), ("out.bin", &old)],
    );
    let guest = export_guest("virtio-fs");
    let cmdline =
        format!("case=fs_check fs_tag=kataShared fs_read=in.bin fs_write=out.bin fs_len={len}");
    let o = qemu_with_virtio_fs(qemu, &guest, &fsd, &cmdline);
    std::fs::remove_file(&guest).ok();
    let out = stdout_of(&o);
    let written = std::fs::read(fsd.shared("out.bin")).unwrap_or_default();
    drop(fsd);
    // isa-debug-exit: QEMU exits with (status << 1) | 1; the guest ends with status 0.
    assert_eq!(
        o.status.code(),
        Some(1),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("EXITLESS VIRTIO fs tag=kataShared matches"),
        "{out}"
    );
    let read = format!("EXITLESS VIRTIO fs read file=in.bin bytes={len} bad=0");
    assert!(out.contains(&read), "{out}");
    let wrote = format!("EXITLESS VIRTIO fs wrote file=out.bin bytes={len} size={len}");
    assert!(out.contains(&wrote), "{out}");
    assert!(out.contains("EXITLESS VIRTIO fs forgot nodes=2"), "{out}");
    assert!(out.contains("EXITLESS VIRTIO fs result=pass"), "{out}");
    assert!(
        written == pattern,
        "out.bin holds {} bytes, not the pattern",
        written.len()
    );
}

/// A chain with no device-writable part ends virtiofsd (it cannot write the reply): the
/// guest's waits are bounded, so it reports the timeouts and ends normally.
#[test]
fn a_malformed_virtio_fs_chain_does_not_hang_the_guest() {
    const TEST: &str = "a_malformed_virtio_fs_chain_does_not_hang_the_guest";
    let Some(qemu) = qemu(TEST) else {
        return;
    };
    let Some(binary) = Virtiofsd::find(TEST) else {
        return;
    };
    let fsd = Virtiofsd::start(&binary, "virtio-fs-hostile", &[]);
    let guest = export_guest("virtio-fs-hostile");
    let o = qemu_with_virtio_fs(qemu, &guest, &fsd, "case=fs_hostile fs_bad=no_writable");
    std::fs::remove_file(&guest).ok();
    drop(fsd);
    let out = stdout_of(&o);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("EXITLESS FS hostile chain=no_writable "),
        "{out}"
    );
    assert!(out.contains("EXITLESS FS hostile chain=valid "), "{out}");
    assert!(out.contains("EXITLESS FS hostile done"), "{out}");
}
