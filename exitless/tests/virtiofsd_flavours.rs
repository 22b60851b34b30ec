//! `bench --cases virtio_fs` with a stand-in for each virtiofsd (the Rust daemon and QEMU's C
//! one): the binary asks the daemon which it is and passes that daemon's own flags, removes
//! the socket and pid file each run leaves, and with no usable daemon skips the case in one
//! line and exits 0.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A stand-in named virtiofsd in `dir`: `--help` prints `help`; otherwise it appends its
/// arguments as one line to `dir/argv`, creates its socket (a plain file, so the VMM's
/// connect fails and the configuration ends at once) and the pid file the real daemon
/// writes (`pid_file` computes its path from the socket's, in `$s`), logs the ready line and
/// waits to be killed.
fn stand_in(dir: &Path, help: &str, socket: &str, pid_file: &str) -> PathBuf {
    let script = format!(
        "#!/bin/sh\n[ \"$1\" = --help ] && {{ printf '%s\\n' '{help}'; exit 0; }}\n\
         echo \"$*\" >> {argv}\n{socket}\n{pid_file}\n: > \"$s\"; : > \"$p\"\n\
         echo 'Waiting for vhost-user socket connection...' >&2\nexec sleep 60\n",
        argv = dir.join("argv").display()
    );
    let path = dir.join("virtiofsd");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// Root (the lookup refuses others) and /dev/kvm (the bench probes the host first).
fn can_run(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        vmm::test_skip::skip(test, "virtiofsd (and so its stand-in) needs root");
        return false;
    }
    common::kvm_available(test)
}

/// Runs the virtio_fs case with `daemon`, exitless's temporary files in `tmp`.
fn bench_with(daemon: &Path, tmp: &Path) -> std::process::Output {
    common::exitless()
        .args(["bench", "--cases", "virtio_fs", "--iterations", "10"])
        .env("EXITLESS_VIRTIOFSD", daemon)
        .env("TMPDIR", tmp)
        .output()
        .unwrap()
}

fn scratch(name: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("exitless-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    let tmp = dir.join("tmp");
    (dir, tmp)
}

#[test]
fn each_virtiofsd_gets_its_own_flags_and_leaves_no_file_behind() {
    const TEST: &str = "virtiofsd_flavours";
    if !can_run(TEST) {
        return;
    }
    let rust = (
        "Usage: virtiofsd [OPTIONS]   --shared-dir <SHARED_DIR>",
        "s=$2",
        "p=$s.pid",
        "--socket-path S --shared-dir D --cache auto --sandbox none",
    );
    let c = (
        "usage: virtiofsd [options]   -o source=PATH   --socket-path=PATH",
        "s=${1#--socket-path=}",
        "mkdir -p /run/virtiofsd; p=/run/virtiofsd/$(echo \"$s\" | tr / .).pid",
        "--socket-path=S -o source=D -o cache=auto -o sandbox=chroot",
    );
    for (name, (help, socket, pid_file, want)) in [("rust", rust), ("c", c)] {
        let (dir, tmp) = scratch(&format!("vfs-{name}"));
        let daemon = stand_in(&dir, help, socket, pid_file);
        let o = bench_with(&daemon, &tmp);
        let err = String::from_utf8_lossy(&o.stderr);
        let argv = std::fs::read_to_string(dir.join("argv")).unwrap_or_default();
        assert_eq!(
            argv.lines().count(),
            9,
            "{name}: 3 configurations x 3 rounds\n{err}"
        );
        for line in argv.lines() {
            // S and D: exitless's socket and shared directory, both in its TMPDIR.
            let words: Vec<&str> = line.split(' ').collect();
            let general: Vec<String> = words
                .iter()
                .map(|w| match w.rsplit_once(tmp.to_str().unwrap()) {
                    Some((pre, rest)) if rest.ends_with(".sock") => format!("{pre}S"),
                    Some((pre, _)) => format!("{pre}D"),
                    None => w.to_string(),
                })
                .collect();
            assert_eq!(general.join(" "), want, "{name}: {line}");
        }
        // The stand-in's socket is no vhost-user socket: each configuration fails.
        assert_eq!(o.status.code(), Some(2), "{name}: {err}");
        let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().flatten().collect();
        assert!(left.is_empty(), "{name}: left in TMPDIR: {left:?}");
        let c_pid_files = std::fs::read_dir("/run/virtiofsd").into_iter().flatten();
        let dotted = tmp.to_str().unwrap().replace('/', ".");
        let ours: Vec<_> = c_pid_files
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&dotted))
            .collect();
        assert!(ours.is_empty(), "{name}: pid files left: {ours:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn without_a_usable_virtiofsd_the_case_is_skipped_in_one_line_and_the_bench_passes() {
    const TEST: &str = "virtiofsd_none_usable";
    if !common::kvm_available(TEST) {
        return;
    }
    let (dir, tmp) = scratch("vfs-none");
    // Were it started after all (an exitless that does not ask), it writes only into `dir`.
    let (socket, pid_file) = (
        format!("s={}/s", dir.display()),
        format!("p={}/p", dir.display()),
    );
    let not_one = stand_in(&dir, "usage: cat [OPTION]... [FILE]...", &socket, &pid_file);
    let o = bench_with(&not_one, &tmp);
    let err = String::from_utf8_lossy(&o.stderr);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{err}{out}");
    let skips: Vec<&str> = err.lines().filter(|l| l.contains("skipped")).collect();
    assert_eq!(skips.len(), 1, "{err}");
    assert!(
        skips[0].contains("virtio_fs/qd1, qd32, qd32-polled: skipped"),
        "{err}"
    );
    assert_eq!(out.matches("skipped:").count(), 1, "{out}");
    assert!(!dir.join("argv").exists(), "only asked, never started");
    std::fs::remove_dir_all(&dir).unwrap();
}
