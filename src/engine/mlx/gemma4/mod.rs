//! The Gemma 4 architecture, text model only: `model_type: "gemma4_text"`,
//! and `"gemma4"` and `"gemma4_unified"`, the multimodal wrappers whose
//! language model this is (its config under `text_config`, its weights
//! under `language_model.`; every other tensor, the vision and audio
//! towers, is dropped at load).
//!
//! Decoder blocks of sliding-window and full attention, by `layer_types`,
//! each with its own rope (`rope_parameters`: the default rope on sliding
//! layers, the proportional rope, which rotates only a fraction of the head,
//! on full layers), its own head size (`global_head_dim` on full layers) and
//! key/value heads (`num_global_key_value_heads` where full layers take
//! their values from the keys, `attention_k_eq_v`). Queries and keys are
//! RMS-normed per head, values normed without a scale, and the attention
//! is unscaled. The last `num_kv_shared_layers` blocks compute no keys or
//! values: each reads those of the last earlier block of its type, and has
//! a double-wide MLP when `use_double_wide_mlp`. The MLP is a GELU-gated
//! one; four norms per block, a learned scalar per block, optional
//! per-layer inputs (a second embedding of the tokens mixed with a
//! projection of the first, fed to each block), embeddings scaled by
//! `sqrt(hidden_size)`, and final logits soft-capped. With
//! `enable_moe_block` each block adds to its MLP a mixture-of-experts
//! branch: a router over the block's input picks `top_k_experts` of
//! `num_experts` GELU-gated experts ([`SwitchGlu`]), each branch normed
//! before the two are summed.
//!
//! Weight names are mlx-lm's: `{P}.embed_tokens`, `{P}.layers.N.{self_attn.
//! {q,k,v,o}_proj, self_attn.{q,k}_norm, mlp.{gate,up,down}_proj,
//! input_layernorm, post_attention_layernorm, pre_feedforward_layernorm,
//! post_feedforward_layernorm, layer_scalar, per_layer_input_gate,
//! per_layer_projection, post_per_layer_input_norm}`, `{P}.norm`,
//! `{P}.embed_tokens_per_layer`, `{P}.per_layer_model_projection`,
//! `{P}.per_layer_projection_norm`, with `P` = `model` for `gemma4_text`
//! and `language_model.model` for the wrappers.
//!
//! Sliding-window layers keep the last `sliding_window - 1` positions
//! between prompt chunks and a rotating buffer of `sliding_window` while
//! generating, laid out as mlx-lm's `RotatingKVCache` lays them out
//! ([`WindowCache`]); full layers keep every position.

use std::collections::HashMap;

use mlx_rs::{fast, ops, Array};
use serde::Deserialize;
use serde_json::Value;

