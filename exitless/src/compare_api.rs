//! `exitless compare --api`: start-up through the API (what Kata measures), exitless beside
//! Cloud Hypervisor, rounds interleaved, and the floor VMM's spawn to first line (it has no
//! API) as the limit.

use std::path::Path;

use exitless_lab::compare::api_start::{self, ApiStart};
use exitless_lab::compare::peer::Vmm;
use exitless_lab::compare::Spread;

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
        .filter(|v| api_start::in_api_comparison(v.kind))
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

/// The median first line of the VMM named `name`, if it has starts.
fn first_line_median(reports: &[ApiStartReport], name: &str) -> Option<f64> {
    let r = reports
        .iter()
        .find(|r| r.vmm == name && !r.starts.is_empty())?;
    Some(spread(r.starts.iter().map(|s| s.first_line_ms)).median).filter(|m| *m > 0.0)
}

/// The table: median (min-max) per column, the first line's ratio to exitless's and to the
/// floor's ("-" where a VMM has no such figure: the floor answers no requests).
pub fn print(reports: &[ApiStartReport]) {
    println!("start through the API (--api-socket, vmm.ping, vm.create, vm.boot, first serial line; the floor: spawned with the guest): median (min-max)");
    println!(
        "{:<18} {:>22} {:>22} {:>22} {:>22} {:>7} {:>8}",
        "vmm", "ping answers ms", "vm.create us", "vm.boot us", "first line ms", "ratio", "x floor"
    );
    let base = first_line_median(reports, "exitless");
    let floor = first_line_median(reports, "floor");
    for r in reports {
        if let Some(why) = &r.failed {
            println!("{:<18} left out: {why}", r.vmm);
            continue;
        }
        let col = |f: fn(&ApiStart) -> Option<f64>| {
            let values: Vec<f64> = r.starts.iter().filter_map(f).collect();
            if values.is_empty() {
                return "-".to_string();
            }
            let s = Spread::of(&values);
            format!("{:.2} ({:.2}-{:.2})", s.median, s.min, s.max)
        };
        let line = spread(r.starts.iter().map(|s| s.first_line_ms)).median;
        let ratio = |to: Option<f64>| to.map_or("-".into(), |b| format!("{:.2}x", line / b));
        println!(
            "{:<18} {:>22} {:>22} {:>22} {:>22} {:>7} {:>8}",
            r.vmm,
            col(|s| s.ready_ms),
            col(|s| s.create_us),
            col(|s| s.boot_us),
            col(|s| Some(s.first_line_ms)),
            ratio(base),
            ratio(floor),
        );
    }
}
