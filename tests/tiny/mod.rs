//! Shared by the architecture tests (`tests/arch_*.rs`): tiny random-weight
//! conversions of real architectures, made with mlx-lm 0.32.2's logits on
//! them by `scripts/reference/tiny_models.py` (`make reference`; the folder
//! is `$DECISIO_REFERENCE_DIR/tiny`, by default `target/reference/tiny`),
//! and the comparisons every architecture goes through.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use decisio::engine::mlx::cache::ModelCache;
use decisio::engine::mlx::sample::argmax;
use decisio::engine::mlx::switch::SORT_EXPERTS_FROM;
use decisio::engine::mlx::{LoadOptions, MlxModel};
use mlx_rs::Array;

pub const TOLERANCE: f32 = 1e-3;
/// The engine reads prompts in chunks of this many tokens.
pub const CHUNK: usize = 256;

pub fn folder(arch: &str, quant: &str) -> PathBuf {
    let base = std::env::var_os("DECISIO_REFERENCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/reference"));
    let dir = base.join(format!("tiny/{arch}-{quant}"));
    assert!(
        dir.join("reference.safetensors").exists(),
        "the tiny {arch} conversion is missing at {}; run `make reference`",
        dir.display()
    );
    dir
}

/// mlx-lm's logits: on the conversion as it is, or (`dense`) on mlx-lm's
/// `dequantize_model` of it, the same weight values in bfloat16 that the
/// CPU default expands them to. (MLX's CPU quantized product accumulates
/// otherwise than a dense product, so the two runs differ by up to 2
/// bfloat16 steps per product; each path is held to its own reference.)
pub fn reference(arch: &str, quant: &str, dense: bool) -> HashMap<String, Array> {
    let file = if dense && quant != "bf16" {
        "reference_dense.safetensors"
    } else {
        "reference.safetensors"
    };
    Array::load_safetensors(folder(arch, quant).join(file)).expect("the reference logits")
}

pub fn ids(a: &Array) -> Vec<u32> {
    a.as_slice::<i32>().iter().map(|&t| t as u32).collect()
}

pub fn logits(model: &MlxModel, hidden: &Array) -> Vec<f32> {
    let l = model.logits(hidden).unwrap().as_type::<f32>().unwrap();
    l.eval().unwrap();
    l.as_slice::<f32>().to_vec()
}

/// The reference's prompt lengths up to `max_len`, shortest first.
pub fn lengths(reference: &HashMap<String, Array>, max_len: usize) -> Vec<usize> {
    let mut lengths: Vec<usize> = reference
        .keys()
        .filter_map(|k| k.strip_prefix("ids_")?.parse().ok())
        .filter(|&n| n <= max_len)
        .collect();
    lengths.sort_unstable();
    lengths
}

/// The last position's logits of `tokens` read from an empty cache in
/// chunks, as the engine reads a prompt.
pub fn prompt_logits(model: &MlxModel, tokens: &[u32]) -> Vec<f32> {
    let mut cache = model.new_cache();
    let last = model.prefill(tokens, &mut cache, CHUNK).unwrap();
    logits(model, &last)
}

pub fn max_diff(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max)
}

