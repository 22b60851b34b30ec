//! The serial device's side of the idle flush (`serial_idle_flush`): when output starts
//! waiting for its newline, one eventfd write tells the devices thread, unless its flush
//! timer already runs. Shared by both sides, so neither imports the other's module.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

/// The serial device's end: says that output waits, unless the flush timer already runs.
pub struct PartialLineWatch {
    timer_running: Arc<AtomicBool>,
    wake: EventFd,
}

impl PartialLineWatch {
    /// A watch that writes `wake` when `timer_running` is not set, and sets it.
    pub fn new(timer_running: Arc<AtomicBool>, wake: EventFd) -> Self {
        PartialLineWatch {
            timer_running,
            wake,
        }
    }

    /// Called with the serial device locked, after output was left pending.
    pub fn tell(&self) {
        // A plain load first: while the timer runs, every further byte costs no write.
        if !self.timer_running.load(Ordering::Acquire)
            && !self.timer_running.swap(true, Ordering::AcqRel)
        {
            let _ = self.wake.write(1);
        }
    }
}
