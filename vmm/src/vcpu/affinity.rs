//! Pinning a vCPU thread to one host CPU.

use std::io;

/// Pins the calling thread to host CPU `cpu`.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    if cpu >= max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("host CPU {cpu} is beyond the largest CPU set ({max})"),
        ));
    }
    // SAFETY: cpu_set_t is a plain bit array; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below the set's bit count (checked above), so CPU_SET stays in bounds.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 is the calling thread; `set` is a valid, initialized cpu_set_t and the size
    // passed is its size.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The host CPUs the calling thread may run on, ascending.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    allowed_cpus_of(0)
}

/// The host CPUs thread `tid` (0: the calling thread) may run on, ascending.
pub fn allowed_cpus_of(tid: libc::pid_t) -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is a plain bit array; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t and the size passed is its size, so the kernel writes
    // only inside it; a `tid` that names no thread gives an error, not undefined behaviour.
    let rc = unsafe { libc::sched_getaffinity(tid, std::mem::size_of_val(&set), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: every `cpu` is below the set's bit count, so CPU_ISSET reads inside `set`.
    Ok((0..max)
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_to_a_cpu_we_may_use_and_rejects_huge_numbers() {
        let cpu = crate::profile::current_cpu().unwrap_or(0);
        let handle = std::thread::spawn(move || pin_current_thread(cpu));
        handle.join().unwrap().unwrap();
        assert!(pin_current_thread(1 << 20).is_err());
    }

    #[test]
    fn the_current_cpu_is_an_allowed_one() {
        let allowed = allowed_cpus().unwrap();
        assert!(!allowed.is_empty());
        assert!(allowed.windows(2).all(|w| w[0] < w[1]));
        if let Some(cpu) = crate::profile::current_cpu() {
            assert!(allowed.contains(&cpu), "{cpu} not in {allowed:?}");
        }
    }
}
