//! The PNG plots of records and gates: reliability diagrams (per set and
//! pooled, before and after the fitted temperature) and accuracy per set
//! beside the reference.

use std::path::Path;
use std::sync::Once;

use anyhow::{anyhow, Context, Result};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::record::Record;
use crate::stats::calibrate::Figures;

/// The plots' TrueType font: the one given, else the first usual system
/// font found (DejaVu Sans on Debian, Arial on macOS).
pub fn font(given: Option<&Path>) -> Option<std::path::PathBuf> {
    if let Some(f) = given {
        return Some(f.to_path_buf());
    }
    [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/System/Library/Fonts/Supplemental/Arial.ttf",
        "/Library/Fonts/Arial.ttf",
    ]
    .iter()
    .map(std::path::PathBuf::from)
    .find(|p| p.is_file())
}

/// Registers the TrueType font the plots' text is drawn with (once).
pub fn register_font(font: &Path) -> Result<()> {
    static ONCE: Once = Once::new();
    let bytes =
        std::fs::read(font).with_context(|| format!("cannot read the font {}", font.display()))?;
    let mut result = Ok(());
    ONCE.call_once(|| {
        let leaked: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        result = plotters::style::register_font("sans-serif", FontStyle::Normal, leaked)
            .map_err(|_| anyhow!("{} is not a TrueType font", font.display()));
    });
    result
}

fn draw_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing a plot: {e:?}")
}

/// A reliability diagram, before and after a temperature, as a PNG (the
/// font registered first with [`register_font`]).
pub fn reliability_diagram(
    title: &str,
    before: &Figures,
    after: &Figures,
    path: &Path,
) -> Result<()> {
    let root = BitMapBackend::new(path, (720, 720)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(54)
        .build_cartesian_2d(0f64..1f64, 0f64..1f64)
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_desc("confidence (top probability)")
        .y_desc("accuracy")
        .draw()
        .map_err(draw_err)?;
    chart
        .draw_series(LineSeries::new([(0.0, 0.0), (1.0, 1.0)], BLACK.mix(0.4)))
        .map_err(draw_err)?;
    for (key, figs, colour, shift) in [
        ("before", before, RED, -0.012),
        ("after", after, BLUE, 0.012),
    ] {
        let points: Vec<(f64, f64)> = figs
            .reliability
            .iter()
            .filter_map(|b| Some((b.confidence?, b.accuracy?)))
            .collect();
        chart
            .draw_series(points.iter().map(|&(c, a)| {
                Rectangle::new(
                    [(c + shift - 0.01, 0.0), (c + shift + 0.01, a)],
                    colour.mix(0.5).filled(),
                )
            }))
            .map_err(draw_err)?
            .label(format!(
                "{key}: T = {:.3}, ECE = {:.3}, accuracy = {:.3}",
                figs.temperature, figs.ece, figs.accuracy
            ))
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
        chart
            .draw_series(LineSeries::new(points, colour))
            .map_err(draw_err)?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present().map_err(draw_err)?;
    Ok(())
}

type Chart<'a, 'b> =
    ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A chart's legend box.
fn legend<'a, 'b: 'a>(chart: &mut Chart<'a, 'b>, at: SeriesLabelPosition) -> Result<()> {
    chart
        .configure_series_labels()
        .position(at)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(draw_err)
}

/// `reliability-<set>.png` for each choice set and `reliability-pooled.png`;
/// the files' names.
pub fn reliability(record: &Record, out: &Path, font: &Path) -> Result<Vec<String>> {
    register_font(font)?;
    let mut names = Vec::new();
    let sets = record
        .choice_sets
        .iter()
        .filter_map(|c| c.figures.as_ref().map(|f| (c.name.as_str(), f)))
        .chain(record.pooled.as_ref().map(|p| ("pooled", p)));
    for (name, f) in sets {
        let file = format!("reliability-{name}.png");
        let title = format!("{}: {name} (n = {})", record.suite.name, f.questions);
        reliability_diagram(&title, &f.before, &f.after, &out.join(&file))?;
        names.push(file);
    }
    Ok(names)
}

/// Accuracy per set of a candidate beside its reference, as bars.
pub fn accuracy(rows: &[(String, f64, f64)], path: &Path, font: &Path, title: &str) -> Result<()> {
    paired_bars(
        rows,
        ["reference", "candidate"],
        ("accuracy", 1.0),
        path,
        font,
        title,
    )
}

/// Two bars per row (`names` say which), on a vertical axis named
/// `y.0` from 0 to `y.1`.
pub fn paired_bars(
    rows: &[(String, f64, f64)],
    names: [&str; 2],
    y: (&str, f64),
    path: &Path,
    font: &Path,
    title: &str,
) -> Result<()> {
    register_font(font)?;
    let n = rows.len().max(1);
    let root = BitMapBackend::new(path, (200 + 120 * n as u32, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(60)
        .y_label_area_size(54)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..y.1)
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                rows.get(i as usize).map_or(String::new(), |r| r.0.clone())
            } else {
                String::new()
            }
        })
        .y_desc(y.0)
        .draw()
        .map_err(draw_err)?;
    for (k, colour, label) in [(0usize, BLUE, names[0]), (1, RED, names[1])] {
        let x0 = if k == 0 { -0.36 } else { 0.0 };
        chart
            .draw_series(rows.iter().enumerate().map(|(i, r)| {
                let v = if k == 0 { r.1 } else { r.2 };
                let x = i as f64 + x0;
                Rectangle::new([(x, 0.0), (x + 0.36, v)], colour.mix(0.7).filled())
            }))
            .map_err(draw_err)?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present().map_err(draw_err)?;
    Ok(())
}
