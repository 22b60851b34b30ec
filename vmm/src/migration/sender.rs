//! The sending side: precopy and the stop rule, apart from the VM it reads ([`Source`]).
//!
//! Start; `local`: each memory region's fd (MemoryFd), no bytes; Config; then, not `local`:
//! the dirty log on, a first pass of the pages the guest touched, dirty passes until what the
//! last pass left fits `downtime_ms` at the rate measured (or `timeout_s` decides); the VM
//! paused, its state captured, the last pass, State, Complete (CompletePaused for a VM that
//! was paused). Any failure: Abandon to the destination (if the connection takes it), the
//! dirty log off, the VM resumed if this paused it.

use std::io::Write;
use std::os::fd::{BorrowedFd, RawFd};
use std::time::{Duration, Instant};

use super::protocol::{self, Command, MemoryRange, Request, Response, Status, HEADER_LEN};
use super::transport::Stream;
use super::MigrationError;

/// Most bytes of memory one Memory request carries.
const MAX_REQUEST_BYTES: u64 = 64 << 20;
/// Most ranges one Memory request carries.
const MAX_REQUEST_RANGES: usize = 4096;
/// Where a range cut between two Memory requests is cut, where it can be (a huge page).
const CUT_ALIGN: u64 = 2 << 20;

/// What the VM being sent offers the sender.
pub trait Source {
    /// The Config payload: the VM's config and its memory regions.
    fn config(&self) -> Result<protocol::MigrationConfig, MigrationError>;
    /// Each region's slot and the fd of its shared memory (`local`); refused when a region
    /// is not shared memory.
    fn memory_fds(&self) -> Result<Vec<(u32, RawFd)>, MigrationError>;
    /// Turns KVM's dirty log on for every slot.
    fn start_tracking(&mut self) -> Result<(), MigrationError>;
    /// Turns it off (also on failure).
    fn stop_tracking(&mut self);
    /// The pages the guest touched so far (sparse, as a snapshot's memory file).
    fn touched(&mut self) -> Result<Vec<MemoryRange>, MigrationError>;
    /// The pages written since the dirty log was last read.
    fn dirty(&mut self) -> Result<Vec<MemoryRange>, MigrationError>;
    /// Writes `len` bytes of guest memory at `gpa` to `to` (the connection), straight from
    /// the guest's pages.
    fn send(&self, gpa: u64, len: u64, to: BorrowedFd<'_>) -> Result<(), MigrationError>;
    /// Pauses the vCPUs (only called if they ran).
    fn pause(&mut self) -> Result<(), MigrationError>;
    fn resume(&mut self);
    /// The VM's state (`state.json`'s bytes), vCPUs paused; the devices hold still until
    /// [`Source::end_capture`].
    fn capture(&mut self) -> Result<Vec<u8>, MigrationError>;
    fn end_capture(&mut self);
    /// Lets go of the host files the destination opens (disk image locks), VM paused and
    /// captured, before State.
    fn release_files(&mut self) -> Result<(), MigrationError> {
        Ok(())
    }
    /// Takes them back (the migration failed after [`Source::release_files`]).
    fn retake_files(&mut self) {}
}

/// What to do when `timeout_s` passes before the dirty pages fit the downtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimeoutStrategy {
    /// Give up: the source goes on (Cloud Hypervisor's default).
    #[default]
    Cancel,
    /// Pause and finish anyway, with a longer downtime.
    Ignore,
}

/// `vm.send-migration`'s choices.
#[derive(Debug, Clone, Copy)]
pub struct SendOptions {
    pub local: bool,
    pub downtime: Duration,
    pub timeout: Duration,
    pub strategy: TimeoutStrategy,
    /// The VM was running (Complete resumes it on the destination).
    pub running: bool,
}

/// What a migration did.
#[derive(Debug, Clone, Copy, Default)]
pub struct SendSummary {
    pub total: Duration,
    /// From the pause to the destination's OK to Complete.
    pub downtime: Duration,
    pub memory_bytes: u64,
    /// Memory passes (the first and last included).
    pub passes: u32,
    pub last_pass_bytes: u64,
    /// Where the time went, step by step.
    pub steps: SendSteps,
}

