//! The gated delta rule of a linear-attention layer, three ways (a token at
//! a time in MLX ops, in blocks of tokens in MLX ops, the CPU's host
//! kernel), on one chunk of tokens at the widths of a Qwen3.5 config: the
//! MLX ops each builds (on Metal, each is at least one kernel launch) and
//! its median time on this machine.
//!
//! With `--model DIR` (a Qwen3.5 conversion), also the model's prefill
//! with MLX's ops (the host kernels off, weights as stored, as on Metal):
//! linear attention a token at a time and in blocks and, for quantized
//! experts, the token-expert pairs sorted by expert and not; for each, the
//! MLX ops of one chunk's graph and the tokens per second.
//! (`scripts/bench/wide_model.py` makes a conversion at the real base's
//! widths with a few layers.)
//!
//! ```sh
//! cargo run --release --example delta_rule -- OUT_DIR [--reps N] [--tokens N] [--model DIR]... CONFIG.json...
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
use decisio::engine::mlx::switch::SORT_EXPERTS_FROM;
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
fn measure(
    way: &str,
    [q, k, v, lg, beta, state]: &[Array; 6],
    reps: usize,
) -> Result<(Option<usize>, f64)> {
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
    for _ in 0..reps {
        let t0 = Instant::now();
        let (y, s) = run()?;
        mlx_rs::transforms::eval([&y, &s])?;
        ms.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    Ok((ops, median(ms)))
}

/// Tokens of the prompt a model reads (four chunks; `--tokens`).
const PROMPT: usize = 1024;
/// Tokens a prompt is read in per forward pass, as the engine reads it.
const CHUNK: usize = 256;

/// The model's prefill of a `prompt`-token prompt with MLX's ops: the MLX
/// ops of one chunk's graph (up to its last hidden state) and the median
/// tokens per second over `reps` runs.
fn prefill_speed(
    dir: &std::path::Path,
    chunked_delta: bool,
    sort_experts_from: usize,
    reps: usize,
    prompt: usize,
) -> Result<(usize, f64)> {
    let options = LoadOptions {
        dequantize: false,
        host_kernels: false,
        chunked_delta,
        sort_experts_from,
    };
    let model = MlxModel::load_with(dir, options)?;
    let vocab = model.info.vocab_size as u64;
    let tokens: Vec<u32> = (0..prompt as u64)
        .map(|i| ((i * 7919 + 13) % vocab) as u32)
        .collect();
    // One chunk read as one pass that is not evaluated (a chunk size above
    // its length), so the whole graph is there to count.
    let first = &tokens[..CHUNK.min(prompt)];
    let last = model.prefill(first, &mut model.new_cache(), CHUNK + 1)?;
    let ops = op_count(&[&last])?;
    let mut per_s = Vec::new();
    for _ in 0..reps {
        let t0 = Instant::now();
        let mut cache = model.new_cache();
        let last = model.prefill(&tokens, &mut cache, CHUNK)?;
        last.eval()?;
        per_s.push(prompt as f64 / t0.elapsed().as_secs_f64());
    }
    Ok((ops, median(per_s)))
}

fn usage() -> anyhow::Error {
    anyhow::anyhow!(
        "usage: delta_rule OUT_DIR [--reps N] [--tokens N] [--model DIR]... CONFIG.json..."
    )
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let out = args.next().map(PathBuf::from).ok_or_else(usage)?;
    let (mut configs, mut models, mut reps, mut prompt) = (Vec::new(), Vec::new(), REPS, PROMPT);
    while let Some(a) = args.next() {
        if a == "--model" {
            models.push(PathBuf::from(args.next().ok_or_else(usage)?));
        } else if a == "--reps" {
            reps = args.next().ok_or_else(usage)?.parse()?;
        } else if a == "--tokens" {
            prompt = args.next().ok_or_else(usage)?.parse()?;
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
         Made by `cargo run --release --example delta_rule -- OUT --reps {reps} --tokens {prompt} [--model DIR]... CONFIG...` on MLX's CPU build; \
         ops are the MLX ops of the graph (each at least one kernel launch on Metal), \
         times the median of {reps} runs on this machine's CPU.\n\n\
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
            let (ops, ms) = measure(way, &inputs, reps)?;
            eprintln!("{name}: {way}: {ops:?} ops, {ms:.1} ms");
            md.push_str(&format!(
                "| {name} | {h} × {dk} × {dv} | {way} | {} | {ms:.1} |\n",
                ops.map_or("-".into(), |n| n.to_string())
            ));
            rows.push(json!({
                "config": name, "heads": h, "dk": dk, "dv": dv, "tokens": TOKENS,
                "way": way, "ops": ops, "median_ms": ms, "reps": reps,
            }));
        }
    }
    let mut prefill = Vec::new();
    if !models.is_empty() {
        md.push_str(&format!(
            "\n## Prefill with MLX's ops ({prompt} tokens in chunks of {CHUNK}; weights as stored, host kernels off)\n\n\
             Ops: the MLX ops of one {CHUNK}-token chunk's graph, to its last hidden state.\n\n\
             | model | linear attention | experts | MLX ops per chunk | tokens/s (median of {reps}) |\n\
             |---|---|---|---|---|\n"
        ));
    }
    for dir in &models {
        let name = dir.file_name().unwrap_or_default().to_string_lossy();
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
        let moe = decisio::model_config::get_usize(&config, "num_experts").is_some();
        let mut ways = vec![
            ("steps", false, "sorted", SORT_EXPERTS_FROM),
            ("chunked", true, "sorted", SORT_EXPERTS_FROM),
        ];
        if moe {
            ways.push(("chunked", true, "unsorted", usize::MAX));
        }
        for (way, chunked, experts, sort_from) in ways {
            let experts = if moe { experts } else { "-" };
            let (ops, tps) = prefill_speed(dir, chunked, sort_from, reps, prompt)?;
            // Three decimals where a model reads under ten tokens a second.
            let shown = format!("{tps:.*}", if tps < 10.0 { 3 } else { 1 });
            eprintln!("{name}: prefill, {way}, {experts}: {ops} ops, {shown} tokens/s");
            md.push_str(&format!(
                "| {name} | {way} | {experts} | {ops} | {shown} |\n"
            ));
            prefill.push(json!({
                "model": name, "way": way, "experts": experts, "tokens": prompt,
                "chunk": CHUNK, "ops_per_chunk": ops, "tokens_per_s": tps, "reps": reps,
            }));
        }
    }
    std::fs::write(
        out.join("figures.json"),
        serde_json::to_string_pretty(&json!({ "rows": rows, "prefill": prefill }))? + "\n",
    )?;
    std::fs::write(out.join("summary.md"), md)?;
    Ok(())
}
