//! qemu-storage-daemon as a vhost-user-blk back end, the one way the bench, `compare` and the
//! tests start it: `--blockdev driver=file,node-name=disk,filename=IMAGE --export
//! type=vhost-user-blk,id=export,node-name=disk,addr.type=unix,addr.path=SOCKET,writable=on`
//! (Debian 12's `qemu-system-common` ships it as /usr/bin/qemu-storage-daemon; QEMU 6.0 and
//! later export vhost-user-blk).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where qemu-storage-daemon is looked for when `EXITLESS_STORAGE_DAEMON` does not name it and
/// it is not on PATH.
const PLACES: &[&str] = &[
    "/usr/bin/qemu-storage-daemon",
    "/usr/local/bin/qemu-storage-daemon",
];
/// How long the daemon may take to open its socket.
const START_WAIT: Duration = Duration::from_secs(10);

/// The daemon's path: `EXITLESS_STORAGE_DAEMON`, then PATH, then [`PLACES`].
pub fn find() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("EXITLESS_STORAGE_DAEMON") {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    let on_path = std::env::var_os("PATH").into_iter().flat_map(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("qemu-storage-daemon"))
            .collect::<Vec<_>>()
    });
    on_path
        .chain(PLACES.iter().map(PathBuf::from))
        .find(|p| p.is_file())
}

/// The command exporting `image` (a raw file) as vhost-user-blk on `socket`.
pub fn command(daemon: &Path, image: &Path, socket: &Path, writable: bool) -> Command {
    let mut blockdev = std::ffi::OsString::from("driver=file,node-name=disk,filename=");
    blockdev.push(image);
    let mut export = std::ffi::OsString::from(
        "type=vhost-user-blk,id=export,node-name=disk,addr.type=unix,addr.path=",
    );
    export.push(socket);
    export.push(if writable {
        ",writable=on"
    } else {
        ",writable=off"
    });
    let mut c = Command::new(daemon);
    c.arg("--blockdev")
        .arg(blockdev)
        .arg("--export")
        .arg(export);
    c
}

/// A running qemu-storage-daemon, killed (and its socket removed) when dropped.
pub struct StorageDaemon {
    child: Child,
    pub socket: PathBuf,
}

impl StorageDaemon {
    /// Starts `daemon` on `image` and waits for its socket; Err says why not (its output).
    pub fn start(
        daemon: &Path,
        image: &Path,
        socket: &Path,
        writable: bool,
    ) -> Result<Self, String> {
        let _ = std::fs::remove_file(socket);
        let child = command(daemon, image, socket, writable)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("Cannot start {}: {e}", daemon.display()))?;
        let mut d = StorageDaemon {
            child,
            socket: socket.to_path_buf(),
        };
        let start = Instant::now();
        while !socket.exists() {
            if let Ok(Some(status)) = d.child.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = d.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                return Err(format!(
                    "{} ended ({status}): {}",
                    daemon.display(),
                    err.trim()
                ));
            }
            if start.elapsed() > START_WAIT {
                return Err(format!(
                    "{} opened no socket within {START_WAIT:?}",
                    daemon.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(d)
    }

    /// The daemon's process id (for its CPU time).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for StorageDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}
