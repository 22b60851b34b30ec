//! The front end against fake back ends on a socketpair: one that follows the protocol, one
//! that closes mid-handshake, ones that answer with the wrong request or size, one that never
//! answers (bounded by the timeout), one that refuses a request.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::mpsc::{channel, Receiver};
use std::thread::JoinHandle;
use std::time::Duration;

use vhost::vhost_user::message::{FrontendReq, VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use super::*;

mod state;
use crate::memory::{create_guest_memory, Backing, MIN_MEMORY};

const PROTOCOL: u64 = 1 << 30;
const OFFERED: u64 = VIRTIO_F_VERSION_1 | (1 << 29) | PROTOCOL;

/// A request the fake back end received.
#[derive(Debug)]
struct Seen {
    code: u32,
    flags: u32,
    body: Vec<u8>,
    fds: Vec<File>,
}

/// How the fake back end misbehaves.
#[derive(Clone, Copy, PartialEq)]
enum Behaviour {
    Honest,
    /// Closes its socket after this many requests.
    CloseAfter(usize),
    /// Answers GET_FEATURES with another request's code.
    WrongCode,
    /// Answers GET_FEATURES with a 4-byte body.
    WrongSize,
    /// Never answers GET_FEATURES (keeps the socket open).
    Silent,
    /// Acks SET_MEM_TABLE with a failure status.
    RefuseMemTable,
    /// Answers this many requests, then closes its socket (a back end that dies).
    DieAfter(usize),
}

fn word(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
}

/// Receives one request with its fds; None once the socket closed.
fn receive(sock: &UnixStream) -> Option<Seen> {
    let mut header = [0u8; 12];
    let mut fds = [-1 as RawFd; 8];
    let mut iov = [libc::iovec {
        iov_base: header.as_mut_ptr().cast(),
        iov_len: header.len(),
    }];
    // SAFETY: the iovec points at `header`, which lives across the call.
    let (n, nfds) = unsafe { sock.recv_with_fds(&mut iov, &mut fds) }.ok()?;
    if n != 12 {
        return None;
    }
    let mut body = vec![0u8; word(&header, 8) as usize];
    std::io::Read::read_exact(&mut &*sock, &mut body).ok()?;
    let fds = fds[..nfds]
        .iter()
        // SAFETY: each fd was just received and is owned by nothing else.
        .map(|&fd| unsafe { File::from_raw_fd(fd) })
        .collect();
    Some(Seen {
        code: word(&header, 0),
        flags: word(&header, 4),
        body,
        fds,
    })
}

fn reply(sock: &UnixStream, code: u32, body: &[u8]) {
    let mut m = code.to_ne_bytes().to_vec();
    m.extend_from_slice(&(0x1u32 | 0x4).to_ne_bytes());
    m.extend_from_slice(&(body.len() as u32).to_ne_bytes());
    m.extend_from_slice(body);
    let _ = std::io::Write::write_all(&mut &*sock, &m);
}

/// What an honest back end answers `r`, if anything.
fn honest_answer(r: &Seen) -> Option<Vec<u8>> {
    let value = |v: u64| Some(v.to_ne_bytes().to_vec());
    let protocol = VhostUserProtocolFeatures::REPLY_ACK
        | VhostUserProtocolFeatures::MQ
        | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
        | VhostUserProtocolFeatures::CONFIG;
    match FrontendReq::try_from(r.code).ok()? {
        FrontendReq::GET_FEATURES => value(OFFERED),
        FrontendReq::GET_PROTOCOL_FEATURES => value(protocol.bits()),
        FrontendReq::GET_QUEUE_NUM => value(2),
        FrontendReq::GET_VRING_BASE => {
            let mut b = r.body[..4].to_vec();
            b.extend_from_slice(&7u32.to_ne_bytes());
            Some(b)
        }
        _ if r.flags & 0x8 != 0 => value(0),
        _ => None,
    }
}

/// A fake back end on one end of a socketpair; returns the other end and what it saw.
fn fake(behaviour: Behaviour) -> (UnixStream, Receiver<Seen>, JoinHandle<()>) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let (tx, rx) = channel();
    let t = std::thread::spawn(move || {
        let mut count = 0;
        while let Some(r) = receive(&theirs) {
            count += 1;
            let code = FrontendReq::try_from(r.code).ok();
            let (rcode, honest) = (r.code, honest_answer(&r));
            let _ = tx.send(r);
            match behaviour {
                Behaviour::CloseAfter(n) if count >= n => return,
                Behaviour::WrongCode if code == Some(FrontendReq::GET_FEATURES) => {
                    reply(
                        &theirs,
                        FrontendReq::GET_PROTOCOL_FEATURES.into(),
                        &OFFERED.to_ne_bytes(),
                    );
                    continue;
                }
                Behaviour::WrongSize if code == Some(FrontendReq::GET_FEATURES) => {
                    reply(&theirs, rcode, &[1, 0, 0, 0]);
                    continue;
                }
                Behaviour::Silent if code == Some(FrontendReq::GET_FEATURES) => {
                    std::thread::sleep(Duration::from_secs(3));
                    return;
                }
                Behaviour::RefuseMemTable if code == Some(FrontendReq::SET_MEM_TABLE) => {
                    reply(&theirs, rcode, &1u64.to_ne_bytes());
                    continue;
                }
                _ => {}
            }
            if let Some(body) = honest {
                reply(&theirs, rcode, &body);
            }
            if behaviour == Behaviour::DieAfter(count) {
                return;
            }
        }
    });
    (ours, rx, t)
}

