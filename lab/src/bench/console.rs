//! The bench guest's console: COM1's output captured in memory as lines (the result lines the
//! lab parses), given to the serial as its sink like any `Write`.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Locks a mutex even if a holder panicked: the protected data stays consistent per call.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Debug, Default)]
struct CaptureState {
    partial: Vec<u8>,
    lines: VecDeque<String>,
    max_lines: usize,
    dropped: u64,
}

impl CaptureState {
    fn end_line(&mut self) {
        let mut line = String::from_utf8_lossy(&self.partial).into_owned();
        self.partial.clear();
        if line.ends_with('\r') {
            line.pop();
        }
        if self.lines.len() >= self.max_lines {
            self.lines.pop_front();
            self.dropped += 1;
        }
        self.lines.push_back(line);
    }
}

/// A bounded, shareable capture of the guest's output, split into lines.
///
/// Clones share the same buffer: keep one clone, give the other to the serial
/// (`SerialOutput::new(Box::new(capture))`).
/// When more than `max_lines` complete lines are held, the oldest are dropped (and counted);
/// a line longer than [`LineCapture::MAX_LINE_LEN`] bytes is split.
#[derive(Debug, Clone)]
pub struct LineCapture {
    inner: Arc<(Mutex<CaptureState>, Condvar)>,
}

impl Default for LineCapture {
    fn default() -> Self {
        Self::new(Self::DEFAULT_MAX_LINES)
    }
}

impl LineCapture {
    /// Lines held by [`LineCapture::default`].
    pub const DEFAULT_MAX_LINES: usize = 4096;
    /// Longest line kept in one piece, in bytes.
    pub const MAX_LINE_LEN: usize = 4096;

    /// A capture holding at most `max_lines` complete lines (at least one).
    pub fn new(max_lines: usize) -> Self {
        let state = CaptureState {
            max_lines: max_lines.max(1),
            ..CaptureState::default()
        };
        Self {
            inner: Arc::new((Mutex::new(state), Condvar::new())),
        }
    }

    /// Adds guest output; `\n` ends a line, a trailing `\r` is stripped.
    pub fn push_bytes(&self, bytes: &[u8]) {
        let mut st = lock(&self.inner.0);
        let mut ended = false;
        for &b in bytes {
            if b == b'\n' {
                st.end_line();
                ended = true;
            } else {
                st.partial.push(b);
                if st.partial.len() >= Self::MAX_LINE_LEN {
                    st.end_line();
                    ended = true;
                }
            }
        }
        if ended {
            self.inner.1.notify_all();
        }
    }

    /// Removes and returns the complete lines captured so far, oldest first.
    pub fn take_lines(&self) -> Vec<String> {
        lock(&self.inner.0).lines.drain(..).collect()
    }

    /// Like [`LineCapture::take_lines`], but waits up to `timeout` for at least one line.
    pub fn wait_lines(&self, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        let mut st = lock(&self.inner.0);
        while st.lines.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            st = match self.inner.1.wait_timeout(st, left) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
        st.lines.drain(..).collect()
    }

    /// Number of lines dropped because the capture was full.
    pub fn dropped(&self) -> u64 {
        lock(&self.inner.0).dropped
    }
}

impl Write for LineCapture {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.push_bytes(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm::bus::{DeviceEvent, MutBusDevice};
    use vmm::devices::serial::{SerialDevice, SerialOutput};
    use vmm_sys_util::eventfd::EventFd;

    #[test]
    fn serial_output_reaches_the_capture_as_lines() {
        let cap = LineCapture::default();
        let out = SerialOutput::new(Box::new(cap.clone()));
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut dev = SerialDevice::new(irq, out);
        let mut put = |s: &[u8]| {
            for &b in s {
                assert_eq!(dev.write(0, &[b]).unwrap(), DeviceEvent::None);
            }
        };
        put(b"hello\r\nresult: 42\npart");
        assert_eq!(cap.take_lines(), vec!["hello", "result: 42"]);
        assert!(cap.take_lines().is_empty());
        put(b"ial\n");
        assert_eq!(cap.wait_lines(Duration::from_secs(1)), vec!["partial"]);
    }

    #[test]
    fn capture_is_bounded() {
        let cap = LineCapture::new(2);
        cap.push_bytes(b"1\n2\n3\n");
        assert_eq!(cap.dropped(), 1);
        assert_eq!(cap.take_lines(), vec!["2", "3"]);
        cap.push_bytes(&vec![b'a'; LineCapture::MAX_LINE_LEN + 1]);
        let lines = cap.take_lines();
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].len(), LineCapture::MAX_LINE_LEN);
        assert!(cap.wait_lines(Duration::from_millis(1)).is_empty());
    }
}
