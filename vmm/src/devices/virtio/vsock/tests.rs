//! virtio-vsock driven through mock queues against real Unix sockets: both directions of
//! connection, data and credit, and a hostile guest.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::packet::*;
use super::*;
use crate::devices::virtio::test_support::{desc, CountingIrq as Irq};
use crate::devices::virtio::ActiveQueue;
use crate::event_loop::EventLoop;

const WRITE: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_WRITE as u16;
const RX_BASE: u64 = 0;
const TX_BASE: u64 = 0x1_0000;
const RX_USED: u64 = 0xc000;
const TX_USED: u64 = 0x1_c000;
const EV_BASE: u64 = 0x2_0000;
const EV_USED: u64 = 0x2_c000;
const EV_BUFS: u64 = 0x80_0000;
const RX_BUFS: u64 = 0x10_0000;
const TX_BUFS: u64 = 0x40_0000;
const CID: u64 = 3;

fn d(addr: u64, len: u32, flags: u16) -> RawDescriptor {
    desc(addr, len, flags, 0)
}

struct Rig {
    mem: &'static GuestMemoryMmap,
    _rx: MockSplitQueue<'static, GuestMemoryMmap>,
    tx: MockSplitQueue<'static, GuestMemoryMmap>,
    tx_notify: EventFd,
    ev: MockSplitQueue<'static, GuestMemoryMmap>,
    ev_notify: EventFd,
    dev: Vsock,
    path: PathBuf,
    _socket_file: SocketFile,
    sent: u16,
    taken: u16,
    _el: EventLoop,
}

fn socket_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("exitless-vsock-{tag}-{}.sock", std::process::id()))
}

/// A device with 32 receive buffers of 4 KiB posted.
fn rig(tag: &str) -> Rig {
    rig_of(tag, false)
}

/// The same, made as a restore makes it when `restored` (no event buffer posted yet).
fn rig_of(tag: &str, restored: bool) -> Rig {
    let mem: &'static GuestMemoryMmap = Box::leak(Box::new(
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap(),
    ));
    let path = socket_path(tag);
    let (dev, socket_file) = Vsock::new(&VsockConfig {
        cid: CID as u32,
        socket: path.clone(),
        id: None,
    })
    .unwrap();
    let rx = MockSplitQueue::create(mem, GuestAddress(RX_BASE), 256);
    let bufs: Vec<_> = (0..32)
        .map(|i| d(RX_BUFS + i * 4096, 4096, WRITE))
        .collect();
    rx.add_desc_chains(&bufs, 0).unwrap();
    let tx = MockSplitQueue::create(mem, GuestAddress(TX_BASE), 256);
    let ev = MockSplitQueue::create(mem, GuestAddress(EV_BASE), 16);
    let mut queues = Vec::new();
    let (mut tx_notify, mut ev_notify) = (None, None);
    for (index, vq, used) in [
        (RX, &rx, RX_USED),
        (TX, &tx, TX_USED),
        (EVENT, &ev, EV_USED),
    ] {
        let mut queue: Queue = vq.create_queue().unwrap();
        queue.set_used_ring_address(Some(used as u32), Some(0));
        let notify = EventFd::new(EFD_NONBLOCK).unwrap();
        match index {
            TX => tx_notify = Some(notify.try_clone().unwrap()),
            EVENT => ev_notify = Some(notify.try_clone().unwrap()),
            _ => {}
        }
        queues.push(ActiveQueue {
            index,
            queue,
            notify: Arc::new(notify),
        });
    }
    let el = EventLoop::start().unwrap();
    let mut dev = dev;
    if restored {
        dev.restored();
    }
    dev.activate(Activation {
        mem: crate::devices::virtio::SharedGuestMemory::new(mem.clone()),
        features: dev.features(),
        queues,
        interrupt: Arc::new(Irq::default()),
        health: crate::devices::virtio::test_support::health(),
        dirty: Default::default(),
    })
    .map(|worker| el.handle().add(worker).unwrap())
    .unwrap();
    Rig {
        mem,
        _rx: rx,
        tx,
        tx_notify: tx_notify.unwrap(),
        ev,
        ev_notify: ev_notify.unwrap(),
        dev,
        path,
        _socket_file: socket_file,
        sent: 0,
        taken: 0,
        _el: el,
    }
}

fn guest_header(op: u16, src_port: u32, dst_port: u32, len: u32) -> Header {
    Header {
        src_cid: CID,
        dst_cid: HOST_CID,
        src_port,
        dst_port,
        len,
        kind: TYPE_STREAM,
        op,
        flags: 0,
        buf_alloc: 64 * 1024,
        fwd_cnt: 0,
    }
}

impl Rig {
    /// The guest sends `h` with `payload` (which may disagree with `h.len`).
    fn send(&mut self, h: Header, payload: &[u8]) {
        let at = TX_BUFS + u64::from(self.sent) * 0x1_0000;
        self.mem.write_slice(&h.bytes(), GuestAddress(at)).unwrap();
        self.mem
            .write_slice(payload, GuestAddress(at + HDR_LEN as u64))
            .unwrap();
        let len = (HDR_LEN + payload.len()) as u32;
        self.tx
            .add_desc_chains(&[d(at, len, 0)], self.sent)
            .unwrap();
        self.sent += 1;
        self.tx_notify.write(1).unwrap();
    }

