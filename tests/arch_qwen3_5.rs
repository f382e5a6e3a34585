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

mod tiny;

use std::path::PathBuf;

use tiny::{compare, CPU, MLX_OPS};

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

/// Snapshots of both kinds of caches (key/value and Gated DeltaNet)
/// continue bit for bit.
#[test]
fn snapshot_continues_bit_for_bit() {
    for (arch, quant, options) in [
        ("qwen3_5_moe", "4bit", CPU),
        ("qwen3_5_moe", "4bit", MLX_OPS),
        ("qwen3_5_moe", "bf16", CPU),
        ("qwen3_5", "6bit", CPU),
    ] {
        tiny::snapshot_continues_bit_for_bit(arch, quant, options);
    }
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

/// Sorting the token-expert pairs before `gather_qmm` (MLX's batched
/// kernel needs them sorted) changes no bit on the CPU, where each pair's
/// product is computed alone either way.
#[test]
fn sorted_experts_give_the_unsorted_bits() {
    for quant in ["4bit", "6bit"] {
        let worst = tiny::sorted_experts_difference("qwen3_5_moe", quant, 300);
        assert_eq!(worst, 0.0, "qwen3_5_moe {quant}");
    }
}
