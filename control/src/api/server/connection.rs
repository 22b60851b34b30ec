//! One client's connection, as the server's thread drives it: never blocking, each step taken
//! when `poll` says the socket is ready or the owner thread's answer came. A connection is
//! reading a request, waiting for the owner thread's answer to one, or writing a reply; it
//! reads nothing more while a request is being answered (requests sent ahead wait in the
//! socket), so what it holds is bounded by [`http::MAX_HEAD`] and [`http::MAX_BODY`].

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use super::super::http::{self, Body, HttpError, Parsed};
use super::super::schema::VmmPingResponse;
use super::super::{route, ApiCall, ApiResponse, Reply, Route};
use super::{IDLE_TIMEOUT, MAX_FDS, REQUEST_TIMEOUT};

/// Bytes taken from the socket per read.
const CHUNK: usize = 4096;

/// Where the owner thread's requests go, and what the server counts and is woken by.
pub(super) struct Owner<'a> {
    pub calls: &'a Sender<ApiCall>,
    pub ready: &'a Arc<EventFd>,
    pub answering: &'a Arc<AtomicUsize>,
}

enum State {
    /// Reading a request: `due` is when it must have arrived whole (None: idle since `idle`).
    Reading {
        due: Option<Instant>,
        idle: Instant,
    },
    /// The owner thread has the request; `keep_alive` says what follows the answer.
    Waiting {
        answer: Receiver<ApiResponse>,
        keep_alive: bool,
    },
    /// Writing `out` from `at`; the client must take some of it by `due`.
    Writing {
        out: Vec<u8>,
        at: usize,
        close: bool,
        due: Instant,
    },
    Closed,
}

/// One client's connection.
pub(super) struct Connection {
    stream: UnixStream,
    buf: Vec<u8>,
    fds: Vec<OwnedFd>,
    state: State,
    /// The peer hung up while its request was with the owner thread: not polled any more.
    hung_up: bool,
    /// A request of this connection is counted in the server's `answering`.
    counted: Option<Arc<AtomicUsize>>,
}

/// The outcome of a non-blocking step.
enum Step {
    /// Progress made; look again.
    Again,
    /// Nothing to do until the socket or the owner is ready.
    Blocked,
}

impl Connection {
    /// A connection on a non-blocking stream.
    pub fn new(stream: UnixStream, now: Instant) -> Self {
        Connection {
            stream,
            buf: Vec::new(),
            fds: Vec::new(),
            state: State::Reading {
                due: None,
                idle: now,
            },
            hung_up: false,
            counted: None,
        }
    }

    pub fn closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// The descriptor and events to poll (-1: none).
    pub fn interest(&self) -> (RawFd, libc::c_short) {
        let fd = self.stream.as_raw_fd();
        match self.state {
            State::Reading { .. } => (fd, libc::POLLIN),
            State::Writing { .. } => (fd, libc::POLLOUT),
            State::Waiting { .. } if !self.hung_up => (fd, 0),
            State::Waiting { .. } | State::Closed => (-1, 0),
        }
    }

    /// When this connection must next be looked at whatever the socket does.
    pub fn deadline(&self) -> Option<Instant> {
        match self.state {
            State::Reading { due: Some(d), .. } => Some(d),
            State::Reading { due: None, idle } => Some(idle + IDLE_TIMEOUT),
            State::Writing { due, .. } => Some(due),
            State::Waiting { .. } | State::Closed => None,
        }
    }

    /// Moves the connection on as far as it goes without blocking: `revents` is what poll
    /// said of its socket (0 when not polled or nothing happened).
    pub fn advance(&mut self, revents: libc::c_short, owner: &Owner, now: Instant) {
        if matches!(self.state, State::Waiting { .. })
            && revents & (libc::POLLHUP | libc::POLLERR) != 0
        {
            self.hung_up = true;
        }
        let mut readable = revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0;
        loop {
            let step = match self.state {
                State::Reading { .. } => self.read_step(&mut readable, owner, now),
                State::Waiting { .. } => self.wait_step(now),
                State::Writing { .. } => self.write_step(now),
                State::Closed => Step::Blocked,
            };
            if let Step::Blocked = step {
                break;
            }
        }
        self.check_deadline(now);
    }

