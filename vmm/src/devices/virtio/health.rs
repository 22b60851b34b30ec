//! What a device says about the driver's misuse: a broken ring puts the device in
//! DEVICE_NEEDS_RESET (reported once, with a configuration-change interrupt) and its queues are
//! left alone until the driver resets it; register faults, refused starts and status writes
//! that clear bits are counted. Log lines a guest can cause go through [`RateLimitedLog`], so
//! no guest can flood the VMM's stderr.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::VirtioInterrupt;

/// Log lines a guest causes: the first few as they come, then at most one a minute saying how
/// many were held back; everything counted.
#[derive(Debug)]
pub struct RateLimitedLog {
    state: Mutex<LogState>,
}

#[derive(Debug)]
struct LogState {
    logged: u32,
    held_back: u64,
    last: Option<Instant>,
}

/// Lines logged as they come before the limit applies.
const LOG_BURST: u32 = 5;
/// Then at most one line per this long.
const LOG_EVERY: Duration = Duration::from_secs(60);

impl Default for RateLimitedLog {
    fn default() -> Self {
        RateLimitedLog {
            state: Mutex::new(LogState {
                logged: 0,
                held_back: 0,
                last: None,
            }),
        }
    }
}

impl RateLimitedLog {
    /// Logs `line` (prefixed `exitless: `) unless the limit holds it back; returns whether it
    /// was written.
    pub fn log(&self, line: impl FnOnce() -> String) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let due = s.logged < LOG_BURST || s.last.is_none_or(|t| now - t >= LOG_EVERY);
        if !due {
            s.held_back += 1;
            return false;
        }
        let held = std::mem::take(&mut s.held_back);
        s.logged += 1;
        s.last = Some(now);
        drop(s);
        let more = if held > 0 {
            format!(" ({held} like it held back)")
        } else {
            String::new()
        };
        eprintln!("exitless: {}{more}", line());
        true
    }

    /// Lines held back so far (not yet summarised).
    pub fn held_back(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .held_back
    }
}

/// A device's standing with its driver, shared by the transport and the device's queue work.
pub struct DeviceHealth {
    name: String,
    needs_reset: AtomicBool,
    /// Rings found broken (each puts the device in NEEDS_RESET).
    pub broken_rings: AtomicU64,
    /// Register accesses that were no register.
    pub faults: AtomicU64,
    /// DRIVER_OK writes refused (a start while running, or an unusable queue).
    pub refused_starts: AtomicU64,
    /// Status writes refused because they cleared a bit (only a reset may).
    pub refused_status: AtomicU64,
    /// BAR moves refused (the new place overlaps another device).
    pub refused_bar_moves: AtomicU64,
    interrupt: Arc<dyn VirtioInterrupt>,
    pub log: RateLimitedLog,
}

impl DeviceHealth {
    pub fn new(name: &str, interrupt: Arc<dyn VirtioInterrupt>) -> Self {
        DeviceHealth {
            name: name.to_string(),
            needs_reset: AtomicBool::new(false),
            broken_rings: AtomicU64::new(0),
            faults: AtomicU64::new(0),
            refused_starts: AtomicU64::new(0),
            refused_status: AtomicU64::new(0),
            refused_bar_moves: AtomicU64::new(0),
            interrupt,
            log: RateLimitedLog::default(),
        }
    }

    /// The device's name, for log lines.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the device is in DEVICE_NEEDS_RESET: its queues are not served until a reset.
    pub fn needs_reset(&self) -> bool {
        self.needs_reset.load(Ordering::Acquire)
    }

    /// Puts the device in DEVICE_NEEDS_RESET because `why`; the driver is told through a
    /// configuration-change interrupt. Reported once until the next reset.
    pub fn fail(&self, why: &str) {
        if self.needs_reset.swap(true, Ordering::AcqRel) {
            return;
        }
        self.log
            .log(|| format!("{}: {why}; the device needs a reset", self.name));
        let _ = self.interrupt.signal_config();
    }

    /// Queue `queue`'s ring announces work it cannot hand out (or more than it holds).
    pub fn ring_broken(&self, queue: u16) {
        if !self.needs_reset() {
            self.broken_rings.fetch_add(1, Ordering::Relaxed);
        }
        self.fail(&format!("queue {queue}'s ring is inconsistent"));
    }

    /// The driver reset the device: it may be used again.
    pub fn reset(&self) {
        self.needs_reset.store(false, Ordering::Release);
    }

    /// What the profile shows for this device beyond its queues.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("broken_rings", l(&self.broken_rings)),
            ("register_faults", l(&self.faults)),
            ("refused_starts", l(&self.refused_starts)),
            ("refused_status_writes", l(&self.refused_status)),
            ("refused_bar_moves", l(&self.refused_bar_moves)),
            ("log_lines_held_back", self.log.held_back()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::test_support::CountingIrq;

    #[test]
    fn a_burst_is_logged_then_held_back_and_counted() {
        let log = RateLimitedLog::default();
        let written = (0..50).filter(|i| log.log(|| format!("line {i}"))).count();
        assert_eq!(written, LOG_BURST as usize);
        assert_eq!(log.held_back(), 50 - u64::from(LOG_BURST));
    }

    #[test]
    fn a_broken_ring_is_reported_once_until_reset() {
        let irq = Arc::new(CountingIrq::default());
        let health = DeviceHealth::new("virtio-test", irq.clone());
        for _ in 0..10 {
            health.ring_broken(1);
        }
        assert!(health.needs_reset());
        assert_eq!(health.broken_rings.load(Ordering::Relaxed), 1);
        assert_eq!(irq.configs(), 1, "one config interrupt");
        health.reset();
        health.ring_broken(0);
        assert_eq!(health.broken_rings.load(Ordering::Relaxed), 2);
    }
}
