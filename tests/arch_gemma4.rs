//! Gemma 4 (`gemma4`, `gemma4_text`) against mlx-lm 0.32.2 on tiny
//! random-weight conversions that keep the structure of the real 12B and
//! 31B configs (and one with KV-shared layers and per-layer inputs), in
//! bf16 and quantized at 6 and 4 bits.
//!
//! `scripts/reference/tiny_gemma4.py` (run by `make reference`) writes the
//! conversions and mlx-lm's float32 logits of the last position: prompts of
//! 1 to 2,000 tokens (the sliding window is 64) on a fresh cache, and a
//! continuation after a prefix read through mlx-lm's caches. Here the
//! prefix goes through [`MlxModel::prefill`] in chunks of 256 and the
//! continuation through [`MlxModel::last_hidden`] on a clone of the cache,
//! as the engine answers a question from a cached state.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;

use decisio::engine::mlx::sample::argmax;
use decisio::engine::mlx::{LoadOptions, MlxModel};
use mlx_rs::Array;

const MODELS: [&str; 3] = ["gemma4-31b", "gemma4-12b", "gemma4-shared-kv"];
const TOLERANCE: f32 = 1e-3;

fn conversion(model: &str, quant: &str) -> (PathBuf, HashMap<String, Array>) {
    let reference = common::reference_file(&format!("tiny/{model}/{quant}.safetensors"));
    let dir = reference.with_extension("");
    let figures = Array::load_safetensors(&reference).expect("the reference figures");
    (dir, figures)
}

fn ids(a: &Array) -> Vec<u32> {
    a.as_slice::<i32>().iter().map(|&t| t as u32).collect()
}

fn logits(model: &MlxModel, last: &Array) -> Vec<f32> {
    let l = model.logits(last).unwrap().as_type::<f32>().unwrap();
    l.eval().unwrap();
    l.as_slice::<f32>().to_vec()
}

/// The largest |difference|, after checking the argmax agrees.
fn compare(got: &[f32], want: &[f32], what: &str) -> f32 {
    compare_within(got, want, what, TOLERANCE)
}

fn compare_within(got: &[f32], want: &[f32], what: &str, tolerance: f32) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}: vocabulary sizes differ");
    assert_eq!(argmax(got), argmax(want), "{what}: argmax differs");
    let diff = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(diff <= tolerance, "{what}: max |diff| {diff:.3e}");
    diff
}

/// Every prompt and continuation of one conversion under `options`;
/// returns the worst difference.
fn check(model_name: &str, quant: &str, options: LoadOptions, label: &str) -> f32 {
    let (dir, want) = conversion(model_name, quant);
    let model = MlxModel::load_with(&dir, options).expect("load the tiny conversion");
    let mut worst = 0f32;
    let prompts = want.keys().filter(|k| k.starts_with("ids_")).count();
    assert!(prompts >= 8, "{model_name}/{quant}: only {prompts} prompts");
    for i in 0..prompts {
        let tokens = ids(&want[&format!("ids_{i}")]);
        let got = model.last_logits(&tokens).unwrap();
        let what = format!("{model_name} {quant} {label}: {} tokens", tokens.len());
        let d = compare(&got, want[&format!("logits_{i}")].as_slice::<f32>(), &what);
        println!("{what}: max |diff| {d:.3e}");
        worst = worst.max(d);
    }
    let continuations = want.keys().filter(|k| k.starts_with("prefix_")).count();
    assert!(continuations >= 4);
    for j in 0..continuations {
        let prefix = ids(&want[&format!("prefix_{j}")]);
        let suffix = ids(&want[&format!("suffix_{j}")]);
        let mut cache = model.new_cache();
        model.prefill(&prefix, &mut cache, 256).unwrap();
        cache.eval().unwrap();
        let mut question = cache.clone();
        let last = model.last_hidden(&suffix, &mut question).unwrap();
        let what = format!(
            "{model_name} {quant} {label}: {} + {} tokens",
            prefix.len(),
            suffix.len()
        );
        let d = compare(
            &logits(&model, &last),
            want[&format!("cont_{j}")].as_slice::<f32>(),
            &what,
        );
        println!("{what}: max |diff| {d:.3e}");
        worst = worst.max(d);
    }
    println!("{model_name} {quant} {label}: worst max |diff| {worst:.3e}");
    worst
}

