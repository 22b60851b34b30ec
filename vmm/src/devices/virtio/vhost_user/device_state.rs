//! The back end's own state, moved through vhost-user's device-state protocol
//! (`VHOST_USER_PROTOCOL_F_DEVICE_STATE`): the front end sends `SET_DEVICE_STATE_FD` with one
//! end of a pipe and the direction (save: the back end writes its state into it; load: it
//! reads it), the writer closes its end when done, the reader reads to the end, and
//! `CHECK_DEVICE_STATE` says whether the back end succeeded (there is no error in the pipe).
//! Only in the "stopped" phase: the back end's queues are stopped first (GET_VRING_BASE), and
//! started again after a save, or for the first time after a load.
//!
//! virtiofsd (1.x, `--migration-mode find-paths` or `file-handles`) keeps its open inodes and
//! file handles this way. The bytes are the back end's business: a snapshot writes them beside
//! `state.json`, a migration sends them (both through [`Frontend::save_device_state`] and
//! [`Frontend::load_device_state`]).

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{
    FrontendReq, VhostTransferStateDirection, VhostTransferStatePhase, VhostUserProtocolFeatures,
    VhostUserTransferDeviceState, VhostUserU64,
};
use vm_memory::ByteValued;

use super::{Frontend, VhostUserError};

/// The most state a back end may hand over (a snapshot keeps it in one file).
pub const MAX_DEVICE_STATE: usize = 256 << 20;
/// How long the back end has to write or read its whole state.
pub const STATE_TIMEOUT: Duration = Duration::from_secs(30);
/// SET_DEVICE_STATE_FD's reply when the back end uses the front end's pipe (bit 8: no fd
/// of its own attached; bits 0-7: 0, success).
const USES_OUR_FD: u64 = 0x100;

impl Frontend {
    /// Whether the back end can hand over its state (DEVICE_STATE negotiated).
    pub fn has_device_state(&self) -> bool {
        self.protocol_features()
            .contains(VhostUserProtocolFeatures::DEVICE_STATE)
    }

    /// The back end's state, read through a pipe (direction save, phase stopped), then
    /// checked with CHECK_DEVICE_STATE. Its queues must be stopped (see [`Frontend::stop`]).
    pub fn save_device_state(&mut self) -> Result<Vec<u8>, VhostUserError> {
        let (ours, theirs) = pipe()?;
        self.set_device_state_fd(VhostTransferStateDirection::SAVE, theirs)?;
        let mut state = Vec::new();
        let read = read_to_end(ours, &mut state);
        // Asked even when the read failed: the back end then says what went wrong at its end.
        self.check_device_state()?;
        read.map_err(|e| VhostUserError::State(format!("reading its state: {e}")))?;
        Ok(state)
    }

    /// Hands the back end `state` (direction load, phase stopped), before its queues start,
    /// and asks it with CHECK_DEVICE_STATE whether it took it.
    pub fn load_device_state(&mut self, state: &[u8]) -> Result<(), VhostUserError> {
        if state.len() > MAX_DEVICE_STATE {
            return Err(VhostUserError::State(format!(
                "{} bytes of state, more than the {MAX_DEVICE_STATE} a back end may hold",
                state.len()
            )));
        }
        let (theirs, ours) = pipe()?;
        self.set_device_state_fd(VhostTransferStateDirection::LOAD, theirs)?;
        let written = write_all(ours, state);
        self.check_device_state()?;
        written.map_err(|e| VhostUserError::State(format!("writing its state: {e}")))
    }

    fn set_device_state_fd(
        &mut self,
        direction: VhostTransferStateDirection,
        end: OwnedFd,
    ) -> Result<(), VhostUserError> {
        if !self.has_device_state() {
            return Err(VhostUserError::Missing(
                "VHOST_USER_PROTOCOL_F_DEVICE_STATE (SET_DEVICE_STATE_FD)",
            ));
        }
        let body = VhostUserTransferDeviceState::new(direction, VhostTransferStatePhase::STOPPED);
        let reply: VhostUserU64 = self.conn.ask_with_fds(
            FrontendReq::SET_DEVICE_STATE_FD,
            body.as_slice(),
            &[end.as_raw_fd()],
        )?;
        // Our end of the pipe is the only one left: EOF (save) or EPIPE (load) once the back
        // end closes its copy.
        drop(end);
        match reply.value {
            USES_OUR_FD => Ok(()),
            0 => Err(VhostUserError::State(
                "it answered SET_DEVICE_STATE_FD with a channel of its own, which exitless \
                 does not take"
                    .into(),
            )),
            status => Err(VhostUserError::Refused {
                request: "SET_DEVICE_STATE_FD".into(),
                status,
            }),
        }
    }

    fn check_device_state(&mut self) -> Result<(), VhostUserError> {
        let status: VhostUserU64 = self.conn.ask(FrontendReq::CHECK_DEVICE_STATE, &[])?;
        match status.value {
            0 => Ok(()),
            status => Err(VhostUserError::Refused {
                request: "CHECK_DEVICE_STATE (the back end failed to save or load its state)"
                    .into(),
                status,
            }),
        }
    }
}

/// A pipe, both ends close-on-exec: (read end, write end).
fn pipe() -> Result<(OwnedFd, OwnedFd), VhostUserError> {
    let mut fds = [-1; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given, of the size it needs.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(VhostUserError::State(format!(
            "cannot make a pipe: {}",
            io::Error::last_os_error()
        )));
    }
    // SAFETY: both descriptors were just made by pipe2 and belong to nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Waits at most until `deadline` for `fd` to be ready for `events`.
fn wait_ready(fd: RawFd, events: libc::c_short, deadline: Instant) -> io::Result<()> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the back end took more than {STATE_TIMEOUT:?}"),
            ));
        }
        let mut p = libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        let ms = left.as_millis().min(1000) as libc::c_int;
        // SAFETY: one pollfd, owned by this frame, for the length given.
        match unsafe { libc::poll(&mut p, 1, ms) } {
            n if n > 0 => return Ok(()),
            0 => {}
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

/// Reads the pipe to its end, at most [`MAX_DEVICE_STATE`] bytes within [`STATE_TIMEOUT`].
///
/// The pipe blocks (no fcntl on the devices thread, whose filter lacks it): each read waits
/// in poll first, and then returns what is there.
fn read_to_end(fd: OwnedFd, into: &mut Vec<u8>) -> io::Result<()> {
    let deadline = Instant::now() + STATE_TIMEOUT;
    let mut file = File::from(fd);
    let mut buf = vec![0u8; 64 << 10];
    loop {
        wait_ready(file.as_raw_fd(), libc::POLLIN, deadline)?;
        match file.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) if into.len() + n > MAX_DEVICE_STATE => {
                return Err(io::Error::other(format!(
                    "more than {MAX_DEVICE_STATE} bytes of state"
                )))
            }
            Ok(n) => into.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Writes all of `state` into the pipe within [`STATE_TIMEOUT`], then closes it. The pipe
/// blocks: each write waits in poll until the pipe has room, and writes at most `PIPE_BUF`
/// bytes, which then fit without blocking.
fn write_all(fd: OwnedFd, state: &[u8]) -> io::Result<()> {
    let deadline = Instant::now() + STATE_TIMEOUT;
    let mut file = File::from(fd);
    let mut done = 0;
    while done < state.len() {
        wait_ready(file.as_raw_fd(), libc::POLLOUT, deadline)?;
        let end = state.len().min(done + libc::PIPE_BUF);
        match file.write(&state[done..end]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
