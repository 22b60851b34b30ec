//! The `migrate` case's table (exitless_lab::compare::migrate): per VMM, way and writing rate,
//! the downtime the guest saw, the VMM's total time and its own downtime figure, bytes sent,
//! and the ratios to QEMU at the same rate; or the error that stopped the VMM.

use exitless_lab::compare::migrate::{MigrateRow, SPAN_MIB};
use exitless_lab::compare::Spread;

fn spread(s: &Spread) -> String {
    format!("{:.1} ({:.1}-{:.1})", s.median, s.min, s.max)
}

fn ratio(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{r:.2}x"))
}

/// One line per row.
pub fn print(rows: &[MigrateRow]) {
    println!(
        "\nmigrate: the guest ({SPAN_MIB} MiB written once, then writing at the rate given) \
         live-migrated on this host; guest downtime = the longest gap its TSC-stamped loop saw \
         that started while the VMM migrated; noise = its longest gap outside that (the host's \
         scheduler); total and VMM downtime as each VMM reports them; x qemu = median over \
         QEMU's at the same rate: median (min-max)"
    );
    println!(
        "{:<17} {:<6} {:>7} {:>22} {:>8} {:>9} {:>22} {:>8} {:>20} {:>20} {:>14}",
        "vmm",
        "way",
        "MiB/s",
        "guest downtime ms",
        "x qemu",
        "noise ms",
        "total ms",
        "x qemu",
        "vmm downtime ms",
        "client ms",
        "sent MiB"
    );
    for r in rows {
        let (vmm, way, rate) = (r.vmm, r.way.name(), r.write_mib_s);
        if let Some(why) = &r.failed {
            println!("{vmm:<17} {way:<6} {rate:>7} cannot migrate here: {why}");
            continue;
        }
        println!(
            "{vmm:<17} {way:<6} {rate:>7} {:>22} {:>8} {:>9.1} {:>22} {:>8} {:>20} {:>20} {:>14.1}",
            spread(&r.guest_downtime_ms),
            ratio(r.ratio_to_qemu(rows, |r| r.guest_downtime_ms.median)),
            r.guest_noise_ms.median,
            spread(&r.total_ms),
            ratio(r.ratio_to_qemu(rows, |r| r.total_ms.median)),
            r.reported_downtime_ms.as_ref().map_or("-".into(), spread),
            spread(&r.client_ms),
            r.sent_mib.median,
        );
    }
    for r in rows.iter().filter(|r| r.failed.is_none()) {
        if let Some(steps) = r.rounds.first().and_then(|m| m.steps.as_ref()) {
            let (vmm, way, rate) = (r.vmm, r.way.name(), r.write_mib_s);
            println!("{vmm} {way} {rate} MiB/s, first round: {steps}");
        }
    }
}
