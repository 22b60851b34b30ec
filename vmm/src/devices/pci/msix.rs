//! MSI-X: the vector table and pending-bit array a function exposes in a BAR, and the enable
//! and function-mask bits of its capability. A state machine: it says which vectors to
//! deliver and which route changed; the owner delivers them (irqfds) and reroutes (GSI table).

/// Where an MSI goes: the message the guest programmed into an MSI-X table entry. The
/// interrupt layer's own type: devices (the virtio-pci transport's interrupts) produce it and
/// the device manager routes it, neither importing the other.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MsiMessage {
    pub address: u64,
    pub data: u32,
}

/// Capability ID of MSI-X.
pub const CAP_ID: u8 = 0x11;
/// Bytes per table entry.
pub const ENTRY_SIZE: u64 = 16;
const CONTROL_ENABLE: u16 = 1 << 15;
const CONTROL_FUNCTION_MASK: u16 = 1 << 14;
const VECTOR_MASKED: u32 = 1;

/// One table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsixVector {
    pub address: u64,
    pub data: u32,
    pub masked: bool,
}

impl Default for MsixVector {
    /// Every vector starts masked (PCI spec).
    fn default() -> Self {
        MsixVector {
            address: 0,
            data: 0,
            masked: true,
        }
    }
}

/// What a table write changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TableWrite {
    /// This vector's message (address/data) changed: its route must follow.
    pub rerouted: Option<u16>,
    /// Vectors unmasked with an interrupt pending: deliver them now.
    pub deliver: Vec<u16>,
}

/// The MSI-X state of one function.
#[derive(Debug)]
pub struct Msix {
    vectors: Vec<MsixVector>,
    pending: Vec<bool>,
    enabled: bool,
    function_masked: bool,
}

impl Msix {
    pub fn new(count: u16) -> Self {
        Msix {
            vectors: vec![MsixVector::default(); usize::from(count)],
            pending: vec![false; usize::from(count)],
            enabled: false,
            function_masked: false,
        }
    }

    pub fn count(&self) -> u16 {
        self.vectors.len() as u16
    }

    pub fn vector(&self, index: u16) -> Option<MsixVector> {
        self.vectors.get(usize::from(index)).copied()
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The capability's body after ID and next pointer: message control, table and PBA
    /// offsets with their BAR index in the low 3 bits.
    pub fn capability_body(count: u16, bar: u8, table: u32, pba: u32) -> [u8; 10] {
        let mut b = [0u8; 10];
        b[0..2].copy_from_slice(&(count - 1).to_le_bytes());
        b[2..6].copy_from_slice(&(table | u32::from(bar)).to_le_bytes());
        b[6..10].copy_from_slice(&(pba | u32::from(bar)).to_le_bytes());
        b
    }

    /// The message control word as the guest reads it.
    pub fn control(&self) -> u16 {
        let mut c = self.count() - 1;
        if self.enabled {
            c |= CONTROL_ENABLE;
        }
        if self.function_masked {
            c |= CONTROL_FUNCTION_MASK;
        }
        c
    }

    /// The guest writes the message control word; returns vectors to deliver now.
    pub fn write_control(&mut self, value: u16) -> Vec<u16> {
        self.enabled = value & CONTROL_ENABLE != 0;
        self.function_masked = value & CONTROL_FUNCTION_MASK != 0;
        self.take_deliverable()
    }

    fn deliverable(&self, v: usize) -> bool {
        self.enabled && !self.function_masked && !self.vectors[v].masked
    }

    /// Whether vector `index` reaches the CPU now (MSI-X on, neither it nor the function
    /// masked).
    pub fn is_deliverable(&self, index: u16) -> bool {
        usize::from(index) < self.vectors.len() && self.deliverable(usize::from(index))
    }

    fn take_deliverable(&mut self) -> Vec<u16> {
        let ready: Vec<usize> = (0..self.vectors.len())
            .filter(|&v| self.pending[v] && self.deliverable(v))
            .collect();
        for &v in &ready {
            self.pending[v] = false;
        }
        ready.into_iter().map(|v| v as u16).collect()
    }

    /// Vector `index` fires: true to deliver it now; false when it is held pending (masked)
    /// or dropped (MSI-X off, or no such vector).
    pub fn trigger(&mut self, index: u16) -> bool {
        let v = usize::from(index);
        if v >= self.vectors.len() || !self.enabled {
            return false;
        }
        if self.deliverable(v) {
            return true;
        }
        self.pending[v] = true;
        false
    }

    /// Reads the table (4-byte accesses to one field; anything else reads as zero).
    pub fn table_read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let (index, field) = ((offset / ENTRY_SIZE) as usize, offset % ENTRY_SIZE);
        let Some(v) = self.vectors.get(index) else {
            return;
        };
        let value = match field {
            0 => v.address as u32,
            4 => (v.address >> 32) as u32,
            8 => v.data,
            12 => u32::from(v.masked) * VECTOR_MASKED,
            _ => return,
        };
        if data.len() == 4 {
            data.copy_from_slice(&value.to_le_bytes());
        } else if data.len() == 8 && field % 8 == 0 {
            let next = if field == 0 { v.data } else { 0 };
            let hi = if field == 0 {
                (v.address >> 32) as u32
            } else {
                next
            };
            data[..4].copy_from_slice(&value.to_le_bytes());
            data[4..].copy_from_slice(&hi.to_le_bytes());
        }
    }

