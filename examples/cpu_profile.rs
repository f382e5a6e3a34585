//! Where the CPU time of a decision goes: a new state's prefill and a
//! pass of questions on a cached state, on a conversion (the fixture by
//! default), run as the engine runs them (`MlxModel::prefill` in chunks,
//! then `MlxModel::read_questions` on the state's cache, a pass of `--rows`
//! questions of `--suffix` tokens each, one by default), first plain
//! and then with the profile on (`decisio::engine::mlx::profile`), which
//! breaks the time down by class of operation with the arithmetic of each
//! and every product's shape. Each shape's product is then timed alone, on
//! arrays of that shape already in memory (MLX's matmul, which calls the
//! machine's BLAS): the GEMM time of each path, the floor its products
//! could reach. `scripts/bench/cpu_profile.py` runs it and times the same
//! shapes with numpy beside it.
//!
//! ```sh
//! cargo run --release --example cpu_profile -- --model DIR OUT.json \
//!     [--state 1170] [--suffix 136] [--rows 1] [--reps 3] [--chunk 256] [--plot OUT.png]
//! ```
//!
//! Token ids are drawn at random from the vocabulary (the time of a pass
//! does not depend on which ids it reads); the same ids every run.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use std::collections::BTreeMap;

use decisio::engine::mlx::host;
use decisio::engine::mlx::profile::{self, Profile, Shape};
use decisio::engine::mlx::MlxModel;
use mlx_rs::{ops, random};
use serde_json::{json, Value};

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

/// `n` ids in `[lo, hi)`, the same for one seed.
fn ids(n: usize, lo: u32, hi: u32, seed: u64) -> Vec<u32> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            lo + ((x >> 33) as u32) % (hi - lo)
        })
        .collect()
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// The median seconds of one product of `shape` alone, its operands in
/// memory, laid out as the model lays them out (a linear layer's weight
/// `[n, k]` transposed; attention's keys `[t, d]` transposed for the
/// scores, values as they are).
fn gemm_seconds(shape: &Shape, reps: usize) -> Result<f64> {
    let (b, m, k, n) = (
        shape.batch as i32,
        shape.m as i32,
        shape.k as i32,
        shape.n as i32,
    );
    let a = random::normal::<f32>(&[b, m, k], None, None, None)?;
    let w = if shape.transposed {
        random::normal::<f32>(&[b, n, k], None, None, None)?
    } else {
        random::normal::<f32>(&[b, k, n], None, None, None)?
    };
    mlx_rs::transforms::eval([&a, &w])?;
    let transposed = shape.transposed;
    let run = || -> Result<f64> {
        let started = Instant::now();
        let y = if transposed {
            ops::matmul(&a, w.transpose_axes(&[0, 2, 1])?)?
        } else {
            ops::matmul(&a, &w)?
        };
        y.eval()?;
        Ok(started.elapsed().as_secs_f64())
    };
    run()?;
    let times: Vec<f64> = (0..reps.max(3)).map(|_| run()).collect::<Result<_>>()?;
    Ok(median(times))
}

/// The median seconds of one of attention's products of `shape` alone as
/// the engine computes it on float32 (`host::blas_product`, on buffers kept
/// between calls); `None` where no BLAS is loaded.
fn engine_attention_seconds(shape: &Shape, reps: usize) -> Option<f64> {
    let (b, m, k, n) = (shape.batch, shape.m, shape.k, shape.n);
    let a: Vec<f32> = (0..b * m * k)
        .map(|i| (i % 17) as f32 * 0.1 - 0.8)
        .collect();
    let w: Vec<f32> = (0..b * k * n)
        .map(|i| (i % 13) as f32 * 0.1 - 0.6)
        .collect();
    let mut out = vec![0.0f32; b * m * n];
    let mut run = || {
        let started = Instant::now();
        host::blas_product(&a, &w, &mut out, b, (m, k, n), shape.transposed)
            .then(|| started.elapsed().as_secs_f64())
    };
    run()?;
    let times: Option<Vec<f64>> = (0..reps.max(3)).map(|_| run()).collect();
    times.map(median)
}

