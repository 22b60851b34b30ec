//! The console's wiring at launch (and restore): where COM1's output goes, the timer that
//! flushes partial lines, and stdin fed to COM1 from the devices event loop.

use std::fs::File;
use std::io::IsTerminal;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};

use super::LaunchError;
use crate::config::{SerialOutputMode, VmConfig};
use crate::devices::console_input::ConsoleInput;
use crate::devices::serial::{FlushPolicy, SerialDevice, SerialOutput};
use crate::devices::serial_idle_flush::SerialIdleFlush;
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

/// Flushes partial console lines on a timer when the console takes whole lines.
pub(super) fn attach_idle_flush(events: &EventLoop, serial: &Arc<Mutex<SerialDevice>>) {
    let holds = serial
        .lock()
        .map(|s| s.output().holds_partial_lines())
        .unwrap_or(false);
    if !holds {
        return;
    }
    let added = SerialIdleFlush::new(serial.clone())
        .map_err(|e| e.to_string())
        .and_then(|(flush, watch)| {
            let flush = Arc::new(Mutex::new(flush));
            events.handle().add(flush).map_err(|e| e.to_string())?;
            if let Ok(mut serial) = serial.lock() {
                serial.output_mut().set_partial_watch(watch);
            }
            Ok(())
        });
    if let Err(e) = added {
        eprintln!("exitless: partial console lines wait for their newline: {e}");
    }
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
