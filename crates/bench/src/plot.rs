//! SVG plots with plotters: throughput versus threads (one line per engine, one panel per
//! workload), or a horizontal bar chart per workload when only one thread count was run; and a
//! generic line chart for reproductions.

use std::collections::BTreeSet;
use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{BenchError, Result};
use crate::report::{Report, RunResult};

const WIDTH: u32 = 960;
const PANEL_HEIGHT: u32 = 440;

fn plot_err(path: &Path) -> impl Fn(String) -> BenchError + '_ {
    move |message| BenchError::Plot { path: path.to_path_buf(), message }
}

fn color(i: usize) -> RGBColor {
    // A colour-blind-friendly palette (Okabe–Ito), then plotters' Palette99.
    const BASE: [RGBColor; 8] = [
        RGBColor(0, 114, 178),
        RGBColor(230, 159, 0),
        RGBColor(0, 158, 115),
        RGBColor(213, 94, 0),
        RGBColor(204, 121, 167),
        RGBColor(86, 180, 233),
        RGBColor(120, 120, 120),
        RGBColor(240, 228, 66),
    ];
    if i < BASE.len() {
        BASE[i]
    } else {
        let c = Palette99::pick(i).to_rgba();
        RGBColor(c.0, c.1, c.2)
    }
}

/// The engines of `runs` in first-seen order.
fn engines(runs: &[&RunResult]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in runs {
        if !out.contains(&r.engine) {
            out.push(r.engine.clone());
        }
    }
    out
}

/// Draws the throughput of `report` to `path` (SVG), one panel per workload.
///
/// # Errors
///
/// [`BenchError::Plot`] if the report has no runs or drawing fails, [`BenchError::Io`] if the
/// parent directory cannot be created.
pub fn throughput_svg(report: &Report, path: &Path) -> Result<()> {
    let err = plot_err(path);
    let mut workloads: Vec<&str> = Vec::new();
    for r in &report.runs {
        if !workloads.contains(&r.workload.as_str()) {
            workloads.push(&r.workload);
        }
    }
    if workloads.is_empty() {
        return Err(err("no runs to plot".into()));
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
    }
    let root =
        SVGBackend::new(path, (WIDTH, PANEL_HEIGHT * workloads.len() as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let panels = root.split_evenly((workloads.len(), 1));
    for (panel, w) in panels.iter().zip(&workloads) {
        let runs: Vec<&RunResult> = report.runs.iter().filter(|r| r.workload == *w).collect();
        let threads: BTreeSet<usize> = runs.iter().map(|r| r.threads).collect();
        if threads.len() > 1 {
            lines_panel(panel, w, &runs).map_err(&err)?;
        } else {
            bars_panel(panel, w, &runs).map_err(&err)?;
        }
    }
    root.present().map_err(|e| err(e.to_string()))
}

fn setup_note(runs: &[&RunResult]) -> String {
    runs.first().map_or(String::new(), |r| {
        format!(
            "{} nodes ({}), {}, latency {}, {}",
            r.nodes, r.placement, r.persist, r.latency, r.dist
        )
    })
}

fn lines_panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    workload: &str,
    runs: &[&RunResult],
) -> Result<(), String> {
    let e = |x: &dyn std::fmt::Display| x.to_string();
    let x_max = runs.iter().map(|r| r.threads).max().unwrap_or(1) as u32;
    let y_max = runs.iter().map(|r| r.throughput_mops).fold(0.0, f64::max).max(1e-3) * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("{workload}: throughput vs threads — {}", setup_note(runs)),
            ("sans-serif", 18),
        )
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(0u32..x_max + 1, 0f64..y_max)
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("worker threads")
        .y_desc("throughput (million ops/s)")
        .x_labels((x_max + 2).min(17) as usize)
        .y_label_formatter(&|y| format!("{y:.2}"))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .draw()
        .map_err(|x| e(&x))?;
    for (i, engine) in engines(runs).iter().enumerate() {
        let c = color(i);
        let mut pts: Vec<(u32, f64)> = runs
            .iter()
            .filter(|r| &r.engine == engine)
            .map(|r| (r.threads as u32, r.throughput_mops))
            .collect();
        pts.sort_by_key(|p| p.0);
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
            .map_err(|x| e(&x))?
            .label(engine.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 22, y)], c.stroke_width(2)));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled()))).map_err(|x| e(&x))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|x| e(&x))
}

