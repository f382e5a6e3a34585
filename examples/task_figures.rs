//! Figures for the task-registration benchmark (`scripts/bench/task_registration.py`).
//!
//! `cargo run --release --example task_figures -- fit-time [N] [LABELS] [DIM]`
//! times the intent head's fit (cross-validation over the C grid on the
//! head part, the final fit, the temperature on the calibration part) on N
//! synthetic feature rows of width DIM
//! (default 10,000 x 57 labels x 576, the fixture's width) and prints JSON.
//!
//! `cargo run --release --example task_figures -- reliability TASK.json OUT.png FONT.ttf`
//! draws a ready task's holdout reliability diagram (before and after the
//! temperature) as a PNG, from `GET /v1/tasks/{id}`'s JSON.

use std::time::Instant;

use decisio::rng::SplitMix;
use decisio::tasks::head;
use plotters::prelude::*;
use serde_json::{json, Value};

/// Rows around one centre per label, with shared noise: about as separable
/// as few-shot intent features.
fn synthetic(n: usize, labels: usize, dim: usize) -> (Vec<Vec<f32>>, Vec<usize>) {
    let mut rng = SplitMix::new(11);
    let centres: Vec<Vec<f32>> = (0..labels)
        .map(|_| {
            (0..dim)
                .map(|_| (rng.next_f64() as f32 - 0.5) * 0.6)
                .collect()
        })
        .collect();
    let mut x = Vec::with_capacity(n);
    let mut y = Vec::with_capacity(n);
    for i in 0..n {
        let l = i % labels;
        x.push(
            centres[l]
                .iter()
                .map(|c| c + (rng.next_f64() as f32 - 0.5) * 2.0)
                .collect(),
        );
        y.push(l);
    }
    (x, y)
}

fn fit_time(args: &[String]) {
    let n = args.first().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let labels = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(57);
    let dim = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(576);
    let (x, y) = synthetic(n, labels, dim);
    let rows: Vec<&[f32]> = x.iter().map(|r| r.as_slice()).collect();
    let started = Instant::now();
    let fitted = head::fit(&rows, &y, labels, None, 0).expect("a fit");
    let seconds = started.elapsed().as_secs_f64();
    let one = Instant::now();
    let _ = head::logits(&fitted.head, &rows[..1000.min(rows.len())]);
    let apply_us = one.elapsed().as_secs_f64() * 1e6 / 1000.0_f64.min(rows.len() as f64);
    let out = json!({
        "examples": n, "labels": labels, "dim": dim,
        "features": "synthetic: one random centre per label plus uniform noise",
        "fit_seconds": seconds,
        "fits": head::C_GRID.len() * head::FOLDS + 1,
        "head_examples": fitted.report.head_examples,
        "calibration_examples": fitted.report.calibration_indices.len(),
        "c": fitted.head.c, "temperature": fitted.head.temperature,
        "cross_validation": fitted.report.cross_validation,
        "apply_microseconds_per_example": apply_us,
    });
    println!("{}", serde_json::to_string_pretty(&out).expect("json"));
}

fn reliability(args: &[String]) {
    let [input, output, font] = args else {
        eprintln!("usage: task_figures reliability TASK.json OUT.png FONT.ttf");
        std::process::exit(2);
    };
    let task: Value = serde_json::from_str(&std::fs::read_to_string(input).expect("the task file"))
        .expect("json");
    let font_bytes: &'static [u8] =
        Box::leak(std::fs::read(font).expect("the font").into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font_bytes)
        .map_err(|_| "the font cannot be read")
        .expect("a font");
    let r = &task["result"];
    let root = BitMapBackend::new(output, (720, 720)).into_drawing_area();
    root.fill(&WHITE).expect("draw");
    let calibration = r["head"]["calibration_indices"]
        .as_array()
        .map_or(String::new(), |c| format!("; T on {} examples", c.len()));
    let title = format!(
        "{}: holdout reliability (n = {}{calibration})",
        task["name"].as_str().unwrap_or("task"),
        r["holdout_examples"]
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(54)
        .build_cartesian_2d(0f64..1f64, 0f64..1f64)
        .expect("chart");
    chart
        .configure_mesh()
        .x_desc("confidence (top probability)")
        .y_desc("accuracy")
        .draw()
        .expect("mesh");
    chart
        .draw_series(LineSeries::new([(0.0, 0.0), (1.0, 1.0)], BLACK.mix(0.4)))
        .expect("diagonal");
    for (key, colour, shift) in [("before", RED, -0.012), ("after", BLUE, 0.012)] {
        let bins = r[key]["reliability"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let points: Vec<(f64, f64, f64)> = bins
            .iter()
            .filter_map(|b| {
                Some((
                    b["confidence"].as_f64()?,
                    b["accuracy"].as_f64()?,
                    b["count"].as_f64()?,
                ))
            })
            .collect();
        let ece = r[key]["ece"].as_f64().unwrap_or(f64::NAN);
        let t = r[key]["temperature"].as_f64().unwrap_or(f64::NAN);
        chart
            .draw_series(points.iter().map(|&(c, a, _)| {
                Rectangle::new(
                    [(c + shift - 0.01, 0.0), (c + shift + 0.01, a)],
                    colour.mix(0.5).filled(),
                )
            }))
            .expect("bars")
            .label(format!("{key}: T = {t:.3}, ECE = {ece:.3}"))
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|&(c, a, _)| (c, a)),
                colour,
            ))
            .expect("line");
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .expect("legend");
    root.present().expect("the PNG");
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("fit-time") => fit_time(&args[1..]),
        Some("reliability") => reliability(&args[1..]),
        _ => {
            eprintln!("usage: task_figures fit-time [N] [LABELS] [DIM] | reliability TASK.json OUT.png FONT.ttf");
            std::process::exit(2);
        }
    }
}