/// Every prompt length (read in chunks as the engine reads it) and every
/// prefix + continuation pair (the continuation from a clone of the
/// prefix's cache); returns the worst difference.
pub fn compare(arch: &str, quant: &str, options: LoadOptions, max_len: usize) -> f32 {
    let model =
        MlxModel::load_with(&folder(arch, quant), options).expect("load the tiny conversion");
    assert!(
        arch.starts_with(&model.info.architecture),
        "{arch} loaded as {}",
        model.info.architecture
    );
    let reference = reference(arch, quant, options.dequantize);
    let all = lengths(&reference, usize::MAX);
    assert!(all.len() >= 8, "the reference holds {all:?}");
    let label = format!(
        "{arch} {quant} ({})",
        if options.dequantize {
            "dequantized, host kernels"
        } else {
            "as stored, MLX ops"
        }
    );
    let mut worst = 0f32;
    for n in all.into_iter().filter(|&n| n <= max_len) {
        let tokens = ids(&reference[&format!("ids_{n}")]);
        let want = reference[&format!("logits_{n}")].as_slice::<f32>();
        let got = prompt_logits(&model, &tokens);
        let diff = max_diff(&got, want);
        println!("{label}: {n} tokens, max |diff| {diff:.3e}");
        assert_eq!(
            argmax(&got),
            argmax(want),
            "{label}: argmax differs at {n} tokens"
        );
        assert!(diff <= TOLERANCE, "{label}: {n} tokens: max |diff| {diff}");
        worst = worst.max(diff);
    }
    let pairs = reference
        .keys()
        .filter(|k| k.starts_with("prefix_"))
        .count();
    assert!(pairs >= 3, "the reference holds {pairs} prefix pairs");
    for i in 0..pairs {
        let prefix = ids(&reference[&format!("prefix_{i}")]);
        let cont = ids(&reference[&format!("cont_{i}")]);
        if prefix.len() + cont.len() > max_len {
            continue;
        }
        let want = reference[&format!("cont_logits_{i}")].as_slice::<f32>();
        let mut cache = model.new_cache();
        model.prefill(&prefix, &mut cache, CHUNK).unwrap();
        cache.eval().unwrap();
        let mut cont_cache = cache.clone();
        let got = logits(&model, &model.last_hidden(&cont, &mut cont_cache).unwrap());
        let diff = max_diff(&got, want);
        println!(
            "{label}: prefix {} + continuation {}, max |diff| {diff:.3e}",
            prefix.len(),
            cont.len()
        );
        assert_eq!(
            argmax(&got),
            argmax(want),
            "{label}: argmax differs on pair {i}"
        );
        assert!(diff <= TOLERANCE, "{label}: pair {i}: max |diff| {diff}");
        worst = worst.max(diff);
    }
    let decodes = reference
        .keys()
        .filter(|k| k.starts_with("decode_prefix_"))
        .count();
    assert!(decodes >= 1, "the reference holds no decoding steps");
    for i in 0..decodes {
        let prefix = ids(&reference[&format!("decode_prefix_{i}")]);
        let steps = ids(&reference[&format!("decode_steps_{i}")]);
        let want = reference[&format!("decode_logits_{i}")].as_slice::<f32>();
        let mut cache = model.new_cache();
        model.prefill(&prefix, &mut cache, CHUNK).unwrap();
        let mut last = None;
        for &t in &steps {
            let h = model.last_hidden(&[t], &mut cache).unwrap();
            cache.eval().unwrap();
            last = Some(h);
        }
        let got = logits(&model, &last.expect("decoding steps"));
        let diff = max_diff(&got, want);
        println!(
            "{label}: prefix {} + {} single steps, max |diff| {diff:.3e}",
            prefix.len(),
            steps.len()
        );
        assert_eq!(
            argmax(&got),
            argmax(want),
            "{label}: argmax differs on decode {i}"
        );
        assert!(diff <= TOLERANCE, "{label}: decode {i}: max |diff| {diff}");
        worst = worst.max(diff);
    }
    println!("{label}: worst max |diff| {worst:.3e}");
    worst
}

/// The CPU defaults: weights dequantized at load, host kernels.
pub const CPU: LoadOptions = LoadOptions {
    dequantize: true,
    host_kernels: true,
    sort_experts_from: SORT_EXPERTS_FROM,
    chunked_delta: true,
};
/// Weights as stored and MLX's own ops (Metal's defaults): linear
/// attention reads prompts in blocks of tokens.
pub const MLX_OPS: LoadOptions = LoadOptions {
    dequantize: false,
    host_kernels: false,
    sort_experts_from: SORT_EXPERTS_FROM,
    chunked_delta: true,
};
/// Weights as stored and MLX's own ops as mlx-lm runs them: linear
/// attention a token at a time.
pub const MLX_LM_OPS: LoadOptions = LoadOptions {
    chunked_delta: false,
    ..MLX_OPS
};

