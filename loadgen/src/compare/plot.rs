//! Interactivity versus throughput per GPU, one series per serving mode (SVG).
//!
//! The usual way to compare serving setups: each run at one offered load is a point
//! (x = median interactivity in tokens/s/user, y = tokens/s per GPU); a mode's points across
//! loads trace its trade-off curve, and a curve further up and to the right is better.

use std::collections::BTreeMap;

use plotters::prelude::*;

use crate::report::RunReport;

/// Which throughput goes on the y axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThroughputKind {
    /// Input + output tokens/s per GPU.
    Total,
    /// Output tokens/s per GPU.
    Output,
    /// Goodput per GPU: requests/s meeting the SLOs ÷ GPUs.
    GoodputPerGpu,
}

/// Errors drawing a plot.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// No run has both an interactivity and a throughput value.
    #[error("no run has an ITL measurement to plot")]
    NoPoints,
    /// The drawing backend failed.
    #[error("drawing failed: {0}")]
    Drawing(String),
}

/// Series colours, cycled by mode.
const COLOURS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
];

/// (x, y) points per mode (runs without a mode are grouped under their label), sorted by x.
pub fn points_by_mode(
    runs: &[RunReport],
    kind: ThroughputKind,
) -> BTreeMap<String, Vec<(f64, f64)>> {
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in runs {
        let Some(x) = r.interactivity.p50.filter(|x| x.is_finite()) else {
            continue;
        };
        let y = match kind {
            ThroughputKind::Total => r.throughput.total_tokens_per_s_per_gpu,
            ThroughputKind::Output => r.throughput.output_tokens_per_s_per_gpu,
            ThroughputKind::GoodputPerGpu => {
                r.goodput.requests_per_s / f64::from(r.meta.gpus.max(1))
            }
        };
        let name = r.meta.mode.clone().unwrap_or_else(|| r.meta.label.clone());
        series.entry(name).or_default().push((x, y));
    }
    for points in series.values_mut() {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    series
}

/// Width of the plot, px.
const WIDTH: u32 = 900;
/// Width of the legend's strip right of the plot, px.
const LEGEND_WIDTH: u32 = 160;

/// Renders the plot as an SVG document.
///
/// # Errors
/// [`PlotError::NoPoints`] if no run can be placed, [`PlotError::Drawing`] on backend errors.
pub fn interactivity_vs_throughput_svg(
    runs: &[RunReport],
    kind: ThroughputKind,
) -> Result<String, PlotError> {
    let series = points_by_mode(runs, kind);
    let all: Vec<(f64, f64)> = series.values().flatten().copied().collect();
    if all.is_empty() {
        return Err(PlotError::NoPoints);
    }
    let x_max = all.iter().map(|p| p.0).fold(0.0, f64::max) * 1.1 + 1e-9;
    let y_max = all.iter().map(|p| p.1).fold(0.0, f64::max) * 1.1 + 1e-9;
    let y_label = match kind {
        ThroughputKind::Total => "input+output tokens/s per GPU",
        ThroughputKind::Output => "output tokens/s per GPU",
        ThroughputKind::GoodputPerGpu => "goodput, requests/s per GPU",
    };
    let caption = match kind {
        ThroughputKind::GoodputPerGpu => "Goodput per GPU vs interactivity (p50)",
        _ => "Throughput per GPU vs interactivity (p50)",
    };
    let draw_err = |e: &dyn std::fmt::Display| PlotError::Drawing(e.to_string());
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (WIDTH + LEGEND_WIDTH, 600)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_err(&e))?;
        // The legend has a strip of its own: drawn over the plot it hid the points that
        // fell under it.
        let (plot_area, legend_area) = root.split_horizontally(WIDTH);
        let mut chart = ChartBuilder::on(&plot_area)
            .caption(caption, ("sans-serif", 22))
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .map_err(|e| draw_err(&e))?;
        chart
            .configure_mesh()
            .x_desc("interactivity, p50 (tokens/s/user)")
            .y_desc(y_label)
            .draw()
            .map_err(|e| draw_err(&e))?;
        for (i, (mode, points)) in series.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            chart
                .draw_series(LineSeries::new(
                    points.iter().copied(),
                    colour.stroke_width(2),
                ))
                .map_err(|e| draw_err(&e))?;
            chart
                .draw_series(PointSeries::of_element(
                    points.iter().copied(),
                    4,
                    colour.filled(),
                    &|c, s, st| Circle::new(c, s, st),
                ))
                .map_err(|e| draw_err(&e))?;
            let y = 70 + 26 * i32::try_from(i).unwrap_or(0);
            legend_area
                .draw(&PathElement::new(
                    [(10, y), (34, y)],
                    colour.stroke_width(2),
                ))
                .map_err(|e| draw_err(&e))?;
            legend_area
                .draw(&Circle::new((22, y), 4, colour.filled()))
                .map_err(|e| draw_err(&e))?;
            legend_area
                .draw(&Text::new(
                    mode.clone(),
                    (42, y - 8),
                    ("sans-serif", 16).into_font(),
                ))
                .map_err(|e| draw_err(&e))?;
        }
        root.present().map_err(|e| draw_err(&e))?;
    }
    Ok(svg)
}
