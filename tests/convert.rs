//! `decisio convert` end to end on a real checkpoint: SmolLM2-135M-Instruct
//! as a Q4_1 GGUF (token embedding in Q8_0, no output.weight).
//!
//! The asset lives in `$DECISIO_ASSETS/smollm2/` (default
//! `$HOME/.cache/decisio/assets`); `scripts/fetch-assets.sh` fetches it. A
//! missing asset fails the tests: they never pass by skipping.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use decisio::convert::{
    convert_gguf, convert_gguf_with, ConvertError, ConvertOptions, OUTPUT_FILES,
};
use mlx_rs::io::GgufFile;
use mlx_rs::{Array, Dtype};
use serde_json::Value;
use tokenizers::Tokenizer;

const GGUF_NAME: &str = "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const LAYERS: usize = 30;
const HIDDEN: i32 = 576;
const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const FFN: i32 = 1536;
const VOCAB: i32 = 49152;

fn asset() -> PathBuf {
    let root = std::env::var_os("DECISIO_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").expect("HOME is not set; set DECISIO_ASSETS");
            PathBuf::from(home).join(".cache/decisio/assets")
        });
    let path = root.join(GGUF_NAME);
    assert!(
        path.is_file(),
        "test asset {} is missing: run scripts/fetch-assets.sh, or point DECISIO_ASSETS at \
         the folder that holds {GGUF_NAME}",
        path.display()
    );
    path
}

/// A fresh scratch folder, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "decisio-convert-test-{name}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&fs::read_to_string(path).unwrap()).unwrap()
}

fn rows_u32(a: &Array) -> Vec<u32> {
    a.as_slice::<u32>().to_vec()
}