    fn check_deadline(&mut self, now: Instant) {
        match self.state {
            State::Reading { due: Some(d), .. } if now >= d => {
                let late = HttpError::new(408, "The request did not arrive in time");
                self.fail(&late, now);
                // Sends what fits at once; a client that does not read it is cut at `due`.
                let _ = self.write_step(now);
            }
            State::Reading { due: None, idle } if now >= idle + IDLE_TIMEOUT => self.close(),
            State::Writing { due, .. } if now >= due => self.close(),
            _ => {}
        }
    }

    /// Parses what was read; reads more (once per readiness) when a request is partial.
    fn read_step(&mut self, readable: &mut bool, owner: &Owner, now: Instant) -> Step {
        match http::parse(&self.buf) {
            Ok(Parsed::Complete(req, used)) => {
                self.buf.drain(..used);
                let fds = std::mem::take(&mut self.fds);
                self.count(owner.answering);
                self.answer(&req, fds, owner, now);
                Step::Again
            }
            Ok(Parsed::Partial) if *readable => {
                *readable = false;
                match self.read_more(now) {
                    Ok(true) => Step::Again,
                    Ok(false) => {
                        self.close();
                        Step::Blocked
                    }
                    Err(e) => {
                        self.fail(&e, now);
                        Step::Again
                    }
                }
            }
            Ok(Parsed::Partial) => Step::Blocked,
            Err(e) => {
                self.fail(&e, now);
                Step::Again
            }
        }
    }

    /// Answers `vmm.ping` and refusals at once; hands other requests to the owner thread.
    fn answer(&mut self, req: &http::Request, fds: Vec<OwnedFd>, owner: &Owner, now: Instant) {
        let close = !req.keep_alive;
        let (status, body) = match route(req, fds) {
            Ok(Route::Ping) => {
                let ping = serde_json::to_string(&VmmPingResponse::current()).unwrap_or_default();
                (200, Body::Json(ping))
            }
            Ok(Route::Vmm(request)) => {
                let (reply, answer) = Reply::waking(owner.ready);
                if owner.calls.send(ApiCall { request, reply }).is_ok() {
                    // The main loop sleeps until woken (control::serve).
                    vmm::wake::wake();
                    self.state = State::Waiting {
                        answer,
                        keep_alive: req.keep_alive,
                    };
                    return;
                }
                gone()
            }
            Err(e) => (e.status, Body::Text(e.message)),
        };
        self.start_writing(status, &body, close, now);
    }

    /// Takes the owner thread's answer if it came.
    fn wait_step(&mut self, now: Instant) -> Step {
        let State::Waiting { answer, keep_alive } = &self.state else {
            return Step::Blocked;
        };
        let close = !*keep_alive;
        let (status, body) = match answer.try_recv() {
            Ok(ApiResponse::NoContent) => (204, Body::None),
            Ok(ApiResponse::Json(j)) => (200, Body::Json(j)),
            Ok(ApiResponse::Error(e)) => (e.status, Body::Text(e.message)),
            Err(TryRecvError::Empty) => return Step::Blocked,
            Err(TryRecvError::Disconnected) => gone(),
        };
        self.start_writing(status, &body, close, now);
        Step::Again
    }

    fn start_writing(&mut self, status: u16, body: &Body, close: bool, now: Instant) {
        self.state = State::Writing {
            out: http::response(status, body, close),
            at: 0,
            close,
            due: now + REQUEST_TIMEOUT,
        };
    }

