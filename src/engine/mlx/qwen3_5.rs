//! The Qwen3.5 / Qwen3.6 architectures (`model_type: "qwen3_5"`, dense, and
//! `"qwen3_5_moe"`): a hybrid of Gated DeltaNet linear-attention blocks and
//! gated full-attention blocks (every `full_attention_interval`-th), with a
//! SwiGLU MLP or a sparse mixture of experts with a shared expert.
//!
//! The MLX conversions are of the vision-language checkpoints: the text
//! config is nested under `text_config` and the weights under
//! `language_model.` (`language_model.model.embed_tokens`,
//! `language_model.model.layers.N.{linear_attn.{in_proj_qkv, in_proj_z,
//! in_proj_b, in_proj_a, conv1d, dt_bias, A_log, norm, out_proj} |
//! self_attn.{q,k,v,o}_proj, q_norm, k_norm}, input_layernorm,
//! post_attention_layernorm, mlp.{gate_proj, up_proj, down_proj} |
//! mlp.{gate, switch_mlp.{gate,up,down}_proj, shared_expert.{gate,up,down}_proj,
//! shared_expert_gate}}`, `language_model.model.norm`,
//! `language_model.lm_head`); the vision tower is skipped.
//!
//! A linear-attention block keeps, per sequence, the last
//! `linear_conv_kernel_dim - 1` inputs of its causal convolution and the
//! recurrent state `[B, Hv, Dv, Dk]` (float32); both continue exactly from a
//! cache, so a prompt may be read in chunks. The state's recurrence (the
//! gated delta rule) is computed as [`super::delta`] says: by the host
//! kernel on the CPU, else in blocks of tokens (reading a prompt) or a
//! token at a time (decoding).

use mlx_rs::{fast, nn, ops, Array, Dtype};
use serde::Deserialize;
use serde_json::Value;

use super::architecture::{Architecture, Stacked};
use super::attention::attention;
use super::cache::{DeltaCache, KvCache, LayerCache, ModelCache};
use super::delta;
use super::layers::{
    last_position, Activation, Block, DecoderStack, GatedMlp, HostKernels, Linear, RmsNorm, Rope,
    RopeScaling,
};
use super::loader::Weights;
use super::switch::SwitchGlu;
use super::{MlxError, MlxResult};
use crate::model_config;

fn default_interval() -> usize {
    4
}

fn default_true() -> bool {
    true
}

fn default_conv() -> i32 {
    4
}

/// The text part of a Qwen3.5 `config.json` (`text_config`, or the whole
/// file for a text-only checkpoint).
#[derive(Clone, Debug, Deserialize)]
pub struct Config {
    pub hidden_size: i32,
    pub num_hidden_layers: usize,
    #[serde(default)]
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub head_dim: Option<i32>,
    pub rms_norm_eps: f32,
    pub vocab_size: usize,
    pub linear_num_value_heads: i32,
    pub linear_num_key_heads: i32,
    pub linear_key_head_dim: i32,
    pub linear_value_head_dim: i32,
    #[serde(default = "default_conv")]
    pub linear_conv_kernel_dim: i32,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default = "default_interval")]
    pub full_attention_interval: usize,
    #[serde(default)]
    pub num_experts: i32,
    #[serde(default)]
    pub num_experts_per_tok: i32,
    #[serde(default)]
    pub shared_expert_intermediate_size: i32,
    #[serde(default)]
    pub moe_intermediate_size: i32,
    #[serde(default = "default_true")]
    pub norm_topk_prob: bool,
    pub rope_parameters: Option<Value>,
}