fn rows_f16(a: &Array) -> Vec<u16> {
    a.as_slice::<half::f16>()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// Row `row` of a 2-D array, as raw values.
fn row<T: Copy>(values: &[T], width: usize, row: usize) -> Vec<T> {
    values[row * width..(row + 1) * width].to_vec()
}

#[test]
fn converts_smollm2_into_a_complete_folder() {
    let gguf = asset();
    let scratch = Scratch::new("main");
    let out = scratch.path().join("smollm2-mlx");

    let report = convert_gguf(&gguf, &out).expect("conversion succeeds");
    assert_eq!(report.architecture, "llama");
    assert!(report.tie_word_embeddings);
    assert_eq!(report.tensors, LAYERS * 7 * 3 + 3 + LAYERS * 2 + 1);

    // The folder: exactly the five files, nothing left beside it.
    let mut files: Vec<String> = fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files, OUTPUT_FILES);
    let siblings: Vec<_> = fs::read_dir(scratch.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(siblings, ["smollm2-mlx"], "no staging folder left behind");

    check_config(&out);
    check_tensors(&out);
    check_unpermuted_qk(&gguf, &out);
    check_tokenizer(&out);

    // An existing, non-empty target is refused and left alone...
    let marker = out.join("config.json");
    let before = fs::read(&marker).unwrap();
    let err = convert_gguf(&gguf, &out).unwrap_err();
    assert!(matches!(err, ConvertError::OutputExists { .. }), "{err}");
    assert!(err.to_string().contains("--force"), "{err}");
    assert_eq!(fs::read(&marker).unwrap(), before);

    // ...and replaced with force, here with float32 scales: the same values,
    // widened exactly.
    let half = Array::load_safetensors(out.join("model.safetensors")).unwrap();
    fs::write(out.join("stale.txt"), "old").unwrap();
    let options = ConvertOptions {
        force: true,
        float_dtype: Some(decisio::convert::FloatDtype::Float32),
        weights: Default::default(),
    };
    convert_gguf_with(&gguf, &out, &options).unwrap();
    assert!(!out.join("stale.txt").exists());
    let wide = Array::load_safetensors(out.join("model.safetensors")).unwrap();
    for name in [
        "model.layers.3.mlp.up_proj.scales",
        "model.embed_tokens.biases",
    ] {
        assert_eq!(wide[name].dtype(), Dtype::Float32, "{name}");
        let a = half[name].as_dtype(Dtype::Float32).unwrap();
        assert_eq!(a.as_slice::<f32>(), wide[name].as_slice::<f32>(), "{name}");
    }
    assert_eq!(
        rows_u32(&half["model.layers.3.mlp.up_proj.weight"]),
        rows_u32(&wide["model.layers.3.mlp.up_proj.weight"])
    );
}

fn check_config(out: &Path) {
    let config = read_json(&out.join("config.json"));
    let expect = [
        ("model_type", serde_json::json!("llama")),
        ("architectures", serde_json::json!(["LlamaForCausalLM"])),
        ("hidden_size", HIDDEN.into()),
        ("intermediate_size", FFN.into()),
        ("num_hidden_layers", LAYERS.into()),
        ("num_attention_heads", HEADS.into()),
        ("num_key_value_heads", KV_HEADS.into()),
        ("head_dim", HEAD_DIM.into()),
        ("max_position_embeddings", 8192.into()),
        ("vocab_size", VOCAB.into()),
        ("tie_word_embeddings", true.into()),
        ("bos_token_id", 1.into()),
        ("eos_token_id", 2.into()),
    ];
    for (key, value) in expect {
        assert_eq!(config[key], value, "config.json {key}");
    }
    assert_eq!(config["rms_norm_eps"].as_f64(), Some(1e-5));
    assert_eq!(config["rope_theta"].as_f64(), Some(100000.0));
    let quantization = serde_json::json!({
        "group_size": 32, "bits": 4, "mode": "affine",
        "model.embed_tokens": {"group_size": 32, "bits": 8, "mode": "affine"},
    });
    assert_eq!(config["quantization"], quantization);
    assert_eq!(config["quantization_config"], quantization);

    let generation = read_json(&out.join("generation_config.json"));
    assert_eq!(generation["bos_token_id"], 1);
    assert_eq!(generation["eos_token_id"], 2);

    let tc = read_json(&out.join("tokenizer_config.json"));
    assert_eq!(tc["bos_token"], "<|im_start|>");
    assert_eq!(tc["eos_token"], "<|im_end|>");
    assert_eq!(tc["unk_token"], "<|endoftext|>");
    assert_eq!(tc["pad_token"], "<|im_end|>");
    assert_eq!(tc["add_bos_token"], false);
    assert_eq!(tc["add_eos_token"], false);
    assert_eq!(tc["model_max_length"], 8192);
    assert_eq!(tc["tokenizer_class"], "PreTrainedTokenizerFast");
    assert_eq!(tc["clean_up_tokenization_spaces"], false);
    assert!(tc["chat_template"]
        .as_str()
        .unwrap()
        .contains("<|im_start|>"));
    let decoder = tc["added_tokens_decoder"].as_object().unwrap();
    assert_eq!(decoder.len(), 17, "the GGUF marks 17 control tokens");
    assert_eq!(
        decoder["2"],
        serde_json::json!({"content": "<|im_end|>", "lstrip": false, "normalized": false,
                           "rstrip": false, "single_word": false, "special": true})
    );
}

fn check_tensors(out: &Path) {
    let (arrays, metadata) =
        Array::load_safetensors_with_metadata(out.join("model.safetensors")).unwrap();
    assert_eq!(metadata.get("format").map(String::as_str), Some("mlx"));
    let mut expected: HashMap<String, (Dtype, Vec<i32>)> = HashMap::new();
    let mut quantized = |name: String, rows: i32, cols: i32, bits: i32| {
        let groups = cols / 32;
        expected.insert(
            format!("{name}.weight"),
            (Dtype::Uint32, vec![rows, cols * bits / 32]),
        );
        expected.insert(
            format!("{name}.scales"),
            (Dtype::Float16, vec![rows, groups]),
        );
        expected.insert(
            format!("{name}.biases"),
            (Dtype::Float16, vec![rows, groups]),
        );
    };
    quantized("model.embed_tokens".into(), VOCAB, HIDDEN, 8);
    let (q, kv) = ((HEADS * HEAD_DIM) as i32, (KV_HEADS * HEAD_DIM) as i32);
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}");
        quantized(format!("{p}.self_attn.q_proj"), q, HIDDEN, 4);
        quantized(format!("{p}.self_attn.k_proj"), kv, HIDDEN, 4);
        quantized(format!("{p}.self_attn.v_proj"), kv, HIDDEN, 4);
        quantized(format!("{p}.self_attn.o_proj"), HIDDEN, q, 4);
        quantized(format!("{p}.mlp.gate_proj"), FFN, HIDDEN, 4);
        quantized(format!("{p}.mlp.up_proj"), FFN, HIDDEN, 4);
        quantized(format!("{p}.mlp.down_proj"), HIDDEN, FFN, 4);
    }
    for l in 0..LAYERS {
        for norm in ["input_layernorm", "post_attention_layernorm"] {
            expected.insert(
                format!("model.layers.{l}.{norm}.weight"),
                (Dtype::Float32, vec![HIDDEN]),
            );
        }
    }
    expected.insert("model.norm.weight".into(), (Dtype::Float32, vec![HIDDEN]));

    let mut names: Vec<&String> = arrays.keys().collect();
    names.sort();
    let mut want: Vec<&String> = expected.keys().collect();
    want.sort();
    assert_eq!(names, want, "tensor names");
    for (name, (dtype, shape)) in &expected {
        let a = &arrays[name];
        assert_eq!(a.dtype(), *dtype, "{name} dtype");
        assert_eq!(a.shape(), shape.as_slice(), "{name} shape");
    }
}

