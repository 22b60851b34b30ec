//! COM1: a 16550 UART (vm-superio) on the I/O bus.
//!
//! The guest's output is teed by [`SerialOutput`] to a sink (usually stdout, any `Write`: the
//! bench's is an in-memory line capture) and an optional log file.
//! Output the console or log cannot take is dropped and counted, never fatal. The
//! interrupt is an [`EventFd`] that the VMM registers as irqfd for [`COM1_IRQ`].

use super::partial_line_watch::PartialLineWatch;
use super::GuestFaults;
use crate::startup;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use std::cell::Cell;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use thiserror::Error;
use vm_superio::serial::{Error as UartError, NoEvents, SerialState};
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use crate::snapshot::{from_state, to_state, Snapshottable};

use crate::bus::{DeviceEvent, MutBusDevice};

/// First I/O port of COM1.
pub const COM1_BASE: u64 = 0x3f8;
/// Number of I/O ports of a 16550.
pub const COM1_LEN: u64 = 8;
/// Legacy IRQ line of COM1.
pub const COM1_IRQ: u32 = 4;

/// Pending output is written out at the latest when it reaches this size.
const PENDING_MAX: usize = 4096;

/// Errors setting up the serial output.
#[derive(Debug, Error)]
pub enum SerialError {
    #[error("Cannot open serial log {}: {source}", path.display())]
    OpenLog {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// When [`SerialOutput`] passes pending output on to its sink and log file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlushPolicy {
    /// On every flush from the UART, i.e. every byte: right for an interactive console.
    #[default]
    EveryWrite,
    /// At each newline (or when 4 KiB are pending, or on drop): fewer host writes.
    Newline,
}

/// Guest output that exitless could not pass on (a closed pipe, a full non-blocking pipe, a
/// gone terminal, a full disk): dropped and counted, never a reason to stop the VM.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct OutputLoss {
    /// Bytes the console (stdout) did not take.
    pub console_bytes: u64,
    /// Bytes the `--serial-log` file did not take.
    pub log_bytes: u64,
}

/// One destination of the output, with what it lost.
struct Destination {
    what: String,
    writer: Box<dyn Write + Send>,
    lost: u64,
}

impl Destination {
    fn new(what: String, writer: Box<dyn Write + Send>) -> Self {
        Self {
            what,
            writer,
            lost: 0,
        }
    }

    /// Writes `bytes`; what does not get through is counted (and said once on stderr).
    fn put(&mut self, bytes: &[u8]) {
        let (unwritten, error) = match write_fully(&mut *self.writer, bytes) {
            Ok(()) => return,
            Err(failure) => failure,
        };
        if self.lost == 0 {
            eprintln!(
                "exitless: {} output lost ({error}); the VM runs on, further lost output is \
                 only counted",
                self.what
            );
        }
        // A failed flush may not say how much was lost: count at least one byte.
        self.lost += unwritten.max(1) as u64;
    }
}

/// Writes all of `bytes` and flushes, retrying on EINTR. On failure: how many bytes did not
/// get through, and why.
fn write_fully(w: &mut dyn Write, mut bytes: &[u8]) -> Result<(), (usize, io::Error)> {
    while !bytes.is_empty() {
        match w.write(bytes) {
            Ok(0) => return Err((bytes.len(), io::ErrorKind::WriteZero.into())),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err((bytes.len(), e)),
        }
    }
    w.flush().map_err(|e| (0, e))
}

/// The VMM's stdout without Rust's buffer in between, so a failed write says how much it lost.
fn unbuffered_stdout() -> Box<dyn Write + Send> {
    match io::stdout().as_fd().try_clone_to_owned() {
        Ok(fd) => Box::new(File::from(fd)),
        Err(_) => Box::new(io::stdout()),
    }
}