    /// Writes the table (4-byte accesses, or an 8-byte address write).
    pub fn table_write(&mut self, offset: u64, data: &[u8]) -> TableWrite {
        let (index, field) = ((offset / ENTRY_SIZE) as usize, offset % ENTRY_SIZE);
        let mut out = TableWrite::default();
        let Some(v) = self.vectors.get_mut(index) else {
            return out;
        };
        let before = *v;
        match (field, data.len()) {
            (0, 8) => v.address = u64::from_le_bytes(data.try_into().unwrap_or([0; 8])),
            (0, 4) => v.address = (v.address & !0xffff_ffff) | u64::from(le32(data)),
            (4, 4) => v.address = (v.address & 0xffff_ffff) | (u64::from(le32(data)) << 32),
            (8, 4) => v.data = le32(data),
            (12, 4) => v.masked = le32(data) & VECTOR_MASKED != 0,
            _ => return out,
        }
        if (v.address, v.data) != (before.address, before.data) {
            out.rerouted = Some(index as u16);
        }
        out.deliver = self.take_deliverable();
        out
    }

    /// Reads the pending-bit array.
    pub fn pba_read(&self, offset: u64, data: &mut [u8]) {
        for (i, byte) in data.iter_mut().enumerate() {
            let first = (offset as usize + i) * 8;
            *byte = (0..8)
                .filter(|b| self.pending.get(first + b).copied().unwrap_or(false))
                .fold(0u8, |acc, b| acc | (1 << b));
        }
    }
}

/// What a snapshot saves of the MSI-X state (docs/snapshot.md).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MsixState {
    pub enabled: bool,
    pub function_masked: bool,
    /// (address, data, masked) of each vector.
    pub vectors: Vec<(u64, u32, bool)>,
    pub pending: Vec<bool>,
}

impl Msix {
    pub fn save(&self) -> MsixState {
        MsixState {
            enabled: self.enabled,
            function_masked: self.function_masked,
            vectors: self
                .vectors
                .iter()
                .map(|v| (v.address, v.data, v.masked))
                .collect(),
            pending: self.pending.clone(),
        }
    }

    /// Puts saved state back; a state of another vector count is refused.
    pub fn load(&mut self, s: &MsixState) -> Result<(), String> {
        let n = self.vectors.len();
        if s.vectors.len() != n || s.pending.len() != n {
            return Err(format!(
                "{} MSI-X vectors saved, the device has {n}",
                s.vectors.len()
            ));
        }
        self.enabled = s.enabled;
        self.function_masked = s.function_masked;
        for (v, &(address, data, masked)) in self.vectors.iter_mut().zip(&s.vectors) {
            *v = MsixVector {
                address,
                data,
                masked,
            };
        }
        self.pending.clone_from(&s.pending);
        Ok(())
    }
}

fn le32(d: &[u8]) -> u32 {
    u32::from_le_bytes([d[0], d[1], d[2], d[3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(m: &mut Msix, vector: u64, field: u64, value: u32) -> TableWrite {
        m.table_write(vector * ENTRY_SIZE + field, &value.to_le_bytes())
    }

    #[test]
    fn a_masked_vector_is_held_pending_and_delivered_on_unmask() {
        let mut m = Msix::new(3);
        assert!(!m.trigger(0), "MSI-X off: dropped");
        assert!(m.write_control(CONTROL_ENABLE).is_empty());
        assert_eq!(put(&mut m, 1, 0, 0xfee0_0000).rerouted, Some(1));
        assert_eq!(put(&mut m, 1, 8, 0x41).rerouted, Some(1));
        assert!(!m.trigger(1), "vectors start masked");
        let mut pba = [0u8; 1];
        m.pba_read(0, &mut pba);
        assert_eq!(pba[0], 0b010);
        let unmask = put(&mut m, 1, 12, 0);
        assert_eq!((unmask.rerouted, unmask.deliver), (None, vec![1]));
        m.pba_read(0, &mut pba);
        assert_eq!(pba[0], 0);
        assert!(m.trigger(1));
        // The function mask holds every vector back, and releases them when cleared.
        m.write_control(CONTROL_ENABLE | CONTROL_FUNCTION_MASK);
        assert!(!m.trigger(1));
        assert_eq!(m.write_control(CONTROL_ENABLE), vec![1]);
        assert_eq!(m.control(), CONTROL_ENABLE | 2);
    }

    #[test]
    fn table_reads_back_and_bad_accesses_are_harmless() {
        let mut m = Msix::new(2);
        m.table_write(16, &0x1_fee0_1000u64.to_le_bytes());
        let mut d = [0u8; 4];
        m.table_read(20, &mut d);
        assert_eq!(u32::from_le_bytes(d), 1);
        m.table_read(28, &mut d);
        assert_eq!(u32::from_le_bytes(d), 1, "masked");
        assert_eq!(
            m.table_write(999 * ENTRY_SIZE, &[1, 2, 3, 4]),
            TableWrite::default()
        );
        assert_eq!(m.table_write(3, &[1]), TableWrite::default());
        m.table_read(7, &mut [0u8; 3]);
        assert!(!m.trigger(77));
        let body = Msix::capability_body(2, 0, 0x4000, 0x5000);
        assert_eq!(&body[..2], &[1, 0]);
        assert_eq!(u32::from_le_bytes(body[2..6].try_into().unwrap()), 0x4000);
    }
}
