//! The receiving side's state machine, apart from the VM it makes ([`Destination`]): Start,
//! then MemoryFds (`local`), Config, Memory requests, State, then Complete (run) or
//! CompletePaused. Any request out of order, any malformed one, any failure of the
//! destination is answered with an Error response and ends the migration; Abandon is
//! answered OK and ends it too. The peer's bytes never size an allocation beyond the bounds
//! of [`super::protocol`].

use std::io::{self, Read, Write};
use std::os::fd::{BorrowedFd, OwnedFd};

use super::protocol::{self, Command, MigrationConfig, Request, Response, HEADER_LEN};
use super::MigrationError;

/// Bytes read from the peer at once into guest memory.
const CHUNK: usize = 1 << 20;

/// A connection that may carry file descriptors (a Unix socket's SCM_RIGHTS).
pub trait Channel: Read + Write {
    /// Reads exactly `buf.len()` bytes that came with one file descriptor.
    fn recv_with_fd(&mut self, buf: &mut [u8]) -> io::Result<Option<OwnedFd>>;
    /// The socket, where guest memory can be read into straight ([`Destination::fill`]).
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
}

/// What the received migration makes.
pub trait Destination {
    /// Makes guest memory as `config` describes (from `fds`, by slot, for `local`).
    fn configure(
        &mut self,
        config: MigrationConfig,
        fds: Vec<(u32, OwnedFd)>,
    ) -> Result<(), MigrationError>;
    /// Guest memory's regions as `(gpa, size)`, once configured.
    fn regions(&self) -> Vec<(u64, u64)>;
    /// Writes `bytes` at `offset` of region `region` (inside it: checked by the caller).
    fn write(&mut self, region: usize, offset: u64, bytes: &[u8]) -> Result<(), MigrationError>;
    /// Reads `len` bytes from `from` into region `region` at `offset` (inside it: checked by
    /// the caller); by default through [`Destination::write`].
    fn fill(
        &mut self,
        region: usize,
        offset: u64,
        len: u64,
        from: BorrowedFd<'_>,
    ) -> Result<(), MigrationError> {
        let io = |e| MigrationError::Io("reading guest memory", e);
        let mut f = std::fs::File::from(from.try_clone_to_owned().map_err(io)?);
        let mut buf = vec![0u8; (len as usize).min(CHUNK)];
        let mut at = 0;
        while at < len {
            let n = (len - at).min(CHUNK as u64) as usize;
            f.read_exact(&mut buf[..n]).map_err(io)?;
            self.write(region, offset + at, &buf[..n])?;
            at += n as u64;
        }
        Ok(())
    }
    /// Makes the VM from its state (`state.json`'s bytes), paused.
    fn state(&mut self, state: &[u8]) -> Result<(), MigrationError>;
    /// The migration is complete: runs the VM if `resume`.
    fn complete(&mut self, resume: bool) -> Result<(), MigrationError>;
}

/// Where the protocol stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Connected,
    Started,
    Configured,
    StateReceived,
}

/// How a migration that completed ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Received {
    /// The VM runs (Complete), or stays paused (CompletePaused).
    pub resumed: bool,
    /// Bytes of guest memory received.
    pub memory_bytes: u64,
    pub memory_requests: u64,
}

/// Serves one migration on `ch` into `dest`. On an error the peer is answered Error (if the
/// connection still takes it) and the error returned.
pub fn receive(
    ch: &mut dyn Channel,
    dest: &mut dyn Destination,
) -> Result<Received, MigrationError> {
    let mut run = Run {
        phase: Phase::Connected,
        fds: Vec::new(),
        done: Received::default(),
        buf: Vec::new(),
    };
    loop {
        match run.step(ch, dest) {
            Ok(finished) => {
                respond(ch, Response::ok())?;
                if finished {
                    return Ok(run.done);
                }
            }
            Err(MigrationError::Abandoned) => {
                let _ = respond(ch, Response::ok());
                return Err(MigrationError::Abandoned);
            }
            Err(e) => {
                let _ = respond(ch, Response::error());
                return Err(e);
            }
        }
    }
}

fn respond(ch: &mut dyn Channel, r: Response) -> Result<(), MigrationError> {
    ch.write_all(&r.encode())
        .and_then(|()| ch.flush())
        .map_err(|e| MigrationError::Io("answering the source", e))
}

