//! `exitless-chart REPORT.json FILE.svg`: draws `exitless compare --json`'s report at a glance
//! (plotters, SVG); `exitless compare --chart` runs it. Three panels: wall time per iteration
//! by case (bar: median, line: min to max), time to the guest's first line (each bar labelled
//! with its ratio to the floor VMM's), and memory beyond guest RAM, one colour per VMM. A
//! `compare --density` report is drawn as curves over N instead (density.rs).
//! `exitless-chart --check` says whether a chart can be drawn.
//!
//! A program of its own so that the VMM binary carries no plotting library: all of a VMM
//! binary's text ends up resident in every VM it runs.

mod density;

use std::path::Path;

use anyhow::{anyhow, bail, Context};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{register_font, FontStyle};
use serde_json::Value;

/// Fonts tried for the labels (plotters measures text with a TrueType font).
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// One per VMM in the report's order: exitless, the peers, the floor VMM last (grey).
const COLOURS: [RGBColor; 5] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x7f, 0x7f, 0x7f),
];

pub(crate) fn colour(vmm: &str, index: usize) -> RGBColor {
    match vmm {
        "floor" => COLOURS[4],
        _ => COLOURS[index % 4],
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.as_slice() {
        [check] if check == "--check" => prepare(),
        [report, svg] => prepare().and_then(|()| draw_file(Path::new(report), Path::new(svg))),
        _ => Err(anyhow!(
            "usage: exitless-chart REPORT.json FILE.svg | exitless-chart --check"
        )),
    };
    if let Err(e) = result {
        eprintln!("exitless-chart: {e:#}");
        std::process::exit(1);
    }
}

/// Registers the labels' font, or says which to install.
fn prepare() -> anyhow::Result<()> {
    let path = FONTS
        .iter()
        .find(|p| Path::new(p).exists())
        .ok_or_else(|| {
            anyhow!("a chart needs a TrueType font for its labels: install fonts-dejavu-core")
        })?;
    let bytes = std::fs::read(path).with_context(|| format!("Cannot read {path}"))?;
    register_font(
        "sans-serif",
        FontStyle::Normal,
        Box::leak(bytes.into_boxed_slice()),
    )
    .map_err(|_| anyhow!("{path} is not a usable TrueType font"))
}

fn draw_file(report: &Path, svg: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(report)
        .with_context(|| format!("Cannot read {}", report.display()))?;
    let report: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", report.display()))?;
    match report["schema"].as_str() {
        Some("exitless.compare/2") => draw(svg, &report),
        Some("exitless.density/1") => density::draw(svg, &report),
        _ => bail!(
            "not an exitless compare report (schema exitless.compare/2 or exitless.density/1)"
        ),
    }
}

/// min, median and max of one figure.
#[derive(Clone, Copy)]
struct Spread {
    min: f64,
    median: f64,
    max: f64,
}

impl Spread {
    fn of(v: &Value, scale: f64) -> Option<Spread> {
        Some(Spread {
            min: v["min"].as_f64()? * scale,
            median: v["median"].as_f64()? * scale,
            max: v["max"].as_f64()? * scale,
        })
    }
}

/// One bar per (group, VMM).
struct Panel {
    title: &'static str,
    groups: Vec<String>,
    /// [group][vmm]
    values: Vec<Vec<Option<Spread>>>,
    /// A label above each bar, [group][vmm] (the first line's ratio to the floor).
    labels: Vec<Vec<Option<String>>>,
    /// Each VMM's colour.
    colours: Vec<RGBColor>,
}

/// The VMMs with figures, and the cases of the first.
fn shown(report: &Value) -> (Vec<&Value>, Vec<String>) {
    let vmms: Vec<&Value> = report["vmms"]
        .as_array()
        .map(|v| {
            v.iter()
                .filter(|v| v["cases"].as_array().is_some_and(|c| !c.is_empty()))
                .collect()
        })
        .unwrap_or_default();
    let cases = vmms
        .first()
        .and_then(|v| v["cases"].as_array())
        .map(|c| {
            c.iter()
                .filter_map(|c| c["case"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    (vmms, cases)
}

fn figure(vmm: &Value, case: &str, key: &str, scale: f64) -> Option<Spread> {
    let cases = vmm["cases"].as_array()?;
    let c = cases.iter().find(|c| c["case"] == case)?;
    Spread::of(&c[key], scale)
}

/// The first case's ratio of each VMM's first line to the floor's, as a label.
fn floor_labels(vmms: &[&Value], case: &str) -> Vec<Vec<Option<String>>> {
    let label = |v: &&Value| {
        let cases = v["cases"].as_array()?;
        let c = cases.iter().find(|c| c["case"] == case)?;
        Some(format!("{:.2}x", c["first_line_ratio_to_floor"].as_f64()?))
    };
    vec![vmms.iter().map(label).collect()]
}

fn panels(vmms: &[&Value], cases: &[String]) -> [Panel; 3] {
    let per_case = |key: &str| -> Vec<Vec<Option<Spread>>> {
        cases
            .iter()
            .map(|case| vmms.iter().map(|v| figure(v, case, key, 1.0)).collect())
            .collect()
    };
    let first = cases.first().map_or("", String::as_str);
    let once = |key: &str, scale: f64| -> Vec<Vec<Option<Spread>>> {
        vec![vmms.iter().map(|v| figure(v, first, key, scale)).collect()]
    };
    let colours: Vec<RGBColor> = vmms
        .iter()
        .enumerate()
        .map(|(i, v)| colour(v["vmm"].as_str().unwrap_or(""), i))
        .collect();
    let panel = |title, groups, values| Panel {
        title,
        groups,
        values,
        labels: Vec::new(),
        colours: colours.clone(),
    };
    [
        panel(
            "wall µs per iteration (start-up cancelled)",
            cases.to_vec(),
            per_case("wall_per_iter_us"),
        ),
        Panel {
            labels: floor_labels(vmms, first),
            ..panel(
                "ms to the guest's first line (x floor)",
                vec![String::new()],
                once("first_line_ms", 1.0),
            )
        },
        panel(
            "MiB beyond guest memory",
            vec![String::new()],
            once("rss_beyond_guest_kib", 1.0 / 1024.0),
        ),
    ]
}

fn draw(path: &Path, report: &Value) -> anyhow::Result<()> {
    let (vmms, cases) = shown(report);
    let root = SVGBackend::new(path, (1200, 460)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let (title, body) = root.split_vertically(40);
    let heading = format!(
        "exitless compare: {} rounds, {} iterations, 1 vCPU, {} MiB",
        report["rounds"], report["iterations"][1], report["memory_mib"]
    );
    title
        .titled(&heading, ("sans-serif", 20))
        .map_err(draw_error)?;
    let (body, legend) = body.split_vertically(380);
    for (panel, area) in panels(&vmms, &cases)
        .iter()
        .zip(body.split_evenly((1, 3)).iter())
    {
        draw_panel(area, panel)?;
    }
    for (i, name) in vmms.iter().filter_map(|v| v["vmm"].as_str()).enumerate() {
        let x = 40 + 200 * i as i32;
        let swatch = Rectangle::new([(x, 10), (x + 16, 26)], colour(name, i).filled());
        legend.draw(&swatch).map_err(draw_error)?;
        let label = Text::new(name.to_string(), (x + 22, 10), ("sans-serif", 16));
        legend.draw(&label).map_err(draw_error)?;
    }
    root.present().map_err(draw_error)
}

fn draw_panel(area: &DrawingArea<SVGBackend, Shift>, panel: &Panel) -> anyhow::Result<()> {
    let vmms = panel.values.first().map_or(0, Vec::len).max(1);
    let top = panel
        .values
        .iter()
        .flatten()
        .flatten()
        .map(|s| s.max)
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.15;
    let groups = panel.groups.len().max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(panel.title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(28)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..groups as f64, 0f64..top)
        .map_err(draw_error)?;
    let labels = panel.groups.clone();
    let label_at = move |x: &f64| {
        let i = x.floor() as usize;
        let centred = (x - x.floor() - 0.5).abs() < 1e-6;
        if centred {
            labels.get(i).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(groups * 2 + 1)
        .x_label_formatter(&label_at)
        .draw()
        .map_err(draw_error)?;
    let width = 0.8 / vmms as f64;
    for (g, row) in panel.values.iter().enumerate() {
        for (v, value) in row.iter().enumerate() {
            let Some(s) = value else { continue };
            let bar = Bar {
                group: g,
                vmm: v,
                width,
                top,
            };
            draw_bar(&mut chart, panel, &bar, s)?;
        }
    }
    Ok(())
}

/// Where one VMM's bar of a group goes: its group, its place in the group, the bars' width
/// and the panel's top value.
struct Bar {
    group: usize,
    vmm: usize,
    width: f64,
    top: f64,
}

type PanelChart<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// One bar: the median, a line from min to max, the value's label above it.
fn draw_bar(chart: &mut PanelChart, panel: &Panel, bar: &Bar, s: &Spread) -> anyhow::Result<()> {
    let (g, v, width) = (bar.group, bar.vmm, bar.width);
    let x0 = g as f64 + 0.1 + width * v as f64;
    let rect = Rectangle::new(
        [(x0, 0.0), (x0 + width * 0.9, s.median.max(0.0))],
        panel.colours.get(v).unwrap_or(&COLOURS[v % 4]).filled(),
    );
    let mid = x0 + width * 0.45;
    let range = PathElement::new(
        vec![(mid, s.min.max(0.0)), (mid, s.max.max(0.0))],
        BLACK.stroke_width(2),
    );
    chart.draw_series([rect]).map_err(draw_error)?;
    chart.draw_series([range]).map_err(draw_error)?;
    let label = panel
        .labels
        .get(g)
        .and_then(|l| l.get(v))
        .cloned()
        .flatten();
    if let Some(label) = label {
        let at = (x0, s.max.max(s.median).max(0.0) + bar.top * 0.02);
        let style =
            TextStyle::from(("sans-serif", 12).into_font()).pos(Pos::new(HPos::Left, VPos::Bottom));
        chart
            .draw_series([Text::new(label, at, style)])
            .map_err(draw_error)?;
    }
    Ok(())
}

pub(crate) fn draw_error<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("Cannot draw the chart: {e:?}")
}