/// Where the guest's serial output goes: a sink and an optional log file.
///
/// Bytes reach the sink and log file as [`FlushPolicy`] says; pending
/// bytes are written out on drop. Output a destination does not take is dropped and counted
/// ([`SerialOutput::loss`]), and said once on stderr: the guest never notices, and the VM
/// never stops for it (`exitless run ... | head` must not kill a guest mid-write).
pub struct SerialOutput {
    sink: Destination,
    log: Option<Destination>,
    policy: FlushPolicy,
    pending: Vec<u8>,
    /// `pending` holds a newline (known from the writes, so no byte is scanned twice).
    pending_newline: bool,
    /// Told when output waits for its newline (a timer then flushes it).
    partial_watch: Option<PartialLineWatch>,
}

impl SerialOutput {
    /// Output to `sink` only.
    pub fn new(sink: Box<dyn Write + Send>) -> Self {
        Self {
            sink: Destination::new("console".into(), sink),
            log: None,
            policy: FlushPolicy::default(),
            // Its whole size now, on the thread that builds the VM: the guest's bytes arrive on
            // a vCPU thread, which then never allocates (nor waits for the heap's lock while
            // the launching thread hands start-up's memory back).
            pending: Vec::with_capacity(PENDING_MAX),
            pending_newline: false,
            partial_watch: None,
        }
    }

    /// Output to the VMM's stdout.
    pub fn stdout() -> Self {
        Self::new(unbuffered_stdout())
    }

    /// Output discarded (a log file may still be added).
    pub fn discard() -> Self {
        Self::new(Box::new(io::sink()))
    }

    /// Also writes everything to `path` (created or truncated).
    pub fn with_log_file(mut self, path: &Path) -> Result<Self, SerialError> {
        let file = File::create(path).map_err(|source| SerialError::OpenLog {
            path: path.to_path_buf(),
            source,
        })?;
        let what = format!("serial log {}", path.display());
        self.log = Some(Destination::new(what, Box::new(file)));
        Ok(self)
    }

    /// Sets when the sink and log file are written.
    pub fn with_flush_policy(mut self, policy: FlushPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Whether output may wait for its newline (then a timer should flush partial lines).
    pub fn holds_partial_lines(&self) -> bool {
        self.policy == FlushPolicy::Newline
    }

    /// Tells `watch` whenever output starts waiting for its newline; it is told now if output
    /// waits already, so that it is flushed too.
    pub fn set_partial_watch(&mut self, watch: PartialLineWatch) {
        if !self.pending.is_empty() {
            watch.tell();
        }
        self.partial_watch = Some(watch);
    }

    /// What the console and the log file could not take so far.
    pub fn loss(&self) -> OutputLoss {
        OutputLoss {
            console_bytes: self.sink.lost,
            log_bytes: self.log.as_ref().map_or(0, |l| l.lost),
        }
    }

    /// Writes all pending bytes to the log file, then the sink.
    pub fn flush_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        if let Some(log) = self.log.as_mut() {
            log.put(&self.pending);
        }
        self.sink.put(&self.pending);
        if startup::enabled() && self.pending_newline {
            startup::mark(startup::moment::FIRST_LINE);
        }
        self.pending.clear();
        self.pending_newline = false;
    }
}

impl Write for SerialOutput {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.pending.extend_from_slice(buf);
        self.pending_newline |= buf.contains(&b'\n');
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let due = match self.policy {
            FlushPolicy::EveryWrite => true,
            FlushPolicy::Newline => self.pending.len() >= PENDING_MAX || self.pending_newline,
        };
        if due {
            self.flush_pending();
        } else if let (false, Some(watch)) = (self.pending.is_empty(), &self.partial_watch) {
            watch.tell();
        }
        Ok(())
    }
}

impl Drop for SerialOutput {
    fn drop(&mut self) {
        self.flush_pending();
    }
}

/// The interrupt line: each trigger adds 1 to the eventfd (an irqfd in KVM). Muted while a
/// restore rebuilds the UART: the interrupt it would raise for its restored registers was
/// raised before the snapshot, and the restored irqchip holds it.
#[derive(Debug)]
pub struct IrqTrigger {
    evt: EventFd,
    muted: Cell<bool>,
}

