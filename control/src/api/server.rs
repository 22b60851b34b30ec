//! The API's Unix socket: a listener thread and one thread per connection, none of which
//! touches the VM. A connection reads requests (with the file descriptors sent with them),
//! answers `vmm.ping` itself and hands every other request to the VM's owner thread,
//! waiting on its own reply channel. A slow or hostile client holds only its own thread, and
//! not for long: a request must arrive whole within [`REQUEST_TIMEOUT`] of its first byte,
//! however slowly its bytes trickle in; a connection idle before or between requests is
//! closed after [`IDLE_TIMEOUT`]; beyond [`MAX_CONNECTIONS`] a new connection is answered 503 and closed.
//! When the process runs out of file descriptors, accepting pauses ([`AcceptErrors`]).

use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use thiserror::Error;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use super::http::{self, Body, HttpError, Parsed};
use super::schema::VmmPingResponse;
use super::{route, ApiCall, ApiResponse, Route};

/// Most connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// How long a request may take to arrive, whole, once its first byte has.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a keep-alive connection may sit idle between requests.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Most file descriptors one request may bring (Kata sends one per queue pair).
pub const MAX_FDS: usize = 16;
/// Stack of a connection thread: parsing and JSON need little.
const CONNECTION_STACK: usize = 256 * 1024;

/// Errors starting the server.
#[derive(Debug, Error)]
pub enum ApiServerError {
    #[error("API socket {0} is in use by a running program")]
    InUse(String),
    #[error("API socket path {0} exists and is not a socket; not removing it")]
    NotSocket(String),
    #[error("Cannot listen on API socket {path}: {error}")]
    Listen { path: String, error: io::Error },
    #[error("Cannot start the API thread: {0}")]
    Thread(io::Error),
}

/// The running server; dropping it stops the listener and removes the socket file.
pub struct ApiServer {
    path: PathBuf,
    /// The socket file as bound (device and inode): removed at the end only if still ours.
    bound: Option<(u64, u64)>,
    /// The listening socket (shared with the listener thread), shut down to end its accept:
    /// whatever happened to the path, the stop does not depend on it.
    socket: UnixListener,
    stop: Arc<AtomicBool>,
    listener: Option<JoinHandle<()>>,
    /// Requests handed to the VMM whose replies are not written yet.
    answering: Arc<AtomicUsize>,
}

/// How long the end of the server waits for replies still being written (`vmm.shutdown`'s
/// own, above all).
const REPLY_GRACE: Duration = Duration::from_secs(1);

/// Binds `path`, replacing a socket file nobody listens on.
fn bind(path: &Path) -> Result<UnixListener, ApiServerError> {
    let shown = path.display().to_string();
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(ApiServerError::NotSocket(shown));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(ApiServerError::InUse(shown));
        }
        let _ = std::fs::remove_file(path);
    }
    UnixListener::bind(path).map_err(|error| ApiServerError::Listen { path: shown, error })
}

