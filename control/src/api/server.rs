//! The API's Unix socket, served by one thread that touches no VM: it polls the listener,
//! every open connection and an eventfd the owner thread's answers write, and moves each
//! connection on without blocking ([`connection`]): reading requests (with the file
//! descriptors sent with them), answering `vmm.ping` itself, handing every other request to
//! the VM's owner thread and writing its answer when it comes. A request waiting for the
//! owner thread (a `vm.boot`, a migration) holds only its own connection; the others are
//! read and answered meanwhile, and their requests for the VM queue behind it on the owner
//! thread as they always did. A slow or hostile client holds no one up: a request must
//! arrive whole within [`REQUEST_TIMEOUT`] of its first byte, however slowly its bytes
//! trickle in (408 then), a reply must be taken within it too, a connection idle before or
//! between requests is closed after [`IDLE_TIMEOUT`], and beyond [`MAX_CONNECTIONS`] a new
//! connection is answered 503 and closed. When the process runs out of file descriptors,
//! accepting pauses ([`AcceptErrors`]). No thread is started per connection.

mod connection;

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use thiserror::Error;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::http::{self, Body};
use super::ApiCall;
use connection::{Connection, Owner};

/// Most connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// How long a request may take to arrive, whole, once its first byte has (and a reply to be
/// taken, once its last byte was).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a keep-alive connection may sit idle between requests.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Most file descriptors one request may bring (Kata sends one per queue pair).
pub const MAX_FDS: usize = 16;

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

/// The running server; dropping it stops its thread and removes the socket file.
pub struct ApiServer {
    path: PathBuf,
    /// The socket file as bound (device and inode): removed at the end only if still ours.
    bound: Option<(u64, u64)>,
    /// The listening socket (shared with the server's thread), shut down at the end: whatever
    /// happened to the path, the stop does not depend on it.
    socket: UnixListener,
    stop: Arc<AtomicBool>,
    /// Wakes the server's thread: answers from the owner thread, and the stop.
    ready: Arc<EventFd>,
    listener: Option<JoinHandle<()>>,
    /// Requests read whose replies are not written yet.
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
    let listen = |error| ApiServerError::Listen {
        path: shown.clone(),
        error,
    };
    let listener = UnixListener::bind(path).map_err(listen)?;
    listener.set_nonblocking(true).map_err(listen)?;
    Ok(listener)
}

