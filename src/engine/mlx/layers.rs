//! The building blocks every architecture shares: linear layers (dense or
//! MLX-affine-quantized), embeddings that double as the output projection,
//! RMS norms, rotary embeddings (attention is `attention.rs`), the
//! gated MLP, the decoder stack every architecture runs (embedding, blocks,
//! final norm, logits), and the one rule for when decisio's host kernels
//! stand in for MLX's ops. Each layer is built from a [`Weights`] view by
//! its checkpoint name.

use mlx_rs::fast;
use mlx_rs::{nn, ops, Array, Dtype};

use super::cache::{LayerCache, ModelCache};
use super::host;
use super::loader::{Quant, Weights};
use super::profile::{self, Class};
use super::MlxResult;

/// When the host kernels ([`host`], [`super::delta::host`]) replace MLX's
/// ops, the one rule for every architecture: where
/// [`super::options::LoadOptions::host_kernels`] is on, and the kernel computes what
/// the ops it replaces compute.
///
/// - The softmax of attention, the SiLU gate, the RMS norm and the rope
///   of standard frequencies ([`HostKernels::apply`]):
///   only on float32 activations. The kernel rounds once, at the end; MLX
///   rounds after each op, and in bfloat16 that difference moves the logits
///   by a few 1e-3 through the layers (the tiny Qwen3.5 and Gemma 4
///   conversions against mlx-lm), so bfloat16 keeps MLX's ops.
/// - The gated delta rule ([`HostKernels::recurrence`]): on any input, as
///   both it and MLX's ops (and mlx-lm's Metal kernel) keep the state and
///   compute in float32.
///
/// No host kernel exists for GELU or for sliding-window attention: those
/// are MLX's on every device.
#[derive(Clone, Copy, Debug)]
pub struct HostKernels(bool);

impl HostKernels {
    pub fn of(w: &Weights) -> Self {
        HostKernels(w.options.host_kernels)
    }

    /// Whether an elementwise host kernel computes on activations like `x`.
    pub fn apply(self, x: &Array) -> bool {
        self.0 && x.dtype() == Dtype::Float32
    }

    /// Whether the host kernel of a float32 recurrence computes.
    pub fn recurrence(self) -> bool {
        self.0
    }
}

/// The last position of `x` (`[B, L, D]` → `[B, 1, D]`).
pub fn last_position(x: &Array) -> MlxResult<Array> {
    let l = x.shape()[1];
    profile::op(Class::Residuals, 0.0, || {
        Ok(ops::indexing::take_axis(
            x,
            Array::from_slice(&[l - 1], &[1]),
            1,
        )?)
    })
}

/// `x + y`: a residual connection.
pub fn residual(x: &Array, y: &Array) -> MlxResult<Array> {
    profile::op(Class::Residuals, profile::elements(y), || {
        Ok(ops::add(x, y)?)
    })
}

/// A scalar in the dtype of `like`, as a Python float meets an MLX array.
pub fn scalar(v: f32, like: &Array) -> MlxResult<Array> {
    Ok(Array::from_f32(v).as_dtype(like.dtype())?)
}

/// How a rope's frequencies follow from its base: the `rope_type` of a
/// config's rope settings, as mlx-lm's `initialize_rope` reads them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// `default`: frequencies `base^(-2i/dims)`.
    Default,
    /// `linear`: the default frequencies, positions divided by `factor`.
    Linear { factor: f32 },
    /// `proportional` (Gemma 4): the first `partial_rotary_factor` of the
    /// dimensions turn at frequencies `factor * base^(2i/dims)`, the rest
    /// not at all (infinite periods).
    Proportional {
        factor: f32,
        partial_rotary_factor: f32,
    },
}

impl RopeScaling {
    /// The scaling `rope_type` names, with the settings' `factor` and
    /// `partial_rotary_factor` (1 where absent); `None` for a type decisio
    /// does not implement.
    pub fn named(rope_type: &str, factor: Option<f32>, partial: Option<f32>) -> Option<Self> {
        let factor = factor.unwrap_or(1.0);
        match rope_type {
            "default" => Some(RopeScaling::Default),
            "linear" => Some(RopeScaling::Linear { factor }),
            "proportional" => Some(RopeScaling::Proportional {
                factor,
                partial_rotary_factor: partial.unwrap_or(1.0),
            }),
            _ => None,
        }
    }

    /// How many of a head's `dims` turn.
    pub fn rotated(self, dims: i32) -> i32 {
        match self {
            RopeScaling::Proportional {
                partial_rotary_factor,
                ..
            } => (dims as f32 * partial_rotary_factor) as i32,
            _ => dims,
        }
    }
}

