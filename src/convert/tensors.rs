//! GGUF tensors to Hugging Face llama tensors: names, shapes, q/k row order
//! and the quantization each module keeps.
//!
//! By default nothing is re-quantized or cast (`--weights` asks for dense
//! or re-quantized matrices, see [`super::Weights`]). MLX loads Q4_0, Q4_1 and Q8_0 tensors as
//! affine-quantized triples (`.weight` packed into uint32, `.scales` and
//! `.biases` in float16, one group per 32 inputs) holding exactly the GGUF's
//! numbers, and F32/F16 tensors as they are; the converter renames them and
//! reorders the rows of the query and key projections.

use std::collections::BTreeMap;

use mlx_rs::io::GgufFile;
use mlx_rs::{Array, Dtype};

use super::header::{Header, TensorInfo};
use super::llama::LlamaParams;
use super::quant::QuantParams;
use super::ConvertError;

/// The converted tensors, in Hugging Face names.
pub(crate) struct Converted {
    pub arrays: BTreeMap<String, Array>,
    pub quantized: BTreeMap<String, QuantParams>,
    pub has_lm_head: bool,
}

/// The Hugging Face module path of a GGUF module (tensor name without its
/// `.weight` suffix), or `None` when a llama checkpoint has no such module.
pub(crate) fn hf_module(gguf_module: &str) -> Option<String> {
    let fixed = match gguf_module {
        "token_embd" => Some("model.embed_tokens"),
        "output_norm" => Some("model.norm"),
        "output" => Some("lm_head"),
        _ => None,
    };
    if let Some(name) = fixed {
        return Some(name.to_owned());
    }
    let rest = gguf_module.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    if layer.is_empty() || !layer.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let layer: u32 = layer.parse().ok()?;
    let hf = match part {
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}"))
}

/// Row order that undoes llama.cpp's q/k permutation.
///
/// llama.cpp writes the rows of a Hugging Face q (or k) projection as
/// `w.reshape(n_head, 2, head_dim/2, rest).swapaxes(1, 2).reshape(out, rest)`
/// so that interleaved ("traditional") rope applies. Entry `r` of the result
/// is the GGUF row that becomes Hugging Face row `r`, i.e. the inverse
/// permutation `reshape(n_head, head_dim/2, 2, rest).swapaxes(1, 2)`.
pub fn unpermute_rows(n_head: usize, head_dim: usize) -> Vec<usize> {
    assert!(head_dim.is_multiple_of(2), "head_dim must be even");
    let half = head_dim / 2;
    let mut rows = Vec::with_capacity(n_head * head_dim);
    for head in 0..n_head {
        for pair in 0..2 {
            for i in 0..half {
                rows.push(head * head_dim + 2 * i + pair);
            }
        }
    }
    rows
}

fn logical_shape(info: &TensorInfo) -> Vec<i64> {
    info.dims.iter().rev().map(|&d| d as i64).collect()
}

/// The Hugging Face shape `[rows, cols]` (or `[len]`) each module must have.
fn expected_shape(gguf_module: &str, p: &LlamaParams) -> Option<Vec<i64>> {
    let hidden = i64::from(p.hidden_size);
    let q = i64::from(p.num_attention_heads * p.head_dim);
    let kv = i64::from(p.num_key_value_heads * p.head_dim);
    let ffn = i64::from(p.intermediate_size);
    let vocab = i64::from(p.vocab_size);
    let shape = match gguf_module {
        "token_embd" | "output" => vec![vocab, hidden],
        "output_norm" => vec![hidden],
        _ => match gguf_module.rsplit_once('.')?.1 {
            "attn_q" => vec![q, hidden],
            "attn_k" | "attn_v" => vec![kv, hidden],
            "attn_output" => vec![hidden, q],
            "ffn_gate" | "ffn_up" => vec![ffn, hidden],
            "ffn_down" => vec![hidden, ffn],
            "attn_norm" | "ffn_norm" => vec![hidden],
            _ => return None,
        },
    };
    Some(shape)
}

