//! Cloud Hypervisor's `ch-remote`, which the API tests drive exitless with: `EXITLESS_CH_REMOTE`
//! if set, else the first `ch-remote` on PATH (build it from Cloud Hypervisor's public
//! source). Without one, the test says so in a skip line and does what it can without it.

use std::path::PathBuf;

/// The `ch-remote` to use, or None after printing `test`'s skip line with `without`: what the
/// test does instead (or that it does nothing).
pub fn find(test: &str, without: &str) -> Option<PathBuf> {
    let given = std::env::var_os("EXITLESS_CH_REMOTE").map(PathBuf::from);
    let found = given.or_else(|| {
        std::env::split_paths(&std::env::var_os("PATH")?)
            .map(|d| d.join("ch-remote"))
            .find(|p| p.is_file())
    });
    match found.filter(|p| p.is_file()) {
        Some(path) => Some(path),
        None => {
            vmm::test_skip::skip(
                test,
                &format!("ch-remote is not on PATH (or EXITLESS_CH_REMOTE): {without}"),
            );
            None
        }
    }
}

/// Runs `remote` (a `ch-remote`) on the API socket `socket` with `args`: whether it
/// succeeded, and what it said (stdout then stderr).
pub fn run(remote: &std::path::Path, socket: &std::path::Path, args: &[&str]) -> (bool, String) {
    let o = std::process::Command::new(remote)
        .arg("--api-socket")
        .arg(socket)
        .args(args)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    (o.status.success(), said)
}