/// The migration's steps, each as long as the source waited for it: the precopy passes,
/// then the downtime's (pause to the destination's OK to Complete).
#[derive(Debug, Clone, Copy, Default)]
pub struct SendSteps {
    /// Start, MemoryFds and Config (the destination makes guest memory and the VM on it).
    pub setup: Duration,
    /// Of `setup`: Start sent and answered (the destination takes the connection).
    pub start: Duration,
    /// Of `setup`: Config sent and answered (the destination makes guest memory and the VM).
    pub config: Duration,
    /// The first pass and the dirty passes, the VM running.
    pub precopy: Duration,
    /// Of `precopy`: the dirty logs switched on (KVM's, the devices', the back ends').
    pub tracking: Duration,
    /// Of `precopy`: the first pass's table (the pages the guest touched) built.
    pub first_table: Duration,
    /// The vCPUs paused.
    pub pause: Duration,
    /// The state captured (vCPUs, irqchip, clock, devices).
    pub capture: Duration,
    /// The last dirty log read and the last pass sent.
    pub last_pass: Duration,
    /// The disk locks let go of, State sent and answered (the destination puts the state
    /// back: vCPUs, devices).
    pub state: Duration,
    /// Complete sent and answered (the destination resumes the VM).
    pub complete: Duration,
}

/// After a completed migration the guest runs on the destination, which may share this
/// host's CPUs: what is left here (stopping the vCPU threads, freeing guest memory, the
/// process's end) runs on the calling thread at `SCHED_IDLE`, so that it never takes a CPU
/// from the guest's vCPUs. Returns whether the kernel took it (a failure changes only who
/// runs first). A raw system call: musl's `sched_setscheduler` does not set a thread's policy.
pub fn step_aside() -> bool {
    // The kernel's `struct sched_param` is one int, the priority (0 for SCHED_IDLE); libc's
    // has more fields under musl.
    let priority: libc::c_int = 0;
    // SAFETY: sched_setscheduler(2) on the calling thread (pid 0); the kernel reads one int
    // through the pointer, which outlives the call; it changes only this thread's scheduling.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_setscheduler,
            0,
            libc::SCHED_IDLE,
            &priority as *const libc::c_int,
        )
    };
    r == 0
}

/// Sends the VM `src` over `s`; on failure the VM runs on as before (see the module docs).
pub fn send(
    s: &mut Stream,
    src: &mut dyn Source,
    opts: SendOptions,
) -> Result<SendSummary, MigrationError> {
    let mut run = Run {
        start: Instant::now(),
        summary: SendSummary::default(),
        paused: false,
        capturing: false,
        tracking: false,
        released: false,
    };
    let sent = run.send(s, src, opts);
    if sent.is_err() {
        let _ = s.write_all(&Request::new(Command::Abandon, 0).encode());
    }
    if run.tracking {
        src.stop_tracking();
    }
    if sent.is_err() && run.released {
        src.retake_files();
    }
    if run.capturing {
        src.end_capture();
    }
    if sent.is_err() && run.paused {
        src.resume();
    }
    sent.map(|()| run.summary)
}

struct Run {
    start: Instant,
    summary: SendSummary,
    paused: bool,
    capturing: bool,
    tracking: bool,
    released: bool,
}

impl Run {
    fn send(
        &mut self,
        s: &mut Stream,
        src: &mut dyn Source,
        opts: SendOptions,
    ) -> Result<(), MigrationError> {
        let config = src.config()?.encode()?;
        let fds = match opts.local {
            true if !s.carries_fds() => {
                return Err(MigrationError::Unsupported(
                    "local migration needs a unix: destination_url (memory goes as fds)".into(),
                ))
            }
            true => src.memory_fds()?,
            false => Vec::new(),
        };
        request(s, Request::new(Command::Start, 0), &[], "Start")?;
        self.summary.steps.start = self.start.elapsed();
        for (slot, fd) in fds {
            s.write_all(&Request::new(Command::MemoryFd, 4).encode())
                .and_then(|()| s.send_with_fd(&slot.to_le_bytes(), fd))
                .map_err(|e| MigrationError::Io("sending a memory fd", e))?;
            answer(s, "MemoryFd")?;
        }
        request(
            s,
            Request::new(Command::Config, config.len() as u64),
            &config,
            "Config",
        )?;
        let mut step = Step(Instant::now());
        self.summary.steps.setup = step.0.duration_since(self.start);
        self.summary.steps.config = self.summary.steps.setup - self.summary.steps.start;
        let pending = match opts.local {
            true => Vec::new(),
            false => self.precopy(s, src, opts)?,
        };
        self.summary.steps.precopy = step.next();
        self.stop_and_finish(s, src, opts, pending, step)
    }

