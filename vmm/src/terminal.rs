//! Raw mode for the VMM's stdin while the guest owns the console.
//!
//! [`RawTerminal::enter`] switches stdin to raw mode (no line buffering, no echo, no signal
//! keys: Ctrl-C goes to the guest) when stdin is a tty, and does nothing otherwise. Canonical
//! mode (`ICANON | ECHO | ISIG`) comes back when the guard drops, when the process panics
//! (a panic hook is chained in front of the existing one) or on [`restore_terminal`], which
//! the VMM should call before `std::process::exit` since that skips destructors. Restoring is
//! idempotent: whichever of these runs first does it, the others do nothing.

use std::io::{self, IsTerminal};
use std::os::unix::io::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

use thiserror::Error;
use vmm_sys_util::terminal::Terminal;

/// Errors entering raw mode.
#[derive(Debug, Error)]
pub enum TerminalError {
    #[error("Cannot put the terminal in raw mode: {0}")]
    RawMode(#[source] vmm_sys_util::errno::Error),
}

/// Whether this process put stdin in raw mode and has not restored it yet.
static RAW: AtomicBool = AtomicBool::new(false);
static PANIC_HOOK: Once = Once::new();

/// Stdin by file descriptor. `StdinLock` also implements `Terminal`, but taking the stdin lock
/// from a panic hook would deadlock while another thread blocks in a read of stdin.
struct StdinFd;

// SAFETY: `tty_fd` returns fd 0, which the process keeps open for its whole life (the VMM never
// closes it), so the descriptor is valid for as long as any `StdinFd` exists.
unsafe impl Terminal for StdinFd {
    fn tty_fd(&self) -> RawFd {
        libc::STDIN_FILENO
    }
}

/// Restores canonical mode if this process set raw mode; safe to call any number of times.
pub fn restore_terminal() {
    if RAW.swap(false, Ordering::SeqCst) {
        if let Err(e) = StdinFd.set_canon_mode() {
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
        if RAW.swap(true, Ordering::SeqCst) {
            return Ok(Self { active: false });
        }
        if let Err(e) = StdinFd.set_raw_mode() {
            RAW.store(false, Ordering::SeqCst);
            return Err(TerminalError::RawMode(e));
        }
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
        assert!(!RAW.load(Ordering::SeqCst));
    }

    #[test]
    fn no_tty_means_no_op() {
        if io::stdin().is_terminal() {
            return;
        }
        let g = RawTerminal::enter().unwrap();
        assert!(!g.is_active());
        assert!(!RAW.load(Ordering::SeqCst));
    }
}
