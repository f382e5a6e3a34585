//! Mixture-of-experts feed-forward blocks: `k` of `E` gated MLP experts per
//! token, as mlx-lm's `SwitchGLU` computes them. The experts' matrices are
//! stacked `[E, out, in]` (`{P}.gate_proj`, `{P}.up_proj`, `{P}.down_proj`).
//!
//! Quantized experts are multiplied by `gather_qmm`, as mlx-lm multiplies
//! them. Dense experts (the CPU default dequantizes at load; MLX's CPU
//! `gather_mm` takes float32 only) are multiplied expert by expert for the
//! rows routed to each, the product rounded to the activations' dtype, as
//! a bfloat16 kernel accumulating in float32 returns it.

use mlx_rs::{ops, Array, Dtype};

use super::layers;
use super::loader::{Quant, Weights};
use super::{MlxError, MlxResult};

/// The experts' stacked matrices `[E, out, in]` of one projection.
enum Experts {
    /// Dense; multiplied expert by expert for the rows routed to it.
    Dense(Array),
    /// Quantized; multiplied by `gather_qmm`.
    Quantized {
        weight: Array,
        scales: Array,
        biases: Array,
        quant: Quant,
    },
}

impl Experts {
    fn load(w: &Weights, name: &str) -> MlxResult<Self> {
        match w.quant(name) {
            Some(quant) if w.options.dequantize => {
                Ok(Experts::Dense(layers::dequantized(w, name, quant)?))
            }
            Some(quant) => Ok(Experts::Quantized {
                weight: w.take(&format!("{name}.weight"))?,
                scales: w.take(&format!("{name}.scales"))?,
                biases: w.take(&format!("{name}.biases"))?,
                quant,
            }),
            None => Ok(Experts::Dense(w.take(&format!("{name}.weight"))?)),
        }
    }

    /// `x` `[B, L, 1, 1, in]` through the experts `indices` `[B, L, k]`
    /// → `[B, L, k, 1, out]`.
    fn gather(&self, x: &Array, indices: &Array) -> MlxResult<Array> {
        match self {
            Experts::Quantized {
                weight,
                scales,
                biases,
                quant,
            } => Ok(ops::gather_qmm(
                x,
                weight,
                scales,
                biases,
                None,
                indices,
                true,
                quant.group_size,
                quant.bits,
                false,
            )?),
            Experts::Dense(_) => Err(MlxError::Config(
                "dense experts are multiplied by rows, not gathered".into(),
            )),
        }
    }

    /// `rows` `[n, in]` through expert `e` → `[n, out]`.
    fn rows(&self, rows: &Array, e: i32) -> MlxResult<Array> {
        match self {
            Experts::Dense(w) => {
                let we = ops::indexing::take_axis(w, Array::from_slice(&[e], &[1]), 0)?
                    .squeeze_axes(&[0])?;
                Ok(ops::matmul(rows, we.t())?.as_dtype(rows.dtype())?)
            }
            Experts::Quantized { .. } => Err(MlxError::Config(
                "quantized experts are gathered, not multiplied by rows".into(),
            )),
        }
    }
}

/// The activation of a gated expert: `act(gate, up)`.
pub type Activation = fn(&Array, &Array, bool) -> MlxResult<Array>;

/// `E` gated MLP experts, of which each token runs the `k` it is routed to.
pub struct SwitchGlu {
    gate_proj: Experts,
    up_proj: Experts,
    down_proj: Experts,
    activation: Activation,
    host_kernels: bool,
}

impl SwitchGlu {
    /// The experts under `prefix` (`{prefix}.gate_proj` and so on), with
    /// `activation(gate, up, host_kernels)` between the projections.
    pub fn load(w: &Weights, prefix: &str, activation: Activation) -> MlxResult<Self> {
        Ok(SwitchGlu {
            gate_proj: Experts::load(w, &format!("{prefix}.gate_proj"))?,
            up_proj: Experts::load(w, &format!("{prefix}.up_proj"))?,
            down_proj: Experts::load(w, &format!("{prefix}.down_proj"))?,
            activation,
            host_kernels: w.options.host_kernels,
        })
    }

    /// `x` `[B, L, D]` through the experts `inds` `[B, L, k]` →
    /// `[B, L, k, D]`, one output per routed expert.
    pub fn forward(&self, x: &Array, inds: &Array) -> MlxResult<Array> {
        match &self.gate_proj {
            Experts::Quantized { .. } => self.gathered(x, inds),
            Experts::Dense(_) => self.by_expert(x, inds),
        }
    }

    /// By `gather_qmm`, as mlx-lm runs quantized experts.
    fn gathered(&self, x: &Array, inds: &Array) -> MlxResult<Array> {
        let xe = x.expand_dims_axes(&[-2, -3])?;
        let up = self.up_proj.gather(&xe, inds)?;
        let gate = self.gate_proj.gather(&xe, inds)?;
        let h = (self.activation)(&gate, &up, self.host_kernels)?;
        Ok(self.down_proj.gather(&h, inds)?.squeeze_axes(&[-2])?)
    }

    /// With dense experts: the routing is read on the host, the rows routed
    /// to each expert are multiplied by its matrices, and the products are
    /// put back in (token, slot) order.
    fn by_expert(&self, x: &Array, inds: &Array) -> MlxResult<Array> {
        let sh = x.shape();
        let d = sh[sh.len() - 1];
        let k = inds.shape()[inds.ndim() - 1] as usize;
        let flat = ops::reshape(x, &[-1, d])?;
        let idx = inds.as_dtype(Dtype::Int32)?.contiguous()?;
        idx.eval()?;
        let routes = idx.as_slice::<i32>();
        // Pairs (expert, token * k + slot), grouped by expert.
        let mut order: Vec<(i32, usize)> = routes.iter().copied().zip(0..).collect();
        order.sort_unstable();
        let mut outputs = Vec::new();
        let mut placed = vec![0i32; order.len()];
        let mut start = 0;
        while start < order.len() {
            let e = order[start].0;
            let end = start + order[start..].iter().take_while(|p| p.0 == e).count();
            let tokens: Vec<i32> = order[start..end].iter().map(|p| (p.1 / k) as i32).collect();
            let rows = ops::indexing::take_axis(
                &flat,
                Array::from_slice(&tokens, &[tokens.len() as i32]),
                0,
            )?;
            let gate = self.gate_proj.rows(&rows, e)?;
            let up = self.up_proj.rows(&rows, e)?;
            let h = (self.activation)(&gate, &up, self.host_kernels)?;
            outputs.push(self.down_proj.rows(&h, e)?);
            for (i, p) in order[start..end].iter().enumerate() {
                placed[p.1] = (start + i) as i32;
            }
            start = end;
        }
        let refs: Vec<&Array> = outputs.iter().collect();
        let all = ops::concatenate(&refs, 0)?;
        let y =
            ops::indexing::take_axis(&all, Array::from_slice(&placed, &[placed.len() as i32]), 0)?;
        let mut shape = sh[..sh.len() - 1].to_vec();
        shape.extend([k as i32, d]);
        Ok(ops::reshape(&y, &shape)?)
    }
}
