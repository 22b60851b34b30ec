//! A type-0 PCI configuration space: identity, command/status, BARs that can be sized and
//! moved, and a capability list. Plain state: the device that owns it does the locking.

use super::{BarChange, BarKind};

/// Size of the configuration space kept (the standard 256 bytes; ECAM's extended space
/// reads as zero).
pub const CONFIG_SIZE: usize = 256;
const COMMAND: usize = 0x04;
const STATUS: usize = 0x06;
const BAR0: usize = 0x10;
const CAP_PTR: usize = 0x34;
const INTERRUPT_LINE: usize = 0x3c;
const FIRST_CAP: usize = 0x40;
/// Command register: memory space decoding.
pub const COMMAND_MEMORY: u16 = 1 << 1;
/// Command register bits a guest may change: I/O, memory, bus master, INTx disable.
const COMMAND_WRITABLE: u16 = 0x0001 | 0x0002 | 0x0004 | 0x0400;
const STATUS_CAP_LIST: u16 = 1 << 4;

/// What identifies a function.
#[derive(Debug, Clone, Copy)]
pub struct PciIds {
    pub vendor: u16,
    pub device: u16,
    pub revision: u8,
    /// Class, subclass, programming interface.
    pub class: (u8, u8, u8),
    pub subsystem_vendor: u16,
    pub subsystem: u16,
}

#[derive(Debug, Clone, Copy, Default)]
struct Bar {
    size: u64,
    kind: Option<BarKind>,
    /// Address bits as written (before masking by the size).
    addr: u64,
}

/// The configuration space of one function.
#[derive(Debug, Clone)]
pub struct PciConfig {
    bytes: [u8; CONFIG_SIZE],
    bars: [Bar; 6],
    next_cap: usize,
    last_cap_next: usize,
}

impl PciConfig {
    pub fn new(ids: PciIds) -> Self {
        let mut c = PciConfig {
            bytes: [0; CONFIG_SIZE],
            bars: [Bar::default(); 6],
            next_cap: FIRST_CAP,
            last_cap_next: CAP_PTR,
        };
        c.put16(0x00, ids.vendor);
        c.put16(0x02, ids.device);
        c.bytes[0x08] = ids.revision;
        (c.bytes[0x09], c.bytes[0x0a], c.bytes[0x0b]) = (ids.class.2, ids.class.1, ids.class.0);
        c.put16(0x2c, ids.subsystem_vendor);
        c.put16(0x2e, ids.subsystem);
        c
    }

