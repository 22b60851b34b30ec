//! Raw mode for the VMM's stdin while the guest owns the console.
//!
//! [`RawTerminal::enter`] switches stdin to raw input (no line buffering, no echo) when stdin
//! is a tty, and does nothing otherwise. Signal keys stay on, so Ctrl-C (SIGINT) and Ctrl-\\
//! (SIGQUIT) reach exitless, which stops the VM cleanly; every other key goes to the guest. The
//! terminal settings saved on entry come back exactly when the guard drops, when the process
//! panics (a panic hook is chained in front of the existing one) or on [`restore_terminal`],
//! which the VMM should call before `std::process::exit` since that skips destructors.
//! Restoring is idempotent: whichever of these runs first does it, the others do nothing.

use std::io::{self, IsTerminal};
use std::sync::{Mutex, Once};

use thiserror::Error;

/// Errors entering raw mode.
#[derive(Debug, Error)]
pub enum TerminalError {
    #[error("Cannot put the terminal in raw mode: {0}")]
    RawMode(#[source] io::Error),
}

/// The settings stdin had before raw mode, while raw mode is on.
static SAVED: Mutex<Option<libc::termios>> = Mutex::new(None);
static PANIC_HOOK: Once = Once::new();

fn get_attrs() -> io::Result<libc::termios> {
    // SAFETY: an all-zero termios is a valid value of this plain C struct; tcgetattr fills it.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: fd 0 stays open for the life of the process and `t` is a valid, writable termios.
    if unsafe { libc::tcgetattr(libc::STDIN_FILENO, &mut t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(t)
}

fn set_attrs(t: &libc::termios) -> io::Result<()> {
    // SAFETY: fd 0 stays open for the life of the process; `t` is a valid termios read only.
    if unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Restores the settings saved by [`RawTerminal::enter`]; safe to call any number of times.
pub fn restore_terminal() {
    let saved = SAVED.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(t) = saved {
        if let Err(e) = set_attrs(&t) {
            eprintln!("Cannot restore the terminal: {e}");
        }
    }
}

fn install_panic_hook() {
    PANIC_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore_terminal();
            previous(info);
        }));
    });
}

/// Keeps stdin in raw mode while alive (see the module docs).
#[derive(Debug)]
#[must_use = "the terminal is restored when the guard drops"]
pub struct RawTerminal {
    active: bool,
}

impl RawTerminal {
    /// Puts stdin in raw mode if it is a tty. A guard made while raw mode is already on (by an
    /// earlier guard) is inactive: only the first one restores the terminal.
    pub fn enter() -> Result<Self, TerminalError> {
        if !io::stdin().is_terminal() {
            return Ok(Self { active: false });
        }
        install_panic_hook();
        let mut saved = SAVED.lock().unwrap_or_else(|e| e.into_inner());
        if saved.is_some() {
            return Ok(Self { active: false });
        }
        let original = get_attrs().map_err(TerminalError::RawMode)?;
        let mut raw = original;
        raw.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ECHONL | libc::IEXTEN);
        raw.c_iflag &= !(libc::ICRNL | libc::IXON);
        raw.c_cc[libc::VMIN] = 1;
        raw.c_cc[libc::VTIME] = 0;
        set_attrs(&raw).map_err(TerminalError::RawMode)?;
        *saved = Some(original);
        Ok(Self { active: true })
    }

    /// Whether this guard switched the terminal to raw mode (false when stdin is no tty).
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// Restores the terminal now; the drop then does nothing.
    pub fn restore(&mut self) {
        if std::mem::take(&mut self.active) {
            restore_terminal();
        }
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        self.restore();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_is_safe_to_restore_repeatedly() {
        let mut g = RawTerminal::enter().unwrap();
        if !io::stdin().is_terminal() {
            assert!(!g.is_active());
        }
        g.restore();
        assert!(!g.is_active());
        g.restore();
        restore_terminal();
        restore_terminal();
        drop(g);
        assert!(SAVED.lock().unwrap().is_none());
    }

    #[test]
    fn no_tty_means_no_op() {
        if io::stdin().is_terminal() {
            return;
        }
        let g = RawTerminal::enter().unwrap();
        assert!(!g.is_active());
        assert!(SAVED.lock().unwrap().is_none());
    }
}
