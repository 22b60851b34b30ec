//! The back end's state through the device-state protocol: refused by name where the back end
//! lacks it; with the real virtiofsd, a file opened through one daemon is read and written
//! through the same FUSE file handle on a fresh daemon that loaded the first one's state.

use std::path::PathBuf;
use std::process::Child;

use super::*;
use crate::devices::virtio::vhost_user::fs::Fs;
use crate::devices::virtio::VirtioDevice;

#[test]
fn a_back_end_without_device_state_is_refused_by_name() {
    let (sock, seen, _t) = fake(Behaviour::Honest);
    let mut f = Frontend::handshake(sock, Path::new("fake"), 2, Duration::from_secs(2)).unwrap();
    assert!(!f.has_device_state());
    let _ = codes(&seen);
    let e = f.save_device_state().unwrap_err().to_string();
    assert!(
        e.contains("does not offer VHOST_USER_PROTOCOL_F_DEVICE_STATE"),
        "{e}"
    );
    let e = f.load_device_state(b"x").unwrap_err().to_string();
    assert!(e.contains("DEVICE_STATE"), "{e}");
    assert!(codes(&seen).is_empty(), "nothing was asked of the back end");
    let (sock, _seen, _t) = fake(Behaviour::Honest);
    let frontend = Frontend::handshake(sock, Path::new("fake.sock"), 2, REPLY_TIMEOUT).unwrap();
    let fs = Fs::new(&fs_config(Path::new("fake.sock")), frontend).unwrap();
    let e = fs.snapshot_support().unwrap_err();
    assert!(
        e.contains("back end at fake.sock does not offer VHOST_USER_PROTOCOL_F_DEVICE_STATE"),
        "{e}"
    );
}

/// One FUSE request at a time on queue 1 (rings as `active_queue` lays them out).
struct Fuse<'a> {
    mem: &'a GuestMemoryMmap,
    kick: std::sync::Arc<EventFd>,
    posted: u16,
    unique: u64,
}

const DESC: u64 = 0x11_0000;
const AVAIL: u64 = 0x11_1000;
const USED: u64 = 0x11_2000;
const REQ: u64 = 0x20_0000;
const OUT: u64 = 0x21_0000;

impl Fuse<'_> {
    /// Sends `opcode` for `node` with `body`; returns the reply's error and body.
    fn call(&mut self, opcode: u32, node: u64, body: &[u8]) -> (i32, Vec<u8>) {
        self.unique += 1;
        let mut m = Vec::new();
        m.extend_from_slice(&(40 + body.len() as u32).to_le_bytes());
        m.extend_from_slice(&opcode.to_le_bytes());
        m.extend_from_slice(&self.unique.to_le_bytes());
        m.extend_from_slice(&node.to_le_bytes());
        m.extend_from_slice(&[0u8; 16]); // uid, gid, pid, extlen, padding
        m.extend_from_slice(body);
        let mem = self.mem;
        mem.write_slice(&m, GuestAddress(REQ)).unwrap();
        let desc = |at: u64, addr: u64, len: u32, flags: u16, next: u16| {
            mem.write_obj(addr, GuestAddress(at)).unwrap();
            mem.write_obj(len, GuestAddress(at + 8)).unwrap();
            mem.write_obj(flags, GuestAddress(at + 12)).unwrap();
            mem.write_obj(next, GuestAddress(at + 14)).unwrap();
        };
        // The out header and the reply's body in buffers of their own, as drivers post them.
        desc(DESC, REQ, m.len() as u32, 1, 1);
        desc(DESC + 16, OUT, 16, 3, 2);
        // A READ's buffer is exactly its size: virtiofsd fills what it is given.
        let room = match opcode {
            15 => u32::from_le_bytes(body[16..20].try_into().unwrap()),
            _ => 4096,
        };
        desc(DESC + 32, OUT + 0x1000, room, 2, 0);
        let slot = u64::from(self.posted % 16);
        mem.write_obj(0u16, GuestAddress(AVAIL + 4 + 2 * slot))
            .unwrap();
        self.posted = self.posted.wrapping_add(1);
        mem.write_obj(self.posted, GuestAddress(AVAIL + 2)).unwrap();
        self.kick.write(1).unwrap();
        let used = || mem.read_obj::<u16>(GuestAddress(USED + 2)).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while used() != self.posted && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(used(), self.posted, "virtiofsd answered opcode {opcode}");
        let mut out = vec![0u8; 16 + 4096];
        mem.read_slice(&mut out[..16], GuestAddress(OUT)).unwrap();
        mem.read_slice(&mut out[16..], GuestAddress(OUT + 0x1000))
            .unwrap();
        let len = u32::from_le_bytes(out[..4].try_into().unwrap()) as usize;
        let error = i32::from_le_bytes(out[4..8].try_into().unwrap());
        (error, out[16..len.clamp(16, out.len())].to_vec())
    }

    fn must(&mut self, opcode: u32, node: u64, body: &[u8]) -> Vec<u8> {
        let (error, reply) = self.call(opcode, node, body);
        assert_eq!(error, 0, "FUSE opcode {opcode} failed");
        reply
    }
}

