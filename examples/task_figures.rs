//! Figures for the task-registration benchmark (`scripts/bench/task_registration.py`).
//!
//! `cargo run --release --example task_figures -- fit-time [N] [LABELS] [DIM]`
//! times the intent head's fit (cross-validation over the C grid on the
//! head part, the final fit, the temperature on the calibration part) on N
//! synthetic feature rows of width DIM
//! (default 10,000 x 57 labels x 576, the fixture's width) and prints JSON.
//!
//! `cargo run --release --example task_figures -- reliability TASK.json OUT.png FONT.ttf`
//! draws (with `decisio::suite::plot`) a ready task's holdout reliability diagram (before and after the
//! temperature) as a PNG, from `GET /v1/tasks/{id}`'s JSON.

use std::time::Instant;

use decisio::rng::SplitMix;
use decisio::suite::plot;
use decisio::tasks::calibrate::Figures;
use decisio::tasks::head;
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
    let r = &task["result"];
    let calibration = r["head"]["calibration_indices"]
        .as_array()
        .map_or(String::new(), |c| format!("; T on {} examples", c.len()));
    let title = format!(
        "{}: holdout reliability (n = {}{calibration})",
        task["name"].as_str().unwrap_or("task"),
        r["holdout_examples"]
    );
    let figures = |key: &str| -> Figures {
        serde_json::from_value(r[key].clone()).expect("the task's figures")
    };
    plot::register_font(std::path::Path::new(font)).expect("a font");
    plot::reliability_diagram(
        &title,
        &figures("before"),
        &figures("after"),
        output.as_ref(),
    )
    .expect("the PNG");
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
