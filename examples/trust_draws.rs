//! Repeated draws of certified answers and prediction sets on answers a
//! server gave ([`decisio::suite::trust`]), with their plots: the figures
//! of `runs/<date>_trust` (`scripts/bench/trust.py`).
//!
//! Usage: `trust_draws IN.json OUT.json PNG_PREFIX`, IN being
//! `{"pools": [{"name", "probabilities": [[p]], "labels": [i]}], "spec":
//! {"alphas", "delta", "coverages", "draws", "seed"}}`. Writes the trust
//! record to OUT and, per task, `PNG_PREFIX-certified-<task>.png` (the
//! share of draws where the promise held against `1 − delta`, per alpha)
//! and `PNG_PREFIX-coverage-<task>.png` (the mean coverage of LAC sets
//! against each level).

use anyhow::{Context, Result};
use decisio::stats::conformal::Score;
use decisio::suite::trust::{draw, DrawSpec, Pool};
use serde::Deserialize;

#[derive(Deserialize)]
struct Input {
    pools: Vec<Pool>,
    spec: DrawSpec,
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, output, prefix] = args.as_slice() else {
        anyhow::bail!("usage: trust_draws IN.json OUT.json PNG_PREFIX");
    };
    let input: Input = serde_json::from_str(&std::fs::read_to_string(input)?)
        .context("the pools file is not what trust_draws reads")?;
    let record = draw(&input.pools, &input.spec);
    let font = decisio::suite::plot::font(None).context("no font for the plots")?;
    for t in &record.tasks {
        let certified: Vec<(String, f64, f64)> = t
            .certified
            .iter()
            .map(|c| (format!("α {}", c.alpha), 1.0 - record.delta, c.promise_held))
            .collect();
        decisio::suite::plot::paired_bars(
            &certified,
            ["promised (1 − δ)", "draws where it held"],
            ("share of draws", 1.15),
            std::path::Path::new(&format!("{prefix}-certified-{}.png", t.name)),
            &font,
            &format!("Certified answers: {}, error among them at most α", t.name),
        )?;
        let coverage: Vec<(String, f64, f64)> = t
            .coverage
            .iter()
            .filter(|c| c.score == Score::Lac)
            .map(|c| (format!("{}", c.level), c.level, c.coverage_mean))
            .collect();
        decisio::suite::plot::paired_bars(
            &coverage,
            ["promised (1 − α)", "mean coverage, test halves"],
            ("coverage", 1.15),
            std::path::Path::new(&format!("{prefix}-coverage-{}.png", t.name)),
            &font,
            &format!("Prediction sets (LAC): {}", t.name),
        )?;
    }
    std::fs::write(output, serde_json::to_string_pretty(&record)?)?;
    Ok(())
}
