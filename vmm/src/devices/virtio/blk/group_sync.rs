//! Write-through by group commit: a write the driver must find durable completes in the page
//! cache first, then waits for one fdatasync the device starts after it; every write that
//! completed before that sync started completes with it. At a queue depth of 32 one sync
//! covers many writes, where RWF_DSYNC on each write costs a sync per write.

use super::*;

/// The completion slot of the device's own sync (no request's slot: those are queue indices).
pub(super) const SYNC_SLOT: u32 = u32::MAX;

impl BlockWorker {
    /// Whether a completed write still waits for a sync before the driver may see it.
    pub(super) fn awaits_sync(&self, r: &Request) -> bool {
        r.op == Op::Write && self.write_through == Some(WriteThrough::GroupSync)
    }

    /// Starts a sync for the writes waiting, unless one runs (they wait for the next).
    pub(super) fn start_sync(&mut self) {
        if self.group.in_flight || self.group.waiting.is_empty() {
            return;
        }
        let op = IoOp {
            slot: SYNC_SLOT,
            kind: IoKind::Flush,
            offset: 0,
            iovecs: Iovecs(Vec::new()),
            durable: false,
        };
        let started = self.io.push(&op).and_then(|()| self.io.submit());
        self.group.running = std::mem::take(&mut self.group.waiting);
        match started {
            Ok(()) => {
                self.group.in_flight = true;
                QueueCounters::add(&self.stats.write_syncs, 1);
            }
            Err(e) => {
                self.io_error(&e);
                self.complete_synced(request::VIRTIO_BLK_S_IOERR);
            }
        }
    }

    /// The device's sync ended: its writes complete (an I/O error if it failed), and the
    /// writes that completed meanwhile get the next one.
    pub(super) fn synced(&mut self, c: &Completion) {
        self.group.in_flight = false;
        let status = match &c.result {
            Ok(_) => request::VIRTIO_BLK_S_OK,
            Err(e) => {
                self.io_error(e);
                request::VIRTIO_BLK_S_IOERR
            }
        };
        self.complete_synced(status);
    }

    fn complete_synced(&mut self, status: u8) {
        for r in std::mem::take(&mut self.group.running) {
            self.finish(r.head, Some(r.status), status, 0);
        }
    }
}
