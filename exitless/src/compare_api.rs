//! `exitless compare --api`: start-up through the API (what Kata measures), exitless beside
//! Cloud Hypervisor, rounds interleaved.

use std::path::Path;

use vmm::compare::api_start::{self, ApiStart};
use vmm::compare::peer::Vmm;
use vmm::compare::Spread;

/// One VMM's starts.
#[derive(serde::Serialize)]
pub struct ApiStartReport {
    pub vmm: &'static str,
    pub starts: Vec<ApiStart>,
    /// Why it was left out, if it was.
    pub failed: Option<String>,
}

/// `rounds` starts of each VMM that speaks the API.
pub fn run(
    vmms: &[Vmm],
    guest: &Path,
    workdir: &Path,
    memory_mib: u64,
    rounds: u32,
) -> Vec<ApiStartReport> {
    let vmms: Vec<&Vmm> = vmms
        .iter()
        .filter(|v| api_start::speaks_api(v.kind))
        .collect();
    let mut reports: Vec<ApiStartReport> = vmms
        .iter()
        .map(|v| ApiStartReport {
            vmm: v.kind.name(),
            starts: Vec::new(),
            failed: None,
        })
        .collect();
    for round in 1..=rounds {
        for (vmm, report) in vmms.iter().zip(reports.iter_mut()) {
            if report.failed.is_some() || vmm::launch::stop_signal().is_some() {
                continue;
            }
            eprintln!(
                "[compare] round {round}/{rounds}: {} start through the API",
                report.vmm
            );
            match api_start::measure(vmm, guest, workdir, memory_mib) {
                Ok(s) => report.starts.push(s),
                Err(e) => {
                    eprintln!("[compare] {}: {e}; left out", report.vmm);
                    report.failed = Some(e);
                }
            }
        }
    }
    reports
}

fn spread(values: impl Iterator<Item = f64>) -> Spread {
    Spread::of(&values.collect::<Vec<_>>())
}

/// The table: median (min-max) per column, the first line's ratio to exitless's.
pub fn print(reports: &[ApiStartReport]) {
    println!("start through the API (--api-socket, vmm.ping, vm.create, vm.boot, first serial line): median (min-max)");
    println!(
        "{:<18} {:>22} {:>22} {:>22} {:>22} {:>7}",
        "vmm", "ping answers ms", "vm.create us", "vm.boot us", "first line ms", "ratio"
    );
    let base = reports
        .first()
        .map(|r| spread(r.starts.iter().map(|s| s.first_line_ms)).median);
    for r in reports {
        if let Some(why) = &r.failed {
            println!("{:<18} left out: {why}", r.vmm);
            continue;
        }
        let col = |f: fn(&ApiStart) -> f64| {
            let s = spread(r.starts.iter().map(f));
            format!("{:.2} ({:.2}-{:.2})", s.median, s.min, s.max)
        };
        let line = spread(r.starts.iter().map(|s| s.first_line_ms)).median;
        let ratio = base
            .filter(|b| *b > 0.0)
            .map_or(String::new(), |b| format!("{:.2}x", line / b));
        println!(
            "{:<18} {:>22} {:>22} {:>22} {:>22} {:>7}",
            r.vmm,
            col(|s| s.ready_ms),
            col(|s| s.create_us),
            col(|s| s.boot_us),
            col(|s| s.first_line_ms),
            ratio
        );
    }
}