impl Config {
    /// Reads the text config of `config.json` and checks what the layers
    /// rely on.
    pub fn from_config(config: &Value) -> MlxResult<Self> {
        let c: Config = serde_json::from_value(model_config::text(config)).map_err(|e| {
            MlxError::Config(format!(
                "config.json is not a Qwen3.5 config (its text_config lacks a field): {e}"
            ))
        })?;
        let bad = |what: String| Err(MlxError::Config(format!("Qwen3.5 config.json: {what}")));
        if c.full_attention_interval == 0 {
            return bad("full_attention_interval must be at least 1".into());
        }
        if c.num_hidden_layers == 0 {
            return bad("num_hidden_layers must be at least 1".into());
        }
        if c.num_attention_heads <= 0
            || c.num_key_value_heads <= 0
            || c.num_attention_heads % c.num_key_value_heads != 0
        {
            return bad(format!(
                "num_attention_heads ({}) must be a positive multiple of num_key_value_heads ({})",
                c.num_attention_heads, c.num_key_value_heads
            ));
        }
        if c.linear_num_key_heads <= 0 || c.linear_num_value_heads % c.linear_num_key_heads != 0 {
            return bad(format!(
                "linear_num_value_heads ({}) must be a multiple of linear_num_key_heads ({})",
                c.linear_num_value_heads, c.linear_num_key_heads
            ));
        }
        if c.linear_conv_kernel_dim < 2 {
            return bad("linear_conv_kernel_dim must be at least 2".into());
        }
        if c.num_experts > 0 && !(1..=c.num_experts).contains(&c.num_experts_per_tok) {
            return bad(format!(
                "num_experts_per_tok ({}) must be between 1 and num_experts ({})",
                c.num_experts_per_tok, c.num_experts
            ));
        }
        if c.head_dim() <= 0 {
            return bad("head_dim must be positive".into());
        }
        c.rope()?;
        Ok(c)
    }