/// A rotary position embedding over the first `dims` of each head
/// (`[B, H, L, D]`).
pub enum Rope {
    /// Frequencies `base^(-2i/dims)`, positions multiplied by `scale`.
    Standard {
        dims: i32,
        traditional: bool,
        base: f32,
        scale: f32,
    },
    /// Explicit frequencies, one per rotated pair.
    Freqs {
        dims: i32,
        traditional: bool,
        freqs: Array,
    },
}

impl Rope {
    /// The rope of every architecture, from its settings: `dims` of a head
    /// (all of it for a proportional rope, which turns a part), the base
    /// `theta`, the pairs' layout and the scaling. A proportional rope's
    /// rotated part must lie within `dims` ([`RopeScaling::rotated`]).
    pub fn new(dims: i32, base: f32, traditional: bool, scaling: RopeScaling) -> MlxResult<Self> {
        let standard = |scale| Rope::Standard {
            dims,
            traditional,
            base,
            scale,
        };
        Ok(match scaling {
            RopeScaling::Default => standard(1.0),
            RopeScaling::Linear { factor } => standard(1.0 / factor),
            RopeScaling::Proportional { factor, .. } => {
                let rotated = scaling.rotated(dims);
                let exponents = ops::divide(
                    &ops::arange::<_, f32>(0, rotated, 2)?,
                    Array::from_f32(dims as f32),
                )?;
                let powers = ops::power(Array::from_f32(base), &exponents)?;
                let rotating = ops::multiply(Array::from_f32(factor), &powers)?;
                let still =
                    ops::full::<f32>(&[(dims - rotated) / 2], &Array::from_f32(f32::INFINITY))?;
                let freqs = ops::concatenate(&[&rotating, &still], 0)?;
                freqs.eval()?;
                Rope::Freqs {
                    dims,
                    traditional,
                    freqs,
                }
            }
        })
    }

    /// `x` rotated for positions `offset..offset + L`.
    pub fn forward(&self, x: &Array, offset: usize) -> MlxResult<Array> {
        // About six operations per rotated element.
        profile::op(Class::Rope, 6.0 * profile::elements(x), || {
            self.apply(x, offset)
        })
    }

    /// Rows `[B, L, H, D]`, as a projection's output splits into heads,
    /// rotated for positions `offset..offset + L` and returned as
    /// `[B, H, L, D]`: by the host kernel where `host` applies to them (a
    /// rope of standard frequencies; [`host::rope`] takes its angles from
    /// this rope), else by MLX's rope after the transpose.
    pub fn forward_heads(&self, y: &Array, offset: usize, host: HostKernels) -> MlxResult<Array> {
        match self {
            Rope::Standard {
                dims,
                traditional,
                base,
                scale,
            } if host.apply(y) => profile::op(Class::Rope, 6.0 * profile::elements(y), || {
                let settings = (u64::from(base.to_bits()) << 32) | u64::from(scale.to_bits());
                host::rope(
                    y,
                    settings,
                    (*dims as usize, *traditional),
                    offset,
                    |u, at| self.apply(u, at),
                )
            }),
            _ => self.forward(&y.transpose_axes(&[0, 2, 1, 3])?, offset),
        }
    }

    fn apply(&self, x: &Array, offset: usize) -> MlxResult<Array> {
        Ok(match self {
            Rope::Standard {
                dims,
                traditional,
                base,
                scale,
            } => fast::rope(x, *dims, *traditional, *base, *scale, offset as i32, None)?,
            Rope::Freqs {
                dims,
                traditional,
                freqs,
            } => fast::rope(x, *dims, *traditional, None, 1.0, offset as i32, freqs)?,
        })
    }
}

/// The tanh approximation of GELU, in the order and dtype of MLX's
/// `nn.gelu_approx`: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
pub fn gelu_approx(x: &Array) -> MlxResult<Array> {
    let cube = ops::power(x, &scalar(3.0, x)?)?;
    let inner = ops::add(x, &ops::multiply(&scalar(0.044715, x)?, &cube)?)?;
    let c = (2.0f32 / std::f32::consts::PI).sqrt();
    let t = ops::tanh(&ops::multiply(&scalar(c, x)?, &inner)?)?;
    let half_x = ops::multiply(&scalar(0.5, x)?, x)?;
    Ok(ops::multiply(&half_x, &ops::add(&scalar(1.0, x)?, &t)?)?)
}