fn codes(seen: &Receiver<Seen>) -> Vec<FrontendReq> {
    seen.try_iter()
        .map(|r| FrontendReq::try_from(r.code).unwrap())
        .collect()
}

fn connect(behaviour: Behaviour) -> (Result<Frontend, VhostUserError>, Receiver<Seen>) {
    let (sock, seen, _t) = fake(behaviour);
    let f = Frontend::handshake(sock, Path::new("fake.sock"), 2, Duration::from_millis(300));
    (f, seen)
}

#[test]
fn the_handshake_negotiates_what_both_sides_have() {
    let (f, seen) = connect(Behaviour::Honest);
    let f = f.unwrap();
    use FrontendReq as R;
    assert_eq!(
        codes(&seen),
        [
            R::SET_OWNER,
            R::GET_FEATURES,
            R::SET_FEATURES,
            R::GET_PROTOCOL_FEATURES,
            R::SET_PROTOCOL_FEATURES,
            R::GET_QUEUE_NUM
        ]
    );
    assert_eq!(f.offered_features(), VIRTIO_F_VERSION_1 | (1 << 29));
    let not_offered =
        VhostUserProtocolFeatures::DEVICE_STATE | VhostUserProtocolFeatures::LOG_SHMFD;
    assert_eq!(
        f.protocol_features(),
        WANTED_PROTOCOL_FEATURES.difference(not_offered),
        "CONFIG is not taken, DEVICE_STATE and LOG_SHMFD are not offered"
    );
    assert!(f.can_add_regions());
    // A migration refuses a running device on it: it cannot log its writes.
    assert!(!f.can_log());
}

#[test]
fn a_back_end_serving_too_few_queues_is_refused() {
    let (sock, _seen, _t) = fake(Behaviour::Honest);
    let e =
        Frontend::handshake(sock, Path::new("fake"), 3, Duration::from_millis(300)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "The back end serves 2 queues; the device has 3"
    );
}

/// Shared guest memory with a value the back end should find through the fd.
fn shared_memory() -> GuestMemoryMmap {
    let shared = Backing {
        shared: true,
        hugepage_size: None,
    };
    let mem = create_guest_memory(MIN_MEMORY, &shared).unwrap();
    mem.write_obj(0xfeed_f00du32, GuestAddress(0x1000)).unwrap();
    mem
}

