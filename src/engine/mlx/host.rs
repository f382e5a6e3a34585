//! Host kernels for the two steps MLX's CPU build runs slowly: the softmax of
//! attention and the SiLU gate of the MLP.
//!
//! MLX's CPU backend computes `exp` one element at a time: over the attention
//! scores of one layer it costs tens of times a multiply of the same size and
//! several times the two matrix products around it
//! (runs/2026-11-30_host-kernels has the figures). So on the CPU, the scores are computed by
//! MLX (OpenBLAS), evaluated, and turned into probabilities here, with an
//! `exp` the compiler vectorises; the products stay
//! in MLX. On Metal none of this is used.
//!
//! The kernels run on the engine thread (a second thread per call cost more
//! than it saved at these sizes, with OpenBLAS's own threads on the cores)
//! and compute every row by the same code, independently of the others, so
//! a prompt gives the same bits however many rows share a call.

use mlx_rs::{ops, Array, Dtype};

use super::profile::{self, Class};
use super::MlxResult;

/// `exp(x)` within about 2 ulp for `x` in the float range, written without
/// branches so that loops over slices vectorise: `x = n ln 2 + r`,
/// `|r| <= ln 2 / 2`, `exp(r)` by a degree-6 polynomial, `2^n` by the
/// exponent bits. Below -87.3 it is 0 (denormals are not produced); above
/// 88 it saturates at `exp(88)`.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in a part exact in a float and the rest.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5 * 2^23 rounds to the nearest integer in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let x_clamped = x.clamp(-87.3, 88.0);
    let shifted = x_clamped * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = x_clamped - n * LN2_HI - n * LN2_LO;
    // Minimax coefficients of (exp(r) - 1 - r) / r^2 on [-ln2/2, ln2/2].
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let er = p * r * r + r + 1.0;
    let k = (shifted.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let scale = f32::from_bits(((k + 127) << 23) as u32);
    if x < -87.3 {
        0.0
    } else {
        er * scale
    }
}

/// Lanes of the reductions: sums and maxima keep this many partial results
/// in a fixed order, so they vectorise and stay deterministic.
const LANES: usize = 8;

#[inline(always)]
fn max(xs: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = a.max(x);
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |a, &x| a.max(x));
    acc.iter().fold(tail, |a, &x| a.max(x))
}

/// Writes `exp(x - m)` into `out` and returns its sum.
#[inline(always)]
fn exp_shifted(xs: &[f32], m: f32, out: &mut [f32]) -> f32 {
    for (o, &x) in out.iter_mut().zip(xs) {
        *o = exp(x - m);
    }
    let mut acc = [0.0f32; LANES];
    let mut chunks = out.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    let tail: f32 = chunks.remainder().iter().sum();
    acc.iter().sum::<f32>() + tail
}

/// Softmax of one row whose first `valid` entries take part; the rest get 0.
#[inline(always)]
fn softmax_row_body(xs: &[f32], valid: usize, out: &mut [f32]) {
    let (live, masked) = out.split_at_mut(valid);
    let m = max(&xs[..valid]);
    let sum = exp_shifted(&xs[..valid], m, live);
    let inv = 1.0 / sum;
    for o in live.iter_mut() {
        *o *= inv;
    }
    masked.fill(0.0);
}

/// `silu(g) * u` into `out`.
#[inline(always)]
fn swiglu_body(g: &[f32], u: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
        *o = g / (1.0 + exp(-g)) * u;
    }
}

/// The loops above compiled for the widest vectors the processor has: the
/// same code and order of operations, so a machine always gives the same
/// bits, only more lanes at a time (the build's baseline is SSE2).
#[cfg(target_arch = "x86_64")]
mod wide {
    #[target_feature(enable = "avx512f")]
    pub unsafe fn softmax_row_avx512(xs: &[f32], valid: usize, out: &mut [f32]) {
        super::softmax_row_body(xs, valid, out)
    }

    #[target_feature(enable = "avx2")]
    pub unsafe fn softmax_row_avx2(xs: &[f32], valid: usize, out: &mut [f32]) {
        super::softmax_row_body(xs, valid, out)
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn swiglu_avx512(g: &[f32], u: &[f32], out: &mut [f32]) {
        super::swiglu_body(g, u, out)
    }

    #[target_feature(enable = "avx2")]
    pub unsafe fn swiglu_avx2(g: &[f32], u: &[f32], out: &mut [f32]) {
        super::swiglu_body(g, u, out)
    }
}

fn softmax_row(xs: &[f32], valid: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: each is called only where the processor has the feature.
        if is_x86_feature_detected!("avx512f") {
            return unsafe { wide::softmax_row_avx512(xs, valid, out) };
        }
        if is_x86_feature_detected!("avx2") {
            return unsafe { wide::softmax_row_avx2(xs, valid, out) };
        }
    }
    softmax_row_body(xs, valid, out)
}

fn swiglu_rows(g: &[f32], u: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: as in `softmax_row`.
        if is_x86_feature_detected!("avx512f") {
            return unsafe { wide::swiglu_avx512(g, u, out) };
        }
        if is_x86_feature_detected!("avx2") {
            return unsafe { wide::swiglu_avx2(g, u, out) };
        }
    }
    swiglu_body(g, u, out)
}

/// Fills a scratch buffer of `len` floats with `fill` and returns an MLX
/// array of `shape` copied from it. The buffer is kept per thread and
/// reused, so the pages are not faulted in anew for every layer.
fn with_scratch(len: usize, shape: &[i32], fill: impl FnOnce(&mut [f32])) -> Array {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SCRATCH.with(|cell| {
        let mut buf = cell.borrow_mut();
        buf.resize(len, 0.0);
        fill(&mut buf[..len]);
        Array::from_slice(&buf[..len], shape)
    })
}