impl ApiServer {
    /// Listens on `path`; requests for the VM go to `calls`.
    pub fn start(path: &Path, calls: Sender<ApiCall>) -> Result<ApiServer, ApiServerError> {
        let listener = bind(path)?;
        let bound = std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()));
        let socket = listener
            .try_clone()
            .map_err(|error| ApiServerError::Listen {
                path: path.display().to_string(),
                error,
            })?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let answering = Arc::new(AtomicUsize::new(0));
        let replies = answering.clone();
        let thread = thread::Builder::new()
            .name("api".into())
            .spawn(move || {
                if let Err(e) = vmm::seccomp::apply(vmm::seccomp::ThreadKind::Api) {
                    eprintln!("exitless: {e}; the API is not served");
                } else {
                    accept_loop(&listener, &calls, &flag, &replies);
                }
                // The main loop learns that requests can no longer come.
                drop(calls);
                vmm::wake::wake();
            })
            .map_err(ApiServerError::Thread)?;
        Ok(ApiServer {
            path: path.to_path_buf(),
            bound,
            socket,
            stop,
            listener: Some(thread),
            answering,
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let start = std::time::Instant::now();
        while self.answering.load(Ordering::Acquire) > 0 && start.elapsed() < REPLY_GRACE {
            thread::sleep(Duration::from_millis(1));
        }
        self.stop.store(true, Ordering::Release);
        // Ends the listener's accept (EINVAL on a shut-down listening socket); it sees the
        // flag and ends. Not a connection to the path: the file may be gone or replaced.
        // SAFETY: shutdown(2) on a socket this server owns; no memory is involved.
        unsafe { libc::shutdown(self.socket.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(t) = self.listener.take() {
            let _ = t.join();
        }
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| Some((m.dev(), m.ino())) == self.bound);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn accept_loop(
    listener: &UnixListener,
    calls: &Sender<ApiCall>,
    stop: &AtomicBool,
    answering: &Arc<AtomicUsize>,
) {
    let active = Arc::new(AtomicUsize::new(0));
    let mut errors = AcceptErrors::default();
    for stream in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let mut stream = match stream {
            Ok(stream) => stream,
            Err(e) => {
                if let Some(pause) = errors.pause(&e) {
                    thread::sleep(pause);
                }
                continue;
            }
        };
        if active.load(Ordering::Acquire) >= MAX_CONNECTIONS {
            let busy = Body::Text("Too many API connections; try again".into());
            let _ = stream.write_all(&http::response(503, &busy, true));
            continue;
        }
        active.fetch_add(1, Ordering::AcqRel);
        let (calls, done, answering) = (calls.clone(), active.clone(), answering.clone());
        let spawned = thread::Builder::new()
            .name("api-conn".into())
            .stack_size(CONNECTION_STACK)
            .spawn(move || {
                Connection::new(stream, calls, answering).serve();
                done.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            active.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// What the accept loop does when accepting fails. Out of file descriptors (or kernel
/// memory) the pending connection stays queued and accept fails again at once: the loop
/// would spin a core until a descriptor is freed. It pauses instead, and says so once.
#[derive(Debug, Default)]
pub struct AcceptErrors {
    /// Failures for want of resources.
    pub starved: u64,
}

/// How long accepting pauses after failing for want of file descriptors or memory.
pub const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

impl AcceptErrors {
    /// After accept failed with `e`: how long to pause before the next try (None: at once,
    /// for a failure of that one connection, such as a client that gave up).
    pub fn pause(&mut self, e: &io::Error) -> Option<Duration> {
        let starved = matches!(
            e.raw_os_error(),
            Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
        );
        if !starved {
            return None;
        }
        self.starved += 1;
        if self.starved == 1 {
            eprintln!(
                "exitless: the API cannot accept a connection: {e}; pausing {} ms between \
                 tries while it lasts (said once)",
                ACCEPT_PAUSE.as_millis()
            );
        }
        Some(ACCEPT_PAUSE)
    }
}

/// One client's connection.
struct Connection {
    stream: UnixStream,
    calls: Sender<ApiCall>,
    answering: Arc<AtomicUsize>,
    buf: Vec<u8>,
    fds: Vec<OwnedFd>,
    /// When the request being read must have arrived whole (None: idle between requests).
    due: Option<Instant>,
}

impl Connection {
    fn new(stream: UnixStream, calls: Sender<ApiCall>, answering: Arc<AtomicUsize>) -> Self {
        Connection {
            stream,
            calls,
            answering,
            buf: Vec::new(),
            fds: Vec::new(),
            due: None,
        }
    }

    /// Answers requests until the client closes, asks to close, stalls or breaks the protocol.
    fn serve(mut self) {
        loop {
            match http::parse(&self.buf) {
                Ok(Parsed::Complete(req, used)) => {
                    self.buf.drain(..used);
                    // Idle, or the next request (sent ahead) is due from now.
                    self.due = (!self.buf.is_empty()).then(|| Instant::now() + REQUEST_TIMEOUT);
                    let fds = std::mem::take(&mut self.fds);
                    self.answering.fetch_add(1, Ordering::AcqRel);
                    let (status, body) = self.answer(&req, fds);
                    let written = self.reply(status, &body, !req.keep_alive);
                    self.answering.fetch_sub(1, Ordering::AcqRel);
                    if written.is_err() || !req.keep_alive {
                        return;
                    }
                }
                Ok(Parsed::Partial) => match self.read_more() {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(timeout) => return self.fail(&timeout),
                },
                Err(e) => return self.fail(&e),
            }
        }
    }

    fn answer(&self, req: &http::Request, fds: Vec<OwnedFd>) -> (u16, Body) {
        match route(req, fds) {
            Ok(Route::Ping) => {
                let ping = serde_json::to_string(&VmmPingResponse::current()).unwrap_or_default();
                (200, Body::Json(ping))
            }
            Ok(Route::Vmm(request)) => {
                let (reply, answer) = channel();
                let gone = (503, Body::Text("The VMM is shutting down".into()));
                if self.calls.send(ApiCall { request, reply }).is_err() {
                    return gone;
                }
                // The main loop sleeps until woken (control::serve).
                vmm::wake::wake();
                match answer.recv() {
                    Ok(ApiResponse::NoContent) => (204, Body::None),
                    Ok(ApiResponse::Json(j)) => (200, Body::Json(j)),
                    Ok(ApiResponse::Error(e)) => (e.status, Body::Text(e.message)),
                    Err(_) => gone,
                }
            }
            Err(e) => (e.status, Body::Text(e.message)),
        }
    }

    fn reply(&mut self, status: u16, body: &Body, close: bool) -> io::Result<()> {
        self.stream.write_all(&http::response(status, body, close))
    }

    /// Answers a request that cannot be served and ends the connection.
    fn fail(&mut self, e: &HttpError) {
        let _ = self.reply(e.status, &Body::Text(e.message.clone()), true);
    }

    /// How long the next read may wait: until the request is due, or [`IDLE_TIMEOUT`]
    /// before and between requests; Err once the request is late.
    fn read_timeout(&self) -> Result<Duration, HttpError> {
        let Some(due) = self.due else {
            return Ok(IDLE_TIMEOUT);
        };
        match due.checked_duration_since(Instant::now()) {
            Some(left) if !left.is_zero() => Ok(left),
            _ => Err(HttpError::new(408, "The request did not arrive in time")),
        }
    }

    /// Reads what the client sent next, with any descriptors: false at the client's end
    /// (or an error), Err when a request did not arrive whole in time.
    fn read_more(&mut self) -> Result<bool, HttpError> {
        let timeout = self.read_timeout()?;
        if self.stream.set_read_timeout(Some(timeout)).is_err() {
            return Ok(false);
        }
        let mut chunk = [0u8; 4096];
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
                if self.due.is_none() {
                    self.due = Some(Instant::now() + REQUEST_TIMEOUT);
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
            Err(e) if matches!(e.errno(), libc::EAGAIN | libc::ETIMEDOUT) => {
                if self.buf.is_empty() {
                    return Ok(false); // idle: just close
                }
                Err(HttpError::new(408, "The request did not arrive in time"))
            }
            Err(_) => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests;
