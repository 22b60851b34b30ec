//! The devices' own log of the guest pages they write, for live migration: KVM's dirty log
//! sees only the vCPUs' writes, while the devices thread and io_uring write used rings,
//! received frames and disk reads straight into guest memory.
//!
//! One [`DeviceDirtyLog`] per VM, shared by every virtio device (handed over in each
//! [`super::Activation`]). Off unless a migration runs: then each completion costs one
//! relaxed atomic load ([`DeviceDirtyLog::completing`]) and nothing else. On: before each
//! `add_used`, the completed chain is walked again from its head (at most the queue's size
//! of descriptors, indirect tables included: a looping chain cannot hang the walk) and the
//! pages of every device-writable descriptor are marked in a sparse bitmap (64 pages a word,
//! only words of guest memory: bounded by its size). Used rings are not marked per
//! completion: each queue's used ring is registered at activation and reported whole at
//! every harvest (its index, elements and the event index the device writes).
//!
//! The walk comes before `add_used` because once the element is published the driver may
//! reuse the descriptors. A guest that rewrites descriptors it has made available, before
//! the device completes them, breaks the virtio contract: it may lose its own writes on the
//! destination, and nothing else.

pub mod shared;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

/// Bytes per page the log counts (KVM's page).
pub const PAGE: u64 = 4096;

const DESC_F_NEXT: u16 = 1;
const DESC_F_WRITE: u16 = 2;
const DESC_F_INDIRECT: u16 = 4;
const DESC_LEN: u64 = 16;

/// A descriptor as the ring holds it.
#[derive(Debug, Clone, Copy)]
struct Desc {
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
}

fn read_desc(mem: &GuestMemoryMmap, table: u64, i: u16) -> Option<Desc> {
    let at = table.checked_add(u64::from(i) * DESC_LEN)?;
    let mut b = [0u8; DESC_LEN as usize];
    mem.read_slice(&mut b, GuestAddress(at)).ok()?;
    let word =
        |r: std::ops::Range<usize>| b[r].iter().rev().fold(0u64, |a, &x| a << 8 | u64::from(x));
    Some(Desc {
        addr: word(0..8),
        len: word(8..12) as u32,
        flags: word(12..14) as u16,
        next: word(14..16) as u16,
    })
}

