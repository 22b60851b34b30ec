//! The virtio-net queues' work on the event loop: the tap's frames into receive buffers, the
//! transmit queue's frames out to the tap.

use std::collections::VecDeque;
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::tap::{Tap, VNET_HDR_LEN};
use super::{NetCounters, RX, TX};
use crate::devices::virtio::{ActiveQueue, QueueCounters, StallGuard, VirtioInterrupt};

/// The largest frame with its header: 64 KiB of segmentation-offloaded payload plus headers.
pub const MAX_FRAME: usize = VNET_HDR_LEN + 65_550;
/// Frames read from the tap per event before the loop serves anything else.
const RX_BATCH: usize = 64;

/// A receive chain taken off the ring and not yet filled.
#[derive(Debug)]
struct RxChain {
    head: u16,
    buffers: Vec<(GuestAddress, u32)>,
    capacity: usize,
}

pub(super) struct NetWorker {
    rx: Queue,
    rx_notify: EventFd,
    tx: Queue,
    tx_notify: EventFd,
    tap: Arc<Tap>,
    mem: GuestMemoryMmap,
    interrupt: Arc<dyn VirtioInterrupt>,
    counters: Arc<[QueueCounters]>,
    net: Arc<NetCounters>,
    mrg_rxbuf: bool,
    /// Receive chains held for the next frames (at most a queue's worth).
    spare: VecDeque<RxChain>,
    frame: Vec<u8>,
    warned: bool,
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
        mem: GuestMemoryMmap,
        interrupt: Arc<dyn VirtioInterrupt>,
        counters: Arc<[QueueCounters]>,
        net: Arc<NetCounters>,
        mrg_rxbuf: bool,
    ) -> Self {
        NetWorker {
            rx: rx.queue,
            rx_notify: rx.notify,
            tx: tx.queue,
            tx_notify: tx.notify,
            tap,
            mem,
            interrupt,
            counters,
            net,
            mrg_rxbuf,
            spare: VecDeque::new(),
            frame: vec![0; MAX_FRAME],
            warned: false,
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
        if queue.needs_notification(&self.mem).unwrap_or(true)
            && matches!(self.interrupt.signal_queue(q), Ok(true))
        {
            add(&self.counters[usize::from(q)].interrupts, 1);
        }
    }

    /// Sends every frame the driver queued; each chain is completed whether the tap took its
    /// frame or not (a NIC transmits into the void when the link is down).
    fn serve_tx(&mut self) {
        let mut stall = StallGuard::default();
        let mut completed = false;
        loop {
            if self.tx.disable_notification(&self.mem).is_err() {
                break;
            }
            let mut popped = 0;
            while let Some(chain) = self.tx.pop_descriptor_chain(&self.mem) {
                popped += 1;
                let head = chain.head_index();
                match gather(chain, &self.mem, &mut self.frame) {
                    Some(len) => self.send(len),
                    None => add(&self.counters[usize::from(TX)].malformed, 1),
                }
                if self.tx.add_used(&self.mem, head, 0).is_err() {
                    add(&self.counters[usize::from(TX)].malformed, 1);
                }
                add(&self.counters[usize::from(TX)].completed, 1);
                completed = true;
            }
            if !self.tx.enable_notification(&self.mem).unwrap_or(false)
                || !stall.go_on(popped, &self.counters[usize::from(TX)])
            {
                break;
            }
        }
        if completed {
            self.signal(TX);
        }
    }

    fn send(&mut self, len: usize) {
        match self.tap.write_frame(&self.frame[..len]) {
            Ok(_) => {
                add(&self.net.tx_frames, 1);
                add(&self.net.tx_bytes, (len - VNET_HDR_LEN) as u64);
            }
            Err(e) => {
                add(&self.net.tx_errors, 1);
                self.warn_once(format_args!("the tap refused a frame: {e}"));
            }
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
            if self.deliver(n) {
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

    /// Takes receive chains off the ring until the spare ones hold `need` bytes (or the first
    /// one does, without merged buffers); false if the ring runs out first.
    fn gather_rx(&mut self, need: usize) -> bool {
        let enough = |spare: &VecDeque<RxChain>, mrg: bool| {
            if mrg {
                spare.iter().map(|c| c.capacity).sum::<usize>() >= need
            } else {
                spare.front().is_some_and(|c| c.capacity >= need)
            }
        };
        while !enough(&self.spare, self.mrg_rxbuf) {
            if !self.mrg_rxbuf && !self.spare.is_empty() {
                return false; // the first chain is too small for this frame
            }
            let Some(chain) = self.rx.pop_descriptor_chain(&self.mem) else {
                return false;
            };
            let head = chain.head_index();
            match rx_chain(chain, &self.mem) {
                Some(c) => self.spare.push_back(c),
                None => {
                    add(&self.counters[usize::from(RX)].malformed, 1);
                    if self.rx.add_used(&self.mem, head, 0).is_ok() {
                        add(&self.counters[usize::from(RX)].completed, 1);
                    }
                }
            }
        }
        true
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
            room += c.capacity;
            chains.push(c);
        }
        // num_buffers, the header's last field: how many chains the frame takes.
        let count = u16::try_from(chains.len()).unwrap_or(u16::MAX);
        self.frame[VNET_HDR_LEN - 2..VNET_HDR_LEN].copy_from_slice(&count.to_le_bytes());
        let mut done = 0;
        for c in chains {
            let start = done;
            for (addr, len) in c.buffers {
                let take = (len as usize).min(n - done);
                if take == 0 {
                    break;
                }
                // The range was checked when the chain was taken.
                let _ = self.mem.write_slice(&self.frame[done..done + take], addr);
                done += take;
            }
            let written = (done - start) as u32;
            if self.rx.add_used(&self.mem, c.head, written).is_err() {
                add(&self.counters[usize::from(RX)].malformed, 1);
            }
            add(&self.counters[usize::from(RX)].completed, 1);
        }
        true
    }
}

/// Copies a transmit chain's readable buffers into `frame`; its length, or None for a chain
/// shorter than the header, longer than `MAX_FRAME`, with a writable buffer, or outside
/// guest memory.
fn gather(
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

/// A receive chain's buffers, checked: all writable and inside guest memory, at least a
/// header's worth in all.
fn rx_chain(
    chain: virtio_queue::DescriptorChain<&GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
) -> Option<RxChain> {
    let head = chain.head_index();
    let mut buffers = Vec::new();
    let mut capacity = 0usize;
    for desc in chain {
        if !desc.is_write_only() || buffers.len() >= usize::from(super::QUEUE_SIZE) {
            return None;
        }
        mem.get_slice(desc.addr(), desc.len() as usize).ok()?;
        capacity = capacity.saturating_add(desc.len() as usize);
        buffers.push((desc.addr(), desc.len()));
    }
    (capacity >= VNET_HDR_LEN).then_some(RxChain {
        head,
        buffers,
        capacity,
    })
}

impl MutEventSubscriber for NetWorker {
    fn process(&mut self, events: Events, _ops: &mut EventOps) {
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
        // Receive buffers need no kick: a frame takes them when it comes.
        let _ = self.rx.disable_notification(&self.mem);
        self.serve_tx();
        self.serve_rx();
    }
}
