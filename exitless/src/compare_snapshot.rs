//! The `snapshot` case's table (exitless_lab::compare::snapshot): per VMM, snapshot create, restore
//! and resume, spawn to the guest's next line, private dirty memory per clone and the
//! snapshot's size on disk, or the error that stopped the VMM.

use exitless_lab::compare::snapshot::{SnapshotRow, CLONES};
use exitless_lab::compare::Spread;

fn spread(s: &Spread, digits: usize) -> String {
    format!("{:.d$} ({:.d$}-{:.d$})", s.median, s.min, s.max, d = digits)
}

/// One line per VMM; the ratio column is the median restore + resume over exitless's.
pub fn print(rows: &[SnapshotRow]) {
    println!(
        "snapshot: the guest paused mid-loop (10 MiB written), snapshotted, restored in fresh \
         processes; ms as the API client sees each reply; {CLONES} clones at once: median (min-max)"
    );
    println!(
        "{:<17} {:>20} {:>20} {:>18} {:>18} {:>20} {:>7} {:>20} {:>12}",
        "vmm",
        "create ms",
        "restore+resume ms",
        "restore ms",
        "resume ms",
        "spawn to line ms",
        "ratio",
        "priv dirty kB/clone",
        "on disk MiB"
    );
    let base = rows
        .iter()
        .find(|r| r.vmm == "exitless" && !r.rounds.is_empty())
        .map(|r| r.restore_resume_ms.median)
        .filter(|m| *m > 0.0);
    for r in rows {
        if let Some(why) = &r.failed {
            println!("{:<17} cannot snapshot here: {why}", r.vmm);
            continue;
        }
        let ratio = base.map_or("-".into(), |b| {
            format!("{:.2}x", r.restore_resume_ms.median / b)
        });
        println!(
            "{:<17} {:>20} {:>20} {:>18} {:>18} {:>20} {:>7} {:>20} {:>12.1}",
            r.vmm,
            spread(&r.create_ms, 1),
            spread(&r.restore_resume_ms, 1),
            spread(&r.restore_ms, 1),
            spread(&r.resume_ms, 1),
            spread(&r.spawn_to_line_ms, 1),
            ratio,
            spread(&r.private_dirty_kib, 0),
            r.snapshot_bytes.median / f64::from(1 << 20),
        );
    }
}
