//! The virtio-net queues' work on the event loop: the tap's frames into receive buffers, the
//! transmit queue's frames out to the tap.
//!
//! Neither direction loses a frame for want of room. A frame that finds no receive buffer is
//! held (one, read from the tap) while the tap is no longer read, so the rest wait in the
//! tap's own queue; the guest is asked to notify the receive queue when it posts buffers
//! (event idx: the available index to notify at), and that notification resumes reading. A
//! frame the tap cannot take yet (`EAGAIN`) is held with its chain, unused, and sent when the
//! tap becomes writable; no further transmit chain is taken meanwhile.

mod rx;
mod tx;

use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use virtio_queue::{Queue, QueueT};
use vmm_sys_util::eventfd::EventFd;

use super::tap::Tap;
use super::{NetCounters, RX, TX};
use crate::devices::virtio::running::QuiesceWorker;
use crate::devices::virtio::{
    signal_used, ActiveQueue, DeviceDirtyLog, DeviceHealth, MemoryView, QueueCounters,
    SharedGuestMemory, VirtioInterrupt, WritableChain,
};
pub use tx::gather;

/// The largest frame with its header: 64 KiB of segmentation-offloaded payload plus headers.
pub const MAX_FRAME: usize = super::tap::VNET_HDR_LEN + 65_550;
/// Frames read from the tap per event before the loop serves anything else.
const RX_BATCH: usize = 64;

pub(super) struct NetWorker {
    rx: Queue,
    rx_notify: Arc<EventFd>,
    tx: Queue,
    tx_notify: Arc<EventFd>,
    tap: Arc<Tap>,
    /// Refreshed at each event (memory may have been hot-added).
    mem: MemoryView,
    interrupt: Arc<dyn VirtioInterrupt>,
    counters: Arc<[QueueCounters]>,
    net: Arc<NetCounters>,
    mrg_rxbuf: bool,
    /// Receive chains taken for the next frames (at most a queue's worth), in the order taken:
    /// a malformed one (Err(head)) is used, empty, when it reaches the front, so chains are
    /// used in the order they were taken and the held ones are always the last taken (a
    /// snapshot gives them back by moving the ring's next index back over them).
    spare: std::collections::VecDeque<Result<WritableChain, u16>>,
    /// A snapshot is being taken: frames the tap gives are dropped, nothing is written to
    /// the receive queue (see [`NetWorker::quiesce`]).
    quiesced: bool,
    /// The frame being received (header first).
    rx_frame: Vec<u8>,
    /// The length of the frame in `rx_frame` that waits for receive buffers: while there is
    /// one the tap is not read.
    rx_held: Option<usize>,
    /// The frame being sent (header first).
    tx_frame: Vec<u8>,
    /// The transmit chain (head, frame length in `tx_frame`) the tap could not take yet.
    tx_held: Option<(u16, usize)>,
    /// What the event loop watches the tap for now (None: not watched).
    tap_events: Option<EventSet>,
    /// The tap reported an error or hang-up (its interface went away): no longer watched,
    /// which would wake the loop for ever.
    tap_broken: bool,
    warned: bool,
    health: Arc<DeviceHealth>,
    /// Told of each completion before it is used (see [`DeviceDirtyLog::completing`]).
    dirty: Arc<DeviceDirtyLog>,
}

fn add(counter: &AtomicU64, n: u64) {
    QueueCounters::add(counter, n);
}

