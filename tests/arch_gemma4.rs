//! The Gemma 4 architecture (`gemma4`, `gemma4_text`) against mlx-lm 0.32.2
//! on tiny random-weight conversions (bf16, 6-bit, 4-bit) of the structures
//! of Gemma 4 31B and 12B (`gemma4_31b`, `gemma4_12b`: five sliding layers
//! and a full one, their head ratios, shared keys and values on full
//! layers, the proportional rope) and of the features neither base enables
//! (`gemma4_text_shared_kv`: per-layer inputs, KV-shared layers of both
//! kinds, double-wide MLPs) and of the mixture-of-experts block
//! (`gemma4_text_moe`), made with their reference logits by
//! `scripts/reference/tiny_models.py`. The sliding window is 64, so the
//! prompts of up to 2,000 tokens and the continuations (up to 600 + 257
//! tokens) run far beyond it.
//!
//! As for every architecture: quantized weights with MLX's ops against
//! mlx-lm on the conversion, dequantized weights with the host kernels (the
//! CPU default) against mlx-lm on its dequantized copy; within 1e-3 with
//! the same argmax.

mod tiny;

use decisio::engine::mlx::MlxModel;
use tiny::{compare, folder, CPU, MLX_OPS};

const QUANTS: [&str; 3] = ["bf16", "6bit", "4bit"];

/// Every quantization of `arch`. The CPU default runs every prompt (up to
/// 2,000 tokens); MLX's quantized CPU kernels are slow on long prompts, so
/// that path runs those up to 700 tokens (still ten windows long).
fn all_quants(arch: &str, options: decisio::engine::mlx::LoadOptions) {
    let max_len = if options.dequantize { usize::MAX } else { 700 };
    for quant in QUANTS {
        compare(arch, quant, options, max_len);
    }
}

#[test]
fn gemma4_31b_dequantized_matches_mlx_lm() {
    all_quants("gemma4_31b", CPU);
}

#[test]
fn gemma4_31b_quantized_matches_mlx_lm() {
    all_quants("gemma4_31b", MLX_OPS);
}

#[test]
fn gemma4_12b_dequantized_matches_mlx_lm() {
    all_quants("gemma4_12b", CPU);
}

#[test]
fn gemma4_12b_quantized_matches_mlx_lm() {
    all_quants("gemma4_12b", MLX_OPS);
}

#[test]
fn gemma4_text_shared_kv_dequantized_matches_mlx_lm() {
    all_quants("gemma4_text_shared_kv", CPU);
}

#[test]
fn gemma4_text_shared_kv_quantized_matches_mlx_lm() {
    all_quants("gemma4_text_shared_kv", MLX_OPS);
}

#[test]
fn gemma4_text_moe_dequantized_matches_mlx_lm() {
    all_quants("gemma4_text_moe", CPU);
}

#[test]
fn gemma4_text_moe_quantized_matches_mlx_lm() {
    all_quants("gemma4_text_moe", MLX_OPS);
}

/// Sorting the token-expert pairs before `gather_qmm` changes no bit on
/// the CPU (tests/arch_qwen3_5.rs says why).
#[test]
fn gemma4_text_moe_sorted_experts_give_the_unsorted_bits() {
    for quant in ["4bit", "6bit"] {
        let worst = tiny::sorted_experts_difference("gemma4_text_moe", quant, 70);
        assert_eq!(worst, 0.0, "gemma4_text_moe {quant}");
    }
}

/// Sliding-window caches, full-attention caches and KV-shared layers
/// continue from a snapshot bit for bit, with the state beyond the window.
#[test]
fn snapshot_continues_bit_for_bit() {
    for (arch, quant, options) in [
        ("gemma4_31b", "6bit", CPU),
        ("gemma4_31b", "4bit", MLX_OPS),
        ("gemma4_12b", "bf16", CPU),
        ("gemma4_text_shared_kv", "6bit", CPU),
        ("gemma4_text_moe", "4bit", MLX_OPS),
    ] {
        tiny::snapshot_continues_bit_for_bit(arch, quant, options);
    }
}

/// The cache keeps `window - 1` positions per sliding layer, however long
/// the state: a snapshot's size stops growing with the state on those
/// layers (only full-attention layers grow).
#[test]
fn sliding_layers_hold_no_more_than_the_window() {
    let model = MlxModel::load(&folder("gemma4_31b", "bf16")).unwrap();
    let size_after = |n: usize| {
        let tokens: Vec<u32> = (0..n as u32).map(|i| i % 1000).collect();
        let mut cache = model.new_cache();
        model.prefill(&tokens, &mut cache, 256).unwrap();
        cache.eval().unwrap();
        cache.layers.iter().map(|l| l.nbytes()).collect::<Vec<_>>()
    };
    let (short, long) = (size_after(200), size_after(1000));
    // Five sliding layers and one full layer (the 31B pattern).
    assert_eq!(short.len(), 6);
    for (i, (s, l)) in short.iter().zip(&long).enumerate() {
        if i == 5 {
            assert_eq!(*l, s * 5, "the full layer keeps every position");
        } else {
            assert_eq!(s, l, "sliding layer {i} grew with the state");
        }
    }
}

/// A `gemma4_unified` conversion (the published Gemma 4 12B's type: the
/// same language model under `language_model.`, with vision and audio
/// towers beside it) loads its text model and drops the towers: the same
/// conversion relabelled, with tower tensors added in a shard of their
/// own, gives the same logits bit for bit.
#[test]
fn gemma4_unified_loads_the_language_model() {
    let from = folder("gemma4_12b", "6bit");
    let dir = std::env::temp_dir().join(format!("decisio-{}-unified", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut index: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(from.join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    for entry in std::fs::read_dir(&from).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if name.starts_with("model") {
            std::fs::copy(&path, dir.join(&name)).unwrap();
        }
    }
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(from.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["model_type"], "gemma4");
    config["model_type"] = "gemma4_unified".into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let towers = [
        "vision_tower.encoder.layers.0.weight",
        "model.audio_tower.conv.weight",
        "embed_vision.embedding_projection.weight",
    ];
    let zeros = mlx_rs::Array::from_slice(&[0f32; 4], &[2, 2]);
    mlx_rs::Array::save_safetensors(
        towers.iter().map(|t| (*t, &zeros)),
        None,
        dir.join("towers.safetensors"),
    )
    .unwrap();
    for t in towers {
        index["weight_map"][t] = "towers.safetensors".into();
    }
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();

    let tokens: Vec<u32> = (0..90u32).map(|i| (i * 7 + 3) % 1024).collect();
    let unified = MlxModel::load(&dir).expect("a gemma4_unified conversion loads");
    assert_eq!(unified.info.architecture, "gemma4_unified");
    let wrapped = MlxModel::load(&from).unwrap();
    let (a, b) = (
        unified.last_logits(&tokens).unwrap(),
        wrapped.last_logits(&tokens).unwrap(),
    );
    assert_eq!(
        a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        b.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
