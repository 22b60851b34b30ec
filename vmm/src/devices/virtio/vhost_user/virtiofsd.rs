//! Which virtiofsd is installed and how to start it: the one lookup the bench, `compare` and
//! the tests share. Two daemons are in use and their command lines differ: the Rust one
//! (`--socket-path P --shared-dir D --cache auto --sandbox none`) and QEMU's C one up to QEMU
//! 7.2 (Debian 12's `/usr/lib/qemu/virtiofsd`: `--socket-path=P -o source=D -o cache=auto`).
//! A daemon is told apart by what its `--help` says, not by where it lies.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where virtiofsd is looked for when `EXITLESS_VIRTIOFSD` does not name it and it is neither
/// on PATH nor in ~/.cargo/bin: root's `cargo install` place, then distributions' (Fedora's,
/// Debian's QEMU package, others).
const DAEMONS: &[&str] = &[
    "/root/.cargo/bin/virtiofsd",
    "/usr/libexec/virtiofsd",
    "/usr/lib/qemu/virtiofsd",
    "/usr/bin/virtiofsd",
];
/// How long a daemon may take to print its `--help`.
const ASK_WAIT: Duration = Duration::from_secs(5);
/// Where QEMU's C daemon keeps its pid file (its `runstatedir`).
const C_PID_DIR: &str = "/run/virtiofsd";

/// Which command line a daemon takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    /// The Rust virtiofsd (gitlab virtio-fs/virtiofsd, any 1.x).
    Rust,
    /// QEMU's C virtiofsd (QEMU 5.0 to 7.2).
    C,
}

/// The cache policy asked of the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cache {
    /// The daemon's default (Kata's configuration).
    Auto,
    /// No caching in the guest.
    Never,
}

/// A virtiofsd found here and which command line it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Daemon {
    pub path: PathBuf,
    pub flavour: Flavour,
}

impl Daemon {
    /// Asks `path` which daemon it is (its `--help`), or says why it is not one exitless can
    /// start.
    pub fn ask(path: &Path) -> Result<Self, String> {
        let help = help_text(path)?;
        let flavour = flavour_of(&help).ok_or_else(|| {
            format!(
                "{} does not answer --help like a virtiofsd (neither --shared-dir nor -o source=)",
                path.display()
            )
        })?;
        Ok(Daemon {
            path: path.to_path_buf(),
            flavour,
        })
    }

    /// The command serving `shared` on the vhost-user socket `socket`, without a sandbox of
    /// its own where the daemon allows (the Rust one's `--sandbox none`; the C one has no such
    /// mode and chroots into the directory).
    pub fn command(&self, socket: &Path, shared: &Path, cache: Cache) -> Command {
        let mut command = Command::new(&self.path);
        match self.flavour {
            Flavour::Rust => {
                let cache = match cache {
                    Cache::Auto => "auto",
                    Cache::Never => "never",
                };
                command
                    .arg("--socket-path")
                    .arg(socket)
                    .arg("--shared-dir")
                    .arg(shared)
                    .args(["--cache", cache, "--sandbox", "none"]);
            }
            Flavour::C => {
                let cache = match cache {
                    Cache::Auto => "cache=auto",
                    Cache::Never => "cache=none",
                };
                let mut socket_arg = std::ffi::OsString::from("--socket-path=");
                socket_arg.push(socket);
                let mut source = std::ffi::OsString::from("source=");
                source.push(shared);
                command.arg(socket_arg).arg("-o").arg(source).args([
                    "-o",
                    cache,
                    "-o",
                    "sandbox=chroot",
                ]);
            }
        }
        command
    }

    /// [`Daemon::command`], and for a daemon that can hand over its state (the Rust one) what
    /// a snapshot or a migration of it needs: `--migration-mode find-paths` (the inodes the
    /// guest holds travel as paths in the shared directory, opened again by the daemon that
    /// loads them). QEMU's C daemon has no such state transfer: a snapshot refuses it.
    pub fn command_for_snapshots(&self, socket: &Path, shared: &Path, cache: Cache) -> Command {
        let mut command = self.command(socket, shared, cache);
        if self.flavour == Flavour::Rust {
            command.args(["--migration-mode", "find-paths"]);
        }
        command
    }

    /// The pid file the daemon writes for `socket` (and leaves behind when killed): the Rust
    /// one beside the socket, the C one under /run/virtiofsd named after the socket's path.
    pub fn pid_file(&self, socket: &Path) -> PathBuf {
        match self.flavour {
            Flavour::Rust => {
                let mut name = socket.as_os_str().to_owned();
                name.push(".pid");
                PathBuf::from(name)
            }
            Flavour::C => {
                let dotted = socket.to_string_lossy().replace('/', ".");
                Path::new(C_PID_DIR).join(format!("{dotted}.pid"))
            }
        }
    }

    /// Removes what a daemon that served `socket` leaves behind: the socket and its pid file.
    pub fn clean_up(&self, socket: &Path) {
        let _ = std::fs::remove_file(socket);
        let _ = std::fs::remove_file(self.pid_file(socket));
    }
}

/// Which daemon a `--help` text describes.
pub fn flavour_of(help: &str) -> Option<Flavour> {
    if help.contains("--shared-dir") {
        Some(Flavour::Rust)
    } else if help.contains("source=") && help.contains("--socket-path") {
        Some(Flavour::C)
    } else {
        None
    }
}