/// A path's profile: its classes, its products by shape with each one's
/// time alone, and the sums.
fn report(p: &Profile, total: f64, gemm: &mut BTreeMap<Shape, f64>, reps: usize) -> Result<Value> {
    let mut classes = serde_json::Map::new();
    let mut counted = 0.0;
    for (c, t) in &p.classes {
        counted += t.seconds;
        classes.insert(
            c.name().to_string(),
            json!({"ms": t.seconds * 1e3, "gflop": t.flops / 1e9, "calls": t.calls}),
        );
    }
    let mut products = Vec::new();
    let (mut linear_ms, mut attention_ms, mut gflop) = (0.0, 0.0, 0.0);
    for (shape, &count) in &p.products {
        let alone = match gemm.get(shape) {
            Some(&s) => s,
            None => {
                let s = gemm_seconds(shape, reps)?;
                gemm.insert(*shape, s);
                s
            }
        };
        let engine = if shape.linear {
            None
        } else {
            engine_attention_seconds(shape, reps)
        };
        let ms = alone * 1e3 * count as f64;
        if shape.linear {
            linear_ms += ms;
        } else {
            attention_ms += ms;
        }
        gflop += shape.flops() * count as f64 / 1e9;
        products.push(json!({
            "linear": shape.linear, "transposed": shape.transposed, "batch": shape.batch,
            "m": shape.m, "k": shape.k,
            "n": shape.n, "count": count, "alone_ms": alone * 1e3,
            "gflops_per_s": shape.flops() / alone / 1e9,
            "engine_gflops_per_s": engine.map(|e| shape.flops() / e / 1e9),
        }));
    }
    Ok(json!({
        "total_ms": total * 1e3,
        "classes": classes,
        "unclassified_ms": (total - counted) * 1e3,
        "products": products,
        "gemm": {"linear_ms": linear_ms, "attention_ms": attention_ms,
                 "ms": linear_ms + attention_ms, "gflop": gflop},
    }))
}