use super::cache::{KvCache, LayerCache, ModelCache, WindowCache};
use super::layers::{
    attention, gelu_approx, last_position, scalar, Activation, Embedding, GatedMlp, HostKernels,
    Linear, RmsNorm, Rope,
};
use super::loader::Weights;
use super::switch::SwitchGlu;
use super::{Architecture, LastHidden};
use super::{MlxError, MlxResult};
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
enum LayerType {
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
                self.rope_kind(t)?;
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
    fn layer_types(&self) -> MlxResult<Vec<LayerType>> {
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
    fn layers_with_kv(&self) -> usize {
        self.num_hidden_layers
            .saturating_sub(self.num_kv_shared_layers)
    }

    fn full_kv_heads(&self) -> i32 {
        match self.num_global_key_value_heads {
            Some(n) if self.attention_k_eq_v => n,
            _ => self.num_key_value_heads,
        }
    }

    fn head_dim_of(&self, t: LayerType) -> i32 {
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

    fn rope_kind(&self, t: LayerType) -> MlxResult<String> {
        let p = self.rope_of(t);
        let kind = p
            .kind
            .clone()
            .or(p.rope_type.clone())
            .unwrap_or_else(|| "default".into());
        match kind.as_str() {
            "default" | "linear" | "proportional" => Ok(kind),
            other => Err(MlxError::Config(format!(
                "Gemma 4 config.json: rope type `{other}` of {} layers is not supported \
                 (default, linear or proportional)",
                t.key()
            ))),
        }
    }
}

/// `x * v` for a scalar `v`, in `x`'s dtype.
fn scale(x: &Array, v: f32) -> MlxResult<Array> {
    Ok(ops::multiply(x, &scalar(v, x)?)?)
}

/// A layer kind's rotary embedding. The proportional rope turns the first
/// `partial_rotary_factor` of the head at frequencies
/// `factor * base^(2i/dims)`, the rest not at all (infinite periods).
fn rope(c: &Config, t: LayerType) -> MlxResult<Rope> {
    let p = c.rope_of(t);
    let dims = c.head_dim_of(t);
    let base = p.rope_theta.unwrap_or(10_000.0);
    match c.rope_kind(t)?.as_str() {
        "proportional" => {
            let rotated = (dims as f32 * p.partial_rotary_factor.unwrap_or(1.0)) as i32;
            if rotated > dims || rotated < 0 {
                return Err(MlxError::Config(format!(
                    "Gemma 4 config.json: partial_rotary_factor of {} layers rotates \
                         {rotated} of {dims} dimensions",
                    t.key()
                )));
            }
            let exponents = ops::divide(
                &ops::arange::<_, f32>(0, rotated, 2)?,
                Array::from_f32(dims as f32),
            )?;
            let powers = ops::power(Array::from_f32(base), &exponents)?;
            let rotating = ops::multiply(Array::from_f32(p.factor.unwrap_or(1.0)), &powers)?;
            let still = ops::full::<f32>(&[(dims - rotated) / 2], &Array::from_f32(f32::INFINITY))?;
            let freqs = ops::concatenate(&[&rotating, &still], 0)?;
            freqs.eval()?;
            Ok(Rope::Freqs {
                dims,
                traditional: c.rope_traditional,
                freqs,
            })
        }
        "linear" => Ok(Rope::Standard {
            dims,
            traditional: c.rope_traditional,
            base,
            scale: 1.0 / p.factor.unwrap_or(1.0),
        }),
        _ => Ok(Rope::Standard {
            dims,
            traditional: c.rope_traditional,
            base,
            scale: 1.0,
        }),
    }
}

/// Where a layer's keys and values come from.
enum KvSource<'a> {
    /// Its own projections, appended to its cache.
    Own(&'a mut LayerCache),
    /// Those an earlier layer of its kind returned for this call.
    Shared(&'a (Array, Array)),
}

/// The projections a layer with its own keys and values has.
struct KvProjections {
    k_proj: Linear,
    /// `None` where values are the keys (`attention_k_eq_v` on full layers).
    v_proj: Option<Linear>,
    k_norm: RmsNorm,
}

struct Attention {
    q_proj: Linear,
    kv: Option<KvProjections>,
    o_proj: Linear,
    q_norm: RmsNorm,
    kind: LayerType,
    n_heads: i32,
    n_kv_heads: i32,
    head_dim: i32,
    eps: f32,
    rope: Rope,
    host: HostKernels,
    window: usize,
}

impl Attention {
    fn load(w: &Weights, p: &str, c: &Config, kind: LayerType, has_kv: bool) -> MlxResult<Self> {
        let k_eq_v = c.attention_k_eq_v && kind == LayerType::Full;
        let head_dim = c.head_dim_of(kind);
        let kv = if has_kv {
            Some(KvProjections {
                k_proj: Linear::load(w, &format!("{p}.k_proj"))?,
                v_proj: if k_eq_v {
                    None
                } else {
                    Some(Linear::load(w, &format!("{p}.v_proj"))?)
                },
                k_norm: RmsNorm::load(w, &format!("{p}.k_norm"), c.rms_norm_eps)?,
            })
        } else {
            // A conversion may still carry the unused projections of a
            // KV-shared layer (mlx-lm drops them when converting).
            w.skip(&[
                &format!("{p}.k_proj."),
                &format!("{p}.v_proj."),
                &format!("{p}.k_norm."),
            ]);
            None
        };
        Ok(Attention {
            q_proj: Linear::load(w, &format!("{p}.q_proj"))?,
            kv,
            o_proj: Linear::load(w, &format!("{p}.o_proj"))?,
            q_norm: RmsNorm::load(w, &format!("{p}.q_norm"), c.rms_norm_eps)?,
            kind,
            n_heads: c.num_attention_heads,
            n_kv_heads: if kind == LayerType::Full {
                c.full_kv_heads()
            } else {
                c.num_key_value_heads
            },
            head_dim,
            eps: c.rms_norm_eps,
            rope: rope(c, kind)?,
            host: HostKernels::of(w),
            window: c.sliding_window,
        })
    }

    /// Attention of every position of `x` (`[B, L, D]`) at positions from
    /// `offset`; returns the output and the keys and values attended to
    /// (for the layers that share them).
    fn forward(
        &self,
        x: &Array,
        offset: usize,
        source: KvSource<'_>,
    ) -> MlxResult<(Array, (Array, Array))> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let q = ops::reshape(
            self.q_proj.forward(x)?,
            &[b, l, self.n_heads, self.head_dim],
        )?;
        let q = self.q_norm.forward(&q)?.transpose_axes(&[0, 2, 1, 3])?;
        let q = self.rope.forward(&q, offset)?;
        let (k, v) = match source {
            KvSource::Shared(kv) => kv.clone(),
            KvSource::Own(cache) => {
                let p = self.kv.as_ref().ok_or_else(|| {
                    MlxError::Config("a KV-shared Gemma 4 layer was given a cache".into())
                })?;
                let shape = [b, l, self.n_kv_heads, self.head_dim];
                let k = ops::reshape(p.k_proj.forward(x)?, &shape)?;
                let v = match &p.v_proj {
                    Some(v_proj) => ops::reshape(v_proj.forward(x)?, &shape)?,
                    None => k.clone(),
                };
                let k = p.k_norm.forward(&k)?.transpose_axes(&[0, 2, 1, 3])?;
                let k = self.rope.forward(&k, offset)?;
                let v = fast::rms_norm(&v, None, self.eps)?.transpose_axes(&[0, 2, 1, 3])?;
                match self.kind {
                    LayerType::Full => cache.kv()?.update_and_fetch(k, v)?,
                    LayerType::Sliding => cache.window()?.update_and_fetch(k, v)?,
                }
            }
        };
        let window = (self.kind == LayerType::Sliding).then_some(self.window);
        let out = attention(&q, &k, &v, 1.0, window, self.host)?;
        let out = ops::reshape(&out.transpose_axes(&[0, 2, 1, 3])?, &[b, l, -1])?;
        Ok((self.o_proj.forward(&out)?, (k, v)))
    }
}

/// A block's per-layer input gate.
struct PerLayerInput {
    per_layer_input_gate: Linear,
    per_layer_projection: Linear,
    post_per_layer_input_norm: RmsNorm,
}

/// The mixture-of-experts branch of a block (`enable_moe_block`), beside
/// the dense MLP: a router over the block's input picks `top_k_experts` of
/// `num_experts` GELU-gated experts, whose outputs it weighs by a softmax
/// over their scores times a learned scale per expert.
struct MoeBranch {
    router_proj: Linear,
    router_scale: Array,
    per_expert_scale: Array,
    experts: SwitchGlu,
    top_k: i32,
    eps: f32,
    pre_feedforward_layernorm_2: RmsNorm,
    post_feedforward_layernorm_1: RmsNorm,
    post_feedforward_layernorm_2: RmsNorm,
}

impl MoeBranch {
    fn load(w: &Weights, p: &str, c: &Config) -> MlxResult<Self> {
        let norm = |n: &str| RmsNorm::load(w, &format!("{p}.{n}"), c.rms_norm_eps);
        Ok(MoeBranch {
            router_proj: Linear::load(w, &format!("{p}.router.proj"))?,
            router_scale: w.take(&format!("{p}.router.scale"))?,
            per_expert_scale: w.take(&format!("{p}.router.per_expert_scale"))?,
            experts: SwitchGlu::load(
                w,
                &format!("{p}.experts.switch_glu"),
                Activation::GeluApprox,
            )?,
            top_k: c.top_k_experts.unwrap_or(1),
            eps: c.rms_norm_eps,
            pre_feedforward_layernorm_2: norm("pre_feedforward_layernorm_2")?,
            post_feedforward_layernorm_1: norm("post_feedforward_layernorm_1")?,
            post_feedforward_layernorm_2: norm("post_feedforward_layernorm_2")?,
        })
    }

    /// The experts chosen for each position of `h` and their weights.
    fn route(&self, h: &Array) -> MlxResult<(Array, Array)> {
        let width = h.shape()[h.ndim() - 1] as f32;
        let scale = ops::multiply(
            &self.router_scale,
            &scalar(width.powf(-0.5), &self.router_scale)?,
        )?;
        let scores = self
            .router_proj
            .forward(&fast::rms_norm(h, Some(&scale), self.eps)?)?;
        let e = scores.shape()[scores.ndim() - 1];
        let k = self.top_k;
        let part = ops::argpartition_axis(&scores, e - k, -1)?;
        let last: Vec<i32> = (e - k..e).collect();
        let inds = ops::indexing::take_axis(&part, Array::from_slice(&last, &[k]), -1)?;
        let weights = ops::softmax_axis(
            &ops::indexing::take_along_axis(&scores, &inds, -1)?,
            -1,
            false,
        )?;
        let per_expert = ops::indexing::take_axis(&self.per_expert_scale, &inds, 0)?;
        Ok((inds, ops::multiply(&weights, &per_expert)?))
    }

    /// The branch's output for the block's input `h`, and the dense MLP's
    /// output `dense` normed as this branch norms it.
    fn forward(&self, h: &Array, dense: &Array) -> MlxResult<Array> {
        let (inds, weights) = self.route(h)?;
        let x = self.pre_feedforward_layernorm_2.forward(h)?;
        let y = self.experts.forward(&x, &inds)?;
        let y = ops::multiply(&weights.expand_dims(-1)?, &y)?.sum_axis(-2, false)?;
        Ok(ops::add(
            &self.post_feedforward_layernorm_1.forward(dense)?,
            &self.post_feedforward_layernorm_2.forward(&y)?,
        )?)
    }
}

struct DecoderLayer {
    self_attn: Attention,
    mlp: GatedMlp,
    moe: Option<MoeBranch>,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    pre_feedforward_layernorm: RmsNorm,
    post_feedforward_layernorm: RmsNorm,
    per_layer: Option<PerLayerInput>,
    layer_scalar: Array,
}

impl DecoderLayer {
    fn load(w: &Weights, p: &str, c: &Config, kind: LayerType, has_kv: bool) -> MlxResult<Self> {
        let norm = |n: &str| RmsNorm::load(w, &format!("{p}.{n}"), c.rms_norm_eps);
        let per_layer = if c.hidden_size_per_layer_input > 0 {
            Some(PerLayerInput {
                per_layer_input_gate: Linear::load(w, &format!("{p}.per_layer_input_gate"))?,
                per_layer_projection: Linear::load(w, &format!("{p}.per_layer_projection"))?,
                post_per_layer_input_norm: norm("post_per_layer_input_norm")?,
            })
        } else {
            None
        };
        Ok(DecoderLayer {
            self_attn: Attention::load(w, &format!("{p}.self_attn"), c, kind, has_kv)?,
            mlp: GatedMlp::load(w, &format!("{p}.mlp"), Activation::GeluApprox)?,
            moe: if c.enable_moe_block {
                Some(MoeBranch::load(w, p, c)?)
            } else {
                None
            },
            input_layernorm: norm("input_layernorm")?,
            post_attention_layernorm: norm("post_attention_layernorm")?,
            pre_feedforward_layernorm: norm("pre_feedforward_layernorm")?,
            post_feedforward_layernorm: norm("post_feedforward_layernorm")?,
            per_layer,
            layer_scalar: w.take(&format!("{p}.layer_scalar"))?,
        })
    }

    fn forward(
        &self,
        x: &Array,
        offset: usize,
        source: KvSource<'_>,
        per_layer_input: Option<&Array>,
    ) -> MlxResult<(Array, (Array, Array))> {
        let (attn, kv) =
            self.self_attn
                .forward(&self.input_layernorm.forward(x)?, offset, source)?;
        let h = ops::add(x, &self.post_attention_layernorm.forward(&attn)?)?;
        let mut m = self
            .mlp
            .forward(&self.pre_feedforward_layernorm.forward(&h)?)?;
        if let Some(moe) = &self.moe {
            m = moe.forward(&h, &m)?;
        }
        let mut h = ops::add(&h, &self.post_feedforward_layernorm.forward(&m)?)?;
        if let (Some(p), Some(input)) = (&self.per_layer, per_layer_input) {
            let gate = gelu_approx(&p.per_layer_input_gate.forward(&h)?)?;
            let gate = p
                .per_layer_projection
                .forward(&ops::multiply(&gate, input)?)?;
            h = ops::add(&h, &p.post_per_layer_input_norm.forward(&gate)?)?;
        }
        Ok((ops::multiply(&h, &self.layer_scalar)?, kv))
    }
}

/// The per-layer input embeddings and their projection.
struct PerLayerEmbedding {
    embed_tokens_per_layer: Embedding,
    per_layer_model_projection: Linear,
    per_layer_projection_norm: RmsNorm,
    width: i32,
}

/// A Gemma 4 text model.
pub struct Model {
    pub config: Config,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    /// For each layer, the earlier layer whose keys and values it reads
    /// (`None`: its own).
    kv_from: Vec<Option<usize>>,
    kinds: Vec<LayerType>,
    norm: RmsNorm,
    per_layer: Option<PerLayerEmbedding>,
    lm_head: Option<Linear>,
}

impl Model {
    pub fn load(config: &Value, w: &Weights) -> MlxResult<Self> {
        let c = Config::from_config(config)?;
        let model_type = config.get("model_type").and_then(Value::as_str);
        // `gemma4` (mlx-lm) and `gemma4_unified` (the published 12B) wrap
        // the language model, under `language_model.`, with the towers of
        // other modalities beside it (vision, audio, their projectors), at
        // the top level or under `model.`: only the text model is loaded.
        let wrapped = matches!(model_type, Some("gemma4" | "gemma4_unified"));
        let (prefix, head) = if wrapped {
            w.skip_where(|k| !k.starts_with("language_model."));
            ("language_model.model", "language_model.lm_head")
        } else {
            ("model", "lm_head")
        };
        // Tensors mlx-lm drops when it loads a checkpoint.
        w.skip_where(|k| {
            [
                "self_attn.rotary_emb",
                "input_max",
                "input_min",
                "output_max",
                "output_min",
            ]
            .iter()
            .any(|s| k.contains(s))
        });
        let kinds = c.layer_types()?;
        let own = c.layers_with_kv();
        let mut kv_from = vec![None; kinds.len()];
        for (i, from) in kv_from.iter_mut().enumerate().skip(own) {
            *from = (0..own).rev().find(|&j| kinds[j] == kinds[i]);
        }
        // (KV-shared layers' MLPs are twice as wide with use_double_wide_mlp;
        // the widths come from the weights.)
        let layers = kinds
            .iter()
            .enumerate()
            .map(|(i, &kind)| {
                DecoderLayer::load(w, &format!("{prefix}.layers.{i}"), &c, kind, i < own)
            })
            .collect::<MlxResult<Vec<_>>>()?;
        let per_layer = if c.hidden_size_per_layer_input > 0 {
            Some(PerLayerEmbedding {
                embed_tokens_per_layer: Embedding::load(
                    w,
                    &format!("{prefix}.embed_tokens_per_layer"),
                )?,
                per_layer_model_projection: Linear::load(
                    w,
                    &format!("{prefix}.per_layer_model_projection"),
                )?,
                per_layer_projection_norm: RmsNorm::load(
                    w,
                    &format!("{prefix}.per_layer_projection_norm"),
                    c.rms_norm_eps,
                )?,
                width: c.hidden_size_per_layer_input as i32,
            })
        } else {
            None
        };
        let embed_tokens = Embedding::load(w, &format!("{prefix}.embed_tokens"))?;
        let lm_head = if c.tie_word_embeddings {
            w.skip(&[&format!("{head}.")]);
            None
        } else {
            Some(Linear::load(w, head)?)
        };
        let norm = RmsNorm::load(w, &format!("{prefix}.norm"), c.rms_norm_eps)?;
        Ok(Model {
            config: c,
            embed_tokens,
            layers,
            kv_from,
            kinds,
            norm,
            per_layer,
            lm_head,
        })
    }

    /// Loads a Gemma 4 model behind the [`Architecture`] seam.
    pub fn boxed(config: &Value, w: &Weights) -> MlxResult<Box<dyn Architecture>> {
        Ok(Box::new(Self::load(config, w)?))
    }

    /// Each layer's per-layer input, `[B, L, P]`.
    fn per_layer_inputs(&self, tokens: &Array, h: &Array) -> MlxResult<Option<Vec<Array>>> {
        let Some(p) = &self.per_layer else {
            return Ok(None);
        };
        let n = self.layers.len() as i32;
        let (b, l) = (tokens.shape()[0], tokens.shape()[1]);
        let shape = [b, l, n, p.width];
        let from_tokens = p.embed_tokens_per_layer.forward(tokens)?;
        let from_tokens = ops::reshape(scale(&from_tokens, (p.width as f32).sqrt())?, &shape)?;
        let projected = p.per_layer_model_projection.forward(h)?;
        let projected = scale(&projected, (self.config.hidden_size as f32).powf(-0.5))?;
        let projected = p
            .per_layer_projection_norm
            .forward(&ops::reshape(&projected, &shape)?)?;
        let mixed = scale(&ops::add(&projected, &from_tokens)?, 2f32.powf(-0.5))?;
        (0..n)
            .map(|i| Ok(ops::indexing::take_axis(&mixed, Array::from_int(i), 2)?))
            .collect::<MlxResult<Vec<_>>>()
            .map(Some)
    }

    /// Runs the blocks over `tokens` and returns the last block's output
    /// (before the final norm) and, when `tap` names a block, that block's
    /// output.
    fn blocks(
        &self,
        tokens: &Array,
        cache: &mut ModelCache,
        tap: Option<usize>,
    ) -> MlxResult<(Array, Option<Array>)> {
        let embedded = self.embed_tokens.forward(tokens)?;
        let mut h = scale(&embedded, (self.config.hidden_size as f32).sqrt())?;
        let per_layer = self.per_layer_inputs(tokens, &h)?;
        let offset = cache.offset();
        if cache.layers.len() != self.config.layers_with_kv() {
            return Err(MlxError::Config(
                "the cache was not made by this Gemma 4 model".into(),
            ));
        }
        let mut kvs: Vec<Option<(Array, Array)>> = vec![None; self.layers.len()];
        let mut tapped = None;
        for (i, layer) in self.layers.iter().enumerate() {
            let source = match self.kv_from[i] {
                Some(j) => KvSource::Shared(kvs[j].as_ref().ok_or_else(|| {
                    MlxError::Config(format!(
                        "layer {i} reads the keys of layer {j}, not yet run"
                    ))
                })?),
                None => KvSource::Own(&mut cache.layers[i]),
            };
            let input = per_layer.as_ref().map(|p| &p[i]);
            let (out, kv) = layer.forward(&h, offset, source, input)?;
            h = out;
            if self.kv_from.contains(&Some(i)) {
                kvs[i] = Some(kv);
            }
            if tap == Some(i) {
                tapped = Some(last_position(&h)?);
            }
        }
        Ok((h, tapped))
    }
}

impl Architecture for Model {
    fn new_cache(&self) -> ModelCache {
        let own = self.config.layers_with_kv();
        ModelCache::with_layers(
            self.kinds[..own]
                .iter()
                .map(|k| match k {
                    LayerType::Full => LayerCache::Kv(KvCache::default()),
                    LayerType::Sliding => {
                        LayerCache::Window(WindowCache::new(self.config.sliding_window))
                    }
                })
                .collect(),
        )
    }

    fn hidden_size(&self) -> usize {
        self.config.hidden_size as usize
    }

    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn hidden(&self, tokens: &Array, cache: &mut ModelCache) -> MlxResult<Array> {
        let (h, _) = self.blocks(tokens, cache, None)?;
        self.norm.forward(&h)
    }

    fn last_hidden(
        &self,
        tokens: &Array,
        cache: &mut ModelCache,
        tap: Option<usize>,
    ) -> MlxResult<LastHidden> {
        let (h, tapped) = self.blocks(tokens, cache, tap)?;
        Ok(LastHidden {
            normed: self.norm.forward(&last_position(&h)?)?,
            tap: tapped,
        })
    }

    fn logits(&self, hidden: &Array) -> MlxResult<Array> {
        let logits = match &self.lm_head {
            Some(head) => head.forward(hidden)?,
            None => self.embed_tokens.as_linear(hidden)?,
        };
        match self.config.final_logit_softcapping {
            Some(cap) => {
                let t = ops::tanh(&ops::divide(&logits, &scalar(cap, &logits)?)?)?;
                scale(&t, cap)
            }
            None => Ok(logits),
        }
    }
}

#[cfg(test)]
mod tests {
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
        let rope = rope(&c, LayerType::Full).unwrap();
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