    /// The next packet the device put in a receive buffer.
    fn recv(&mut self) -> (Header, Vec<u8>) {
        let start = Instant::now();
        loop {
            let idx: u16 = self.mem.read_obj(GuestAddress(RX_USED + 2)).unwrap();
            if idx != self.taken {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "no packet for the guest"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let at = GuestAddress(RX_USED + 4 + 8 * u64::from(self.taken));
        let id: u32 = self.mem.read_obj(at).unwrap();
        let len: u32 = self.mem.read_obj(GuestAddress(at.0 + 4)).unwrap();
        self.taken += 1;
        let mut b = vec![0u8; len as usize];
        self.mem
            .read_slice(&mut b, GuestAddress(RX_BUFS + u64::from(id) * 4096))
            .unwrap();
        let h = Header::parse(b[..HDR_LEN].try_into().unwrap());
        (h, b[HDR_LEN..].to_vec())
    }

    fn count(&self, name: &str) -> u64 {
        let c = self.dev.device_counters();
        c.iter().find(|(n, _)| *n == name).unwrap().1
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(format!("{}_1234", self.path.display()));
    }
}

#[test]
fn a_guest_connection_reaches_the_hosts_port_socket_and_data_flows_both_ways() {
    let mut r = rig("guest-connects");
    let port_path = format!("{}_1234", r.path.display());
    let listener = UnixListener::bind(&port_path).unwrap();
    r.send(guest_header(OP_REQUEST, 5000, 1234, 0), &[]);
    let (h, _) = r.recv();
    assert_eq!(
        (h.op, h.src_port, h.dst_port, h.dst_cid),
        (OP_RESPONSE, 1234, 5000, CID)
    );
    assert_eq!(h.buf_alloc, connection::BUF_ALLOC);
    let (mut host, _) = listener.accept().unwrap();
    r.send(guest_header(OP_RW, 5000, 1234, 5), b"hello");
    let mut got = [0u8; 5];
    host.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"hello");
    host.write_all(b"world!").unwrap();
    let (h, data) = r.recv();
    assert_eq!((h.op, h.len, data.as_slice()), (OP_RW, 6, &b"world!"[..]));
    assert_eq!(h.fwd_cnt, 5, "what the host took of the guest's bytes");
    // The host is done sending but still reads: the guest hears SHUTDOWN(SEND), and what it
    // sends after that still reaches the host.
    host.shutdown(std::net::Shutdown::Write).unwrap();
    let (h, _) = r.recv();
    assert_eq!((h.op, h.flags), (OP_SHUTDOWN, SHUTDOWN_SEND));
    r.send(guest_header(OP_RW, 5000, 1234, 3), b"bye");
    let mut rest = Vec::new();
    r.send(guest_header(OP_SHUTDOWN, 5000, 1234, 0), &[]);
    host.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, b"bye");
    assert_eq!(
        r.recv().0.op,
        OP_RST,
        "both sides done: the connection ends"
    );
    let start = Instant::now();
    while r.count("open") != 0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "connection not closed"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        (
            r.count("connections"),
            r.count("tx_bytes"),
            r.count("rx_bytes")
        ),
        (1, 8, 6)
    );
}

#[test]
fn a_host_program_connects_with_a_connect_line_and_gets_ok_and_the_host_port() {
    let mut r = rig("host-connects");
    // A guest connection that ends first: its socket's fd number comes back with the next
    // socket, which must still be watched (a closed fd cannot leave epoll).
    let port_path = format!("{}_1234", r.path.display());
    let listener = UnixListener::bind(&port_path).unwrap();
    r.send(guest_header(OP_REQUEST, 5000, 1234, 0), &[]);
    assert_eq!(r.recv().0.op, OP_RESPONSE);
    r.send(guest_header(OP_RST, 5000, 1234, 0), &[]);
    drop(listener);
    let mut host = UnixStream::connect(&r.path).unwrap();
    host.write_all(b"CONNECT 52\n").unwrap();
    let (h, _) = r.recv();
    assert_eq!((h.op, h.dst_port, h.src_cid), (OP_REQUEST, 52, HOST_CID));
    let host_port = h.src_port;
    r.send(guest_header(OP_RESPONSE, 52, host_port, 0), &[]);
    let mut line = [0u8; 64];
    let n = host.read(&mut line).unwrap();
    assert_eq!(
        std::str::from_utf8(&line[..n]).unwrap(),
        format!("OK {host_port}\n")
    );
    for _ in 0..3 {
        host.write_all(b"ping").unwrap();
        let (h, data) = r.recv();
        assert_eq!(
            (h.op, h.dst_port, data.as_slice()),
            (OP_RW, 52, &b"ping"[..])
        );
    }
    // A bad line is refused: the program sees EOF.
    let mut bad = UnixStream::connect(&r.path).unwrap();
    bad.write_all(b"HELLO 52\n").unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(bad.read(&mut line).unwrap(), 0);
    assert_eq!(r.count("refused"), 1);
}