    fn head_dim(&self) -> i32 {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Rotated dimensions of a head and the rope base.
    fn rope(&self) -> MlxResult<(i32, f32)> {
        let p = self.rope_parameters.as_ref();
        let get = |k: &str| p.and_then(|p| p.get(k));
        let kind = get("type")
            .or_else(|| get("rope_type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        if kind != "default" {
            return Err(MlxError::Config(format!(
                "Qwen3.5 rope type `{kind}` is not supported (only `default` for text)"
            )));
        }
        let factor = get("partial_rotary_factor")
            .and_then(Value::as_f64)
            .unwrap_or(0.25);
        let theta = get("rope_theta")
            .and_then(Value::as_f64)
            .unwrap_or(100_000.0);
        Ok(((self.head_dim() as f64 * factor) as i32, theta as f32))
    }

    /// Whether block `i` is a linear-attention block.
    fn is_linear(&self, i: usize) -> bool {
        !(i + 1).is_multiple_of(self.full_attention_interval)
    }
}

/// A linear layer (dense, quantized, or quantized and expanded at load as
/// [`Linear`] does) whose output keeps the input's type.
struct Proj(Linear);

impl Proj {
    fn load(w: &Weights, name: &str) -> MlxResult<Self> {
        Ok(Proj(Linear::load(w, name)?))
    }

    fn forward(&self, x: &Array) -> MlxResult<Array> {
        self.0.forward_as(x)
    }
}

/// The gated full attention: queries carry an output gate, queries and keys
/// are RMS-normed per head, and rope turns the first `rope_dims` of a head.
struct Attention {
    q_proj: Proj,
    k_proj: Proj,
    v_proj: Proj,
    o_proj: Proj,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    n_heads: i32,
    n_kv_heads: i32,
    head_dim: i32,
    scale: f32,
    rope: Rope,
    host: HostKernels,
}

impl Attention {
    fn load(w: &Weights, p: &str, c: &Config) -> MlxResult<Self> {
        let head_dim = c.head_dim();
        let (rope_dims, rope_theta) = c.rope()?;
        Ok(Attention {
            q_proj: Proj::load(w, &format!("{p}.q_proj"))?,
            k_proj: Proj::load(w, &format!("{p}.k_proj"))?,
            v_proj: Proj::load(w, &format!("{p}.v_proj"))?,
            o_proj: Proj::load(w, &format!("{p}.o_proj"))?,
            q_norm: RmsNorm::load(w, &format!("{p}.q_norm"), c.rms_norm_eps)?,
            k_norm: RmsNorm::load(w, &format!("{p}.k_norm"), c.rms_norm_eps)?,
            n_heads: c.num_attention_heads,
            n_kv_heads: c.num_key_value_heads,
            head_dim,
            scale: (head_dim as f32).powf(-0.5),
            rope: Rope::new(rope_dims, rope_theta, false, RopeScaling::Default)?,
            host: HostKernels::of(w),
        })
    }

    fn forward(&self, x: &Array, cache: &mut KvCache) -> MlxResult<Array> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let q = ops::reshape(self.q_proj.forward(x)?, &[b, l, self.n_heads, -1])?;
        let parts = q.split_at_indices(&[self.head_dim], -1)?;
        let (queries, gate) = (&parts[0], ops::reshape(&parts[1], &[b, l, -1])?);
        let keys = ops::reshape(self.k_proj.forward(x)?, &[b, l, self.n_kv_heads, -1])?;
        let values = ops::reshape(self.v_proj.forward(x)?, &[b, l, self.n_kv_heads, -1])?;
        let queries = self
            .q_norm
            .forward(queries)?
            .transpose_axes(&[0, 2, 1, 3])?;
        let keys = self.k_norm.forward(&keys)?.transpose_axes(&[0, 2, 1, 3])?;
        let values = values.transpose_axes(&[0, 2, 1, 3])?;

        let offset = cache.offset();
        let queries = self.rope.forward(&queries, offset)?;
        let keys = self.rope.forward(&keys, offset)?;
        let keys = cache.update_and_fetch(keys, values)?;
        let out = attention(&queries, &keys, self.scale, None, self.host)?;
        let out = ops::reshape(&out.transpose_axes(&[0, 2, 1, 3])?, &[b, l, -1])?;
        self.o_proj
            .forward(&ops::multiply(&out, &ops::sigmoid(&gate)?)?)
    }
}

/// Gated DeltaNet: a causal depthwise convolution over the projected
/// queries, keys and values, then the gated delta rule
/// `S_t = g_t S_{t-1} + k_t (beta_t (v_t - g_t S_{t-1} k_t))^T`,
/// `y_t = S_t q_t`, per value head, and a gated RMS norm of `y`.
struct GatedDeltaNet {
    in_proj_qkv: Proj,
    in_proj_z: Proj,
    in_proj_b: Proj,
    in_proj_a: Proj,
    /// `[conv_dim, kernel, 1]`.
    conv1d: Array,
    dt_bias: Array,
    a_log: Array,
    norm: RmsNorm,
    out_proj: Proj,
    num_k_heads: i32,
    num_v_heads: i32,
    head_k_dim: i32,
    head_v_dim: i32,
    kernel: i32,
    host: HostKernels,
    /// Read prompts in blocks of tokens (`LoadOptions::chunked_delta`).
    chunked: bool,
}

impl GatedDeltaNet {
    fn load(w: &Weights, p: &str, c: &Config) -> MlxResult<Self> {
        let conv1d = w.take(&format!("{p}.conv1d.weight"))?;
        let key_dim = c.linear_key_head_dim * c.linear_num_key_heads;
        let conv_dim = 2 * key_dim + c.linear_value_head_dim * c.linear_num_value_heads;
        if conv1d.shape() != [conv_dim, c.linear_conv_kernel_dim, 1] {
            return Err(MlxError::Config(format!(
                "{p}.conv1d.weight has shape {:?}, expected [{conv_dim}, {}, 1]; \
                 convert the checkpoint with mlx_lm.convert",
                conv1d.shape(),
                c.linear_conv_kernel_dim
            )));
        }
        Ok(GatedDeltaNet {
            in_proj_qkv: Proj::load(w, &format!("{p}.in_proj_qkv"))?,
            in_proj_z: Proj::load(w, &format!("{p}.in_proj_z"))?,
            in_proj_b: Proj::load(w, &format!("{p}.in_proj_b"))?,
            in_proj_a: Proj::load(w, &format!("{p}.in_proj_a"))?,
            conv1d,
            dt_bias: w.take(&format!("{p}.dt_bias"))?,
            a_log: w.take(&format!("{p}.A_log"))?,
            norm: RmsNorm::load(w, &format!("{p}.norm"), c.rms_norm_eps)?,
            out_proj: Proj::load(w, &format!("{p}.out_proj"))?,
            num_k_heads: c.linear_num_key_heads,
            num_v_heads: c.linear_num_value_heads,
            head_k_dim: c.linear_key_head_dim,
            head_v_dim: c.linear_value_head_dim,
            kernel: c.linear_conv_kernel_dim,
            host: HostKernels::of(w),
            chunked: w.options.chunked_delta,
        })
    }

