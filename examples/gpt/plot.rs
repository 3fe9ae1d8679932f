//! The charts, drawn with `plotters` into PNGs: training and validation loss against the step,
//! and decoding tokens/s against the batch size, with tick values, axis labels, a legend and a
//! title naming the run.
//!
//! Text is set in a subset of DejaVu Sans bundled with the examples
//! (`examples/common/fonts/`), so the chart draws the same on a machine without system fonts.

use std::path::Path;

use graphed::{Error, Result};
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

const W: u32 = 1000;
const H: u32 = 560;
const TRAIN: RGBColor = RGBColor(31, 90, 200);
const VAL: RGBColor = RGBColor(210, 40, 40);
static FONT: &[u8] = include_bytes!("../common/fonts/DejaVuSans-subset.ttf");

fn plot_err(e: impl std::fmt::Display) -> Error {
    Error::msg(format!("drawing a chart: {e}"))
}

/// Draws a chart's legend at `position`, in the charts' one style.
/// A white W x H canvas writing to `path`, the bundled font registered.
fn canvas(path: &Path) -> Result<DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>> {
    register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| Error::msg("the bundled chart font does not parse"))?;
    let root = BitMapBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    Ok(root)
}

fn finish<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .position(position)
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(plot_err)
}

/// Writes the training and validation losses (step, loss) to `path` as a PNG titled `title`
/// (say what ran: model, device, dtype, mode). The x axis runs from step 0 to the last step,
/// the y axis from 0 to a little above the largest finite loss.
pub fn write_loss_png(path: &Path, title: &str, train: &[(usize, f32)], val: &[(usize, f32)]) -> Result<()> {
    let all = || train.iter().chain(val).filter(|p| p.1.is_finite());
    let last_step = all().map(|p| p.0).max().unwrap_or(1).max(1);
    let top = all().map(|p| p.1).fold(0.0f32, f32::max).max(1e-3) * 1.05;

    let root = canvas(path)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(0..last_step, 0f32..top)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("loss (cross-entropy, nats per byte)")
        .axis_desc_style(("sans-serif", 16))
        .label_style(("sans-serif", 14))
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(200, 200, 200))
        .draw()
        .map_err(plot_err)?;

    let finite = |points: &[(usize, f32)]| points.iter().copied().filter(|p| p.1.is_finite()).collect::<Vec<_>>();
    chart
        .draw_series(LineSeries::new(finite(train), TRAIN.stroke_width(2)))
        .map_err(plot_err)?
        .label(format!("training (last {:.3})", train.last().map_or(f32::NAN, |p| p.1)))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], TRAIN.stroke_width(2)));
    let val_points = finite(val);
    chart
        .draw_series(LineSeries::new(val_points.clone(), VAL.stroke_width(2)))
        .map_err(plot_err)?
        .label(format!("validation (last {:.3})", val.last().map_or(f32::NAN, |p| p.1)))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], VAL.stroke_width(2)));
    chart.draw_series(val_points.iter().map(|&p| Circle::new(p, 3, VAL.filled()))).map_err(plot_err)?;
    finish(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present().map_err(|e| Error::msg(format!("writing {}: {e}", path.display())))
}

/// One line of the decoding chart: a label and (batch, tokens/s) points.
pub type RateSeries = (String, Vec<(usize, f64)>);

/// Writes decoding throughput to `path` as a PNG titled `title`: tokens/s against the batch
/// size, one line per way of running (log scales on both axes: batches double, and the ways
/// differ by orders of magnitude).
pub fn write_rate_png(path: &Path, title: &str, series: &[RateSeries]) -> Result<()> {
    const COLORS: [RGBColor; 4] =
        [RGBColor(31, 90, 200), RGBColor(210, 40, 40), RGBColor(40, 150, 60), RGBColor(230, 140, 20)];
    let points = || series.iter().flat_map(|s| s.1.iter()).filter(|p| p.1.is_finite() && p.1 > 0.0);
    let max_batch = points().map(|p| p.0).max().unwrap_or(1).max(2) as f64;
    let (lo, hi) = points().fold((f64::INFINITY, 0.0f64), |(lo, hi), p| (lo.min(p.1), hi.max(p.1)));
    let (lo, hi) = if hi > 0.0 { (lo / 2.0, hi * 2.0) } else { (1.0, 10.0) };

    let root = canvas(path)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(80)
        .build_cartesian_2d((1f64..max_batch).log_scale(), (lo..hi).log_scale())
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("batch size (sequences decoded together)")
        .y_desc("tokens/s (all sequences)")
        .x_label_formatter(&|x| format!("{}", x.round()))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .axis_desc_style(("sans-serif", 16))
        .label_style(("sans-serif", 14))
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(200, 200, 200))
        .draw()
        .map_err(plot_err)?;
    for (i, (label, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64)> =
            pts.iter().filter(|p| p.1.is_finite() && p.1 > 0.0).map(|p| (p.0 as f64, p.1)).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(plot_err)?
            .label(label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(2)));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(plot_err)?;
    }
    finish(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present().map_err(|e| Error::msg(format!("writing {}: {e}", path.display())))
}