fn vring(index: u16, kick: &EventFd, call: Option<&EventFd>) -> Vring {
    Vring {
        index,
        size: 256,
        desc: 0x10_0000 + u64::from(index) * 0x1_0000,
        avail: 0x10_1000 + u64::from(index) * 0x1_0000,
        used: 0x10_2000 + u64::from(index) * 0x1_0000,
        base: 3,
        kick: kick.as_raw_fd(),
        call: call.map(|c| c.as_raw_fd()),
    }
}

/// A u32 at offset 0x1000 of the file, read through a mapping of it (what a back end does).
fn mapped_u32(file: &File) -> u32 {
    let len = MIN_MEMORY as usize;
    // SAFETY: a fresh shared read-only mapping of the whole file, unmapped before returning.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        let v = *(p.cast::<u8>().add(0x1000).cast::<u32>());
        libc::munmap(p, len);
        v
    }
}

#[test]
fn start_hands_over_memory_and_rings_and_stop_takes_them_back() {
    let (sock, seen, _t) = fake(Behaviour::Honest);
    let mut f = Frontend::handshake(sock, Path::new("fake"), 2, Duration::from_secs(2)).unwrap();
    let _ = codes(&seen);
    let mem = shared_memory();
    let (kick0, kick1, call0) = (
        EventFd::new(0).unwrap(),
        EventFd::new(0).unwrap(),
        EventFd::new(0).unwrap(),
    );
    let vrings = [vring(0, &kick0, Some(&call0)), vring(1, &kick1, None)];
    f.start(&mem, VIRTIO_F_VERSION_1, &vrings).unwrap();
    let got: Vec<Seen> = seen.try_iter().collect();
    let code = |r: &Seen| FrontendReq::try_from(r.code).unwrap();
    use FrontendReq as R;
    let ring = [
        R::SET_VRING_NUM,
        R::SET_VRING_ADDR,
        R::SET_VRING_BASE,
        R::SET_VRING_CALL,
        R::SET_VRING_KICK,
        R::SET_VRING_ENABLE,
    ];
    let want: Vec<R> = [R::SET_FEATURES, R::SET_MEM_TABLE]
        .into_iter()
        .chain(ring)
        .chain(ring)
        .collect();
    assert_eq!(got.iter().map(code).collect::<Vec<_>>(), want);
    assert!(
        got.iter().all(|r| r.flags & 0x8 != 0),
        "REPLY_ACK asked on every request"
    );
    let features = u64::from_ne_bytes(got[0].body[..8].try_into().unwrap());
    assert_eq!(features, VIRTIO_F_VERSION_1 | PROTOCOL);
    // One region, its fd the memfd: the back end's own mapping sees the guest's memory.
    let table = &got[1];
    assert_eq!((word(&table.body, 0), table.fds.len()), (1, 1));
    let region = &table.body[8..40];
    let host = mem.get_host_address(GuestAddress(0)).unwrap() as u64;
    let field = |i: usize| u64::from_ne_bytes(region[i * 8..i * 8 + 8].try_into().unwrap());
    assert_eq!(
        (field(0), field(1), field(2), field(3)),
        (0, MIN_MEMORY, host, 0)
    );
    assert_eq!(mapped_u32(&table.fds[0]), 0xfeed_f00d);
    // Ring addresses are this process's, the base where the queue resumes.
    let addr = &got[3].body;
    assert_eq!(
        u64::from_ne_bytes(addr[8..16].try_into().unwrap()),
        host + 0x10_0000
    );
    assert_eq!(word(&got[4].body, 4), 3);
    // Queue 0's call is its irqfd; queue 1 is polled: an eventfd of its own all the same
    // (libvhost-user back ends need one), not the NOFD flag.
    assert_eq!((got[5].fds.len(), got[11].fds.len()), (1, 1));
    assert_eq!(u64::from_ne_bytes(got[11].body[..8].try_into().unwrap()), 1);
    assert_eq!(got[6].fds.len(), 1, "the kick eventfd");
    assert_eq!(f.started(), [0, 1]);
    assert_eq!(f.stop().unwrap(), [(0, 7), (1, 7)]);
    assert_eq!(codes(&seen), [R::GET_VRING_BASE, R::GET_VRING_BASE]);
    assert!(f.started().is_empty());
    assert_eq!(f.stop().unwrap(), [], "nothing left to stop");
}

