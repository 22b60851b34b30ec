//! One stream between a guest port and a host Unix socket: what each side may still send
//! (the spec's credit: the receiver's `buf_alloc` minus what is in flight) and the bytes from
//! the guest that the host socket has not taken yet (never more than our `buf_alloc`, which
//! is what the guest was told it may send).

use std::collections::VecDeque;
use std::io::{self, ErrorKind, Write};
use std::os::unix::net::UnixStream;

use super::packet::Header;

/// Bytes of the guest's data the device holds per connection (our `buf_alloc`).
pub const BUF_ALLOC: u32 = 256 * 1024;

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// A host program asked for this guest port; the guest has not answered the REQUEST.
    Connecting,
    Established,
    /// The host program sends no more (EOF): the guest was told with SHUTDOWN(SEND); its data
    /// still goes to the host until it shuts down or resets too.
    HostClosed,
}

/// A connection and its accounting.
#[derive(Debug)]
pub struct Connection {
    pub stream: UnixStream,
    pub state: State,
    /// The guest's data not yet written to the host socket.
    pending: VecDeque<u8>,
    /// Bytes of the guest's data written to the host socket (our `fwd_cnt`).
    pub fwd_cnt: u32,
    /// `fwd_cnt` as last told to the guest.
    pub fwd_cnt_sent: u32,
    /// Bytes sent to the guest (its `fwd_cnt` catches up as it reads).
    pub rx_cnt: u32,
    pub peer_buf_alloc: u32,
    pub peer_fwd_cnt: u32,
    /// The host socket may have data (edge-triggered: set by an event, cleared by EAGAIN).
    pub readable: bool,
    /// The guest will send no more: the host socket's write side is shut once drained.
    pub guest_done_sending: bool,
}

/// Why the guest's data was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// More than the credit the device gave.
    CreditOverrun,
    /// The host socket failed.
    HostGone,
}

impl Connection {
    pub fn new(stream: UnixStream, state: State) -> Self {
        Connection {
            stream,
            state,
            pending: VecDeque::new(),
            fwd_cnt: 0,
            fwd_cnt_sent: 0,
            rx_cnt: 0,
            peer_buf_alloc: 0,
            peer_fwd_cnt: 0,
            readable: true,
            guest_done_sending: false,
        }
    }

    /// Takes the guest's view of its receive buffer from any packet it sends.
    pub fn update_peer_credit(&mut self, h: &Header) {
        self.peer_buf_alloc = h.buf_alloc;
        self.peer_fwd_cnt = h.fwd_cnt;
    }

    /// How many bytes the guest can take now. A guest that claims to have read more than it
    /// was sent gets nothing (it only stalls itself).
    pub fn peer_credit(&self) -> u32 {
        let in_flight = self.rx_cnt.wrapping_sub(self.peer_fwd_cnt);
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    /// The guest's data for the host socket: written now as far as it goes, the rest held.
    pub fn from_guest(&mut self, data: &[u8]) -> Result<(), Refusal> {
        if self.pending.len() + data.len() > BUF_ALLOC as usize {
            return Err(Refusal::CreditOverrun);
        }
        self.pending.extend(data);
        self.flush()
    }

    /// Writes held data to the host socket until it would block.
    pub fn flush(&mut self) -> Result<(), Refusal> {
        while !self.pending.is_empty() {
            let (front, _) = self.pending.as_slices();
            match self.stream.write(front) {
                Ok(0) => return Err(Refusal::HostGone),
                Ok(n) => {
                    self.pending.drain(..n);
                    self.fwd_cnt = self.fwd_cnt.wrapping_add(n as u32);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(_) => return Err(Refusal::HostGone),
            }
        }
        if self.guest_done_sending {
            let _ = self.stream.shutdown(std::net::Shutdown::Write);
        }
        Ok(())
    }

    /// Whether the held data is all written.
    pub fn drained(&self) -> bool {
        self.pending.is_empty()
    }

    /// Whether the guest should hear of freed space now: half our buffer or more was
    /// written since it was last told (or it asked).
    pub fn credit_update_due(&self) -> bool {
        self.fwd_cnt.wrapping_sub(self.fwd_cnt_sent) >= BUF_ALLOC / 2
    }

    /// Writes a short control line ("OK <port>\n") to the host program.
    pub fn tell_host(&mut self, line: &str) -> io::Result<()> {
        self.stream.write_all(line.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credit_is_what_the_guest_has_room_for_and_never_wraps_into_plenty() {
        let (a, _b) = UnixStream::pair().unwrap();
        let mut c = Connection::new(a, State::Established);
        assert_eq!(
            c.peer_credit(),
            0,
            "nothing before the guest says its buffer"
        );
        c.update_peer_credit(&Header {
            buf_alloc: 1000,
            fwd_cnt: 0,
            ..Header::default()
        });
        c.rx_cnt = 600;
        assert_eq!(c.peer_credit(), 400);
        c.peer_fwd_cnt = 500;
        assert_eq!(c.peer_credit(), 900);
        c.peer_fwd_cnt = 700; // claims to have read more than it got
        assert_eq!(c.peer_credit(), 0);
        c.rx_cnt = 5;
        c.peer_fwd_cnt = u32::MAX - 10; // counters wrap
        assert_eq!(c.peer_credit(), 1000 - 16);
    }

    #[test]
    fn data_beyond_the_buffer_is_an_overrun_and_held_data_drains_later() {
        let (a, b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let mut c = Connection::new(a, State::Established);
        // Fill the socket until it would block, then some: the rest is held.
        let chunk = vec![7u8; 64 * 1024];
        let mut sent = 0usize;
        while c.drained() {
            c.from_guest(&chunk).unwrap();
            sent += chunk.len();
        }
        assert!(c.fwd_cnt < sent as u32);
        let room = BUF_ALLOC as usize - (sent - c.fwd_cnt as usize);
        assert_eq!(
            c.from_guest(&vec![1u8; room + 1]),
            Err(Refusal::CreditOverrun)
        );
        // The host reads everything; the held bytes follow.
        b.set_nonblocking(true).unwrap();
        let mut got = 0usize;
        let mut buf = vec![0u8; 1 << 20];
        while got < sent {
            match (&b).read(&mut buf) {
                Ok(n) => got += n,
                Err(_) => c.flush().unwrap(),
            }
        }
        assert_eq!((got, c.fwd_cnt as usize), (sent, sent));
        assert!(c.credit_update_due());
    }

    use std::io::Read;
}
