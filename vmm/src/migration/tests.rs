//! The sender and the receiver against each other over a Unix socket pair, with a fake VM on
//! each side: precopy carries every page the guest wrote, through dirty passes, into the
//! destination; a destination that fails leaves the source resumed.

use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::protocol::{MemoryRange, MigrationConfig, RegionLayout};
use super::receiver::{self, Destination};
use super::sender::{self, SendOptions, Source, TimeoutStrategy};
use super::transport::Stream;
use super::MigrationError;

const SIZE: usize = 64 << 10;

/// A guest of SIZE bytes at gpa 0 that, while not paused, writes `writes[n]` (gpa, byte)
/// before the n-th read of its dirty log (as if during the pass before it).
struct FakeSource {
    mem: Vec<u8>,
    writes: Vec<Vec<(usize, u8)>>,
    dirty: Vec<MemoryRange>,
    log: Arc<Mutex<Vec<String>>>,
    paused: bool,
}

impl FakeSource {
    fn write(&mut self, at: usize, v: u8) {
        self.mem[at] = v;
        let gpa = (at as u64) & !4095;
        self.dirty.push(MemoryRange { gpa, length: 4096 });
    }

    fn note(&self, what: &str) {
        self.log.lock().unwrap().push(what.into());
    }
}

impl Source for FakeSource {
    fn config(&self) -> Result<MigrationConfig, MigrationError> {
        Ok(MigrationConfig {
            config: serde_json::json!({"fake": true}),
            regions: vec![RegionLayout {
                slot: 0,
                gpa: 0,
                size: SIZE as u64,
                fd_offset: 0,
            }],
            vcpus: None,
        })
    }
    fn memory_fds(&self) -> Result<Vec<(u32, RawFd)>, MigrationError> {
        Ok(Vec::new())
    }
    fn start_tracking(&mut self) -> Result<(), MigrationError> {
        self.note("track");
        Ok(())
    }
    fn stop_tracking(&mut self) {
        self.note("untrack");
    }
    fn touched(&mut self) -> Result<Vec<MemoryRange>, MigrationError> {
        Ok(vec![MemoryRange {
            gpa: 0,
            length: 8192,
        }])
    }
    fn dirty(&mut self) -> Result<Vec<MemoryRange>, MigrationError> {
        if !self.paused && !self.writes.is_empty() {
            for (at, v) in self.writes.remove(0) {
                self.write(at, v);
            }
        }
        Ok(std::mem::take(&mut self.dirty))
    }
    fn send(&self, gpa: u64, len: u64, to: BorrowedFd<'_>) -> Result<(), MigrationError> {
        use std::io::Write;
        let mut f = std::fs::File::from(to.try_clone_to_owned().unwrap());
        f.write_all(&self.mem[gpa as usize..(gpa + len) as usize])
            .map_err(|e| MigrationError::Io("sending", e))
    }
    fn pause(&mut self) -> Result<(), MigrationError> {
        self.note("pause");
        self.paused = true;
        Ok(())
    }
    fn resume(&mut self) {
        self.note("resume");
        self.paused = false;
    }
    fn capture(&mut self) -> Result<Vec<u8>, MigrationError> {
        Ok(b"state".to_vec())
    }
    fn end_capture(&mut self) {}
    fn release_files(&mut self) -> Result<(), MigrationError> {
        self.note("release");
        Ok(())
    }
    fn retake_files(&mut self) {
        self.note("retake");
    }
}

#[derive(Default)]
struct FakeDestination {
    mem: Vec<u8>,
    state: Vec<u8>,
    fail_state: bool,
    resumed: Option<bool>,
}

impl Destination for FakeDestination {
    fn configure(
        &mut self,
        c: MigrationConfig,
        _: Vec<(u32, OwnedFd)>,
    ) -> Result<(), MigrationError> {
        self.mem = vec![0; c.regions[0].size as usize];
        Ok(())
    }
    fn regions(&self) -> Vec<(u64, u64)> {
        vec![(0, self.mem.len() as u64)]
    }
    fn write(&mut self, _: usize, offset: u64, bytes: &[u8]) -> Result<(), MigrationError> {
        self.mem[offset as usize..offset as usize + bytes.len()].copy_from_slice(bytes);
        Ok(())
    }
    fn state(&mut self, s: &[u8]) -> Result<(), MigrationError> {
        if self.fail_state {
            return Err(MigrationError::Destination("no".into()));
        }
        self.state = s.to_vec();
        Ok(())
    }
    fn complete(&mut self, resume: bool) -> Result<(), MigrationError> {
        self.resumed = Some(resume);
        Ok(())
    }
}

