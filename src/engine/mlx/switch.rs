//! Mixture-of-experts feed-forward blocks: `k` of `E` gated MLP experts per
//! token, as mlx-lm's `SwitchGLU` computes them. The experts' matrices are
//! stacked `[E, out, in]` (`{P}.gate_proj`, `{P}.up_proj`, `{P}.down_proj`).
//!
//! Quantized experts are multiplied by `gather_qmm`, as mlx-lm multiplies
//! them. From [`SORT_EXPERTS_FROM`] token-expert pairs on, the pairs are
//! sorted by expert first (and the outputs put back in order after): MLX
//! runs its batched kernel (on Metal, one pass over each expert's weights
//! for all its rows) only for sorted pairs. Dense experts (the CPU default dequantizes at load; MLX's CPU
//! `gather_mm` takes float32 only) are multiplied expert by expert for the
//! rows routed to each, the product rounded to the activations' dtype, as
//! a bfloat16 kernel accumulating in float32 returns it.

use mlx_rs::{ops, Array, Dtype};

use super::layers::{self, Activation, HostKernels};
use super::loader::{Quant, Weights};
use super::{MlxError, MlxResult};

pub use super::options::SORT_EXPERTS_FROM;

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
    /// → `[B, L, k, 1, out]`; or, `sorted`, `x` `[N, 1, in]` through
    /// `indices` `[N]` in ascending order → `[N, 1, out]`.
    fn gather(&self, x: &Array, indices: &Array, sorted: bool) -> MlxResult<Array> {
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
                sorted,
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

/// `E` gated MLP experts, of which each token runs the `k` it is routed to.
pub struct SwitchGlu {
    gate_proj: Experts,
    up_proj: Experts,
    down_proj: Experts,
    activation: Activation,
    host: HostKernels,
    sort_from: usize,
}

impl SwitchGlu {
    /// The experts under `prefix` (`{prefix}.gate_proj` and so on), with
    /// `activation` gating between the projections.
    pub fn load(w: &Weights, prefix: &str, activation: Activation) -> MlxResult<Self> {
        Ok(SwitchGlu {
            gate_proj: Experts::load(w, &format!("{prefix}.gate_proj"))?,
            up_proj: Experts::load(w, &format!("{prefix}.up_proj"))?,
            down_proj: Experts::load(w, &format!("{prefix}.down_proj"))?,
            activation,
            host: HostKernels::of(w),
            sort_from: w.options.sort_experts_from,
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

    /// By `gather_qmm`, as mlx-lm runs quantized experts: the pairs in
    /// token order, or sorted by expert from `sort_from` pairs on.
    fn gathered(&self, x: &Array, inds: &Array) -> MlxResult<Array> {
        if inds.size() >= self.sort_from {
            return self.gathered_sorted(x, inds);
        }
        let xe = x.expand_dims_axes(&[-2, -3])?;
        let up = self.up_proj.gather(&xe, inds, false)?;
        let gate = self.gate_proj.gather(&xe, inds, false)?;
        let h = self.activation.gate(&gate, &up, self.host)?;
        Ok(self
            .down_proj
            .gather(&h, inds, false)?
            .squeeze_axes(&[-2])?)
    }

    /// The pairs sorted by expert (on the device: four MLX ops whatever the
    /// number of tokens), each pair's row of `x` taken in that order, the
    /// products gathered as sorted, and the outputs put back in (token,
    /// slot) order by the inverse permutation.
    fn gathered_sorted(&self, x: &Array, inds: &Array) -> MlxResult<Array> {
        let sh = x.shape();
        let d = sh[sh.len() - 1];
        let k = inds.shape()[inds.ndim() - 1];
        let pairs = ops::flatten(inds, None, None)?;
        let order = ops::argsort_axis(&pairs, 0)?;
        let back = ops::argsort_axis(&order, 0)?;
        // Each pair's token (argsort's indices are uint32; so is `k` here).
        let token = ops::floor_divide(&order, Array::from_slice(&[k as u32], &[]))?;
        let rows = ops::indexing::take_axis(ops::reshape(x, &[-1, d])?, &token, 0)?
            .expand_dims_axes(&[-2])?;
        let experts = ops::indexing::take_axis(&pairs, &order, 0)?;
        let up = self.up_proj.gather(&rows, &experts, true)?;
        let gate = self.gate_proj.gather(&rows, &experts, true)?;
        let h = self.activation.gate(&gate, &up, self.host)?;
        let y = self
            .down_proj
            .gather(&h, &experts, true)?
            .squeeze_axes(&[-2])?;
        let y = ops::indexing::take_axis(&y, &back, 0)?;
        let mut shape = sh[..sh.len() - 1].to_vec();
        shape.extend([k, d]);
        Ok(ops::reshape(&y, &shape)?)
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
            let h = self.activation.gate(&gate, &up, self.host)?;
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
