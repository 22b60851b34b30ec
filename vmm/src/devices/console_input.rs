//! Console input on the device event loop: host stdin (or any readable fd) fed to COM1.
//!
//! stdin is watched with epoll when it can be (a terminal, a pipe, a socket). When epoll
//! refuses it (a regular file, `/dev/null`), it is read on a short timer instead. Bytes the
//! guest's receive FIFO cannot take yet are kept and retried on the timer, so nothing typed is
//! lost and nothing spins. At EOF the input simply ends; the VM runs on.

use std::io::{self, Read};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use vmm_sys_util::timerfd::TimerFd;

use super::serial::SerialDevice;

/// How long to wait before retrying when the guest's FIFO is full or stdin cannot be epolled.
const RETRY: Duration = Duration::from_millis(5);

/// Feeds a readable source to COM1 from the event loop.
pub struct ConsoleInput<R: Read + AsRawFd + Send> {
    source: R,
    serial: Arc<Mutex<SerialDevice>>,
    timer: TimerFd,
    /// Read but not yet taken by the guest.
    pending: Vec<u8>,
    /// The source cannot be epolled: read it on the timer.
    polled: bool,
    ended: bool,
}

impl<R: Read + AsRawFd + Send> ConsoleInput<R> {
    pub fn new(source: R, serial: Arc<Mutex<SerialDevice>>) -> io::Result<Self> {
        Ok(ConsoleInput {
            source,
            serial,
            timer: TimerFd::new()?,
            pending: Vec::new(),
            polled: false,
            ended: false,
        })
    }

    /// Whether the source has ended (EOF or a read error) and everything read was delivered.
    pub fn is_done(&self) -> bool {
        self.ended && self.pending.is_empty()
    }

    /// Moves pending bytes into the guest's FIFO; returns whether all were taken.
    fn deliver(&mut self) -> bool {
        if self.pending.is_empty() {
            return true;
        }
        let taken = match self.serial.lock() {
            Ok(mut s) => s.enqueue_input(&self.pending).unwrap_or(0),
            Err(_) => 0,
        };
        self.pending.drain(..taken);
        self.pending.is_empty()
    }

    /// Reads one chunk of the source into `pending` (only when nothing is pending).
    fn read_source(&mut self) {
        let mut buf = [0u8; 256];
        match self.source.read(&mut buf) {
            Ok(0) => self.ended = true,
            Ok(n) => self.pending.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => {
                eprintln!("exitless: console input ended: {e}");
                self.ended = true;
            }
        }
    }

    /// One step: deliver what is pending, read more if all went in, and say whether to come
    /// back on the timer.
    fn step(&mut self) -> bool {
        if self.deliver() && !self.ended {
            self.read_source();
            self.deliver();
        }
        !self.is_done() && (!self.pending.is_empty() || self.polled)
    }

    fn arm_timer(&mut self, on: bool) {
        let _ = if on {
            self.timer.reset(RETRY, None)
        } else {
            self.timer.reset(Duration::ZERO, None)
        };
    }

    fn source_fd(&self) -> RawFd {
        self.source.as_raw_fd()
    }
}

impl<R: Read + AsRawFd + Send> MutEventSubscriber for ConsoleInput<R> {
    fn process(&mut self, events: Events, ops: &mut EventOps) {
        if events.fd() == self.timer.as_raw_fd() {
            let _ = self.timer.wait();
        }
        let again = self.step();
        // While the guest's FIFO is full, stop watching the source (it would fire at once).
        if !self.polled {
            let watching = Events::new_raw(self.source_fd(), EventSet::IN);
            if self.ended || !self.pending.is_empty() {
                let _ = ops.remove(watching);
            } else if events.fd() == self.timer.as_raw_fd() {
                let _ = ops.add(watching);
            }
        }
        self.arm_timer(again);
    }

    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new(&self.timer, EventSet::IN)) {
            eprintln!("exitless: no console input: {e}");
            return;
        }
        // epoll refuses regular files and /dev/null (EPERM): read those on the timer.
        self.polled = ops
            .add(Events::new_raw(self.source_fd(), EventSet::IN))
            .is_err();
        if self.polled {
            self.arm_timer(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::MutBusDevice;
    use crate::devices::serial::SerialOutput;
    use crate::event_loop::EventLoop;
    use std::fs::File;
    use std::time::Instant;
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    fn com1() -> Arc<Mutex<SerialDevice>> {
        let irq = EventFd::new(EFD_NONBLOCK).unwrap();
        Arc::new(Mutex::new(SerialDevice::new(irq, SerialOutput::discard())))
    }

    /// Reads everything the guest can from COM1's receive buffer for up to `limit`.
    fn guest_reads(serial: &Arc<Mutex<SerialDevice>>, want: usize, limit: Duration) -> Vec<u8> {
        let (mut got, start) = (Vec::new(), Instant::now());
        while got.len() < want && start.elapsed() < limit {
            let mut s = serial.lock().unwrap();
            let mut lsr = [0u8];
            s.read(5, &mut lsr);
            if lsr[0] & 1 == 1 {
                let mut b = [0u8];
                s.read(0, &mut b);
                got.push(b[0]);
            } else {
                drop(s);
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        got
    }

    #[test]
    fn a_file_larger_than_the_fifo_reaches_the_guest_whole() {
        // A regular file cannot be epolled: it is read on the timer, and what the FIFO cannot
        // take waits there until the guest reads.
        let path = std::env::temp_dir().join(format!("exitless-stdin-{}", std::process::id()));
        let text: Vec<u8> = (0..300u32).map(|i| b'a' + (i % 26) as u8).collect();
        std::fs::write(&path, &text).unwrap();
        let serial = com1();
        let input = ConsoleInput::new(File::open(&path).unwrap(), serial.clone()).unwrap();
        let el = EventLoop::start().unwrap();
        el.handle().add(Arc::new(Mutex::new(input))).unwrap();
        let got = guest_reads(&serial, text.len(), Duration::from_secs(10));
        std::fs::remove_file(&path).ok();
        assert_eq!(got, text);
    }

    #[test]
    fn a_pipe_is_epolled_and_eof_ends_the_input() {
        let (rx, mut tx) = std::os::unix::net::UnixStream::pair().unwrap();
        let serial = com1();
        let mut input = ConsoleInput::new(rx, serial.clone()).unwrap();
        use std::io::Write;
        tx.write_all(b"hi\n").unwrap();
        drop(tx);
        // Driven by hand: two steps read the bytes, then EOF.
        input.polled = false;
        input.step();
        input.step();
        assert!(input.is_done());
        assert_eq!(guest_reads(&serial, 3, Duration::from_secs(1)), b"hi\n");
    }
}