impl IrqTrigger {
    fn new(evt: EventFd) -> Self {
        IrqTrigger {
            evt,
            muted: Cell::new(false),
        }
    }
}

impl Trigger for IrqTrigger {
    type E = io::Error;

    fn trigger(&self) -> io::Result<()> {
        if self.muted.get() {
            return Ok(());
        }
        self.evt.write(1)
    }
}

fn uart_error(e: UartError<io::Error>) -> io::Error {
    match e {
        UartError::Trigger(e) | UartError::IOError(e) => e,
        UartError::FullFifo => io::Error::other("Serial input FIFO full"),
    }
}

/// The COM1 device: a [`MutBusDevice`] of [`COM1_LEN`] ports.
pub struct SerialDevice {
    uart: Serial<IrqTrigger, NoEvents, SerialOutput>,
    faults: GuestFaults,
}

impl SerialDevice {
    /// A UART raising `irq` and writing to `out`.
    pub fn new(irq: EventFd, out: SerialOutput) -> Self {
        Self {
            uart: Serial::new(IrqTrigger::new(irq), out),
            faults: GuestFaults::new("serial"),
        }
    }

    /// The interrupt eventfd, to be registered as irqfd for [`COM1_IRQ`].
    pub fn interrupt_evt(&self) -> &EventFd {
        &self.uart.interrupt_evt().evt
    }

    /// Queues host input for the guest; returns how many bytes fit in the receive FIFO (0 when
    /// it is full: the caller keeps the rest and retries once the guest has read).
    /// An error means the interrupt could not be raised (the accepted bytes stay queued).
    pub fn enqueue_input(&mut self, bytes: &[u8]) -> io::Result<usize> {
        if bytes.is_empty() || self.uart.fifo_capacity() == 0 {
            return Ok(0);
        }
        self.uart.enqueue_raw_bytes(bytes).map_err(uart_error)
    }

    /// Free space in the receive FIFO, in bytes.
    pub fn fifo_capacity(&self) -> usize {
        self.uart.fifo_capacity()
    }

    /// Number of guest accesses that were invalid (bad offset or width).
    pub fn faults(&self) -> u64 {
        self.faults.count()
    }

    /// The output (e.g. to see what it lost).
    pub fn output(&self) -> &SerialOutput {
        self.uart.writer()
    }

    /// The output, to change where it goes.
    pub fn output_mut(&mut self) -> &mut SerialOutput {
        self.uart.writer_mut()
    }

    /// Writes out any output held back by [`FlushPolicy::Newline`].
    pub fn flush_output(&mut self) {
        self.uart.writer_mut().flush_pending();
    }

    /// Checks a guest access: the register index, or None for a counted fault.
    fn check(&mut self, op: &str, offset: u64, len: usize) -> Option<u8> {
        self.faults.check_byte_access(op, offset, len, COM1_LEN)
    }

    /// The UART's registers and receive FIFO (pending output is written out first).
    pub fn state(&mut self) -> UartState {
        self.flush_output();
        UartState::from(self.uart.state())
    }

    /// Sets the UART's registers and receive FIFO, keeping its output and interrupt line;
    /// raises no interrupt (see [`IrqTrigger`]).
    pub fn set_state(&mut self, state: &UartState) -> Result<(), String> {
        if state.in_buffer.len() > UART_FIFO {
            return Err(format!(
                "a receive FIFO of {} bytes (a 16550 holds {UART_FIFO})",
                state.in_buffer.len()
            ));
        }
        let evt = self
            .interrupt_evt()
            .try_clone()
            .map_err(|e| e.to_string())?;
        let trigger = IrqTrigger::new(evt);
        trigger.muted.set(true);
        let out = std::mem::replace(self.uart.writer_mut(), SerialOutput::discard());
        let uart = Serial::from_state(&SerialState::from(state), trigger, NoEvents, out)
            .map_err(|e| format!("{e:?}"))?;
        self.uart = uart;
        self.uart.interrupt_evt().muted.set(false);
        Ok(())
    }
}