/// `fh`'s READ (opcode 15) or WRITE (16) body: fh, offset, size, flags, lock owner, flags.
fn io_in(fh: u64, offset: u64, size: u32) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&fh.to_le_bytes());
    b.extend_from_slice(&offset.to_le_bytes());
    b.extend_from_slice(&size.to_le_bytes());
    b.extend_from_slice(&[0u8; 20]);
    b
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// A virtiofsd serving `shared` on `socket`, started for snapshots, and the device on it.
fn daemon_and_device(
    daemon: &super::super::virtiofsd::Daemon,
    socket: &Path,
    shared: &Path,
) -> (Child, Fs) {
    let child = daemon
        .command_for_snapshots(socket, shared, super::super::virtiofsd::Cache::Auto)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !socket.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    (child, Fs::connect(&fs_config(socket)).unwrap())
}

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn an_open_file_goes_on_through_a_fresh_virtiofsd_that_loaded_the_state() {
    let Some(daemon) = virtiofsd("virtiofsd_device_state") else {
        return;
    };
    if daemon.flavour != super::super::virtiofsd::Flavour::Rust {
        return crate::test_skip::skip("virtiofsd_device_state", "the C virtiofsd has no state");
    }
    let dir = Dir(std::env::temp_dir().join(format!("exitless-vfs-state-{}", std::process::id())));
    let shared = dir.0.join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::write(shared.join("kept"), b"written before the snapshot").unwrap();
    let (socket_a, socket_b) = (dir.0.join("a.sock"), dir.0.join("b.sock"));
    let (mut child_a, mut fs_a) = daemon_and_device(&daemon, &socket_a, &shared);
    let p = fs_a.frontend().protocol_features();
    assert!(fs_a.frontend().has_device_state(), "{p:?}");
    let mem = shared_memory();
    let (a, _calls) = activation(&mem, 2);
    let mut fuse = Fuse {
        mem: &mem,
        kick: a.queues[1].notify.clone(),
        posted: 0,
        unique: 0,
    };
    fs_a.activate(a).unwrap();
    fuse.must(26, 0, &fuse_init()[40..]); // INIT
    let node = u64_at(&fuse.must(1, 1, b"kept\0"), 0); // LOOKUP
    let fh = u64_at(&fuse.must(14, node, &[2, 0, 0, 0, 0, 0, 0, 0]), 0); // OPEN O_RDWR
                                                                         // The snapshot: queues stopped, state read, queues started again; A goes on serving.
    let state = fs_a.save_backend_state().unwrap();
    assert!(!state.is_empty());
    fs_a.unquiesce();
    assert_eq!(
        fuse.must(15, node, &io_in(fh, 0, 7)),
        b"written",
        "the first daemon serves again after the save"
    );
    fs_a.reset();
    drop(fs_a);
    let _ = child_a.kill();
    let _ = child_a.wait();
    // A fresh daemon, a fresh device and rings: the state loaded before the queues start.
    let (mut child_b, mut fs_b) = daemon_and_device(&daemon, &socket_b, &shared);
    fs_b.load_backend_state(&state).unwrap();
    let mem_b = shared_memory();
    let (b, _calls) = activation(&mem_b, 2);
    let mut fuse_b = Fuse {
        mem: &mem_b,
        kick: b.queues[1].notify.clone(),
        posted: 0,
        unique: 100,
    };
    fs_b.activate(b).unwrap();
    let read = fuse_b.must(15, node, &io_in(fh, 8, 6)); // READ through the old handle
    let mut write = io_in(fh, 0, 7);
    write.extend_from_slice(b"WRITTEN");
    let wrote = fuse_b.call(16, node, &write);
    fs_b.reset();
    drop(fs_b);
    let _ = child_b.kill();
    let _ = child_b.wait();
    daemon.clean_up(&socket_a);
    daemon.clean_up(&socket_b);
    assert_eq!(read, b"before");
    assert_eq!(wrote.0, 0, "WRITE through the old handle");
    assert_eq!(wrote.1.get(..4), Some(&7u32.to_le_bytes()[..]));
    assert_eq!(
        std::fs::read(shared.join("kept")).unwrap(),
        b"WRITTEN before the snapshot"
    );
    // Garbage is refused by the back end, named.
    let (mut child_c, mut fs_c) = daemon_and_device(&daemon, &socket_b, &shared);
    let e = fs_c.load_backend_state(b"not a state").unwrap_err();
    drop(fs_c);
    let _ = child_c.kill();
    let _ = child_c.wait();
    daemon.clean_up(&socket_b);
    assert!(e.contains("CHECK_DEVICE_STATE"), "{e}");
}
