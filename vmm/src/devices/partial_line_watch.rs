//! The serial device's side of the idle flush (`serial_idle_flush`): when output starts
//! waiting for its newline, the main thread is woken ([`crate::wake`]) to flush it a little
//! later, unless a flush is already due. Shared by both sides, so neither imports the other's
//! module.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The serial device's end: says that output waits, unless a flush is already due.
pub struct PartialLineWatch {
    waiting: Arc<AtomicBool>,
}

impl PartialLineWatch {
    /// A watch that sets `waiting` and wakes the main thread when it was not set.
    pub fn new(waiting: Arc<AtomicBool>) -> Self {
        PartialLineWatch { waiting }
    }

    /// Called with the serial device locked, after output was left pending. No lock,
    /// allocation or system call while a flush is due; one futex wake-up otherwise.
    pub fn tell(&self) {
        // A plain load first: while a flush is due, every further byte costs nothing.
        if !self.waiting.load(Ordering::Acquire) && !self.waiting.swap(true, Ordering::AcqRel) {
            crate::wake::wake();
        }
    }
}
