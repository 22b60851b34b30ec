//! The virtio_fs case, VMM side: virtiofsd started on a scratch shared directory holding the
//! file the guest reads, the virtio-fs device connected to it, and the checks of a run.
//! `exitless compare` starts its virtiofsd the same way ([`Virtiofsd`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cases::FsSetup;
use super::config_run::{ConfigRun, RunError, VirtioFigures};
use vmm::builder::VmBuilder;
use vmm::config::FsConfig;
use vmm::device_manager::Notify;
use vmm::devices::virtio::transport::VirtioPciDevice;
use vmm::devices::virtio::vhost_user::fs::Fs;
use vmm::devices::virtio::vhost_user::virtiofsd::{self, Cache, Daemon};

/// Data bytes of each READ the guest makes.
pub const BYTES_PER_REQUEST: u64 = 4096;
/// The tag every VMM's device gets (Kata's).
pub const TAG: &str = "kataShared";
/// The file the guest reads (its `fs_read` default), 4096 blocks of 4 KiB.
pub const FILE: &str = "in.bin";
const FILE_BYTES: usize = 16 << 20;
/// Queue size offered to the driver (Kata's; the guest's driver uses at most 128).
pub const QUEUE_SIZE: u16 = 1024;
/// What virtiofsd logs once its socket listens.
const READY: &str = "Waiting for vhost-user socket connection";
const READY_WAIT: Duration = Duration::from_secs(10);

/// The virtiofsd to start, or why none can be (said as a skip): see [`virtiofsd::find`].
pub fn daemon() -> Result<Daemon, String> {
    virtiofsd::find()
}

/// A shared directory holding [`FILE`] (16 MiB, written whole so that it is in the page
/// cache), removed when dropped.
pub struct ScratchShare {
    pub dir: PathBuf,
}

impl ScratchShare {
    /// Creates `dir` with the file in it.
    pub fn create(dir: PathBuf) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        let data: Vec<u8> = (0..FILE_BYTES).map(|i| (i * 7 + (i >> 12)) as u8).collect();
        std::fs::write(dir.join(FILE), data)?;
        Ok(ScratchShare { dir })
    }

    /// A fresh one in the temporary directory.
    fn in_tmp() -> std::io::Result<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("exitless-bench-fs-{}-{n}", std::process::id());
        Self::create(std::env::temp_dir().join(name))
    }
}

impl Drop for ScratchShare {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// virtiofsd serving a directory on a socket, its log in a file; killed when dropped, its
/// socket, pid file and log removed (virtiofsd 1.14 also ends by itself when its front end
/// disconnects).
pub struct Virtiofsd {
    child: Child,
    daemon: Daemon,
    pub socket: PathBuf,
    log: PathBuf,
}

impl Virtiofsd {
    /// Starts `daemon` (cache auto and no sandbox of its own where it allows, as Kata's
    /// configuration and the tests do) on `shared`, listening at `socket` (removed first),
    /// logging to `log`; returns once it listens.
    pub fn start(
        daemon: &Daemon,
        shared: &Path,
        socket: &Path,
        log: &Path,
    ) -> Result<Self, String> {
        daemon.clean_up(socket);
        let log_file = std::fs::File::create(log)
            .map_err(|e| format!("Cannot create {}: {e}", log.display()))?;
        let child = daemon
            .command(socket, shared, Cache::Auto)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .map_err(|e| format!("Cannot start {}: {e}", daemon.path.display()))?;
        let mut d = Virtiofsd {
            child,
            daemon: daemon.clone(),
            socket: socket.to_path_buf(),
            log: log.to_path_buf(),
        };
        d.wait_ready()?;
        Ok(d)
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let start = Instant::now();
        while start.elapsed() < READY_WAIT {
            if self.log_text().contains(READY) {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("virtiofsd ended ({status}): {}", self.last_line()));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Err(format!(
            "virtiofsd did not listen within {READY_WAIT:?}: {}",
            self.last_line()
        ))
    }

    /// The process id (its CPU time is read from /proc).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything it logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn last_line(&self) -> String {
        let text = self.log_text();
        text.lines().last().unwrap_or("no log").to_string()
    }