    /// The downtime: the pause, the state captured, the last pass (`pending` and what was
    /// written since), State and Complete.
    fn stop_and_finish(
        &mut self,
        s: &mut Stream,
        src: &mut dyn Source,
        opts: SendOptions,
        pending: Vec<MemoryRange>,
        mut step: Step,
    ) -> Result<(), MigrationError> {
        let paused_at = step.0;
        if opts.running {
            src.pause()?;
            self.paused = true;
        }
        self.summary.steps.pause = step.next();
        self.capturing = true;
        let state = src.capture()?;
        self.summary.steps.capture = step.next();
        // The last pass, State and Complete go without waiting for each answer in between
        // (the answers are read after): the destination handles requests in order and ends
        // the migration at the first it refuses, so it reads Complete, and resumes the VM,
        // only once every request before it succeeded; and it does so as soon as State is
        // put back, the Complete request already there (no round trip in the downtime).
        let mut unanswered = 0;
        if !opts.local {
            let mut last = pending;
            last.extend(src.dirty()?);
            self.summary.last_pass_bytes = last.iter().map(|r| r.length).sum();
            unanswered = self.write_memory(s, src, &last)?.1;
            self.summary.passes += 1;
        }
        self.summary.steps.last_pass = step.next();
        self.released = true;
        src.release_files()?;
        let complete = match opts.running {
            true => Command::Complete,
            false => Command::CompletePaused,
        };
        let mut requests = Vec::with_capacity(state.len() + 2 * HEADER_LEN);
        requests.extend_from_slice(&Request::new(Command::State, state.len() as u64).encode());
        requests.extend_from_slice(&state);
        requests.extend_from_slice(&Request::new(complete, 0).encode());
        s.write_all(&requests)
            .map_err(|e| MigrationError::Io("sending a request", e))?;
        for _ in 0..unanswered {
            answer(s, "Memory")?;
        }
        answer(s, "State")?;
        self.summary.steps.state = step.next();
        answer(s, "Complete")?;
        self.summary.steps.complete = step.next();
        self.summary.downtime = paused_at.elapsed();
        self.summary.total = self.start.elapsed();
        Ok(())
    }

    /// The first pass and dirty passes; returns the dirty ranges left for the last pass.
    fn precopy(
        &mut self,
        s: &mut Stream,
        src: &mut dyn Source,
        opts: SendOptions,
    ) -> Result<Vec<MemoryRange>, MigrationError> {
        let at = Instant::now();
        src.start_tracking()?;
        self.tracking = true;
        self.summary.steps.tracking = at.elapsed();
        let mut ranges = src.touched()?;
        self.summary.steps.first_table = at.elapsed() - self.summary.steps.tracking;
        let mut extra = 0;
        loop {
            let at = Instant::now();
            let bytes = self.send_memory(s, src, &ranges)?;
            self.summary.passes += 1;
            // Bytes per second, at least 1 MiB/s: an empty pass measures nothing.
            let rate = (bytes as f64 / at.elapsed().as_secs_f64().max(1e-6)).max(1e6);
            ranges = src.dirty()?;
            let left: u64 = ranges.iter().map(|r| r.length).sum();
            let pass = Pass {
                sent: bytes,
                left,
                rate,
            };
            match stop_rule(pass, opts.downtime, extra) {
                Stop::Now => return Ok(ranges),
                Stop::OneMore => extra += 1,
                Stop::NotYet => {}
            }
            if self.start.elapsed() >= opts.timeout {
                return match opts.strategy {
                    TimeoutStrategy::Cancel => Err(MigrationError::Timeout(opts.timeout.as_secs())),
                    TimeoutStrategy::Ignore => Ok(ranges),
                };
            }
        }
    }

    /// Sends `ranges` in Memory requests of bounded size; returns the bytes sent.
    fn send_memory(
        &mut self,
        s: &mut Stream,
        src: &dyn Source,
        ranges: &[MemoryRange],
    ) -> Result<u64, MigrationError> {
        let mut sent = 0;
        for batch in batches(ranges) {
            sent += self.write_batch(s, src, &batch)?;
            answer(s, "Memory")?;
        }
        Ok(sent)
    }

    /// Sends `ranges` as [`Run::send_memory`] does without reading the answers; returns the
    /// bytes sent and the requests whose answers are left to read.
    fn write_memory(
        &mut self,
        s: &mut Stream,
        src: &dyn Source,
        ranges: &[MemoryRange],
    ) -> Result<(u64, usize), MigrationError> {
        let batches = batches(ranges);
        let mut sent = 0;
        for batch in &batches {
            sent += self.write_batch(s, src, batch)?;
        }
        Ok((sent, batches.len()))
    }

