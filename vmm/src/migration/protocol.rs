//! Cloud Hypervisor's live-migration wire format, as exitless speaks it (docs/migration.md):
//! a 16-byte request header (u16 command, 6 bytes of which a Start's first two carry the
//! protocol version, u64 payload length, little-endian), a 16-byte response (u16 status, 6
//! bytes, u64 length), and a Memory request's payload: a table of `{gpa, length}` pairs (16
//! bytes each; the header's length is the table's) followed by the ranges' bytes in order.
//!
//! Pure: bytes in, values out. Everything the peer sends is checked here before anything is
//! allocated for it: a payload longer than its command may have is refused by its length.

use serde::{Deserialize, Serialize};

use super::MigrationError;

/// Bytes in a request header and in a response.
pub const HEADER_LEN: usize = 16;
/// Bytes of one `{gpa, length}` entry of a memory table.
pub const RANGE_LEN: usize = 16;
/// The protocol version exitless sends and accepts in Start (Cloud Hypervisor's current).
pub const PROTOCOL_VERSION: u16 = 0;
/// Longest Config payload (a VM's config and memory layout: a few kB).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// Longest State payload (a snapshot's state.json may be this long).
pub const MAX_STATE_BYTES: u64 = crate::snapshot::format::MAX_STATE_BYTES;
/// Most ranges in one Memory table (16 MiB of table).
pub const MAX_RANGES: usize = 1 << 20;
/// Most memory regions a Config may describe (and MemoryFd slots a receiver keeps).
pub const MAX_REGIONS: usize = 64;

/// A request's command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Command {
    Start = 1,
    Config = 2,
    State = 3,
    Memory = 4,
    Complete = 5,
    Abandon = 6,
    MemoryFd = 7,
    CompletePaused = 8,
}

impl Command {
    fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            1 => Command::Start,
            2 => Command::Config,
            3 => Command::State,
            4 => Command::Memory,
            5 => Command::Complete,
            6 => Command::Abandon,
            7 => Command::MemoryFd,
            8 => Command::CompletePaused,
            _ => return None,
        })
    }

    /// The most payload bytes this command may carry.
    pub fn max_payload(self) -> u64 {
        match self {
            Command::Start | Command::Complete | Command::Abandon | Command::CompletePaused => 0,
            Command::MemoryFd => 4,
            Command::Config => MAX_CONFIG_BYTES,
            Command::State => MAX_STATE_BYTES,
            Command::Memory => (MAX_RANGES * RANGE_LEN) as u64,
        }
    }
}

/// A request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub command: Command,
    /// The sender's protocol version (Start only; 0 otherwise).
    pub version: u16,
    /// Payload bytes after the header (a Memory request: its table's).
    pub length: u64,
}

impl Request {
    pub fn new(command: Command, length: u64) -> Self {
        Request {
            command,
            version: PROTOCOL_VERSION,
            length,
        }
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[..2].copy_from_slice(&(self.command as u16).to_le_bytes());
        if self.command == Command::Start {
            b[2..4].copy_from_slice(&self.version.to_le_bytes());
        }
        b[8..].copy_from_slice(&self.length.to_le_bytes());
        b
    }

    /// A header from the peer: a known command whose length fits it (a Memory table's is
    /// whole entries), a Start of a version this side speaks.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Self, MigrationError> {
        let raw = u16::from_le_bytes([b[0], b[1]]);
        let command = Command::from_u16(raw).ok_or_else(|| {
            MigrationError::Protocol(format!("a request with unknown command {raw}"))
        })?;
        let version = match command {
            Command::Start => u16::from_le_bytes([b[2], b[3]]),
            _ => 0,
        };
        let length = u64::from_le_bytes(b[8..].try_into().unwrap_or([0; 8]));
        if length > command.max_payload() {
            return Err(MigrationError::Protocol(format!(
                "a {command:?} request of {length} bytes (at most {})",
                command.max_payload()
            )));
        }
        if command == Command::Memory && length % RANGE_LEN as u64 != 0 {
            return Err(MigrationError::Protocol(format!(
                "a memory table of {length} bytes, not whole {RANGE_LEN}-byte entries"
            )));
        }
        if command == Command::Start && version != PROTOCOL_VERSION {
            return Err(MigrationError::Protocol(format!(
                "protocol version {version}; exitless speaks {PROTOCOL_VERSION}"
            )));
        }
        Ok(Request {
            command,
            version,
            length,
        })
    }
}