#[test]
fn a_hostile_guest_gets_resets_and_counts_never_a_panic_or_unbounded_state() {
    let mut r = rig("hostile");
    // A REQUEST to a port nobody listens on.
    r.send(guest_header(OP_REQUEST, 7, 999, 0), &[]);
    assert_eq!(r.recv().0.op, OP_RST);
    // A length the chain does not hold.
    r.send(guest_header(OP_RW, 7, 999, 100), b"short");
    assert_eq!(r.recv().0.op, OP_RST);
    // An unknown operation on an open connection.
    let port_path = format!("{}_1234", r.path.display());
    let listener = UnixListener::bind(&port_path).unwrap();
    r.send(guest_header(OP_REQUEST, 8, 1234, 0), &[]);
    assert_eq!(r.recv().0.op, OP_RESPONSE);
    r.send(guest_header(99, 8, 1234, 0), &[]);
    assert_eq!(r.recv().0.op, OP_RST);
    // More data than the credit given: reset, counted. The host reads nothing meanwhile.
    r.send(guest_header(OP_REQUEST, 9, 1234, 0), &[]);
    assert_eq!(r.recv().0.op, OP_RESPONSE);
    let (_host, _) = listener.accept().unwrap();
    let chunk = vec![0x42u8; MAX_PAYLOAD as usize];
    let mut op = OP_RESPONSE;
    for _ in 0..16 {
        r.send(guest_header(OP_RW, 9, 1234, MAX_PAYLOAD), &chunk);
        let start = Instant::now();
        while r.count("credit_overruns") == 0 && start.elapsed() < Duration::from_millis(200) {
            std::thread::sleep(Duration::from_millis(1));
        }
        if r.count("credit_overruns") > 0 {
            // Credit updates for what the host socket took may come first.
            while op != OP_RST {
                op = r.recv().0.op;
                assert!(op == OP_RST || op == OP_CREDIT_UPDATE, "op {op}");
            }
            break;
        }
    }
    assert_eq!(op, OP_RST, "the overrun is answered with RST");
    // Packets from another cid are not answered at all.
    let mut h = guest_header(OP_REQUEST, 10, 1234, 0);
    h.src_cid = 77;
    r.send(h, &[]);
    assert!(r.count("bad_packets") >= 2);
    assert_eq!(r.count("open"), 0, "every misbehaving connection was reset");
    assert_eq!(r.count("connections"), 2);
}

/// After a restore the device owes the guest a transport reset (virtio 1.2, 5.10.6.7): a
/// snapshot is refused until it is sent; it goes out, once, in the first event buffer the
/// driver gives. A quiesced device puts nothing in the receive queue.
#[test]
fn a_restored_device_sends_one_transport_reset_once_the_driver_gives_an_event_buffer() {
    let mut r = rig_of("reset", true);
    assert_eq!(r.dev.prefilled_queues(), &[RX, EVENT]);
    let err = r.dev.quiesce().unwrap_err();
    assert!(err.contains("transport reset"), "{err}");
    r.dev.unquiesce();
    let used = |r: &Rig| -> u16 { r.mem.read_obj(GuestAddress(EV_USED + 2)).unwrap() };
    assert_eq!(used(&r), 0, "no event buffer yet");
    r.mem
        .write_obj(0xffff_ffffu32, GuestAddress(EV_BUFS))
        .unwrap();
    let bufs = [d(EV_BUFS, 8, WRITE), d(EV_BUFS + 8, 8, WRITE)];
    r.ev.add_desc_chains(&bufs, 0).unwrap();
    r.ev_notify.write(1).unwrap();
    let start = Instant::now();
    while used(&r) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no transport reset"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let id: u32 = r.mem.read_obj(GuestAddress(EV_USED + 4)).unwrap();
    let len: u32 = r.mem.read_obj(GuestAddress(EV_USED + 8)).unwrap();
    assert_eq!((id, len), (0, 4));
    let event: u32 = r.mem.read_obj(GuestAddress(EV_BUFS)).unwrap();
    assert_eq!(event, 0, "VIRTIO_VSOCK_EVENT_TRANSPORT_RESET");
    // Sent now: the snapshot may go on; the second buffer stays the driver's.
    r.dev.quiesce().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(used(&r), 1, "one reset, once");
    // Quiesced, a guest connection's answer waits in the muxer: nothing is received.
    let _host = UnixListener::bind(format!("{}_1234", r.path.display())).unwrap();
    r.send(guest_header(OP_REQUEST, 5000, 1234, 0), &[]);
    std::thread::sleep(Duration::from_millis(50));
    let rx_used: u16 = r.mem.read_obj(GuestAddress(RX_USED + 2)).unwrap();
    assert_eq!(rx_used, 0, "nothing written while quiesced");
    r.dev.unquiesce();
    let (h, _) = r.recv();
    assert_eq!(h.op, OP_RESPONSE, "the answer once the snapshot is over");
}
