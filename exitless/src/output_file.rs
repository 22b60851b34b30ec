//! Files exitless writes its results to: checked before the work starts, so a long run never
//! ends in "cannot write" with its results lost.

use std::fs::OpenOptions;
use std::path::Path;

use anyhow::Context;

/// Fails now, in one line, if `path` (given with `option`) cannot be written later. A file
/// created only for the check is removed again.
pub fn ensure_writable(option: &str, path: &Path) -> anyhow::Result<()> {
    let existed = path.exists();
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .with_context(|| format!("{option} {}: cannot write there", path.display()))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Writes `value` as pretty JSON to `path`.
pub fn write_json(path: &Path, value: &impl serde::Serialize) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value).context("Cannot serialize the results")?;
    std::fs::write(path, text + "\n").with_context(|| format!("Cannot write {}", path.display()))
}