/// A response's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Status {
    Ok = 1,
    Error = 2,
}

/// A response (its length is 0 in every exchange exitless makes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    pub status: Status,
    pub length: u64,
}

impl Response {
    pub fn ok() -> Self {
        Response {
            status: Status::Ok,
            length: 0,
        }
    }

    pub fn error() -> Self {
        Response {
            status: Status::Error,
            length: 0,
        }
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[..2].copy_from_slice(&(self.status as u16).to_le_bytes());
        b[8..].copy_from_slice(&self.length.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Self, MigrationError> {
        let status = match u16::from_le_bytes([b[0], b[1]]) {
            1 => Status::Ok,
            2 => Status::Error,
            other => {
                return Err(MigrationError::Protocol(format!(
                    "a response with unknown status {other}"
                )))
            }
        };
        let length = u64::from_le_bytes(b[8..].try_into().unwrap_or([0; 8]));
        if length != 0 {
            return Err(MigrationError::Protocol(format!(
                "a response with {length} bytes of payload"
            )));
        }
        Ok(Response { status, length })
    }
}

/// One range of guest memory in a Memory table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryRange {
    pub gpa: u64,
    pub length: u64,
}

/// A table's bytes.
pub fn encode_table(ranges: &[MemoryRange]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ranges.len() * RANGE_LEN);
    for r in ranges {
        out.extend_from_slice(&r.gpa.to_le_bytes());
        out.extend_from_slice(&r.length.to_le_bytes());
    }
    out
}

/// A table from its bytes (whole entries, at most [`MAX_RANGES`]).
pub fn decode_table(b: &[u8]) -> Result<Vec<MemoryRange>, MigrationError> {
    if b.len() % RANGE_LEN != 0 || b.len() / RANGE_LEN > MAX_RANGES {
        return Err(MigrationError::Protocol(format!(
            "a memory table of {} bytes",
            b.len()
        )));
    }
    let word = |c: &[u8]| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
    Ok(b.chunks_exact(RANGE_LEN)
        .map(|c| MemoryRange {
            gpa: word(&c[..8]),
            length: word(&c[8..]),
        })
        .collect())
}

/// Where each range's bytes go: `(region index, offset in the region, length)`. Every range
/// lies inside one region of `regions` (`(gpa, size)`); the total is at most `max_total`.
pub fn place_ranges(
    ranges: &[MemoryRange],
    regions: &[(u64, u64)],
    max_total: u64,
) -> Result<Vec<(usize, u64, u64)>, MigrationError> {
    let mut total = 0u64;
    let mut placed = Vec::with_capacity(ranges.len());
    for r in ranges {
        let bad = || {
            MigrationError::Protocol(format!(
                "a memory range at {:#x} of {:#x} bytes outside guest memory",
                r.gpa, r.length
            ))
        };
        let end = r.gpa.checked_add(r.length).ok_or_else(bad)?;
        let (i, (gpa, _)) = regions
            .iter()
            .enumerate()
            .find(|(_, (g, s))| r.gpa >= *g && end <= g + s)
            .ok_or_else(bad)?;
        total = total.checked_add(r.length).ok_or_else(bad)?;
        if total > max_total {
            return Err(MigrationError::Protocol(format!(
                "memory tables of more than {max_total} bytes"
            )));
        }
        placed.push((i, r.gpa - gpa, r.length));
    }
    Ok(placed)
}

/// One region of guest memory as the Config describes it: its KVM slot, where it is, and
/// (for `local`) the offset of its bytes in the file sent for its slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegionLayout {
    pub slot: u32,
    pub gpa: u64,
    pub size: u64,
    #[serde(default)]
    pub fd_offset: u64,
}

