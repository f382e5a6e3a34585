//! The Gemma 4 text model's config: `config.json` (or its `text_config`)
//! read with mlx-lm's defaults and checked, each layer's attention kind, and
//! the rope of each kind.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::Value;

use crate::engine::mlx::layers::{Rope, RopeScaling};
use crate::engine::mlx::{MlxError, MlxResult};
use crate::model_config;

fn d_head_dim() -> i32 {
    256
}
fn d_global_head_dim() -> Option<i32> {
    Some(512)
}
fn d_eps() -> f32 {
    1e-6
}
fn d_one() -> i32 {
    1
}
fn d_shared() -> usize {
    20
}
fn d_per_layer() -> usize {
    256
}
fn d_window() -> usize {
    512
}
fn d_pattern() -> usize {
    5
}
fn d_softcap() -> Option<f32> {
    Some(30.0)
}
fn d_true() -> bool {
    true
}

/// Rope of one kind of layer (`rope_parameters.<layer type>`).
#[derive(Clone, Debug, Deserialize)]
pub struct RopeParameters {
    pub rope_type: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub rope_theta: Option<f32>,
    pub partial_rotary_factor: Option<f32>,
    pub factor: Option<f32>,
}

/// The text model's config (`config.json`, or its `text_config` for
/// `gemma4`). Absent fields take mlx-lm 0.32.2's defaults, so a config means
/// the same model here as there.
#[derive(Clone, Debug, Deserialize)]
pub struct Config {
    pub hidden_size: i32,
    pub num_hidden_layers: usize,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    #[serde(default = "d_head_dim")]
    pub head_dim: i32,
    #[serde(default = "d_global_head_dim")]
    pub global_head_dim: Option<i32>,
    #[serde(default = "d_eps")]
    pub rms_norm_eps: f32,
    pub vocab_size: usize,
    pub vocab_size_per_layer_input: Option<usize>,
    #[serde(default = "d_one")]
    pub num_key_value_heads: i32,
    pub num_global_key_value_heads: Option<i32>,
    #[serde(default = "d_shared")]
    pub num_kv_shared_layers: usize,
    #[serde(default = "d_per_layer")]
    pub hidden_size_per_layer_input: usize,
    #[serde(default)]
    pub rope_traditional: bool,
    pub rope_parameters: Option<HashMap<String, RopeParameters>>,
    #[serde(default = "d_window")]
    pub sliding_window: usize,
    #[serde(default = "d_pattern")]
    pub sliding_window_pattern: usize,
    pub max_position_embeddings: Option<usize>,
    #[serde(default)]
    pub attention_k_eq_v: bool,
    #[serde(default = "d_softcap")]
    pub final_logit_softcapping: Option<f32>,
    #[serde(default = "d_true")]
    pub use_double_wide_mlp: bool,
    #[serde(default)]
    pub enable_moe_block: bool,
    pub num_experts: Option<i32>,
    pub top_k_experts: Option<i32>,
    pub layer_types: Option<Vec<String>>,
    #[serde(default = "d_true")]
    pub tie_word_embeddings: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LayerType {
    Sliding,
    Full,
}

impl LayerType {
    fn key(self) -> &'static str {
        match self {
            LayerType::Sliding => "sliding_attention",
            LayerType::Full => "full_attention",
        }
    }
}

impl Config {
    /// Reads the text model's config from a `gemma4_text`, `gemma4` or
    /// `gemma4_unified` config.json.
    pub fn from_config(config: &Value) -> MlxResult<Self> {
        let wrapped = matches!(
            config.get("model_type").and_then(Value::as_str),
            Some("gemma4" | "gemma4_unified")
        );
        if wrapped && !model_config::is_nested(config) {
            return Err(MlxError::Config(
                "a gemma4 config.json needs a text_config (the language model's settings)".into(),
            ));
        }
        let c: Config = serde_json::from_value(model_config::text(config)).map_err(|e| {
            MlxError::Config(format!(
                "config.json is not a Gemma 4 text config ({e}); check that --model is a \
                 gemma4 or gemma4_text MLX conversion"
            ))
        })?;
        c.validate()?;
        Ok(c)
    }

