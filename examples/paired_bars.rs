//! Two bars per row from a benchmark's figures, as a PNG (the benches are
//! Python; the plot is the project's own, `decisio::suite::plot`).
//!
//! Usage: `paired_bars JSON OUT.png`, JSON being
//! `{"rows": [{"name", "a", "b"}], "names": [A, B], "y": LABEL, "title": T}`.

use anyhow::{Context, Result};
use serde_json::Value;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (spec, out) = match args.as_slice() {
        [spec, out] => (spec, out),
        _ => anyhow::bail!("usage: paired_bars JSON OUT.png"),
    };
    let spec: Value = serde_json::from_str(spec).context("the figures are not JSON")?;
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let rows: Vec<(String, f64, f64)> = spec["rows"]
        .as_array()
        .context("no `rows`")?
        .iter()
        .map(|r| {
            let n = |k: &str| r[k].as_f64().unwrap_or(0.0);
            (text(&r["name"]), n("a"), n("b"))
        })
        .collect();
    let top = rows.iter().map(|r| r.1.max(r.2)).fold(0.0, f64::max) * 1.15;
    let names = [text(&spec["names"][0]), text(&spec["names"][1])];
    let font = decisio::suite::plot::font(None).context("no font for the plot")?;
    decisio::suite::plot::paired_bars(
        &rows,
        [&names[0], &names[1]],
        (&text(&spec["y"]), top.max(1e-9)),
        std::path::Path::new(out),
        &font,
        &text(&spec["title"]),
    )
}
