//! Host kernels for the steps MLX's CPU build runs slowly: the softmax of
//! attention and the SiLU gate of the MLP here, attention's products and
//! their tiles around that softmax in `attention.rs` ([`attention`],
//! [`split_attention`]), the RMS norm and the rotary embedding in `rows.rs`
//! ([`rms_norm`], [`rope`]).
//!
//! MLX's CPU backend computes `exp` one element at a time: over the attention
//! scores of one layer it costs tens of times a multiply of the same size and
//! several times the two matrix products around it
//! (runs/2026-11-30_host-kernels has the figures). So on the CPU, the scores
//! are computed by the BLAS MLX calls (OpenBLAS) and turned into
//! probabilities here, with an `exp` the compiler vectorises. On Metal none
//! of this is used.
//!
//! The kernels run on the engine thread (a second thread per call cost more
//! than it saved at these sizes, with OpenBLAS's own threads on the cores)
//! and compute every row by the same code, independently of the others, so
//! a prompt gives the same bits however many rows share a call.

use mlx_rs::{Array, Dtype};

mod attention;
mod blas_core;
mod rows;
mod workers;
pub use attention::{attention, blas_product, split_attention, MAX_INNER};
pub use blas_core::choose_blas_core;
pub use rows::{rms_norm, rope};

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

/// Replaces each `x` by `exp(x - m)` and returns their sum.
#[inline(always)]
fn exp_shifted(xs: &mut [f32], m: f32) -> f32 {
    for x in xs.iter_mut() {
        *x = exp(*x - m);
    }
    let mut acc = [0.0f32; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    let tail: f32 = chunks.remainder().iter().sum();
    acc.iter().sum::<f32>() + tail
}

/// Softmax of one row, in place, over its first `valid` entries; the rest
/// become 0.
#[inline(always)]
fn softmax_row_body(row: &mut [f32], valid: usize) {
    let (live, masked) = row.split_at_mut(valid);
    let m = max(live);
    let inv = 1.0 / exp_shifted(live, m);
    for x in live.iter_mut() {
        *x *= inv;
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

/// `fn $name(args)` running the loop `$body(args)` compiled for the widest
/// vectors the processor has (AVX-512, else AVX2, else the build's
/// baseline, SSE2): the same code and order of operations, so a machine
/// always gives the same bits, only more lanes at a time. Each host loop of
/// this module and of [`rows`] is dispatched by it.
macro_rules! widest {
    ($(#[$meta:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) => $body:path) => {
        $(#[$meta])*
        fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                unsafe fn avx512($($arg: $ty),*) {
                    $body($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                unsafe fn avx2($($arg: $ty),*) {
                    $body($($arg),*)
                }
                // SAFETY: each is called only where the processor has the
                // feature it is compiled for.
                if is_x86_feature_detected!("avx512f") {
                    return unsafe { avx512($($arg),*) };
                }
                if is_x86_feature_detected!("avx2") {
                    return unsafe { avx2($($arg),*) };
                }
            }
            $body($($arg),*)
        }
    };
}
use widest;

widest!(fn softmax_row_in_place(row: &mut [f32], valid: usize) => softmax_row_body);
widest!(fn swiglu_rows(g: &[f32], u: &[f32], out: &mut [f32]) => swiglu_body);

/// The address of the function `name` in the process (the BLAS MLX's
/// products call is found by name this way), `None` where none is loaded.
fn symbol(name: &std::ffi::CStr) -> Option<*mut libc::c_void> {
    // SAFETY: dlsym with a NUL-terminated name only looks the symbol up.
    let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!sym.is_null()).then_some(sym)
}

thread_local! {
    /// [`with_buffers`]' two buffers.
    static BUFFERS: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// The most bytes [`trim_buffers`] leaves in each of a thread's two kept
/// buffers. On float32 the scores are held a tile at a time (at most
/// `TILE_SCORES` of them, or 16 rows on a state over 16,384 tokens) and
/// the outputs a pass's rows times the head size (3 MB for ~17 questions
/// of 80 tokens on the fixture); a state read in another type holds a
/// chunk's whole scores (55 MB for 512 tokens over 3,000 with 9 heads).
/// Larger requests grow them while they run.
pub const KEPT_BUFFER_BYTES: usize = 64 << 20;

/// Runs `f` on two buffers of `a` and `b` floats this thread keeps between
/// calls (their contents are whatever the last call left), so the pages
/// are not faulted in anew for every layer.
fn with_buffers<T>(a: usize, b: usize, f: impl FnOnce(&mut [f32], &mut [f32]) -> T) -> T {
    BUFFERS.with(|cell| {
        let (x, y) = &mut *cell.borrow_mut();
        x.resize(x.len().max(a), 0.0);
        y.resize(y.len().max(b), 0.0);
        f(&mut x[..a], &mut y[..b])
    })
}

/// Frees this thread's kept buffers that a large request grew beyond
/// [`KEPT_BUFFER_BYTES`] (the engine thread calls it when its queue is
/// empty), so that memory returns after the request; returns the bytes
/// freed.
pub fn trim_buffers() -> usize {
    let most = KEPT_BUFFER_BYTES / std::mem::size_of::<f32>();
    BUFFERS.with(|cell| {
        let (x, y) = &mut *cell.borrow_mut();
        let mut freed = 0;
        for buf in [x, y] {
            if buf.capacity() > most {
                freed += buf.capacity() * std::mem::size_of::<f32>();
                *buf = Vec::new();
            }
        }
        freed
    })
}

/// Fills a kept buffer of `len` floats with `fill` and returns an MLX array
/// of `shape` copied from it.
fn with_scratch(len: usize, shape: &[i32], fill: impl FnOnce(&mut [f32])) -> Array {
    with_buffers(len, 0, |buf, _| {
        fill(buf);
        Array::from_slice(buf, shape)
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
        let mut out = [1.0, 2.0, 3.0, 100.0];
        softmax_row_in_place(&mut out, 3);
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
        let (mut wide, mut base) = (xs.clone(), xs.clone());
        softmax_row_in_place(&mut wide, 997);
        softmax_row_body(&mut base, 997);
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