    /// Writes what the socket takes; once the reply is out, reads the next request.
    fn write_step(&mut self, now: Instant) -> Step {
        let State::Writing {
            out,
            at,
            close,
            due,
        } = &mut self.state
        else {
            return Step::Blocked;
        };
        while *at < out.len() {
            let rest = &out[*at..];
            // SAFETY: sends from a live slice of `rest.len()` bytes on a socket this
            // connection owns; MSG_NOSIGNAL: a client gone is an error here, not a SIGPIPE.
            let n = unsafe {
                libc::send(
                    self.stream.as_raw_fd(),
                    rest.as_ptr().cast(),
                    rest.len(),
                    libc::MSG_NOSIGNAL,
                )
            };
            if n > 0 {
                *at += n as usize;
                *due = now + REQUEST_TIMEOUT;
                continue;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => return Step::Blocked,
                _ => {
                    self.close();
                    return Step::Blocked;
                }
            }
        }
        let close = *close;
        self.uncount();
        if close {
            self.close();
            return Step::Blocked;
        }
        // Idle, or the next request (sent ahead) is due from now.
        let due = (!self.buf.is_empty()).then(|| now + REQUEST_TIMEOUT);
        self.state = State::Reading { due, idle: now };
        Step::Again
    }

    /// Answers a request that cannot be served, then closes.
    fn fail(&mut self, e: &HttpError, now: Instant) {
        self.start_writing(e.status, &Body::Text(e.message.clone()), true, now);
    }

    fn close(&mut self) {
        self.uncount();
        self.state = State::Closed;
    }

    fn count(&mut self, answering: &Arc<AtomicUsize>) {
        if self.counted.is_none() {
            answering.fetch_add(1, Ordering::AcqRel);
            self.counted = Some(Arc::clone(answering));
        }
    }

    fn uncount(&mut self) {
        if let Some(answering) = self.counted.take() {
            answering.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Reads what the client sent next, with any descriptors: false at the client's end
    /// (or an error) or when nothing was there, Err when too many descriptors came.
    fn read_more(&mut self, now: Instant) -> Result<bool, HttpError> {
        let mut chunk = [0u8; CHUNK];
        let mut fds: [RawFd; MAX_FDS] = [-1; MAX_FDS];
        let mut iov = [libc::iovec {
            iov_base: chunk.as_mut_ptr().cast(),
            iov_len: chunk.len(),
        }];
        // SAFETY: the iovec points at `chunk`, which may take any bytes; descriptors the
        // kernel hands over are wrapped in OwnedFd below, so each is closed once.
        let received = unsafe { self.stream.recv_with_fds(&mut iov, &mut fds) };
        match received {
            Ok((0, _)) => Ok(false),
            Ok((n, count)) => {
                for &fd in &fds[..count] {
                    // SAFETY: the kernel just gave this process `fd`; nothing else owns it.
                    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                    if self.fds.len() < MAX_FDS {
                        self.fds.push(owned);
                    }
                }
                self.buf.extend_from_slice(&chunk[..n]);
                if let State::Reading {
                    due: due @ None, ..
                } = &mut self.state
                {
                    *due = Some(now + REQUEST_TIMEOUT);
                }
                Ok(true)
            }
            // More descriptors than MAX_FDS: the kernel and vmm-sys-util closed them all, and
            // the bytes that came with them are gone, so the request cannot be answered as
            // sent; the client hears why before the connection closes.
            Err(e) if e.errno() == libc::ENOBUFS => Err(HttpError::new(
                400,
                format!(
                    "A request may bring at most {MAX_FDS} file descriptors; \
                     this one brought more (all closed)"
                ),
            )),
            // Woken for nothing (or interrupted): poll again.
            Err(e) if matches!(e.errno(), libc::EAGAIN | libc::EINTR) => Ok(true),
            Err(_) => Ok(false),
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.uncount();
    }
}

/// The answer when the owner thread is gone.
fn gone() -> (u16, Body) {
    (503, Body::Text("The VMM is shutting down".into()))
}
