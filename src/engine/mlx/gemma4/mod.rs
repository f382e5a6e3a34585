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
//!
//! The config, its defaults and checks, and each layer kind's rope are in
//! `config.rs`; this file holds the layers and the model.

mod config;

use mlx_rs::{fast, ops, Array};
use serde_json::Value;

pub use self::config::{Config, RopeParameters};

use self::config::LayerType;
use super::architecture::Architecture;
use super::attention::attention;
use super::cache::{Keys, KvCache, LayerCache, ModelCache, WindowCache};
use super::layers::{
    gelu_approx, last_position, run_blocks, scalar, Activation, DecoderStack, Embedding, GatedMlp,
    HostKernels, LastHidden, Linear, RmsNorm, Rope,
};
use super::loader::Weights;
use super::switch::SwitchGlu;
use super::{MlxError, MlxResult};

/// `x * v` for a scalar `v`, in `x`'s dtype.
fn scale(x: &Array, v: f32) -> MlxResult<Array> {
    Ok(ops::multiply(x, &scalar(v, x)?)?)
}

/// Where a layer's keys and values come from.
enum KvSource<'a> {
    /// Its own projections, appended to its cache.
    Own(&'a mut LayerCache),
    /// Those an earlier layer of its kind returned for this call.
    Shared(&'a Keys),
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
            rope: c.rope(kind)?,
            host: HostKernels::of(w),
            window: c.sliding_window,
        })
    }

    /// Attention of every position of `x` (`[B, L, D]`) at positions from
    /// `offset`; returns the output and the keys and values attended to
    /// (for the layers that share them).
    fn forward(&self, x: &Array, offset: usize, source: KvSource<'_>) -> MlxResult<(Array, Keys)> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let q = ops::reshape(
            self.q_proj.forward(x)?,
            &[b, l, self.n_heads, self.head_dim],
        )?;
        let q = self.q_norm.forward(&q)?.transpose_axes(&[0, 2, 1, 3])?;
        let q = self.rope.forward(&q, offset)?;
        let keys = match source {
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
        let out = attention(&q, &keys, 1.0, window, self.host)?;
        let out = ops::reshape(&out.transpose_axes(&[0, 2, 1, 3])?, &[b, l, -1])?;
        Ok((self.o_proj.forward(&out)?, keys))
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
    ) -> MlxResult<(Array, Keys)> {
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
    stack: DecoderStack<DecoderLayer>,
    /// For each layer, the earlier layer whose keys and values it reads
    /// (`None`: its own).
    kv_from: Vec<Option<usize>>,
    kinds: Vec<LayerType>,
    per_layer: Option<PerLayerEmbedding>,
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
        if c.tie_word_embeddings {
            // Every tensor of the tied head, as mlx-lm drops them.
            w.skip(&[&format!("{head}.")]);
        }
        let stack = DecoderStack::load(
            w,
            layers,
            prefix,
            head,
            c.tie_word_embeddings,
            c.rms_norm_eps,
        )?;
        Ok(Model {
            config: c,
            stack,
            kv_from,
            kinds,
            per_layer,
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
        let n = self.stack.layers.len() as i32;
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
        let embedded = self.stack.embed_tokens.forward(tokens)?;
        let h = scale(&embedded, (self.config.hidden_size as f32).sqrt())?;
        let per_layer = self.per_layer_inputs(tokens, &h)?;
        let offset = cache.offset();
        if cache.layers.len() != self.config.layers_with_kv() {
            return Err(MlxError::Config(
                "the cache was not made by this Gemma 4 model".into(),
            ));
        }
        let mut kvs: Vec<Option<Keys>> = vec![None; self.stack.layers.len()];
        run_blocks(&self.stack.layers, h, tap, |i, layer, h| {
            let source = match self.kv_from[i] {
                Some(j) => KvSource::Shared(kvs[j].as_ref().ok_or_else(|| {
                    MlxError::Config(format!(
                        "layer {i} reads the keys of layer {j}, not yet run"
                    ))
                })?),
                None => KvSource::Own(&mut cache.layers[i]),
            };
            let input = per_layer.as_ref().map(|p| &p[i]);
            let (out, kv) = layer.forward(h, offset, source, input)?;
            if self.kv_from.contains(&Some(i)) {
                kvs[i] = Some(kv);
            }
            Ok(out)
        })
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
        self.stack.layers.len()
    }

    fn hidden(
        &self,
        tokens: &Array,
        cache: &mut ModelCache,
        tap: Option<usize>,
    ) -> MlxResult<(Array, Option<Array>)> {
        let (h, tapped) = self.blocks(tokens, cache, tap)?;
        Ok((self.stack.norm.forward(&h)?, tapped))
    }

    fn last_hidden(
        &self,
        tokens: &Array,
        cache: &mut ModelCache,
        tap: Option<usize>,
    ) -> MlxResult<LastHidden> {
        let (h, tapped) = self.blocks(tokens, cache, tap)?;
        Ok(LastHidden {
            normed: self.stack.norm.forward(&last_position(&h)?)?,
            tap: tapped.as_ref().map(last_position).transpose()?,
        })
    }

    fn logits(&self, hidden: &Array) -> MlxResult<Array> {
        let logits = self.stack.logits(hidden)?;
        match self.config.final_logit_softcapping {
            Some(cap) => {
                let t = ops::tanh(&ops::divide(&logits, &scalar(cap, &logits)?)?)?;
                scale(&t, cap)
            }
            None => Ok(logits),
        }
    }
}
