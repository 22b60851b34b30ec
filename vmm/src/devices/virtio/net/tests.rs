//! virtio-net driven through mock queues, with a datagram socket pair standing in for the tap.

use std::os::unix::net::UnixDatagram;
use std::sync::atomic::Ordering;

use std::time::{Duration, Instant};
use virtio_queue::desc::RawDescriptor;

use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::*;
use crate::devices::virtio::test_support::{desc as d, CountingIrq as Irq};
use crate::devices::virtio::ActiveQueue;
use crate::event_loop::EventLoop;
use virtio_bindings::virtio_net as vn;

const NEXT: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_NEXT as u16;
const WRITE: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_WRITE as u16;
const RX_BASE: u64 = 0;
const TX_BASE: u64 = 0x1_0000;
/// Used rings of our own (the mock's overlaps its avail ring's `used_event`).
const RX_USED: u64 = 0x8000;
const TX_USED: u64 = 0x1_8000;

struct Rig {
    mem: &'static GuestMemoryMmap,
    dev: Net,
    host: UnixDatagram,
    /// The receive ring, to post more buffers.
    rx_ring: MockSplitQueue<'static, GuestMemoryMmap>,
    /// The queues' notifiers (the guest's kicks), by index.
    notify: Vec<Arc<EventFd>>,
    _el: EventLoop,
}

/// A device whose receive ring holds `rx` and transmit ring `tx`, `features` negotiated; the
/// host end of the stand-in tap is returned to send and receive frames.
fn rig(rx: &[RawDescriptor], tx: &[RawDescriptor], features: u64, pending: &[&[u8]]) -> Rig {
    rig_with(rx, tx, features, pending, |_| {})
}

/// [`rig`], with `prepare` given the device's end of the stand-in tap before it starts.
fn rig_with(
    rx: &[RawDescriptor],
    tx: &[RawDescriptor],
    features: u64,
    pending: &[&[u8]],
    prepare: impl FnOnce(&UnixDatagram),
) -> Rig {
    let mem: &'static GuestMemoryMmap = Box::leak(Box::new(
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 8 << 20)]).unwrap(),
    ));
    // What the guest's transmit buffers hold.
    mem.write_slice(&[0x5a; 4096], GuestAddress(0x10_0000))
        .unwrap();
    let (host, device_end) = UnixDatagram::pair().unwrap();
    for f in pending {
        host.send(f).unwrap();
    }
    prepare(&device_end);
    let mut queues = Vec::new();
    let mut rings = Vec::new();
    for (index, base, used, descs) in [(RX, RX_BASE, RX_USED, rx), (TX, TX_BASE, TX_USED, tx)] {
        let vq = MockSplitQueue::create(mem, GuestAddress(base), 16);
        if !descs.is_empty() {
            vq.add_desc_chains(descs, 0).unwrap();
        }
        let mut queue: Queue = vq.create_queue().unwrap();
        queue.set_used_ring_address(Some(used as u32), Some(0));
        queue.set_event_idx(features & VIRTIO_RING_F_EVENT_IDX != 0);
        let notify = EventFd::new(EFD_NONBLOCK).unwrap();
        queues.push(ActiveQueue {
            index,
            queue,
            notify: Arc::new(notify),
        });
        rings.push(vq);
    }
    let notify = queues.iter().map(|q| q.notify.clone()).collect();
    let el = EventLoop::start().unwrap();
    let mut dev = Net::with_tap(Tap::from_socket(device_end), [0x52, 0x54, 0, 1, 2, 3]);
    // Registering the worker runs its `init` (a first pass over the tap and both rings)
    // before `add` returns.
    dev.activate(Activation {
        mem: crate::devices::virtio::SharedGuestMemory::new(mem.clone()),
        features,
        queues,
        interrupt: Arc::new(Irq::default()),
        health: crate::devices::virtio::test_support::health(),
        dirty: Default::default(),
    })
    .map(|worker| el.handle().add(worker).unwrap())
    .unwrap();
    rings.truncate(1);
    Rig {
        mem,
        dev,
        host,
        rx_ring: rings.pop().unwrap(),
        notify,
        _el: el,
    }
}