    /// One Memory request: its table, then the ranges' bytes.
    fn write_batch(
        &mut self,
        s: &mut Stream,
        src: &dyn Source,
        batch: &[MemoryRange],
    ) -> Result<u64, MigrationError> {
        let table = protocol::encode_table(batch);
        s.write_all(&Request::new(Command::Memory, table.len() as u64).encode())
            .and_then(|()| s.write_all(&table))
            .map_err(|e| MigrationError::Io("sending a memory table", e))?;
        let mut sent = 0;
        for r in batch {
            src.send(r.gpa, r.length, s.fd())?;
            sent += r.length;
        }
        self.summary.memory_bytes += sent;
        Ok(sent)
    }
}

/// Past `downtime_ms`, the last pass is aimed at this: while a pass leaves more than this
/// to send and shrinks what is left, the VM runs on for one more (a pass of what the guest
/// wrote during the last one is shorter by the ratio of its write rate to the send rate).
const LAST_PASS_TARGET: Duration = Duration::from_millis(2);
/// Most passes run to bring the last pass from `downtime_ms` toward [`LAST_PASS_TARGET`].
const MAX_EXTRA_PASSES: u32 = 8;

/// A dirty pass just sent: its bytes, the bytes written meanwhile (left to send), the rate
/// it went at (bytes/s).
#[derive(Debug, Clone, Copy)]
struct Pass {
    sent: u64,
    left: u64,
    rate: f64,
}

#[derive(Debug, PartialEq, Eq)]
enum Stop {
    /// Pause and send the last pass.
    Now,
    /// What is left fits the downtime; one more pass to shrink it.
    OneMore,
    /// What is left does not fit the downtime yet.
    NotYet,
}

/// The stop rule: stop once what is left fits `downtime` at the rate measured, unless it is
/// still above [`LAST_PASS_TARGET`], the pass shrank it to at most half of what it sent
/// (the passes converge), and fewer than [`MAX_EXTRA_PASSES`] ran for it (`extra`).
fn stop_rule(p: Pass, downtime: Duration, extra: u32) -> Stop {
    let last = Duration::from_secs_f64(p.left as f64 / p.rate);
    if last > downtime {
        return Stop::NotYet;
    }
    let converging = p.left.saturating_mul(2) <= p.sent;
    match last > LAST_PASS_TARGET && converging && extra < MAX_EXTRA_PASSES {
        true => Stop::OneMore,
        false => Stop::Now,
    }
}

/// A stopwatch over consecutive steps.
struct Step(Instant);

impl Step {
    /// The time since the last step ended; the next starts now.
    fn next(&mut self) -> Duration {
        let now = Instant::now();
        let took = now.duration_since(self.0);
        self.0 = now;
        took
    }
}

