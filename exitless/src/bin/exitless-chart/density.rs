//! A `compare --density` report as curves over N, one line per VMM: the time until all N VMs
//! printed their first line, each VM's own start, private dirty memory, peak RSS (those four
//! on a log scale: QEMU's are 10-100 times the others'), and the host CPU and wake-ups of an
//! idle VM (medians over the N VMs).

use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::Value;

use super::{colour, draw_error};

/// One panel: a title, where its value is in a run, and whether its scale is logarithmic.
struct Curve {
    title: &'static str,
    value: fn(&Value) -> Option<f64>,
    log: bool,
}

const CURVES: [Curve; 6] = [
    Curve {
        title: "ms until all N printed their first line",
        value: |r| r["all_started_ms"].as_f64(),
        log: true,
    },
    Curve {
        title: "ms from a VM's spawn to its first line",
        value: |r| r["summary"]["start_ms"]["median"].as_f64(),
        log: true,
    },
    Curve {
        title: "private dirty kB per VM",
        value: |r| r["summary"]["private_dirty_kib"]["median"].as_f64(),
        log: true,
    },
    Curve {
        title: "peak RSS kB per VM",
        value: |r| r["summary"]["peak_rss_kib"]["median"].as_f64(),
        log: true,
    },
    Curve {
        title: "host CPU µs per second per idle VM",
        value: |r| r["summary"]["idle_cpu_us_per_s"]["median"].as_f64(),
        log: false,
    },
    Curve {
        title: "wake-ups per second per idle VM",
        value: |r| r["summary"]["idle_wakeups_per_s"]["median"].as_f64(),
        log: false,
    },
];

/// The VMMs in the order they first appear, each with its (N, run) points.
fn series(report: &Value) -> Vec<(String, Vec<(f64, &Value)>)> {
    let mut out: Vec<(String, Vec<(f64, &Value)>)> = Vec::new();
    let runs = report["runs"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    for run in runs.iter().filter(|r| r["failed"].is_null()) {
        let (Some(vmm), Some(n)) = (run["vmm"].as_str(), run["n"].as_f64()) else {
            continue;
        };
        match out.iter_mut().find(|(name, _)| name == vmm) {
            Some((_, points)) => points.push((n, run)),
            None => out.push((vmm.to_string(), vec![(n, run)])),
        }
    }
    out
}

pub fn draw(path: &Path, report: &Value) -> anyhow::Result<()> {
    let series = series(report);
    let root = SVGBackend::new(path, (1200, 760)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let (title, body) = root.split_vertically(40);
    let heading = format!(
        "exitless compare --density: N VMs at once, {} MiB and 1 vCPU each, idle {} s",
        report["memory_mib"], report["idle_s"]
    );
    title
        .titled(&heading, ("sans-serif", 20))
        .map_err(draw_error)?;
    let (body, legend) = body.split_vertically(680);
    let max_n = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(n, _)| *n))
        .fold(1.0f64, f64::max);
    for (curve, area) in CURVES.iter().zip(body.split_evenly((2, 3)).iter()) {
        draw_curve(area, curve, &series, max_n)?;
    }
    for (i, (name, _)) in series.iter().enumerate() {
        let x = 40 + 200 * i as i32;
        let swatch = Rectangle::new([(x, 10), (x + 16, 26)], colour(name, i).filled());
        legend.draw(&swatch).map_err(draw_error)?;
        let label = Text::new(name.clone(), (x + 22, 10), ("sans-serif", 16));
        legend.draw(&label).map_err(draw_error)?;
    }
    root.present().map_err(draw_error)
}

fn draw_curve(
    area: &DrawingArea<SVGBackend, Shift>,
    curve: &Curve,
    series: &[(String, Vec<(f64, &Value)>)],
    max_n: f64,
) -> anyhow::Result<()> {
    let values = series
        .iter()
        .flat_map(|(_, p)| p.iter().filter_map(|(_, r)| (curve.value)(r)));
    let (low, high) = values.fold((f64::MAX, 0.0f64), |(l, h), v| (l.min(v), h.max(v)));
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(curve.title, ("sans-serif", 15))
        .margin(12)
        .x_label_area_size(28)
        .y_label_area_size(56);
    let x = 0f64..max_n * 1.05;
    if curve.log && low > 0.0 && low < f64::MAX {
        let y = (low * 0.7..high * 1.5).log_scale();
        let mut chart = builder.build_cartesian_2d(x, y).map_err(draw_error)?;
        chart
            .configure_mesh()
            .x_desc("N")
            .draw()
            .map_err(draw_error)?;
        draw_lines(&mut chart, curve, series)
    } else {
        let y = 0f64..high.max(1e-9) * 1.15;
        let mut chart = builder.build_cartesian_2d(x, y).map_err(draw_error)?;
        chart
            .configure_mesh()
            .x_desc("N")
            .draw()
            .map_err(draw_error)?;
        draw_lines(&mut chart, curve, series)
    }
}

/// One line with its points per VMM.
fn draw_lines<Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<SVGBackend, Cartesian2d<RangedCoordf64, Y>>,
    curve: &Curve,
    series: &[(String, Vec<(f64, &Value)>)],
) -> anyhow::Result<()> {
    for (i, (name, points)) in series.iter().enumerate() {
        let style = colour(name, i);
        let line: Vec<(f64, f64)> = points
            .iter()
            .filter_map(|(n, r)| Some((*n, (curve.value)(r)?)))
            .collect();
        chart
            .draw_series([PathElement::new(line.clone(), style.stroke_width(2))])
            .map_err(draw_error)?;
        chart
            .draw_series(line.iter().map(|p| Circle::new(*p, 3, style.filled())))
            .map_err(draw_error)?;
    }
    Ok(())
}
