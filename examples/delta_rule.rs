//! The gated delta rule of a linear-attention layer, three ways (a token at
//! a time in MLX ops, in blocks of tokens in MLX ops, the CPU's host
//! kernel), on one chunk of tokens at the widths of a Qwen3.5 config: the
//! MLX ops each builds (on Metal, each is at least one kernel launch) and
//! its median time on this machine.
//!
//! With `--model DIR` (a Qwen3.5 conversion), also the model's prefill
//! speed with MLX's ops (the host kernels off, weights as stored, as on
//! Metal), linear attention a token at a time and in blocks.
//!
//! ```sh
//! cargo run --release --example delta_rule -- OUT_DIR [--model DIR]... CONFIG.json...
//! ```
//!
//! Writes OUT_DIR/figures.json and OUT_DIR/summary.md. The inputs are made
//! by `delta::sample` (unit keys, decays and betas as a layer makes them),
//! the key heads already repeated to the value heads.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use decisio::engine::mlx::delta;
use decisio::engine::mlx::graph::op_count;
use decisio::engine::mlx::qwen3_5::Config;
use decisio::engine::mlx::{LoadOptions, MlxModel};
use mlx_rs::{ops, Array};
use serde_json::json;

/// Tokens of one chunk, as the engine reads a prompt.
const TOKENS: i32 = 256;
const REPS: usize = 5;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

/// (ops, median milliseconds) of one way on the inputs.
fn measure(way: &str, [q, k, v, lg, beta, state]: &[Array; 6]) -> Result<(Option<usize>, f64)> {
    let decay = ops::exp(lg)?;
    mlx_rs::transforms::eval([q, k, v, lg, &decay, beta, state])?;
    let run = || -> Result<(Array, Array)> {
        Ok(match way {
            "steps" => delta::steps(q, k, v, &decay, beta, state.clone())?,
            "chunked" => delta::chunked(q, k, v, lg, beta, state.clone())?,
            _ => delta::host(q, k, v, &decay, beta, state)?,
        })
    };
    // The host kernel computes on the spot: it builds no graph.
    let ops = if way == "host" {
        None
    } else {
        let (y, s) = run()?;
        Some(op_count(&[&y, &s])?)
    };
    let mut ms = Vec::new();
    for _ in 0..REPS {
        let t0 = Instant::now();
        let (y, s) = run()?;
        mlx_rs::transforms::eval([&y, &s])?;
        ms.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    Ok((ops, median(ms)))
}

/// Tokens of the prompt a model reads (four chunks).
const PROMPT: usize = 1024;

/// The model's prefill of a PROMPT-token prompt with MLX's ops: median
/// tokens per second over REPS runs.
fn prefill_speed(dir: &std::path::Path, chunked_delta: bool) -> Result<f64> {
    let options = LoadOptions {
        dequantize: false,
        host_kernels: false,
        chunked_delta,
        ..LoadOptions::default()
    };
    let model = MlxModel::load_with(dir, options)?;
    let vocab = model.info.vocab_size as u64;
    let tokens: Vec<u32> = (0..PROMPT as u64)
        .map(|i| ((i * 7919 + 13) % vocab) as u32)
        .collect();
    let mut per_s = Vec::new();
    for _ in 0..REPS {
        let t0 = Instant::now();
        let mut cache = model.new_cache();
        let last = model.prefill(&tokens, &mut cache, 256)?;
        last.eval()?;
        per_s.push(PROMPT as f64 / t0.elapsed().as_secs_f64());
    }
    Ok(median(per_s))
}

fn usage() -> anyhow::Error {
    anyhow::anyhow!("usage: delta_rule OUT_DIR [--model DIR]... CONFIG.json...")
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let out = args.next().map(PathBuf::from).ok_or_else(usage)?;
    let (mut configs, mut models) = (Vec::new(), Vec::new());
    while let Some(a) = args.next() {
        if a == "--model" {
            models.push(PathBuf::from(args.next().ok_or_else(usage)?));
        } else {
            configs.push(PathBuf::from(a));
        }
    }
    if configs.is_empty() {
        return Err(usage());
    }
    std::fs::create_dir_all(&out)?;
    let mut rows = Vec::new();
    let mut md = format!(
        "# The gated delta rule on one chunk of {TOKENS} tokens\n\n\
         Made by `cargo run --release --example delta_rule -- OUT CONFIG...` on MLX's CPU build; \
         ops are the MLX ops of the graph (each at least one kernel launch on Metal), \
         times the median of {REPS} runs on this machine's CPU.\n\n\
         | config | heads × Dk × Dv | way | MLX ops | ms |\n|---|---|---|---|---|\n"
    );
    for path in &configs {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let c = Config::from_config(&serde_json::from_str(&text)?)?;
        let (h, dk, dv) = (
            c.linear_num_value_heads,
            c.linear_key_head_dim,
            c.linear_value_head_dim,
        );
        let inputs = delta::sample(TOKENS, h, dk, dv, 1, false)?;
        // A conversion's config.json is named by its folder.
        let name = match path.file_name().and_then(|f| f.to_str()) {
            Some("config.json") => path.parent().and_then(|p| p.file_name()),
            _ => path.file_name(),
        }
        .unwrap_or_default()
        .to_string_lossy();
        for way in ["steps", "chunked", "host"] {
            let (ops, ms) = measure(way, &inputs)?;
            eprintln!("{name}: {way}: {ops:?} ops, {ms:.1} ms");
            md.push_str(&format!(
                "| {name} | {h} × {dk} × {dv} | {way} | {} | {ms:.1} |\n",
                ops.map_or("-".into(), |n| n.to_string())
            ));
            rows.push(json!({
                "config": name, "heads": h, "dk": dk, "dv": dv, "tokens": TOKENS,
                "way": way, "ops": ops, "median_ms": ms, "reps": REPS,
            }));
        }
    }
    let mut prefill = Vec::new();
    if !models.is_empty() {
        md.push_str(&format!(
            "\n## Prefill with MLX's ops ({PROMPT} tokens in chunks of 256; weights as stored, host kernels off)\n\n\
             | model | linear attention | tokens/s (median of {REPS}) |\n|---|---|---|\n"
        ));
    }
    for dir in &models {
        let name = dir.file_name().unwrap_or_default().to_string_lossy();
        for (way, chunked) in [("steps", false), ("chunked", true)] {
            let tps = prefill_speed(dir, chunked)?;
            eprintln!("{name}: prefill, {way}: {tps:.0} tokens/s");
            md.push_str(&format!("| {name} | {way} | {tps:.0} |\n"));
            prefill.push(json!({"model": name, "way": way, "tokens": PROMPT, "tokens_per_s": tps}));
        }
    }
    std::fs::write(
        out.join("figures.json"),
        serde_json::to_string_pretty(&json!({ "rows": rows, "prefill": prefill }))? + "\n",
    )?;
    std::fs::write(out.join("summary.md"), md)?;
    Ok(())
}
