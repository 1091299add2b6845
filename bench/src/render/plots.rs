//! SVG line charts with plotters (SVG backend only: no system font or image libraries needed),
//! and which charts each scenario's result makes.

use std::path::Path;

use plotters::prelude::*;

use crate::floor::Stack;
use crate::results::{Outcome, Section};
use crate::scenarios::overhead::{Case, CaseResult};
use crate::{Error, Result};

/// Draws the charts of `section` into `dir` as `<stem>-<name>.svg`; returns the file names.
pub fn for_section(section: &Section, dir: &Path, stem: &str) -> Result<Vec<String>> {
    let mut files = Vec::new();
    let mut draw = |name: &str, chart: Chart<'_>, series: Vec<Series>| -> Result<()> {
        let file = format!("{stem}-{name}.svg");
        line_chart(&dir.join(&file), &chart, &series)?;
        files.push(file);
        Ok(())
    };
    match &section.outcome {
        Some(Outcome::Overhead(r)) => {
            let singles: Vec<&CaseResult> = r.cases.iter().filter(|c| matches!(c.case, Case::Single { .. })).collect();
            let tokens = |c: &CaseResult| match c.case {
                Case::Single { tokens } => tokens as f64,
                Case::Info | Case::Concurrent { .. } => f64::NAN,
            };
            let line = |name: &str, side: fn(&CaseResult) -> &[crate::scenarios::Sample]| Series {
                name: name.into(),
                points: singles.iter().map(|c| (tokens(c), CaseResult::p50_ms(side(c)))).collect(),
            };
            let mut series = vec![line("direct", |c| &c.direct), line("multiplexer", |c| &c.mux)];
            if singles.iter().all(|c| !c.floor.is_empty()) {
                series.push(line(Stack::Tonic.label(), |c| &c.floor));
            }
            if singles.iter().all(|c| !c.floors.floor_h2.is_empty()) {
                series.push(line(Stack::H2.label(), |c| &c.floors.floor_h2));
            }
            if singles.iter().all(|c| !c.floors.haproxy_tcp.is_empty() && !c.floors.haproxy_h2.is_empty()) {
                series.push(line("HAProxy TCP", |c| &c.floors.haproxy_tcp));
                series.push(line("HAProxy h2", |c| &c.floors.haproxy_h2));
            }
            let chart = Chart {
                title: "Single-request p50 latency, ~1 ms backend",
                x_label: "input tokens",
                y_label: "p50 latency (ms)",
                log_y: false,
                log_x: true,
            };
            draw("overhead", chart, series)?;
        }
        Some(Outcome::Overload(r)) => {
            let series = |f: &dyn Fn(&teifleet_load::Report) -> f64| {
                vec![
                    Series {
                        name: "direct (TEI's own admission)".into(),
                        points: r.rows.iter().map(|row| (row.factor, f(&row.direct))).collect(),
                    },
                    Series {
                        name: "through the multiplexer".into(),
                        points: r.rows.iter().map(|row| (row.factor, f(&row.mux))).collect(),
                    },
                ]
            };
            let latency = Chart {
                title: "p99 latency of OK answers vs offered load",
                x_label: "offered load (× measured capacity)",
                y_label: "p99 latency (ms)",
                log_y: true,
                log_x: true,
            };
            draw("overload-latency", latency, series(&|x| x.latency_ok.p99_ms))?;
            let goodput = Chart {
                title: "Goodput (OK within the 1 s deadline) vs offered load",
                x_label: "offered load (× measured capacity)",
                y_label: "goodput / capacity",
                log_y: false,
                log_x: true,
            };
            draw("overload-goodput", goodput, series(&|x| x.goodput_rps / r.capacity.rps))?;
        }
        Some(Outcome::AdaptiveLimit(r)) => super::admission::plots(r, dir, stem, &mut files)?,
        _ => {}
    }
    Ok(files)
}

/// One line of a chart.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

pub struct Chart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    /// Logarithmic y axis (latencies spanning orders of magnitude).
    pub log_y: bool,
    pub log_x: bool,
}

