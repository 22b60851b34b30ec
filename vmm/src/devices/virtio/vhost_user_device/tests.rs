//! The device against a fake back end on a socketpair (its configuration space read with
//! GET_CONFIG, refusals) and against the real qemu-storage-daemon (vhost-user-blk, and the same
//! back end as a generic device).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::thread::JoinHandle;
use std::time::Duration;

use vhost::vhost_user::message::{FrontendReq, VhostUserProtocolFeatures};

use super::storage_daemon::{self, StorageDaemon};
use super::*;

const PROTOCOL_BIT: u64 = 1 << 30;

/// A back end offering `protocol` that answers GET_CONFIG for sizes up to `config_len` (with
/// bytes 0, 1, 2, ...) and refuses larger ones with an empty reply, as libvhost-user does.
fn fake(protocol: VhostUserProtocolFeatures, config_len: u32) -> (UnixStream, JoinHandle<()>) {
    let (ours, mut theirs) = UnixStream::pair().unwrap();
    let t = std::thread::spawn(move || loop {
        let mut header = [0u8; 12];
        if theirs.read_exact(&mut header).is_err() {
            return;
        }
        let word = |b: &[u8], at: usize| u32::from_ne_bytes(b[at..at + 4].try_into().unwrap());
        let (code, flags) = (word(&header, 0), word(&header, 4));
        let mut body = vec![0u8; word(&header, 8) as usize];
        theirs.read_exact(&mut body).unwrap();
        let value = |v: u64| v.to_ne_bytes().to_vec();
        let answer = match FrontendReq::try_from(code).unwrap() {
            FrontendReq::GET_FEATURES => Some(value(VIRTIO_F_VERSION_1 | PROTOCOL_BIT | 0x206)),
            FrontendReq::GET_PROTOCOL_FEATURES => Some(value(protocol.bits())),
            FrontendReq::GET_QUEUE_NUM => Some(value(1)),
            FrontendReq::GET_CONFIG if word(&body, 4) <= config_len => {
                let mut reply = body[..12].to_vec();
                reply.extend((0..word(&body, 4)).map(|i| i as u8));
                Some(reply)
            }
            FrontendReq::GET_CONFIG => Some(Vec::new()),
            _ if flags & 0x8 != 0 => Some(value(0)),
            _ => None,
        };
        if let Some(b) = answer {
            let mut m = code.to_ne_bytes().to_vec();
            m.extend_from_slice(&5u32.to_ne_bytes());
            m.extend_from_slice(&(b.len() as u32).to_ne_bytes());
            m.extend_from_slice(&b);
            theirs.write_all(&m).unwrap();
        }
    });
    (ours, t)
}

fn connect(
    protocol: VhostUserProtocolFeatures,
    config_len: u32,
    kind: Kind,
) -> Result<VhostUserDevice, VhostUserError> {
    let (sock, _t) = fake(protocol, config_len);
    let wanted = WANTED_PROTOCOL_FEATURES | VhostUserProtocolFeatures::CONFIG;
    let timeout = Duration::from_secs(2);
    let f = Frontend::handshake_wanting(sock, Path::new("fake"), 1, timeout, wanted)?;
    VhostUserDevice::new(f, kind)
}

fn all() -> VhostUserProtocolFeatures {
    WANTED_PROTOCOL_FEATURES | VhostUserProtocolFeatures::CONFIG
}

#[test]
fn a_block_device_reads_its_configuration_and_passes_on_block_features_only() {
    let dev = connect(all(), 60, Kind::Block).unwrap();
    assert_eq!(dev.device_type(), TYPE_BLOCK);
    assert_eq!(dev.queue_max_sizes(), [BLK_QUEUE_SIZE]);
    // Offered 0x206: SIZE_MAX, SEG_MAX and FLUSH, all passed on.
    assert_eq!(dev.features(), VIRTIO_F_VERSION_1 | 0x206);
    let mut capacity = [0u8; 8];
    dev.read_config(0, &mut capacity);
    assert_eq!(capacity, [0, 1, 2, 3, 4, 5, 6, 7]);
    let mut last = [0u8; 4];
    dev.read_config(56, &mut last);
    assert_eq!(last, [56, 57, 58, 59]);
    // Past what was read (in part or whole): zeros, never a panic.
    let mut past = [0xffu8; 8];
    dev.read_config(56, &mut past);
    assert_eq!(past, [0; 8]);
    dev.read_config(u64::MAX - 2, &mut past);
    assert_eq!(past, [0; 8]);
    // The driver's writes are the guest's to make, not the back end's to see: counted.
    let mut dev = dev;
    dev.write_config(0, &[0xff; 8]);
    dev.write_config(u64::MAX, &[1]);
    let counted: std::collections::BTreeMap<_, _> = dev.device_counters().into_iter().collect();
    assert_eq!(counted["config_writes_ignored"], 2);
    let mut capacity = [0u8; 8];
    dev.read_config(0, &mut capacity);
    assert_eq!(capacity, [0, 1, 2, 3, 4, 5, 6, 7]);
}

#[test]
fn a_block_back_end_without_config_or_a_short_one_is_refused_by_name() {
    let no_config = connect(WANTED_PROTOCOL_FEATURES, 60, Kind::Block)
        .err()
        .unwrap();
    assert!(
        no_config.to_string().contains("does not offer CONFIG"),
        "{no_config}"
    );
    let short = connect(all(), 32, Kind::Block).err().unwrap();
    assert!(
        short.to_string().contains("GET_CONFIG of 60 bytes"),
        "{short}"
    );
}

#[test]
fn a_generic_device_takes_the_largest_configuration_its_back_end_has() {
    let kind = Kind::Generic {
        device_type: 42,
        queue_sizes: vec![64],
    };
    let dev = connect(all(), 100, kind.clone()).unwrap();
    assert_eq!((dev.device_type(), dev.config_space().len()), (42, 64));
    // All device feature bits pass, the ring's too.
    assert_eq!(dev.features(), VIRTIO_F_VERSION_1 | 0x206);
    let none = connect(WANTED_PROTOCOL_FEATURES, 0, kind).unwrap();
    assert!(none.config_space().is_empty());
}

#[test]
fn qemu_storage_daemon_serves_a_block_device_and_a_generic_one() {
    let Some(daemon) = storage_daemon::find() else {
        eprintln!("SKIPPED: qemu_storage_daemon: qemu-storage-daemon is not installed");
        return;
    };
    let dir = std::env::temp_dir().join(format!("exitless-vublk-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let image = dir.join("disk.img");
    std::fs::write(&image, vec![0u8; 8 << 20]).unwrap();
    let socket = dir.join("blk.sock");
    for kind in [
        Kind::Block,
        Kind::Generic {
            device_type: TYPE_BLOCK,
            queue_sizes: vec![128],
        },
    ] {
        let _d = StorageDaemon::start(&daemon, &image, &socket, true).unwrap();
        let dev = VhostUserDevice::connect(&socket, kind.clone()).unwrap();
        let mut capacity = [0u8; 8];
        dev.read_config(0, &mut capacity);
        assert_eq!(u64::from_le_bytes(capacity), (8 << 20) / 512, "{kind:?}");
        assert_ne!(dev.features() & VIRTIO_F_VERSION_1, 0);
        assert_ne!(
            dev.features() & (1 << 9),
            0,
            "FLUSH offered: {:#x}",
            dev.features()
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}
