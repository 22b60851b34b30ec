//! KVM's binary statistics (KVM_GET_STATS_FD): per-VM and per-vCPU counters read with pread,
//! so in-kernel exits are visible without debugfs.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;

use kvm_bindings::{kvm_stats_header, KVM_STATS_TYPE_MASK, KVM_STATS_TYPE_SHIFT};
use vmm_sys_util::ioctl::ioctl;
use vmm_sys_util::ioctl_io_nr;

use super::KvmError;

ioctl_io_nr!(KVM_GET_STATS_FD, kvm_bindings::KVMIO, 0xce);

const STATS_TYPE_CUMULATIVE: u32 = kvm_bindings::KVM_STATS_TYPE_CUMULATIVE;
const STATS_TYPE_INSTANT: u32 = kvm_bindings::KVM_STATS_TYPE_INSTANT;
const STATS_TYPE_PEAK: u32 = kvm_bindings::KVM_STATS_TYPE_PEAK;
/// Size of the fixed part of `kvm_stats_desc` before its name.
const DESC_FIXED: usize = 16;

/// One scalar statistic: its name and where its value lies in the data block.
#[derive(Debug, Clone)]
struct StatDesc {
    name: String,
    offset: u64,
    cumulative: bool,
}

/// The names and kinds of a stats fd's scalar statistics, in snapshot order.
#[derive(Debug, Clone, Default)]
pub struct StatsSchema {
    descs: Vec<StatDesc>,
}

/// An open stats fd with its descriptors parsed once.
#[derive(Debug)]
pub struct StatsFd {
    file: File,
    data_offset: u64,
    data_len: usize,
    schema: StatsSchema,
}

/// Values read at one moment, in descriptor order.
#[derive(Debug, Clone, Default)]
pub struct StatsSnapshot {
    pub values: Vec<u64>,
}

impl StatsFd {
    /// Opens the stats fd of a VM or vCPU file descriptor.
    pub fn open(owner: &impl AsRawFd) -> Result<Self, KvmError> {
        // SAFETY: KVM_GET_STATS_FD takes no argument and returns a new fd or -1; `owner` is a
        // valid KVM VM or vCPU fd for the duration of the call.
        let fd = unsafe { ioctl(owner, KVM_GET_STATS_FD()) };
        if fd < 0 {
            return Err(KvmError::Stats(std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        Self::parse(file)
    }

    fn parse(file: File) -> Result<Self, KvmError> {
        let mut hdr = [0u8; std::mem::size_of::<kvm_stats_header>()];
        file.read_exact_at(&mut hdr, 0).map_err(KvmError::Stats)?;
        let word = |i: usize| u32::from_ne_bytes([hdr[i], hdr[i + 1], hdr[i + 2], hdr[i + 3]]);
        let (name_size, num_desc) = (word(4) as usize, word(8) as usize);
        let (desc_offset, data_offset) = (word(16) as u64, word(20) as u64);
        let desc_size = DESC_FIXED + name_size;
        let mut raw = vec![0u8; desc_size * num_desc];
        file.read_exact_at(&mut raw, desc_offset)
            .map_err(KvmError::Stats)?;
        let mut descs = Vec::new();
        let mut data_len = 0usize;
        for d in raw.chunks_exact(desc_size) {
            let flags = u32::from_ne_bytes([d[0], d[1], d[2], d[3]]);
            let size = u16::from_ne_bytes([d[6], d[7]]) as usize;
            let offset = u32::from_ne_bytes([d[8], d[9], d[10], d[11]]) as usize;
            data_len = data_len.max(offset + size * 8);
            let kind = (flags & KVM_STATS_TYPE_MASK) >> KVM_STATS_TYPE_SHIFT;
            let scalar = matches!(
                kind,
                STATS_TYPE_CUMULATIVE | STATS_TYPE_INSTANT | STATS_TYPE_PEAK
            );
            if !scalar || size != 1 {
                continue;
            }
            let name_bytes = &d[DESC_FIXED..];
            let end = name_bytes
                .iter()
                .position(|&b| b == 0)
                .unwrap_or(name_bytes.len());
            descs.push(StatDesc {
                name: String::from_utf8_lossy(&name_bytes[..end]).into_owned(),
                offset: offset as u64,
                cumulative: kind == STATS_TYPE_CUMULATIVE,
            });
        }
        Ok(StatsFd {
            file,
            data_offset,
            data_len,
            schema: StatsSchema { descs },
        })
    }

    /// The statistics' names and kinds.
    pub fn schema(&self) -> &StatsSchema {
        &self.schema
    }

    /// Reads every scalar statistic with one pread.
    pub fn read(&self) -> Result<StatsSnapshot, KvmError> {
        let mut data = vec![0u8; self.data_len];
        self.file
            .read_exact_at(&mut data, self.data_offset)
            .map_err(KvmError::Stats)?;
        let values = self
            .schema
            .descs
            .iter()
            .map(|d| {
                let o = d.offset as usize;
                let mut b = [0u8; 8];
                b.copy_from_slice(&data[o..o + 8]);
                u64::from_ne_bytes(b)
            })
            .collect();
        Ok(StatsSnapshot { values })
    }
}

impl StatsSchema {
    /// Named deltas `later - earlier` of the cumulative statistics, zero ones included.
    pub fn deltas(&self, earlier: &StatsSnapshot, later: &StatsSnapshot) -> Vec<(String, u64)> {
        self.descs
            .iter()
            .enumerate()
            .filter(|(_, d)| d.cumulative)
            .map(|(i, d)| {
                let a = earlier.values.get(i).copied().unwrap_or(0);
                let b = later.values.get(i).copied().unwrap_or(0);
                (d.name.clone(), b.wrapping_sub(a))
            })
            .collect()
    }
}
