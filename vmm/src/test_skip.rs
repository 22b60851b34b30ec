//! How a test says it skipped: one `SKIPPED: test: reason` line on stderr (which `cargo test`
//! hides for passing tests), and the same line appended to the file `EXITLESS_SKIP_LOG` names,
//! which `scripts/test.sh` counts and prints at the end of the suite.

use std::io::Write;

/// Reports that `test` was skipped because of `reason`.
pub fn skip(test: &str, reason: &str) {
    let line = format!("SKIPPED: {test}: {reason}");
    eprintln!("{line}");
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
