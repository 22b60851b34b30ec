//! The main thread's wake-up, so that an idle VMM's main thread sleeps until it has work:
//! an event count (a generation number and a futex on it). Whatever needs the main thread (an
//! API request, a vCPU thread ending, the guest ejecting a device or a CPU, a signal) calls
//! [`wake`]; the main thread reads [`generation`], looks at everything, and calls
//! [`sleep_until_changed`] with the value it read. Nothing is lost between looking and
//! sleeping: the futex sleeps only while the count still holds that value.
//!
//! One count per process: a wake-up meant for one VM's loop wakes every waiting loop (tests
//! run several in one process), each of which looks and sleeps again. [`wake`] is an atomic
//! add and, when someone waits, one system call: async-signal-safe, so the signal handlers
//! call it. `futex` is in every thread's seccomp list.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

static GENERATION: AtomicU32 = AtomicU32::new(0);
/// Threads inside [`sleep_until_changed`]: [`wake`] makes the system call only for them.
static WAITERS: AtomicU32 = AtomicU32::new(0);

/// The count now: read it before looking for work, then sleep with it.
pub fn generation() -> u32 {
    GENERATION.load(Ordering::SeqCst)
}

/// Tells the waiting loops that something happened.
pub fn wake() {
    GENERATION.fetch_add(1, Ordering::SeqCst);
    // Sequentially consistent with the waiter's increment and load: either it sees the new
    // count and does not sleep, or this sees it waiting and wakes it.
    if WAITERS.load(Ordering::SeqCst) > 0 {
        // SAFETY: FUTEX_WAKE on a static word; no memory is written.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                GENERATION.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                i32::MAX,
            );
        }
    }
}

/// Sleeps until the count is no longer `seen` or `timeout` passes (`None`: as long as it
/// takes); also returns early on a signal. The caller looks again either way.
pub fn sleep_until_changed(seen: u32, timeout: Option<Duration>) {
    WAITERS.fetch_add(1, Ordering::SeqCst);
    if GENERATION.load(Ordering::SeqCst) == seen {
        let limit = timeout.map(|t| libc::timespec {
            tv_sec: t.as_secs().min(i32::MAX as u64) as _,
            tv_nsec: t.subsec_nanos().into(),
        });
        let limit_ptr = limit
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: FUTEX_WAIT on a static word with a timespec that outlives the call (or
        // null); the kernel only reads both.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                GENERATION.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                seen,
                limit_ptr,
            );
        }
    }
    WAITERS.fetch_sub(1, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_wake_between_looking_and_sleeping_is_not_lost() {
        let seen = generation();
        wake();
        let started = Instant::now();
        sleep_until_changed(seen, Some(Duration::from_secs(30)));
        assert!(started.elapsed() < Duration::from_secs(10), "slept through");
    }

    #[test]
    fn a_sleeper_wakes_when_another_thread_wakes_it_and_after_its_timeout() {
        let seen = generation();
        let waker = std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            wake();
        });
        let started = Instant::now();
        // Other tests' wake-ups may end the sleep sooner; ours ends it within the limit.
        while generation() == seen && started.elapsed() < Duration::from_secs(30) {
            sleep_until_changed(seen, Some(Duration::from_secs(30)));
        }
        waker.join().unwrap();
        assert_ne!(generation(), seen);
        assert!(started.elapsed() < Duration::from_secs(10));
        let started = Instant::now();
        sleep_until_changed(generation().wrapping_add(1), Some(Duration::from_secs(30)));
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "a stale value returns at once"
        );
        let seen = generation();
        sleep_until_changed(seen, Some(Duration::from_millis(20)));
    }
}