/// The gate of a gated MLP (and of its experts).
#[derive(Clone, Copy, Debug)]
pub enum Activation {
    /// `silu(gate) * up` (SwiGLU: llama, Qwen3.5).
    Silu,
    /// `gelu_approx(gate) * up` (GeGLU: Gemma 4).
    GeluApprox,
}

impl Activation {
    pub fn gate(self, gate: &Array, up: &Array, host: HostKernels) -> MlxResult<Array> {
        match self {
            Activation::Silu if host.apply(gate) => host::swiglu(gate, up),
            Activation::Silu => Ok(ops::multiply(&nn::silu(gate)?, up)?),
            Activation::GeluApprox => Ok(ops::multiply(&gelu_approx(gate)?, up)?),
        }
    }
}

/// `down_proj(act(gate_proj x) * up_proj x)`, every projection's output in
/// the type of `x`.
pub struct GatedMlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    activation: Activation,
    host: HostKernels,
}

impl GatedMlp {
    pub fn load(w: &Weights, p: &str, activation: Activation) -> MlxResult<Self> {
        Ok(GatedMlp {
            gate_proj: Linear::load(w, &format!("{p}.gate_proj"))?,
            up_proj: Linear::load(w, &format!("{p}.up_proj"))?,
            down_proj: Linear::load(w, &format!("{p}.down_proj"))?,
            activation,
            host: HostKernels::of(w),
        })
    }

    pub fn forward(&self, x: &Array) -> MlxResult<Array> {
        let gate = self.gate_proj.forward_as(x)?;
        let up = self.up_proj.forward_as(x)?;
        let h = profile::op(Class::Activations, 5.0 * profile::elements(&gate), || {
            self.activation.gate(&gate, &up, self.host)
        })?;
        self.down_proj.forward_as(&h)
    }
}

/// The dense matrix a quantized module stands for, evaluated once.
pub(super) fn dequantized(w: &Weights, name: &str, quant: Quant) -> MlxResult<Array> {
    let dense = ops::dequantize(
        w.take(&format!("{name}.weight"))?,
        w.take(&format!("{name}.scales"))?,
        &w.take(&format!("{name}.biases"))?,
        quant.group_size,
        quant.bits,
    )?;
    dense.eval()?;
    Ok(dense)
}

/// `x W^T` for a quantized `W`.
fn qmm(x: &Array, weight: &Array, scales: &Array, biases: &Array, q: Quant) -> MlxResult<Array> {
    Ok(ops::quantized_matmul(
        x,
        weight,
        scales,
        biases,
        true,
        q.group_size,
        q.bits,
    )?)
}

/// `y = x W^T (+ b)`, with `W` dense or quantized (`weight`, `scales`,
/// `biases` as MLX's affine quantization stores them).
pub enum Linear {
    Dense {
        weight: Array,
        bias: Option<Array>,
    },
    Quantized {
        weight: Array,
        scales: Array,
        biases: Array,
        quant: Quant,
        bias: Option<Array>,
    },
}

impl Linear {
    /// Loads the linear layer named `name` (`name.weight`, and for a
    /// quantized one `name.scales` and `name.biases`; `name.bias` if present).
    pub fn load(w: &Weights, name: &str) -> MlxResult<Self> {
        let bias = w.optional(&format!("{name}.bias"));
        match w.quant(name) {
            Some(quant) if w.options.dequantize => Ok(Linear::Dense {
                weight: dequantized(w, name, quant)?,
                bias,
            }),
            Some(quant) => Ok(Linear::Quantized {
                weight: w.take(&format!("{name}.weight"))?,
                scales: w.take(&format!("{name}.scales"))?,
                biases: w.take(&format!("{name}.biases"))?,
                quant,
                bias,
            }),
            None => Ok(Linear::Dense {
                weight: w.take(&format!("{name}.weight"))?,
                bias,
            }),
        }
    }

    /// `forward(x)` in the type of `x` (a float32-scaled quantized matrix
    /// would otherwise promote bfloat16 activations).
    pub fn forward_as(&self, x: &Array) -> MlxResult<Array> {
        let y = self.forward(x)?;
        if y.dtype() == x.dtype() {
            return Ok(y);
        }
        profile::op(Class::Residuals, 0.0, || Ok(y.as_dtype(x.dtype())?))
    }

    pub fn forward(&self, x: &Array) -> MlxResult<Array> {
        profile::product(x, self.outputs());
        profile::op(
            Class::Products,
            profile::product_flops(x, self.outputs()),
            || self.apply(x),
        )
    }

