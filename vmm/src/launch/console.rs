//! The console's wiring at launch (and restore): where COM1's output goes, the main thread's
//! flush of partial lines, and stdin fed to COM1 from the devices event loop.

use std::fs::File;
use std::io::IsTerminal;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};

use super::LaunchError;
use crate::config::{SerialOutputMode, VmConfig};
use crate::devices::console_input::ConsoleInput;
use crate::devices::serial::{FlushPolicy, SerialDevice, SerialOutput};
use crate::devices::serial_idle_flush::IdleFlush;
use crate::event_loop::EventLoop;

/// The console: stdout, nothing or a file (the API's serial mode), and the serial log. An
/// interactive console needs every byte at once; a pipe or file gets whole lines, which saves
/// a write syscall on most console exits.
pub(super) fn console_output(config: &VmConfig) -> Result<SerialOutput, LaunchError> {
    let mut out = match &config.serial_output {
        SerialOutputMode::Stdout => {
            let policy = if std::io::stdout().is_terminal() {
                FlushPolicy::EveryWrite
            } else {
                FlushPolicy::Newline
            };
            SerialOutput::stdout().with_flush_policy(policy)
        }
        SerialOutputMode::Discard => SerialOutput::discard(),
        SerialOutputMode::File(path) => {
            // Appended: a reboot keeps what the guest wrote before it.
            let file = File::options().create(true).append(true).open(path);
            let file = file.map_err(|error| LaunchError::SerialFile {
                path: path.clone(),
                error,
            })?;
            SerialOutput::new(Box::new(file)).with_flush_policy(FlushPolicy::Newline)
        }
    };
    if let Some(path) = &config.serial_log {
        out = out.with_log_file(path)?;
    }
    Ok(out)
}

/// The main thread's flush of partial console lines, when the console takes whole lines.
pub(super) fn attach_idle_flush(serial: &Arc<Mutex<SerialDevice>>) -> Option<IdleFlush> {
    let mut device = serial.lock().ok()?;
    if !device.output().holds_partial_lines() {
        return None;
    }
    let (flush, watch) = IdleFlush::new(serial.clone());
    device.output_mut().set_partial_watch(watch);
    Some(flush)
}

/// Whether stdin may give the guest anything: it is open and not /dev/null (what launchers
/// give a VMM whose console nobody types into), so that such a VM needs no devices thread for
/// it.
pub(super) fn stdin_may_have_input() -> bool {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes one `stat` into `st`, which is that size; fd 0 is only read.
    if unsafe { libc::fstat(0, st.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: fstat succeeded, so it filled `st`.
    let st = unsafe { st.assume_init() };
    let is_char = st.st_mode & libc::S_IFMT == libc::S_IFCHR;
    !(is_char && st.st_rdev == libc::makedev(1, 3))
}

/// Feeds stdin to COM1 from the device event loop until stdin ends (the VM keeps running).
pub(super) fn attach_stdin(events: &EventLoop, serial: Arc<Mutex<SerialDevice>>) {
    // A duplicate of fd 0 without std's buffer in front of it, which epoll could not see.
    let attached = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map(File::from)
        .and_then(|stdin| ConsoleInput::new(stdin, serial))
        .map_err(|e| e.to_string())
        .and_then(|input| {
            events
                .handle()
                .add(Arc::new(Mutex::new(input)))
                .map_err(|e| e.to_string())
        });
    // Without console input the VM still runs.
    if let Err(e) = attached {
        eprintln!("exitless: no console input: {e}");
    }
}
