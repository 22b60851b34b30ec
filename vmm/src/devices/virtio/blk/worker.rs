//! The virtio-blk queue worker: takes requests off the ring, starts their I/O, and completes
//! them as the host finishes.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use virtio_queue::{DescriptorChain, QueueOwnedT};

use super::*;

impl BlockWorker {
    fn counter(&self) -> &QueueCounters {
        &self.counters[0]
    }

    /// Raises the queue's interrupt if the driver asked for one (event idx may say no).
    fn maybe_signal(&mut self) {
        if self
            .queue
            .needs_notification(self.mem.get())
            .unwrap_or(true)
        {
            if let Ok(true) = self.interrupt.signal_queue(0) {
                QueueCounters::add(&self.counters[0].interrupts, 1);
            }
        }
    }

    /// Puts a finished chain on the used ring with `status` at its status byte.
    pub(super) fn finish(
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
        self.dirty.completing(self.mem.get(), &self.queue, head);
        if self.queue.add_used(self.mem.get(), head, len).is_err() {
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

    /// A host buffer for a direct=on request whose guest buffers O_DIRECT cannot use, holding
    /// the data of a write.
    fn bounce(&self, r: &Request) -> Option<Bounce> {
        let align = self.direct?;
        if !matches!(r.op, Op::Read | Op::Write) || align.fits(&r.data) {
            return None;
        }
        let mut b = Bounce::new(r.data_len as usize);
        if r.op == Op::Write {
            request::read_into(&self.mem, &r.data, b.as_mut_slice());
        }
        QueueCounters::add(&self.stats.bounced, 1);
        Some(b)
    }

    /// Whether the request fits the in-flight budget (one request always does).
    fn fits_budget(&self, r: &Request) -> bool {
        self.inflight_bytes == 0 || self.inflight_bytes + r.data_len <= MAX_INFLIGHT_BYTES
    }

    /// Starts a read, write or flush; returns false if it completed at once (an error).
    fn start(&mut self, r: Request) -> bool {
        let kind = match r.op {
            Op::Read => IoKind::Read,
            Op::Write => IoKind::Write,
            _ => IoKind::Flush,
        };
        let mut bounce = self.bounce(&r);
        let iovecs = match bounce.as_mut() {
            Some(b) => Some(Iovecs(vec![libc::iovec {
                iov_base: b.ptr().cast(),
                iov_len: b.len(),
            }])),
            None => self.iovecs(&r),
        };
        let (Some(slot), Some(iovecs)) = (self.free.pop(), iovecs) else {
            self.finish(r.head, Some(r.status), request::VIRTIO_BLK_S_IOERR, 0);
            return false;
        };
        let write_through = kind == IoKind::Write && self.write_through.is_some();
        let durable = write_through && self.write_through == Some(WriteThrough::Dsync);
        let op = IoOp {
            slot,
            kind,
            offset: r.offset,
            iovecs,
            durable,
        };
        if let Err(e) = self.io.push(&op) {
            self.io_error(&e);
            self.free.push(slot);
            self.finish(r.head, Some(r.status), request::VIRTIO_BLK_S_IOERR, 0);
            return false;
        }
        let counter = match (kind, write_through) {
            (IoKind::Write, true) => Some(&self.stats.writes_durable),
            (IoKind::Write, false) => Some(&self.stats.writes_cached),
            (IoKind::Flush, _) => Some(&self.stats.flushes),
            (IoKind::Read, _) => None,
        };
        if let Some(counter) = counter {
            QueueCounters::add(counter, 1);
        }
        self.inflight_bytes += r.data_len;
        self.inflight[slot as usize] = Some(InFlight {
            request: r,
            op,
            bounce,
        });
        true
    }

    pub(super) fn io_error(&mut self, e: &std::io::Error) {
        if !self.warned_io {
            self.warned_io = true;
            eprintln!("virtio-blk: disk I/O failed ({e}); the guest gets an I/O error (further ones only counted)");
        }
    }

    /// Answers one chain, or starts its I/O; false if it must wait in the ring (the in-flight
    /// budget is spent). Sets `answered` when the chain completed at once.
    fn take(&mut self, chain: DescriptorChain<&GuestMemoryMmap>, answered: &mut bool) -> bool {
        let shape = DiskShape {
            capacity_bytes: self.capacity.load(Ordering::Acquire),
            ..self.shape
        };
        match request::parse(chain, &self.mem, shape) {
            Err(refused) => {
                if refused.too_long {
                    QueueCounters::add(&self.stats.too_long, 1);
                    self.health.log.log(|| {
                        format!(
                            "virtio-blk: a request has more than seg_max ({}) segments; it gets an I/O error",
                            request::SEG_MAX
                        )
                    });
                }
                self.refused(refused);
                *answered = true;
            }
            Ok(r) if r.op == Op::GetId => {
                self.get_id(r);
                *answered = true;
            }
            Ok(r) if !self.fits_budget(&r) => {
                self.queue.go_to_previous_position();
                QueueCounters::add(&self.stats.deferred, 1);
                self.deferred = true;
                return false;
            }
            Ok(r) => *answered |= !self.start(r),
        }
        true
    }

    /// Takes every available request, re-checking after re-enabling notifications (event
    /// idx), starts their I/O in one batch, and signals for the ones answered at once. Stops
    /// early where the in-flight budget is spent: the rest waits in the ring until requests
    /// complete.
    pub(super) fn serve_queue(&mut self) {
        let mut answered = false;
        let mut stall = StallGuard::new(0);
        self.deferred = false;
        // The chains borrow the map while `take` borrows self: a reference of its own.
        let mem = self.mem.current();
        'ring: loop {
            if self.health.needs_reset() || self.queue.disable_notification(&*mem).is_err() {
                break;
            }
            let mut popped = 0;
            while let Some(chain) = self.queue.pop_descriptor_chain(&*mem) {
                if !self.take(chain, &mut answered) {
                    break 'ring;
                }
                popped += 1;
            }
            if !self.queue.enable_notification(&*mem).unwrap_or(false)
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

    /// The request's status and used length for its completion.
    fn outcome(&mut self, c: &Completion, f: &InFlight) -> (u8, u32) {
        let r = &f.request;
        let ok = match (&c.result, r.op) {
            (Ok(_), Op::Flush) => true,
            (Ok(n), _) => *n as u64 == r.data_len,
            (Err(e), _) => {
                self.io_error(e);
                false
            }
        };
        match (ok, r.op) {
            (true, Op::Read) => {
                if let Some(b) = &f.bounce {
                    request::write_across(&self.mem, &r.data, b.as_slice());
                }
                (request::VIRTIO_BLK_S_OK, r.data_len as u32)
            }
            (true, _) => (request::VIRTIO_BLK_S_OK, 0),
            (false, _) => (request::VIRTIO_BLK_S_IOERR, 0),
        }
    }

    /// Completes what the host finished, with one interrupt for the batch, and takes the
    /// requests that waited for the in-flight budget.
    pub(super) fn complete(&mut self) {
        let mut done: Vec<Completion> = Vec::new();
        self.io.reap(&mut done);
        if done.is_empty() {
            return;
        }
        for c in done {
            if c.slot == group_sync::SYNC_SLOT {
                self.synced(&c);
                continue;
            }
            let Some(f) = self
                .inflight
                .get_mut(c.slot as usize)
                .and_then(Option::take)
            else {
                continue;
            };
            self.free.push(f.op.slot);
            self.inflight_bytes -= f.request.data_len;
            let (status, len) = self.outcome(&c, &f);
            if status == request::VIRTIO_BLK_S_OK && self.awaits_sync(&f.request) {
                self.group.waiting.push(f.request);
                continue;
            }
            self.finish(f.request.head, Some(f.request.status), status, len);
        }
        self.start_sync();
        self.maybe_signal();
        if self.deferred {
            self.serve_queue();
        }
    }
}

impl MutEventSubscriber for BlockWorker {
    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        self.mem.refresh();
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
        self.mem.refresh();
        self.serve_queue();
    }
}