#[test]
fn private_memory_is_refused_before_anything_is_sent() {
    let (sock, seen, _t) = fake(Behaviour::Honest);
    let mut f = Frontend::handshake(sock, Path::new("fake"), 2, Duration::from_secs(2)).unwrap();
    let _ = codes(&seen);
    let private = create_guest_memory(MIN_MEMORY, &Backing::default()).unwrap();
    let kick = EventFd::new(0).unwrap();
    let e = f
        .start(&private, VIRTIO_F_VERSION_1, &[vring(0, &kick, None)])
        .unwrap_err();
    assert!(e.to_string().contains("memory.shared=true"), "{e}");
    std::thread::sleep(Duration::from_millis(20));
    assert!(codes(&seen).is_empty());
}

#[test]
fn a_back_end_that_closes_mid_handshake_is_one_clear_error() {
    let (f, _) = connect(Behaviour::CloseAfter(1));
    let e = f.unwrap_err().to_string();
    assert_eq!(
        e,
        "The back end closed its socket (before answering GET_FEATURES)"
    );
}

#[test]
fn a_reply_to_another_request_is_refused() {
    let (f, _) = connect(Behaviour::WrongCode);
    let e = f.unwrap_err().to_string();
    assert!(
        e.starts_with("The back end answered GET_FEATURES with GET_PROTOCOL_FEATURES"),
        "{e}"
    );
}

#[test]
fn a_reply_of_the_wrong_size_is_refused() {
    let (f, _) = connect(Behaviour::WrongSize);
    let e = f.unwrap_err().to_string();
    assert_eq!(e, "The back end's reply to GET_FEATURES has 4 bytes, not 8");
}

#[test]
fn a_back_end_that_never_answers_times_out_and_breaks_the_connection() {
    let (sock, _seen, _t) = fake(Behaviour::Silent);
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let _ = tx.send(
            Frontend::handshake(sock, Path::new("fake"), 2, Duration::from_millis(200)).map(drop),
        );
    });
    // Bounded: the answer comes (an error) long before the fake's 3 s silence ends.
    let e = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("no hang")
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "The back end did not answer GET_FEATURES within 200ms"
    );
}

#[test]
fn a_refused_request_fails_the_start_and_later_requests_fail_at_once() {
    let (sock, _seen, _t) = fake(Behaviour::RefuseMemTable);
    let mut f = Frontend::handshake(sock, Path::new("fake"), 2, Duration::from_secs(2)).unwrap();
    let kick = EventFd::new(0).unwrap();
    let e = f
        .start(
            &shared_memory(),
            VIRTIO_F_VERSION_1,
            &[vring(0, &kick, None)],
        )
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "The back end refused SET_MEM_TABLE (status 1)"
    );
    assert!(f.broken().is_some());
    let e = f
        .start(&shared_memory(), VIRTIO_F_VERSION_1, &[])
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("The connection to the back end is broken"),
        "{e}"
    );
}

#[test]
fn the_protocol_bits_are_the_crates() {
    assert_eq!(PROTOCOL, VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits());
}

/// A test interrupt whose queues' "irqfds" are plain eventfds.
struct CallFds(Vec<EventFd>);

