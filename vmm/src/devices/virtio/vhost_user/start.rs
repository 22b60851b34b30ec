//! What every device on a vhost-user back end does the same way when the driver starts or
//! resets it (virtio-fs, vhost-user-blk, the generic device): the enabled queues handed to the
//! back end with their ioeventfds and irqfds, the socket watched while it runs, a back end that
//! went refused by name, and the starts and stops counted.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use virtio_queue::QueueT;
use vm_memory::GuestAddressSpace;

use super::fs::BackendWatch;
use super::{Frontend, VhostUserError, Vring};
use crate::devices::virtio::{Activation, VirtioError};
use crate::event_loop::Subscriber;

/// The starts and stops of a device's back end (its queues are the back end's: exitless
/// sees no request).
#[derive(Debug, Default)]
pub(crate) struct StartCounters {
    starts: AtomicU64,
    failed_starts: AtomicU64,
    failed_stops: AtomicU64,
}

impl StartCounters {
    /// A start after a snapshot that failed.
    pub(crate) fn failed_start(&self) {
        self.failed_starts.fetch_add(1, Ordering::Relaxed);
    }

    /// The device's counters as [`crate::devices::virtio::VirtioDevice::device_counters`]
    /// names them.
    pub(crate) fn entries(&self) -> Vec<(&'static str, u64)> {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("backend_starts", l(&self.starts)),
            ("backend_failed_starts", l(&self.failed_starts)),
            ("backend_failed_stops", l(&self.failed_stops)),
        ]
    }
}

/// A device's hold on its back end, borrowed from the device for a start or a reset.
pub(crate) struct Backend<'a> {
    pub frontend: &'a Mutex<Frontend>,
    /// A second handle on the socket, made at connect: what the watch of a running device
    /// registers.
    pub watch_socket: &'a Arc<UnixStream>,
    /// Set by the watch when the back end closed its socket: nothing more is asked of it.
    pub gone: &'a Arc<AtomicBool>,
    pub counters: &'a StartCounters,
}

impl Backend<'_> {
    fn frontend(&self) -> std::sync::MutexGuard<'_, Frontend> {
        self.frontend.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands the enabled queues to the back end: the watch of the running device, and the
    /// queues as handed over (virtio-fs keeps them to start them again after a snapshot). A
    /// back end that is gone, or refuses, is the device's error naming it; a half-started one
    /// is stopped (bounded: a broken one is not asked).
    pub(crate) fn activate(&self, a: &Activation) -> Result<(Subscriber, Vec<Vring>), VirtioError> {
        let failed = |message: String| VirtioError::Backend {
            device: a.health.name().to_string(),
            message,
        };
        if self.gone.load(Ordering::Acquire) {
            return Err(failed(
                "the vhost-user back end closed its socket earlier".into(),
            ));
        }
        let vrings = match self.start(a) {
            Ok(vrings) => vrings,
            Err(e) => {
                self.counters.failed_start();
                let _ = self.frontend().stop();
                return Err(failed(e.to_string()));
            }
        };
        self.counters.starts.fetch_add(1, Ordering::Relaxed);
        let path = self.frontend().path().to_path_buf();
        let watch = BackendWatch::new(
            self.watch_socket.clone(),
            path,
            a.health.clone(),
            self.gone.clone(),
        );
        Ok((Arc::new(Mutex::new(watch)), vrings))
    }

    /// The queues with their kick ioeventfds and call irqfds, handed over with the memory
    /// table as it is now (regions hot-added before this start included).
    fn start(&self, a: &Activation) -> Result<Vec<Vring>, VhostUserError> {
        let mut vrings = Vec::with_capacity(a.queues.len());
        for q in &a.queues {
            let call = a
                .interrupt
                .queue_irqfd(q.index)
                .map_err(VhostUserError::NoIrqfd)?;
            vrings.push(Vring {
                index: q.index,
                size: q.queue.size(),
                desc: q.queue.desc_table(),
                avail: q.queue.avail_ring(),
                used: q.queue.used_ring(),
                base: q.queue.next_avail(),
                kick: q.notify.as_raw_fd(),
                call,
            });
        }
        let mut frontend = self.frontend();
        frontend.start(&a.mem.memory(), a.features, &vrings)?;
        // Started while a migration runs: a back end that can log does so from the first.
        if let Some(log) = a.dirty.shared().filter(|_| frontend.can_log()) {
            if !frontend.logging() {
                frontend.set_logging(Some(&log))?;
            }
        }
        Ok(vrings)
    }

    /// The driver reset the device: the back end stops its queues (one that is gone has its
    /// queues forgotten: it was said once when it went).
    pub(crate) fn reset(&self) {
        let mut frontend = self.frontend();
        if self.gone.load(Ordering::Acquire) {
            return frontend.forget_queues();
        }
        if let Err(e) = frontend.stop() {
            self.counters.failed_stops.fetch_add(1, Ordering::Relaxed);
            eprintln!(
                "exitless: the vhost-user back end at {} did not stop its queues: {e}",
                frontend.path().display()
            );
        }
    }
}
