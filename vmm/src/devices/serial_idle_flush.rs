//! Output the guest left without a newline (a login prompt, a progress dot) reaches the
//! console soon even when the console takes whole lines: when output starts waiting for its
//! newline, the serial device tells the devices thread (one eventfd write, at most once per
//! [`IDLE_FLUSH`]), which starts a one-shot timer that flushes what is still pending. Complete
//! lines are written as they end; an idle console costs no wake-ups.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::timerfd::TimerFd;

use super::partial_line_watch::PartialLineWatch;
use super::serial::SerialDevice;

/// How long a partial line may wait for the rest of its line.
pub const IDLE_FLUSH: Duration = Duration::from_millis(50);

/// The devices thread's end: starts the timer when told, flushes COM1's pending output when
/// it fires.
pub struct SerialIdleFlush {
    serial: Arc<Mutex<SerialDevice>>,
    timer: TimerFd,
    wake: EventFd,
    timer_running: Arc<AtomicBool>,
}

impl SerialIdleFlush {
    /// The flusher for `serial`, and the watch to give its output
    /// ([`SerialOutput::set_partial_watch`](super::serial::SerialOutput::set_partial_watch)).
    pub fn new(serial: Arc<Mutex<SerialDevice>>) -> std::io::Result<(Self, PartialLineWatch)> {
        let wake = EventFd::new(EFD_NONBLOCK)?;
        let timer_running = Arc::new(AtomicBool::new(false));
        let watch = PartialLineWatch::new(timer_running.clone(), wake.try_clone()?);
        let flush = SerialIdleFlush {
            serial,
            timer: TimerFd::new()?,
            wake,
            timer_running,
        };
        Ok((flush, watch))
    }

    fn fire(&mut self) {
        let _ = self.timer.wait();
        // Cleared before the flush, which takes the device's lock: output left pending after
        // the flush tells the watch again; output before it is flushed.
        self.timer_running.store(false, Ordering::Release);
        if let Ok(mut serial) = self.serial.lock() {
            serial.flush_output();
        }
    }
}

impl MutEventSubscriber for SerialIdleFlush {
    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        if events.fd() == self.timer.as_raw_fd() {
            self.fire();
            return;
        }
        let _ = self.wake.read();
        if let Err(e) = self.timer.reset(IDLE_FLUSH, None) {
            // Unflushed output still leaves with its newline or the VM's end.
            eprintln!("exitless: partial console lines wait for their newline: {e}");
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        let fds: [RawFd; 2] = [self.timer.as_raw_fd(), self.wake.as_raw_fd()];
        for fd in fds {
            if let Err(e) = ops.add(Events::new_raw(fd, EventSet::IN)) {
                eprintln!("exitless: partial console lines wait for their newline: {e:?}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::MutBusDevice;
    use crate::devices::serial::{FlushPolicy, SerialOutput};
    use crate::event_loop::EventLoop;
    use std::io::{self, Write};
    use std::time::Instant;

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

    #[test]
    fn a_partial_line_reaches_the_console_without_its_newline() {
        let sink = Sink::default();
        let out = SerialOutput::new(Box::new(sink.clone())).with_flush_policy(FlushPolicy::Newline);
        let irq = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
        let serial = Arc::new(Mutex::new(SerialDevice::new(irq, out)));
        for b in b"login: " {
            serial.lock().unwrap().write(0, &[*b]).unwrap();
        }
        assert!(sink.0.lock().unwrap().is_empty(), "held back until flushed");
        let events = EventLoop::start().unwrap();
        let (flush, watch) = SerialIdleFlush::new(serial.clone()).unwrap();
        let running = flush.timer_running.clone();
        events.handle().add(Arc::new(Mutex::new(flush))).unwrap();
        // What waited before the watch was set is flushed too.
        serial.lock().unwrap().output_mut().set_partial_watch(watch);
        wait_for(|| sink.0.lock().unwrap().as_slice() == b"login: ");
        assert_eq!(&*sink.0.lock().unwrap(), b"login: ");
        // Idle: the one-shot timer has fired and is not started again.
        wait_for(|| !running.load(Ordering::Acquire));
        std::thread::sleep(IDLE_FLUSH * 2);
        assert!(
            !running.load(Ordering::Acquire),
            "an idle console starts no timer"
        );
        // A new partial line starts it again and is flushed; a whole line needs no timer.
        for b in b"root\n# " {
            serial.lock().unwrap().write(0, &[*b]).unwrap();
        }
        assert_eq!(&*sink.0.lock().unwrap(), b"login: root\n");
        wait_for(|| sink.0.lock().unwrap().as_slice() == b"login: root\n# ");
        assert_eq!(&*sink.0.lock().unwrap(), b"login: root\n# ");
    }

    fn wait_for(done: impl Fn() -> bool) {
        let start = Instant::now();
        while !done() && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
