//! Fuzz targets: every parser a guest (or the bench guest's console) feeds, driven by
//! arbitrary bytes. Each function must return for any input without panicking; where a
//! parser promises more (a request's buffers lie inside guest memory and inside the disk),
//! the target asserts it. `fuzz/` runs them under libFuzzer (`cargo +nightly fuzz run NAME`);
//! the test suite runs each over its checked-in corpus and a few thousand mutations of it
//! (`lab/tests/fuzz_corpus.rs`). docs/fuzzing.md says how to run them for hours.

use std::sync::{Arc, Mutex};

use kvm_bindings::kvm_coalesced_mmio;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use vmm::bus::{BusBuilder, BusDevice, Buses, MutBusDevice};
use vmm::devices::i8042::{I8042, I8042_LEN};
use vmm::devices::pci::root::{PciConfigPorts, PciEcam, PciRoot};
use vmm::devices::pci::PciDevice;
use vmm::devices::serial::{SerialDevice, SerialOutput};
use vmm::devices::virtio::blk::request::{self, DiskShape};
use vmm::devices::virtio::rng::Rng;
use vmm::devices::virtio::transport::VirtioPciDevice;
use vmm::event_loop::EventLoop;
use vmm::kvm::ring::CoalescedWrite;

mod migration_receiver;
mod snapshot_state;
mod snapshot_virtio;
mod virtio_status;
pub use migration_receiver::migration_receiver;
pub use snapshot_state::snapshot_state;
pub use virtio_status::virtio_status;

/// A fuzz target: takes any bytes, must return.
pub type Target = fn(&[u8]);

/// The targets by name, as `fuzz/fuzz_targets/NAME.rs` and the corpus directories call them.
pub const TARGETS: &[(&str, Target)] = &[
    ("serial", serial),
    ("i8042", i8042),
    ("acpi_registers", acpi_registers),
    ("pci_config", pci_config),
    ("virtio_transport", virtio_transport),
    ("virtio_status", virtio_status),
    ("blk_request", blk_request),
    ("net_chains", net_chains),
    ("balloon_chains", balloon_chains),
    ("pmem_request", pmem_request),
    ("vsock_packets", vsock_packets),
    ("coalesced_ring", coalesced_ring),
    ("bench_line", bench_line),
    ("api_http", api_http),
    ("api_config", api_config),
    ("snapshot_state", snapshot_state),
    ("migration_receiver", migration_receiver),
];

/// Reads the input as a stream of small values; past its end every value is 0.
struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    fn new(data: &'a [u8]) -> Self {
        Input { data, pos: 0 }
    }

    fn more(&self) -> bool {
        self.pos < self.data.len()
    }

    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn u64(&mut self) -> u64 {
        (0..8).fold(0, |v, i| v | u64::from(self.u8()) << (8 * i))
    }

    /// An access length: mostly 1, 2, 4 or 8, sometimes 3 or 0 (hostile).
    fn len(&mut self) -> usize {
        [1, 2, 4, 8, 1, 3, 0, 4][usize::from(self.u8() & 7)]
    }
}

/// One guest access per step: read or write, offset, length, value.
fn accesses(data: &[u8], max_offset: u64, dev: &dyn BusDevice) {
    let mut input = Input::new(data);
    while input.more() {
        let op = input.u8();
        let offset = u64::from(input.u16()) % max_offset;
        let len = input.len();
        let value = input.u64().to_le_bytes();
        if op & 1 == 0 {
            let mut buf = [0u8; 8];
            dev.read(offset, &mut buf[..len]);
        } else {
            let _ = dev.write(offset, &value[..len]);
        }
    }
}

/// COM1's registers, including offsets past them and odd lengths; console input mixed in.
pub fn serial(data: &[u8]) {
    let Ok(irq) = EventFd::new(EFD_NONBLOCK) else {
        return;
    };
    let mut serial = SerialDevice::new(irq, SerialOutput::discard());
    if let Some((&n, rest)) = data.split_first() {
        let _ = serial.enqueue_input(&rest[..usize::from(n).min(rest.len())]);
    }
    accesses(data, 16, &Mutex::new(serial));
}

/// The i8042's ports (data, status/command) and beyond.
pub fn i8042(data: &[u8]) {
    accesses(data, I8042_LEN + 4, &Mutex::new(I8042::new()));
}

