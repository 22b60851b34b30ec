//! A virtio-blk request from a descriptor chain (virtio 1.x, 5.2.6): a 16-byte header the
//! device reads, data, and a status byte it writes, framed any way the driver likes. Every
//! check a hostile driver can fail is made here, before any I/O.

use virtio_queue::DescriptorChain;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

pub const SECTOR: u64 = 512;
const HEADER: u64 = 16;
pub const VIRTIO_BLK_T_IN: u32 = 0;
pub const VIRTIO_BLK_T_OUT: u32 = 1;
pub const VIRTIO_BLK_T_FLUSH: u32 = 4;
pub const VIRTIO_BLK_T_GET_ID: u32 = 8;
pub const VIRTIO_BLK_S_OK: u8 = 0;
pub const VIRTIO_BLK_S_IOERR: u8 = 1;
pub const VIRTIO_BLK_S_UNSUPP: u8 = 2;
/// Length of the GET_ID answer.
pub const ID_LEN: usize = 20;
/// Data segments per request the device advertises (seg_max): the queue size less the header
/// and status descriptors.
pub const SEG_MAX: u32 = 254;
/// Bytes per data segment the device advertises (size_max).
pub const SIZE_MAX: u32 = 16 << 10;
/// Bytes of data a request may move: what seg_max segments of size_max hold (4064 KiB).
pub const MAX_REQUEST_BYTES: u64 = SEG_MAX as u64 * SIZE_MAX as u64;
/// Descriptors a chain may have: seg_max data segments, the header and the status byte.
const MAX_DESCRIPTORS: usize = SEG_MAX as usize + 2;

/// What the request asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Flush,
    GetId,
}

/// A guest buffer: address and length.
pub type Segment = (GuestAddress, u32);

/// A request that passed every check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub head: u16,
    pub op: Op,
    /// Byte offset in the disk.
    pub offset: u64,
    /// The data buffers (device-writable for reads and GET_ID, readable for writes).
    pub data: Vec<Segment>,
    pub data_len: u64,
    pub status: GuestAddress,
}

/// Why a chain was refused. With a status byte it is answered with `status`; without one it
/// is only returned (used length 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub head: u16,
    pub status_addr: Option<GuestAddress>,
    pub status: u8,
    /// The driver broke the protocol (counted as malformed), as opposed to an unsupported or
    /// refused but well-formed request.
    pub malformed: bool,
    /// The chain had more data segments than seg_max.
    pub too_long: bool,
}

/// What the disk looks like to requests.
#[derive(Debug, Clone, Copy)]
pub struct DiskShape {
    pub capacity_bytes: u64,
    pub readonly: bool,
}

/// A chain's segments: readable ones first, then writable ones.
struct Split {
    readable: Vec<Segment>,
    writable: Vec<Segment>,
    /// More than MAX_DESCRIPTORS: the lists stop there, the walk went on only to find the
    /// status byte (the last writable descriptor), building nothing.
    too_long: Option<Segment>,
}

/// Splits a chain into its readable and writable segments (readable ones must come first).
/// At most MAX_DESCRIPTORS are kept, however long the chain (its length is bounded by the
/// queue or the indirect table).
fn segments(chain: DescriptorChain<&GuestMemoryMmap>) -> Result<Split, ()> {
    let (mut readable, mut writable) = (Vec::new(), Vec::new());
    let (mut count, mut last_writable) = (0usize, None);
    for d in chain {
        count += 1;
        let seg = (d.addr(), d.len());
        if d.is_write_only() {
            last_writable = Some(seg);
            if count <= MAX_DESCRIPTORS {
                writable.push(seg);
            }
        } else if last_writable.is_none() {
            if count <= MAX_DESCRIPTORS {
                readable.push(seg);
            }
        } else {
            return Err(()); // readable after writable
        }
    }
    let too_long = if count > MAX_DESCRIPTORS {
        Some(last_writable.ok_or(())?)
    } else {
        None
    };
    Ok(Split {
        readable,
        writable,
        too_long,
    })
}

/// The segments from byte `skip` on (dropping empty ones).
fn skip_bytes(segs: &[Segment], mut skip: u64) -> Vec<Segment> {
    let mut out = Vec::new();
    for &(addr, len) in segs {
        let len = u64::from(len);
        if skip >= len {
            skip -= len;
            continue;
        }
        out.push((addr.unchecked_add(skip), (len - skip) as u32));
        skip = 0;
    }
    out
}

/// The segments without their last byte (the status), and that byte's address.
fn split_status(segs: &[Segment]) -> Option<(Vec<Segment>, GuestAddress)> {
    let mut segs: Vec<Segment> = segs.iter().copied().filter(|s| s.1 > 0).collect();
    let (addr, len) = segs.pop()?;
    let status = addr.checked_add(u64::from(len) - 1)?;
    if len > 1 {
        segs.push((addr, len - 1));
    }
    Some((segs, status))
}

