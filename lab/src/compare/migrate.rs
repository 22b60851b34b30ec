//! The `migrate` compare case: the bench guest's `case=migrate` (a loop stamping every turn
//! with the TSC while it dirties pages at a given rate, `bench-guest/migrate.c`) live-migrated
//! between two processes of the same VMM on this host, once at rest and once while writing:
//! exitless over `unix:` and, as a row of its own, `local` (shared memory handed over as fds),
//! QEMU over `unix:` with its bandwidth cap lifted, Cloud Hypervisor tried over `unix:` (its
//! error in its row). Per migration: the longest gap the guest saw (its downtime as it lives
//! it, the same figure for every VMM), the VMM's own total time, downtime and bytes sent, and
//! the client's time for the whole request. Each round runs every row once, interleaved.
//! The drivers are in `migrate_run.rs`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::migrate_run;
use super::peer::Vmm;
use super::vmm_kind::VmmKind;
use super::{CompareError, Plan, Spread};

/// The case's name in `--cases`.
pub use super::peer::MIGRATE_CASE as CASE;

/// MiB of guest memory the guest writes once before its loop (the first pass's load).
pub const SPAN_MIB: u64 = 128;
/// The writing row's rate (MiB of pages dirtied per second), one QEMU still converges at
/// here with its cap lifted.
pub const WRITE_MIB_S: u64 = 64;
/// The rows' rates: at rest, and writing.
pub const RATES: [u64; 2] = [0, WRITE_MIB_S];
/// How long the guest's loop runs; the migration starts [`WARM`] into it.
pub const SECS: u64 = 6;
pub const WARM: Duration = Duration::from_millis(500);

/// Whether this VMM takes part (Firecracker cannot migrate a running VM; the floor has no
/// migration).
pub fn takes_part(kind: VmmKind) -> bool {
    matches!(
        kind,
        VmmKind::Exitless | VmmKind::Qemu | VmmKind::CloudHypervisor
    )
}

/// How the guest's memory goes: over a Unix socket, or (exitless's `local`) as the fds of
/// its shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Way {
    Unix,
    Local,
}

impl Way {
    pub fn name(self) -> &'static str {
        match self {
            Way::Unix => "unix",
            Way::Local => "local",
        }
    }
}

/// One migration, as measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MigrateRound {
    /// The longest gap between two turns of the guest's loop that started while the VMM
    /// migrated (`in_window`), or the longest of all where the guest's TSC is not the
    /// host's.
    pub guest_downtime_ms: f64,
    pub in_window: bool,
    /// When that gap started, from the migration request (ms; in the window only): near
    /// the total less the downtime, it is the pause.
    pub guest_gap_from_start_ms: Option<f64>,
    /// The longest gap the guest saw outside the migration (the host's scheduler), among its
    /// 16 longest; 0 when all fell inside.
    pub guest_noise_ms: f64,
    /// From the source's start of the migration to its end, as the VMM reports it.
    pub total_ms: f64,
    /// The pause as the VMM reports it (exitless: pause to the destination's OK to
    /// Complete; QEMU: its `downtime`).
    pub reported_downtime_ms: Option<f64>,
    /// The migration request to its end as the driver saw it (exitless: vm.send-migration's
    /// reply; QEMU: `migrate` until `query-migrate` said completed, polled every ms).
    pub client_ms: f64,
    /// Guest memory sent, MiB (exitless: whole MiB as it logs them; `local`: 0).
    pub sent_mib: f64,
    /// Memory passes, when the VMM says (exitless's passes, QEMU's dirty syncs).
    pub passes: Option<u64>,
    /// MiB the guest wrote in its loop (the writing row: its rate times its loop).
    pub written_mib: u64,
    /// The destination printed the guest's result (every page as written) and done lines.
    pub done_line: bool,
    /// The source's VMM process ended (exitless) or its VM stopped (QEMU: `postmigrate`).
    pub source_ended: bool,
    /// exitless: where the time went, as its source logs it with `-v` (setup, precopy, then
    /// the downtime's pause, capture, last pass, State, Complete).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<String>,
}

