//! Transmitting: the guest's frames out to the tap, one held with its chain while the tap
//! cannot take it yet.

use std::io::ErrorKind;

use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestMemoryMmap};

use super::{add, NetWorker};
use crate::devices::virtio::net::tap::VNET_HDR_LEN;
use crate::devices::virtio::net::TX;
use crate::devices::virtio::StallGuard;

/// What the tap did with a frame.
#[derive(Debug, PartialEq, Eq)]
enum Sent {
    /// Took it, or refused it for good (interface down, a bad header: counted, not sent, as
    /// a NIC transmits into the void when the link is down): the chain is done.
    Done,
    /// Cannot take it yet (`EAGAIN`): the frame waits for the tap to become writable.
    Again,
}

impl NetWorker {
    /// The frame waiting for the tap, then every frame the driver queued, in order; each
    /// chain is completed once the tap took or refused its frame.
    pub(super) fn serve_tx(&mut self) {
        if self.tap.handed_over() {
            return; // for a migration's destination: the chains wait (the VM is paused)
        }
        let mut completed = false;
        if let Some((head, len)) = self.tx_held {
            if self.tap_broken {
                add(&self.net.tx_errors, 1);
            } else if self.send(len) == Sent::Again {
                return;
            }
            self.tx_held = None;
            self.use_tx(head);
            completed = true;
        }
        completed |= self.serve_tx_ring();
        if completed {
            self.signal(TX);
        }
    }

    /// Serves the transmit ring until it is empty (notifications back on, checked again, under
    /// a [`StallGuard`]) or the tap cannot take a frame; whether any chain was completed.
    fn serve_tx_ring(&mut self) -> bool {
        let mut stall = StallGuard::new(TX);
        let mut completed = false;
        loop {
            if self.health.needs_reset() || self.tx.disable_notification(self.mem.get()).is_err() {
                break;
            }
            let mut popped = 0;
            while let Some(chain) = self.tx.pop_descriptor_chain(self.mem.get()) {
                popped += 1;
                let head = chain.head_index();
                match gather(chain, self.mem.get(), &mut self.tx_frame) {
                    Some(len) if self.send(len) == Sent::Again => {
                        self.tx_held = Some((head, len));
                        return completed;
                    }
                    Some(_) => {}
                    None => add(&self.counters[usize::from(TX)].malformed, 1),
                }
                self.use_tx(head);
                completed = true;
            }
            let more = self.tx.enable_notification(self.mem.get()).unwrap_or(false);
            let (counters, health) = (&self.counters[usize::from(TX)], &self.health);
            if !more || !stall.go_on(popped, counters, health) {
                break;
            }
        }
        completed
    }

    /// Gives a transmit chain back to the driver.
    fn use_tx(&mut self, head: u16) {
        let counters = &self.counters[usize::from(TX)];
        self.dirty.completing(self.mem.get(), &self.tx, head);
        if self.tx.add_used(self.mem.get(), head, 0).is_err() {
            add(&counters.malformed, 1);
        }
        add(&counters.completed, 1);
    }

    /// Writes the `len`-byte frame in `tx_frame` (header first) to the tap, counting it or
    /// its failure.
    fn send(&mut self, len: usize) -> Sent {
        loop {
            match self.tap.write_frame(&self.tx_frame[..len]) {
                Ok(_) => {
                    add(&self.net.tx_frames, 1);
                    add(&self.net.tx_bytes, (len - VNET_HDR_LEN) as u64);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Sent::Again,
                Err(e) => {
                    add(&self.net.tx_errors, 1);
                    self.warn_once(format_args!("the tap refused a frame: {e}"));
                }
            }
            return Sent::Done;
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