/// Hugging Face row `h*D + j*D/2 + i` is GGUF row `h*D + 2*i + j`: llama.cpp
/// interleaves the two halves of every head.
fn gguf_row_of(hf_row: usize) -> usize {
    let (head, within) = (hf_row / HEAD_DIM, hf_row % HEAD_DIM);
    let (half, i) = (within / (HEAD_DIM / 2), within % (HEAD_DIM / 2));
    head * HEAD_DIM + 2 * i + half
}

fn check_unpermuted_qk(gguf: &Path, out: &Path) {
    let source = GgufFile::load(gguf).unwrap();
    let converted = Array::load_safetensors(out.join("model.safetensors")).unwrap();
    for layer in [0, 17, LAYERS - 1] {
        for (gguf_part, hf_part, heads, permuted) in [
            ("attn_q", "q_proj", HEADS, true),
            ("attn_k", "k_proj", KV_HEADS, true),
            ("attn_v", "v_proj", KV_HEADS, false),
        ] {
            for suffix in ["weight", "scales", "biases"] {
                let src = source
                    .get_array(&format!("blk.{layer}.{gguf_part}.{suffix}"))
                    .unwrap()
                    .unwrap();
                let dst = &converted[&format!("model.layers.{layer}.self_attn.{hf_part}.{suffix}")];
                assert_eq!(src.shape(), dst.shape());
                let width = src.shape()[1] as usize;
                let (src, dst): (Vec<u64>, Vec<u64>) = if suffix == "weight" {
                    (
                        rows_u32(&src).into_iter().map(u64::from).collect(),
                        rows_u32(dst).into_iter().map(u64::from).collect(),
                    )
                } else {
                    (
                        rows_f16(&src).into_iter().map(u64::from).collect(),
                        rows_f16(dst).into_iter().map(u64::from).collect(),
                    )
                };
                // The whole first and last head, row by row.
                let rows = heads * HEAD_DIM;
                for hf_row in (0..HEAD_DIM).chain(rows - HEAD_DIM..rows) {
                    let from = if permuted {
                        gguf_row_of(hf_row)
                    } else {
                        hf_row
                    };
                    assert_eq!(
                        row(&dst, width, hf_row),
                        row(&src, width, from),
                        "layer {layer} {hf_part}.{suffix} row {hf_row}"
                    );
                }
                // And as a whole it is a reordering of the same rows.
                if permuted {
                    let mut a: Vec<Vec<u64>> = (0..rows).map(|r| row(&src, width, r)).collect();
                    let mut b: Vec<Vec<u64>> = (0..rows).map(|r| row(&dst, width, r)).collect();
                    a.sort();
                    b.sort();
                    assert_eq!(a, b);
                    assert_ne!(src, dst, "{hf_part}.{suffix} rows must move");
                }
            }
        }
    }
}