    /// exitless's device configuration for it.
    pub fn fs_config(&self) -> FsConfig {
        FsConfig {
            tag: TAG.into(),
            socket: self.socket.clone(),
            num_queues: 1,
            queue_size: QUEUE_SIZE,
            id: None,
        }
    }
}

impl Drop for Virtiofsd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.daemon.clean_up(&self.socket);
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A bench run's back end: virtiofsd and the directory it serves.
pub struct HostFs {
    daemon: Virtiofsd,
    _share: ScratchShare,
}

impl HostFs {
    pub fn pid(&self) -> u32 {
        self.daemon.pid()
    }
}

/// Starts virtiofsd on a scratch share and puts a virtio-fs device connected to it on the
/// VM's PCI bus (the VM's memory must be shared).
pub fn attach(builder: &mut VmBuilder) -> Result<(Arc<VirtioPciDevice>, HostFs), RunError> {
    let program = daemon().map_err(RunError::Unavailable)?;
    let share = ScratchShare::in_tmp()
        .map_err(|e| RunError::Device(format!("Cannot create the shared directory: {e}")))?;
    let daemon = Virtiofsd::start(
        &program,
        &share.dir,
        &share.dir.with_extension("sock"),
        &share.dir.with_extension("log"),
    )
    .map_err(RunError::Device)?;
    let fs = Fs::connect(&daemon.fs_config()).map_err(|e| RunError::Device(e.to_string()))?;
    let device = builder.add_virtio("virtio-fs", Box::new(fs), Notify::Ioeventfd)?;
    let host = HostFs {
        daemon,
        _share: share,
    };
    Ok((device, host))
}

/// The guest command line's part for `setup` but event idx (see bench-guest/virtio_fs.c).
pub fn guest_args(setup: &FsSetup) -> String {
    let mut args = format!(" qd={}", setup.queue_depth);
    if !setup.msix {
        args.push_str(" irq=poll");
    }
    args
}

/// Checks a run against the design: every READ answered in full, the device started its back
/// end, and the devices thread never woke during the loop (the kicks go to virtiofsd through
/// KVM's ioeventfd, its interrupts to the guest through irqfds). No userspace exit is the
/// configuration's `Expect::None`, checked with every case.
pub fn check(run: &mut ConfigRun, f: &VirtioFigures, io_errors: Option<u64>) {
    let n = run.iterations;
    run.check_io_errors(io_errors, "READs");
    if f.count("backend_starts") == 0 {
        run.problems
            .push("the device never started its back end".into());
    }
    match run.threads.and_then(|t| t.devices_wakeups) {
        None => run
            .problems
            .push("the devices thread's wake-ups were not measured".into()),
        Some(0) => {}
        Some(w) => run.problems.push(format!(
            "the devices thread woke {w} times during {n} READs (expected none: the back end is kicked and calls through KVM)"
        )),
    }
}

/// The design the checks hold a run to, said when it passed.
pub const DESIGN: &str = "0 userspace exits and 0 devices-thread wake-ups per request";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::cases::{VirtioSetup, CASES};
    use crate::bench::report::tests::run;
    use crate::bench::threads::ThreadsCpu;

    fn fs_run(config: &str) -> (ConfigRun, FsSetup) {
        let case = CASES.iter().position(|c| c.name == "virtio_fs").unwrap();
        let cfg = CASES[case]
            .configs
            .iter()
            .position(|c| c.name == config)
            .unwrap();
        let Some(VirtioSetup::Fs(setup)) = CASES[case].configs[cfg].virtio else {
            panic!("{config} has a file system");
        };
        (run(case, cfg, 20_000.0, 0), setup)
    }