    /// Output features.
    fn outputs(&self) -> usize {
        match self {
            Linear::Dense { weight, .. } => weight.shape()[0] as usize,
            Linear::Quantized { scales, .. } => scales.shape()[0] as usize,
        }
    }

    fn apply(&self, x: &Array) -> MlxResult<Array> {
        let (y, bias) = match self {
            Linear::Dense { weight, bias } => (ops::matmul(x, weight.t())?, bias),
            Linear::Quantized {
                weight,
                scales,
                biases,
                quant,
                bias,
            } => (qmm(x, weight, scales, biases, *quant)?, bias),
        };
        Ok(match bias {
            Some(b) => ops::add(&y, b)?,
            None => y,
        })
    }
}

/// A token embedding table; with tied embeddings it is also the output
/// projection ([`Embedding::as_linear`]).
pub enum Embedding {
    Dense {
        weight: Array,
    },
    Quantized {
        weight: Array,
        scales: Array,
        biases: Array,
        quant: Quant,
    },
}

impl Embedding {
    pub fn load(w: &Weights, name: &str) -> MlxResult<Self> {
        match w.quant(name) {
            Some(quant) if w.options.dequantize => Ok(Embedding::Dense {
                weight: dequantized(w, name, quant)?,
            }),
            Some(quant) => Ok(Embedding::Quantized {
                weight: w.take(&format!("{name}.weight"))?,
                scales: w.take(&format!("{name}.scales"))?,
                biases: w.take(&format!("{name}.biases"))?,
                quant,
            }),
            None => Ok(Embedding::Dense {
                weight: w.take(&format!("{name}.weight"))?,
            }),
        }
    }

    /// Rows of the table for the token ids `ids` (any shape).
    pub fn forward(&self, ids: &Array) -> MlxResult<Array> {
        profile::op(Class::Embedding, 0.0, || self.gather(ids))
    }

    fn gather(&self, ids: &Array) -> MlxResult<Array> {
        match self {
            Embedding::Dense { weight } => Ok(ops::indexing::take_axis(weight, ids, 0)?),
            Embedding::Quantized {
                weight,
                scales,
                biases,
                quant,
            } => {
                let w = ops::indexing::take_axis(weight, ids, 0)?;
                let s = ops::indexing::take_axis(scales, ids, 0)?;
                let b = ops::indexing::take_axis(biases, ids, 0)?;
                Ok(ops::dequantize(&w, &s, &b, quant.group_size, quant.bits)?)
            }
        }
    }

    /// `x E^T`: the logits over the vocabulary for hidden states `x`.
    pub fn as_linear(&self, x: &Array) -> MlxResult<Array> {
        let n = match self {
            Embedding::Dense { weight } => weight.shape()[0],
            Embedding::Quantized { scales, .. } => scales.shape()[0],
        } as usize;
        profile::product(x, n);
        profile::op(Class::Products, profile::product_flops(x, n), || {
            self.project(x)
        })
    }

    fn project(&self, x: &Array) -> MlxResult<Array> {
        match self {
            Embedding::Dense { weight } => Ok(ops::matmul(x, weight.t())?),
            Embedding::Quantized {
                weight,
                scales,
                biases,
                quant,
            } => qmm(x, weight, scales, biases, *quant),
        }
    }
}

/// Root-mean-square layer norm with a learned scale.
pub struct RmsNorm {
    pub weight: Array,
    pub eps: f32,
    host: HostKernels,
}

impl RmsNorm {
    pub fn load(w: &Weights, name: &str, eps: f32) -> MlxResult<Self> {
        Ok(RmsNorm {
            weight: w.take(&format!("{name}.weight"))?,
            eps,
            host: HostKernels::of(w),
        })
    }

    pub fn forward(&self, x: &Array) -> MlxResult<Array> {
        profile::op(Class::Norms, 4.0 * profile::elements(x), || {
            if self.host.apply(x) {
                return host::rms_norm(x, &self.weight, self.eps);
            }
            Ok(fast::rms_norm(x, Some(&self.weight), self.eps)?)
        })
    }
}

/// The last position's hidden states.
pub struct LastHidden {
    /// After the final norm, `[1, 1, D]`.
    pub normed: Array,
    /// The output of the tapped block, `[1, 1, D]`, when one was asked for.
    pub tap: Option<Array>,
}