/// The GED's register (read clears, writes ignored) with the host pressing the power button
/// between accesses, and the ACPI sleep register (S5 powers off, other sleep states are
/// refused and counted): each access goes to one of them by its op byte.
pub fn acpi_registers(data: &[u8]) {
    use vmm::devices::acpi::ged::{Ged, POWER_BUTTON};
    use vmm::devices::acpi::sleep::{SleepControl, SLEEP_LEN};
    let Ok(irq) = EventFd::new(EFD_NONBLOCK) else {
        return;
    };
    let (ged, sleep) = (Ged::new(irq), SleepControl::default());
    let mut input = Input::new(data);
    while input.more() {
        let op = input.u8();
        let len = input.len();
        let value = input.u64().to_le_bytes();
        let dev: &dyn BusDevice = if op & 2 == 0 { &ged } else { &sleep };
        let offset = u64::from(op >> 2) % (SLEEP_LEN + 16);
        match op & 1 {
            0 => dev.read(offset, &mut [0u8; 8][..len]),
            _ => {
                let _ = dev.write(offset, &value[..len]);
            }
        }
        if op & 0x80 != 0 {
            let _ = ged.notify(POWER_BUTTON);
        }
    }
}

/// A virtio-pci function (virtio-rng) on the guest's memory, with its own event loop.
fn rng_function(mem: &GuestMemoryMmap) -> Option<(Arc<VirtioPciDevice>, EventLoop)> {
    // A fuzzing process is not a VMM: its sanitizer runtime makes calls the device thread's
    // filter does not list.
    vmm::seccomp::disable();
    let event_loop = EventLoop::start().ok()?;
    let dev = VirtioPciDevice::new(
        "virtio-rng",
        Box::new(Rng::new()),
        0xc000_0000,
        vmm::devices::virtio::SharedGuestMemory::new(mem.clone()),
        event_loop.handle(),
    )
    .ok()?;
    Some((dev, event_loop))
}

fn small_memory() -> Option<GuestMemoryMmap> {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).ok()
}

/// PCI configuration space through 0xCF8/0xCFC and through ECAM: the host bridge and one
/// virtio function, BAR sizing and moves, capabilities, MSI-X control.
pub fn pci_config(data: &[u8]) {
    let Some(mem) = small_memory() else {
        return;
    };
    let Some((dev, _event_loop)) = rng_function(&mem) else {
        return;
    };
    let root = PciRoot::new();
    root.add(dev);
    let root = Arc::new(root);
    let (half, rest) = data.split_at(data.len() / 2);
    accesses(half, 8, &PciConfigPorts::new(root.clone()));
    accesses(rest, 1 << 16, &PciEcam::new(root));
}

/// The virtio-pci transport's BAR (common config, notify, ISR, device config, MSI-X table and
/// PBA) driven in any order, queues pointed anywhere in guest memory that the input fills.
pub fn virtio_transport(data: &[u8]) {
    let Some(mem) = small_memory() else {
        return;
    };
    let _ = mem.write_slice(&data[..data.len().min(4096)], GuestAddress(0));
    let Some((dev, _event_loop)) = rng_function(&mem) else {
        return;
    };
    let bar = BarAccess(dev);
    accesses(data, 1 << 14, &bar);
}

/// BAR 0 of a PCI function as a bus device.
struct BarAccess(Arc<VirtioPciDevice>);