/// The array in float32 and row-major order, evaluated, so that its
/// elements can be borrowed with [`Array::as_slice`].
fn host_f32(a: &Array) -> MlxResult<Array> {
    let a = if a.dtype() == Dtype::Float32 {
        a.clone()
    } else {
        a.as_type::<f32>()?
    };
    // A product or an element-wise result is row-major already (then this
    // shares the buffer); any other input is copied into that order.
    let a = a.contiguous()?;
    a.eval()?;
    Ok(a)
}

/// Scaled dot-product attention, `softmax(q k^T * scale) v`, the products
/// in MLX and the softmax here.
///
/// `q` is `[B, H, L, D]`, `k` and `v` are `[B, KVH, T, D]` with `H` a
/// multiple of `KVH` (grouped-query attention). With `causal`, query `i`
/// sees the keys up to `T - L + i` (the queries are the last `L` positions).
/// The order of operations is MLX's own for this operation on the CPU
/// (scale the queries, multiply, mask, softmax in float32, multiply).
pub fn attention(q: &Array, k: &Array, v: &Array, scale: f32, causal: bool) -> MlxResult<Array> {
    let (b, h, l, d) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let (kvh, t) = (k.shape()[1], k.shape()[2]);
    let groups = h / kvh;
    let product = 2.0
        * [b, h, l, t, d]
            .iter()
            .map(|&n| f64::from(n))
            .product::<f64>();
    let (batch, rows) = ((b * kvh) as usize, (groups * l) as usize);
    let (t_, d_) = (t as usize, d as usize);
    for (k_, n_, transposed) in [(d_, t_, true), (t_, d_, false)] {
        profile::shape(profile::Shape {
            linear: false,
            transposed,
            batch,
            m: rows,
            k: k_,
            n: n_,
        });
    }
    let q = ops::multiply(q, &Array::from_f32(scale).as_dtype(q.dtype())?)?;
    let q = ops::reshape(&q, &[b, kvh, groups * l, d])?;
    let scores = profile::op(Class::AttentionProducts, product, || {
        Ok(ops::matmul(&q, &k.transpose_axes(&[0, 1, 3, 2])?)?)
    })?;
    let scores = host_f32(&scores)?;
    let xs = scores.as_slice::<f32>();
    let (l, t) = (l as usize, t as usize);
    let probs = profile::host(Class::Softmax, 5.0 * xs.len() as f64, || {
        with_scratch(xs.len(), scores.shape(), |out| {
            for (r, row) in out.chunks_exact_mut(t).enumerate() {
                let valid = if causal { t - l + r % l + 1 } else { t };
                softmax_row(&xs[r * t..(r + 1) * t], valid, row);
            }
        })
        .as_dtype(v.dtype())
    })?;
    let out = profile::op(Class::AttentionProducts, product, || {
        Ok(ops::matmul(&probs, v)?)
    })?;
    Ok(ops::reshape(&out, &[b, h, l as i32, d])?)
}

/// `silu(gate) * up`, element-wise, for two arrays of one shape.
pub fn swiglu(gate: &Array, up: &Array) -> MlxResult<Array> {
    let (g, u) = (host_f32(gate)?, host_f32(up)?);
    let (g, u) = (g.as_slice::<f32>(), u.as_slice::<f32>());
    let out = with_scratch(g.len(), gate.shape(), |out| swiglu_rows(g, u, out));
    Ok(out.as_dtype(gate.dtype())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulp_of_std() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (exp(x), x.exp());
            let ulp = (got.to_bits() as i64 - want.to_bits() as i64).abs();
            assert!(ulp <= 2, "exp({x}) = {got}, std gives {want}");
            x += 0.0137;
        }
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert!(exp(100.0).is_finite());
    }

    #[test]
    fn softmax_row_masks_and_sums_to_one() {
        let xs = [1.0, 2.0, 3.0, 100.0];
        let mut out = [9.0; 4];
        softmax_row(&xs, 3, &mut out);
        assert_eq!(out[3], 0.0);
        let e: Vec<f64> = (1..=3).map(|i| (i as f64 - 3.0).exp()).collect();
        let s: f64 = e.iter().sum();
        for i in 0..3 {
            assert!((out[i] as f64 - e[i] / s).abs() < 1e-7);
        }
    }

    #[test]
    fn wide_loops_give_the_baseline_bits() {
        let xs: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 1000) as f32 / 37.0 - 13.0)
            .collect();
        let (mut wide, mut base) = (vec![0.0; 1000], vec![0.0; 1000]);
        softmax_row(&xs, 997, &mut wide);
        softmax_row_body(&xs, 997, &mut base);
        assert_eq!(wide, base);
        swiglu_rows(&xs, &xs[1..], &mut wide[..999]);
        swiglu_body(&xs, &xs[1..], &mut base[..999]);
        assert_eq!(wide, base);
    }

    #[test]
    fn scratch_arrays_are_independent_copies() {
        let a = with_scratch(4, &[2, 2], |b| b.copy_from_slice(&[1.0, 2.0, 3.0, 4.0]));
        let b = with_scratch(2, &[2], |b| b.copy_from_slice(&[7.0, 8.0]));
        assert_eq!(a.as_slice::<f32>(), &[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(b.as_slice::<f32>(), &[7.0, 8.0]);
    }
}