fn bars_panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    workload: &str,
    runs: &[&RunResult],
) -> Result<(), String> {
    let e = |x: &dyn std::fmt::Display| x.to_string();
    let names = engines(runs);
    let n = names.len() as u32;
    let x_max = runs.iter().map(|r| r.throughput_mops).fold(0.0, f64::max).max(1e-3) * 1.3;
    let threads = runs.first().map_or(0, |r| r.threads);
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("{workload}: throughput at {threads} threads — {}", setup_note(runs)),
            ("sans-serif", 18),
        )
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(170)
        .build_cartesian_2d(0f64..x_max, (0u32..n.saturating_sub(1)).into_segmented())
        .map_err(|x| e(&x))?;
    let labels = names.clone();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .light_line_style(WHITE.mix(0.0))
        .x_desc("throughput (million ops/s)")
        .y_desc("engine")
        .y_labels(n as usize + 1)
        .y_label_formatter(&move |v| match v {
            // The first engine is drawn on top.
            SegmentValue::CenterOf(i) => (labels.len() as u32)
                .checked_sub(i + 1)
                .and_then(|j| labels.get(j as usize).cloned())
                .unwrap_or_default(),
            _ => String::new(),
        })
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .draw()
        .map_err(|x| e(&x))?;
    for (i, engine) in names.iter().enumerate() {
        let c = color(i);
        let v: f64 = runs.iter().filter(|r| &r.engine == engine).map(|r| r.throughput_mops).sum();
        let i = n - 1 - i as u32;
        let mut bar = Rectangle::new(
            [(0.0, SegmentValue::Exact(i)), (v, SegmentValue::Exact(i + 1))],
            c.filled(),
        );
        bar.set_margin(6, 6, 0, 0);
        chart
            .draw_series(std::iter::once(bar))
            .map_err(|x| e(&x))?
            .label(engine.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
        chart
            .draw_series(std::iter::once(Text::new(
                format!(" {v:.3}"),
                (v, SegmentValue::CenterOf(i)),
                ("sans-serif", 13),
            )))
            .map_err(|x| e(&x))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(|x| e(&x))
}

/// A labelled series of `(x, y)` points.
pub type Series = (String, Vec<(f64, f64)>);

/// A line chart of `series` (e.g. recovery time vs keys) with axis descriptions and a legend.
///
/// # Errors
///
/// [`BenchError::Plot`] if there is nothing to draw or drawing fails.
pub fn lines_svg(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
) -> Result<()> {
    let err = plot_err(path);
    let pts = series.iter().flat_map(|s| s.1.iter());
    let (x_max, y_max) = pts.fold((0.0f64, 0.0f64), |(a, b), &(x, y)| (a.max(x), b.max(y)));
    if series.iter().all(|s| s.1.is_empty()) {
        return Err(err("no points to plot".into()));
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
    }
    let root = SVGBackend::new(path, (WIDTH, PANEL_HEIGHT)).into_drawing_area();
    let draw = || -> Result<(), String> {
        let e = |x: &dyn std::fmt::Display| x.to_string();
        root.fill(&WHITE).map_err(|x| e(&x))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(72)
            .build_cartesian_2d(0f64..x_max.max(1e-9) * 1.05, 0f64..y_max.max(1e-9) * 1.15)
            .map_err(|x| e(&x))?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 15))
            .draw()
            .map_err(|x| e(&x))?;
        for (i, (name, pts)) in series.iter().enumerate() {
            let c = color(i);
            chart
                .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
                .map_err(|x| e(&x))?
                .label(name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 22, y)], c.stroke_width(2))
                });
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))
                .map_err(|x| e(&x))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()
            .map_err(|x| e(&x))?;
        root.present().map_err(|x| e(&x))
    };
    draw().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_engine_bars_and_generic_lines_draw() {
        let dir = tempfile::tempdir().unwrap();
        let report = Report {
            runs: vec![RunResult {
                engine: "solo".into(),
                workload: "w".into(),
                threads: 4,
                throughput_mops: 2.5,
                ..RunResult::default()
            }],
            failures: Vec::new(),
        };
        let bars = dir.path().join("sub/bars.svg");
        throughput_svg(&report, &bars).unwrap();
        let svg = std::fs::read_to_string(&bars).unwrap();
        assert!(
            svg.contains("solo")
                && svg.contains("2.500")
                && svg.contains("throughput at 4 threads")
        );
        assert!(throughput_svg(&Report::default(), &bars).is_err());

        let lines = dir.path().join("lines.svg");
        let series = vec![
            ("a".to_owned(), vec![(1.0, 2.0), (2.0, 3.0)]),
            ("b".to_owned(), vec![(1.0, 1.0)]),
        ];
        lines_svg(&lines, "title", "keys loaded", "recovery time (ms)", &series).unwrap();
        let svg = std::fs::read_to_string(&lines).unwrap();
        for needle in ["keys loaded", "recovery time (ms)", "title", "\na\n", "\nb\n"] {
            assert!(svg.contains(needle), "{needle:?}");
        }
        assert!(lines_svg(&lines, "t", "x", "y", &[]).is_err());
    }
}