impl BusDevice for BarAccess {
    fn read(&self, offset: u64, data: &mut [u8]) {
        self.0.bar_read(0, offset, data);
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<vmm::bus::DeviceEvent> {
        self.0.bar_write(0, offset, data);
        Ok(vmm::bus::DeviceEvent::None)
    }
}

/// virtio-blk request parsing: a split queue whose descriptor table and available ring are the
/// input (loops, chains out of memory, indirect tables, wrong directions). A request that
/// parses must have its buffers in guest memory, its sectors inside the disk, at most seg_max
/// segments and at most seg_max * size_max bytes.
pub fn blk_request(data: &[u8]) {
    const SIZE: u16 = 16;
    let Some((mem, mut queue)) = queue_from(data) else {
        return;
    };
    let disk = DiskShape {
        capacity_bytes: 64 * 512,
        readonly: data.first().is_some_and(|b| b & 1 == 1),
    };
    for _ in 0..2 * SIZE {
        let Some(chain) = queue.pop_descriptor_chain(&mem) else {
            break;
        };
        if let Ok(req) = request::parse(chain, &mem, disk) {
            if matches!(req.op, request::Op::Read | request::Op::Write) {
                let end = req.offset.saturating_add(req.data_len);
                assert!(
                    end <= disk.capacity_bytes,
                    "request past the end of the disk"
                );
            }
            assert!(
                !(disk.readonly && req.op == request::Op::Write),
                "write to a read-only disk"
            );
            assert!(
                req.data.len() <= request::SEG_MAX as usize
                    && req.data_len <= request::MAX_REQUEST_BYTES,
                "more than seg_max segments or size_max * seg_max bytes"
            );
            for &(addr, len) in &req.data {
                assert!(
                    mem.get_slice(addr, len as usize).is_ok(),
                    "buffer outside memory"
                );
            }
        }
    }
}

/// A split queue of 16 in small memory whose descriptor table and available ring are the
/// first bytes of `data`.
fn queue_from(data: &[u8]) -> Option<(GuestMemoryMmap, Queue)> {
    const SIZE: u16 = 16;
    let mem = small_memory()?;
    let _ = mem.write_slice(&data[..data.len().min(1 << 16)], GuestAddress(0));
    let mut queue = Queue::new(SIZE).ok()?;
    queue.set_desc_table_address(Some(0), Some(0));
    queue.set_avail_ring_address(Some(0x100), Some(0));
    queue.set_used_ring_address(Some(0x200), Some(0));
    queue.set_size(SIZE);
    queue.set_ready(true);
    Some((mem, queue))
}

/// virtio-net chains from arbitrary memory, taken as transmit frames (gathered: at most a
/// frame's size) and as receive buffers (filled: never past their room, never outside memory).
pub fn net_chains(data: &[u8]) {
    use vmm::devices::virtio::net::tap::VNET_HDR_LEN;
    use vmm::devices::virtio::net::worker::{gather, MAX_FRAME};
    use vmm::devices::virtio::WritableChain;
    let Some((mem, mut queue)) = queue_from(data) else {
        return;
    };
    let mut frame = vec![0u8; MAX_FRAME];
    let payload = vec![0x5au8; 3000];
    for i in 0..32 {
        let Some(chain) = queue.pop_descriptor_chain(&mem) else {
            break;
        };
        if i % 2 == 0 {
            if let Some(len) = gather(chain, &mem, &mut frame) {
                assert!(
                    (VNET_HDR_LEN..=MAX_FRAME).contains(&len),
                    "frame of {len} bytes"
                );
            }
        } else if let Some(c) = WritableChain::take(chain, &mem, 256, VNET_HDR_LEN) {
            let n = c.fill(&mem, &payload);
            assert!(n <= c.capacity && n <= payload.len(), "filled {n}");
        }
    }
}

/// virtio-balloon chains from arbitrary memory, taken in turn as reports, inflates and
/// deflates: never a panic, and the device writes nothing back (used length 0).
pub fn balloon_chains(data: &[u8]) {
    use vmm::devices::virtio::balloon::{take_chain, BalloonStats, Role};
    use vmm::devices::virtio::transport::MsixInterrupt;
    use vmm::devices::virtio::DeviceHealth;
    let Some((mem, mut queue)) = queue_from(data) else {
        return;
    };
    let Ok(irq) = MsixInterrupt::new(1, 1) else {
        return;
    };
    let health = DeviceHealth::new("virtio-balloon", Arc::new(irq));
    let stats = BalloonStats::default();
    let roles = [Role::Reporting, Role::Inflate, Role::Deflate];
    for i in 0..32 {
        let Some(chain) = queue.pop_descriptor_chain(&mem) else {
            break;
        };
        let used = take_chain(roles[i % 3], chain, &mem, &health, &stats);
        assert!(matches!(used, None | Some(0)), "used length {used:?}");
    }
}

/// virtio-pmem requests from arbitrary memory: a request that parses has its answer inside
/// guest memory (4 bytes, device-writable); never a panic.
pub fn pmem_request(data: &[u8]) {
    use vmm::devices::virtio::pmem::request;
    let Some((mem, mut queue)) = queue_from(data) else {
        return;
    };
    for _ in 0..32 {
        let Some(chain) = queue.pop_descriptor_chain(&mem) else {
            break;
        };
        if let Some(r) = request::parse(chain, &mem) {
            assert!(mem.get_slice(r.answer, 4).is_ok(), "answer outside memory");
        }
    }
}

/// vsock packets from the guest (any header, any payload length) into a muxer with one host
/// port listening, its answers taken or not as the input says: never a panic, and the state
/// it holds stays within its bounds.
pub fn vsock_packets(data: &[u8]) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use vmm::devices::virtio::vsock::muxer::{Muxer, MAX_CONNECTIONS, MAX_CONTROL};
    use vmm::devices::virtio::vsock::packet::{Header, HDR_LEN, HOST_CID};
    static RUN: AtomicU64 = AtomicU64::new(0);
    let n = RUN.fetch_add(1, Ordering::Relaxed);
    let base = std::env::temp_dir().join(format!("exitless-fuzz-vsock-{}-{n}", std::process::id()));
    let port = std::path::PathBuf::from(format!("{}_1234", base.display()));
    let (Ok(listener), Ok(_port_listener)) = (
        std::os::unix::net::UnixListener::bind(&base),
        std::os::unix::net::UnixListener::bind(&port),
    ) else {
        return;
    };
    let _ = listener.set_nonblocking(true);
    let mut m = Muxer::new(3, base.clone(), listener, Arc::default());
    let mut input = Input::new(data);
    let mut buf = vec![0u8; HDR_LEN + 4096];
    let payload = vec![0x42u8; 70 * 1024];
    while input.more() {
        let op = input.u8();
        let h = Header {
            src_cid: if op & 0x80 != 0 { input.u64() } else { 3 },
            dst_cid: if op & 0x40 != 0 {
                input.u64()
            } else {
                HOST_CID
            },
            src_port: u32::from(input.u16()),
            dst_port: if op & 0x20 != 0 {
                1234
            } else {
                u32::from(input.u16())
            },
            len: u32::from(input.u16()) << (op & 3),
            kind: if op & 0x10 != 0 { input.u16() } else { 1 },
            op: u16::from(input.u8() % 10),
            flags: u32::from(input.u8()),
            buf_alloc: u32::from(input.u16()) << 4,
            fwd_cnt: u32::from(input.u16()),
        };
        let len = (h.len as usize).min(payload.len());
        let short = if op & 0x08 != 0 { len / 2 } else { len };
        m.guest_packet(&h, &payload[..short]);
        if op & 0x04 != 0 {
            while m.next_rx(&mut buf).is_some() {}
        }
        assert!(m.connections() <= MAX_CONNECTIONS);
        assert!(m.pending_control() <= MAX_CONTROL);
    }
    drop(m);
    let _ = std::fs::remove_file(&base);
    let _ = std::fs::remove_file(&port);
}