    fn forward(&self, x: &Array, cache: &mut DeltaCache) -> MlxResult<Array> {
        let (b, s) = (x.shape()[0], x.shape()[1]);
        let key_dim = self.head_k_dim * self.num_k_heads;
        let conv_dim = self.conv1d.shape()[0];
        let qkv = self.in_proj_qkv.forward(x)?;
        let z = ops::reshape(
            self.in_proj_z.forward(x)?,
            &[b, s, self.num_v_heads, self.head_v_dim],
        )?;
        let beta_in = self.in_proj_b.forward(x)?;
        let a = self.in_proj_a.forward(x)?;

        // The causal convolution continues from the inputs the cache kept.
        let conv_state = match cache.conv.take() {
            Some(c) => c,
            None => ops::zeros_dtype(&[b, self.kernel - 1, conv_dim], x.dtype())?,
        };
        let conv_input = ops::concatenate(&[&conv_state, &qkv], 1)?;
        let total = conv_input.shape()[1];
        let keep: Vec<i32> = (total - (self.kernel - 1)..total).collect();
        cache.conv = Some(ops::indexing::take_axis(
            &conv_input,
            Array::from_slice(&keep, &[keep.len() as i32]),
            1,
        )?);
        let conv_out = nn::silu(ops::conv1d(&conv_input, &self.conv1d, 1, 0, 1, conv_dim)?)?;
        let parts = conv_out.split_at_indices(&[key_dim, 2 * key_dim], -1)?;
        let q = ops::reshape(&parts[0], &[b, s, self.num_k_heads, self.head_k_dim])?;
        let k = ops::reshape(&parts[1], &[b, s, self.num_k_heads, self.head_k_dim])?;
        let v = ops::reshape(&parts[2], &[b, s, self.num_v_heads, self.head_v_dim])?;

        // L2 norms of queries and keys, with the readout scale folded into
        // the queries (as RMS norms with a rescaled epsilon).
        let inv_scale = (self.head_k_dim as f32).powf(-0.5);
        let eps = 1e-6 * inv_scale * inv_scale;
        let scaled = |x: Array, by: f32| -> MlxResult<Array> {
            Ok(ops::multiply(
                &Array::from_f32(by).as_dtype(x.dtype())?,
                &x,
            )?)
        };
        let q = scaled(fast::rms_norm(&q, None, eps)?, inv_scale * inv_scale)?;
        let k = scaled(fast::rms_norm(&k, None, eps)?, inv_scale)?;

        let beta = ops::sigmoid(&beta_in)?;
        let log_decay = ops::multiply(
            &ops::negative(&ops::exp(self.a_log.as_dtype(Dtype::Float32)?)?)?,
            &nn::softplus(ops::add(&a, &self.dt_bias)?)?,
        )?;
        let decay = ops::exp(&log_decay)?;
        let state = match cache.state.take() {
            Some(st) => st,
            None => ops::zeros_dtype(
                &[b, self.num_v_heads, self.head_v_dim, self.head_k_dim],
                Dtype::Float32,
            )?,
        };
        // The host kernel on the CPU; else MLX ops: a token at a time to
        // decode, in blocks of tokens to read a prompt.
        let (y, state) = if self.host.recurrence() {
            delta::host(&q, &k, &v, &decay, &beta, &state)?
        } else {
            let repeat = self.num_v_heads / self.num_k_heads;
            let (q, k) = if repeat > 1 {
                (repeat_heads(&q, repeat)?, repeat_heads(&k, repeat)?)
            } else {
                (q, k)
            };
            if s == 1 || !self.chunked {
                delta::steps(&q, &k, &v, &decay, &beta, state)?
            } else {
                delta::chunked(&q, &k, &v, &log_decay, &beta, state)?
            }
        };
        cache.state = Some(state);
        let y = y.as_dtype(x.dtype())?;

        // Gated RMS norm: norm(y) * silu(z), in float32.
        let normed = self.norm.forward(&y)?;
        let gated = ops::multiply(
            &nn::silu(z.as_dtype(Dtype::Float32)?)?,
            &normed.as_dtype(Dtype::Float32)?,
        )?
        .as_dtype(y.dtype())?;
        self.out_proj.forward(&ops::reshape(&gated, &[b, s, -1])?)
    }
}

/// `[B, L, H, D]` → `[B, L, H * r, D]`, each head repeated `r` times in place.
fn repeat_heads(x: &Array, r: i32) -> MlxResult<Array> {
    let sh = x.shape();
    let e = x.expand_dims(3)?;
    let e = ops::broadcast_to(&e, &[sh[0], sh[1], sh[2], r, sh[3]])?;
    Ok(ops::reshape(&e, &[sh[0], sh[1], sh[2] * r, sh[3]])?)
}

/// Top-k routing over `num_experts` SwiGLU experts, plus a shared expert
/// scaled by its own sigmoid gate.
struct SparseMoe {
    gate: Proj,
    switch_mlp: SwitchGlu,
    shared_expert: GatedMlp,
    shared_expert_gate: Proj,
    top_k: i32,
    norm_topk_prob: bool,
}

impl SparseMoe {
    fn load(w: &Weights, p: &str, c: &Config) -> MlxResult<Self> {
        Ok(SparseMoe {
            gate: Proj::load(w, &format!("{p}.gate"))?,
            switch_mlp: SwitchGlu::load(w, &format!("{p}.switch_mlp"), Activation::Silu)?,
            shared_expert: GatedMlp::load(w, &format!("{p}.shared_expert"), Activation::Silu)?,
            shared_expert_gate: Proj::load(w, &format!("{p}.shared_expert_gate"))?,
            top_k: c.num_experts_per_tok,
            norm_topk_prob: c.norm_topk_prob,
        })
    }

