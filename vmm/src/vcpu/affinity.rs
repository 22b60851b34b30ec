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
}
