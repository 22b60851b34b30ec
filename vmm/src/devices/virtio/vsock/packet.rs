//! The virtio-vsock packet header (`struct virtio_vsock_hdr`, 44 bytes, little-endian) and
//! its operations.

/// Bytes of the header before each packet's payload.
pub const HDR_LEN: usize = 44;
/// The host's context id.
pub const HOST_CID: u64 = 2;
/// `type`: a stream socket (the only kind served).
pub const TYPE_STREAM: u16 = 1;

/// `op` values.
pub const OP_REQUEST: u16 = 1;
pub const OP_RESPONSE: u16 = 2;
pub const OP_RST: u16 = 3;
pub const OP_SHUTDOWN: u16 = 4;
pub const OP_RW: u16 = 5;
pub const OP_CREDIT_UPDATE: u16 = 6;
pub const OP_CREDIT_REQUEST: u16 = 7;

/// SHUTDOWN flags: the sender will receive no more, send no more.
pub const SHUTDOWN_RCV: u32 = 1;
pub const SHUTDOWN_SEND: u32 = 2;

/// Largest payload taken from the guest in one packet (Linux sends at most 64 KiB).
pub const MAX_PAYLOAD: u32 = 64 * 1024;

/// A packet header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Header {
    pub src_cid: u64,
    pub dst_cid: u64,
    pub src_port: u32,
    pub dst_port: u32,
    pub len: u32,
    pub kind: u16,
    pub op: u16,
    pub flags: u32,
    pub buf_alloc: u32,
    pub fwd_cnt: u32,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl Header {
    /// Reads a header from its 44 bytes.
    pub fn parse(b: &[u8; HDR_LEN]) -> Header {
        let u64_at = |at| u64::from(u32_at(b, at)) | u64::from(u32_at(b, at + 4)) << 32;
        Header {
            src_cid: u64_at(0),
            dst_cid: u64_at(8),
            src_port: u32_at(b, 16),
            dst_port: u32_at(b, 20),
            len: u32_at(b, 24),
            kind: u16::from_le_bytes([b[28], b[29]]),
            op: u16::from_le_bytes([b[30], b[31]]),
            flags: u32_at(b, 32),
            buf_alloc: u32_at(b, 36),
            fwd_cnt: u32_at(b, 40),
        }
    }

    /// The header's 44 bytes.
    pub fn bytes(&self) -> [u8; HDR_LEN] {
        let mut b = [0u8; HDR_LEN];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.kind.to_le_bytes());
        b[30..32].copy_from_slice(&self.op.to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_in_the_specs_layout() {
        let h = Header {
            src_cid: 3,
            dst_cid: HOST_CID,
            src_port: 0x1234,
            dst_port: 52,
            len: 5,
            kind: TYPE_STREAM,
            op: OP_RW,
            flags: 0,
            buf_alloc: 1 << 18,
            fwd_cnt: 7,
        };
        let b = h.bytes();
        assert_eq!(&b[0..8], &3u64.to_le_bytes());
        assert_eq!(&b[16..20], &0x1234u32.to_le_bytes());
        assert_eq!(&b[28..32], &[1, 0, 5, 0]);
        assert_eq!(&b[36..40], &(1u32 << 18).to_le_bytes());
        assert_eq!(Header::parse(&b), h);
    }
}