fn total(segs: &[Segment]) -> u64 {
    segs.iter().map(|s| u64::from(s.1)).sum()
}

/// Reads `N` bytes starting at byte `at` of the segments.
fn read_across<const N: usize>(mem: &GuestMemoryMmap, segs: &[Segment]) -> Option<[u8; N]> {
    let mut out = [0u8; N];
    (read_into(mem, segs, &mut out) == N).then_some(out)
}

/// Reads the guest memory of `segs`, in order, into `out` until it is full; returns how many
/// bytes were read (fewer when the segments are shorter or a read fails).
pub fn read_into(mem: &GuestMemoryMmap, segs: &[Segment], out: &mut [u8]) -> usize {
    let mut done = 0;
    for &(addr, len) in segs {
        let take = (len as usize).min(out.len() - done);
        if mem.read_slice(&mut out[done..done + take], addr).is_err() {
            break;
        }
        done += take;
        if done == out.len() {
            break;
        }
    }
    done
}

/// Checks a chain and turns it into a request.
pub fn parse(
    chain: DescriptorChain<&GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
    disk: DiskShape,
) -> Result<Request, Refused> {
    let head = chain.head_index();
    let refuse = |status_addr, status, malformed| Refused {
        head,
        status_addr,
        status,
        malformed,
        too_long: false,
    };
    let split = segments(chain).map_err(|()| refuse(None, 0, true))?;
    let last = split.too_long.map(|s| vec![s]);
    let (writable, status) = split_status(last.as_ref().unwrap_or(&split.writable))
        .ok_or_else(|| refuse(None, 0, true))?;
    if mem.check_address(status).is_none() {
        return Err(refuse(None, 0, true));
    }
    let ioerr = |malformed| refuse(Some(status), VIRTIO_BLK_S_IOERR, malformed);
    if split.too_long.is_some() {
        return Err(Refused {
            too_long: true,
            ..ioerr(true)
        });
    }
    let readable = split.readable;
    let header: [u8; HEADER as usize] = read_across(mem, &readable).ok_or_else(|| ioerr(true))?;
    let kind = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let sector = u64::from_le_bytes(header[8..16].try_into().unwrap_or([0; 8]));
    let after_header = skip_bytes(&readable, HEADER);
    let (op, data) = match kind {
        VIRTIO_BLK_T_IN if after_header.is_empty() => (Op::Read, writable),
        VIRTIO_BLK_T_OUT if writable.is_empty() => (Op::Write, after_header),
        VIRTIO_BLK_T_FLUSH => (Op::Flush, Vec::new()),
        VIRTIO_BLK_T_GET_ID if after_header.is_empty() => (Op::GetId, writable),
        VIRTIO_BLK_T_IN | VIRTIO_BLK_T_OUT | VIRTIO_BLK_T_GET_ID => return Err(ioerr(true)),
        _ => return Err(refuse(Some(status), VIRTIO_BLK_S_UNSUPP, false)),
    };
    if data.len() > SEG_MAX as usize {
        return Err(ioerr(true)); // framing packed more than seg_max data segments
    }
    let data_len = total(&data);
    for &(addr, len) in &data {
        if mem.get_slice(addr, len as usize).is_err() {
            return Err(ioerr(true));
        }
    }
    let request = Request {
        head,
        op,
        offset: sector.saturating_mul(SECTOR),
        data,
        data_len,
        status,
    };
    check_io(&request, disk).map_err(ioerr)?;
    Ok(request)
}

/// Range and direction checks for reads and writes. `Err(malformed)`.
fn check_io(r: &Request, disk: DiskShape) -> Result<(), bool> {
    match r.op {
        Op::Read | Op::Write => {
            if r.data_len == 0 || r.data_len % SECTOR != 0 || r.data_len > MAX_REQUEST_BYTES {
                return Err(true);
            }
            let end = r.offset.checked_add(r.data_len).ok_or(true)?;
            if end > disk.capacity_bytes {
                return Err(true);
            }
            if r.op == Op::Write && disk.readonly {
                return Err(false);
            }
            Ok(())
        }
        Op::GetId if r.data_len == 0 => Err(true),
        _ => Ok(()),
    }
}

/// Writes `bytes` across the segments (as much as fits); returns how many were written.
pub fn write_across(mem: &GuestMemoryMmap, segs: &[Segment], bytes: &[u8]) -> usize {
    let mut done = 0;
    for &(addr, len) in segs {
        let take = (len as usize).min(bytes.len() - done);
        if mem.write_slice(&bytes[done..done + take], addr).is_err() {
            break;
        }
        done += take;
        if done == bytes.len() {
            break;
        }
    }
    done
}
