//! Memory of an MLX conversion against state length: the bytes of the
//! prefix-cache entry a state of N tokens makes, and MLX's peak memory while
//! computing it, with the weights' own bytes for reference.
//!
//! ```sh
//! cargo run --release --example memory -- MODEL_DIR [LENGTHS] > memory.json
//! ```
//!
//! LENGTHS is a comma-separated list (default `1,128,512,2048`). The state's
//! token ids are arbitrary but fixed (memory does not depend on them). The
//! weights are held as `serve` holds them by default (dense on the CPU).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use decisio::engine::mlx::MlxModel;
use mlx_rs::memory;
use serde_json::json;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next().map(PathBuf::from) else {
        bail!("usage: memory MODEL_DIR [LENGTHS]");
    };
    let lengths: Vec<usize> = args
        .next()
        .unwrap_or_else(|| "1,128,512,2048".into())
        .split(',')
        .map(|n| {
            n.trim()
                .parse()
                .context("LENGTHS is a comma-separated list of numbers")
        })
        .collect::<Result<_>>()?;
    let model = MlxModel::load(&dir).with_context(|| format!("loading {}", dir.display()))?;
    // Weights load lazily: one token through the model brings them all in.
    let mut warm = model.new_cache();
    model.prefill(&[1], &mut warm, 256)?;
    warm.eval()?;
    drop(warm);
    memory::clear_cache()?;
    let weights = memory::active_memory()?;
    let vocab = model.info.vocab_size as u64;
    let mut rows = Vec::new();
    for &n in &lengths {
        memory::reset_peak_memory()?;
        let ids: Vec<u32> = (0..n as u64)
            .map(|i| ((i * 7919 + 13) % vocab) as u32)
            .collect();
        let mut cache = model.new_cache();
        model.prefill(&ids, &mut cache, 256)?;
        cache.eval()?;
        rows.push(json!({
            "tokens": n,
            "cache_entry_bytes": cache.nbytes(),
            "peak_bytes": memory::peak_memory()?,
        }));
        drop(cache);
        memory::clear_cache()?;
    }
    let out = json!({
        "model": dir.file_name().map(|f| f.to_string_lossy().into_owned()),
        "architecture": model.info.architecture,
        "weights_bytes": weights,
        "states": rows,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
