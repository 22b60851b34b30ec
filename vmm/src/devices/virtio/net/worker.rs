//! The virtio-net queues' work on the event loop: the tap's frames into receive buffers, the
//! transmit queue's frames out to the tap.

use std::collections::VecDeque;
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::tap::{Tap, VNET_HDR_LEN};
use super::{NetCounters, RX, TX};
use crate::devices::virtio::{
    serve_available, signal_used, ActiveQueue, DeviceHealth, MemoryView, QueueCounters,
    SharedGuestMemory, VirtioInterrupt, WritableChain,
};

/// The largest frame with its header: 64 KiB of segmentation-offloaded payload plus headers.
pub const MAX_FRAME: usize = VNET_HDR_LEN + 65_550;
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
    spare: VecDeque<Result<WritableChain, u16>>,
    /// A snapshot is being taken: frames the tap gives are dropped, nothing is written to
    /// the receive queue (see [`NetWorker::quiesce`]).
    quiesced: bool,
    frame: Vec<u8>,
    warned: bool,
    health: Arc<DeviceHealth>,
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
        health: Arc<DeviceHealth>,
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
            spare: VecDeque::new(),
            quiesced: false,
            frame: vec![0; MAX_FRAME],
            warned: false,
            health,
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

    /// Sends every frame the driver queued; each chain is completed whether the tap took its
    /// frame or not (a NIC transmits into the void when the link is down).
    fn serve_tx(&mut self) {
        let (mem, frame) = (self.mem.get(), &mut self.frame);
        let (tap, net) = (&self.tap, &self.net);
        let mut refused = None;
        let completed = serve_available(
            (&mut self.tx, TX),
            mem,
            &self.counters[usize::from(TX)],
            &self.health,
            |chain| {
                let len = gather(chain, mem, frame)?;
                if let Err(e) = send(tap, net, &frame[..len]) {
                    refused = Some(e);
                }
                Some(0)
            },
        );
        if let Some(e) = refused {
            self.warn_once(format_args!("the tap refused a frame: {e}"));
        }
        if completed {
            self.signal(TX);
        }
    }

    /// Reads what the tap has (a batch at most) into the guest's receive buffers.
    fn serve_rx(&mut self) {
        let mut delivered = false;
        for _ in 0..RX_BATCH {
            let n = match self.tap.read_frame(&mut self.frame) {
                Ok(n) if n >= VNET_HDR_LEN => n,
                Ok(_) => continue,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => {
                    self.warn_once(format_args!("cannot read the tap: {e}"));
                    break;
                }
            };
            if self.quiesced {
                add(&self.net.rx_dropped, 1);
            } else if self.deliver(n) {
                delivered = true;
                add(&self.net.rx_frames, 1);
                add(&self.net.rx_bytes, (n - VNET_HDR_LEN) as u64);
            } else {
                add(&self.net.rx_dropped, 1);
            }
        }
        if delivered {
            self.signal(RX);
        }
    }

    /// Completes a malformed receive chain empty, counted.
    fn use_malformed(&mut self, head: u16) {
        add(&self.counters[usize::from(RX)].malformed, 1);
        if self.rx.add_used(self.mem.get(), head, 0).is_ok() {
            add(&self.counters[usize::from(RX)].completed, 1);
        }
    }

    /// Takes receive chains off the ring until the spare ones hold `need` bytes (or the first
    /// one does, without merged buffers); false if the ring runs out first.
    fn gather_rx(&mut self, need: usize) -> bool {
        let enough = |spare: &VecDeque<Result<WritableChain, u16>>, mrg: bool| {
            if mrg {
                let room = spare.iter().flatten().map(|c| c.capacity);
                room.sum::<usize>() >= need
            } else {
                spare
                    .front()
                    .is_some_and(|c| c.as_ref().is_ok_and(|c| c.capacity >= need))
            }
        };
        loop {
            while let Some(&Err(head)) = self.spare.front() {
                self.spare.pop_front();
                self.use_malformed(head);
            }
            if enough(&self.spare, self.mrg_rxbuf) {
                return true;
            }
            if !self.mrg_rxbuf && !self.spare.is_empty() {
                return false; // the first chain is too small for this frame
            }
            let Some(chain) = self.rx.pop_descriptor_chain(self.mem.get()) else {
                return false;
            };
            let head = chain.head_index();
            let max = usize::from(super::QUEUE_SIZE);
            let taken = WritableChain::take(chain, &self.mem, max, VNET_HDR_LEN);
            self.spare.push_back(taken.ok_or(head));
        }
    }

    /// For a snapshot (vCPUs parked): stops writing the receive queue until
    /// [`NetWorker::unquiesce`] (frames the tap gives meanwhile are dropped and counted, as
    /// frames in flight) and gives back the receive chains held for the next frames: they
    /// were the last taken off the ring and none after them was used, so the ring's next
    /// index goes back over them and the device (or the one restored from the used ring)
    /// takes them again. Err if a chain taken is still neither used nor given back.
    pub(super) fn quiesce(&mut self) -> Result<(), String> {
        self.quiesced = true;
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

    /// The snapshot is over: frames go to the guest again.
    pub(super) fn unquiesce(&mut self) {
        self.quiesced = false;
    }

    /// Copies the `n`-byte frame (header first) into receive chains; false if they lack room.
    fn deliver(&mut self, n: usize) -> bool {
        if !self.gather_rx(n) {
            return false;
        }
        let mut chains = Vec::new();
        let mut room = 0;
        while room < n {
            let c = self.spare.pop_front().expect("gather_rx found room");
            room += c.as_ref().map_or(0, |c| c.capacity);
            chains.push(c);
        }
        // num_buffers, the header's last field: how many chains the frame takes.
        let count = chains.iter().filter(|c| c.is_ok()).count();
        let count = u16::try_from(count).unwrap_or(u16::MAX);
        self.frame[VNET_HDR_LEN - 2..VNET_HDR_LEN].copy_from_slice(&count.to_le_bytes());
        let mut done = 0;
        for c in chains {
            let c = match c {
                Ok(c) => c,
                Err(head) => {
                    self.use_malformed(head);
                    continue;
                }
            };
            let written = c.fill(&self.mem, &self.frame[done..n]);
            done += written;
            if self
                .rx
                .add_used(self.mem.get(), c.head, written as u32)
                .is_err()
            {
                add(&self.counters[usize::from(RX)].malformed, 1);
            }
            add(&self.counters[usize::from(RX)].completed, 1);
        }
        true
    }
}

