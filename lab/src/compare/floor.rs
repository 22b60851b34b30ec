//! The floor VMM (lab/floor/floor.c): a freestanding C program that does the least a KVM VMM
//! must do to run the bench guest (see docs/performance.md, "The floor"). Built by build.rs,
//! embedded here, and written out by `compare` into its folder to run as one more VMM.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The floor VMM's executable (static, no libc).
pub const FLOOR_VMM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/floor"));

/// Writes the floor VMM into `dir` as an executable file named `floor`; returns its path.
pub fn write_into(dir: &Path) -> std::io::Result<PathBuf> {
    let path = dir.join("floor");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o755)
        .open(&path)?;
    file.write_all(FLOOR_VMM)?;
    // Written back now: text whose page cache is still dirty counts as private dirty memory.
    file.sync_all()?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_a_static_executable_that_needs_no_loader() {
        assert_eq!(&FLOOR_VMM[..4], b"\x7fELF");
        assert_eq!(
            u16::from_le_bytes([FLOOR_VMM[16], FLOOR_VMM[17]]),
            2,
            "ET_EXEC"
        );
        let phoff = u64::from_le_bytes(FLOOR_VMM[32..40].try_into().unwrap()) as usize;
        let phnum = u16::from_le_bytes([FLOOR_VMM[56], FLOOR_VMM[57]]) as usize;
        let types: Vec<u32> = (0..phnum)
            .map(|i| {
                let at = phoff + i * 56;
                u32::from_le_bytes(FLOOR_VMM[at..at + 4].try_into().unwrap())
            })
            .collect();
        assert!(!types.contains(&3), "no PT_INTERP: {types:?}");
        assert!(types.contains(&1), "PT_LOAD: {types:?}");
        assert!(FLOOR_VMM.len() < 64 << 10, "{} bytes", FLOOR_VMM.len());
    }

    /// The floor run on the embedded bench guest with `args` before the three operands.
    fn run_floor(tag: &str, args: &[&str], cmdline: &str) -> std::process::Output {
        let dir = std::env::temp_dir().join(format!("exitless-floor-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let guest = dir.join("bench.elf");
        std::fs::write(&guest, crate::bench::guest::BENCH_GUEST).unwrap();
        let out = std::process::Command::new(write_into(&dir).unwrap())
            .args(args)
            .arg(&guest)
            .arg(cmdline)
            .arg("64")
            .output()
            .unwrap();
        std::fs::remove_dir_all(&dir).ok();
        out
    }

    fn results(out: &std::process::Output) -> Vec<crate::bench::result::GuestResult> {
        use crate::bench::result::{parse_line, GuestLine};
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| match parse_line(l) {
                Ok(GuestLine::Result(r)) => Some(r),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_floor_runs_the_bench_guest_and_ends_with_its_status() {
        if std::fs::metadata("/dev/kvm").is_err() {
            vmm::test_skip::skip("floor_runs_the_guest", "/dev/kvm is missing on this host");
            return;
        }
        for (args, tag) in [(&[][..], "cpuid"), (&["--small-cpuid"][..], "small")] {
            let out = run_floor(tag, args, "case=pio_out iters=50");
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
            let r = results(&out);
            assert_eq!(r.len(), 1, "{args:?}: {out:?}");
            assert_eq!(
                (r[0].case.as_str(), r[0].iters, r[0].cpl),
                ("pio_out", 50, 3)
            );
            assert!(r[0].cycles > 0);
        }
        // The guest's own status through the exit port: 2 for a case it does not know.
        let out = run_floor("unknown", &[], "case=no_such_case");
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("EXITLESS ERROR unknown case"));
        // --timing: every step, after the first line.
        let out = run_floor("timing", &["--timing"], "case=cpuid iters=10");
        let err = String::from_utf8_lossy(&out.stderr);
        for step in ["KVM_CREATE_VM", "KVM_GET_SUPPORTED_CPUID", "first KVM_RUN"] {
            assert!(err.contains(step), "{step}: {err}");
        }
        assert!(err.contains("guest's first serial line written"), "{err}");
    }

    #[test]
    fn the_floor_is_written_as_an_executable() {
        let dir = std::env::temp_dir().join(format!("exitless-floor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = write_into(&dir).unwrap();
        let out = std::process::Command::new(&path).output().unwrap();
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("floor: usage: floor"), "{err}");
    }
}
