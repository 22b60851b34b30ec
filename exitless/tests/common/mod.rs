//! Shared by the integration tests: a child's output read as it comes, waited on with a limit.

use std::io::Read;
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// The output of a pipe, read by a thread of its own, so a test can wait for what it expects.
pub struct Stream {
    chunks: Receiver<String>,
    /// Everything read so far.
    pub text: String,
}

impl Stream {
    /// Starts reading `pipe` until it ends. The pipe is drained to its end even after the
    /// `Stream` is dropped, so a child never finds its output closed under it (a test that
    /// stops listening must not change how the child runs).
    pub fn spawn(mut pipe: impl Read + Send + 'static) -> Self {
        let (tx, chunks) = channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = pipe.read(&mut buf) {
                // Nobody listens any more: keep reading, discard.
                let _ = tx.send(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        });
        Stream {
            chunks,
            text: String::new(),
        }
    }

    /// Reads until `done(text)` holds (true), the pipe ends or `limit` passes (false).
    pub fn wait_for(&mut self, limit: Duration, done: impl Fn(&str) -> bool) -> bool {
        let deadline = Instant::now() + limit;
        while !done(&self.text) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.chunks.recv_timeout(left) {
                Ok(chunk) => self.text.push_str(&chunk),
                Err(_) => return false,
            }
        }
        true
    }

    /// Reads until the pipe ends or `limit` passes.
    pub fn read_to_end(&mut self, limit: Duration) {
        self.wait_for(limit, |_| false);
    }
}
