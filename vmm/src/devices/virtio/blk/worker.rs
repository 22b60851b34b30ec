//! The virtio-blk queue worker: takes requests off the ring, starts their I/O, and completes
//! them as the host finishes.

use std::os::fd::AsRawFd;

use super::*;

impl BlockWorker {
    fn counter(&self) -> &QueueCounters {
        &self.counters[0]
    }

    /// Raises the queue's interrupt if the driver asked for one (event idx may say no).
    fn maybe_signal(&mut self) {
        if self.queue.needs_notification(&self.mem).unwrap_or(true) {
            if let Ok(true) = self.interrupt.signal_queue(0) {
                QueueCounters::add(&self.counters[0].interrupts, 1);
            }
        }
    }

    /// Puts a finished chain on the used ring with `status` at its status byte.
    fn finish(
        &mut self,
        head: u16,
        status_addr: Option<vm_memory::GuestAddress>,
        status: u8,
        len: u32,
    ) {
        let written = status_addr
            .map(|a| self.mem.write_obj(status, a).is_ok())
            .unwrap_or(false);
        let len = if written { len + 1 } else { 0 };
        if self.queue.add_used(&self.mem, head, len).is_err() {
            QueueCounters::add(&self.counters[0].malformed, 1);
        }
        QueueCounters::add(&self.counters[0].completed, 1);
    }

    fn refused(&mut self, r: Refused) {
        if r.malformed {
            QueueCounters::add(&self.counter().malformed, 1);
        }
        self.finish(r.head, r.status_addr, r.status, 0);
    }

    fn get_id(&mut self, r: Request) {
        let n = request::write_across(&self.mem, &r.data, &self.id);
        self.finish(r.head, Some(r.status), request::VIRTIO_BLK_S_OK, n as u32);
    }

    /// Host buffers of the request's data (checked in `request::parse`).
    fn iovecs(&self, r: &Request) -> Option<Iovecs> {
        let mut v = Vec::with_capacity(r.data.len());
        for &(addr, len) in &r.data {
            let slice = self.mem.get_slice(addr, len as usize).ok()?;
            v.push(libc::iovec {
                iov_base: slice.ptr_guard_mut().as_ptr().cast(),
                iov_len: len as usize,
            });
        }
        Some(Iovecs(v))
    }

    /// Starts a read, write or flush; returns false if it completed at once (an error).
    fn start(&mut self, r: Request) -> bool {
        let kind = match r.op {
            Op::Read => IoKind::Read,
            Op::Write => IoKind::Write,
            _ => IoKind::Flush,
        };
        let (Some(slot), Some(iovecs)) = (self.free.pop(), self.iovecs(&r)) else {
            self.finish(r.head, Some(r.status), request::VIRTIO_BLK_S_IOERR, 0);
            return false;
        };
        let op = IoOp {
            slot,
            kind,
            offset: r.offset,
            iovecs,
        };
        if let Err(e) = self.io.push(&op) {
            self.io_error(&e);
            self.free.push(slot);
            self.finish(r.head, Some(r.status), request::VIRTIO_BLK_S_IOERR, 0);
            return false;
        }
        self.inflight[slot as usize] = Some(InFlight { request: r, op });
        true
    }

    fn io_error(&mut self, e: &std::io::Error) {
        if !self.warned_io {
            self.warned_io = true;
            eprintln!("virtio-blk: disk I/O failed ({e}); the guest gets an I/O error (further ones only counted)");
        }
    }

    /// Takes every available request, re-checking after re-enabling notifications (event
    /// idx), starts their I/O in one batch, and signals for the ones answered at once.
    pub(super) fn serve_queue(&mut self) {
        let mut answered = false;
        let mut stall = StallGuard::new(0);
        loop {
            if self.health.needs_reset() || self.queue.disable_notification(&self.mem).is_err() {
                break;
            }
            let mut popped = 0;
            while let Some(chain) = self.queue.pop_descriptor_chain(&self.mem) {
                popped += 1;
                match request::parse(chain, &self.mem, self.shape) {
                    Err(refused) => {
                        self.refused(refused);
                        answered = true;
                    }
                    Ok(r) if r.op == Op::GetId => {
                        self.get_id(r);
                        answered = true;
                    }
                    Ok(r) => answered |= !self.start(r),
                }
            }
            if !self.queue.enable_notification(&self.mem).unwrap_or(false)
                || !stall.go_on(popped, &self.counters[0], &self.health)
            {
                break;
            }
        }
        if let Err(e) = self.io.submit() {
            self.io_error(&e);
        }
        if answered {
            self.maybe_signal();
        }
    }

    /// Completes what the host finished, with one interrupt for the batch.
    pub(super) fn complete(&mut self) {
        let mut done: Vec<Completion> = Vec::new();
        self.io.reap(&mut done);
        if done.is_empty() {
            return;
        }
        for c in done {
            let Some(InFlight { request: r, op }) = self
                .inflight
                .get_mut(c.slot as usize)
                .and_then(Option::take)
            else {
                continue;
            };
            self.free.push(op.slot);
            let ok = match (&c.result, r.op) {
                (Ok(_), Op::Flush) => true,
                (Ok(n), _) => *n as u64 == r.data_len,
                (Err(e), _) => {
                    self.io_error(e);
                    false
                }
            };
            let (status, len) = match (ok, r.op) {
                (true, Op::Read) => (request::VIRTIO_BLK_S_OK, r.data_len as u32),
                (true, _) => (request::VIRTIO_BLK_S_OK, 0),
                (false, _) => (request::VIRTIO_BLK_S_IOERR, 0),
            };
            self.finish(r.head, Some(r.status), status, len);
        }
        self.maybe_signal();
    }
}

impl MutEventSubscriber for BlockWorker {
    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        if events.fd() == self.notify.as_raw_fd() {
            if self.notify.read().is_ok() {
                QueueCounters::add(&self.counters[0].notifies, 1);
            }
            self.serve_queue();
        } else {
            self.complete();
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        let notify = ops.add(Events::new(&self.notify, EventSet::IN));
        let done = ops.add(Events::new(self.io.eventfd(), EventSet::IN));
        if let Err(e) = notify.and(done) {
            eprintln!("virtio-blk: cannot watch the queue: {e}");
        }
        self.serve_queue();
    }
}
