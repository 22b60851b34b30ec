//! A virtio-pmem request as the guest puts it on the queue (virtio 1.2, 5.19.6): a
//! device-readable `le32 type` (0: FLUSH, the only one) followed by a device-writable
//! `le32 ret` (0: done, 1: failed). Anything else is malformed: no readable request first, a
//! part too short, no writable part, a part outside guest memory.

use virtio_queue::DescriptorChain;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

/// The request type of a flush.
pub const REQ_FLUSH: u32 = 0;
/// The answer: the request was done.
pub const RESP_OK: u32 = 0;
/// The answer: it failed (or was not a flush).
pub const RESP_EIO: u32 = 1;
/// Most descriptors a request may have (one each way; more is a hostile chain).
const MAX_DESCRIPTORS: usize = 4;

/// One parsed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// The request type (a flush is [`REQ_FLUSH`]).
    pub kind: u32,
    /// Where the 4-byte answer goes (inside guest memory, device-writable).
    pub answer: GuestAddress,
}

/// The request `chain` holds, or None for a malformed one.
pub fn parse(chain: DescriptorChain<&GuestMemoryMmap>, mem: &GuestMemoryMmap) -> Option<Request> {
    let mut kind = None;
    for (i, desc) in chain.enumerate() {
        if i >= MAX_DESCRIPTORS {
            return None;
        }
        match (kind, desc.is_write_only()) {
            (None, false) if desc.len() >= 4 => {
                kind = Some(mem.read_obj::<u32>(desc.addr()).ok()?.to_le());
            }
            (Some(kind), true) if desc.len() >= 4 => {
                mem.get_slice(desc.addr(), 4).ok()?;
                return Some(Request {
                    kind,
                    answer: desc.addr(),
                });
            }
            // A second readable part is allowed (ignored); anything else is malformed.
            (Some(_), false) => {}
            _ => return None,
        }
    }
    None
}
