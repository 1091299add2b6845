//! SVG line charts with plotters (SVG backend only: no system font or image libraries needed).
//! Which charts a scenario draws is its [`super::Render::plots`].

use std::path::Path;

use plotters::prelude::*;

use crate::{Error, Result};

/// The charts of one section: each is drawn into `dir` as `<stem>-<name>.svg`, and its file name
/// kept for the Markdown to link.
pub struct Plots<'a> {
    dir: &'a Path,
    stem: &'a str,
    pub files: Vec<String>,
}

impl<'a> Plots<'a> {
    pub fn new(dir: &'a Path, stem: &'a str) -> Self {
        Self { dir, stem, files: Vec::new() }
    }

    pub fn draw(&mut self, name: &str, chart: Chart<'_>, series: Vec<Series>) -> Result<()> {
        let file = format!("{}-{name}.svg", self.stem);
        line_chart(&self.dir.join(&file), &chart, &series)?;
        self.files.push(file);
        Ok(())
    }
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