/// What `path --help` prints (stdout and stderr), within [`ASK_WAIT`].
fn help_text(path: &Path) -> Result<String, String> {
    let mut child = Command::new(path)
        .arg("--help")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {} --help: {e}", path.display()))?;
    let readers = [
        child
            .stdout
            .take()
            .map(|o| Box::new(o) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|e| Box::new(e) as Box<dyn Read + Send>),
    ]
    .map(|pipe| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(pipe) = pipe {
                let _ = pipe.take(1 << 20).read_to_end(&mut text);
            }
            text
        })
    });
    let start = Instant::now();
    let finished = loop {
        match child.try_wait() {
            Ok(Some(_)) => break true,
            Ok(None) if start.elapsed() < ASK_WAIT => std::thread::sleep(Duration::from_millis(5)),
            _ => break false,
        }
    };
    if !finished {
        let _ = child.kill();
    }
    let _ = child.wait();
    let mut text = String::new();
    for reader in readers {
        text.push_str(&String::from_utf8_lossy(&reader.join().unwrap_or_default()));
    }
    match finished {
        true => Ok(text),
        false => Err(format!(
            "{} --help did not end within {ASK_WAIT:?}",
            path.display()
        )),
    }
}

/// The virtiofsd to start, or why none can be (said as a skip): it runs as root here (the
/// Rust daemon's `--sandbox none` still needs CAP_DAC_READ_SEARCH and friends for its file
/// handles; the C one chroots). `EXITLESS_VIRTIOFSD` names one; else the first program named
/// virtiofsd on PATH, in ~/.cargo/bin or in [`DAEMONS`] that answers like one.
pub fn find() -> Result<Daemon, String> {
    // SAFETY: geteuid has no preconditions and touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        return Err("virtiofsd needs root".into());
    }
    if let Some(named) = std::env::var_os("EXITLESS_VIRTIOFSD") {
        let path = PathBuf::from(named);
        if !path.is_file() {
            return Err(format!(
                "EXITLESS_VIRTIOFSD={} is not a file",
                path.display()
            ));
        }
        return Daemon::ask(&path).map_err(|why| format!("EXITLESS_VIRTIOFSD: {why}"));
    }
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|dir| dir.join("virtiofsd"));
    let cargo_home =
        std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo/bin/virtiofsd"));
    let mut refused = Vec::new();
    for path in on_path
        .chain(cargo_home)
        .chain(DAEMONS.iter().map(PathBuf::from))
        .filter(|p| p.is_file())
    {
        match Daemon::ask(&path) {
            Ok(daemon) => return Ok(daemon),
            Err(why) => refused.push(why),
        }
    }
    match refused.is_empty() {
        true => Err(format!(
            "virtiofsd is not installed (looked on PATH, in ~/.cargo/bin and in {}; \
             EXITLESS_VIRTIOFSD names another)",
            DAEMONS.join(", ")
        )),
        false => Err(format!("no usable virtiofsd: {}", refused.join("; "))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(daemon: &Daemon, cache: Cache) -> Vec<String> {
        let c = daemon.command(Path::new("/s/fs.sock"), Path::new("/d"), cache);
        c.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn each_flavour_gets_its_own_command_line_and_pid_file() {
        let rust = Daemon {
            path: "/x/virtiofsd".into(),
            flavour: Flavour::Rust,
        };
        let c = Daemon {
            flavour: Flavour::C,
            ..rust.clone()
        };
        assert_eq!(
            args(&rust, Cache::Never).join(" "),
            "--socket-path /s/fs.sock --shared-dir /d --cache never --sandbox none"
        );
        assert_eq!(
            args(&c, Cache::Auto).join(" "),
            "--socket-path=/s/fs.sock -o source=/d -o cache=auto -o sandbox=chroot"
        );
        assert_eq!(args(&c, Cache::Never)[4], "cache=none");
        let socket = Path::new("/tmp/a/fs.sock");
        assert_eq!(rust.pid_file(socket), Path::new("/tmp/a/fs.sock.pid"));
        assert_eq!(
            c.pid_file(socket),
            Path::new("/run/virtiofsd/.tmp.a.fs.sock.pid")
        );
    }

    #[test]
    fn the_help_text_tells_the_flavour() {
        let rust = "Usage: virtiofsd [OPTIONS]\n      --shared-dir <SHARED_DIR>\n";
        let c = "usage: virtiofsd [options]\n    -o source=PATH   shared directory tree\n    \
                 --socket-path=PATH   path for the vhost-user socket\n";
        assert_eq!(flavour_of(rust), Some(Flavour::Rust));
        assert_eq!(flavour_of(c), Some(Flavour::C));
        assert_eq!(flavour_of("usage: cat [OPTION]... [FILE]..."), None);
    }

    #[test]
    fn a_program_that_is_not_a_virtiofsd_is_refused_with_its_name() {
        let e = Daemon::ask(Path::new("/bin/true")).unwrap_err();
        assert!(
            e.contains("/bin/true does not answer --help like a virtiofsd"),
            "{e}"
        );
        let e = Daemon::ask(Path::new("/nonexistent/virtiofsd")).unwrap_err();
        assert!(
            e.contains("cannot run /nonexistent/virtiofsd --help"),
            "{e}"
        );
    }
}
