//! `migration_receiver`: a live migration's receiving side fed arbitrary bytes as the
//! source's: request headers, MemoryFd, the Config's JSON, memory tables and their bytes,
//! the State's JSON (a snapshot's state.json), in any order. It must refuse in one line,
//! never panic, never write outside guest memory, never allocate what the peer's lengths
//! say beyond the protocol's bounds. The destination here is guest memory of at most
//! 1 MiB as the Config lays it out; the State is parsed and checked as a restore would.

use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;

use vmm::migration::protocol::MigrationConfig;
use vmm::migration::receiver::{self, Channel, Destination};
use vmm::migration::MigrationError;
use vmm::snapshot::{device_data, SnapshotState};

/// Most guest memory the fake destination makes.
const MAX_MEMORY: u64 = 1 << 20;

struct Bytes<'a> {
    data: &'a [u8],
}

impl Read for Bytes<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.data.read(buf)
    }
}

impl Write for Bytes<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Channel for Bytes<'_> {
    fn recv_with_fd(&mut self, buf: &mut [u8]) -> io::Result<Option<OwnedFd>> {
        self.data.read_exact(buf)?;
        Ok(std::fs::File::open("/dev/null").ok().map(OwnedFd::from))
    }
}

#[derive(Default)]
struct Fake {
    regions: Vec<(u64, u64)>,
    memory: Vec<Vec<u8>>,
    stated: bool,
}

impl Destination for Fake {
    fn configure(
        &mut self,
        c: MigrationConfig,
        _fds: Vec<(u32, OwnedFd)>,
    ) -> Result<(), MigrationError> {
        let total = c
            .regions
            .iter()
            .map(|r| r.size)
            .fold(0u64, u64::saturating_add);
        if total > MAX_MEMORY {
            return Err(MigrationError::Destination("too much memory".into()));
        }
        self.regions = c.regions.iter().map(|r| (r.gpa, r.size)).collect();
        self.memory = c.regions.iter().map(|r| vec![0; r.size as usize]).collect();
        Ok(())
    }

    fn regions(&self) -> Vec<(u64, u64)> {
        self.regions.clone()
    }

    fn write(&mut self, region: usize, offset: u64, bytes: &[u8]) -> Result<(), MigrationError> {
        let mem = &mut self.memory[region];
        let end = offset as usize + bytes.len();
        assert!(end <= mem.len(), "a write past region {region}'s end");
        mem[offset as usize..end].copy_from_slice(bytes);
        Ok(())
    }

    /// As exitless's destination reads it: the length, state.json, the devices' data.
    fn state(&mut self, state: &[u8]) -> Result<(), MigrationError> {
        let (json, data) = device_data::unframe_state(state).map_err(MigrationError::Protocol)?;
        let mut parsed = SnapshotState::parse(json)?;
        device_data::take_all(data, &mut parsed.devices)?;
        self.stated = true;
        Ok(())
    }

    fn complete(&mut self, _resume: bool) -> Result<(), MigrationError> {
        assert!(self.stated, "complete before a state");
        Ok(())
    }
}

/// The receiver over `data` as the source's bytes.
pub fn migration_receiver(data: &[u8]) {
    let mut ch = Bytes { data };
    let mut dest = Fake::default();
    if let Err(e) = receiver::receive(&mut ch, &mut dest) {
        assert!(!e.to_string().contains('\n'), "{e}");
    }
}
