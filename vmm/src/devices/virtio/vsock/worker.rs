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
use super::{RX, TX};
use crate::devices::virtio::{
    serve_available, signal_used, ActiveQueue, DeviceHealth, MemoryView, QueueCounters,
    SharedGuestMemory, StallGuard, VirtioInterrupt, WritableChain,
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
    spare: Option<WritableChain>,
    buf: Vec<u8>,
    health: Arc<DeviceHealth>,
}

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
        rx: ActiveQueue,
        tx: ActiveQueue,
        muxer: Arc<Mutex<Muxer>>,
        mem: SharedGuestMemory,
        interrupt: Arc<dyn VirtioInterrupt>,
        counters: Arc<[QueueCounters]>,
        health: Arc<DeviceHealth>,
    ) -> Self {
        VsockWorker {
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
        }
    }

    fn counter(&self, q: u16) -> &QueueCounters {
        &self.counters[usize::from(q)]
    }

    fn signal(&mut self, q: u16) {
        let queue = if q == RX { &mut self.rx } else { &mut self.tx };
        let counters = &self.counters[usize::from(q)];
        signal_used(queue, self.mem.get(), self.interrupt.as_ref(), q, counters);
    }

    /// Hands every packet the guest queued to the muxer.
    fn serve_tx(&mut self) {
        let (mem, buf, muxer) = (self.mem.get(), &mut self.buf, &self.muxer);
        let counters = &self.counters[usize::from(TX)];
        let completed = serve_available((&mut self.tx, TX), mem, counters, &self.health, |chain| {
            let (h, len) = read_packet(chain, mem, buf)?;
            lock(muxer).guest_packet(&h, &buf[HDR_LEN..HDR_LEN + len]);
            Some(0)
        });
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
        for fd in [
            self.tx_notify.as_raw_fd(),
            self.rx_notify.as_raw_fd(),
            listener,
        ] {
            if let Err(e) = ops.add(Events::new_raw(fd, EventSet::IN)) {
                eprintln!("exitless: virtio-vsock cannot watch its fds: {e}");
            }
        }
        self.serve_tx();
        self.apply_fd_changes(ops);
        self.fill_rx();
        self.apply_fd_changes(ops);
    }
}