/// The Config payload: the VM's config in Cloud Hypervisor's schema (what `vm.info` shows)
/// and the guest memory's regions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigrationConfig {
    pub config: serde_json::Value,
    pub regions: Vec<RegionLayout>,
    /// The ids of the VM's vCPUs, ascending (vCPUs added or removed while it ran leave
    /// gaps): the destination creates them at Config. Without it, 0 to the config's count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<Vec<u8>>,
}

impl MigrationConfig {
    /// From the peer's bytes: JSON of this shape, 1..=[`MAX_REGIONS`] page-aligned regions
    /// in address order, not overlapping, slots distinct.
    pub fn parse(b: &[u8]) -> Result<Self, MigrationError> {
        if b.len() as u64 > MAX_CONFIG_BYTES {
            return Err(MigrationError::Protocol(format!(
                "a config of {} bytes",
                b.len()
            )));
        }
        let c: MigrationConfig = serde_json::from_slice(b)
            .map_err(|e| MigrationError::Protocol(format!("the config: {e}")))?;
        if c.regions.is_empty() || c.regions.len() > MAX_REGIONS {
            return Err(MigrationError::Protocol(format!(
                "a config with {} memory regions",
                c.regions.len()
            )));
        }
        let mut last_end = 0u64;
        for (i, r) in c.regions.iter().enumerate() {
            let end = r.gpa.checked_add(r.size);
            let aligned = r.gpa % 4096 == 0 && r.size % 4096 == 0 && r.fd_offset % 4096 == 0;
            let dup = c.regions[..i].iter().any(|o| o.slot == r.slot);
            if end.is_none() || !aligned || r.size == 0 || r.gpa < last_end || dup {
                return Err(MigrationError::Protocol(format!(
                    "a memory region at {:#x} of {:#x} bytes (slot {})",
                    r.gpa, r.size, r.slot
                )));
            }
            last_end = end.unwrap_or(u64::MAX);
        }
        if let Some(ids) = &c.vcpus {
            let max = crate::config::MAX_VCPUS;
            let ascending = ids.windows(2).all(|w| w[0] < w[1]);
            if ids.is_empty()
                || ids.len() > max
                || !ascending
                || ids.iter().any(|&i| usize::from(i) >= max)
            {
                return Err(MigrationError::Protocol(format!(
                    "a config with vCPUs {ids:?}"
                )));
            }
        }
        Ok(c)
    }