    fn validate(&self) -> MlxResult<()> {
        let bad = |m: String| Err(MlxError::Config(format!("Gemma 4 config.json: {m}")));
        if self.enable_moe_block {
            match (self.num_experts, self.top_k_experts) {
                (Some(e), Some(k)) if e > 0 && (1..=e).contains(&k) => {}
                (e, k) => {
                    return bad(format!(
                        "enable_moe_block needs num_experts > 0 and top_k_experts between 1 \
                         and num_experts (got {e:?} and {k:?})"
                    ))
                }
            }
        }
        if self.num_hidden_layers == 0 || self.hidden_size <= 0 || self.num_attention_heads <= 0 {
            return bad(
                "hidden_size, num_hidden_layers and num_attention_heads must be positive".into(),
            );
        }
        if self.sliding_window == 0 {
            return bad("sliding_window must be positive".into());
        }
        let types = self.layer_types()?;
        let own = self.layers_with_kv();
        if own == 0 {
            return bad(format!(
                "num_kv_shared_layers ({}) leaves no layer that computes keys and values \
                 ({} layers)",
                self.num_kv_shared_layers, self.num_hidden_layers
            ));
        }
        for (i, t) in types.iter().enumerate().skip(own) {
            if !types[..own].contains(t) {
                return bad(format!(
                    "layer {i} shares the keys and values of an earlier {} layer, and none \
                     of the first {own} layers is one",
                    t.key()
                ));
            }
        }
        for t in [LayerType::Sliding, LayerType::Full] {
            if types.contains(&t) {
                self.rope_scaling(t)?;
            }
        }
        for (heads, what) in [
            (self.num_key_value_heads, "num_key_value_heads"),
            (self.full_kv_heads(), "the key/value heads of full layers"),
        ] {
            if heads <= 0 || self.num_attention_heads % heads != 0 {
                return bad(format!(
                    "{what} ({heads}) must divide num_attention_heads ({})",
                    self.num_attention_heads
                ));
            }
        }
        Ok(())
    }

    /// Each layer's attention kind.
    pub(super) fn layer_types(&self) -> MlxResult<Vec<LayerType>> {
        let names: Vec<String> = match &self.layer_types {
            Some(t) => t.clone(),
            None => {
                let p = self.sliding_window_pattern.max(1);
                (0..self.num_hidden_layers)
                    .map(|i| {
                        if i % p == p - 1 {
                            "full_attention".into()
                        } else {
                            "sliding_attention".into()
                        }
                    })
                    .collect()
            }
        };
        if names.len() != self.num_hidden_layers {
            return Err(MlxError::Config(format!(
                "Gemma 4 config.json: layer_types has {} entries for {} layers",
                names.len(),
                self.num_hidden_layers
            )));
        }
        names
            .iter()
            .map(|n| match n.as_str() {
                "sliding_attention" => Ok(LayerType::Sliding),
                "full_attention" => Ok(LayerType::Full),
                other => Err(MlxError::Config(format!(
                    "Gemma 4 config.json: layer type `{other}` is not supported \
                     (sliding_attention or full_attention)"
                ))),
            })
            .collect()
    }

    /// Layers that compute their own keys and values (the first ones).
    pub(super) fn layers_with_kv(&self) -> usize {
        self.num_hidden_layers
            .saturating_sub(self.num_kv_shared_layers)
    }

    pub(super) fn full_kv_heads(&self) -> i32 {
        match self.num_global_key_value_heads {
            Some(n) if self.attention_k_eq_v => n,
            _ => self.num_key_value_heads,
        }
    }

    pub(super) fn head_dim_of(&self, t: LayerType) -> i32 {
        match (t, self.global_head_dim) {
            (LayerType::Full, Some(d)) if d > 0 => d,
            _ => self.head_dim,
        }
    }

    /// The rope parameters of a layer kind (mlx-lm's defaults when the
    /// config has none).
    fn rope_of(&self, t: LayerType) -> RopeParameters {
        if let Some(p) = &self.rope_parameters {
            return p.get(t.key()).cloned().unwrap_or(RopeParameters {
                rope_type: None,
                kind: None,
                rope_theta: None,
                partial_rotary_factor: None,
                factor: None,
            });
        }
        match t {
            LayerType::Full => RopeParameters {
                rope_type: Some("proportional".into()),
                kind: None,
                rope_theta: Some(1_000_000.0),
                partial_rotary_factor: Some(0.25),
                factor: None,
            },
            LayerType::Sliding => RopeParameters {
                rope_type: Some("default".into()),
                kind: None,
                rope_theta: Some(10_000.0),
                partial_rotary_factor: Some(1.0),
                factor: None,
            },
        }
    }

    /// A layer kind's rope scaling, by its type (`default`, `linear` or
    /// `proportional`).
    fn rope_scaling(&self, t: LayerType) -> MlxResult<RopeScaling> {
        let p = self.rope_of(t);
        let kind = p
            .kind
            .clone()
            .or(p.rope_type.clone())
            .unwrap_or_else(|| "default".into());
        RopeScaling::named(&kind, p.factor, p.partial_rotary_factor).ok_or_else(|| {
            MlxError::Config(format!(
                "Gemma 4 config.json: rope type `{kind}` of {} layers is not supported \
                 (default, linear or proportional)",
                t.key()
            ))
        })
    }