/// Bytes a 16550's receive FIFO holds.
const UART_FIFO: usize = 64;

/// A 16550's registers and receive FIFO, as a snapshot saves them (vm-superio's
/// `SerialState`, named here so the file's format is exitless's own).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UartState {
    pub baud_divisor_low: u8,
    pub baud_divisor_high: u8,
    pub interrupt_enable: u8,
    pub interrupt_identification: u8,
    pub line_control: u8,
    pub line_status: u8,
    pub modem_control: u8,
    pub modem_status: u8,
    pub scratch: u8,
    pub in_buffer: Vec<u8>,
}

impl From<SerialState> for UartState {
    fn from(s: SerialState) -> Self {
        UartState {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer,
        }
    }
}

impl From<&UartState> for SerialState {
    fn from(s: &UartState) -> Self {
        SerialState {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer.clone(),
        }
    }
}

fn lock(m: &Mutex<SerialDevice>) -> std::sync::MutexGuard<'_, SerialDevice> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Snapshottable for Mutex<SerialDevice> {
    fn kind(&self) -> &'static str {
        "serial"
    }

    fn snapshot(&self) -> Result<serde_json::Value, String> {
        to_state(&lock(self).state())
    }

    fn restore(&self, state: serde_json::Value) -> Result<(), String> {
        lock(self).set_state(&from_state(state)?)
    }
}