/// One row: a VMM, a way, a rate; medians (min-max) over its rounds, or why it failed.
#[derive(Clone, Debug, Serialize)]
pub struct MigrateRow {
    pub vmm: &'static str,
    pub way: Way,
    pub write_mib_s: u64,
    pub failed: Option<String>,
    pub rounds: Vec<MigrateRound>,
    pub guest_downtime_ms: Spread,
    /// The longest gaps outside the migration (the host's own noise, for scale).
    pub guest_noise_ms: Spread,
    pub total_ms: Spread,
    pub reported_downtime_ms: Option<Spread>,
    pub client_ms: Spread,
    pub sent_mib: Spread,
}

impl MigrateRow {
    pub fn of(
        vmm: &'static str,
        (way, write_mib_s): (Way, u64),
        rounds: Vec<MigrateRound>,
        failed: Option<String>,
    ) -> Self {
        let over =
            |f: fn(&MigrateRound) -> f64| Spread::of(&rounds.iter().map(f).collect::<Vec<_>>());
        let reported: Vec<f64> = rounds
            .iter()
            .filter_map(|r| r.reported_downtime_ms)
            .collect();
        MigrateRow {
            vmm,
            way,
            write_mib_s,
            failed,
            guest_downtime_ms: over(|r| r.guest_downtime_ms),
            guest_noise_ms: over(|r| r.guest_noise_ms),
            total_ms: over(|r| r.total_ms),
            reported_downtime_ms: (!reported.is_empty()).then(|| Spread::of(&reported)),
            client_ms: over(|r| r.client_ms),
            sent_mib: over(|r| r.sent_mib),
            rounds,
        }
    }

    /// This row's median of `figure` over QEMU's at the same rate (`unix:`), if QEMU has one.
    pub fn ratio_to_qemu(
        &self,
        rows: &[MigrateRow],
        figure: fn(&MigrateRow) -> f64,
    ) -> Option<f64> {
        let qemu = rows.iter().find(|r| {
            r.vmm == VmmKind::Qemu.name() && r.write_mib_s == self.write_mib_s && r.failed.is_none()
        })?;
        let base = figure(qemu);
        (base > 0.0 && self.failed.is_none()).then(|| figure(self) / base)
    }
}

/// What every migration of a comparison boots.
pub struct Setting<'a> {
    pub guest: &'a Path,
    pub memory_mib: u64,
    /// The host's TSC frequency, which the guest's figures and rate need.
    pub tsc_khz: u64,
    /// A folder of the case's own (sockets, logs).
    pub dir: PathBuf,
    /// Longest a migration's steps may take each.
    pub limit: Duration,
}

impl Setting<'_> {
    /// The guest's command line at `rate`.
    pub fn cmdline(&self, rate: u64) -> String {
        format!(
            "case=migrate span_mib={SPAN_MIB} write_mib_s={rate} secs={SECS} tsc_khz={}",
            self.tsc_khz
        )
    }
}

/// One VMM's ways: exitless's `unix` and `local`, the others' `unix`.
fn ways(kind: VmmKind) -> &'static [Way] {
    match kind {
        VmmKind::Exitless => &[Way::Unix, Way::Local],
        _ => &[Way::Unix],
    }
}

/// A row's way and writing rate (MiB/s), and its rounds so far.
type RowRounds = ((Way, u64), Vec<MigrateRound>);

/// The case's rounds so far: per VMM of the plan that takes part, per way and rate, and the
/// error that stopped a VMM (a peer's is its rows'; exitless's ends the comparison).
pub struct Migrations {
    vmms: Vec<(Vmm, Vec<RowRounds>, Option<String>)>,
    tsc_khz: u64,
}

impl Migrations {
    pub fn new(plan: &Plan) -> Self {
        let vmms = plan
            .vmms
            .iter()
            .filter(|v| takes_part(v.kind))
            .map(|v| {
                let rows = ways(v.kind)
                    .iter()
                    .flat_map(|w| RATES.map(|r| ((*w, r), Vec::new())))
                    .collect();
                (v.clone(), rows, None)
            })
            .collect();
        let wanted = plan.cases.iter().any(|c| c == CASE);
        let tsc_khz = match wanted {
            true => vmm::profile::estimate_tsc_khz(Duration::from_millis(200)),
            false => 0,
        };
        Migrations { vmms, tsc_khz }
    }

