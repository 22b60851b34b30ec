//! A VMM process started for a case driven through its API (`api_start`, `snapshot`): no
//! stdin, no stderr, and its console read on a thread of its own that sends the time each
//! line of interest came.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Instant;

/// Starts `cmd` (`program`, named in errors), and a thread that sends the arrival time of each
/// console line starting with `prefix` until the receiver is dropped or the console ends.
pub fn spawn(
    cmd: &mut Command,
    program: &Path,
    prefix: &'static str,
) -> Result<(Child, Receiver<Instant>), String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        let _ = child.wait();
        return Err("the VMM has no stdout".into());
    };
    let (sender, lines) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with(prefix) && sender.send(Instant::now()).is_err() {
                return;
            }
        }
    });
    Ok((child, lines))
}
