//! The virtio-pci common configuration structure (virtio 1.x, 4.1.4.3) as a state machine:
//! feature negotiation, device status, and the per-queue registers the driver programs.

use crate::devices::virtio::VIRTIO_F_VERSION_1;

/// Length of the structure (up to queue_device).
pub const COMMON_LEN: u64 = 0x38;
/// "No MSI-X vector" for msix_config and queue_msix_vector.
pub const NO_VECTOR: u16 = 0xffff;
pub const STATUS_ACKNOWLEDGE: u8 = 1;
pub const STATUS_DRIVER: u8 = 2;
pub const STATUS_DRIVER_OK: u8 = 4;
pub const STATUS_FEATURES_OK: u8 = 8;
pub const STATUS_NEEDS_RESET: u8 = 0x40;
pub const STATUS_FAILED: u8 = 0x80;

/// What the driver programmed for one queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueRegs {
    pub max_size: u16,
    pub size: u16,
    pub enabled: bool,
    pub vector: u16,
    pub desc: u64,
    pub driver: u64,
    pub device: u64,
}

impl QueueRegs {
    fn new(max_size: u16) -> Self {
        QueueRegs {
            max_size,
            size: max_size,
            enabled: false,
            vector: NO_VECTOR,
            desc: 0,
            driver: 0,
            device: 0,
        }
    }
}

/// What a register write asks of the transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommonEvent {
    None,
    /// The driver wrote 0 to device_status: reset everything.
    Reset,
    /// The driver set DRIVER_OK after a successful FEATURES_OK: activate the device.
    DriverOk,
    /// A queue's MSI-X vector changed (`None`: the configuration vector).
    Vector(Option<u16>, u16),
    /// The write was not a valid access to a register (counted by the transport).
    Fault,
    /// A status write that would clear a bit: only a reset (0) may; the status stays.
    StatusRefused,
}

/// The common configuration of one device.
#[derive(Debug, Clone)]
pub struct CommonCfg {
    offered: u64,
    msix_count: u16,
    device_feature_select: u32,
    driver_feature_select: u32,
    pub driver_features: u64,
    pub config_vector: u16,
    pub status: u8,
    pub generation: u8,
    queue_select: u16,
    pub queues: Vec<QueueRegs>,
}

impl CommonCfg {
    /// A device offering `offered` features with queues of `max_sizes` and `msix_count`
    /// MSI-X vectors.
    pub fn new(offered: u64, max_sizes: &[u16], msix_count: u16) -> Self {
        CommonCfg {
            offered,
            msix_count,
            device_feature_select: 0,
            driver_feature_select: 0,
            driver_features: 0,
            config_vector: NO_VECTOR,
            status: 0,
            generation: 0,
            queue_select: 0,
            queues: max_sizes.iter().map(|&m| QueueRegs::new(m)).collect(),
        }
    }

    /// Back to the state after power-on (the driver wrote 0 to device_status).
    pub fn reset(&mut self) {
        let sizes: Vec<u16> = self.queues.iter().map(|q| q.max_size).collect();
        *self = CommonCfg::new(self.offered, &sizes, self.msix_count);
    }

    fn selected(&self) -> Option<&QueueRegs> {
        self.queues.get(usize::from(self.queue_select))
    }

