//! The device event loop: one thread ("devices") waiting in epoll (the `event-manager` crate)
//! for device work, so that no device I/O runs on a vCPU thread. A vCPU thread only signals an
//! eventfd (or KVM does, through an ioeventfd); the subscriber registered here does the work.
//!
//! Subscribers are added and removed from any other thread through an [`EventLoopHandle`]
//! (the manager's remote endpoint); a subscriber registers its fds in `init`.
//!
//! The thread starts when first needed, so that a VM whose devices never need it (a guest
//! that never drives its virtio-rng, say) never pays for it or its seccomp install: a call
//! that waits for the loop starts it; work fired from a thread that may not start threads (a
//! vCPU's, activating a device) asks for it and wakes the main thread ([`crate::wake`]),
//! which starts it when it looks ([`EventLoop::run_if_wanted`]).

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};

use event_manager::{
    EventManager, MutEventSubscriber, RemoteEndpoint, SubscriberId, SubscriberOps,
};
use thiserror::Error;

/// What the loop holds: a device's subscriber, locked only while the loop runs its callback.
pub type Subscriber = Arc<Mutex<dyn MutEventSubscriber + Send>>;

/// Errors starting or talking to the event loop.
#[derive(Debug, Error)]
pub enum EventLoopError {
    #[error("Cannot create the device event loop: {0}")]
    Create(event_manager::Error),
    #[error("Cannot start the device event loop thread: {0}")]
    Thread(io::Error),
    #[error("The device event loop is not running: {0}")]
    Stopped(event_manager::Error),
}

impl From<event_manager::Error> for EventLoopError {
    fn from(e: event_manager::Error) -> Self {
        EventLoopError::Stopped(e)
    }
}

/// Adds and removes subscribers from outside the loop's thread. Never call it from a
/// subscriber's own callback (that is the loop's thread: it would wait for itself).
///
/// One of the lab's entry points (the bench's virtio cases run their devices on it).
#[derive(Clone)]
pub struct EventLoopHandle {
    endpoint: RemoteEndpoint<Subscriber>,
    thread: Arc<LoopThread>,
}

/// The loop's thread: not started yet (the manager waits here), or started.
struct LoopThread {
    pending: Mutex<Option<EventManager<Subscriber>>>,
    stop: Arc<AtomicBool>,
    started: Mutex<Option<JoinHandle<()>>>,
    /// Set once work was fired (or the thread started): the main thread starts it then.
    wanted: AtomicBool,
}