    /// One round: every rate, every VMM and way, in turn.
    pub fn round(
        &mut self,
        plan: &Plan,
        round: u32,
        progress: &mut impl FnMut(&str),
        stop: &impl Fn() -> bool,
    ) -> Result<(), CompareError> {
        let setting = Setting {
            guest: &plan.guest,
            memory_mib: plan.memory_mib,
            tsc_khz: self.tsc_khz,
            dir: plan.workdir.join("migrate"),
            limit: plan.limit,
        };
        for rate in RATES {
            for (vmm, rows, failed) in &mut self.vmms {
                for ((way, r), rounds) in rows.iter_mut().filter(|(k, _)| k.1 == rate) {
                    if failed.is_some() {
                        continue;
                    }
                    if stop() {
                        return Err(CompareError::Stopped);
                    }
                    let name = vmm.kind.name();
                    let what = format!("{name} migrate {} write_mib_s={r}", way.name());
                    progress(&format!("round {round}/{}: {what}", plan.rounds));
                    match migrate_run::once(vmm, &setting, *way, *r) {
                        Ok(m) => rounds.push(m),
                        Err(e) if vmm.kind == VmmKind::Exitless => {
                            return Err(CompareError::Exitless {
                                case: CASE.into(),
                                source: Box::new(CompareError::Migrate(format!("{what}: {e}"))),
                            })
                        }
                        Err(e) => {
                            progress(&format!("{name}: migrate: {e}; left out"));
                            *failed = Some(e);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    pub fn rows(self) -> Vec<MigrateRow> {
        let mut out = Vec::new();
        for rate in RATES {
            for (vmm, rows, failed) in &self.vmms {
                for (key, rounds) in rows.iter().filter(|(k, _)| k.1 == rate) {
                    let name = vmm.kind.name();
                    out.push(MigrateRow::of(name, *key, rounds.clone(), failed.clone()));
                }
            }
        }
        out
    }
}

/// The value of `key=` in a guest line.
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// What the guest saw of one migration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GuestSeen {
    pub downtime_ms: f64,
    pub in_window: bool,
    pub from_start_ms: Option<f64>,
    pub noise_ms: f64,
    pub written_mib: u64,
}

/// Parses the guest's result line, once every page checked out (`ok=1`; else why not):
/// of its longest gaps, the longest that started within `window` (host TSC, when the
/// guest's TSC is the host's), else the longest of all.
pub fn guest_result(
    line: &str,
    tsc_khz: u64,
    window: Option<(u64, u64)>,
) -> Result<GuestSeen, String> {
    let num = |key: &str| field(line, key).and_then(|v| v.parse::<u64>().ok());
    if num("ok") != Some(1) {
        return Err(format!(
            "the guest's pages were not as it wrote them: {line}"
        ));
    }
    let lacks = || format!("the guest's result line lacks its figures: {line}");
    let top: Vec<(u64, u64)> = field(line, "top_gaps")
        .ok_or_else(lacks)?
        .split(',')
        .filter_map(|g| g.split_once('@'))
        .filter_map(|(c, at)| Some((c.parse().ok()?, at.parse().ok()?)))
        .collect();
    let written_mib = num("written_mib").ok_or_else(lacks)?;
    let ms = |cycles: u64| cycles as f64 / tsc_khz.max(1) as f64;
    let inside = |at: u64| window.is_some_and(|(from, to)| (from..=to).contains(&at));
    let longest = |keep: &dyn Fn(u64) -> bool| top.iter().filter(|g| keep(g.1)).map(|g| g.0).max();
    let (gap, in_window) = match longest(&inside) {
        Some(g) => (g, true),
        None => (longest(&|_| true).ok_or_else(lacks)?, false),
    };
    let from_start_ms = window.filter(|_| in_window).and_then(|(from, _)| {
        let at = top.iter().find(|g| g.0 == gap && inside(g.1))?.1;
        Some(ms(at - from))
    });
    Ok(GuestSeen {
        downtime_ms: ms(gap),
        in_window,
        from_start_ms,
        noise_ms: longest(&|at| in_window && !inside(at)).map_or(0.0, ms),
        written_mib,
    })
}

/// Whether the guest's TSC (`tsc=` of its loop line) is the host's `host_tsc` read when the
/// line came, within a second.
pub fn same_tsc(loop_line: &str, host_tsc: u64, tsc_khz: u64) -> bool {
    field(loop_line, "tsc")
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|g| g.abs_diff(host_tsc) < tsc_khz * 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(guest: f64, total: f64, sent: f64) -> MigrateRound {
        MigrateRound {
            guest_downtime_ms: guest,
            total_ms: total,
            sent_mib: sent,
            done_line: true,
            source_ended: true,
            ..MigrateRound::default()
        }
    }

    #[test]
    fn rows_take_medians_and_ratios_are_to_qemu_at_the_same_rate() {
        let e = MigrateRow::of(
            "exitless",
            (Way::Unix, 64),
            vec![
                round(2.0, 100.0, 128.0),
                round(4.0, 300.0, 130.0),
                round(3.0, 200.0, 129.0),
            ],
            None,
        );
        assert_eq!(e.guest_downtime_ms.median, 3.0);
        assert_eq!(e.total_ms.max, 300.0);
        assert!(e.reported_downtime_ms.is_none());
        let q = MigrateRow::of(
            "qemu",
            (Way::Unix, 64),
            vec![round(30.0, 400.0, 140.0)],
            None,
        );
        let q0 = MigrateRow::of("qemu", (Way::Unix, 0), vec![round(1.0, 1.0, 1.0)], None);
        let ch = MigrateRow::of(
            "cloud-hypervisor",
            (Way::Unix, 64),
            Vec::new(),
            Some("x".into()),
        );
        let rows = [e.clone(), q0, q, ch.clone()];
        let down = e.ratio_to_qemu(&rows, |r| r.guest_downtime_ms.median);
        assert_eq!(down, Some(0.1));
        assert_eq!(e.ratio_to_qemu(&rows, |r| r.total_ms.median), Some(0.5));
        assert_eq!(ch.ratio_to_qemu(&rows, |r| r.total_ms.median), None);
    }

    #[test]
    fn the_guest_downtime_is_its_longest_gap_in_the_migration_s_window() {
        let ok = "EXITLESS RESULT case=migrate cpl=3 iters=1000 span_mib=128 write_mib_s=64 \
                  loops=9 written_mib=319 max_gap_cycles=9000 max_gap_us=9 max_gap_at_ms=652 \
                  gaps_over_1ms=62 top_gaps=9000@100,5000@2000,3000@2500,1000@50 bad=0 ok=1";
        let seen = |window| guest_result(ok, 1000, window).unwrap();
        let s = seen(Some((1500, 3000)));
        assert_eq!((s.downtime_ms, s.in_window, s.noise_ms), (5.0, true, 9.0));
        assert_eq!(s.from_start_ms, Some(0.5));
        assert_eq!(s.written_mib, 319);
        let s = seen(Some((4000, 5000)));
        assert_eq!((s.downtime_ms, s.in_window, s.noise_ms), (9.0, false, 0.0));
        assert_eq!(seen(None).downtime_ms, 9.0);
        let bad = ok.replace("bad=0 ok=1", "bad=3 ok=0");
        let e = guest_result(&bad, 1000, None).unwrap_err();
        assert!(e.contains("not as it wrote"), "{e}");
        assert!(guest_result("EXITLESS RESULT case=migrate ok=1", 1000, None).is_err());
        let line = "EXITLESS MIGRATE loop span_mib=1 write_mib_s=0 tsc=5000000";
        assert!(same_tsc(line, 5_500_000, 1000) && !same_tsc(line, 7_000_000, 1000));
    }

    #[test]
    fn exitless_has_unix_and_local_rows_qemu_and_cloud_hypervisor_unix_only() {
        assert_eq!(ways(VmmKind::Exitless), [Way::Unix, Way::Local]);
        assert_eq!(ways(VmmKind::Qemu), [Way::Unix]);
        assert!(takes_part(VmmKind::CloudHypervisor));
        assert!(!takes_part(VmmKind::Firecracker) && !takes_part(VmmKind::Floor));
    }
}