/// `ranges` split into requests of at most [`MAX_REQUEST_RANGES`] ranges and about
/// [`MAX_REQUEST_BYTES`] (a range longer than that is cut).
fn batches(ranges: &[MemoryRange]) -> Vec<Vec<MemoryRange>> {
    let mut out = Vec::new();
    let mut cur: Vec<MemoryRange> = Vec::new();
    let mut bytes = 0;
    for r in ranges {
        let mut r = *r;
        while r.length > 0 {
            let room = MAX_REQUEST_BYTES - bytes;
            let take = match r.length.min(room) {
                // A cut range ends on a 2 MiB boundary where it can: the destination fills
                // whole 2 MiB chunks with huge pages (`memory::huge_fill`), not cut ones.
                take if take < r.length && (r.gpa + take) % CUT_ALIGN > 0 => {
                    let aligned = (r.gpa + take) / CUT_ALIGN * CUT_ALIGN;
                    match aligned > r.gpa {
                        true => aligned - r.gpa,
                        false => take,
                    }
                }
                take => take,
            };
            cur.push(MemoryRange {
                gpa: r.gpa,
                length: take,
            });
            bytes += take;
            r = MemoryRange {
                gpa: r.gpa + take,
                length: r.length - take,
            };
            // A range cut (by room, then alignment) ends its request.
            if r.length > 0 || bytes == MAX_REQUEST_BYTES || cur.len() == MAX_REQUEST_RANGES {
                out.push(std::mem::take(&mut cur));
                bytes = 0;
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Sends a request with its payload and waits for OK.
fn request(
    s: &mut Stream,
    req: Request,
    payload: &[u8],
    what: &'static str,
) -> Result<(), MigrationError> {
    s.write_all(&req.encode())
        .and_then(|()| s.write_all(payload))
        .map_err(|e| MigrationError::Io("sending a request", e))?;
    answer(s, what)
}

fn answer(s: &mut Stream, what: &'static str) -> Result<(), MigrationError> {
    let mut b = [0u8; HEADER_LEN];
    std::io::Read::read_exact(s, &mut b)
        .map_err(|e| MigrationError::Io("waiting for the destination's answer", e))?;
    match Response::decode(&b)?.status {
        Status::Ok => Ok(()),
        Status::Error => Err(MigrationError::Refused(what)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The thread that steps aside runs at SCHED_IDLE afterwards, and only that thread.
    #[test]
    fn stepping_aside_idles_the_calling_thread_only() {
        let policy = || {
            // SAFETY: sched_getscheduler(2) on the calling thread reads its policy.
            unsafe { libc::syscall(libc::SYS_sched_getscheduler, 0) as i32 }
        };
        let other = std::thread::spawn(move || {
            assert!(step_aside(), "{}", std::io::Error::last_os_error());
            policy()
        });
        assert_eq!(other.join().unwrap(), libc::SCHED_IDLE);
        assert_ne!(policy(), libc::SCHED_IDLE);
    }

    #[test]
    fn the_stop_rule_runs_passes_that_shrink_the_last_one_toward_its_target() {
        let down = Duration::from_millis(300);
        let mib = 1 << 20;
        // 500 MB/s: 16 MiB left fits 300 ms but is ~34 ms of pause; the pass sent 128 MiB.
        let pass = |sent: u64, left: u64| Pass {
            sent,
            left,
            rate: 500e6,
        };
        assert_eq!(stop_rule(pass(128 * mib, 16 * mib), down, 0), Stop::OneMore);
        // Small enough: stop.
        assert_eq!(stop_rule(pass(16 * mib, 512 << 10), down, 1), Stop::Now);
        // Not shrinking (the guest writes as fast as the passes go): stop at the downtime.
        assert_eq!(stop_rule(pass(16 * mib, 12 * mib), down, 1), Stop::Now);
        // Extra passes bounded.
        assert_eq!(
            stop_rule(pass(128 * mib, 16 * mib), down, MAX_EXTRA_PASSES),
            Stop::Now
        );
        // Beyond the downtime: not yet, whatever else.
        assert_eq!(stop_rule(pass(512 * mib, 400 * mib), down, 0), Stop::NotYet);
        assert_eq!(
            stop_rule(pass(8192, 4096), Duration::ZERO, 0),
            Stop::NotYet,
            "a zero downtime waits for nothing left"
        );
        assert_eq!(stop_rule(pass(8192, 0), Duration::ZERO, 0), Stop::Now);
    }

    #[test]
    fn batches_bound_bytes_and_ranges_and_cut_long_ranges() {
        let big = MemoryRange {
            gpa: 0,
            length: MAX_REQUEST_BYTES + 4096,
        };
        let b = batches(&[big]);
        assert_eq!(b.len(), 2);
        assert_eq!(b[0][0].length, MAX_REQUEST_BYTES);
        assert_eq!(
            b[1][0],
            MemoryRange {
                gpa: MAX_REQUEST_BYTES,
                length: 4096
            }
        );
        // After a page, a long range is cut on a 2 MiB boundary (the page is 4 KiB short).
        let page = MemoryRange {
            gpa: 0,
            length: 4096,
        };
        let from = MemoryRange {
            gpa: CUT_ALIGN,
            length: MAX_REQUEST_BYTES,
        };
        let b = batches(&[page, from]);
        assert_eq!(b[0][1].length, MAX_REQUEST_BYTES - CUT_ALIGN);
        assert_eq!(b[1][0].gpa, MAX_REQUEST_BYTES);
        assert_eq!(b[1][0].length, CUT_ALIGN);
        let pages: Vec<_> = (0..MAX_REQUEST_RANGES as u64 + 1)
            .map(|i| MemoryRange {
                gpa: i * 8192,
                length: 4096,
            })
            .collect();
        let b = batches(&pages);
        assert_eq!(
            b.iter().map(Vec::len).collect::<Vec<_>>(),
            [MAX_REQUEST_RANGES, 1]
        );
    }
}