impl MutBusDevice for SerialDevice {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        match self.check("read", offset, data.len()) {
            Some(reg) => data[0] = self.uart.read(reg),
            None => data.fill(0xff),
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<DeviceEvent> {
        if let Some(reg) = self.check("write", offset, data.len()) {
            self.uart.write(reg, data[0]).map_err(uart_error)?;
        }
        Ok(DeviceEvent::None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    const THR: u64 = 0;
    const IER: u64 = 1;
    const LSR: u64 = 5;

    /// A sink shared with the test.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Takes `room` bytes, then fails like a closed pipe (or a full non-blocking one).
    struct Closing {
        room: usize,
        kind: io::ErrorKind,
    }

    impl Write for Closing {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.room == 0 {
                return Err(self.kind.into());
            }
            let n = buf.len().min(self.room);
            self.room -= n;
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn evt() -> EventFd {
        EventFd::new(libc::EFD_NONBLOCK).unwrap()
    }

    fn device(policy: FlushPolicy) -> (SerialDevice, Shared) {
        let sink = Shared::default();
        let out = SerialOutput::new(Box::new(sink.clone())).with_flush_policy(policy);
        (SerialDevice::new(evt(), out), sink)
    }

    fn put(dev: &mut SerialDevice, s: &[u8]) {
        for &b in s {
            assert_eq!(dev.write(THR, &[b]).unwrap(), DeviceEvent::None);
        }
    }

    #[test]
    fn thr_writes_reach_the_sink_at_once() {
        let (mut dev, sink) = device(FlushPolicy::EveryWrite);
        put(&mut dev, b"hello\r\nresult: 42\npart");
        assert_eq!(&*sink.0.lock().unwrap(), b"hello\r\nresult: 42\npart");
        assert_eq!(dev.faults(), 0);
    }

    /// The guest's bytes arrive on a vCPU thread, which must not allocate: the buffer is
    /// whole from the start and keeps its place through any amount of output.
    #[test]
    fn output_never_reallocates_its_buffer() {
        for policy in [FlushPolicy::Newline, FlushPolicy::EveryWrite] {
            let (mut dev, sink) = device(policy);
            let buffer = dev.output().pending.as_ptr();
            put(&mut dev, &[b'x'; 3 * PENDING_MAX + 7]);
            put(&mut dev, b"\nline\n");
            assert_eq!(dev.output().pending.as_ptr(), buffer, "{policy:?}");
            assert_eq!(dev.output().pending.capacity(), PENDING_MAX, "{policy:?}");
            assert_eq!(sink.0.lock().unwrap().len(), 3 * PENDING_MAX + 7 + 6);
        }
    }

    #[test]
    fn newline_policy_holds_back_until_newline() {
        let (mut dev, sink) = device(FlushPolicy::Newline);
        put(&mut dev, b"ab");
        assert!(sink.0.lock().unwrap().is_empty());
        put(&mut dev, b"\nc");
        assert_eq!(&*sink.0.lock().unwrap(), b"ab\n");
        dev.flush_output();
        assert_eq!(&*sink.0.lock().unwrap(), b"ab\nc");
        put(&mut dev, b"d");
        drop(dev);
        assert_eq!(&*sink.0.lock().unwrap(), b"ab\ncd");
    }

    #[test]
    fn log_file_gets_everything() {
        let path = std::env::temp_dir().join(format!("exitless-serial-{}.log", std::process::id()));
        let out = SerialOutput::discard().with_log_file(&path).unwrap();
        let mut dev = SerialDevice::new(evt(), out);
        put(&mut dev, b"boot\nok");
        assert_eq!(std::fs::read(&path).unwrap(), b"boot\nok");
        std::fs::remove_file(&path).unwrap();
        let bad = SerialOutput::discard().with_log_file(Path::new("/nonexistent/dir/x.log"));
        let msg = bad.err().unwrap().to_string();
        assert!(
            msg.starts_with("Cannot open serial log /nonexistent/dir/x.log"),
            "{msg}"
        );
    }

    #[test]
    fn a_closed_console_drops_and_counts_and_the_guest_goes_on() {
        for kind in [io::ErrorKind::BrokenPipe, io::ErrorKind::WouldBlock] {
            let sink = Closing { room: 3, kind };
            let out = SerialOutput::new(Box::new(sink));
            let mut dev = SerialDevice::new(evt(), out);
            // Every byte is its own flush (EveryWrite): 3 get through, 7 are lost.
            put(&mut dev, b"abcdefghi\n");
            assert_eq!(dev.output().loss().console_bytes, 7, "{kind:?}");
            assert_eq!(dev.output().loss().log_bytes, 0);
            // The guest's side is unaffected: the UART still takes bytes.
            let mut lsr = [0u8];
            dev.read(LSR, &mut lsr);
            assert_eq!(lsr[0] & 0x60, 0x60);
        }
    }

    #[test]
    fn a_partial_write_counts_only_what_was_not_written() {
        let sink = Closing {
            room: 4,
            kind: io::ErrorKind::BrokenPipe,
        };
        let out = SerialOutput::new(Box::new(sink)).with_flush_policy(FlushPolicy::Newline);
        let mut dev = SerialDevice::new(evt(), out);
        put(&mut dev, b"0123456789\n");
        assert_eq!(dev.output().loss().console_bytes, 7);
    }

    #[test]
    fn a_full_log_file_is_counted_and_the_console_still_gets_everything() {
        if !Path::new("/dev/full").exists() {
            crate::test_skip::skip("a_full_log_file_is_counted", "/dev/full is missing");
            return;
        }
        let sink = Shared::default();
        let out = SerialOutput::new(Box::new(sink.clone()))
            .with_log_file(Path::new("/dev/full"))
            .unwrap()
            .with_flush_policy(FlushPolicy::Newline);
        let mut dev = SerialDevice::new(evt(), out);
        put(&mut dev, b"line one\nline two\n");
        assert_eq!(&*sink.0.lock().unwrap(), b"line one\nline two\n");
        let loss = dev.output().loss();
        assert_eq!((loss.console_bytes, loss.log_bytes), (0, 18));
    }

    #[test]
    fn lsr_reports_thr_empty() {
        let (mut dev, _) = device(FlushPolicy::EveryWrite);
        let mut d = [0u8];
        dev.read(LSR, &mut d);
        assert_eq!(d[0] & 0x60, 0x60, "THRE and TEMT set");
        assert_eq!(d[0] & 0x01, 0, "no data ready");
    }

    #[test]
    fn input_is_readable_via_rbr_and_raises_irq() {
        let (mut dev, _) = device(FlushPolicy::EveryWrite);
        dev.write(IER, &[0x01]).unwrap();
        assert_eq!(dev.enqueue_input(b"ok").unwrap(), 2);
        assert_eq!(dev.interrupt_evt().read().unwrap(), 1);
        let mut d = [0u8];
        dev.read(LSR, &mut d);
        assert_eq!(d[0] & 0x01, 0x01);
        dev.read(THR, &mut d);
        assert_eq!(d[0], b'o');
        dev.read(THR, &mut d);
        assert_eq!(d[0], b'k');
        dev.read(LSR, &mut d);
        assert_eq!(d[0] & 0x01, 0);
    }

    #[test]
    fn full_fifo_accepts_only_what_fits() {
        let (mut dev, _) = device(FlushPolicy::EveryWrite);
        let big = [b'x'; 100];
        let n = dev.enqueue_input(&big).unwrap();
        assert!(n > 0 && n < big.len());
        assert_eq!(dev.fifo_capacity(), 0);
        assert_eq!(dev.enqueue_input(&big[n..]).unwrap(), 0);
        assert_eq!(dev.enqueue_input(&[]).unwrap(), 0);
    }

    #[test]
    fn registers_and_input_survive_a_snapshot_without_a_second_interrupt() {
        let (mut dev, _) = device(FlushPolicy::EveryWrite);
        dev.write(IER, &[0x01]).unwrap();
        dev.write(7, &[0x5a]).unwrap(); // scratch
        assert_eq!(dev.enqueue_input(b"hi").unwrap(), 2);
        assert_eq!(dev.interrupt_evt().read().unwrap(), 1);
        let saved = Mutex::new(dev).snapshot().unwrap();
        let (fresh, sink) = device(FlushPolicy::EveryWrite);
        let fresh = Mutex::new(fresh);
        fresh.restore(saved).unwrap();
        let mut dev = fresh.into_inner().unwrap();
        // Data ready with its interrupt enabled: restored, and not raised again.
        assert!(dev.interrupt_evt().read().is_err(), "no second interrupt");
        let mut d = [0u8];
        dev.read(7, &mut d);
        assert_eq!(d[0], 0x5a);
        dev.read(THR, &mut d);
        assert_eq!(d[0], b'h');
        // The line still works and output still reaches the same sink.
        put(&mut dev, b"ok");
        assert_eq!(&*sink.0.lock().unwrap(), b"ok");
        assert!(dev.enqueue_input(b"x").unwrap() > 0);
        assert_eq!(dev.interrupt_evt().read().unwrap(), 1);
        let too_much = serde_json::json!({"baud_divisor_low": 12, "baud_divisor_high": 0,
            "interrupt_enable": 0, "interrupt_identification": 1, "line_control": 3,
            "line_status": 96, "modem_control": 8, "modem_status": 0, "scratch": 0,
            "in_buffer": vec![0u8; 65]});
        let e = Mutex::new(dev).restore(too_much).unwrap_err();
        assert!(e.contains("receive FIFO of 65 bytes"), "{e}");
    }

    #[test]
    fn bad_accesses_are_counted_faults() {
        let (mut dev, sink) = device(FlushPolicy::EveryWrite);
        let mut d = [0u8; 2];
        dev.read(THR, &mut d);
        assert_eq!(d, [0xff, 0xff]);
        assert_eq!(dev.write(THR, b"ab").unwrap(), DeviceEvent::None);
        assert_eq!(dev.write(8, b"a").unwrap(), DeviceEvent::None);
        dev.read(9, &mut d[..1]);
        dev.read(0, &mut []);
        assert_eq!(dev.faults(), 5);
        assert!(sink.0.lock().unwrap().is_empty());
    }
}
