//! The vsock queues' work on the event loop: the guest's packets from the transmit queue to
//! the muxer, the muxer's packets into receive buffers, host socket events to the muxer.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{Bytes, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::muxer::{FdChange, Muxer};
use super::packet::{Header, HDR_LEN, MAX_PAYLOAD};
use super::{EVENT, RX, TX};
use crate::devices::virtio::running::QuiesceWorker;
use crate::devices::virtio::{
    serve_available, signal_used, ActiveQueue, DeviceDirtyLog, DeviceHealth, MemoryView,
    QueueCounters, SharedGuestMemory, StallGuard, VirtioInterrupt, WritableChain,
};

pub(super) struct VsockWorker {
    rx: Queue,
    rx_notify: Arc<EventFd>,
    tx: Queue,
    tx_notify: Arc<EventFd>,
    muxer: Arc<Mutex<Muxer>>,
    /// Refreshed at each event (memory may have been hot-added).
    mem: MemoryView,
    interrupt: Arc<dyn VirtioInterrupt>,
    counters: Arc<[QueueCounters]>,
    /// The event queue, where only a transport reset is ever sent (after a restore).
    event: Option<(Queue, Arc<EventFd>)>,
    /// A transport reset is owed to the guest (the device was restored from a snapshot): sent
    /// once the driver has an event buffer there.
    reset_pending: bool,
    /// The receive chain taken and not used (the last taken off the ring: nothing after it
    /// was used).
    spare: Option<WritableChain>,
    /// A snapshot is being taken: nothing is written to the receive queue (see
    /// [`VsockWorker::quiesce`]).
    quiesced: bool,
    buf: Vec<u8>,
    health: Arc<DeviceHealth>,
    dirty: Arc<DeviceDirtyLog>,
}

/// `VIRTIO_VSOCK_EVENT_TRANSPORT_RESET` (virtio 1.2, 5.10.6.7): the device's connections
/// are gone and the guest's CID may have changed; `struct virtio_vsock_event` is its le32 id.
const EVENT_TRANSPORT_RESET: u32 = 0;