impl ApiServer {
    /// Listens on `path`; requests for the VM go to `calls`.
    pub fn start(path: &Path, calls: Sender<ApiCall>) -> Result<ApiServer, ApiServerError> {
        let listener = bind(path)?;
        let bound = std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()));
        let listen = |error| ApiServerError::Listen {
            path: path.display().to_string(),
            error,
        };
        let socket = listener.try_clone().map_err(listen)?;
        let ready = Arc::new(EventFd::new(EFD_NONBLOCK).map_err(listen)?);
        let stop = Arc::new(AtomicBool::new(false));
        let answering = Arc::new(AtomicUsize::new(0));
        let (flag, replies, wake) = (stop.clone(), answering.clone(), ready.clone());
        let thread = thread::Builder::new()
            .name("api".into())
            .spawn(move || {
                if let Err(e) = vmm::seccomp::apply(vmm::seccomp::ThreadKind::Api) {
                    eprintln!("exitless: {e}; the API is not served");
                } else {
                    let owner = Owner {
                        calls: &calls,
                        ready: &wake,
                        answering: &replies,
                    };
                    Server::new(&listener, &flag).run(&owner);
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
            ready,
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
        let _ = self.ready.write(1);
        // No new connection is taken. Not a connection to the path: the file may be gone or
        // replaced.
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

/// The server's thread: the listener, the connections, and when accepting may resume.
struct Server<'a> {
    listener: &'a UnixListener,
    stop: &'a AtomicBool,
    connections: Vec<Connection>,
    errors: AcceptErrors,
    paused_until: Option<Instant>,
}

/// The poll set's first entries: the listener, then the wake-up; connections follow.
const FIRST_CONNECTION: usize = 2;

impl<'a> Server<'a> {
    fn new(listener: &'a UnixListener, stop: &'a AtomicBool) -> Self {
        Server {
            listener,
            stop,
            connections: Vec::with_capacity(MAX_CONNECTIONS),
            errors: AcceptErrors::default(),
            paused_until: None,
        }
    }

    /// Serves until the server is stopped or its listener fails for good.
    fn run(&mut self, owner: &Owner) {
        let mut polled: Vec<libc::pollfd> = Vec::with_capacity(MAX_CONNECTIONS + FIRST_CONNECTION);
        loop {
            let now = Instant::now();
            if self.paused_until.is_some_and(|t| now >= t) {
                self.paused_until = None;
            }
            let listening = if self.paused_until.is_none() {
                self.listener.as_raw_fd()
            } else {
                -1
            };
            polled.clear();
            polled.push(pollfd(listening, libc::POLLIN));
            polled.push(pollfd(owner.ready.as_raw_fd(), libc::POLLIN));
            for c in &self.connections {
                let (fd, events) = c.interest();
                polled.push(pollfd(fd, events));
            }
            if poll(&mut polled, self.timeout(now)) < 0 {
                continue; // EINTR: look again
            }
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            if polled[1].revents != 0 {
                // Drained: every answer that came is taken below.
                let _ = owner.ready.read();
            }
            let now = Instant::now();
            for (c, p) in self.connections.iter_mut().zip(&polled[FIRST_CONNECTION..]) {
                c.advance(p.revents, owner, now);
            }
            self.connections.retain(|c| !c.closed());
            if polled[0].revents != 0 && !self.accept(owner, now) {
                return;
            }
        }
    }

    /// How long poll may sleep: until the nearest deadline (None: until something happens,
    /// so an idle server makes no wake-ups).
    fn timeout(&self, now: Instant) -> libc::c_int {
        let nearest = self
            .connections
            .iter()
            .filter_map(Connection::deadline)
            .chain(self.paused_until)
            .min();
        match nearest {
            None => -1,
            // Rounded up, so that the deadline has passed when poll returns.
            Some(t) => t
                .saturating_duration_since(now)
                .as_micros()
                .div_ceil(1000)
                .min(i32::MAX as u128) as libc::c_int,
        }
    }

    /// Takes the pending connections; false when the listener is shut down or broken.
    fn accept(&mut self, owner: &Owner, now: Instant) -> bool {
        loop {
            // SAFETY: accept4(2) on the listener this server owns, with no address asked; a
            // descriptor it returns is wrapped at once, so it is closed once.
            let fd = unsafe {
                libc::accept4(
                    self.listener.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                )
            };
            if fd < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN) => return true,
                    // Shut down (the server's end) or not a listener any more.
                    Some(libc::EINVAL | libc::EBADF | libc::ENOTSOCK) => return false,
                    _ => {}
                }
                if let Some(pause) = self.errors.pause(&e) {
                    self.paused_until = Some(now + pause);
                    return true;
                }
                continue;
            }
            // SAFETY: accept4 just returned this descriptor; nothing else owns it.
            let stream = unsafe { UnixStream::from_raw_fd(fd) };
            if self.connections.len() >= MAX_CONNECTIONS {
                refuse(&stream);
                continue;
            }
            let mut c = Connection::new(stream, now);
            // A request sent with the connect is read at once.
            c.advance(libc::POLLIN, owner, now);
            if !c.closed() {
                self.connections.push(c);
            }
        }
    }
}

/// Answers a connection beyond [`MAX_CONNECTIONS`] 503, as far as its socket takes it at
/// once, and closes it.
fn refuse(stream: &UnixStream) {
    let busy = Body::Text("Too many API connections; try again".into());
    let reply = http::response(503, &busy, true);
    // SAFETY: sends from a live buffer of `reply.len()` bytes on a socket this server owns.
    unsafe {
        libc::send(
            stream.as_raw_fd(),
            reply.as_ptr().cast(),
            reply.len(),
            libc::MSG_NOSIGNAL,
        )
    };
}

fn pollfd(fd: RawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// poll(2) over `fds`, `timeout` ms (-1: no limit); negative on failure (EINTR).
fn poll(fds: &mut [libc::pollfd], timeout: libc::c_int) -> libc::c_int {
    // SAFETY: `fds` is a live, writable array of `fds.len()` pollfd entries.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) }
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

#[cfg(test)]
mod tests;