/// Writes one frame (header first) to the tap, counting it or its failure.
fn send(tap: &Tap, net: &NetCounters, frame: &[u8]) -> std::io::Result<()> {
    match tap.write_frame(frame) {
        Ok(_) => {
            add(&net.tx_frames, 1);
            add(&net.tx_bytes, (frame.len() - VNET_HDR_LEN) as u64);
            Ok(())
        }
        Err(e) => {
            add(&net.tx_errors, 1);
            Err(e)
        }
    }
}

/// Copies a transmit chain's readable buffers into `frame`; its length, or None for a chain
/// shorter than the header, longer than `MAX_FRAME`, with a writable buffer, or outside
/// guest memory.
pub fn gather(
    chain: virtio_queue::DescriptorChain<&GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
    frame: &mut [u8],
) -> Option<usize> {
    let mut len = 0usize;
    for desc in chain {
        if desc.is_write_only() {
            return None;
        }
        let n = desc.len() as usize;
        let end = len.checked_add(n).filter(|&e| e <= frame.len())?;
        mem.read_slice(&mut frame[len..end], desc.addr()).ok()?;
        len = end;
    }
    (len >= VNET_HDR_LEN).then_some(len)
}

impl MutEventSubscriber for NetWorker {
    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        self.mem.refresh();
        let fd = events.fd();
        if fd == self.tap.as_raw_fd() {
            self.serve_rx();
        } else if fd == self.tx_notify.as_raw_fd() {
            if self.tx_notify.read().is_ok() {
                add(&self.counters[usize::from(TX)].notifies, 1);
            }
            self.serve_tx();
        } else if fd == self.rx_notify.as_raw_fd() && self.rx_notify.read().is_ok() {
            // New receive buffers: taken when the next frame comes.
            add(&self.counters[usize::from(RX)].notifies, 1);
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        for fd in [
            self.tap.as_raw_fd(),
            self.tx_notify.as_raw_fd(),
            self.rx_notify.as_raw_fd(),
        ] {
            if let Err(e) = ops.add(Events::new_raw(fd, EventSet::IN)) {
                eprintln!("exitless: virtio-net cannot watch its fds: {e}");
            }
        }
        self.mem.refresh();
        // Receive buffers need no kick: a frame takes them when it comes.
        let _ = self.rx.disable_notification(self.mem.get());
        self.serve_tx();
        self.serve_rx();
    }
}