/// Coalesced-ring entries (any length, flags, address) decoded and delivered to a bus.
pub fn coalesced_ring(data: &[u8]) {
    #[derive(Default)]
    struct Sink;
    impl MutBusDevice for Sink {
        fn read(&mut self, _: u64, data: &mut [u8]) {
            data.fill(0);
        }
        fn write(&mut self, _: u64, _: &[u8]) -> std::io::Result<vmm::bus::DeviceEvent> {
            Ok(vmm::bus::DeviceEvent::None)
        }
    }
    let mut pio = BusBuilder::new();
    let mut mmio = BusBuilder::new();
    let sink: Arc<dyn BusDevice> = Arc::new(Mutex::new(Sink));
    if pio.insert("sink", 0x7e0, 8, sink.clone()).is_err()
        || mmio.insert("sink", 0xd000_0000, 8, sink).is_err()
    {
        return;
    }
    let buses = Buses {
        pio: pio.freeze(),
        mmio: mmio.freeze(),
    };
    let mut input = Input::new(data);
    let mut writes = Vec::new();
    while input.more() {
        let mut entry = kvm_coalesced_mmio {
            phys_addr: input.u64(),
            len: u32::from(input.u8()),
            data: input.u64().to_le_bytes(),
            ..Default::default()
        };
        entry.__bindgen_anon_1.pio = u32::from(input.u8() & 1);
        writes.push(CoalescedWrite::from_entry(&entry));
    }
    let _ = vmm::vcpu::exit::dispatch(&buses, writes.into_iter(), None, |_, _| {});
}

/// The bench result-line parser, on any console line.
pub fn bench_line(data: &[u8]) {
    for line in String::from_utf8_lossy(data).lines() {
        let _ = crate::bench::result::parse_line(line);
    }
}

/// The API's HTTP reading: a client's byte stream taken request by request (as a connection
/// does), each routed to its typed request. Each request takes at least one byte, no more
/// than there are.
pub fn api_http(data: &[u8]) {
    use exitless_control::api::http::{parse, Parsed};
    let mut rest = data;
    while let Ok(Parsed::Complete(req, used)) = parse(rest) {
        assert!(
            used > 0 && used <= rest.len(),
            "a request took {used} of {} bytes",
            rest.len()
        );
        let _ = exitless_control::api::route(&req, Vec::new());
        rest = &rest[used..];
    }
}

/// The API's bodies: a `vm.create` (and the device bodies) as JSON, checked and converted to
/// exitless's config, and written back for `vm.info`.
pub fn api_config(data: &[u8]) {
    use exitless_control::api::schema::{DiskConfig, NetConfig, VmConfig, VsockConfig};
    if let Ok(c) = serde_json::from_slice::<VmConfig>(data) {
        let _ = c.to_vm_config();
        let _ = serde_json::to_string(&c);
    }
    if let Ok(d) = serde_json::from_slice::<DiskConfig>(data) {
        let _ = d.to_disk_config();
    }
    if let Ok(n) = serde_json::from_slice::<NetConfig>(data) {
        let _ = n.to_net_config(Vec::new());
    }
    if let Ok(v) = serde_json::from_slice::<VsockConfig>(data) {
        let _ = v.to_vsock_config();
    }
}
