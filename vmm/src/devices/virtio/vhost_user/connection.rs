//! One vhost-user request and its reply at a time, with a bounded wait.
//!
//! The message layouts and codes are the `vhost` crate's (`vhost_user::message`); the
//! exchange is exitless's own, because the crate's `Frontend` retries a receive that timed out
//! (EAGAIN) for ever, so a back end that never answers would hold the devices thread. Here
//! every reply is awaited at most [`Connection`]'s timeout, checked (request code, reply flag,
//! version, size) before it is read, and the first failure marks the connection broken: a
//! back end that lied once gets no more requests.

use std::io::{self, Read};
use std::os::fd::RawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{FrontendReq, VhostUserMsgValidator, VhostUserU64};
use vm_memory::ByteValued;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use super::VhostUserError;

/// The header's version (bits 0-1).
const VERSION: u32 = 0x1;
/// The header's reply flag.
const FLAG_REPLY: u32 = 0x4;
/// The header's "needs a reply" flag (REPLY_ACK).
const FLAG_NEED_REPLY: u32 = 0x8;
/// Size of a message header: request, flags, size (u32 each, native order).
pub const HEADER_LEN: usize = 12;

/// The name of a request, for errors.
pub fn request_name(code: FrontendReq) -> String {
    format!("{code:?}")
}

/// The socket to one back end.
#[derive(Debug)]
pub struct Connection {
    sock: UnixStream,
    timeout: Duration,
    reply_ack: bool,
    broken: Option<String>,
}

impl Connection {
    /// Talks over `sock`, waiting at most `timeout` for each reply (and each send).
    pub fn new(sock: UnixStream, timeout: Duration) -> io::Result<Self> {
        sock.set_read_timeout(Some(timeout))?;
        sock.set_write_timeout(Some(timeout))?;
        Ok(Connection {
            sock,
            timeout,
            reply_ack: false,
            broken: None,
        })
    }

    /// The socket, for watching it (a closed back end) while no request is out.
    pub fn socket(&self) -> &UnixStream {
        &self.sock
    }

    /// From now on requests without a reply of their own ask for an ack (REPLY_ACK was
    /// negotiated) and fail when the back end refuses them.
    pub fn set_reply_ack(&mut self, on: bool) {
        self.reply_ack = on;
    }

    /// Why the connection broke, if it did.
    pub fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    /// Sends `code` with `body` and `fds`; with REPLY_ACK, waits for the back end's ack.
    pub fn send(
        &mut self,
        code: FrontendReq,
        body: &[u8],
        fds: &[RawFd],
    ) -> Result<(), VhostUserError> {
        let ack = self.reply_ack;
        self.guarded(|c| {
            c.write_message(code, body, fds, ack)?;
            if ack {
                let status: VhostUserU64 = c.read_reply(code)?;
                if status.value != 0 {
                    return Err(VhostUserError::Refused {
                        request: request_name(code),
                        status: status.value,
                    });
                }
            }
            Ok(())
        })
    }

    /// Sends `code` with an 8-byte `value` as its body (see [`Connection::send`]).
    pub fn send_u64(
        &mut self,
        code: FrontendReq,
        value: u64,
        fds: &[RawFd],
    ) -> Result<(), VhostUserError> {
        self.send(code, VhostUserU64::new(value).as_slice(), fds)
    }

    /// Sends `code` with `body` and returns the back end's reply.
    pub fn ask<T: ByteValued + VhostUserMsgValidator + Default>(
        &mut self,
        code: FrontendReq,
        body: &[u8],
    ) -> Result<T, VhostUserError> {
        self.guarded(|c| {
            c.write_message(code, body, &[], false)?;
            c.read_reply(code)
        })
    }

    /// Sends `code` with `body` and returns the reply's body, whose size is the back end's to
    /// choose (GET_CONFIG: an empty body is a refusal), at most `max` bytes.
    pub fn ask_sized(
        &mut self,
        code: FrontendReq,
        body: &[u8],
        max: usize,
    ) -> Result<Vec<u8>, VhostUserError> {
        self.guarded(|c| {
            c.write_message(code, body, &[], false)?;
            let size = c.read_header(code)? as usize;
            if size > max {
                return Err(VhostUserError::WrongSize {
                    request: request_name(code),
                    want: max,
                    got: size as u32,
                });
            }
            let mut reply = vec![0u8; size];
            c.read_exactly(code, &mut reply)?;
            Ok(reply)
        })
    }

    /// Sends `code` with `body` and `fds` (SET_DEVICE_STATE_FD's pipe, SET_LOG_BASE's log
    /// region) and returns the back end's reply.
    pub fn ask_with_fds<T: ByteValued + VhostUserMsgValidator + Default>(
        &mut self,
        code: FrontendReq,
        body: &[u8],
        fds: &[RawFd],
    ) -> Result<T, VhostUserError> {
        self.guarded(|c| {
            c.write_message(code, body, fds, false)?;
            c.read_reply(code)
        })
    }