struct Run {
    phase: Phase,
    fds: Vec<(u32, OwnedFd)>,
    done: Received,
    buf: Vec<u8>,
}

impl Run {
    /// One request: Ok(true) once the migration is complete.
    fn step(
        &mut self,
        ch: &mut dyn Channel,
        dest: &mut dyn Destination,
    ) -> Result<bool, MigrationError> {
        let mut h = [0u8; HEADER_LEN];
        ch.read_exact(&mut h)
            .map_err(|e| MigrationError::Io("reading a request", e))?;
        let req = Request::decode(&h)?;
        let out_of_order = || {
            MigrationError::Protocol(format!(
                "a {:?} request where the migration is {:?}",
                req.command, self.phase
            ))
        };
        match (req.command, self.phase) {
            (Command::Abandon, _) => return Err(MigrationError::Abandoned),
            (Command::Start, Phase::Connected) => self.phase = Phase::Started,
            (Command::MemoryFd, Phase::Started) => self.memory_fd(ch, req.length)?,
            (Command::Config, Phase::Started) => {
                let bytes = self.payload(ch, req.length)?;
                let config = MigrationConfig::parse(bytes)?;
                dest.configure(config, std::mem::take(&mut self.fds))?;
                self.phase = Phase::Configured;
            }
            (Command::Memory, Phase::Configured) => self.memory(ch, req.length, dest)?,
            (Command::State, Phase::Configured) => {
                let bytes = self.payload(ch, req.length)?;
                dest.state(bytes)?;
                self.phase = Phase::StateReceived;
            }
            (Command::Complete | Command::CompletePaused, Phase::StateReceived) => {
                let resume = req.command == Command::Complete;
                dest.complete(resume)?;
                self.done.resumed = resume;
                return Ok(true);
            }
            _ => return Err(out_of_order()),
        }
        Ok(false)
    }

    /// The request's payload (its length already bounded by its command).
    fn payload(&mut self, ch: &mut dyn Channel, len: u64) -> Result<&[u8], MigrationError> {
        self.buf.clear();
        let got = ch
            .take(len)
            .read_to_end(&mut self.buf)
            .map_err(|e| MigrationError::Io("reading a request's payload", e))?;
        if got as u64 != len {
            return Err(MigrationError::Protocol(format!(
                "the connection ended {got} bytes into a payload of {len}"
            )));
        }
        Ok(&self.buf)
    }

    fn memory_fd(&mut self, ch: &mut dyn Channel, len: u64) -> Result<(), MigrationError> {
        if len != 4 || self.fds.len() >= protocol::MAX_REGIONS {
            return Err(MigrationError::Protocol(format!(
                "a MemoryFd request of {len} bytes after {} of them",
                self.fds.len()
            )));
        }
        let mut slot = [0u8; 4];
        let fd = ch
            .recv_with_fd(&mut slot)
            .map_err(|e| MigrationError::Io("receiving a memory fd", e))?
            .ok_or_else(|| MigrationError::Protocol("a MemoryFd request without an fd".into()))?;
        self.fds.push((u32::from_le_bytes(slot), fd));
        Ok(())
    }

    /// A table of ranges, then their bytes, each range into guest memory.
    fn memory(
        &mut self,
        ch: &mut dyn Channel,
        len: u64,
        dest: &mut dyn Destination,
    ) -> Result<(), MigrationError> {
        let table = protocol::decode_table(self.payload(ch, len)?)?;
        let regions = dest.regions();
        let total: u64 = regions.iter().map(|r| r.1).sum();
        let placed = protocol::place_ranges(&table, &regions, total)?;
        for (region, offset, length) in placed {
            if let Some(fd) = ch.fd() {
                dest.fill(region, offset, length, fd)?;
                self.done.memory_bytes += length;
                continue;
            }
            self.buf.resize(CHUNK, 0);
            let mut at = 0;
            while at < length {
                let n = (length - at).min(CHUNK as u64) as usize;
                ch.read_exact(&mut self.buf[..n])
                    .map_err(|e| MigrationError::Io("reading guest memory", e))?;
                dest.write(region, offset + at, &self.buf[..n])?;
                at += n as u64;
            }
            self.done.memory_bytes += length;
        }
        self.done.memory_requests += 1;
        Ok(())
    }
}
