//! Receiving: the tap's frames into the guest's receive chains, one frame held (and the tap
//! left unread) while the ring has no room for it.

use std::collections::VecDeque;
use std::io::ErrorKind;

use virtio_queue::QueueT;

use super::{add, NetWorker, RX_BATCH};
use crate::devices::virtio::net::tap::VNET_HDR_LEN;
use crate::devices::virtio::net::{QUEUE_SIZE, RX};
use crate::devices::virtio::{StallGuard, WritableChain};

/// Whether the receive chains taken hold a frame.
#[derive(Debug, PartialEq, Eq)]
enum Room {
    /// They do.
    Enough,
    /// The ring has no more chains yet: the frame waits for the guest to post some.
    Wait,
    /// It never will: without merged buffers the next chain is too small (the driver broke
    /// the spec's minimum), or every chain the ring can hold is taken and still too small.
    Never,
}

/// What became of a frame offered to the receive queue.
#[derive(Debug, PartialEq, Eq)]
enum Placed {
    Delivered,
    Dropped,
    Wait,
}

impl NetWorker {
    /// The frame waiting for buffers, then what the tap has (a batch at most), into the
    /// guest's receive buffers. A frame without room waits: the guest is asked to notify
    /// the queue when it posts buffers, and the tap is not read until then.
    pub(super) fn serve_rx(&mut self) {
        if self.tap.handed_over() {
            return; // the frames wait in the tap for a migration's destination
        }
        let mut delivered = false;
        let mut stall = StallGuard::new(RX);
        for _ in 0..RX_BATCH {
            let n = match self.rx_held.take() {
                Some(n) => n,
                None => match self.read_tap() {
                    Some(n) => n,
                    None => break,
                },
            };
            let before = self.rx.next_avail();
            match self.place(n) {
                Placed::Delivered => delivered = true,
                Placed::Dropped => add(&self.net.rx_dropped, 1),
                Placed::Wait => {
                    self.rx_held = Some(n);
                    let popped = self.rx.next_avail().wrapping_sub(before);
                    // Chains posted since the ring was read are taken now; none is missed.
                    let more = self.rx.enable_notification(self.mem.get());
                    let (counters, health) = (&self.counters[usize::from(RX)], &self.health);
                    if !more.unwrap_or(false) || !stall.go_on(usize::from(popped), counters, health)
                    {
                        break;
                    }
                }
            }
        }
        if self.rx_held.is_none() {
            // Frames find buffers again: no kick needed for the next ones.
            let _ = self.rx.disable_notification(self.mem.get());
        }
        if delivered {
            self.signal(RX);
        }
    }

    /// Reads one frame from the tap into `rx_frame`: its length, or None when the tap has
    /// none (or cannot be read).
    fn read_tap(&mut self) -> Option<usize> {
        loop {
            match self.tap.read_frame(&mut self.rx_frame) {
                Ok(n) if n >= VNET_HDR_LEN => return Some(n),
                Ok(_) => continue,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return None,
                Err(e) => {
                    self.warn_once(format_args!("cannot read the tap: {e}"));
                    return None;
                }
            }
        }
    }

    /// Offers the `n`-byte frame in `rx_frame` to the receive queue (dropped while quiesced
    /// for a snapshot, or when no chain could ever hold it).
    fn place(&mut self, n: usize) -> Placed {
        if self.quiesced {
            return Placed::Dropped;
        }
        match self.gather_rx(n) {
            Room::Enough => {
                self.deliver(n);
                add(&self.net.rx_frames, 1);
                add(&self.net.rx_bytes, (n - VNET_HDR_LEN) as u64);
                Placed::Delivered
            }
            Room::Wait => Placed::Wait,
            Room::Never => Placed::Dropped,
        }
    }

    /// Completes a malformed receive chain empty, counted.
    fn use_malformed(&mut self, head: u16) {
        add(&self.counters[usize::from(RX)].malformed, 1);
        self.dirty.completing(self.mem.get(), &self.rx, head);
        if self.rx.add_used(self.mem.get(), head, 0).is_ok() {
            add(&self.counters[usize::from(RX)].completed, 1);
        }
    }

    /// Takes receive chains off the ring until the spare ones hold `need` bytes (or the first
    /// one does, without merged buffers).
    fn gather_rx(&mut self, need: usize) -> Room {
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
                return Room::Enough;
            }
            if !self.mrg_rxbuf && !self.spare.is_empty() {
                return Room::Never; // the first chain is too small for this frame
            }
            if self.spare.len() >= usize::from(self.rx.size()) {
                return Room::Never; // the whole ring holds less than this frame
            }
            let Some(chain) = self.rx.pop_descriptor_chain(self.mem.get()) else {
                return Room::Wait;
            };
            let head = chain.head_index();
            let max = usize::from(QUEUE_SIZE);
            let taken = WritableChain::take(chain, &self.mem, max, VNET_HDR_LEN);
            self.spare.push_back(taken.ok_or(head));
        }
    }

    /// Copies the `n`-byte frame (header first) into the spare receive chains, which hold it.
    fn deliver(&mut self, n: usize) {
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
        self.rx_frame[VNET_HDR_LEN - 2..VNET_HDR_LEN].copy_from_slice(&count.to_le_bytes());
        let mut done = 0;
        for c in chains {
            let c = match c {
                Ok(c) => c,
                Err(head) => {
                    self.use_malformed(head);
                    continue;
                }
            };
            let written = c.fill(&self.mem, &self.rx_frame[done..n]);
            done += written;
            self.dirty.completing(self.mem.get(), &self.rx, c.head);
            if self
                .rx
                .add_used(self.mem.get(), c.head, written as u32)
                .is_err()
            {
                add(&self.counters[usize::from(RX)].malformed, 1);
            }
            add(&self.counters[usize::from(RX)].completed, 1);
        }
    }
}
