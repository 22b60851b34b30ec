//! virtio-balloon (device type 5) with free page reporting: how a guest gives memory back to
//! the host. Its configuration space holds the host's target (`num_pages`, 4 KiB pages the
//! guest should hand over, set at creation and by `vm.resize {"desired_balloon"}`, announced
//! with a configuration-change interrupt) and the guest's `actual`.
//!
//! Queues, by index as the driver numbers them (virtio 1.3, 5.5.2: the queues that exist are
//! numbered in order, so their indexes follow the features negotiated): inflateq 0, deflateq 1,
//! then statsq and free_page_vq (never offered here), then reporting_vq: index 2 once
//! VIRTIO_BALLOON_F_REPORTING is negotiated. What the guest names on inflateq (arrays of le32
//! PFNs) and on reporting_vq (each descriptor's address and length is a free range; Linux
//! posts them device-writable, either direction is taken) goes back to the host ([`discard`]);
//! deflated pages need nothing (the guest's next touch faults them in). The queues are served
//! on the device event loop ([`worker`]); a hostile guest's ranges are clipped to guest RAM
//! or refused, and counted, and its malformed chains are counted and logged, rate-limited.

pub mod discard;
#[cfg(test)]
mod tests;
mod worker;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::{
    Activation, QueueCounters, VirtioDevice, VirtioError, TYPE_BALLOON, VIRTIO_F_VERSION_1,
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};
use crate::config::BalloonConfig;
use crate::event_loop::Subscriber;
use discard::PAGE_SIZE;
use worker::BalloonWorker;
pub use worker::{take_chain, MAX_PFNS_PER_CHAIN};

/// The driver must tell the device before it uses a deflated page (never offered).
pub const F_MUST_TELL_HOST: u64 = 1 << 0;
/// A statistics queue exists (never offered).
pub const F_STATS_VQ: u64 = 1 << 1;
/// The guest deflates the balloon when it runs out of memory.
pub const F_DEFLATE_ON_OOM: u64 = 1 << 2;
/// A free page hinting queue exists (never offered).
pub const F_FREE_PAGE_HINT: u64 = 1 << 3;
/// Free page reporting: a reporting queue exists.
pub const F_REPORTING: u64 = 1 << 5;
/// Entries of each queue (Linux reports at most 32 ranges a time and sends 256 PFNs).
pub const QUEUE_SIZE: u16 = 128;
/// Bytes of the configuration space: num_pages, actual, free_page_hint_cmd_id, poison_val.
const CONFIG_LEN: usize = 16;

/// What a queue is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Inflate,
    Deflate,
    Reporting,
}

/// What queue `index` is for once the driver negotiated `features`: the queues that exist are
/// numbered in order (inflateq, deflateq, statsq, free_page_vq, reporting_vq).
pub fn role_of(index: u16, features: u64) -> Option<Role> {
    let has = |f: u64| features & f != 0;
    let reporting = 2 + u16::from(has(F_STATS_VQ)) + u16::from(has(F_FREE_PAGE_HINT));
    match index {
        0 => Some(Role::Inflate),
        1 => Some(Role::Deflate),
        i if i == reporting && has(F_REPORTING) => Some(Role::Reporting),
        _ => None,
    }
}

/// What the device did with the guest's pages, written by the queue work (one writer).
#[derive(Debug, Default)]
pub struct BalloonStats {
    /// Pages the guest reported free, given back to the host.
    pub reported_pages: AtomicU64,
    /// Pages the guest put in the balloon, given back to the host.
    pub inflated_pages: AtomicU64,
    /// Pages the guest took back out of the balloon.
    pub deflated_pages: AtomicU64,
    /// Ranges refused: unaligned, empty or wholly outside guest RAM.
    pub refused_ranges: AtomicU64,
    /// Ranges partly outside guest RAM (the part inside was given back).
    pub clipped_ranges: AtomicU64,
    /// Ranges the host failed to discard (madvise or fallocate said no).
    pub discard_errors: AtomicU64,
}

/// The balloon's state shared by the device model (the driver's config accesses), its queue
/// work and the VMM ([`BalloonHandle`]).
#[derive(Debug, Default)]
struct Shared {
    /// The host's target: pages the guest should have in the balloon (`num_pages`).
    target_pages: AtomicU32,
    /// Pages the guest says it has in the balloon (`actual`).
    actual_pages: AtomicU32,
    stats: BalloonStats,
}

/// How the VMM sets the balloon's target and reads what the guest did.
#[derive(Debug, Clone)]
pub struct BalloonHandle(Arc<Shared>);

impl BalloonHandle {
    /// Sets the target to `bytes` (whole pages, at most 2^32 - 1 of them); returns whether it
    /// changed (the caller then raises the configuration-change interrupt).
    pub fn set_target_bytes(&self, bytes: u64) -> bool {
        let pages = u32::try_from(bytes / PAGE_SIZE).unwrap_or(u32::MAX);
        self.0.target_pages.swap(pages, Ordering::AcqRel) != pages
    }

    /// The target in bytes.
    pub fn target_bytes(&self) -> u64 {
        u64::from(self.0.target_pages.load(Ordering::Acquire)) * PAGE_SIZE
    }

    /// What the guest says the balloon holds, in bytes.
    pub fn actual_bytes(&self) -> u64 {
        u64::from(self.0.actual_pages.load(Ordering::Acquire)) * PAGE_SIZE
    }

    /// What the queue work did.
    pub fn stats(&self) -> &BalloonStats {
        &self.0.stats
    }
}

