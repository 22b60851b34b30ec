//! `exitless run` on a real terminal (a pseudo-terminal made by `script`): Ctrl-C stops the VM
//! cleanly with exit code 130, and the terminal's settings come back as they were.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

fn available() -> bool {
    let script = Command::new("script")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let kvm = std::path::Path::new("/dev/kvm").exists();
    let bash = std::path::Path::new("/bin/bash").exists();
    if !(script && kvm && bash) {
        eprintln!("SKIPPED: needs /dev/kvm, /bin/bash and script(1) (bsdutils)");
    }
    script && kvm && bash
}

#[test]
fn ctrl_c_on_the_console_stops_the_vm_and_restores_the_terminal() {
    if !available() {
        return;
    }
    let exe = env!("CARGO_BIN_EXE_exitless");
    let guest = std::env::temp_dir().join(format!("exitless-tty-{}.elf", std::process::id()));
    assert!(Command::new(exe)
        .args(["bench", "--export-guest"])
        .arg(&guest)
        .status()
        .unwrap()
        .success());
    let modes = "stty -a | grep -o -- '-\\?icanon\\b\\|-\\?echo\\b\\|-\\?isig\\b' | tr '\\n' ' '";
    // A guest that keeps running (self-IPIs take ~1 ms each on PVM) until Ctrl-C arrives.
    let inner = format!(
        "{modes}; echo; {exe} run --kernel {} --memory 64M --cmdline 'case=self_ipi iters=200000' \
         --timeout 60; echo exit=$?; {modes}",
        guest.display()
    );
    // script(1) runs the line with $SHELL. A non-interactive dash dies of the Ctrl-C itself
    // (SIGINT goes to the whole foreground group); bash waits and sees exitless exit with 130.
    let mut child = Command::new("script")
        .env("SHELL", "/bin/bash")
        .args(["-qec", &inner, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let output = spawn_reader(child.stdout.take().unwrap());
    // Ctrl-C once the guest runs, then keep the pty's input open until the session ends: EOF
    // would end script(1) early.
    let mut text = String::new();
    let started = read_until(
        &output,
        &mut text,
        "EXITLESS START",
        Duration::from_secs(30),
    );
    stdin.write_all(b"\x03").unwrap();
    read_until(&output, &mut text, "\u{0}", Duration::from_secs(30));
    drop(stdin);
    child.kill().ok();
    child.wait().unwrap();
    std::fs::remove_file(&guest).ok();
    assert!(started, "the guest never started: {text}");
    let text = text.replace('\r', "");
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("EXITLESS"))
        .collect();
    assert!(text.contains("exit=130"), "{text}");
    let before = lines.first().copied().unwrap_or("").trim();
    let after = lines.last().copied().unwrap_or("").trim();
    assert_eq!(before, "isig icanon echo", "{text}");
    assert_eq!(after, before, "terminal not restored: {text}");
}

/// Sends what `out` produces, chunk by chunk, until it ends.
fn spawn_reader(mut out: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = out.read(&mut buf) {
            if tx
                .send(String::from_utf8_lossy(&buf[..n]).into_owned())
                .is_err()
            {
                break;
            }
        }
    });
    rx
}

/// Appends output to `text` until it contains `needle` (true), the output ends or `limit` passes.
fn read_until(output: &Receiver<String>, text: &mut String, needle: &str, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while !text.contains(needle) {
        let left = deadline.saturating_duration_since(Instant::now());
        match output.recv_timeout(left) {
            Ok(chunk) => text.push_str(&chunk),
            Err(_) => return false,
        }
    }
    true
}
