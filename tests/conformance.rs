//! Numerical conformance: decisio's MLX forward pass against mlx-lm 0.32.2
//! on the same weights and token ids.
//!
//! The reference (`tests/fixtures/reference/logits.safetensors`, 24 prompts
//! of 5 to 500 tokens) is written by `scripts/reference/logits.py` on the
//! fixture conversion (`make reference-logits`; it takes about 9 minutes on
//! two cores, since mlx-lm runs MLX's slow CPU quantized kernels), and is
//! committed so that CI does not recompute it.

mod common;

use std::collections::HashMap;

use decisio::engine::mlx::{LoadOptions, MlxModel};
use mlx_rs::Array;

fn reference() -> HashMap<String, Array> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/reference/logits.safetensors");
    Array::load_safetensors(path).expect("the committed reference logits")
}

/// Dense weights and the host kernels (the CPU default): the same values,
/// another summation order, another `exp`.
#[test]
fn dequantized_logits_match_mlx_lm() {
    compare(
        LoadOptions {
            dequantize: true,
            ..LoadOptions::default()
        },
        usize::MAX,
        1e-3,
    );
}

/// Quantized weights and MLX's own ops, as mlx-lm holds and runs them
/// (checked on the shorter prompts: MLX's CPU quantized kernels are slow).
#[test]
fn quantized_logits_match_mlx_lm() {
    compare(
        LoadOptions {
            dequantize: false,
            host_kernels: false,
            ..LoadOptions::default()
        },
        10,
        1e-3,
    );
}

fn compare(options: LoadOptions, max_prompts: usize, tolerance: f32) {
    common::blas_as_served();
    let model = MlxModel::load_with(&common::model_dir(), options).expect("load the fixture");
    let reference = reference();
    let prompts = reference.keys().filter(|k| k.starts_with("ids_")).count();
    assert!(
        prompts >= 20,
        "the reference holds {prompts} prompts; expected at least 20"
    );
    let mut worst = 0f32;
    for i in 0..prompts.min(max_prompts) {
        let ids: Vec<u32> = reference[&format!("ids_{i}")]
            .as_slice::<i32>()
            .iter()
            .map(|&t| t as u32)
            .collect();
        let want = reference[&format!("logits_{i}")].as_slice::<f32>().to_vec();
        let got = model.last_logits(&ids).unwrap();
        assert_eq!(got.len(), want.len());
        let diff = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let argmax = |v: &[f32]| decisio::engine::mlx::sample::argmax(v);
        println!("prompt {i}: {} tokens, max |diff| {diff:.3e}", ids.len());
        assert_eq!(argmax(&got), argmax(&want), "argmax differs on prompt {i}");
        assert!(
            diff <= tolerance,
            "prompt {i} ({} tokens): max |diff| {diff}",
            ids.len()
        );
        worst = worst.max(diff);
    }
    println!(
        "{options:?}: {} prompts, worst max |diff| {worst:.3e}",
        prompts.min(max_prompts)
    );
}

/// The CPU profile (`decisio::engine::mlx::profile`) evaluates each
/// operation where it is built: the answers keep their bits, and every
/// class of the fixture's forward pass is counted, with the products'
/// arithmetic exactly the shapes' (`2 m k n`).
#[test]
fn the_profile_changes_no_bit_and_counts_every_class() {
    use decisio::engine::mlx::profile::{self, Class};
    common::blas_as_served();
    let model = MlxModel::load(&common::model_dir()).expect("load the fixture");
    let state: Vec<u32> = (0..300).map(|i| 100 + (i * 7919) % 40000).collect();
    let suffix: Vec<u32> = (0..20).map(|i| 200 + (i * 104729) % 40000).collect();
    let letters = [330u32, 331, 332, 333];
    let run = || {
        let mut cache = model.new_cache();
        model.prefill(&state, &mut cache, 128).unwrap();
        model
            .read_question(&suffix, &cache, 128, &letters, false, None)
            .unwrap()
    };
    let plain = run();
    profile::start();
    let profiled = run();
    let p = profile::finish();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&plain.logits), bits(&profiled.logits));
    assert_eq!(bits(&plain.logprobs), bits(&profiled.logprobs));
    for class in [
        Class::Products,
        Class::AttentionProducts,
        Class::Softmax,
        Class::Norms,
        Class::Rope,
        Class::Activations,
        Class::Residuals,
        Class::Cache,
        Class::Embedding,
        Class::Transfers,
    ] {
        let t = p.classes.get(&class).unwrap_or_else(|| panic!("{class:?}"));
        assert!(t.calls > 0 && t.seconds > 0.0, "{class:?}: {t:?}");
    }
    let counted: f64 = p
        .products
        .iter()
        .filter(|(s, _)| s.linear)
        .map(|(s, &n)| s.flops() * n as f64)
        .sum();
    assert_eq!(counted, p.classes[&Class::Products].flops);
    // Off again: nothing is gathered.
    run();
    assert!(profile::finish().classes.is_empty());
}