    /// The structure's bytes as the driver sees them now.
    fn image(&self) -> [u8; COMMON_LEN as usize] {
        let mut b = [0u8; COMMON_LEN as usize];
        let half = |v: u64, sel: u32| match sel {
            0 => v as u32,
            1 => (v >> 32) as u32,
            _ => 0,
        };
        b[0x00..0x04].copy_from_slice(&self.device_feature_select.to_le_bytes());
        b[0x04..0x08]
            .copy_from_slice(&half(self.offered, self.device_feature_select).to_le_bytes());
        b[0x08..0x0c].copy_from_slice(&self.driver_feature_select.to_le_bytes());
        b[0x0c..0x10]
            .copy_from_slice(&half(self.driver_features, self.driver_feature_select).to_le_bytes());
        b[0x10..0x12].copy_from_slice(&self.config_vector.to_le_bytes());
        b[0x12..0x14].copy_from_slice(&(self.queues.len() as u16).to_le_bytes());
        b[0x14] = self.status;
        b[0x15] = self.generation;
        b[0x16..0x18].copy_from_slice(&self.queue_select.to_le_bytes());
        if let Some(q) = self.selected() {
            b[0x18..0x1a].copy_from_slice(&q.size.to_le_bytes());
            b[0x1a..0x1c].copy_from_slice(&q.vector.to_le_bytes());
            b[0x1c..0x1e].copy_from_slice(&u16::from(q.enabled).to_le_bytes());
            b[0x1e..0x20].copy_from_slice(&self.queue_select.to_le_bytes());
            b[0x20..0x28].copy_from_slice(&q.desc.to_le_bytes());
            b[0x28..0x30].copy_from_slice(&q.driver.to_le_bytes());
            b[0x30..0x38].copy_from_slice(&q.device.to_le_bytes());
        }
        b
    }

    /// Reads any bytes of the structure (outside it: zeros).
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        let image = self.image();
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = image.get(offset as usize + i).copied().unwrap_or(0);
        }
    }

    /// Writes one register with an access of its own width (64-bit addresses as two halves).
    pub fn write(&mut self, offset: u64, data: &[u8]) -> CommonEvent {
        let v = match data.len() {
            1 => u32::from(data[0]),
            2 => u32::from(u16::from_le_bytes([data[0], data[1]])),
            4 => u32::from_le_bytes([data[0], data[1], data[2], data[3]]),
            _ => return CommonEvent::Fault,
        };
        match (offset, data.len()) {
            (0x00, 4) => self.device_feature_select = v,
            (0x08, 4) => self.driver_feature_select = v,
            (0x0c, 4) => self.write_driver_features(v),
            (0x10, 2) => {
                self.config_vector = self.valid_vector(v as u16);
                return CommonEvent::Vector(None, self.config_vector);
            }
            (0x14, 1) => return self.write_status(v as u8),
            (0x16, 2) => self.queue_select = v as u16,
            (0x18..=0x37, _) => return self.write_queue(offset, data.len(), v),
            _ => return CommonEvent::Fault,
        }
        CommonEvent::None
    }

    fn write_driver_features(&mut self, v: u32) {
        // Features are fixed once FEATURES_OK is set.
        if self.status & STATUS_FEATURES_OK != 0 {
            return;
        }
        match self.driver_feature_select {
            0 => self.driver_features = (self.driver_features & !0xffff_ffff) | u64::from(v),
            1 => self.driver_features = (self.driver_features & 0xffff_ffff) | (u64::from(v) << 32),
            _ => {}
        }
    }

    fn valid_vector(&self, v: u16) -> u16 {
        if v < self.msix_count {
            v
        } else {
            NO_VECTOR
        }
    }

    fn write_status(&mut self, v: u8) -> CommonEvent {
        if v == 0 {
            return CommonEvent::Reset;
        }
        // The driver must not clear a status bit (virtio 1.x, 2.1.2): clearing DRIVER_OK and
        // setting it again would start the device a second time without a reset.
        if self.status & !v & !STATUS_NEEDS_RESET != 0 {
            return CommonEvent::StatusRefused;
        }
        let newly = v & !self.status;
        let mut status = v;
        if newly & STATUS_FEATURES_OK != 0 {
            let unknown = self.driver_features & !self.offered;
            if unknown != 0 || self.driver_features & VIRTIO_F_VERSION_1 == 0 {
                status &= !STATUS_FEATURES_OK; // refused: the driver reads it back unset
            }
        }
        self.status = status | (self.status & STATUS_NEEDS_RESET);
        let ok = STATUS_FEATURES_OK | STATUS_DRIVER_OK;
        if newly & STATUS_DRIVER_OK != 0 && self.status & ok == ok {
            return CommonEvent::DriverOk;
        }
        CommonEvent::None
    }

    fn write_queue(&mut self, offset: u64, len: usize, v: u32) -> CommonEvent {
        let live = self.status & STATUS_DRIVER_OK != 0;
        let msix_count = self.msix_count;
        let select = self.queue_select;
        let Some(q) = self.queues.get_mut(usize::from(select)) else {
            return CommonEvent::Fault;
        };
        let set_half = |field: &mut u64, high: bool| {
            *field = if high {
                (*field & 0xffff_ffff) | (u64::from(v) << 32)
            } else {
                (*field & !0xffff_ffff) | u64::from(v)
            }
        };
        match (offset, len) {
            (0x1a, 2) => {
                q.vector = if (v as u16) < msix_count {
                    v as u16
                } else {
                    NO_VECTOR
                };
                return CommonEvent::Vector(Some(select), q.vector);
            }
            // A live queue's shape cannot change under the device.
            _ if live => return CommonEvent::Fault,
            (0x18, 2) if (v as u16).is_power_of_two() && v as u16 <= q.max_size => {
                q.size = v as u16
            }
            (0x1c, 2) => q.enabled = v == 1,
            (0x20 | 0x24, 4) => set_half(&mut q.desc, offset == 0x24),
            (0x28 | 0x2c, 4) => set_half(&mut q.driver, offset == 0x2c),
            (0x30 | 0x34, 4) => set_half(&mut q.device, offset == 0x34),
            _ => return CommonEvent::Fault,
        }
        CommonEvent::None
    }
}

