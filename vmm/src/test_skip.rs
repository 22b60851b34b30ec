//! How a test says it skipped: one `SKIPPED: test: reason` line on stderr (which `cargo test`
//! hides for passing tests), the same line appended to the file `EXITLESS_SKIP_LOG` names
//! (which `scripts/test.sh` counts and prints at the end of the suite), and, when the test
//! binary ends, one summary on stderr of every test it skipped, by reason (cargo captures a
//! test's own output, not what the process prints as it exits).

use std::io::Write;
use std::sync::{Mutex, Once};

/// (test, reason) of every skip in this process.
static SKIPPED: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());
static SUMMARY_AT_EXIT: Once = Once::new();

/// Reports that `test` was skipped because of `reason`.
pub fn skip(test: &str, reason: &str) {
    let line = format!("SKIPPED: {test}: {reason}");
    eprintln!("{line}");
    record(test, reason);
    let Some(path) = std::env::var_os("EXITLESS_SKIP_LOG") else {
        return;
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path);
    if let Ok(mut file) = file {
        // One write per line: lines from parallel tests do not interleave.
        let _ = file.write_all(format!("{line}\n").as_bytes());
    }
}

fn record(test: &str, reason: &str) {
    SKIPPED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((test.to_string(), reason.to_string()));
    SUMMARY_AT_EXIT.call_once(|| {
        // SAFETY: atexit only stores the address of a function that takes nothing and never
        // unwinds; it runs once, when the process exits.
        unsafe { libc::atexit(print_summary) };
    });
}

/// The summary of `skipped`: a count, then one line per test, grouped by reason.
fn summary(skipped: &[(String, String)]) -> String {
    let mut sorted: Vec<&(String, String)> = skipped.iter().collect();
    sorted.sort_by(|a, b| (&a.1, &a.0).cmp(&(&b.1, &b.0)));
    sorted.dedup();
    let plural = if sorted.len() == 1 { "" } else { "s" };
    let mut text = format!("skipped {} test{plural}:\n", sorted.len());
    for (test, reason) in sorted {
        text.push_str(&format!("  {test} — {reason}\n"));
    }
    text
}

extern "C" fn print_summary() {
    // Never panic here: the process is exiting, across a C frame.
    let skipped = match SKIPPED.lock() {
        Ok(s) => s.clone(),
        Err(e) => e.into_inner().clone(),
    };
    if !skipped.is_empty() {
        let _ = std::io::stderr().write_all(summary(&skipped).as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_counts_each_test_once_grouped_by_reason() {
        let s = |t: &str, r: &str| (t.to_string(), r.to_string());
        let skipped = [
            s("b", "no kvm"),
            s("c", "no qemu"),
            s("a", "no kvm"),
            s("b", "no kvm"),
        ];
        assert_eq!(
            summary(&skipped),
            "skipped 3 tests:\n  a — no kvm\n  b — no kvm\n  c — no qemu\n"
        );
    }
}
