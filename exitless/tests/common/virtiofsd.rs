//! virtiofsd (the Rust daemon or QEMU's C one) serving a scratch folder, for the virtio-fs
//! tests.

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// The byte the bench guest's `fs_check` expects at offset `i` of its input file.
pub fn pattern(i: usize) -> u8 {
    ((i * 7 + (i >> 8) * 13 + (i >> 16) * 29 + 3) & 0xff) as u8
}

/// virtiofsd serving a scratch directory, its log in a file; killed when dropped.
pub struct Virtiofsd {
    child: Child,
    daemon: vmm::devices::virtio::vhost_user::virtiofsd::Daemon,
    pub dir: PathBuf,
    pub socket: PathBuf,
    log: PathBuf,
    /// The directory it serves (its own `shared`, or another daemon's).
    shared: PathBuf,
}

impl Virtiofsd {
    /// None (the test reported skipped) unless virtiofsd is installed and this is root.
    pub fn start(test: &str) -> Option<Self> {
        let daemon = Self::find(test)?;
        Some(Self::spawn(test, daemon, None, false))
    }

    /// The daemon the bench's lookup finds (root, EXITLESS_VIRTIOFSD, PATH, ~/.cargo/bin,
    /// distributions'), or None (the test reported skipped).
    pub fn find(test: &str) -> Option<vmm::devices::virtio::vhost_user::virtiofsd::Daemon> {
        match vmm::devices::virtio::vhost_user::virtiofsd::find() {
            Ok(daemon) => Some(daemon),
            Err(why) => {
                vmm::test_skip::skip(test, &why);
                None
            }
        }
    }

    /// `daemon` serving `shared` (else a `shared` folder of its own) on a socket of its own
    /// named after `test`; with `snapshots`, started as a snapshot needs it
    /// (`Daemon::command_for_snapshots`).
    pub fn spawn(
        test: &str,
        daemon: vmm::devices::virtio::vhost_user::virtiofsd::Daemon,
        shared: Option<PathBuf>,
        snapshots: bool,
    ) -> Self {
        let dir = std::env::temp_dir().join(format!("exitless-vfs-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("shared")).unwrap();
        let shared = shared.unwrap_or_else(|| dir.join("shared"));
        // The socket where Kata puts it: <sandbox dir>/virtiofsd.sock.
        let (socket, log) = (dir.join("virtiofsd.sock"), dir.join("virtiofsd.log"));
        let cache = vmm::devices::virtio::vhost_user::virtiofsd::Cache::Auto;
        let mut command = match snapshots {
            true => daemon.command_for_snapshots(&socket, &shared, cache),
            false => daemon.command(&socket, &shared, cache),
        };
        let child = command
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let d = Virtiofsd {
            child,
            daemon,
            dir,
            socket,
            log,
            shared,
        };
        assert!(
            d.wait_log("Waiting for vhost-user socket connection"),
            "{}",
            d.log_text()
        );
        d
    }

    pub fn shared(&self) -> PathBuf {
        self.shared.clone()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits up to 10 s for `line` in the log.
    pub fn wait_log(&self, line: &str) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if self.log_text().contains(line) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    /// Which daemon this is (their logs and their answers to bad requests differ).
    pub fn flavour(&self) -> vmm::devices::virtio::vhost_user::virtiofsd::Flavour {
        self.daemon.flavour
    }

    /// Waits up to 10 s for the daemon to log that a front end connected and is served.
    pub fn wait_connected(&self) -> bool {
        self.wait_log(match self.flavour() {
            vmm::devices::virtio::vhost_user::virtiofsd::Flavour::Rust => {
                "Client connected, servicing requests"
            }
            vmm::devices::virtio::vhost_user::virtiofsd::Flavour::C => {
                "Received vhost-user socket connection"
            }
        })
    }

    /// Waits up to 10 s for the daemon to log that its front end went.
    pub fn wait_disconnected(&self) -> bool {
        self.wait_log(match self.flavour() {
            vmm::devices::virtio::vhost_user::virtiofsd::Flavour::Rust => "Client disconnected",
            vmm::devices::virtio::vhost_user::virtiofsd::Flavour::C => "virtio_loop: Exit",
        })
    }

    /// Whether the daemon has ended (died or exited).
    pub fn has_ended(&mut self) -> bool {
        self.child.try_wait().unwrap().is_some()
    }

    pub fn fs_arg(&self) -> String {
        format!("tag=kataShared,socket={}", self.socket.display())
    }
}

impl Drop for Virtiofsd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.daemon.clean_up(&self.socket);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
