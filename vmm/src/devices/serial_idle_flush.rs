//! Output the guest left without a newline (a login prompt, a progress dot) reaches the
//! console soon even when the console takes whole lines: a timer on the device event loop
//! flushes what is pending. Complete lines are written as they end; this only catches the tail.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use vmm_sys_util::timerfd::TimerFd;

use super::serial::SerialDevice;

/// How long a partial line may wait for the rest of its line.
pub const IDLE_FLUSH: Duration = Duration::from_millis(50);

/// Flushes COM1's pending output every [`IDLE_FLUSH`].
pub struct SerialIdleFlush {
    serial: Arc<Mutex<SerialDevice>>,
    timer: TimerFd,
}

impl SerialIdleFlush {
    pub fn new(serial: Arc<Mutex<SerialDevice>>) -> std::io::Result<Self> {
        Ok(SerialIdleFlush {
            serial,
            timer: TimerFd::new()?,
        })
    }
}

impl MutEventSubscriber for SerialIdleFlush {
    fn process(&mut self, _events: Events, _ops: &mut EventOps) {
        let _ = self.timer.wait();
        if let Ok(mut serial) = self.serial.lock() {
            serial.flush_output();
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        let armed = self.timer.reset(IDLE_FLUSH, Some(IDLE_FLUSH));
        let added = match armed {
            Ok(()) => ops
                .add(Events::new_raw(self.timer.as_raw_fd(), EventSet::IN))
                .map_err(|e| format!("{e:?}")),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = added {
            eprintln!("exitless: partial console lines wait for their newline: {e}");
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
        let flush = SerialIdleFlush::new(serial.clone()).unwrap();
        events.handle().add(Arc::new(Mutex::new(flush))).unwrap();
        let start = Instant::now();
        while sink.0.lock().unwrap().is_empty() && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(&*sink.0.lock().unwrap(), b"login: ");
    }
}
