//! Llama hyperparameters from GGUF metadata, and the Hugging Face
//! `config.json` / `generation_config.json` they become.

use serde_json::{json, Value};

use super::header::Header;
use super::meta::{bad, missing, Meta};
use super::quant::QuantConfig;
use super::ConvertError;

/// The only architecture the converter handles.
pub const ARCHITECTURE: &str = "llama";

/// llama.cpp's default rope base when a GGUF does not state one.
const DEFAULT_ROPE_THETA: f64 = 10000.0;

/// Hyperparameters of a llama checkpoint, in Hugging Face terms.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaParams {
    pub num_hidden_layers: u32,
    pub hidden_size: u32,
    pub intermediate_size: u32,
    pub num_attention_heads: u32,
    pub num_key_value_heads: u32,
    pub head_dim: u32,
    pub max_position_embeddings: u32,
    pub vocab_size: u32,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
}

impl LlamaParams {
    /// Reads `llama.*` metadata. `header` supplies the embedding's shape,
    /// which fixes the vocabulary size.
    pub(crate) fn read(meta: &Meta, header: &Header) -> Result<Self, ConvertError> {
        let key = |k: &str| format!("{ARCHITECTURE}.{k}");
        let num_hidden_layers = meta.require_u32(&key("block_count"))?;
        let hidden_size = meta.require_u32(&key("embedding_length"))?;
        let intermediate_size = meta.require_u32(&key("feed_forward_length"))?;
        let num_attention_heads = meta.require_u32(&key("attention.head_count"))?;
        let num_key_value_heads = meta
            .u32(&key("attention.head_count_kv"))?
            .unwrap_or(num_attention_heads);
        let max_position_embeddings = meta.require_u32(&key("context_length"))?;
        let rms_norm_eps = meta
            .float(&key("attention.layer_norm_rms_epsilon"))?
            .ok_or_else(|| missing(&key("attention.layer_norm_rms_epsilon")))?;
        let rope_theta = meta
            .float(&key("rope.freq_base"))?
            .unwrap_or(DEFAULT_ROPE_THETA);

        if num_attention_heads == 0 {
            return Err(bad(&key("attention.head_count"), "zero heads"));
        }
        if num_key_value_heads == 0 || !num_attention_heads.is_multiple_of(num_key_value_heads) {
            return Err(bad(
                &key("attention.head_count_kv"),
                format!("{num_key_value_heads} key/value heads do not divide {num_attention_heads} heads"),
            ));
        }
        let head_dim = match meta.u32(&key("attention.key_length"))? {
            Some(d) => d,
            None if hidden_size.is_multiple_of(num_attention_heads) => {
                hidden_size / num_attention_heads
            }
            None => {
                return Err(bad(
                    &key("attention.head_count"),
                    format!(
                        "{num_attention_heads} heads do not divide the hidden size {hidden_size}"
                    ),
                ))
            }
        };
        if let Some(v) = meta.u32(&key("attention.value_length"))? {
            if v != head_dim {
                return Err(ConvertError::Unsupported {
                    feature: format!("value heads of size {v} with key heads of size {head_dim}"),
                });
            }
        }
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(bad(
                &key("attention.key_length"),
                format!("head size {head_dim} is not a positive even number"),
            ));
        }
        if let Some(rope_dims) = meta.u32(&key("rope.dimension_count"))? {
            if rope_dims != head_dim {
                return Err(ConvertError::Unsupported {
                    feature: format!(
                        "partial rope ({rope_dims} of {head_dim} head dimensions rotated)"
                    ),
                });
            }
        }
        if let Some(kind) = meta.string(&key("rope.scaling.type"))? {
            if kind != "none" {
                return Err(ConvertError::Unsupported {
                    feature: format!("rope scaling of type {kind:?}"),
                });
            }
        }

        let embed = header
            .tensors
            .iter()
            .find(|t| t.name == "token_embd.weight")
            .ok_or_else(|| ConvertError::MissingTensor {
                tensor: "token_embd.weight".into(),
            })?;
        let vocab_size = match embed.dims.as_slice() {
            [_, rows] => u32::try_from(*rows).map_err(|_| ConvertError::Shape {
                tensor: embed.name.clone(),
                expected: vec![],
                found: embed.dims.iter().rev().map(|&d| d as i64).collect(),
            })?,
            _ => {
                return Err(ConvertError::Shape {
                    tensor: embed.name.clone(),
                    expected: vec![-1, i64::from(hidden_size)],
                    found: embed.dims.iter().rev().map(|&d| d as i64).collect(),
                })
            }
        };
        if let Some(stated) = meta.u32(&key("vocab_size"))? {
            if stated != vocab_size {
                return Err(bad(
                    &key("vocab_size"),
                    format!("says {stated}, but token_embd.weight has {vocab_size} rows"),
                ));
            }
        }

        Ok(Self {
            num_hidden_layers,
            hidden_size,
            intermediate_size,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            max_position_embeddings,
            vocab_size,
            rms_norm_eps,
            rope_theta,
        })
    }

    /// The Hugging Face `config.json`.
    pub fn config_json(
        &self,
        tie_word_embeddings: bool,
        bos_token_id: Option<u32>,
        eos_token_id: Option<u32>,
        quantization: Option<&QuantConfig>,
    ) -> Value {
        let mut config = json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": ARCHITECTURE,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": null,
            "attention_bias": false,
            "mlp_bias": false,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "tie_word_embeddings": tie_word_embeddings,
            "bos_token_id": bos_token_id,
            "eos_token_id": eos_token_id,
        });
        if let Some(q) = quantization {
            config["quantization"] = q.to_json();
            config["quantization_config"] = q.to_json();
        }
        config
    }
}

/// The Hugging Face `generation_config.json`.
pub fn generation_config_json(bos_token_id: Option<u32>, eos_token_id: Option<u32>) -> Value {
    json!({
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
    })
}