impl Rig {
    fn count(&self, name: &str) -> u64 {
        let c = self.dev.device_counters();
        c.iter().find(|(n, _)| *n == name).unwrap().1
    }
    fn wait(&self, what: &str, done: impl Fn(&Rig) -> bool) {
        let start = Instant::now();
        while !done(self) {
            assert!(start.elapsed() < Duration::from_secs(5), "{what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    /// Used element `i` of a used ring: (id, len).
    fn used(&self, ring: u64, i: u64) -> (u32, u32) {
        let at = GuestAddress(ring + 4 + 8 * i);
        let id: u32 = self.mem.read_obj(at).unwrap();
        let len: u32 = self.mem.read_obj(at.unchecked_add(4)).unwrap();
        (id, len)
    }
    fn used_idx(&self, ring: u64) -> u16 {
        self.mem.read_obj(GuestAddress(ring + 2)).unwrap()
    }
    /// The used ring's flags (`VRING_USED_F_NO_NOTIFY`: the device wants no kick).
    fn used_flags(&self, ring: u64) -> u16 {
        self.mem.read_obj(GuestAddress(ring)).unwrap()
    }
    /// The used ring's `avail_event` (event idx: the available index to kick at).
    fn avail_event(&self, ring: u64) -> u16 {
        self.mem.read_obj(GuestAddress(ring + 4 + 8 * 16)).unwrap()
    }
    /// The guest posts receive chains (from descriptor `first` on) and kicks the queue.
    fn post_rx(&self, chains: &[RawDescriptor], first: u16) {
        self.rx_ring.add_desc_chains(chains, first).unwrap();
        self.notify[usize::from(RX)].write(1).unwrap();
    }
}

fn frame(payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; tap::VNET_HDR_LEN];
    f.extend_from_slice(payload);
    f
}

#[test]
fn guest_frames_reach_the_tap_and_bad_chains_are_counted() {
    let mem_frame = 0x10_0000;
    let tx = [
        // A 12-byte header and a 60-byte frame in two buffers.
        d(mem_frame, 12, NEXT, 1),
        d(mem_frame + 12, 60, 0, 0),
        // Shorter than the header.
        d(mem_frame, 4, 0, 0),
        // A writable buffer in a transmit chain.
        d(mem_frame, 72, WRITE, 0),
        // Outside guest memory.
        d(0x4000_0000, 72, 0, 0),
    ];
    let r = rig(&[], &tx, VIRTIO_F_VERSION_1, &[]);
    r.wait("transmit chains completed", |r| {
        r.dev.counters()[1].completed.load(Ordering::Relaxed) == 4
    });
    let mut got = [0u8; 2048];
    let n = r.host.recv(&mut got).unwrap();
    assert_eq!(n, 72, "one frame with its header");
    assert_eq!(&got[12..72], &[0x5a; 60][..], "the guest's bytes");
    r.host.set_nonblocking(true).unwrap();
    assert!(
        r.host.recv(&mut got).is_err(),
        "only the good chain was sent"
    );
    assert_eq!(r.dev.counters()[1].malformed.load(Ordering::Relaxed), 3);
    assert_eq!((r.count("tx_frames"), r.count("tx_bytes")), (1, 60));
    assert_eq!(r.used_idx(TX_USED), 4, "every chain is given back");
}

#[test]
fn a_tap_frame_fills_one_chain_or_merges_across_several() {
    let payload: Vec<u8> = (0..1500u32).map(|i| i as u8).collect();
    let f = frame(&payload);
    // Without merged buffers: one 2 KiB chain takes the whole frame.
    let rx = [d(0x10_0000, 2048, WRITE, 0)];
    let r = rig(&rx, &[], VIRTIO_F_VERSION_1, &[&f]);
    r.wait("frame delivered", |r| r.count("rx_frames") == 1);
    assert_eq!(r.used(RX_USED, 0), (0, f.len() as u32));
    let mut got = vec![0u8; f.len()];
    r.mem.read_slice(&mut got, GuestAddress(0x10_0000)).unwrap();
    assert_eq!(&got[12..], &payload[..]);
    assert_eq!(r.used_idx(RX_USED), 1);
    assert_eq!(u16::from_le_bytes([got[10], got[11]]), 1, "num_buffers");

    // With merged buffers: three 600-byte chains, the frame takes all three.
    let rx = [
        d(0x10_0000, 600, WRITE, 0),
        d(0x20_0000, 600, WRITE, 0),
        d(0x30_0000, 600, WRITE, 0),
    ];
    let r = rig(&rx, &[], VIRTIO_F_VERSION_1 | F_MRG_RXBUF, &[&f]);
    r.wait("frame delivered", |r| r.count("rx_frames") == 1);
    let used: Vec<_> = (0..3).map(|i| r.used(RX_USED, i)).collect();
    assert_eq!(used, [(0, 600), (1, 600), (2, 312)]);
    let mut head = [0u8; 12];
    r.mem
        .read_slice(&mut head, GuestAddress(0x10_0000))
        .unwrap();
    assert_eq!(u16::from_le_bytes([head[10], head[11]]), 3, "num_buffers");
    let mut tail = [0u8; 312];
    r.mem
        .read_slice(&mut tail, GuestAddress(0x30_0000))
        .unwrap();
    assert_eq!(&tail[..], &payload[1500 - 312..]);
}

/// Sixteen 2 KiB receive chains from descriptor 0 on.
fn rx_chains() -> Vec<RawDescriptor> {
    (0..16u64)
        .map(|i| d(0x10_0000 + i * 0x1000, 2048, WRITE, 0))
        .collect()
}

/// Frames that find no receive buffer wait in the tap, none dropped: the device holds the
/// one it read, asks the guest for a kick (no event idx: the used ring's NO_NOTIFY flag is
/// cleared) and reads the tap again once the guest posts buffers and kicks.
#[test]
fn frames_without_room_wait_in_the_tap_until_the_guest_posts_buffers() {
    let frames: Vec<Vec<u8>> = (0..13u8).map(|i| frame(&[i; 100])).collect();
    let first: Vec<&[u8]> = frames[..3].iter().map(|f| &f[..]).collect();
    let r = rig(&[], &[], VIRTIO_F_VERSION_1, &first);
    // `init` read the first frame, found no buffer and asked for a kick.
    assert_eq!(r.used_flags(RX_USED), 0, "the device wants a kick");
    for f in &frames[3..] {
        r.host.send(f).unwrap();
    }
    assert_eq!(r.count("rx_dropped"), 0);
    r.post_rx(&rx_chains(), 0);
    r.wait("every frame delivered", |r| r.count("rx_frames") == 13);
    assert_eq!(r.count("rx_dropped"), 0, "no frame was lost");
    for i in 0..13u64 {
        assert_eq!(
            r.used(RX_USED, i),
            (i as u32, 112),
            "frame {i} in chain {i}"
        );
        let mut b = [0u8; 1];
        let at = GuestAddress(0x10_0000 + i * 0x1000 + 12);
        r.mem.read_slice(&mut b, at).unwrap();
        assert_eq!(b[0], i as u8, "frame {i}'s bytes, in order");
    }
    assert_eq!(
        r.used_flags(RX_USED),
        1,
        "kicks are off while buffers remain"
    );
}

/// With event idx the device asks for a kick at the available index it stopped at; a kick
/// that brings too little room for the waiting frame (merged buffers) asks again further on.
#[test]
fn with_event_idx_the_device_asks_for_a_kick_where_it_stopped() {
    let f = frame(&[0x77; 1500]);
    let features = VIRTIO_F_VERSION_1 | VIRTIO_RING_F_EVENT_IDX | F_MRG_RXBUF;
    let rx = [d(0x10_0000, 600, WRITE, 0)];
    let r = rig(&rx, &[], features, &[&f]);
    assert_eq!(r.avail_event(RX_USED), 1, "kick once chain 1 is posted");
    r.post_rx(&[d(0x20_0000, 600, WRITE, 0)], 1);
    r.wait("asked again further on", |r| r.avail_event(RX_USED) == 2);
    assert_eq!(r.used_idx(RX_USED), 0, "the frame still waits");
    r.post_rx(&[d(0x30_0000, 600, WRITE, 0)], 2);
    r.wait("the frame delivered", |r| r.count("rx_frames") == 1);
    let used: Vec<_> = (0..3).map(|i| r.used(RX_USED, i)).collect();
    assert_eq!(used, [(0, 600), (1, 600), (2, 312)]);
    assert_eq!(r.count("rx_dropped"), 0);
}

/// A frame no chain can ever hold is dropped and counted: without merged buffers, one larger
/// than the next chain (a driver below the spec's minimum), the chain kept for a smaller
/// frame; a read-only chain is given back as malformed.
#[test]
fn frames_no_chain_can_hold_are_dropped_and_counted() {
    let f = frame(&[0xab; 100]);
    let rx = [d(0x10_0000, 64, 0, 0), d(0x20_0000, 50, WRITE, 0)];
    let r = rig(&rx, &[], VIRTIO_F_VERSION_1, &[&f, &frame(&[1; 20])]);
    r.wait("small frame delivered", |r| r.count("rx_frames") == 1);
    assert_eq!(r.count("rx_dropped"), 1);
    assert_eq!(r.dev.counters()[0].malformed.load(Ordering::Relaxed), 1);
    assert_eq!(r.used(RX_USED, 0), (0, 0), "the read-only chain, empty");
    assert_eq!(
        r.used(RX_USED, 1),
        (1, 32),
        "the small frame in the small chain"
    );
}

/// A tap that cannot take a frame yet (EAGAIN: its buffer is full) keeps the frame and its
/// chain, unused, and no further chain is taken; once the tap drains, every frame is sent in
/// order, none lost or counted as an error.
#[test]
fn a_frame_the_tap_cannot_take_yet_is_sent_when_it_can() {
    let mem_frame = 0x10_0000;
    let tx: Vec<_> = (0..4).map(|_| d(mem_frame, 72, 0, 0)).collect();
    let mut filler = 0;
    let r = rig_with(&[], &tx, VIRTIO_F_VERSION_1, &[], |end| {
        end.set_nonblocking(true).unwrap();
        while end.send(&[0xee; 1000]).is_ok() {
            filler += 1;
        }
    });
    assert!(filler > 0);
    // `init` met the full tap: the first chain is held, none used.
    assert_eq!(
        r.used_idx(TX_USED),
        0,
        "no chain used while the tap is full"
    );
    assert_eq!((r.count("tx_frames"), r.count("tx_errors")), (0, 0));
    let mut got = vec![0u8; 2048];
    for _ in 0..filler {
        assert_eq!(r.host.recv(&mut got).unwrap(), 1000);
    }
    r.wait("every chain sent", |r| r.used_idx(TX_USED) == 4);
    for _ in 0..4 {
        assert_eq!(r.host.recv(&mut got).unwrap(), 72, "a guest frame");
        assert_eq!(&got[12..72], &[0x5a; 60][..]);
    }
    assert_eq!((r.count("tx_frames"), r.count("tx_errors")), (4, 0));
}

#[test]
fn config_space_holds_the_mac_and_link_up() {
    let (_, end) = UnixDatagram::pair().unwrap();
    let dev = Net::with_tap(Tap::from_socket(end), [0x52, 0x54, 0, 9, 8, 7]);
    let mut cfg = [0xffu8; 10];
    dev.read_config(0, &mut cfg);
    assert_eq!(cfg, [0x52, 0x54, 0, 9, 8, 7, 1, 0, 0, 0]);
    let mut status = [0u8; 2];
    dev.read_config(6, &mut status);
    assert_eq!(status, [1, 0]);
    assert_eq!(
        dev.features() & OFFLOADS,
        0,
        "no offloads without a tap that takes them"
    );
    assert_ne!(dev.features() & F_MRG_RXBUF, 0);
    assert_eq!(default_mac("tap0"), default_mac("tap0"));
    assert_ne!(default_mac("tap0"), default_mac("tap1"));
    assert_eq!(
        default_mac("tap0")[0] & 3,
        2,
        "locally administered unicast"
    );
}

#[test]
fn the_tap_is_told_the_offloads_the_driver_accepted() {
    let f = |bits: &[u32]| bits.iter().fold(0u64, |a, b| a | 1 << b);
    let all = f(&[
        vn::VIRTIO_NET_F_GUEST_CSUM,
        vn::VIRTIO_NET_F_GUEST_TSO4,
        vn::VIRTIO_NET_F_GUEST_TSO6,
        vn::VIRTIO_NET_F_GUEST_ECN,
    ]);
    assert_eq!(
        tap_offloads(all),
        tap::TUN_F_CSUM | tap::TUN_F_TSO4 | tap::TUN_F_TSO6 | tap::TUN_F_TSO_ECN
    );
    assert_eq!(
        tap_offloads(f(&[vn::VIRTIO_NET_F_GUEST_CSUM])),
        tap::TUN_F_CSUM
    );
    // Segmentation without checksum offload means nothing to the kernel: none at all.
    assert_eq!(tap_offloads(f(&[vn::VIRTIO_NET_F_GUEST_TSO4])), 0);
    // Host-side offloads (what the guest may send) are not the tap's reader's business.
    assert_eq!(
        tap_offloads(f(&[vn::VIRTIO_NET_F_HOST_TSO4, vn::VIRTIO_NET_F_CSUM])),
        0
    );
}

/// A real tap (root, in a network namespace of the test's own) takes every offload, so the
/// card offers them; activating with them set tells the tap.
#[test]
fn a_real_tap_takes_the_offloads_and_the_card_offers_them() {
    let net = match private_net::PrivateNet::create()
        .and_then(|n| n.add_tap("exl-off0").map(|t| (n, t)))
    {
        Ok(n) => n,
        Err(e) => {
            let why = format!("cannot make a tap in a private network namespace (needs root): {e}");
            return crate::test_skip::skip("virtio_net_offloads", &why);
        }
    };
    let (_ns, tap) = net;
    assert!(tap.supports_offloads());
    tap.set_offloads(tap_offloads(OFFLOADS)).unwrap();
    let dev = Net::with_tap(tap, [0x52, 0x54, 0, 0, 0, 1]);
    assert_eq!(dev.features() & OFFLOADS, OFFLOADS);
}

/// Kata opens the tap and sends its fd: a tap with the virtio-net header is taken as is; one
/// without it, or an fd that is no tap, is refused with why.
#[test]
fn a_tap_opened_by_another_program_is_taken_from_its_fd() {
    let ns = match private_net::PrivateNet::create() {
        Ok(ns) => ns,
        Err(e) => {
            let why = format!("cannot make a private network namespace (needs root): {e}");
            return crate::test_skip::skip("virtio_net_tap_fd", &why);
        }
    };
    let fd = ns
        .open_foreign_tap("exl-fd0", private_net::KATA_TAP_FLAGS)
        .unwrap();
    let taken = Tap::from_fd(fd).unwrap();
    assert_eq!(taken.name(), "exl-fd0");
    let no_header = private_net::KATA_TAP_FLAGS & !0x4000;
    let plain = ns.open_foreign_tap("exl-fd1", no_header).unwrap();
    let err = Tap::from_fd(plain).unwrap_err().to_string();
    assert!(
        err.contains("exl-fd1") && err.contains("IFF_VNET_HDR"),
        "{err}"
    );
    let (pipe, _other) = std::os::unix::net::UnixStream::pair().unwrap();
    let err = Tap::from_fd(pipe.into()).unwrap_err().to_string();
    assert!(err.contains("not one"), "{err}");
}

/// A snapshot of a running card (docs/snapshot.md): the receive chains it held for a frame
/// that did not fit yet (a malformed one among them) are given back in the ring, not used,
/// and the frame waiting for them is dropped and counted (in flight); nothing is written
/// while quiesced; afterwards the same chains are taken again in order, none lost or used
/// twice.
#[test]
fn a_snapshot_gives_back_the_receive_chains_held_and_nothing_is_used_twice() {
    let rx = [
        d(0x10_0000, 600, WRITE, 0),
        d(0x20_0000, 600, 0, 0), // read-only: malformed
        d(0x30_0000, 600, WRITE, 0),
    ];
    // 2000 bytes need more than the two good chains: taken and held, the frame waits.
    let big = frame(&[0x11; 2000]);
    let mut r = rig(&rx, &[], VIRTIO_F_VERSION_1 | F_MRG_RXBUF, &[&big]);
    assert_eq!(r.used_idx(RX_USED), 0, "the chains are held, not used");
    assert_eq!(r.count("rx_dropped"), 0, "the frame waits");
    assert_eq!(r.dev.prefilled_queues(), &[RX]);
    r.dev.quiesce().unwrap();
    assert_eq!(r.count("rx_dropped"), 1, "the waiting frame, in flight");
    r.host.send(&frame(&[0x22; 50])).unwrap();
    assert_eq!(r.used_idx(RX_USED), 0, "nothing written while quiesced");
    r.dev.unquiesce();
    // Taken again from the first: the next frame fills chain 0, then the malformed chain
    // is given back empty when the next frame reaches it.
    r.wait("a frame after", |r| r.count("rx_frames") == 1);
    assert_eq!(r.used(RX_USED, 0), (0, 62));
    r.host.send(&frame(&[0x44; 50])).unwrap();
    r.wait("the next frame", |r| r.count("rx_frames") == 2);
    assert_eq!(
        r.used(RX_USED, 1),
        (1, 0),
        "the malformed chain, empty, in order"
    );
    assert_eq!(r.used(RX_USED, 2), (2, 62));
    assert_eq!(r.used_idx(RX_USED), 3, "each chain used once");
    assert_eq!(r.dev.counters()[0].malformed.load(Ordering::Relaxed), 1);
}