    /// A stand-in for a virtiofsd of `flavour` in `dir`: it answers --help like that daemon,
    /// records its arguments in `dir/argv`, makes its socket and the pid file the real one
    /// would (the C one's only where /run/virtiofsd can be written), logs the ready line and
    /// waits to be killed.
    fn stand_in(dir: &Path, flavour: virtiofsd::Flavour) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let (help, socket, pid) = match flavour {
            virtiofsd::Flavour::Rust => (
                "Usage: virtiofsd [OPTIONS]\n  --shared-dir <SHARED_DIR>  Shared directory path",
                r#"s=$2"#,
                r#"p=$s.pid"#,
            ),
            virtiofsd::Flavour::C => (
                "usage: virtiofsd [options]\n  -o source=PATH  shared directory tree\n  \
                 --socket-path=PATH  path for the vhost-user socket",
                r#"s=${1#--socket-path=}"#,
                r#"mkdir -p /run/virtiofsd 2>/dev/null; p=/run/virtiofsd/$(echo "$s" | tr / .).pid"#,
            ),
        };
        let script = format!(
            "#!/bin/sh\n[ \"$1\" = --help ] && {{ printf '{help}\\n'; exit 0; }}\n\
             printf '%s\\n' \"$@\" > {argv}\n{socket}\n{pid}\n: > \"$s\"; : > \"$p\" 2>/dev/null\n\
             echo 'Waiting for vhost-user socket connection...' >&2\nexec sleep 60\n",
            argv = dir.join("argv").display()
        );
        let path = dir.join("virtiofsd");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn each_virtiofsd_flavour_is_started_with_its_flags_and_leaves_nothing_behind() {
        use virtiofsd::Flavour;
        for (flavour, want) in [
            (
                Flavour::Rust,
                "--socket-path S --shared-dir D --cache auto --sandbox none",
            ),
            (
                Flavour::C,
                "--socket-path=S -o source=D -o cache=auto -o sandbox=chroot",
            ),
        ] {
            let dir = std::env::temp_dir().join(format!(
                "exitless-vfs-stand-in-{flavour:?}-{}",
                std::process::id()
            ));
            std::fs::create_dir_all(dir.join("share")).unwrap();
            let daemon = Daemon::ask(&stand_in(&dir, flavour)).unwrap();
            assert_eq!(daemon.flavour, flavour);
            let (share, socket) = (dir.join("share"), dir.join("fs.sock"));
            let log = dir.join("fs.log");
            let running = Virtiofsd::start(&daemon, &share, &socket, &log).unwrap();
            let argv = std::fs::read_to_string(dir.join("argv")).unwrap();
            let argv = argv.lines().collect::<Vec<_>>().join(" ");
            let (s, d) = (socket.to_str().unwrap(), share.to_str().unwrap());
            assert_eq!(argv.replace(s, "S").replace(d, "D"), want);
            let pid_file = daemon.pid_file(&socket);
            assert!(socket.exists());
            drop(running);
            assert!(
                !socket.exists() && !log.exists(),
                "{flavour:?}: socket or log left"
            );
            assert!(
                !pid_file.exists(),
                "{flavour:?}: {} left",
                pid_file.display()
            );
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn guest_arguments_say_the_queue_depth_and_polling() {
        use crate::bench::virtio::guest_args;
        let (_, qd1) = fs_run("qd1");
        assert_eq!(guest_args(&VirtioSetup::Fs(qd1)), " qd=1");
        let (_, polled) = fs_run("qd32-polled");
        assert_eq!(guest_args(&VirtioSetup::Fs(polled)), " qd=32 irq=poll");
        assert!(VirtioSetup::Fs(qd1).shares_memory());
    }

    #[test]
    fn errors_an_idle_back_end_and_a_woken_devices_thread_are_problems() {
        let started = VirtioFigures {
            device: vec![("backend_starts", 1)],
            ..VirtioFigures::default()
        };
        let quiet = ThreadsCpu {
            devices_wakeups: Some(0),
            ..ThreadsCpu::default()
        };
        let (mut r, _) = fs_run("qd32");
        r.threads = Some(quiet);
        check(&mut r, &started, Some(0));
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        let (mut r, _) = fs_run("qd32");
        r.threads = Some(ThreadsCpu {
            devices_wakeups: Some(4),
            ..quiet
        });
        check(&mut r, &VirtioFigures::default(), Some(3));
        assert_eq!(r.problems.len(), 3, "{:?}", r.problems);
        assert!(r.problems[0].contains("3 of 100 READs failed"));
        assert!(r.problems[1].contains("never started"));
        assert!(r.problems[2].contains("woke 4 times"));
        let (mut r, _) = fs_run("qd1");
        check(&mut r, &started, None);
        assert_eq!(
            r.problems.len(),
            2,
            "not measured is a problem: {:?}",
            r.problems
        );
    }
}