/// GGUF modules a llama checkpoint must hold (`output` is optional: without
/// it the embeddings are tied).
fn required_modules(layers: u32) -> Vec<String> {
    let mut names = vec!["token_embd".to_owned(), "output_norm".to_owned()];
    for layer in 0..layers {
        for part in [
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
            "attn_norm",
            "ffn_norm",
        ] {
            names.push(format!("blk.{layer}.{part}"));
        }
    }
    names
}

fn mlx_error(action: &'static str) -> impl Fn(mlx_rs::error::Exception) -> ConvertError {
    move |error| ConvertError::Mlx { action, error }
}

fn shape_i64(a: &Array) -> Vec<i64> {
    a.shape().iter().map(|&d| i64::from(d)).collect()
}

/// The shape a module's weight must have: an error for a module the
/// architecture does not have (or a layer past its count), or when the
/// file's shape differs.
fn expected_of(
    info: &TensorInfo,
    module: &str,
    params: &LlamaParams,
) -> Result<Vec<i64>, ConvertError> {
    let unexpected = || ConvertError::UnexpectedTensor {
        tensor: info.name.clone(),
    };
    if let Some(layer) = module
        .strip_prefix("blk.")
        .and_then(|r| r.split_once('.'))
        .and_then(|(n, _)| n.parse::<u32>().ok())
    {
        if layer >= params.num_hidden_layers {
            return Err(unexpected());
        }
    }
    let expected = expected_shape(module, params).ok_or_else(unexpected)?;
    let logical = logical_shape(info);
    if logical != expected {
        return Err(ConvertError::Shape {
            tensor: info.name.clone(),
            expected,
            found: logical,
        });
    }
    Ok(expected)
}

/// GGUF stores the rows of the query and key projections permuted for its
/// rotary embedding; puts them back in the checkpoint's order.
fn unpermute_q_k(
    module: &str,
    params: &LlamaParams,
    parts: &mut [(&str, Array)],
) -> Result<(), ConvertError> {
    let heads = match module.rsplit_once('.').map(|(_, part)| part) {
        Some("attn_q") => Some(params.num_attention_heads),
        Some("attn_k") => Some(params.num_key_value_heads),
        _ => None,
    };
    if let Some(heads) = heads {
        let rows = unpermute_rows(heads as usize, params.head_dim as usize);
        let rows: Vec<i32> = rows.into_iter().map(|r| r as i32).collect();
        let index = Array::from_slice(&rows, &[rows.len() as i32]);
        for (_, array) in parts.iter_mut() {
            *array = array
                .take_axis(&index, 0)
                .map_err(mlx_error("reordering q/k rows"))?;
        }
    }
    Ok(())
}