/// Runs decoder blocks over `h`: `block(i, item, h)` for each of `items`
/// (a block and what it reads, such as its cache), in order. Returns the
/// last block's output and, when `tap` names a block, that block's output
/// at every position.
pub fn run_blocks<T>(
    items: impl IntoIterator<Item = T>,
    mut h: Array,
    tap: Option<usize>,
    mut block: impl FnMut(usize, T, &Array) -> MlxResult<Array>,
) -> MlxResult<(Array, Option<Array>)> {
    let mut tapped = None;
    for (i, item) in items.into_iter().enumerate() {
        h = block(i, item, &h)?;
        if tap == Some(i) {
            tapped = Some(h.clone());
        }
    }
    Ok((h, tapped))
}

/// A decoder block that reads and extends its layer's cache.
pub trait Block {
    /// The block's output at every position of `x` (`[B, L, D]`).
    fn forward(&self, x: &Array, cache: &mut LayerCache) -> MlxResult<Array>;
    /// The block's output at the last position of `x` only; its cache still
    /// gains every position.
    fn forward_last(&self, x: &Array, cache: &mut LayerCache) -> MlxResult<Array>;
}

/// A decoder stack: the token embedding, the blocks, the final norm, and
/// the logits through `lm_head` or, with tied embeddings, through the
/// embedding table itself.
pub struct DecoderStack<B> {
    pub embed_tokens: Embedding,
    pub layers: Vec<B>,
    pub norm: RmsNorm,
    lm_head: Option<Linear>,
    /// Untied logits in the hidden states' type ([`Linear::forward_as`]).
    head_keeps_type: bool,
}

impl<B> DecoderStack<B> {
    /// `layers` between `{model}.embed_tokens` and `{model}.norm`, with the
    /// output projection `lm_head` unless `tied` (a tied checkpoint's
    /// `{lm_head}.weight`, if any, is dropped).
    pub fn load(
        w: &Weights,
        layers: Vec<B>,
        model: &str,
        lm_head: &str,
        tied: bool,
        eps: f32,
    ) -> MlxResult<Self> {
        let embed_tokens = Embedding::load(w, &format!("{model}.embed_tokens"))?;
        let lm_head = if tied {
            w.optional(&format!("{lm_head}.weight"));
            None
        } else {
            Some(Linear::load(w, lm_head)?)
        };
        let norm = RmsNorm::load(w, &format!("{model}.norm"), eps)?;
        Ok(DecoderStack {
            embed_tokens,
            layers,
            norm,
            lm_head,
            head_keeps_type: false,
        })
    }

    /// Untied logits in the hidden states' type, as every projection of a
    /// model whose layers all keep it.
    pub fn head_keeping_type(self) -> Self {
        DecoderStack {
            head_keeps_type: true,
            ..self
        }
    }

    /// Logits over the vocabulary for final hidden states.
    pub fn logits(&self, hidden: &Array) -> MlxResult<Array> {
        match &self.lm_head {
            Some(head) if self.head_keeps_type => head.forward_as(hidden),
            Some(head) => head.forward(hidden),
            None => self.embed_tokens.as_linear(hidden),
        }
    }
}

impl<B: Block> DecoderStack<B> {
    /// Runs `tokens` (`[B, L]`), extending every layer's cache; the final
    /// hidden states of every position, and block `tap`'s output at every
    /// position.
    pub fn hidden(
        &self,
        tokens: &Array,
        cache: &mut ModelCache,
        tap: Option<usize>,
    ) -> MlxResult<(Array, Option<Array>)> {
        let h = self.embed_tokens.forward(tokens)?;
        let layers = self.layers.iter().zip(cache.layers.iter_mut());
        let (h, tapped) = run_blocks(layers, h, tap, |_, (layer, c), h| layer.forward(h, c))?;
        Ok((self.norm.forward(&h)?, tapped))
    }

    /// The final hidden state of the last position, and block `tap`'s
    /// output there. The last block computes its output at the last
    /// position alone, since nothing reads it elsewhere; every block's
    /// cache still gains every position.
    pub fn last_hidden(
        &self,
        tokens: &Array,
        cache: &mut ModelCache,
        tap: Option<usize>,
    ) -> MlxResult<LastHidden> {
        let h = self.embed_tokens.forward(tokens)?;
        let last = self.layers.len() - 1;
        let layers = self.layers.iter().zip(cache.layers.iter_mut());
        let (h, tapped) = run_blocks(layers, h, tap, |i, (layer, c), h| {
            if i == last {
                layer.forward_last(h, c)
            } else {
                layer.forward(h, c)
            }
        })?;
        Ok(LastHidden {
            normed: self.norm.forward(&h)?,
            tap: tapped.as_ref().map(last_position).transpose()?,
        })
    }
}