impl crate::devices::virtio::VirtioInterrupt for CallFds {
    fn signal_queue(&self, _queue: u16) -> std::io::Result<bool> {
        Ok(false)
    }
    fn signal_config(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn queue_irqfd(&self, queue: u16) -> std::io::Result<Option<RawFd>> {
        Ok(self.0.get(usize::from(queue)).map(|e| e.as_raw_fd()))
    }
}

/// Queue `index` with its rings at 0x10_0000 + index * 0x1_0000 of `mem`.
fn active_queue(mem: &GuestMemoryMmap, index: u16) -> crate::devices::virtio::ActiveQueue {
    use virtio_queue::{Queue, QueueT};
    let base = 0x10_0000 + u64::from(index) * 0x1_0000;
    let mut q = Queue::new(256).unwrap();
    q.set_size(16);
    q.set_desc_table_address(Some(base as u32), Some(0));
    q.set_avail_ring_address(Some((base + 0x1000) as u32), Some(0));
    q.set_used_ring_address(Some((base + 0x2000) as u32), Some(0));
    q.set_ready(true);
    assert!(q.is_valid(mem));
    crate::devices::virtio::ActiveQueue {
        index,
        queue: q,
        notify: std::sync::Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()),
    }
}

/// What `Fs::activate` gets for `queues` queues, and the queues' call eventfds.
fn activation(
    mem: &GuestMemoryMmap,
    queues: u16,
) -> (crate::devices::virtio::Activation, std::sync::Arc<CallFds>) {
    let calls = (0..queues)
        .map(|_| EventFd::new(libc::EFD_NONBLOCK).unwrap())
        .collect();
    let irq = std::sync::Arc::new(CallFds(calls));
    let a = crate::devices::virtio::Activation {
        mem: crate::devices::virtio::SharedGuestMemory::new(mem.clone()),
        features: VIRTIO_F_VERSION_1,
        queues: (0..queues).map(|i| active_queue(mem, i)).collect(),
        interrupt: irq.clone(),
        health: crate::devices::virtio::test_support::health(),
        dirty: Default::default(),
    };
    (a, irq)
}

fn fs_config(socket: &Path) -> crate::config::FsConfig {
    format!("tag=myfs,socket={}", socket.display())
        .parse()
        .unwrap()
}

#[test]
fn the_fs_device_offers_its_tag_and_the_back_ends_features() {
    use crate::devices::virtio::vhost_user::fs::Fs;
    use crate::devices::virtio::VirtioDevice;
    let (sock, _seen, _t) = fake(Behaviour::Honest);
    let frontend = Frontend::handshake(sock, Path::new("fake"), 2, Duration::from_secs(2)).unwrap();
    let fs = Fs::new(&fs_config(Path::new("fake")), frontend).unwrap();
    assert_eq!(fs.device_type(), crate::devices::virtio::TYPE_FS);
    assert_eq!(
        fs.queue_max_sizes(),
        [1024, 1024],
        "hiprio and one request queue"
    );
    assert_eq!(
        fs.features(),
        VIRTIO_F_VERSION_1 | (1 << 29),
        "what both sides have"
    );
    let mut tag = [0u8; 40];
    fs.read_config(0, &mut tag);
    assert_eq!(&tag[..5], b"myfs\0");
    assert_eq!(&tag[36..], 1u32.to_le_bytes());
    let mut past = [0xffu8; 4];
    fs.read_config(38, &mut past);
    assert_eq!(past, [0; 4], "reads past the space are zero");
}