    fn put16(&mut self, at: usize, v: u16) {
        self.bytes[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }

    fn get16(&self, at: usize) -> u16 {
        u16::from_le_bytes([self.bytes[at], self.bytes[at + 1]])
    }

    /// Declares BAR `index` (a 64-bit BAR also takes `index + 1`) of `size` bytes (a power of
    /// two, at least 16) at `addr`.
    pub fn set_bar(&mut self, index: usize, kind: BarKind, size: u64, addr: u64) {
        debug_assert!(size.is_power_of_two() && size >= 16);
        self.bars[index] = Bar {
            size,
            kind: Some(kind),
            addr,
        };
    }

    /// Appends a capability (`body` without its ID and next-pointer bytes); returns its offset.
    pub fn add_capability(&mut self, id: u8, body: &[u8]) -> usize {
        let at = self.next_cap;
        let len = (2 + body.len()).next_multiple_of(4);
        assert!(
            at + len <= CONFIG_SIZE,
            "capabilities overflow the config space"
        );
        self.bytes[at] = id;
        self.bytes[at + 2..at + 2 + body.len()].copy_from_slice(body);
        self.bytes[self.last_cap_next] = at as u8;
        self.last_cap_next = at + 1;
        self.next_cap = at + len;
        let status = self.get16(STATUS) | STATUS_CAP_LIST;
        self.put16(STATUS, status);
        at
    }

    /// Bytes of the capability area a device manages itself (e.g. MSI-X control).
    pub fn bytes_mut(&mut self, at: usize, len: usize) -> &mut [u8] {
        &mut self.bytes[at..at + len]
    }

    /// What the guest may change besides BARs: the command word and the interrupt line (a
    /// snapshot saves them).
    pub fn guest_writable(&self) -> (u16, u8) {
        (self.get16(COMMAND), self.bytes[INTERRUPT_LINE])
    }

    /// Puts [`PciConfig::guest_writable`] back (only the bits a guest can write).
    pub fn set_guest_writable(&mut self, command: u16, interrupt_line: u8) {
        let cmd = (self.get16(COMMAND) & !COMMAND_WRITABLE) | (command & COMMAND_WRITABLE);
        self.put16(COMMAND, cmd);
        self.bytes[INTERRUPT_LINE] = interrupt_line;
    }

    /// Whether the guest enabled memory decoding.
    pub fn memory_enabled(&self) -> bool {
        self.get16(COMMAND) & COMMAND_MEMORY != 0
    }

    /// Where BAR `index` decodes now (None: not a BAR, decoding off, or not placed).
    pub fn bar_address(&self, index: usize) -> Option<u64> {
        let bar = self.bars.get(index)?;
        bar.kind?;
        let addr = bar.addr & !(bar.size - 1);
        (self.memory_enabled() && addr != 0).then_some(addr)
    }

    /// The address BAR `index` holds, decoded or not (0 when it is not a BAR).
    pub fn bar_base(&self, index: usize) -> u64 {
        self.bars
            .get(index)
            .map_or(0, |b| b.addr & !(b.size.max(1) - 1))
    }

    /// Size of BAR `index` (0 when it is not a BAR).
    pub fn bar_size(&self, index: usize) -> u64 {
        self.bars.get(index).map_or(0, |b| b.size)
    }

    fn bar_register(&self, reg: usize) -> u32 {
        let index = (reg - BAR0) / 4;
        if let Some(bar) = self.bars[index].kind.map(|k| (k, self.bars[index])) {
            let (kind, b) = bar;
            let flags = match kind {
                BarKind::Mem32 => 0x0,
                BarKind::Mem64 => 0x4,
            };
            return ((b.addr & !(b.size - 1)) as u32 & !0xf) | flags;
        }
        // The upper half of a 64-bit BAR below.
        match index.checked_sub(1).map(|i| self.bars[i]) {
            Some(b) if b.kind == Some(BarKind::Mem64) => ((b.addr & !(b.size - 1)) >> 32) as u32,
            _ => 0,
        }
    }

    fn write_bar_register(&mut self, reg: usize, value: u32) {
        let index = (reg - BAR0) / 4;
        if self.bars[index].kind.is_some() {
            let bar = &mut self.bars[index];
            bar.addr = (bar.addr & !0xffff_ffff) | u64::from(value & !0xf);
        } else if let Some(low) = index.checked_sub(1) {
            let bar = &mut self.bars[low];
            if bar.kind == Some(BarKind::Mem64) {
                bar.addr = (bar.addr & 0xffff_ffff) | (u64::from(value) << 32);
            }
        }
    }

    /// Reads `data.len()` bytes (1, 2 or 4, naturally aligned; anything else reads as ones).
    pub fn read(&self, offset: usize, data: &mut [u8]) {
        if !aligned(offset, data.len()) || offset + data.len() > CONFIG_SIZE {
            data.fill(if offset >= CONFIG_SIZE { 0 } else { 0xff });
            return;
        }
        let dword = offset & !3;
        let value = if (BAR0..BAR0 + 24).contains(&dword) {
            self.bar_register(dword)
        } else {
            u32::from_le_bytes(self.bytes[dword..dword + 4].try_into().unwrap_or([0; 4]))
        };
        let bytes = value.to_le_bytes();
        let at = offset - dword;
        data.copy_from_slice(&bytes[at..at + data.len()]);
    }

    /// Writes what the guest may change; returns the BARs whose decoded address changed.
    pub fn write(&mut self, offset: usize, data: &[u8]) -> Vec<BarChange> {
        if !aligned(offset, data.len()) || offset + data.len() > CONFIG_SIZE {
            return Vec::new();
        }
        let before: Vec<Option<u64>> = (0..6).map(|i| self.bar_address(i)).collect();
        let dword = offset & !3;
        let mut reg = [0u8; 4];
        self.read(dword, &mut reg);
        reg[offset - dword..offset - dword + data.len()].copy_from_slice(data);
        let value = u32::from_le_bytes(reg);
        match dword {
            COMMAND => {
                let cmd =
                    (self.get16(COMMAND) & !COMMAND_WRITABLE) | (value as u16 & COMMAND_WRITABLE);
                self.put16(COMMAND, cmd);
            }
            d if (BAR0..BAR0 + 24).contains(&d) => self.write_bar_register(d, value),
            INTERRUPT_LINE => self.bytes[INTERRUPT_LINE] = value as u8,
            _ => {} // identity, status, capabilities: read-only here
        }
        (0..6)
            .filter_map(|i| {
                let now = self.bar_address(i);
                (now != before[i]).then_some(BarChange {
                    bar: i as u8,
                    old: before[i],
                    new: now,
                })
            })
            .collect()
    }
}

fn aligned(offset: usize, len: usize) -> bool {
    matches!(len, 1 | 2 | 4) && offset % len == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> PciConfig {
        let mut c = PciConfig::new(PciIds {
            vendor: 0x1af4,
            device: 0x1042,
            revision: 1,
            class: (0x01, 0x80, 0x00),
            subsystem_vendor: 0x1af4,
            subsystem: 0x40,
        });
        c.set_bar(0, BarKind::Mem64, 0x8000, 0xc000_0000);
        c
    }

    fn read32(c: &PciConfig, at: usize) -> u32 {
        let mut d = [0u8; 4];
        c.read(at, &mut d);
        u32::from_le_bytes(d)
    }

    #[test]
    fn identity_is_read_only() {
        let mut c = config();
        assert_eq!(read32(&c, 0), 0x1042_1af4);
        assert_eq!(read32(&c, 8) >> 8, 0x01_80_00);
        c.write(0, &0u32.to_le_bytes());
        assert_eq!(read32(&c, 0), 0x1042_1af4);
        let mut b = [0u8; 2];
        c.read(2, &mut b);
        assert_eq!(u16::from_le_bytes(b), 0x1042);
        // Unaligned or odd widths never panic and read as ones.
        let mut odd = [0u8; 3];
        c.read(1, &mut odd);
        assert_eq!(odd, [0xff; 3]);
        c.read(255, &mut b);
        assert!(c.write(254, &[1, 2, 3, 4]).is_empty());
    }

    #[test]
    fn a_64_bit_bar_sizes_and_moves() {
        let mut c = config();
        assert_eq!(read32(&c, 0x10), 0xc000_0004);
        assert_eq!(read32(&c, 0x14), 0);
        assert_eq!(c.bar_address(0), None, "memory decoding is off");
        let on = c.write(COMMAND, &COMMAND_MEMORY.to_le_bytes());
        assert_eq!(
            on,
            [BarChange {
                bar: 0,
                old: None,
                new: Some(0xc000_0000)
            }]
        );
        // Sizing: all ones reads back the size mask.
        c.write(0x10, &u32::MAX.to_le_bytes());
        c.write(0x14, &u32::MAX.to_le_bytes());
        assert_eq!(read32(&c, 0x10), 0xffff_8004);
        assert_eq!(read32(&c, 0x14), 0xffff_ffff);
        c.write(0x14, &0u32.to_le_bytes());
        let moved = c.write(0x10, &0xc010_0000u32.to_le_bytes());
        assert_eq!(moved.last().map(|m| m.new), Some(Some(0xc010_0000)));
        assert_eq!(c.bar_address(0), Some(0xc010_0000));
        assert_eq!(c.bar_address(1), None, "upper half is not a BAR");
    }

    #[test]
    fn capabilities_chain_from_the_pointer() {
        let mut c = config();
        let a = c.add_capability(0x09, &[0x10, 1, 2]);
        let b = c.add_capability(0x11, &[0; 10]);
        assert_eq!((a, b), (0x40, 0x48));
        let mut d = [0u8; 1];
        c.read(CAP_PTR, &mut d);
        assert_eq!(d[0], 0x40);
        c.read(0x41, &mut d);
        assert_eq!(d[0], 0x48);
        c.read(0x49, &mut d);
        assert_eq!(d[0], 0);
        c.read(STATUS, &mut d);
        assert_eq!(d[0] & 0x10, 0x10);
    }
}
