//! Output the guest left without a newline (a login prompt, a progress dot) reaches the
//! console soon even when the console takes whole lines: when output starts waiting for its
//! newline, the serial device wakes the main thread (a [`PartialLineWatch`], at most once
//! until the flush), which flushes what is still pending [`IDLE_FLUSH`] later. Complete lines
//! are written as they end; an idle console costs no wake-ups, and the flush no thread of its
//! own (a VM without virtio devices never starts the devices thread).
//!
//! [`IdleFlush`] is the main thread's part, a state machine over the time it is given: each
//! time the main thread wakes it calls [`IdleFlush::attend`] and sleeps at most as long as
//! that says.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::partial_line_watch::PartialLineWatch;
use super::serial::SerialDevice;

/// How long a partial line may wait for the rest of its line.
pub const IDLE_FLUSH: Duration = Duration::from_millis(50);

/// The main thread's end: notes when a partial line was told of, flushes COM1's pending output
/// once it has waited [`IDLE_FLUSH`].
pub struct IdleFlush {
    serial: Arc<Mutex<SerialDevice>>,
    /// Set by the watch when output starts waiting, cleared by the flush.
    waiting: Arc<AtomicBool>,
    /// When the flush is due, once the main thread saw `waiting`.
    due: Option<Instant>,
}

impl IdleFlush {
    /// The flush of `serial`, and the watch to give its output
    /// ([`SerialOutput::set_partial_watch`](super::serial::SerialOutput::set_partial_watch)).
    pub fn new(serial: Arc<Mutex<SerialDevice>>) -> (Self, PartialLineWatch) {
        let waiting = Arc::new(AtomicBool::new(false));
        let watch = PartialLineWatch::new(waiting.clone());
        let flush = IdleFlush {
            serial,
            waiting,
            due: None,
        };
        (flush, watch)
    }

    /// What the main thread does when it wakes, at `now`: a partial line told of is due
    /// [`IDLE_FLUSH`] after the main thread first sees it, then flushed. Returns how long until
    /// the flush is due, if one waits (the main thread sleeps at most that long).
    pub fn attend(&mut self, now: Instant) -> Option<Duration> {
        if !self.waiting.load(Ordering::Acquire) {
            self.due = None;
            return None;
        }
        let due = *self.due.get_or_insert(now + IDLE_FLUSH);
        if now < due {
            return Some(due - now);
        }
        self.due = None;
        // Cleared before the flush, which takes the device's lock: output left pending after
        // the flush tells the watch again; output before it is flushed.
        self.waiting.store(false, Ordering::Release);
        if let Ok(mut serial) = self.serial.lock() {
            serial.flush_output();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::MutBusDevice;
    use crate::devices::serial::{FlushPolicy, SerialOutput};
    use std::io::{self, Write};

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn put(serial: &Mutex<SerialDevice>, text: &[u8]) {
        for b in text {
            serial.lock().unwrap().write(0, &[*b]).unwrap();
        }
    }

    #[test]
    fn a_partial_line_reaches_the_console_once_it_has_waited() {
        let sink = Sink::default();
        let out = SerialOutput::new(Box::new(sink.clone())).with_flush_policy(FlushPolicy::Newline);
        let irq = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
        let serial = Arc::new(Mutex::new(SerialDevice::new(irq, out)));
        put(&serial, b"login: ");
        assert!(sink.0.lock().unwrap().is_empty(), "held back until flushed");
        let (mut flush, watch) = IdleFlush::new(serial.clone());
        // What waited before the watch was set is flushed too.
        serial.lock().unwrap().output_mut().set_partial_watch(watch);
        let t0 = Instant::now();
        assert_eq!(flush.attend(t0), Some(IDLE_FLUSH));
        let half = t0 + IDLE_FLUSH / 2;
        assert_eq!(flush.attend(half), Some(IDLE_FLUSH / 2));
        assert!(sink.0.lock().unwrap().is_empty(), "not due yet");
        assert_eq!(flush.attend(t0 + IDLE_FLUSH), None);
        assert_eq!(&*sink.0.lock().unwrap(), b"login: ");
        // Idle: nothing waits, nothing is due, the main thread may sleep for good.
        assert_eq!(flush.attend(t0 + IDLE_FLUSH * 3), None);
        // A whole line needs no flush; a new partial line is due again, IDLE_FLUSH after
        // the main thread first sees it.
        put(&serial, b"root\n# ");
        assert_eq!(&*sink.0.lock().unwrap(), b"login: root\n");
        let t1 = t0 + IDLE_FLUSH * 4;
        assert_eq!(flush.attend(t1), Some(IDLE_FLUSH));
        assert_eq!(flush.attend(t1 + IDLE_FLUSH * 2), None);
        assert_eq!(&*sink.0.lock().unwrap(), b"login: root\n# ");
    }

    /// A partial line told of marks a flush as waiting and wakes the main thread.
    #[test]
    fn a_tell_marks_the_flush_waiting_and_wakes_the_main_thread() {
        let waiting = Arc::new(AtomicBool::new(false));
        let watch = PartialLineWatch::new(waiting.clone());
        let seen = crate::wake::generation();
        watch.tell();
        let after_first = crate::wake::generation();
        assert_ne!(after_first, seen, "the first tell wakes the main thread");
        assert!(waiting.load(Ordering::Acquire));
    }
}