/// The guest pages the devices wrote since the last [`DeviceDirtyLog::take`], while on.
#[derive(Debug, Default)]
pub struct DeviceDirtyLog {
    on: AtomicBool,
    /// Guest page / 64 -> the word's bits (page % 64).
    words: Mutex<BTreeMap<u64, u64>>,
    /// Each queue's used ring, by (device, queue): `(gpa, bytes)`.
    rings: Mutex<BTreeMap<(String, u16), (u64, u64)>>,
    /// The log vhost-user back ends write, while they log ([`shared::SharedLog`]).
    shared: Mutex<Option<Arc<shared::SharedLog>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl DeviceDirtyLog {
    /// Starts logging (forgetting anything logged before).
    pub fn start(&self) {
        lock(&self.words).clear();
        self.on.store(true, Ordering::SeqCst);
    }

    /// Stops logging and forgets what was logged.
    pub fn stop(&self) {
        self.on.store(false, Ordering::SeqCst);
        lock(&self.words).clear();
    }

    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Records queue `queue` of device `device`'s used ring (`size` elements at `gpa`),
    /// reported whole at every harvest. Called at activation (not on the hot path).
    pub fn add_ring(&self, device: &str, queue: u16, gpa: u64, size: u16) {
        let bytes = 6 + 8 * u64::from(size);
        lock(&self.rings).insert((device.to_string(), queue), (gpa, bytes));
    }

    /// Called before `add_used` of the chain at `head` on `queue`: while on, marks the
    /// pages of its device-writable descriptors. Off: one relaxed load.
    #[inline]
    pub fn completing(&self, mem: &GuestMemoryMmap, queue: &Queue, head: u16) {
        if self.on.load(Ordering::Relaxed) {
            self.mark_chain(mem, queue.desc_table(), queue.size(), head);
        }
    }

    /// Walks the chain at `head` of the descriptor table at `table` (`size` entries), at
    /// most `size` descriptors in all (indirect ones included), marking writable ones.
    fn mark_chain(&self, mem: &GuestMemoryMmap, table: u64, size: u16, head: u16) {
        let mut words = lock(&self.words);
        let mut budget = u32::from(size);
        let (mut table, mut entries, mut next) = (table, size, head);
        let mut indirect = false;
        while budget > 0 && next < entries {
            budget -= 1;
            let Some(d) = read_desc(mem, table, next) else {
                return;
            };
            if d.flags & DESC_F_INDIRECT != 0 {
                if indirect {
                    return; // Nested indirect tables are not allowed.
                }
                indirect = true;
                table = d.addr;
                entries = u16::try_from(u64::from(d.len) / DESC_LEN).unwrap_or(u16::MAX);
                next = 0;
                continue;
            }
            if d.flags & DESC_F_WRITE != 0 {
                mark(&mut words, mem, d.addr, u64::from(d.len));
            }
            if d.flags & DESC_F_NEXT == 0 {
                return;
            }
            next = d.next;
        }
    }

    /// Marks `len` bytes at `gpa` (while on), for a write outside a descriptor chain.
    pub fn mark_range(&self, mem: &GuestMemoryMmap, gpa: u64, len: u64) {
        if self.on.load(Ordering::Relaxed) {
            mark(&mut lock(&self.words), mem, gpa, len);
        }
    }

    /// Harvests `log` too (vhost-user back ends write it), or no more (None).
    pub fn share(&self, log: Option<Arc<shared::SharedLog>>) {
        *lock(&self.shared) = log;
    }

    /// The log vhost-user back ends write, if one is shared.
    pub fn shared(&self) -> Option<Arc<shared::SharedLog>> {
        lock(&self.shared).clone()
    }

    /// The pages logged since the last call (and every registered used ring's, and what
    /// back ends logged), sorted, as guest page numbers (gpa / [`PAGE`]); the logs are
    /// cleared.
    pub fn take(&self, mem: &GuestMemoryMmap) -> Vec<u64> {
        let rings: Vec<(u64, u64)> = lock(&self.rings).values().copied().collect();
        let mut words = lock(&self.words);
        for (gpa, bytes) in rings {
            mark(&mut words, mem, gpa, bytes);
        }
        let taken = std::mem::take(&mut *words);
        drop(words);
        let mut pages = Vec::new();
        for (w, mut bits) in taken {
            while bits != 0 {
                pages.push(w * 64 + u64::from(bits.trailing_zeros()));
                bits &= bits - 1;
            }
        }
        if let Some(log) = self.shared() {
            log.take(&mut pages);
            pages.sort_unstable();
            pages.dedup();
        }
        pages
    }
}

/// Sets the bits of the pages of `[gpa, gpa + len)` that are guest memory.
fn mark(words: &mut BTreeMap<u64, u64>, mem: &GuestMemoryMmap, gpa: u64, len: u64) {
    let end = gpa.saturating_add(len);
    for r in mem.iter() {
        let (start, stop) = (r.start_addr().0, r.start_addr().0 + r.len());
        let (from, to) = (gpa.max(start), end.min(stop));
        if from >= to {
            continue;
        }
        let (first, last) = (from / PAGE, (to - 1) / PAGE);
        for w in first / 64..=last / 64 {
            let lo = if w == first / 64 { first % 64 } else { 0 };
            let hi = if w == last / 64 { last % 64 } else { 63 };
            let bits = (u64::MAX >> (63 - hi)) & (u64::MAX << lo);
            *words.entry(w).or_insert(0) |= bits;
        }
    }
}

#[cfg(test)]
mod tests;