    /// Runs one exchange unless the connection is broken; a failure breaks it.
    fn guarded<T>(
        &mut self,
        exchange: impl FnOnce(&mut Self) -> Result<T, VhostUserError>,
    ) -> Result<T, VhostUserError> {
        if let Some(why) = &self.broken {
            return Err(VhostUserError::Broken(why.clone()));
        }
        exchange(self).inspect_err(|e| self.broken = Some(e.to_string()))
    }

    fn write_message(
        &mut self,
        code: FrontendReq,
        body: &[u8],
        fds: &[RawFd],
        need_reply: bool,
    ) -> Result<(), VhostUserError> {
        let flags = VERSION | if need_reply { FLAG_NEED_REPLY } else { 0 };
        let mut message = Vec::with_capacity(HEADER_LEN + body.len());
        message.extend_from_slice(&u32::from(code).to_ne_bytes());
        message.extend_from_slice(&flags.to_ne_bytes());
        message.extend_from_slice(&(body.len() as u32).to_ne_bytes());
        message.extend_from_slice(body);
        let failed = |error: io::Error| match error.kind() {
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => {
                VhostUserError::Closed(request_name(code))
            }
            _ => VhostUserError::Send {
                request: request_name(code),
                error,
            },
        };
        // The fds go with the first bytes; a short send (a full socket) sends the rest alone.
        let mut sent = self
            .sock
            .send_with_fds(&[&message[..]], fds)
            .map_err(|e| failed(io::Error::from_raw_os_error(e.errno())))?;
        while sent < message.len() {
            let n = self
                .sock
                .send_with_fds(&[&message[sent..]], &[])
                .map_err(|e| failed(io::Error::from_raw_os_error(e.errno())))?;
            if n == 0 {
                return Err(VhostUserError::Closed(request_name(code)));
            }
            sent += n;
        }
        Ok(())
    }

    /// Reads `buf` whole within the timeout (counted from the first read).
    fn read_exactly(&mut self, code: FrontendReq, buf: &mut [u8]) -> Result<(), VhostUserError> {
        let start = Instant::now();
        let mut done = 0;
        while done < buf.len() {
            if start.elapsed() > self.timeout {
                return Err(self.timed_out(code));
            }
            match self.sock.read(&mut buf[done..]) {
                Ok(0) => return Err(VhostUserError::Closed(request_name(code))),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                    return Err(VhostUserError::Closed(request_name(code)))
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(self.timed_out(code))
                }
                Err(error) => {
                    return Err(VhostUserError::Receive {
                        request: request_name(code),
                        error,
                    })
                }
            }
        }
        Ok(())
    }

    fn timed_out(&self, code: FrontendReq) -> VhostUserError {
        VhostUserError::Timeout {
            request: request_name(code),
            after: self.timeout,
        }
    }

    /// A reply's header: request code, reply flag and version checked; returns the body's size.
    fn read_header(&mut self, code: FrontendReq) -> Result<u32, VhostUserError> {
        let mut header = [0u8; HEADER_LEN];
        self.read_exactly(code, &mut header)?;
        let word =
            |i: usize| u32::from_ne_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
        let (request, flags, size) = (word(0), word(4), word(8));
        if request != u32::from(code) || flags & FLAG_REPLY == 0 || flags & 0x3 != VERSION {
            return Err(VhostUserError::WrongReply {
                request: request_name(code),
                got: FrontendReq::try_from(request)
                    .map_or_else(|_| format!("request code {request}"), request_name),
                flags,
            });
        }
        Ok(size)
    }

    /// The reply to `code`: its header checked first, then its body of exactly `T`'s size.
    fn read_reply<T: ByteValued + VhostUserMsgValidator + Default>(
        &mut self,
        code: FrontendReq,
    ) -> Result<T, VhostUserError> {
        let mut header = [0u8; HEADER_LEN];
        self.read_exactly(code, &mut header)?;
        let word =
            |i: usize| u32::from_ne_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
        let (request, flags, size) = (word(0), word(4), word(8));
        if request != u32::from(code) || flags & FLAG_REPLY == 0 || flags & 0x3 != VERSION {
            return Err(VhostUserError::WrongReply {
                request: request_name(code),
                got: FrontendReq::try_from(request)
                    .map_or_else(|_| format!("request code {request}"), request_name),
                flags,
            });
        }
        let want = std::mem::size_of::<T>();
        if size as usize != want {
            return Err(VhostUserError::WrongSize {
                request: request_name(code),
                want,
                got: size,
            });
        }
        let mut body = T::default();
        self.read_exactly(code, body.as_mut_slice())?;
        if !body.is_valid() {
            return Err(VhostUserError::WrongReply {
                request: request_name(code),
                got: "an invalid body".into(),
                flags,
            });
        }
        Ok(body)
    }
}