impl NetWorker {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        rx: ActiveQueue,
        tx: ActiveQueue,
        tap: Arc<Tap>,
        mem: SharedGuestMemory,
        interrupt: Arc<dyn VirtioInterrupt>,
        counters: Arc<[QueueCounters]>,
        net: Arc<NetCounters>,
        mrg_rxbuf: bool,
        (health, dirty): (Arc<DeviceHealth>, Arc<DeviceDirtyLog>),
    ) -> Self {
        NetWorker {
            rx: rx.queue,
            rx_notify: rx.notify,
            tx: tx.queue,
            tx_notify: tx.notify,
            tap,
            mem: MemoryView::new(mem),
            interrupt,
            counters,
            net,
            mrg_rxbuf,
            spare: Default::default(),
            quiesced: false,
            rx_frame: vec![0; MAX_FRAME],
            rx_held: None,
            tx_frame: vec![0; MAX_FRAME],
            tx_held: None,
            tap_events: None,
            tap_broken: false,
            warned: false,
            health,
            dirty,
        }
    }

    fn warn_once(&mut self, what: std::fmt::Arguments) {
        if !self.warned {
            self.warned = true;
            eprintln!(
                "exitless: virtio-net on {}: {what} (counted; said once)",
                self.tap.name()
            );
        }
    }

    /// Raises queue `q`'s interrupt if the driver asked for one.
    fn signal(&mut self, q: u16) {
        let queue = if q == RX { &mut self.rx } else { &mut self.tx };
        let counters = &self.counters[usize::from(q)];
        signal_used(queue, self.mem.get(), self.interrupt.as_ref(), q, counters);
    }

    /// A live migration asked to let go of the tap ([`Tap::ask_release`]): out of epoll,
    /// while its file is still open, before the migration closes it.
    pub(super) fn unwatch_tap(&mut self, ops: &mut EventOps) {
        if !self.tap.watched() {
            return;
        }
        if self.tap_events.take().is_some() {
            let _ = ops.remove(Events::empty_raw(self.tap.as_raw_fd()));
        }
        self.tap.unwatch();
    }

    /// Wakes the loop for this worker ([`NetWorker::unwatch_tap`] and
    /// [`NetWorker::watch_tap`] then run).
    pub(super) fn wake(&self) {
        let _ = self.rx_notify.write(1);
    }

    /// Watches the tap for what the queues wait for: readable unless a received frame waits
    /// for buffers, writable while a transmitted frame waits for the tap.
    fn watch_tap(&mut self, ops: &mut EventOps) {
        let mut want = EventSet::empty();
        if self.rx_held.is_none() {
            want |= EventSet::IN;
        }
        if self.tx_held.is_some() {
            want |= EventSet::OUT;
        }
        if self.tap_broken || self.tap.handed_over() {
            want = EventSet::empty();
        }
        if self.tap_events == Some(want) || (self.tap_events.is_none() && want.is_empty()) {
            return;
        }
        let fd = self.tap.as_raw_fd();
        let done = match self.tap_events {
            _ if want.is_empty() => ops.remove(Events::empty_raw(fd)),
            None => ops.add(Events::new_raw(fd, want)),
            Some(_) => ops.modify(Events::new_raw(fd, want)),
        };
        match done {
            Ok(()) => self.tap_events = (!want.is_empty()).then_some(want),
            Err(e) => self.warn_once(format_args!("cannot watch the tap: {e}")),
        }
    }
}

impl QuiesceWorker for NetWorker {
    /// For a snapshot (vCPUs parked): stops writing the receive queue until
    /// [`QuiesceWorker::unquiesce`] (frames the tap gives meanwhile, and the one waiting for
    /// buffers, are dropped and counted, as frames in flight) and gives back the receive
    /// chains held for the next frames: they were the last taken off the ring and none after
    /// them was used, so the ring's next index goes back over them and the device (or the
    /// one restored from the used ring) takes them again. Err if a chain taken is still
    /// neither used nor given back.
    fn quiesce(&mut self) -> Result<(), String> {
        self.quiesced = true;
        if self.rx_held.take().is_some() {
            add(&self.net.rx_dropped, 1);
        }
        let held = u16::try_from(self.spare.len()).unwrap_or(u16::MAX);
        let next = self.rx.next_avail().wrapping_sub(held);
        self.rx.set_next_avail(next);
        self.spare.clear();
        let used = self.rx.next_used();
        if next != used {
            return Err(format!(
                "queue {RX} holds {} receive buffers it took and did not use",
                next.wrapping_sub(used)
            ));
        }
        Ok(())
    }

    /// The snapshot is over: frames go to the guest again. The loop is woken (through the
    /// receive queue's notifier) to read the tap again and take the chains given back.
    fn unquiesce(&mut self) {
        self.quiesced = false;
        let _ = self.rx_notify.write(1);
    }
}

impl MutEventSubscriber for NetWorker {
    fn process(&mut self, events: Events, ops: &mut EventOps) {
        self.mem.refresh();
        self.unwatch_tap(ops);
        let fd = events.fd();
        if fd == self.tap.as_raw_fd() {
            let ready = events.event_set();
            if !ready.intersects(EventSet::IN | EventSet::OUT) {
                // EPOLLERR or EPOLLHUP alone: reported whatever is asked, level-triggered.
                self.tap_broken = true;
                self.warn_once(format_args!(
                    "the tap reports an error; it is no longer read"
                ));
            }
            if ready.contains(EventSet::OUT) || self.tap_broken {
                self.serve_tx();
            }
            if ready.contains(EventSet::IN) {
                self.serve_rx();
            }
        } else if fd == self.tx_notify.as_raw_fd() {
            if self.tx_notify.read().is_ok() {
                add(&self.counters[usize::from(TX)].notifies, 1);
            }
            self.serve_tx();
        } else if fd == self.rx_notify.as_raw_fd() {
            // New receive buffers: the frame waiting for them, then the tap.
            if self.rx_notify.read().is_ok() {
                add(&self.counters[usize::from(RX)].notifies, 1);
            }
            self.serve_rx();
        }
        self.watch_tap(ops);
    }

    fn init(&mut self, ops: &mut EventOps) {
        for fd in [self.tx_notify.as_raw_fd(), self.rx_notify.as_raw_fd()] {
            if let Err(e) = ops.add(Events::new_raw(fd, EventSet::IN)) {
                eprintln!("exitless: virtio-net cannot watch its fds: {e}");
            }
        }
        self.mem.refresh();
        // Receive buffers need no kick while frames find them: a frame takes them when it
        // comes. The guest is asked for one only when a frame waits for buffers.
        let _ = self.rx.disable_notification(self.mem.get());
        self.serve_tx();
        self.serve_rx();
        self.watch_tap(ops);
    }
}
