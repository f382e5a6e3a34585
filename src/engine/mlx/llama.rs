//! The llama architecture (`model_type: "llama"`): pre-norm decoder blocks of
//! grouped-query attention with rotary embeddings and a SwiGLU MLP.
//!
//! Weight names follow the Hugging Face checkpoints:
//! `model.embed_tokens`, `model.layers.N.{self_attn.{q,k,v,o}_proj,
//! mlp.{gate,up,down}_proj, input_layernorm, post_attention_layernorm}`,
//! `model.norm`, `lm_head` (absent with tied embeddings).

use mlx_rs::{ops, Array};
use serde::Deserialize;
use serde_json::Value;

use super::architecture::{Architecture, Stacked};
use super::attention::attention;
use super::cache::{KvCache, LayerCache, ModelCache};
use super::layers::{
    last_position, residual, Activation, Block, DecoderStack, GatedMlp, HostKernels, Linear,
    RmsNorm, Rope, RopeScaling,
};
use super::loader::Weights;
use super::{MlxError, MlxResult};

fn default_rope_theta() -> f32 {
    10000.0
}

fn default_true() -> bool {
    true
}

/// `config.json` of a llama checkpoint.
#[derive(Clone, Debug, Deserialize)]
pub struct Config {
    pub hidden_size: i32,
    pub num_hidden_layers: usize,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: Option<i32>,
    pub head_dim: Option<i32>,
    pub rms_norm_eps: f32,
    pub vocab_size: usize,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f32,
    #[serde(default)]
    pub rope_traditional: bool,
    pub rope_scaling: Option<Value>,
    pub max_position_embeddings: Option<usize>,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
}