    pub fn encode(&self) -> Result<Vec<u8>, MigrationError> {
        serde_json::to_vec(self).map_err(|e| MigrationError::Protocol(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_carry_the_version_in_start_only() {
        let start = Request::new(Command::Start, 0).encode();
        assert_eq!(start, [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        let mem = Request::new(Command::Memory, 32);
        let b = mem.encode();
        assert_eq!(&b[..2], &[4, 0]);
        assert_eq!(&b[8..], &32u64.to_le_bytes());
        assert_eq!(Request::decode(&b).unwrap(), mem);
        let ok = Response::ok().encode();
        assert_eq!(Response::decode(&ok).unwrap(), Response::ok());
        assert_eq!(
            Response::decode(&Response::error().encode())
                .unwrap()
                .status,
            Status::Error
        );
    }

    #[test]
    fn hostile_headers_are_refused_by_their_command_and_length() {
        let mut b = [0u8; HEADER_LEN];
        assert!(Request::decode(&b)
            .unwrap_err()
            .to_string()
            .contains("unknown command 0"));
        b[0] = 9;
        assert!(Request::decode(&b).is_err());
        // A State longer than a state file, a Config longer than 1 MiB, payload on Complete.
        for (cmd, len) in [
            (3u8, MAX_STATE_BYTES + 1),
            (2, MAX_CONFIG_BYTES + 1),
            (5, 1),
            (7, 5),
        ] {
            b[0] = cmd;
            b[8..].copy_from_slice(&len.to_le_bytes());
            let e = Request::decode(&b).unwrap_err().to_string();
            assert!(e.contains("bytes (at most"), "{e}");
        }
        b[0] = 4;
        b[8..].copy_from_slice(&17u64.to_le_bytes());
        assert!(Request::decode(&b)
            .unwrap_err()
            .to_string()
            .contains("whole"));
        b[0] = 1;
        b[2] = 7;
        b[8..].copy_from_slice(&0u64.to_le_bytes());
        assert!(Request::decode(&b)
            .unwrap_err()
            .to_string()
            .contains("version 7"));
        let mut r = Response::ok().encode();
        r[0] = 0;
        assert!(Response::decode(&r).is_err());
    }

    #[test]
    fn tables_round_trip_and_ranges_must_lie_inside_one_region() {
        let ranges = [
            MemoryRange {
                gpa: 0x1000,
                length: 0x2000,
            },
            MemoryRange {
                gpa: 0x10_0000,
                length: 0x1000,
            },
        ];
        let b = encode_table(&ranges);
        assert_eq!(b.len(), 32);
        assert_eq!(decode_table(&b).unwrap(), ranges);
        assert!(decode_table(&b[..31]).is_err());
        let regions = [(0, 0x8000), (0x10_0000, 0x1000)];
        let placed = place_ranges(&ranges, &regions, u64::MAX).unwrap();
        assert_eq!(placed, [(0, 0x1000, 0x2000), (1, 0, 0x1000)]);
        for bad in [
            MemoryRange {
                gpa: 0x7000,
                length: 0x2000,
            },
            MemoryRange {
                gpa: u64::MAX,
                length: 2,
            },
            MemoryRange {
                gpa: 0x9000,
                length: 1,
            },
        ] {
            assert!(place_ranges(&[bad], &regions, u64::MAX).is_err(), "{bad:?}");
        }
        assert!(place_ranges(&ranges, &regions, 0x2fff).is_err());
    }

    #[test]
    fn configs_need_aligned_ordered_regions_with_distinct_slots() {
        let good = br#"{"config": {}, "regions": [{"slot": 0, "gpa": 0, "size": 4096}]}"#;
        assert_eq!(MigrationConfig::parse(good).unwrap().regions[0].size, 4096);
        for bad in [
            &br#"{"config": {}, "regions": []}"#[..],
            br#"{"config": {}, "regions": [{"slot": 0, "gpa": 1, "size": 4096}]}"#,
            br#"{"config": {}, "regions": [{"slot": 0, "gpa": 0, "size": 4096},
                {"slot": 0, "gpa": 8192, "size": 4096}]}"#,
            br#"{"config": {}, "regions": [{"slot": 0, "gpa": 8192, "size": 4096},
                {"slot": 1, "gpa": 0, "size": 4096}]}"#,
            br#"{"config": {}, "regions": [{"slot": 0, "gpa": 0, "size": 4096}], "x": 1}"#,
            br#"{"config": {}"#,
        ] {
            assert!(
                MigrationConfig::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn configs_list_distinct_ascending_vcpu_ids_if_any() {
        let with = |ids: &str| {
            let text = format!(
                r#"{{"config": {{}}, "regions": [{{"slot": 0, "gpa": 0, "size": 4096}}],
                    "vcpus": {ids}}}"#
            );
            MigrationConfig::parse(text.as_bytes()).map(|c| c.vcpus)
        };
        assert_eq!(with("[0, 2, 3]").unwrap(), Some(vec![0, 2, 3]));
        for bad in ["[]", "[1, 1]", "[2, 0]", "[254]", "[300]", "\"0\""] {
            assert!(with(bad).is_err(), "{bad}");
        }
        let without = br#"{"config": {}, "regions": [{"slot": 0, "gpa": 0, "size": 4096}]}"#;
        let c = MigrationConfig::parse(without).unwrap();
        assert_eq!(c.vcpus, None);
        // An encoded config without ids says nothing of them.
        assert!(!String::from_utf8(c.encode().unwrap())
            .unwrap()
            .contains("vcpus"));
    }
}
