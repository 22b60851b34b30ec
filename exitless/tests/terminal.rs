//! `exitless run` on a real terminal (a pseudo-terminal made by `script`): Ctrl-C stops the VM
//! cleanly with exit code 130, and the terminal's settings come back as they were.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::Stream;

fn available() -> bool {
    let script = Command::new("script")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let kvm = std::path::Path::new("/dev/kvm").exists();
    let bash = std::path::Path::new("/bin/bash").exists();
    if !(script && kvm && bash) {
        vmm::test_skip::skip(
            "ctrl_c_on_the_console",
            "needs /dev/kvm, /bin/bash and script(1) (bsdutils)",
        );
    }
    script && kvm && bash
}

#[test]
fn ctrl_c_on_the_console_stops_the_vm_and_restores_the_terminal() {
    if !available() {
        return;
    }
    let exe = common::exitless_path().display().to_string();
    let guest = std::env::temp_dir().join(format!("exitless-tty-{}.elf", std::process::id()));
    assert!(Command::new(&exe)
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
    let mut output = Stream::spawn(child.stdout.take().unwrap());
    // Ctrl-C once the guest runs, then keep the pty's input open until the session ends: EOF
    // would end script(1) early.
    let limit = Duration::from_secs(30);
    let started = output.wait_for(limit, |text| text.contains("EXITLESS START"));
    stdin.write_all(b"\x03").unwrap();
    output.read_to_end(limit);
    drop(stdin);
    child.kill().ok();
    child.wait().unwrap();
    std::fs::remove_file(&guest).ok();
    let text = output.text.replace('\r', "");
    assert!(started, "the guest never started: {text}");
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