#[test]
fn a_back_end_that_dies_puts_the_device_in_needs_reset_alone() {
    use crate::devices::virtio::vhost_user::fs::Fs;
    use crate::devices::virtio::VirtioDevice;
    // 6 handshake requests, SET_FEATURES, SET_MEM_TABLE and 6 per queue (2): then it dies.
    let (sock, _seen, _t) = fake(Behaviour::DieAfter(20));
    let frontend = Frontend::handshake(sock, Path::new("fake"), 2, Duration::from_secs(2)).unwrap();
    let mut fs = Fs::new(&fs_config(Path::new("fake")), frontend).unwrap();
    let mem = shared_memory();
    let (a, _calls) = activation(&mem, 2);
    let health = a.health.clone();
    let watch = fs.activate(a).unwrap();
    let events = crate::event_loop::EventLoop::start().unwrap();
    events.handle().add(watch).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !health.needs_reset() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(health.needs_reset(), "the dead back end was noticed");
    // The reset that follows asks the gone back end nothing and leaves the device idle; a
    // new start is refused at once (no reconnecting).
    fs.reset();
    assert!(fs.frontend().started().is_empty());
    let counters: std::collections::HashMap<_, _> = fs.device_counters().into_iter().collect();
    assert_eq!(
        (counters["backend_starts"], counters["backend_failed_stops"]),
        (1, 0)
    );
    let (a, _calls) = activation(&mem, 2);
    let e = fs.activate(a).err().unwrap().to_string();
    assert!(e.contains("closed its socket earlier"), "{e}");
}

/// virtiofsd, if installed and this process is root (it needs to be): the bench's lookup.
fn virtiofsd(test: &str) -> Option<super::virtiofsd::Daemon> {
    super::virtiofsd::find()
        .map_err(|why| crate::test_skip::skip(test, &why))
        .ok()
}

/// A FUSE_INIT request (fuse_in_header, then the 16-byte fuse_init_in of protocol 7.31).
fn fuse_init() -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&56u32.to_le_bytes()); // len
    m.extend_from_slice(&26u32.to_le_bytes()); // FUSE_INIT
    m.extend_from_slice(&1u64.to_le_bytes()); // unique
    m.extend_from_slice(&[0u8; 24]); // nodeid, uid, gid, pid, extlen, padding
    for v in [7u32, 31, 0, 0] {
        m.extend_from_slice(&v.to_le_bytes()); // major, minor, max_readahead, flags
    }
    m
}