/// What a snapshot saves of the balloon beyond its transport: the host's target
/// (`num_pages`), what the guest says it holds (`actual`), and the work counters.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BalloonState {
    target_pages: u32,
    actual_pages: u32,
    inflated_pages: u64,
    deflated_pages: u64,
    reported_pages: u64,
}

/// The virtio-balloon device model.
pub struct Balloon {
    features: u64,
    queue_sizes: Vec<u16>,
    shared: Arc<Shared>,
    counters: Arc<[QueueCounters]>,
}

impl Balloon {
    pub fn new(config: &BalloonConfig) -> Self {
        let mut features =
            VIRTIO_F_VERSION_1 | VIRTIO_RING_F_EVENT_IDX | VIRTIO_RING_F_INDIRECT_DESC;
        let mut queues = 2;
        if config.deflate_on_oom {
            features |= F_DEFLATE_ON_OOM;
        }
        if config.free_page_reporting {
            features |= F_REPORTING;
            queues += 1;
        }
        let balloon = Balloon {
            features,
            queue_sizes: vec![QUEUE_SIZE; queues],
            shared: Arc::default(),
            counters: (0..queues).map(|_| QueueCounters::default()).collect(),
        };
        balloon.handle().set_target_bytes(config.size);
        balloon
    }

    /// How the VMM changes the target and reads the guest's progress.
    pub fn handle(&self) -> BalloonHandle {
        BalloonHandle(self.shared.clone())
    }

    /// The configuration space as the driver reads it.
    fn config_image(&self) -> [u8; CONFIG_LEN] {
        let mut b = [0u8; CONFIG_LEN];
        let target = self.shared.target_pages.load(Ordering::Acquire);
        let actual = self.shared.actual_pages.load(Ordering::Acquire);
        b[0..4].copy_from_slice(&target.to_le_bytes());
        b[4..8].copy_from_slice(&actual.to_le_bytes());
        b
    }
}

impl VirtioDevice for Balloon {
    fn device_type(&self) -> u32 {
        TYPE_BALLOON
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_sizes
    }

    fn features(&self) -> u64 {
        self.features
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let image = self.config_image();
        for (i, byte) in data.iter_mut().enumerate() {
            let at = offset.saturating_add(i as u64);
            *byte = usize::try_from(at)
                .ok()
                .and_then(|a| image.get(a))
                .copied()
                .unwrap_or(0);
        }
    }

    /// Only `actual` (bytes 4-7) is the driver's to write; other writes are ignored.
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        let Some(end) = offset.checked_add(data.len() as u64) else {
            return;
        };
        if offset < 4 || end > 8 {
            return;
        }
        let mut actual = self
            .shared
            .actual_pages
            .load(Ordering::Acquire)
            .to_le_bytes();
        let at = (offset - 4) as usize;
        actual[at..at + data.len()].copy_from_slice(data);
        self.shared
            .actual_pages
            .store(u32::from_le_bytes(actual), Ordering::Release);
    }

    fn activate(&mut self, a: Activation) -> Result<Subscriber, VirtioError> {
        let worker = BalloonWorker::new(a, self.counters.clone(), self.shared.clone());
        Ok(Arc::new(Mutex::new(worker)))
    }

    /// The transport's registers and the rings are its state, with the target and what the
    /// guest says the balloon holds ([`VirtioDevice::save_state`]): inflated pages were
    /// given back to the host, so the snapshot's memory has them as holes (zeros), as the
    /// guest expects of pages it gave away; which pages they are is the guest's to know.
    fn snapshot_support(&self) -> Result<(), String> {
        Ok(())
    }

    fn save_state(&self) -> Option<serde_json::Value> {
        let s = &self.shared;
        let state = BalloonState {
            target_pages: s.target_pages.load(Ordering::Acquire),
            actual_pages: s.actual_pages.load(Ordering::Acquire),
            inflated_pages: s.stats.inflated_pages.load(Ordering::Relaxed),
            deflated_pages: s.stats.deflated_pages.load(Ordering::Relaxed),
            reported_pages: s.stats.reported_pages.load(Ordering::Relaxed),
        };
        serde_json::to_value(state).ok()
    }

    fn load_state(&mut self, state: serde_json::Value) -> Result<(), String> {
        let b: BalloonState = crate::snapshot::from_state(state)?;
        let s = &self.shared;
        s.target_pages.store(b.target_pages, Ordering::Release);
        s.actual_pages.store(b.actual_pages, Ordering::Release);
        s.stats
            .inflated_pages
            .store(b.inflated_pages, Ordering::Relaxed);
        s.stats
            .deflated_pages
            .store(b.deflated_pages, Ordering::Relaxed);
        s.stats
            .reported_pages
            .store(b.reported_pages, Ordering::Relaxed);
        Ok(())
    }

    /// A reset driver starts with an empty balloon.
    fn reset(&mut self) {
        self.shared.actual_pages.store(0, Ordering::Release);
    }

    fn counters(&self) -> Arc<[QueueCounters]> {
        self.counters.clone()
    }

    fn device_counters(&self) -> Vec<(&'static str, u64)> {
        let s = &self.shared.stats;
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let pages = |c: &AtomicU32| u64::from(c.load(Ordering::Relaxed));
        vec![
            ("target_pages", pages(&self.shared.target_pages)),
            ("actual_pages", pages(&self.shared.actual_pages)),
            ("reported_pages", l(&s.reported_pages)),
            ("inflated_pages", l(&s.inflated_pages)),
            ("deflated_pages", l(&s.deflated_pages)),
            ("refused_ranges", l(&s.refused_ranges)),
            ("clipped_ranges", l(&s.clipped_ranges)),
            ("discard_errors", l(&s.discard_errors)),
        ]
    }
}