fn check_tokenizer(out: &Path) {
    let tok = Tokenizer::from_file(out.join("tokenizer.json")).expect("tokenizer.json loads");
    assert_eq!(tok.get_vocab_size(true), VOCAB as usize);
    let ids = |s: &str| tok.encode(s, false).unwrap().get_ids().to_vec();
    assert_eq!(ids("<|im_start|>"), [1]);
    assert_eq!(ids("<|im_end|>"), [2]);
    assert_eq!(ids("123").len(), 3, "digits are split one by one");
    assert_eq!(ids("Hello"), ids("Hello"));
    let chat = ids("<|im_start|>user\nHi<|im_end|>\n");
    assert_eq!(chat.first(), Some(&1));
    assert!(chat.contains(&2));
    for s in [
        "Hello, world!",
        "The capital of France is Paris.",
        "  two leading spaces, a\ttab and\nnewlines  ",
        "Unicode: café, naïve, 東京, Ελληνικά, emoji 🦙🚀",
        "1234567890 + 0.5 = 1234567890.5",
        "<|im_start|>assistant\nBonjour!<|im_end|>",
    ] {
        let encoded = ids(s);
        let decoded = tok.decode(&encoded, false).unwrap();
        assert_eq!(decoded, s, "round trip of {s:?} via {encoded:?}");
    }
    // Specials are dropped when asked to.
    assert_eq!(
        tok.decode(&ids("<|im_start|>Hi<|im_end|>"), true).unwrap(),
        "Hi"
    );
}

#[test]
fn a_missing_gguf_is_reported_with_its_path() {
    let scratch = Scratch::new("missing");
    let gguf = scratch.path().join("nope.gguf");
    let err = convert_gguf(&gguf, &scratch.path().join("out")).unwrap_err();
    assert!(matches!(err, ConvertError::Input { .. }), "{err}");
    assert!(err.to_string().contains("nope.gguf"), "{err}");
    assert!(!scratch.path().join("out").exists());
}

#[test]
fn other_architectures_are_refused_by_name() {
    let scratch = Scratch::new("arch");
    let gguf = scratch.path().join("tiny.gguf");
    let mut file = GgufFile::new().unwrap();
    file.insert_metadata("general.architecture", "qwen2")
        .unwrap();
    file.insert_array(
        "token_embd.weight",
        &Array::from_slice(&[0f32; 32], &[4, 8]),
    )
    .unwrap();
    file.save(&gguf).unwrap();

    let out = scratch.path().join("out");
    let err = convert_gguf(&gguf, &out).unwrap_err();
    assert!(
        matches!(&err, ConvertError::UnsupportedArchitecture { architecture } if architecture == "qwen2"),
        "{err}"
    );
    assert!(err.to_string().contains("\"qwen2\""), "{err}");
    assert!(!out.exists());
}

/// A hand-written GGUF holding one Q4_K tensor, a type MLX would silently
/// dequantize.
fn q4_k_gguf(path: &Path) {
    fn string(b: &mut Vec<u8>, s: &str) {
        b.extend((s.len() as u64).to_le_bytes());
        b.extend(s.as_bytes());
    }
    let mut b = Vec::new();
    b.extend(b"GGUF");
    b.extend(3u32.to_le_bytes());
    b.extend(1u64.to_le_bytes()); // tensors
    b.extend(1u64.to_le_bytes()); // metadata
    string(&mut b, "general.architecture");
    b.extend(8u32.to_le_bytes());
    string(&mut b, "llama");
    string(&mut b, "blk.0.ffn_down.weight");
    b.extend(1u32.to_le_bytes());
    b.extend(256u64.to_le_bytes());
    b.extend(12u32.to_le_bytes()); // Q4_K
    b.extend(0u64.to_le_bytes());
    while !b.len().is_multiple_of(32) {
        b.push(0);
    }
    b.extend([0u8; 144]); // one Q4_K block
    fs::write(path, b).unwrap();
}

#[test]
fn unsupported_tensor_types_are_refused_by_name() {
    let scratch = Scratch::new("qtype");
    let gguf = scratch.path().join("k-quant.gguf");
    q4_k_gguf(&gguf);
    let err = convert_gguf(&gguf, &scratch.path().join("out")).unwrap_err();
    assert!(
        matches!(&err, ConvertError::UnsupportedTensorType { tensor, ggml_type, .. }
            if tensor == "blk.0.ffn_down.weight" && ggml_type == "Q4_K"),
        "{err}"
    );
    let message = err.to_string();
    assert!(
        message.contains("Q4_K") && message.contains("Q8_0"),
        "{message}"
    );
}

#[test]
fn files_that_are_not_gguf_are_refused() {
    let scratch = Scratch::new("notgguf");
    let gguf = scratch.path().join("model.gguf");
    fs::write(&gguf, b"{\"this\": \"is json\"}").unwrap();
    let err = convert_gguf(&gguf, &scratch.path().join("out")).unwrap_err();
    assert!(matches!(err, ConvertError::NotGguf { .. }), "{err}");
}
