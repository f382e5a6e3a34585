//! The building blocks every architecture shares: linear layers (dense or
//! MLX-affine-quantized), embeddings that double as the output projection,
//! RMS norms. Each is built from a [`Weights`] view by its checkpoint name.

use mlx_rs::{fast, ops, Array};

use super::loader::{Quant, Weights};
use super::MlxResult;

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

    pub fn forward(&self, x: &Array) -> MlxResult<Array> {
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
}

impl RmsNorm {
    pub fn load(w: &Weights, name: &str, eps: f32) -> MlxResult<Self> {
        Ok(RmsNorm {
            weight: w.take(&format!("{name}.weight"))?,
            eps,
        })
    }

    pub fn forward(&self, x: &Array) -> MlxResult<Array> {
        Ok(fast::rms_norm(x, Some(&self.weight), self.eps)?)
    }
}