/// The CPU defaults: weights dequantized at load, softmax by the host
/// kernels.
#[test]
fn dequantized_with_host_kernels_match_mlx_lm() {
    let options = LoadOptions {
        dequantize: true,
        host_kernels: true,
    };
    for model in MODELS {
        for quant in ["bf16", "6bit", "4bit"] {
            check(model, quant, options, "dequantized+host");
        }
    }
}

/// Weights as stored (quantized matrices multiplied by MLX's quantized
/// kernels) and MLX's own attention, as mlx-lm runs them.
#[test]
fn quantized_with_mlx_ops_match_mlx_lm() {
    let options = LoadOptions {
        dequantize: false,
        host_kernels: false,
    };
    for model in MODELS {
        for quant in ["bf16", "6bit", "4bit"] {
            check(model, quant, options, "quantized+mlx");
        }
    }
}

/// A state longer than the window, snapshotted and continued with two
/// different questions: each answer is bit for bit the one computed with
/// the prefix and the question in the same two steps on a fresh cache, and
/// answering one question leaves the snapshot as it was for the other.
#[test]
fn snapshots_continue_bit_for_bit() {
    for model_name in MODELS {
        for (quant, options) in [
            ("6bit", LoadOptions::default()),
            (
                "4bit",
                LoadOptions {
                    dequantize: false,
                    host_kernels: false,
                },
            ),
        ] {
            let (dir, _) = conversion(model_name, quant);
            let model = MlxModel::load_with(&dir, options).unwrap();
            let prefix: Vec<u32> = (0..300u32).map(|i| (i * 7919 + 13) % 1024).collect();
            let questions: [Vec<u32>; 2] = [
                (0..17u32).map(|i| (i * 31 + 5) % 1024).collect(),
                (0..90u32).map(|i| (i * 101 + 7) % 1024).collect(),
            ];
            let mut state = model.new_cache();
            model.prefill(&prefix, &mut state, 256).unwrap();
            state.eval().unwrap();
            let snapshot = state.clone();
            let answer = |cache: &mut decisio::engine::mlx::cache::ModelCache, q: &[u32]| {
                let last = model.last_hidden(q, cache).unwrap();
                logits(&model, &last)
            };
            let first: Vec<Vec<f32>> = questions
                .iter()
                .map(|q| answer(&mut snapshot.clone(), q))
                .collect();
            assert_ne!(first[0], first[1], "two questions gave the same logits");
            for (q, from_snapshot) in questions.iter().zip(&first) {
                let mut fresh = model.new_cache();
                model.prefill(&prefix, &mut fresh, 256).unwrap();
                fresh.eval().unwrap();
                let direct = answer(&mut fresh, q);
                assert_eq!(
                    from_snapshot
                        .iter()
                        .map(|x| x.to_bits())
                        .collect::<Vec<_>>(),
                    direct.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{model_name} {quant}: a continuation from the snapshot differs"
                );
                let again = answer(&mut snapshot.clone(), q);
                assert_eq!(
                    from_snapshot
                        .iter()
                        .map(|x| x.to_bits())
                        .collect::<Vec<_>>(),
                    again.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{model_name} {quant}: the snapshot changed after a question"
                );
            }
            println!("{model_name} {quant} {options:?}: snapshot continuations bit for bit");
        }
    }
}

/// The cache keeps `window - 1` positions per sliding layer, however long
/// the state: a snapshot's size stops growing with the state on those
/// layers (only full-attention layers grow).
#[test]
fn sliding_layers_hold_no_more_than_the_window() {
    let (dir, _) = conversion("gemma4-31b", "bf16");
    let model = MlxModel::load(&dir).unwrap();
    let size_after = |n: usize| {
        let tokens: Vec<u32> = (0..n as u32).map(|i| i % 1000).collect();
        let mut cache = model.new_cache();
        model.prefill(&tokens, &mut cache, 256).unwrap();
        cache.eval().unwrap();
        cache.layers.iter().map(|l| l.nbytes()).collect::<Vec<_>>()
    };
    let (short, long) = (size_after(200), size_after(1000));
    // Five sliding layers and one full layer (the 31B pattern).
    for (i, (s, l)) in short.iter().zip(&long).enumerate() {
        if i == 5 {
            assert_eq!(*l, s * 5, "the full layer keeps every position");
        } else {
            assert_eq!(s, l, "sliding layer {i} grew with the state");
        }
    }
}