/// Renames, checks and un-permutes every tensor of `file`.
pub(crate) fn convert(
    file: &GgufFile,
    header: &Header,
    params: &LlamaParams,
    float_dtype: Option<super::FloatDtype>,
    weights: super::Weights,
) -> Result<Converted, ConvertError> {
    let mut arrays = BTreeMap::new();
    let mut quantized = BTreeMap::new();
    let mut seen = Vec::new();

    let mut infos: Vec<&TensorInfo> = header.tensors.iter().collect();
    infos.sort_by(|a, b| a.name.cmp(&b.name));

    for info in infos {
        let unexpected = || ConvertError::UnexpectedTensor {
            tensor: info.name.clone(),
        };
        let module = info.name.strip_suffix(".weight").ok_or_else(unexpected)?;
        let hf = hf_module(module).ok_or_else(unexpected)?;
        let expected = expected_of(info, module, params)?;

        let get = |suffix: &str| -> Result<Array, ConvertError> {
            let key = format!("{module}.{suffix}");
            file.get_array(&key)
                .map_err(|error| ConvertError::Load {
                    path: key.clone().into(),
                    error,
                })?
                .ok_or(ConvertError::MissingTensor { tensor: key })
        };

        let mut parts: Vec<(&str, Array)> = vec![("weight", get("weight")?)];
        if let Some((group_size, bits)) = info.ggml_type.mlx_quantization() {
            parts.push(("scales", get("scales")?));
            parts.push(("biases", get("biases")?));
            check_quantized(&info.name, &expected, &parts, group_size, bits)?;
            quantized.insert(hf.clone(), QuantParams { group_size, bits });
        } else {
            let found = shape_i64(&parts[0].1);
            if found != expected {
                return Err(ConvertError::Shape {
                    tensor: info.name.clone(),
                    expected,
                    found,
                });
            }
        }

        unpermute_q_k(module, params, &mut parts)?;

        if let Some(q) = quantized.get(&hf).copied() {
            parts = requantize(parts, q, weights)?;
            match weights {
                super::Weights::Keep => {}
                super::Weights::Dense => {
                    quantized.remove(&hf);
                }
                super::Weights::Bits(bits) => {
                    quantized.insert(hf.clone(), QuantParams { bits, ..q });
                }
            }
        }

        for (suffix, array) in parts {
            let array = match float_dtype {
                Some(d) if array.dtype().is_float() && array.dtype() != d.mlx() => array
                    .as_dtype(d.mlx())
                    .map_err(mlx_error("casting to the requested dtype"))?,
                _ => array,
            };
            arrays.insert(format!("{hf}.{suffix}"), array);
        }
        seen.push(module.to_owned());
    }

    for module in required_modules(params.num_hidden_layers) {
        if !seen.contains(&module) {
            return Err(ConvertError::MissingTensor {
                tensor: format!("{module}.weight"),
            });
        }
    }
    let has_lm_head = seen.iter().any(|m| m == "output");
    Ok(Converted {
        arrays,
        quantized,
        has_lm_head,
    })
}

/// A quantized module's triple as `weights` asks: kept, dequantized to one
/// float32 matrix, or dequantized and quantized again at other bits (same
/// group size, MLX's affine quantization).
fn requantize(
    parts: Vec<(&str, Array)>,
    q: QuantParams,
    weights: super::Weights,
) -> Result<Vec<(&str, Array)>, ConvertError> {
    if weights == super::Weights::Keep {
        return Ok(parts);
    }
    let [(_, w), (_, scales), (_, biases)] = &parts[..] else {
        return Ok(parts);
    };
    let (group, bits) = (q.group_size as i32, q.bits as i32);
    let dense = mlx_rs::ops::dequantize(
        w,
        scales
            .as_dtype(Dtype::Float32)
            .map_err(mlx_error("casting scales"))?,
        &biases
            .as_dtype(Dtype::Float32)
            .map_err(mlx_error("casting biases"))?,
        group,
        bits,
    )
    .map_err(mlx_error("dequantizing"))?;
    match weights {
        super::Weights::Bits(b) => {
            let (w, s, z) =
                mlx_rs::ops::quantize(&dense, group, b as i32).map_err(mlx_error("quantizing"))?;
            Ok(vec![("weight", w), ("scales", s), ("biases", z)])
        }
        _ => Ok(vec![("weight", dense)]),
    }
}