/// What a snapshot saves of the common configuration (docs/snapshot.md): every register
/// the driver wrote, and each queue's.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommonState {
    pub device_feature_select: u32,
    pub driver_feature_select: u32,
    pub driver_features: u64,
    pub config_vector: u16,
    pub status: u8,
    pub generation: u8,
    pub queue_select: u16,
    /// (size, enabled, vector, desc, driver, device) of each queue.
    pub queues: Vec<(u16, bool, u16, u64, u64, u64)>,
}

impl CommonCfg {
    pub fn save(&self) -> CommonState {
        CommonState {
            device_feature_select: self.device_feature_select,
            driver_feature_select: self.driver_feature_select,
            driver_features: self.driver_features,
            config_vector: self.config_vector,
            status: self.status,
            generation: self.generation,
            queue_select: self.queue_select,
            queues: self
                .queues
                .iter()
                .map(|q| (q.size, q.enabled, q.vector, q.desc, q.driver, q.device))
                .collect(),
        }
    }

    /// Puts saved registers back, checked as a driver's writes would be: the same queues,
    /// features this device offers, vectors it has, sizes it allows.
    pub fn load(&mut self, s: &CommonState) -> Result<(), String> {
        if s.queues.len() != self.queues.len() {
            return Err(format!(
                "{} queues saved, the device has {}",
                s.queues.len(),
                self.queues.len()
            ));
        }
        if s.driver_features & !self.offered != 0 {
            return Err(format!(
                "features {:#x} saved that the device does not offer",
                s.driver_features & !self.offered
            ));
        }
        let vector_ok = |v: u16| v == NO_VECTOR || v < self.msix_count;
        if !vector_ok(s.config_vector) {
            return Err(format!("configuration vector {} saved", s.config_vector));
        }
        for (i, (q, saved)) in self.queues.iter().zip(&s.queues).enumerate() {
            let (size, _, vector, ..) = *saved;
            if !size.is_power_of_two() || size > q.max_size || !vector_ok(vector) {
                return Err(format!("queue {i}: size {size} or vector {vector} saved"));
            }
        }
        self.device_feature_select = s.device_feature_select;
        self.driver_feature_select = s.driver_feature_select;
        self.driver_features = s.driver_features;
        self.config_vector = s.config_vector;
        self.status = s.status;
        self.generation = s.generation;
        self.queue_select = s.queue_select;
        for (q, &(size, enabled, vector, desc, driver, device)) in
            self.queues.iter_mut().zip(&s.queues)
        {
            (q.size, q.enabled, q.vector) = (size, enabled, vector);
            (q.desc, q.driver, q.device) = (desc, driver, device);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OFFERED: u64 = VIRTIO_F_VERSION_1 | 1 << 9;

    fn w32(c: &mut CommonCfg, at: u64, v: u32) -> CommonEvent {
        c.write(at, &v.to_le_bytes())
    }

    fn r32(c: &CommonCfg, at: u64) -> u32 {
        let mut d = [0u8; 4];
        c.read(at, &mut d);
        u32::from_le_bytes(d)
    }

    #[test]
    fn a_driver_negotiates_sets_up_a_queue_and_goes_live() {
        let mut c = CommonCfg::new(OFFERED, &[256, 64], 3);
        assert_eq!(r32(&c, 0x04), 1 << 9);
        w32(&mut c, 0x00, 1);
        assert_eq!(r32(&c, 0x04), 1, "VERSION_1 is bit 32");
        assert_eq!(
            c.write(0x14, &[STATUS_ACKNOWLEDGE | STATUS_DRIVER]),
            CommonEvent::None
        );
        w32(&mut c, 0x08, 1);
        w32(&mut c, 0x0c, 1);
        c.write(0x14, &[3 | STATUS_FEATURES_OK]);
        assert_eq!(c.status & STATUS_FEATURES_OK, STATUS_FEATURES_OK);
        c.write(0x16, &1u16.to_le_bytes());
        assert_eq!(r32(&c, 0x18) & 0xffff, 64);
        c.write(0x18, &32u16.to_le_bytes());
        c.write(0x18, &48u16.to_le_bytes()); // not a power of two: ignored
        w32(&mut c, 0x20, 0x1000);
        w32(&mut c, 0x24, 0x1);
        w32(&mut c, 0x28, 0x2000);
        w32(&mut c, 0x30, 0x3000);
        assert_eq!(
            c.write(0x1a, &2u16.to_le_bytes()),
            CommonEvent::Vector(Some(1), 2)
        );
        assert_eq!(
            c.write(0x1a, &9u16.to_le_bytes()),
            CommonEvent::Vector(Some(1), NO_VECTOR)
        );
        c.write(0x1c, &1u16.to_le_bytes());
        let q = c.queues[1];
        assert_eq!(
            (q.size, q.desc, q.driver, q.device, q.enabled),
            (32, 0x1_0000_1000, 0x2000, 0x3000, true)
        );
        assert_eq!(c.write(0x14, &[0xf]), CommonEvent::DriverOk);
        // Live queues keep their shape; reset starts over.
        assert_eq!(c.write(0x18, &16u16.to_le_bytes()), CommonEvent::Fault);
        assert_eq!(c.write(0x14, &[0]), CommonEvent::Reset);
        c.reset();
        assert_eq!(
            (c.status, c.queues[1].size, c.queues[1].enabled),
            (0, 64, false)
        );
    }

    #[test]
    fn features_ok_is_refused_without_version_1_or_with_unknown_bits() {
        let mut c = CommonCfg::new(OFFERED, &[8], 1);
        w32(&mut c, 0x0c, 1 << 9);
        c.write(0x14, &[3 | STATUS_FEATURES_OK]);
        assert_eq!(c.status & STATUS_FEATURES_OK, 0, "no VERSION_1");
        assert_eq!(
            c.write(0x14, &[0xf]),
            CommonEvent::None,
            "no DRIVER_OK without FEATURES_OK"
        );
        w32(&mut c, 0x08, 1);
        w32(&mut c, 0x0c, 1 | 1 << 5);
        c.write(0x14, &[3 | STATUS_FEATURES_OK]);
        assert_eq!(c.status & STATUS_FEATURES_OK, 0, "bit 37 was not offered");
    }

    #[test]
    fn bad_accesses_are_faults_and_never_panic() {
        let mut c = CommonCfg::new(OFFERED, &[8], 1);
        assert_eq!(c.write(0x14, &[1, 2, 3]), CommonEvent::Fault);
        assert_eq!(c.write(0x12, &1u16.to_le_bytes()), CommonEvent::Fault);
        assert_eq!(c.write(0x99, &[1]), CommonEvent::Fault);
        c.write(0x16, &7u16.to_le_bytes());
        assert_eq!(r32(&c, 0x18), 0, "no queue 7: size reads 0");
        assert_eq!(c.write(0x1c, &1u16.to_le_bytes()), CommonEvent::Fault);
        let mut far = [0u8; 8];
        c.read(0x36, &mut far);
    }
}
