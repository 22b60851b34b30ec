//! The queue work of a running device, kept by the device so that a snapshot can reach it.
//!
//! A device's activation hands its worker to the event loop, which owns it; the device keeps
//! a weak handle, and [`VirtioDevice::quiesce`](super::VirtioDevice::quiesce) and
//! [`VirtioDevice::unquiesce`](super::VirtioDevice::unquiesce) forward to the worker through
//! it (nothing to do when the device is not running).

use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// What a device's worker does around a snapshot (the vCPUs are parked meanwhile).
pub trait QuiesceWorker {
    /// Stops writing the guest's queues and gives back the chains taken and not used;
    /// Err(why) refuses the snapshot.
    fn quiesce(&mut self) -> Result<(), String>;
    /// The snapshot is over: the worker goes on.
    fn unquiesce(&mut self);
}

/// A weak handle on the worker of a running device (none while it is stopped).
#[derive(Debug)]
pub struct RunningWorker<W>(Weak<Mutex<W>>);

impl<W> Default for RunningWorker<W> {
    fn default() -> Self {
        RunningWorker(Weak::new())
    }
}

fn lock<W>(worker: &Mutex<W>) -> MutexGuard<'_, W> {
    worker.lock().unwrap_or_else(|e| e.into_inner())
}

impl<W: QuiesceWorker> RunningWorker<W> {
    /// The device starts: returns the worker for the event loop, which owns it.
    pub fn start(&mut self, worker: W) -> Arc<Mutex<W>> {
        let worker = Arc::new(Mutex::new(worker));
        self.0 = Arc::downgrade(&worker);
        worker
    }

    /// The device stops (reset): the handle lets go of the worker.
    pub fn stop(&mut self) {
        self.0 = Weak::new();
    }

    /// [`QuiesceWorker::quiesce`] on the worker if the device runs.
    pub fn quiesce(&self) -> Result<(), String> {
        match self.0.upgrade() {
            Some(worker) => lock(&worker).quiesce(),
            None => Ok(()),
        }
    }

    /// `f` on the worker if the device runs (None if not).
    pub fn with<R>(&self, f: impl FnOnce(&mut W) -> R) -> Option<R> {
        self.0.upgrade().map(|worker| f(&mut lock(&worker)))
    }

    /// [`QuiesceWorker::unquiesce`] on the worker if the device runs.
    pub fn unquiesce(&self) {
        if let Some(worker) = self.0.upgrade() {
            lock(&worker).unquiesce();
        }
    }
}