#[test]
fn virtiofsd_answers_fuse_init_through_the_handed_over_queue() {
    use crate::devices::virtio::vhost_user::fs::Fs;
    use crate::devices::virtio::VirtioDevice;
    let Some(daemon) = virtiofsd("virtiofsd_fuse_init") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("exitless-vfs-unit-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("shared")).unwrap();
    let socket = dir.join("fs.sock");
    let cache = super::virtiofsd::Cache::Never;
    let mut child = daemon
        .command(&socket, &dir.join("shared"), cache)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !socket.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut fs = Fs::connect(&fs_config(&socket)).unwrap();
    let mem = shared_memory();
    let (a, calls) = activation(&mem, 2);
    // Queue 1 (requests): FUSE_INIT at 0x20_0000, its reply buffer at 0x21_0000.
    let (req, out) = (GuestAddress(0x20_0000), GuestAddress(0x21_0000));
    mem.write_slice(&fuse_init(), req).unwrap();
    let desc = |at: u64, addr: u64, len: u32, flags: u16, next: u16| {
        mem.write_obj(addr, GuestAddress(at)).unwrap();
        mem.write_obj(len, GuestAddress(at + 8)).unwrap();
        mem.write_obj(flags, GuestAddress(at + 12)).unwrap();
        mem.write_obj(next, GuestAddress(at + 14)).unwrap();
    };
    desc(0x11_0000, req.0, 56, 1, 1); // NEXT
    desc(0x11_0010, out.0, 4096, 2, 0); // WRITE
    mem.write_obj(0u16, GuestAddress(0x11_1004)).unwrap(); // avail ring[0] = head 0
    mem.write_obj(1u16, GuestAddress(0x11_1002)).unwrap(); // avail idx
    let kick = a.queues[1].notify.clone();
    fs.activate(a).unwrap();
    kick.write(1).unwrap();
    // The used index, not the call eventfd: QEMU's C virtiofsd (libvhost-user) signals the
    // call once when it is handed over, before any request.
    let used = || mem.read_obj::<u16>(GuestAddress(0x11_2002)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while used() == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let used_idx = used();
    let signalled = calls.0[1].read().is_ok();
    let error: i32 = mem.read_obj(GuestAddress(out.0 + 4)).unwrap();
    let major: u32 = mem.read_obj(GuestAddress(out.0 + 16)).unwrap();
    fs.reset();
    drop(fs);
    let _ = child.kill();
    let _ = child.wait();
    daemon.clean_up(&socket);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(used_idx, 1, "virtiofsd completed the request");
    assert!(signalled, "and signalled the queue's call eventfd");
    assert_eq!((error, major), (0, 7), "FUSE_INIT answered");
}

#[test]
fn a_region_added_later_goes_alone_with_its_memfd() {
    let (sock, seen, _t) = fake(Behaviour::Honest);
    let mut f = Frontend::handshake(sock, Path::new("fake"), 2, Duration::from_secs(2)).unwrap();
    let _ = codes(&seen);
    let shared = Backing {
        shared: true,
        hugepage_size: None,
    };
    let region = crate::memory::create_region(GuestAddress(1 << 32), 2 << 20, &shared).unwrap();
    f.add_region(&region).unwrap();
    let r = seen.try_iter().next().unwrap();
    assert_eq!(
        FrontendReq::try_from(r.code).unwrap(),
        FrontendReq::ADD_MEM_REG
    );
    assert_eq!((r.body.len(), r.fds.len()), (40, 1));
    let gpa = u64::from_ne_bytes(r.body[8..16].try_into().unwrap());
    let size = u64::from_ne_bytes(r.body[16..24].try_into().unwrap());
    assert_eq!((gpa, size), (1 << 32, 2 << 20));
    let private = crate::memory::create_region(GuestAddress(0), 2 << 20, &Backing::default());
    let e = f.add_region(&private.unwrap()).unwrap_err();
    assert!(e.to_string().contains("is private"), "{e}");
}

#[test]
fn the_memory_listener_adds_a_region_to_a_started_back_end_only() {
    use crate::devices::virtio::vhost_user::fs::Fs;
    use crate::devices::virtio::VirtioDevice;
    use crate::memory::hotplug::MemoryListener;
    let (sock, seen, _t) = fake(Behaviour::Honest);
    let frontend = Frontend::handshake(sock, Path::new("fake"), 2, Duration::from_secs(2)).unwrap();
    let fs = Fs::new(&fs_config(Path::new("fake")), frontend).unwrap();
    let events = crate::event_loop::EventLoop::start().unwrap();
    let mut listener = fs.memory_listener("fs0", events.handle());
    let shared = Backing {
        shared: true,
        hugepage_size: None,
    };
    let region = std::sync::Arc::new(
        crate::memory::create_region(GuestAddress(1 << 32), 2 << 20, &shared).unwrap(),
    );
    let _ = codes(&seen);
    // Not started: nothing is sent (the next start sends the whole table).
    listener.region_added(&region).unwrap();
    assert!(codes(&seen).is_empty());
    // Started on the devices thread, as the transport starts it: the region goes.
    let mem = shared_memory();
    let (a, _calls) = activation(&mem, 2);
    let (tx, rx) = std::sync::mpsc::channel();
    let mut moved = fs;
    events
        .handle()
        .call(move |_| {
            let watch = moved.activate(a).map(drop);
            let _ = tx.send((watch.is_ok(), moved));
        })
        .unwrap();
    let (started, fs) = rx.recv().unwrap();
    assert!(started);
    let _ = codes(&seen);
    listener.region_added(&region).unwrap();
    assert_eq!(codes(&seen), [FrontendReq::ADD_MEM_REG]);
    assert!(!listener.is_gone());
    drop(fs);
    assert!(listener.is_gone(), "a removed device's listener is dropped");
    listener.region_added(&region).unwrap();
    assert!(codes(&seen).is_empty());
}