fn lock(m: &Mutex<Muxer>) -> MutexGuard<'_, Muxer> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A transmit chain's header and the length of the payload it holds (at most the header's
/// `len`; the muxer resets a packet whose payload falls short), or None for a chain without
/// a whole header, longer than a header and `MAX_PAYLOAD`, or outside guest memory.
fn read_packet(
    chain: DescriptorChain<&GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
    buf: &mut Vec<u8>,
) -> Option<(Header, usize)> {
    buf.clear();
    for desc in chain {
        if desc.is_write_only() {
            return None;
        }
        let start = buf.len();
        let n = desc.len() as usize;
        if start + n > HDR_LEN + MAX_PAYLOAD as usize {
            return None;
        }
        buf.resize(start + n, 0);
        mem.read_slice(&mut buf[start..], desc.addr()).ok()?;
    }
    let hdr: &[u8; HDR_LEN] = buf.get(..HDR_LEN)?.try_into().ok()?;
    let h = Header::parse(hdr);
    let payload = (buf.len() - HDR_LEN).min(h.len as usize);
    Some((h, payload))
}

impl VsockWorker {
    pub(super) fn new(
        (rx, tx, event): (ActiveQueue, ActiveQueue, Option<ActiveQueue>),
        muxer: Arc<Mutex<Muxer>>,
        mem: SharedGuestMemory,
        interrupt: Arc<dyn VirtioInterrupt>,
        counters: Arc<[QueueCounters]>,
        (health, dirty): (Arc<DeviceHealth>, Arc<DeviceDirtyLog>),
        reset_pending: bool,
    ) -> Self {
        VsockWorker {
            event: event.map(|q| (q.queue, q.notify)),
            reset_pending,
            quiesced: false,
            rx: rx.queue,
            rx_notify: rx.notify,
            tx: tx.queue,
            tx_notify: tx.notify,
            muxer,
            mem: MemoryView::new(mem),
            interrupt,
            counters,
            spare: None,
            buf: Vec::with_capacity(HDR_LEN + MAX_PAYLOAD as usize),
            health,
            dirty,
        }
    }

    fn counter(&self, q: u16) -> &QueueCounters {
        &self.counters[usize::from(q)]
    }

    fn signal(&mut self, q: u16) {
        let queue = match (q, &mut self.event) {
            (RX, _) => &mut self.rx,
            (EVENT, Some((event, _))) => event,
            _ => &mut self.tx,
        };
        let counters = &self.counters[usize::from(q)];
        signal_used(queue, self.mem.get(), self.interrupt.as_ref(), q, counters);
    }

    /// Sends the transport reset a restore owes the guest, once the driver has given an event
    /// buffer (a malformed one is completed empty and counted).
    fn send_reset(&mut self) {
        let Some((event, _)) = self.event.as_mut().filter(|_| self.reset_pending) else {
            return;
        };
        let mem = self.mem.get();
        let counters = &self.counters[usize::from(EVENT)];
        while let Some(chain) = event.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            let taken = WritableChain::take(chain, mem, 4, 4);
            let len = taken.map_or(0, |c| c.fill(mem, &EVENT_TRANSPORT_RESET.to_le_bytes()));
            self.dirty.completing(mem, event, head);
            let _ = event.add_used(mem, head, len as u32);
            QueueCounters::add(&counters.completed, 1);
            if len == 0 {
                QueueCounters::add(&counters.malformed, 1);
                continue;
            }
            self.reset_pending = false;
            self.signal(EVENT);
            return;
        }
    }

    /// Hands every packet the guest queued to the muxer.
    fn serve_tx(&mut self) {
        let (mem, buf, muxer) = (self.mem.get(), &mut self.buf, &self.muxer);
        let counters = &self.counters[usize::from(TX)];
        let dirty = &self.dirty;
        let completed = serve_available(
            (&mut self.tx, TX),
            mem,
            (counters, &self.health, dirty),
            |chain| {
                let (h, len) = read_packet(chain, mem, buf)?;
                lock(muxer).guest_packet(&h, &buf[HDR_LEN..HDR_LEN + len]);
                Some(0)
            },
        );
        if completed {
            self.signal(TX);
        }
    }

    /// A receive chain: the one held back, or the next on the ring. With none, the guest is
    /// asked to notify when it adds one (re-checked, as it may have just added one), under a
    /// [`StallGuard`]: a ring that announces chains it cannot hand out is broken.
    fn take_rx_chain(&mut self) -> Option<WritableChain> {
        if let Some(c) = self.spare.take() {
            return Some(c);
        }
        let mut stall = StallGuard::new(RX);
        loop {
            if self.health.needs_reset() {
                return None;
            }
            let mut popped = 0;
            while let Some(chain) = self.rx.pop_descriptor_chain(self.mem.get()) {
                popped += 1;
                let head = chain.head_index();
                if let Some(c) = WritableChain::take(chain, &self.mem, 64, HDR_LEN) {
                    let _ = self.rx.disable_notification(self.mem.get());
                    return Some(c);
                }
                QueueCounters::add(&self.counter(RX).malformed, 1);
                self.dirty.completing(self.mem.get(), &self.rx, head);
                let _ = self.rx.add_used(self.mem.get(), head, 0);
            }
            if !self.rx.enable_notification(self.mem.get()).unwrap_or(false)
                || !stall.go_on(popped, &self.counters[usize::from(RX)], &self.health)
            {
                return None;
            }
        }
    }

    /// Moves the muxer's packets into receive buffers while both last.
    fn fill_rx(&mut self) {
        if self.quiesced {
            return;
        }
        let mut delivered = false;
        while lock(&self.muxer).has_rx() {
            let Some(chain) = self.take_rx_chain() else {
                break;
            };
            let room = chain.capacity.min(HDR_LEN + MAX_PAYLOAD as usize);
            self.buf.resize(room, 0);
            let Some(n) = lock(&self.muxer).next_rx(&mut self.buf[..room]) else {
                self.spare = Some(chain);
                break;
            };
            chain.fill(&self.mem, &self.buf[..n]);
            self.dirty.completing(self.mem.get(), &self.rx, chain.head);
            if self
                .rx
                .add_used(self.mem.get(), chain.head, n as u32)
                .is_err()
            {
                QueueCounters::add(&self.counter(RX).malformed, 1);
            }
            QueueCounters::add(&self.counter(RX).completed, 1);
            delivered = true;
        }
        if delivered {
            self.signal(RX);
        }
    }

    /// Wakes the loop for this worker (a listener let go of or taken back is then
    /// unwatched or watched).
    pub(super) fn wake(&self) {
        let _ = self.rx_notify.write(1);
    }

    fn apply_fd_changes(&mut self, ops: &mut EventOps) {
        let (changes, closing) = lock(&self.muxer).take_fd_changes();
        let watched = EventSet::IN | EventSet::OUT | EventSet::EDGE_TRIGGERED;
        for change in changes {
            let _ = match change {
                FdChange::Watch(fd) => ops.add(Events::new_raw(fd, watched)),
                FdChange::Forget(fd) => ops.remove(Events::new_raw(fd, watched)),
            };
        }
        drop(closing); // now that their fds are out of epoll
    }

    fn host_event(&mut self, fd: RawFd, set: EventSet) {
        let mut m = lock(&self.muxer);
        if fd == m.listener_fd() {
            m.accept();
        } else {
            let readable = set.intersects(EventSet::IN | EventSet::HANG_UP | EventSet::ERROR);
            m.host_event(fd, readable, set.contains(EventSet::OUT));
        }
    }
}