fn opts() -> SendOptions {
    SendOptions {
        local: false,
        downtime: Duration::ZERO,
        timeout: Duration::from_secs(60),
        strategy: TimeoutStrategy::Cancel,
        running: true,
    }
}

fn migrate(src: FakeSource, dest: FakeDestination) -> Migrated {
    migrate_with(src, dest, opts())
}

type Migrated = (
    Result<sender::SendSummary, MigrationError>,
    FakeSource,
    Result<receiver::Received, MigrationError>,
    FakeDestination,
);

fn migrate_with(mut src: FakeSource, mut dest: FakeDestination, opts: SendOptions) -> Migrated {
    let (a, b) = UnixStream::pair().unwrap();
    let receiving = std::thread::spawn(move || {
        let r = receiver::receive(&mut Stream::Unix(b), &mut dest);
        (r, dest)
    });
    let sent = sender::send(&mut Stream::Unix(a), &mut src, opts);
    let (received, dest) = receiving.join().unwrap();
    (sent, src, received, dest)
}

fn source(writes: Vec<Vec<(usize, u8)>>) -> FakeSource {
    let mut mem = vec![0u8; SIZE];
    mem[..8192].fill(0xaa);
    FakeSource {
        mem,
        writes,
        dirty: Vec::new(),
        log: Arc::default(),
        paused: false,
    }
}

#[test]
fn precopy_carries_every_page_written_during_the_passes() {
    // Pass 1 dirties two pages, pass 2 one more (written twice), then nothing.
    let writes = vec![
        vec![(0x3000, 1), (0x9005, 2)],
        vec![(0x3000, 3), (0xf000, 4)],
    ];
    let (sent, src, received, dest) = migrate(source(writes), FakeDestination::default());
    let sent = sent.unwrap();
    let received = received.unwrap();
    assert!(dest.mem == src.mem, "the destination's memory differs");
    assert_eq!(dest.mem[0xf000], 4);
    assert_eq!(dest.state, b"state");
    assert_eq!(dest.resumed, Some(true));
    assert!(received.resumed);
    assert_eq!(received.memory_bytes, sent.memory_bytes);
    // The first pass, two dirty passes, an empty one that fits the downtime, the last.
    assert_eq!(sent.passes, 4, "{sent:?}");
    let log = src.log.lock().unwrap().clone();
    assert_eq!(log, ["track", "pause", "release", "untrack"]);
}

#[test]
fn a_destination_that_fails_leaves_the_source_resumed() {
    let dest = FakeDestination {
        fail_state: true,
        ..Default::default()
    };
    let (sent, src, received, _) = migrate(source(Vec::new()), dest);
    assert!(
        matches!(sent, Err(MigrationError::Refused("State"))),
        "{sent:?}"
    );
    assert!(matches!(received, Err(MigrationError::Destination(_))));
    let log = src.log.lock().unwrap().clone();
    // The disk locks let go of before State are taken back before the VM resumes.
    assert_eq!(
        log,
        ["track", "pause", "release", "untrack", "retake", "resume"]
    );
}

#[test]
fn a_paused_vm_completes_paused_without_a_pause_of_its_own() {
    let o = SendOptions {
        running: false,
        ..opts()
    };
    let (sent, src, received, dest) =
        migrate_with(source(Vec::new()), FakeDestination::default(), o);
    sent.unwrap();
    assert!(!received.unwrap().resumed);
    assert_eq!(dest.resumed, Some(false));
    assert_eq!(*src.log.lock().unwrap(), ["track", "release", "untrack"]);
}

#[test]
fn a_timeout_with_cancel_abandons_and_the_source_goes_on_unpaused() {
    // The guest writes a page before every read of its log: never nothing left.
    let writes = (0..100).map(|i| vec![(0x4000 + i * 8, 1)]).collect();
    let o = SendOptions {
        timeout: Duration::ZERO,
        ..opts()
    };
    let (sent, src, received, _) = migrate_with(source(writes), FakeDestination::default(), o);
    assert!(matches!(sent, Err(MigrationError::Timeout(0))), "{sent:?}");
    assert!(
        matches!(received, Err(MigrationError::Abandoned)),
        "{received:?}"
    );
    assert_eq!(*src.log.lock().unwrap(), ["track", "untrack"]);
}
