//! The `qwen3_5_moe` and `qwen3_5` architectures against mlx-lm 0.32.2 on
//! tiny random-weight conversions of Qwen3.6-35B-A3B's and Qwen3.6-27B's
//! structures (bf16, 6-bit, 4-bit), made with
//! their reference logits by `scripts/reference/tiny_models.py` (`make
//! reference`; the folder is `$DECISIO_REFERENCE_DIR/tiny`, by default
//! `target/reference/tiny`).
//!
//! Quantized weights with MLX's ops are compared with mlx-lm on the
//! conversion; dequantized weights with the host kernels (the CPU default)
//! with mlx-lm on its dequantized copy of the conversion. Every path within
//! 1e-3 of its reference on prompts of 1 to 2,000 tokens (read in chunks of
//! 256 as the engine reads them) and on continuations from a cloned cache.

use std::collections::HashMap;
use std::path::PathBuf;

use decisio::engine::mlx::sample::argmax;
use decisio::engine::mlx::{LoadOptions, MlxModel};
use mlx_rs::Array;

const TOLERANCE: f32 = 1e-3;
/// The engine reads prompts in chunks of this many tokens.
const CHUNK: usize = 256;

fn folder(arch: &str, quant: &str) -> PathBuf {
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
fn reference(arch: &str, quant: &str, dense: bool) -> HashMap<String, Array> {
    let file = if dense && quant != "bf16" {
        "reference_dense.safetensors"
    } else {
        "reference.safetensors"
    };
    Array::load_safetensors(folder(arch, quant).join(file)).expect("the reference logits")
}

fn ids(a: &Array) -> Vec<u32> {
    a.as_slice::<i32>().iter().map(|&t| t as u32).collect()
}

fn logits(model: &MlxModel, hidden: &Array) -> Vec<f32> {
    let l = model.logits(hidden).unwrap().as_type::<f32>().unwrap();
    l.eval().unwrap();
    l.as_slice::<f32>().to_vec()
}

fn max_diff(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max)
}