/// Shares of each path's profiled time by class, as paired bars.
fn plot(figures: &Value, path: &std::path::Path) -> Result<()> {
    let short = [
        ("products", "products"),
        ("attention products", "attn prod"),
        ("softmax", "softmax"),
        ("norms", "norms"),
        ("rope", "rope"),
        ("activations", "act"),
        ("residuals, casts and reshapes", "resid/cast"),
        ("cache copies and concatenations", "cache"),
        ("embedding", "embed"),
        ("host and MLX transfers", "transfer"),
    ];
    let share = |which: &str, class: &str| -> f64 {
        let p = &figures["profiled"][which];
        let total = p["total_ms"].as_f64().unwrap_or(1.0).max(1e-9);
        let ms = if class == "overhead" {
            p["unclassified_ms"].as_f64().unwrap_or(0.0)
        } else {
            p["classes"][class]["ms"].as_f64().unwrap_or(0.0)
        };
        ms / total
    };
    let mut rows: Vec<(String, f64, f64)> = short
        .iter()
        .map(|(name, label)| {
            (
                label.to_string(),
                share("prefill", name),
                share("question", name),
            )
        })
        .collect();
    rows.push((
        "other".into(),
        share("prefill", "overhead"),
        share("question", "overhead"),
    ));
    let font = decisio::suite::plot::font(None).context("no font for the plot")?;
    decisio::suite::plot::paired_bars(
        &rows,
        ["new state", "question on a cached state"],
        ("share of the profiled time", 1.0),
        path,
        &font,
        "Where a decision's CPU time goes, by class of operation",
    )
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model_dir = PathBuf::from(arg(&args, "--model").context("--model DIR")?);
    let out = args
        .iter()
        .find(|a| a.ends_with(".json"))
        .map(PathBuf::from)
        .context("OUT.json")?;
    let get = |name: &str, default: usize| -> Result<usize> {
        Ok(match arg(&args, name) {
            Some(v) => v.parse().with_context(|| format!("{name} {v}"))?,
            None => default,
        })
    };
    let (state_len, suffix_len) = (get("--state", 1170)?, get("--suffix", 136)?);
    let (reps, chunk) = (get("--reps", 3)?, get("--chunk", 256)?);
    let rows = get("--rows", 1)?.max(1);
    let plot_path = arg(&args, "--plot").map(PathBuf::from);

    let model = MlxModel::load(&model_dir)?;
    model.warm_up()?;
    let vocab = model.info.vocab_size as u32;
    let state = ids(state_len, 100, vocab - 100, 1);
    let suffixes: Vec<Vec<u32>> = (0..rows)
        .map(|r| ids(suffix_len, 100, vocab - 100, 2 + r as u64))
        .collect();
    let suffixes: Vec<&[u32]> = suffixes.iter().map(|s| s.as_slice()).collect();
    let letters: Vec<u32> = (0..4).map(|i| 100 + i).collect();

    // One pass of each path: (prefill seconds, question seconds).
    // One pass of each path, each profiled when `profiled`: the seconds
    // and the profile of the prefill, then of the question.
    let run = |profiled: bool| -> Result<[(f64, Profile); 2]> {
        let timed = |f: &mut dyn FnMut() -> Result<()>| -> Result<(f64, Profile)> {
            if profiled {
                profile::start();
            }
            let started = Instant::now();
            f()?;
            let seconds = started.elapsed().as_secs_f64();
            Ok((seconds, profile::finish()))
        };
        let mut cache = model.new_cache();
        let prefill = timed(&mut || {
            model.prefill(&state, &mut cache, chunk)?;
            cache.eval()?;
            let _ = mlx_rs::memory::clear_cache();
            Ok(())
        })?;
        let asked = timed(&mut || {
            let reads = vec![letters.as_slice(); rows];
            model.read_questions(&cache, &suffixes, &reads, chunk, false, None)?;
            Ok(())
        })?;
        Ok([prefill, asked])
    };
    run(false)?;
    let (mut prefill, mut question) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let [(a, _), (b, _)] = run(false)?;
        prefill.push(a);
        question.push(b);
    }
    // Profiled: each path alone, its last repetition kept.
    let mut profiled = run(true)?;
    for _ in 1..reps {
        profiled = run(true)?;
    }
    let [(a, pa), (b, pb)] = profiled;
    let profiled = (pa, a, pb, b);
    let mut gemm = BTreeMap::new();
    let prefill_report = report(&profiled.0, profiled.1, &mut gemm, reps)?;
    let question_report = report(&profiled.2, profiled.3, &mut gemm, reps)?;
    let figures = json!({
        "model": model_dir.file_name().map(|n| n.to_string_lossy().to_string()),
        "architecture": model.info.architecture,
        "layers": model.num_layers(),
        "hidden_size": model.hidden_size(),
        "vocab_size": vocab,
        "state_tokens": state_len,
        "suffix_tokens": suffix_len,
        "rows": rows,
        "chunk": chunk,
        "reps": reps,
        "plain_ms": {
            "prefill": median(prefill.clone()) * 1e3,
            "question": median(question.clone()) * 1e3,
            "prefill_all": prefill.iter().map(|s| s * 1e3).collect::<Vec<_>>(),
            "question_all": question.iter().map(|s| s * 1e3).collect::<Vec<_>>(),
        },
        "profiled": {"prefill": prefill_report, "question": question_report},
    });
    std::fs::write(&out, serde_json::to_string_pretty(&figures)?)?;
    if let Some(path) = plot_path {
        plot(&figures, &path)?;
    }
    println!("{}", serde_json::to_string_pretty(&figures["plain_ms"])?);
    Ok(())
}