impl QuiesceWorker for VsockWorker {
    /// For a snapshot (vCPUs parked): stops writing the receive queue until
    /// [`QuiesceWorker::unquiesce`] (what host programs send meanwhile waits in the muxer) and
    /// gives back the receive chain held for the next packet: it was the last taken off the
    /// ring and none after it was used, so the ring's next index goes back over it. Err if a
    /// chain is still held, or a transport reset the guest was owed has not reached it.
    fn quiesce(&mut self) -> Result<(), String> {
        self.quiesced = true;
        if self.spare.take().is_some() {
            let next = self.rx.next_avail().wrapping_sub(1);
            self.rx.set_next_avail(next);
        }
        let (next, used) = (self.rx.next_avail(), self.rx.next_used());
        if next != used {
            return Err(format!(
                "queue {RX} holds {} receive buffers it took and did not use",
                next.wrapping_sub(used)
            ));
        }
        if self.reset_pending {
            return Err(
                "the transport reset its restore owes the guest has not reached it \
                        (the driver has given no event buffer)"
                    .into(),
            );
        }
        Ok(())
    }

    /// The snapshot is over: packets go to the guest again (a pass of the worker is asked
    /// for: what came meanwhile waits in the muxer).
    fn unquiesce(&mut self) {
        self.quiesced = false;
        let _ = self.rx_notify.write(1);
    }
}

impl MutEventSubscriber for VsockWorker {
    fn process(&mut self, events: Events, ops: &mut EventOps) {
        self.mem.refresh();
        let fd = events.fd();
        if fd == self.tx_notify.as_raw_fd() {
            if self.tx_notify.read().is_ok() {
                QueueCounters::add(&self.counter(TX).notifies, 1);
            }
            self.serve_tx();
        } else if fd == self.rx_notify.as_raw_fd() {
            if self.rx_notify.read().is_ok() {
                QueueCounters::add(&self.counter(RX).notifies, 1);
            }
        } else if let Some((_, notify)) = self.event.as_ref().filter(|e| e.1.as_raw_fd() == fd) {
            if notify.read().is_ok() {
                QueueCounters::add(&self.counter(EVENT).notifies, 1);
            }
            self.send_reset();
        } else {
            self.host_event(fd, events.event_set());
        }
        self.apply_fd_changes(ops);
        self.fill_rx();
        // Receiving may have closed connections (their fds leave the watch list).
        self.apply_fd_changes(ops);
    }

    fn init(&mut self, ops: &mut EventOps) {
        self.mem.refresh();
        let listener = lock(&self.muxer).listener_fd();
        let event = self.event.as_ref().map(|e| e.1.as_raw_fd());
        let fds = [
            self.tx_notify.as_raw_fd(),
            self.rx_notify.as_raw_fd(),
            listener,
        ];
        for fd in fds.into_iter().chain(event) {
            if let Err(e) = ops.add(Events::new_raw(fd, EventSet::IN)) {
                eprintln!("exitless: virtio-vsock cannot watch its fds: {e}");
            }
        }
        self.send_reset();
        self.serve_tx();
        self.apply_fd_changes(ops);
        self.fill_rx();
        self.apply_fd_changes(ops);
    }
}