/// Every prompt length (read in chunks as the engine reads it) and every
/// prefix + continuation pair (the continuation from a clone of the
/// prefix's cache); returns the worst difference.
fn compare(arch: &str, quant: &str, options: LoadOptions, max_len: usize) -> f32 {
    let model =
        MlxModel::load_with(&folder(arch, quant), options).expect("load the tiny conversion");
    assert_eq!(model.info.architecture, arch);
    let reference = reference(arch, quant, options.dequantize);
    let mut lengths: Vec<usize> = reference
        .keys()
        .filter_map(|k| k.strip_prefix("ids_")?.parse().ok())
        .collect();
    lengths.sort_unstable();
    assert!(lengths.len() >= 8, "the reference holds {lengths:?}");
    let label = format!(
        "{arch} {quant} ({})",
        if options.dequantize {
            "dequantized, host kernels"
        } else {
            "as stored, MLX ops"
        }
    );
    let mut worst = 0f32;
    for n in lengths.into_iter().filter(|&n| n <= max_len) {
        let tokens = ids(&reference[&format!("ids_{n}")]);
        let want = reference[&format!("logits_{n}")].as_slice::<f32>();
        let mut cache = model.new_cache();
        let last = model.prefill(&tokens, &mut cache, CHUNK).unwrap();
        let got = logits(&model, &last);
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
    println!("{label}: worst max |diff| {worst:.3e}");
    worst
}

const CPU: LoadOptions = LoadOptions {
    dequantize: true,
    host_kernels: true,
};
const MLX_OPS: LoadOptions = LoadOptions {
    dequantize: false,
    host_kernels: false,
};

#[test]
fn moe_bf16_matches_mlx_lm() {
    compare("qwen3_5_moe", "bf16", CPU, usize::MAX);
}

#[test]
fn moe_bf16_with_mlx_ops_matches_mlx_lm() {
    compare("qwen3_5_moe", "bf16", MLX_OPS, 700);
}

#[test]
fn moe_six_bit_dequantized_matches_mlx_lm() {
    compare("qwen3_5_moe", "6bit", CPU, usize::MAX);
}

#[test]
fn moe_six_bit_quantized_matches_mlx_lm() {
    compare("qwen3_5_moe", "6bit", MLX_OPS, 700);
}

#[test]
fn moe_four_bit_dequantized_matches_mlx_lm() {
    compare("qwen3_5_moe", "4bit", CPU, usize::MAX);
}

#[test]
fn moe_four_bit_quantized_matches_mlx_lm() {
    compare("qwen3_5_moe", "4bit", MLX_OPS, 700);
}

#[test]
fn dense_bf16_matches_mlx_lm() {
    compare("qwen3_5", "bf16", CPU, usize::MAX);
}

#[test]
fn dense_bf16_with_mlx_ops_matches_mlx_lm() {
    compare("qwen3_5", "bf16", MLX_OPS, 700);
}

#[test]
fn dense_six_bit_dequantized_matches_mlx_lm() {
    compare("qwen3_5", "6bit", CPU, usize::MAX);
}

#[test]
fn dense_six_bit_quantized_matches_mlx_lm() {
    compare("qwen3_5", "6bit", MLX_OPS, 700);
}

#[test]
fn dense_four_bit_dequantized_matches_mlx_lm() {
    compare("qwen3_5", "4bit", CPU, usize::MAX);
}

#[test]
fn dense_four_bit_quantized_matches_mlx_lm() {
    compare("qwen3_5", "4bit", MLX_OPS, 700);
}

/// A snapshot (a clone of the prefix's cache) continued with two different
/// suffixes gives, bit for bit, what a fresh cache gives for the same prefix
/// and suffix read in the same two steps; and continuing from it leaves the
/// snapshot as it was.
#[test]
fn snapshot_continues_bit_for_bit() {
    for (arch, quant, options) in [
        ("qwen3_5_moe", "4bit", CPU),
        ("qwen3_5_moe", "4bit", MLX_OPS),
        ("qwen3_5_moe", "bf16", CPU),
        ("qwen3_5", "6bit", CPU),
    ] {
        let model = MlxModel::load_with(&folder(arch, quant), options).unwrap();
        let prefix: Vec<u32> = (0..300).map(|i| (i * 37 + 11) % 1024).collect();
        let suffixes: [Vec<u32>; 2] =
            [vec![5, 900, 17], (0..40).map(|i| (i * 13) % 1024).collect()];
        let mut cache = model.new_cache();
        model.prefill(&prefix, &mut cache, CHUNK).unwrap();
        cache.eval().unwrap();
        let snapshot = cache;
        let mut from_snapshot = Vec::new();
        for suffix in &suffixes {
            let mut c = snapshot.clone();
            from_snapshot.push(logits(&model, &model.last_hidden(suffix, &mut c).unwrap()));
        }
        // The snapshot is untouched: reading the first suffix again agrees.
        let mut again = snapshot.clone();
        let repeat = logits(
            &model,
            &model.last_hidden(&suffixes[0], &mut again).unwrap(),
        );
        assert_eq!(repeat, from_snapshot[0], "{quant}: the snapshot changed");
        for (suffix, got) in suffixes.iter().zip(&from_snapshot) {
            let mut fresh = model.new_cache();
            model.prefill(&prefix, &mut fresh, CHUNK).unwrap();
            cache_eval(&fresh);
            let want = logits(&model, &model.last_hidden(suffix, &mut fresh).unwrap());
            assert_eq!(
                got, &want,
                "{quant}: a continuation from the snapshot differs from a fresh cache"
            );
        }
        assert_ne!(from_snapshot[0], from_snapshot[1]);
        println!("{arch} {quant} {options:?}: snapshot continuations equal bit for bit");
    }
}

fn cache_eval(c: &decisio::engine::mlx::cache::ModelCache) {
    c.eval().unwrap();
}

fn base(name: &str) -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/bases")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The real configs parse; a config the layers cannot run is a config
/// error that says what is wrong, not a panic.
#[test]
fn configs_are_checked() {
    use decisio::engine::mlx::qwen3_5::Config;
    let moe = base("qwen3_5_moe-35b-a3b.config.json");
    let c = Config::from_config(&moe).unwrap();
    assert_eq!(
        (
            c.num_experts,
            c.num_experts_per_tok,
            c.full_attention_interval
        ),
        (256, 8, 4)
    );
    Config::from_config(&base("qwen3_5-27b.config.json")).unwrap();
    let broken = |edit: &dyn Fn(&mut serde_json::Value), says: &str| {
        let mut v = moe.clone();
        edit(&mut v["text_config"]);
        let err = Config::from_config(&v)
            .expect_err("a config error")
            .to_string();
        assert!(err.contains(says), "{err:?} should mention {says}");
    };
    broken(
        &|t| t["full_attention_interval"] = 0.into(),
        "full_attention_interval",
    );
    broken(
        &|t| t["linear_num_value_heads"] = 33.into(),
        "linear_num_value_heads",
    );
    broken(
        &|t| t["num_key_value_heads"] = 3.into(),
        "num_key_value_heads",
    );
    broken(
        &|t| t["num_experts_per_tok"] = 300.into(),
        "num_experts_per_tok",
    );
    broken(
        &|t| t["rope_parameters"]["rope_type"] = "yarn".into(),
        "yarn",
    );
    broken(
        &|t| {
            t.as_object_mut().unwrap().remove("hidden_size");
        },
        "hidden_size",
    );
}