impl LoopThread {
    /// Starts the thread unless it was started: what every call that waits for the loop does
    /// first, so that nothing waits for a loop that is not running.
    fn ensure_running(&self) -> Result<(), EventLoopError> {
        let Some(mut manager) = lock(&self.pending).take() else {
            return Ok(());
        };
        self.wanted.store(true, Ordering::Release);
        let flag = self.stop.clone();
        let thread = thread::Builder::new()
            .name("devices".into())
            .spawn(move || {
                if let Err(e) = crate::seccomp::apply(crate::seccomp::ThreadKind::Devices) {
                    eprintln!("exitless: {e}; devices are not served");
                    return;
                }
                while !flag.load(Ordering::Acquire) {
                    if let Err(e) = manager.run() {
                        eprintln!("exitless: device event loop failed: {e}");
                        break;
                    }
                }
            })
            .map_err(EventLoopError::Thread)?;
        *lock(&self.started) = Some(thread);
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl EventLoopHandle {
    /// Registers `subscriber` (its `init` runs on the loop) and returns its id.
    pub fn add(&self, subscriber: Subscriber) -> Result<SubscriberId, EventLoopError> {
        self.thread.ensure_running()?;
        self.endpoint
            .call_blocking(move |ops| Ok::<_, EventLoopError>(ops.add_subscriber(subscriber)))
    }

    /// Unregisters a subscriber (its fds leave the epoll set).
    pub fn remove(&self, id: SubscriberId) -> Result<(), EventLoopError> {
        self.thread.ensure_running()?;
        self.endpoint
            .call_blocking(move |ops| ops.remove_subscriber(id).map(drop))
            .map_err(EventLoopError::Stopped)
    }

    /// Runs `work` on the loop's thread, after what was asked before it, without waiting:
    /// what a vCPU thread hands over (a device's start and reset), so that it never blocks on
    /// the device thread. On a loop not started yet ([`EventLoop::deferred`]) it waits in the
    /// queue until the loop starts: the first such work wakes the main thread to start it.
    pub fn fire(
        &self,
        work: impl FnOnce(&mut dyn SubscriberOps<Subscriber = Subscriber>) + Send + 'static,
    ) -> Result<(), EventLoopError> {
        self.endpoint.fire(work).map_err(EventLoopError::Stopped)?;
        let wanted = &self.thread.wanted;
        if !wanted.load(Ordering::Acquire) && !wanted.swap(true, Ordering::AcqRel) {
            crate::wake::wake();
        }
        Ok(())
    }

    /// Runs `work` on the loop's thread and waits for it to finish (not from a vCPU thread,
    /// nor from the loop's own).
    pub fn call(
        &self,
        work: impl FnOnce(&mut dyn SubscriberOps<Subscriber = Subscriber>) + Send + 'static,
    ) -> Result<(), EventLoopError> {
        self.thread.ensure_running()?;
        self.endpoint
            .call_blocking(move |ops| {
                work(ops);
                Ok::<(), event_manager::Error>(())
            })
            .map_err(EventLoopError::Stopped)
    }
}

/// The loop; dropping it stops and joins the thread.
pub struct EventLoop {
    handle: EventLoopHandle,
    stop: Arc<AtomicBool>,
}

impl EventLoop {
    /// Starts the loop on its own thread.
    pub fn start() -> Result<Self, EventLoopError> {
        let event_loop = Self::deferred()?;
        event_loop.run()?;
        Ok(event_loop)
    }

    /// The loop, its thread not started until [`EventLoop::run`] or the first call that waits
    /// for it ([`EventLoopHandle::add`], `remove`, `call`); work fired before waits for it.
    /// `launch` starts it once the vCPUs run: the guest's first instruction does not wait for
    /// its thread or its seccomp filter.
    pub fn deferred() -> Result<Self, EventLoopError> {
        let manager = EventManager::<Subscriber>::new().map_err(EventLoopError::Create)?;
        let stop = Arc::new(AtomicBool::new(false));
        let handle = EventLoopHandle {
            endpoint: manager.remote_endpoint(),
            thread: Arc::new(LoopThread {
                pending: Mutex::new(Some(manager)),
                stop: stop.clone(),
                started: Mutex::new(None),
                wanted: AtomicBool::new(false),
            }),
        };
        Ok(EventLoop { handle, stop })
    }

    /// Starts the loop's thread, unless it runs already.
    pub fn run(&self) -> Result<(), EventLoopError> {
        self.handle.thread.ensure_running()
    }

    /// Starts the loop's thread if work was fired at it: what the main thread does each time
    /// it wakes.
    pub fn run_if_wanted(&self) -> Result<(), EventLoopError> {
        if self.handle.thread.wanted.load(Ordering::Acquire) {
            self.run()?;
        }
        Ok(())
    }

    /// Whether the loop's thread was started.
    pub fn is_running(&self) -> bool {
        lock(&self.handle.thread.pending).is_none()
    }

    /// A handle to add and remove subscribers.
    pub fn handle(&self) -> EventLoopHandle {
        self.handle.clone()
    }
}

/// How long dropping the loop waits for its thread; one still busy after that is left behind
/// (the process is ending), so that no device can keep the VMM from stopping.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_millis(300);

impl Drop for EventLoop {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.handle.endpoint.kick();
        // A loop never started stays so: a handle's later call finds it stopped.
        drop(lock(&self.handle.thread.pending).take());
        let Some(t) = lock(&self.handle.thread.started).take() else {
            return;
        };
        let start = std::time::Instant::now();
        while !t.is_finished() && start.elapsed() < STOP_GRACE {
            thread::sleep(std::time::Duration::from_millis(2));
        }
        if t.is_finished() {
            let _ = t.join();
        } else {
            eprintln!(
                "exitless: the device thread did not stop within {STOP_GRACE:?}; left behind"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use event_manager::{EventOps, EventSet, Events};
    use std::sync::mpsc::{channel, Sender};
    use std::time::Duration;
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    struct Counter {
        evt: EventFd,
        seen: Sender<(u64, String)>,
    }

    impl MutEventSubscriber for Counter {
        fn process(&mut self, _events: Events, _ops: &mut EventOps) {
            let n = self.evt.read().unwrap_or(0);
            let name = thread::current().name().unwrap_or("").to_string();
            let _ = self.seen.send((n, name));
        }
        fn init(&mut self, ops: &mut EventOps) {
            ops.add(Events::new(&self.evt, EventSet::IN)).unwrap();
        }
    }

    #[test]
    fn subscribers_run_on_the_devices_thread_until_removed() {
        let el = EventLoop::start().unwrap();
        let (tx, rx) = channel();
        let evt = EventFd::new(EFD_NONBLOCK).unwrap();
        let signal = evt.try_clone().unwrap();
        let sub: Subscriber = Arc::new(Mutex::new(Counter { evt, seen: tx }));
        let id = el.handle().add(sub).unwrap();
        signal.write(3).unwrap();
        let (n, name) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!((n, name.as_str()), (3, "devices"));
        el.handle().remove(id).unwrap();
        signal.write(1).unwrap();
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        assert!(el.handle().remove(id).is_err());
        drop(el);
    }

    /// A deferred loop has no thread until it is run (or a call waits for it): work fired
    /// before waits in the queue and runs, on the devices thread, once it starts.
    #[test]
    fn a_deferred_loop_runs_work_fired_before_it_started() {
        let el = EventLoop::deferred().unwrap();
        let (tx, rx) = channel();
        el.handle()
            .fire(move |_| {
                let name = thread::current().name().unwrap_or("").to_string();
                let _ = tx.send(name);
            })
            .unwrap();
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        assert!(!el.is_running());
        el.run().unwrap();
        el.run().unwrap();
        let name = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(name, "devices");
        drop(el);
    }

    /// Work fired from another thread (a vCPU's) wakes the main thread, whose next look starts
    /// the loop; before anything was fired, a look starts nothing.
    #[test]
    fn fired_work_wakes_the_main_thread_whose_next_look_starts_the_loop() {
        let el = EventLoop::deferred().unwrap();
        el.run_if_wanted().unwrap();
        assert!(!el.is_running(), "nothing asked for the loop");
        let (tx, rx) = channel();
        let seen = crate::wake::generation();
        let handle = el.handle();
        thread::spawn(move || {
            handle
                .fire(move |_| {
                    let _ = tx.send(thread::current().name().unwrap_or("").to_string());
                })
                .unwrap()
        })
        .join()
        .unwrap();
        assert_ne!(crate::wake::generation(), seen, "the main thread was woken");
        assert!(!el.is_running());
        el.run_if_wanted().unwrap();
        assert!(el.is_running());
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), "devices");
        drop(el);
    }

    /// A call that waits for the loop starts it, so that nothing waits for a thread that
    /// never comes; a loop dropped before it started refuses later calls.
    #[test]
    fn a_waiting_call_starts_a_deferred_loop_and_a_dropped_one_refuses() {
        let el = EventLoop::deferred().unwrap();
        let (tx, rx) = channel();
        el.handle()
            .call(move |_| {
                let _ = tx.send(thread::current().name().unwrap_or("").to_string());
            })
            .unwrap();
        assert_eq!(rx.try_recv().unwrap(), "devices");
        let never = EventLoop::deferred().unwrap();
        let handle = never.handle();
        drop(never);
        assert!(handle.call(|_| {}).is_err());
    }
}