    /// A layer kind's rotary embedding.
    pub(super) fn rope(&self, t: LayerType) -> MlxResult<Rope> {
        let p = self.rope_of(t);
        let dims = self.head_dim_of(t);
        let scaling = self.rope_scaling(t)?;
        let rotated = scaling.rotated(dims);
        if rotated > dims || rotated < 0 {
            return Err(MlxError::Config(format!(
                "Gemma 4 config.json: partial_rotary_factor of {} layers rotates \
                     {rotated} of {dims} dimensions",
                t.key()
            )));
        }
        let base = p.rope_theta.unwrap_or(10_000.0);
        Rope::new(dims, base, self.rope_traditional, scaling)
    }
}

#[cfg(test)]
mod tests {
    use mlx_rs::ops;

    use super::*;

    fn text(extra: Value) -> Value {
        let mut c = serde_json::json!({
            "model_type": "gemma4_text",
            "hidden_size": 64,
            "num_hidden_layers": 4,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 100,
            "num_kv_shared_layers": 0,
            "hidden_size_per_layer_input": 0,
        });
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    }

    fn refused(extra: Value, says: &str) {
        match Config::from_config(&text(extra)) {
            Err(MlxError::Config(m)) => assert!(m.contains(says), "{m}"),
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("accepted a config that should be refused"),
        }
    }

    #[test]
    fn default_layer_types_follow_the_pattern() {
        let c =
            Config::from_config(&text(serde_json::json!({"sliding_window_pattern": 2}))).unwrap();
        assert_eq!(
            c.layer_types().unwrap(),
            vec![
                LayerType::Sliding,
                LayerType::Full,
                LayerType::Sliding,
                LayerType::Full
            ]
        );
    }

    #[test]
    fn bad_configs_are_refused_with_reasons() {
        refused(
            serde_json::json!({"enable_moe_block": true, "num_experts": 8}),
            "top_k_experts",
        );
        refused(
            serde_json::json!({"layer_types": ["sliding_attention"]}),
            "4 layers",
        );
        refused(
            serde_json::json!({"layer_types": ["sliding_attention", "x", "full_attention", "full_attention"]}),
            "layer type `x`",
        );
        refused(
            serde_json::json!({"num_kv_shared_layers": 4}),
            "leaves no layer",
        );
        refused(
            serde_json::json!({"num_kv_shared_layers": 1, "layer_types":
                ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]}),
            "none of the first 3",
        );
        refused(serde_json::json!({"num_key_value_heads": 3}), "must divide");
        refused(
            serde_json::json!({"rope_parameters": {"sliding_attention": {"rope_type": "yarn"},
                "full_attention": {"rope_type": "default"}}}),
            "rope type `yarn`",
        );
        refused(
            serde_json::json!({"hidden_size": "wide"}),
            "not a Gemma 4 text config",
        );
        let wrapped = serde_json::json!({"model_type": "gemma4", "vocab_size": 10});
        assert!(
            matches!(Config::from_config(&wrapped), Err(MlxError::Config(m)) if m.contains("text_config"))
        );
    }

    #[test]
    fn the_wrapper_vocabulary_is_the_text_model_s() {
        let c = serde_json::json!({"model_type": "gemma4", "vocab_size": 77, "text_config": text(serde_json::json!({}))});
        assert_eq!(Config::from_config(&c).unwrap().vocab_size, 77);
    }

    #[test]
    fn the_proportional_rope_leaves_the_unrotated_part_alone() {
        let c = Config::from_config(&text(serde_json::json!({"global_head_dim": 16}))).unwrap();
        let rope = c.rope(LayerType::Full).unwrap();
        let x = ops::ones::<f32>(&[1, 1, 3, 16]).unwrap();
        let y = rope.forward(&x, 5).unwrap();
        y.eval().unwrap();
        let y = y.as_slice::<f32>();
        // A quarter of 16 dimensions rotate: pairs (0, 8) and (1, 9) with the
        // split-half layout; dimensions 2..8 and 10..16 keep their values.
        for row in y.chunks(16) {
            for (i, v) in row.iter().enumerate() {
                if ![0, 1, 8, 9].contains(&i) {
                    assert_eq!(*v, 1.0, "dimension {i} moved: {row:?}");
                }
            }
            assert_ne!(row[0], 1.0);
        }
    }
}