const COLORS: [RGBColor; 4] =
    [RGBColor(31, 119, 180), RGBColor(214, 39, 40), RGBColor(44, 160, 44), RGBColor(148, 103, 189)];

fn bounds(values: impl Iterator<Item = f64>, log: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| v.is_finite() && (!log || *v > 0.0)) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (if log { 0.1 } else { 0.0 }, 1.0);
    }
    if log {
        (lo / 1.5, hi * 1.5)
    } else {
        let pad = ((hi - lo) * 0.08).max(hi.abs() * 0.05).max(1e-9);
        ((lo - pad).min(0.0_f64.max(lo - pad)), hi + pad)
    }
}

/// Draws `series` to an SVG file at `path`.
pub fn line_chart(path: &Path, chart: &Chart<'_>, series: &[Series]) -> Result<()> {
    let fail = |e: &dyn std::fmt::Display| Error::Plot { path: path.into(), message: e.to_string() };
    let xs = bounds(series.iter().flat_map(|s| s.points.iter().map(|p| p.0)), chart.log_x);
    let ys = bounds(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)), chart.log_y);
    let root = SVGBackend::new(path, (820, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut builder = ChartBuilder::on(&root);
    builder.caption(chart.title, ("sans-serif", 20)).margin(14).x_label_area_size(44).y_label_area_size(70);
    // The four axis combinations are different types in plotters, hence the macro.
    macro_rules! draw {
        ($x:expr, $y:expr) => {{
            let mut ctx = builder.build_cartesian_2d($x, $y).map_err(|e| fail(&e))?;
            ctx.configure_mesh()
                .x_desc(chart.x_label)
                .y_desc(chart.y_label)
                .label_style(("sans-serif", 13))
                .light_line_style(RGBColor(245, 245, 245))
                .draw()
                .map_err(|e| fail(&e))?;
            for (i, s) in series.iter().enumerate() {
                let color = COLORS[i % COLORS.len()];
                let points: Vec<(f64, f64)> = s
                    .points
                    .iter()
                    .copied()
                    .filter(|p| p.0.is_finite() && p.1.is_finite() && (!chart.log_y || p.1 > 0.0))
                    .collect();
                ctx.draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                    .map_err(|e| fail(&e))?
                    .label(s.name.clone())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
                ctx.draw_series(points.into_iter().map(|p| Circle::new(p, 3, color.filled()))).map_err(|e| fail(&e))?;
            }
            ctx.configure_series_labels()
                .border_style(BLACK)
                .background_style(WHITE.mix(0.85))
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(|e| fail(&e))?;
        }};
    }
    match (chart.log_x, chart.log_y) {
        (false, false) => draw!(xs.0..xs.1, ys.0..ys.1),
        (false, true) => draw!(xs.0..xs.1, (ys.0..ys.1).log_scale()),
        (true, false) => draw!((xs.0..xs.1).log_scale(), ys.0..ys.1),
        (true, true) => draw!((xs.0..xs.1).log_scale(), (ys.0..ys.1).log_scale()),
    }
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_an_svg_with_the_series_names() {
        let dir = std::env::temp_dir().join(format!("teifleet-bench-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("chart.svg");
        let series = vec![
            Series { name: "direct".into(), points: vec![(0.5, 10.0), (1.0, 20.0), (10.0, 1000.0)] },
            Series { name: "multiplexer".into(), points: vec![(0.5, 11.0), (1.0, 21.0), (10.0, 0.0)] },
        ];
        let chart = Chart { title: "p99", x_label: "load", y_label: "ms", log_y: true, log_x: true };
        line_chart(&path, &chart, &series).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("multiplexer"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bounds_pad_and_ignore_non_positive_on_log_axes() {
        let (lo, hi) = bounds([0.0, 10.0, 100.0].into_iter(), true);
        assert!(lo > 0.0 && lo < 10.0 && hi > 100.0);
        assert_eq!(bounds(std::iter::empty(), false), (0.0, 1.0));
    }
}