/// Checks that an MLX quantized triple has the shapes `(group_size, bits)`
/// imply for a `[rows, cols]` matrix.
fn check_quantized(
    tensor: &str,
    expected: &[i64],
    parts: &[(&str, Array)],
    group_size: u32,
    bits: u32,
) -> Result<(), ConvertError> {
    let (rows, cols) = (expected[0], expected[expected.len() - 1]);
    let (group_size, bits) = (i64::from(group_size), i64::from(bits));
    for (suffix, array) in parts {
        let want = match *suffix {
            "weight" => vec![rows, cols * bits / 32],
            _ => vec![rows, cols / group_size],
        };
        let found = shape_i64(array);
        if found != want {
            return Err(ConvertError::Shape {
                tensor: format!("{tensor} ({suffix} as loaded by MLX)"),
                expected: want,
                found,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's permutation, written out with MLX ops.
    fn permute(w: &Array, n_head: i32) -> Array {
        let (out, rest) = (w.shape()[0], w.shape()[1]);
        w.reshape(&[n_head, 2, out / n_head / 2, rest])
            .unwrap()
            .swap_axes(1, 2)
            .unwrap()
            .reshape(&[out, rest])
            .unwrap()
    }

    /// The inverse the brief of the format states, written out with MLX ops.
    fn unpermute_by_reshape(w: &Array, n_head: i32) -> Array {
        let (out, rest) = (w.shape()[0], w.shape()[1]);
        w.reshape(&[n_head, out / n_head / 2, 2, rest])
            .unwrap()
            .swap_axes(1, 2)
            .unwrap()
            .reshape(&[out, rest])
            .unwrap()
    }

    fn rows_of(a: &Array) -> Vec<i32> {
        a.as_type::<i32>().unwrap().as_slice::<i32>().to_vec()
    }

    #[test]
    fn unpermute_small_case_by_hand() {
        // one head of four rows: llama.cpp stores HF rows 0, 2, 1, 3
        assert_eq!(unpermute_rows(1, 4), [0, 2, 1, 3]);
        // two heads of six rows
        assert_eq!(unpermute_rows(2, 6), [0, 2, 4, 1, 3, 5, 6, 8, 10, 7, 9, 11]);
    }

    #[test]
    fn unpermute_is_a_permutation_inverting_llama_cpp() {
        for (n_head, head_dim) in [(9, 64), (3, 64), (4, 8), (1, 2)] {
            let rows = unpermute_rows(n_head, head_dim);
            let n = n_head * head_dim;
            let mut sorted = rows.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n).collect::<Vec<_>>());

            // Tag each Hugging Face row with its index, permute as llama.cpp
            // does, then gather with our rows: the tags must come back in order.
            let hf = Array::from_iter(0..n as i32, &[n as i32, 1]);
            let gguf = permute(&hf, n_head as i32);
            let index: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
            let back = gguf
                .take_axis(Array::from_slice(&index, &[n as i32]), 0)
                .unwrap();
            assert_eq!(rows_of(&back), (0..n as i32).collect::<Vec<_>>());
            // and it agrees with the reshape form of the inverse
            assert_eq!(
                rows_of(&unpermute_by_reshape(&gguf, n_head as i32)),
                rows_of(&back)
            );
        }
    }

    #[test]
    fn names_map_to_hugging_face() {
        let cases = [
            ("token_embd", "model.embed_tokens"),
            ("output_norm", "model.norm"),
            ("output", "lm_head"),
            ("blk.0.attn_q", "model.layers.0.self_attn.q_proj"),
            ("blk.12.attn_k", "model.layers.12.self_attn.k_proj"),
            ("blk.1.attn_v", "model.layers.1.self_attn.v_proj"),
            ("blk.1.attn_output", "model.layers.1.self_attn.o_proj"),
            ("blk.29.ffn_gate", "model.layers.29.mlp.gate_proj"),
            ("blk.2.ffn_up", "model.layers.2.mlp.up_proj"),
            ("blk.2.ffn_down", "model.layers.2.mlp.down_proj"),
            ("blk.3.attn_norm", "model.layers.3.input_layernorm"),
            ("blk.3.ffn_norm", "model.layers.3.post_attention_layernorm"),
        ];
        for (gguf, hf) in cases {
            assert_eq!(hf_module(gguf).as_deref(), Some(hf), "{gguf}");
        }
        for odd in [
            "rope_freqs",
            "blk.x.attn_q",
            "blk.1.attn_q_norm",
            "blk..ffn_up",
        ] {
            assert_eq!(hf_module(odd), None, "{odd}");
        }
    }
}
