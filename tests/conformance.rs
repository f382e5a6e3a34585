//! Numerical conformance: decisio's MLX forward pass against mlx-lm 0.32.2
//! on the same weights and token ids (reference from `make reference`).

mod common;

use decisio::engine::mlx::MlxModel;
use mlx_rs::Array;

#[test]
fn last_position_logits_match_mlx_lm() {
    let model = MlxModel::load(&common::model_dir()).expect("load the fixture");
    let reference = Array::load_safetensors(common::reference_file("logits.safetensors")).unwrap();
    let prompts = reference.keys().filter(|k| k.starts_with("ids_")).count();
    assert!(prompts >= 20, "the reference holds {prompts} prompts; expected at least 20");
    let mut worst = 0f32;
    for i in 0..prompts {
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
        assert!(diff <= 1e-3, "prompt {i} ({} tokens): max |diff| {diff}", ids.len());
        worst = worst.max(diff);
    }
    println!("{prompts} prompts, worst max |diff| {worst:.3e}");
}