/// A snapshot (a clone of the prefix's cache, here a 300-token state, beyond
/// a sliding window of 64) continued with two different suffixes gives, bit
/// for bit, what a fresh cache gives for the same prefix and suffix read in
/// the same two steps; and continuing from it leaves the snapshot as it was.
pub fn snapshot_continues_bit_for_bit(arch: &str, quant: &str, options: LoadOptions) {
    let model = MlxModel::load_with(&folder(arch, quant), options).unwrap();
    let prefix: Vec<u32> = (0..300).map(|i| (i * 37 + 11) % 1024).collect();
    let suffixes: [Vec<u32>; 2] = [vec![5, 900, 17], (0..90).map(|i| (i * 13) % 1024).collect()];
    let mut cache = model.new_cache();
    model.prefill(&prefix, &mut cache, CHUNK).unwrap();
    cache.eval().unwrap();
    let snapshot = cache;
    let answer = |cache: &mut ModelCache, suffix: &[u32]| {
        logits(&model, &model.last_hidden(suffix, cache).unwrap())
    };
    let from_snapshot: Vec<Vec<f32>> = suffixes
        .iter()
        .map(|s| answer(&mut snapshot.clone(), s))
        .collect();
    // The snapshot is untouched: reading the first suffix again agrees.
    let repeat = answer(&mut snapshot.clone(), &suffixes[0]);
    assert_eq!(
        bits(&repeat),
        bits(&from_snapshot[0]),
        "{arch} {quant}: the snapshot changed"
    );
    for (suffix, got) in suffixes.iter().zip(&from_snapshot) {
        let mut fresh = model.new_cache();
        model.prefill(&prefix, &mut fresh, CHUNK).unwrap();
        fresh.eval().unwrap();
        let want = answer(&mut fresh, suffix);
        assert_eq!(
            bits(got),
            bits(&want),
            "{arch} {quant}: a continuation from the snapshot differs from a fresh cache"
        );
    }
    assert_ne!(from_snapshot[0], from_snapshot[1]);
    println!("{arch} {quant} {options:?}: snapshot continuations equal bit for bit");
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Quantized experts with their token-expert pairs sorted by expert (the
/// default from `SORT_EXPERTS_FROM` pairs on) and never sorted, on every
/// reference prompt up to `max_len` tokens: the worst difference of their
/// logits.
pub fn sorted_experts_difference(arch: &str, quant: &str, max_len: usize) -> f32 {
    let dir = folder(arch, quant);
    let sorted = MlxModel::load_with(&dir, MLX_OPS).expect("load the tiny conversion");
    let unsorted = MlxModel::load_with(
        &dir,
        LoadOptions {
            sort_experts_from: usize::MAX,
            ..MLX_OPS
        },
    )
    .expect("load the tiny conversion");
    let reference = reference(arch, quant, false);
    let lengths = lengths(&reference, max_len);
    assert!(
        lengths.iter().any(|&n| n >= SORT_EXPERTS_FROM),
        "no prompt long enough to sort: {lengths:?}"
    );
    let mut worst = 0f32;
    for n in lengths {
        let tokens = ids(&reference[&format!("ids_{n}")]);
        let diff = max_diff(
            &prompt_logits(&sorted, &tokens),
            &prompt_logits(&unsorted, &tokens),
        );
        println!(
            "{arch} {quant}: {n} tokens, sorted against unsorted experts: max |diff| {diff:.3e}"
        );
        worst = worst.max(diff);
    }
    worst
}

/// A copy of a tiny conversion with every floating tensor in float32 (the
/// packed quantized weights kept), so that the model computes in float32.
pub fn float32_copy(arch: &str, quant: &str) -> PathBuf {
    let from = folder(arch, quant);
    let to =
        std::env::temp_dir().join(format!("decisio-f32-{}-{arch}-{quant}", std::process::id()));
    std::fs::create_dir_all(&to).unwrap();
    for entry in std::fs::read_dir(&from).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("reference") {
            continue;
        }
        if name.ends_with(".safetensors") {
            let arrays = Array::load_safetensors(&path).unwrap();
            let cast: HashMap<String, Array> = arrays
                .into_iter()
                .map(|(k, a)| {
                    let a = match a.dtype() {
                        mlx_rs::Dtype::Bfloat16 | mlx_rs::Dtype::Float16 => {
                            a.as_dtype(mlx_rs::Dtype::Float32).unwrap()
                        }
                        _ => a,
                    };
                    (k, a)
                })
                .collect();
            Array::save_safetensors(cast.iter(), None, to.join(&name)).unwrap();
        } else if name.ends_with(".json") {
            std::fs::copy(&path, to.join(&name)).unwrap();
        }
    }
    to
}

/// Linear attention read in blocks of tokens against a token at a time,
/// both in MLX ops on a float32 copy of the conversion, on the reference
/// prompts up to `max_len` tokens: the worst difference of their logits.
pub fn chunked_against_steps(arch: &str, quant: &str, max_len: usize) -> f32 {
    let dir = float32_copy(arch, quant);
    let chunked = MlxModel::load_with(&dir, MLX_OPS).unwrap();
    let steps = MlxModel::load_with(&dir, MLX_LM_OPS).unwrap();
    let reference = reference(arch, quant, false);
    let mut worst = 0f32;
    for n in lengths(&reference, max_len) {
        let tokens = ids(&reference[&format!("ids_{n}")]);
        let (a, b) = (
            prompt_logits(&chunked, &tokens),
            prompt_logits(&steps, &tokens),
        );
        let diff = max_diff(&a, &b);
        println!(
            "{arch} {quant} in float32: {n} tokens, blocks against steps: max |diff| {diff:.3e}"
        );
        assert_eq!(argmax(&a), argmax(&b), "{arch} {quant}: {n} tokens");
        worst = worst.max(diff);
    }
    let _ = std::fs::remove_dir_all(&dir);
    worst
}

/// Linear attention read in blocks of tokens, in the conversion's own
/// bfloat16, against mlx-lm's logits on the reference prompts up to
/// `max_len` tokens: (worst difference, prompts with the same argmax,
/// prompts).
pub fn chunked_bfloat16_figures(arch: &str, quant: &str, max_len: usize) -> (f32, usize, usize) {
    let model = MlxModel::load_with(&folder(arch, quant), MLX_OPS).unwrap();
    let reference = reference(arch, quant, false);
    let lengths = lengths(&reference, max_len);
    let (mut worst, mut same) = (0f32, 0);
    for &n in &lengths {
        let tokens = ids(&reference[&format!("ids_{n}")]);
        let want = reference[&format!("logits_{n}")].as_slice::<f32>();
        let got = prompt_logits(&model, &tokens);
        let diff = max_diff(&got, want);
        let top = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        println!("{arch} {quant} in bfloat16, blocks: {n} tokens, max |diff| {diff:.3e} (largest logit {top:.3e})");
        worst = worst.max(diff);
        same += usize::from(argmax(&got) == argmax(want));
    }
    (worst, same, lengths.len())
}