impl Config {
    fn kv_heads(&self) -> i32 {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    fn head_dim(&self) -> i32 {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    /// The rope's scaling (`rope_scaling`: none, default or linear).
    fn rope_scaling(&self) -> MlxResult<RopeScaling> {
        let Some(scaling) = &self.rope_scaling else {
            return Ok(RopeScaling::Default);
        };
        let kind = scaling
            .get("rope_type")
            .or_else(|| scaling.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        let factor = scaling.get("factor").and_then(Value::as_f64).unwrap_or(1.0);
        match RopeScaling::named(kind, Some(factor as f32), None) {
            Some(s @ (RopeScaling::Default | RopeScaling::Linear { .. })) => Ok(s),
            _ => Err(MlxError::Config(format!(
                "llama rope_scaling type `{kind}` is not supported (default or linear)"
            ))),
        }
    }
}

struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    n_heads: i32,
    n_kv_heads: i32,
    scale: f32,
    rope: Rope,
    host: HostKernels,
}

impl Attention {
    fn load(w: &Weights, p: &str, c: &Config) -> MlxResult<Self> {
        let head_dim = c.head_dim();
        Ok(Attention {
            q_proj: Linear::load(w, &format!("{p}.q_proj"))?,
            k_proj: Linear::load(w, &format!("{p}.k_proj"))?,
            v_proj: Linear::load(w, &format!("{p}.v_proj"))?,
            o_proj: Linear::load(w, &format!("{p}.o_proj"))?,
            n_heads: c.num_attention_heads,
            n_kv_heads: c.kv_heads(),
            scale: (head_dim as f32).powf(-0.5),
            rope: Rope::new(
                head_dim,
                c.rope_theta,
                c.rope_traditional,
                c.rope_scaling()?,
            )?,
            host: HostKernels::of(w),
        })
    }

    /// Attention of every position of `x` (`[B, L, D]`), extending `cache`.
    fn forward(&self, x: &Array, cache: &mut KvCache) -> MlxResult<Array> {
        self.attend(x, x, cache)
    }

    /// Attention of the last position of `x` only; `cache` still gains
    /// every position's keys and values.
    fn forward_last(&self, x: &Array, cache: &mut KvCache) -> MlxResult<Array> {
        self.attend(x, &last_position(x)?, cache)
    }

    /// Keys and values of all of `x`, queries of `queries` (the last
    /// positions of `x`).
    fn attend(&self, x: &Array, queries: &Array, cache: &mut KvCache) -> MlxResult<Array> {
        let b = x.shape()[0];
        // `[B, L, H, D]`: the heads of each position.
        let split = |y: Array, n: i32| -> MlxResult<Array> {
            let l = y.shape()[1];
            Ok(ops::reshape(&y, &[b, l, n, -1])?)
        };
        let l = queries.shape()[1];
        let q = split(self.q_proj.forward(queries)?, self.n_heads)?;
        let k = split(self.k_proj.forward(x)?, self.n_kv_heads)?;
        let v = split(self.v_proj.forward(x)?, self.n_kv_heads)?.transpose_axes(&[0, 2, 1, 3])?;

        let offset = cache.offset();
        let q = self
            .rope
            .forward_heads(&q, offset + (x.shape()[1] - l) as usize, self.host)?;
        let k = self.rope.forward_heads(&k, offset, self.host)?;
        let keys = cache.update_and_fetch(k, v)?;
        let out = attention(&q, &keys, self.scale, None, self.host)?;
        let out = ops::reshape(&out.transpose_axes(&[0, 2, 1, 3])?, &[b, l, -1])?;
        self.o_proj.forward(&out)
    }
}

/// One decoder block: attention and the gated MLP, each after its norm.
pub struct TransformerBlock {
    self_attn: Attention,
    mlp: GatedMlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

impl TransformerBlock {
    fn load(w: &Weights, p: &str, c: &Config) -> MlxResult<Self> {
        Ok(TransformerBlock {
            self_attn: Attention::load(w, &format!("{p}.self_attn"), c)?,
            mlp: GatedMlp::load(w, &format!("{p}.mlp"), Activation::Silu)?,
            input_layernorm: RmsNorm::load(w, &format!("{p}.input_layernorm"), c.rms_norm_eps)?,
            post_attention_layernorm: RmsNorm::load(
                w,
                &format!("{p}.post_attention_layernorm"),
                c.rms_norm_eps,
            )?,
        })
    }

    fn feed_forward(&self, h: Array) -> MlxResult<Array> {
        let r = self
            .mlp
            .forward(&self.post_attention_layernorm.forward(&h)?)?;
        residual(&h, &r)
    }
}

impl Block for TransformerBlock {
    fn forward(&self, x: &Array, cache: &mut LayerCache) -> MlxResult<Array> {
        let attn = self
            .self_attn
            .forward(&self.input_layernorm.forward(x)?, cache.kv()?)?;
        self.feed_forward(residual(x, &attn)?)
    }

    /// Its keys and values still go to `cache` for every position.
    fn forward_last(&self, x: &Array, cache: &mut LayerCache) -> MlxResult<Array> {
        let attn = self
            .self_attn
            .forward_last(&self.input_layernorm.forward(x)?, cache.kv()?)?;
        self.feed_forward(residual(&last_position(x)?, &attn)?)
    }
}

/// A llama model: embeddings, blocks, final norm, output projection.
pub struct Model {
    pub config: Config,
    stack: DecoderStack<TransformerBlock>,
}

impl Model {
    pub fn load(config: &Value, w: &Weights) -> MlxResult<Self> {
        let c: Config = serde_json::from_value(config.clone())
            .map_err(|e| MlxError::Config(format!("config.json is not a llama config: {e}")))?;
        w.skip(&["model.rotary_emb", "rotary_emb"]);
        let layers = (0..c.num_hidden_layers)
            .map(|i| TransformerBlock::load(w, &format!("model.layers.{i}"), &c))
            .collect::<MlxResult<Vec<_>>>()?;
        let stack = DecoderStack::load(
            w,
            layers,
            "model",
            "lm_head",
            c.tie_word_embeddings,
            c.rms_norm_eps,
        )?;
        Ok(Model { config: c, stack })
    }

    /// Loads a llama model behind the [`Architecture`] seam.
    pub fn boxed(config: &Value, w: &Weights) -> MlxResult<Box<dyn Architecture>> {
        Ok(Box::new(Self::load(config, w)?))
    }
}

impl Stacked for Model {
    type Block = TransformerBlock;

    fn stack(&self) -> &DecoderStack<TransformerBlock> {
        &self.stack
    }

    fn new_cache(&self) -> ModelCache {
        ModelCache::new(self.stack.layers.len())
    }

    fn hidden_size(&self) -> usize {
        self.config.hidden_size as usize
    }
}