    fn forward(&self, x: &Array) -> MlxResult<Array> {
        let gates = ops::softmax_axis(&self.gate.forward(x)?, -1, true)?;
        let e = gates.shape()[gates.ndim() - 1];
        let k = self.top_k;
        let part = ops::argpartition_axis(&gates, e - k, -1)?;
        let last: Vec<i32> = (e - k..e).collect();
        let inds = ops::indexing::take_axis(&part, Array::from_slice(&last, &[k]), -1)?;
        let mut scores = ops::indexing::take_along_axis(&gates, &inds, -1)?;
        if self.norm_topk_prob {
            scores = ops::divide(&scores, &scores.sum_axis(-1, true)?)?;
        }
        let y = self.switch_mlp.forward(x, &inds)?;
        let y = ops::multiply(&y, &scores.expand_dims(-1)?)?.sum_axis(-2, false)?;
        let shared = self.shared_expert.forward(x)?;
        let shared = ops::multiply(
            &ops::sigmoid(&self.shared_expert_gate.forward(x)?)?,
            &shared,
        )?;
        Ok(ops::add(&y, &shared)?)
    }
}

enum Mixer {
    Linear(GatedDeltaNet),
    Full(Attention),
}

enum FeedForward {
    Dense(GatedMlp),
    Sparse(Box<SparseMoe>),
}

impl FeedForward {
    fn forward(&self, x: &Array) -> MlxResult<Array> {
        match self {
            FeedForward::Dense(m) => m.forward(x),
            FeedForward::Sparse(m) => m.forward(x),
        }
    }
}

/// One decoder block: its mixer (full attention or a DeltaNet layer) and
/// its MLP (dense or experts), each after its norm.
pub struct DecoderLayer {
    mixer: Mixer,
    mlp: FeedForward,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

impl DecoderLayer {
    fn load(w: &Weights, p: &str, c: &Config, linear: bool) -> MlxResult<Self> {
        let mixer = if linear {
            Mixer::Linear(GatedDeltaNet::load(w, &format!("{p}.linear_attn"), c)?)
        } else {
            Mixer::Full(Attention::load(w, &format!("{p}.self_attn"), c)?)
        };
        let mlp = if c.num_experts > 0 {
            FeedForward::Sparse(Box::new(SparseMoe::load(w, &format!("{p}.mlp"), c)?))
        } else {
            FeedForward::Dense(GatedMlp::load(w, &format!("{p}.mlp"), Activation::Silu)?)
        };
        Ok(DecoderLayer {
            mixer,
            mlp,
            input_layernorm: RmsNorm::load(w, &format!("{p}.input_layernorm"), c.rms_norm_eps)?,
            post_attention_layernorm: RmsNorm::load(
                w,
                &format!("{p}.post_attention_layernorm"),
                c.rms_norm_eps,
            )?,
        })
    }

    /// The residual stream after the token mixer, every position.
    fn mix(&self, x: &Array, cache: &mut LayerCache) -> MlxResult<Array> {
        let h = self.input_layernorm.forward(x)?;
        let r = match (&self.mixer, cache) {
            (Mixer::Linear(m), LayerCache::Delta(c)) => m.forward(&h, c)?,
            (Mixer::Full(m), c) => m.forward(&h, c.kv()?)?,
            (Mixer::Linear(_), _) => {
                return Err(MlxError::Config(
                    "a linear-attention block was given a cache of another kind".into(),
                ))
            }
        };
        Ok(ops::add(x, &r)?)
    }

    fn feed_forward(&self, h: &Array) -> MlxResult<Array> {
        let r = self
            .mlp
            .forward(&self.post_attention_layernorm.forward(h)?)?;
        Ok(ops::add(h, &r)?)
    }
}

impl Block for DecoderLayer {
    fn forward(&self, x: &Array, cache: &mut LayerCache) -> MlxResult<Array> {
        self.feed_forward(&self.mix(x, cache)?)
    }

    /// The mixer still reads, and caches, every position.
    fn forward_last(&self, x: &Array, cache: &mut LayerCache) -> MlxResult<Array> {
        self.feed_forward(&last_position(&self.mix(x, cache)?)?)
    }
}

/// A Qwen3.5 text model.
pub struct Model {
    pub config: Config,
    stack: DecoderStack<DecoderLayer>,
}

impl Model {
    pub fn load(config: &Value, w: &Weights) -> MlxResult<Self> {
        let c = Config::from_config(config)?;
        w.skip(&[
            "vision_tower",
            "model.visual",
            "language_model.mtp.",
            "mtp.",
        ]);
        // The conversions of the vision-language checkpoints put the text
        // model under `language_model.`.
        let root = if w.contains("language_model.model.embed_tokens.weight")
            || w.contains("language_model.model.embed_tokens.scales")
        {
            "language_model."
        } else {
            ""
        };
        let layers = (0..c.num_hidden_layers)
            .map(|i| DecoderLayer::load(w, &format!("{root}model.layers.{i}"), &c, c.is_linear(i)))
            .collect::<MlxResult<Vec<_>>>()?;
        let stack = DecoderStack::load(
            w,
            layers,
            &format!("{root}model"),
            &format!("{root}lm_head"),
            c.tie_word_embeddings,
            c.rms_norm_eps,
        )?
        .head_keeping_type();
        Ok(Model { config: c, stack })
    }

    /// Loads a Qwen3.5 model behind the [`Architecture`] seam.
    pub fn boxed(config: &Value, w: &Weights) -> MlxResult<Box<dyn Architecture>> {
        Ok(Box::new(Self::load(config, w)?))
    }
}

impl Stacked for Model {
    type Block = DecoderLayer;

    fn stack(&self) -> &DecoderStack<DecoderLayer> {
        &self.stack
    }

    fn new_cache(&self) -> ModelCache {
        ModelCache::with_layers(
            (0..self.stack.layers.len())
                .map(|i| {
                    if self.config.is_linear(i) {
                        LayerCache::Delta(DeltaCache::default())
                    } else {
                        LayerCache::Kv(KvCache::default())
                    }
                })
                .collect(),
        )
    }

    fn hidden_size(&self) -> usize {
        self.config.hidden_size as usize
    }
}
