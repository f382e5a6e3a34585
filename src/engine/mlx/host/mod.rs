//! Host kernels for the steps MLX's CPU build runs slowly: the softmax of
//! attention and the SiLU gate of the MLP here, the RMS norm and the rotary
//! embedding in `rows.rs` ([`rms_norm`], [`rope`]).
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

mod rows;
pub use rows::{rms_norm, rope};

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

thread_local! {
    /// [`with_buffers`]' two buffers.
    static BUFFERS: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// The most bytes [`trim_buffers`] leaves in each of a thread's two kept
/// buffers: a pass of ~17 questions of 80 tokens on a 3,000-token state
/// (the fixture's 9 heads) needs 151 MB for its scores, a 512-token chunk
/// of a new state 55 MB; larger requests grow them while they run.
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

/// The CBLAS single-precision product, `C = alpha op(A) op(B) + beta C`,
/// row-major (the signature of `cblas_sgemm`).
type Sgemm = unsafe extern "C" fn(
    layout: i32,
    trans_a: i32,
    trans_b: i32,
    m: i32,
    n: i32,
    k: i32,
    alpha: f32,
    a: *const f32,
    lda: i32,
    b: *const f32,
    ldb: i32,
    beta: f32,
    c: *mut f32,
    ldc: i32,
) -> ();

const ROW_MAJOR: i32 = 101;
const NO_TRANS: i32 = 111;
const TRANS: i32 = 112;

/// The most keys one product of a question pass's attention weights by its
/// values sums over, in [`split_attention`] here and in MLX's
/// (`super::attention`): longer key ranges are summed in blocks of this
/// many, at the same key boundaries whatever the pass. OpenBLAS's threaded
/// `sgemm` splits a longer inner dimension in a way that depends on the
/// product's other sides, so on how many questions a pass holds and on its
/// longest row: measured on the hybrid Qwen's tiny conversion, a question
/// on a 700-token state read alone and beside three others differed in its
/// probabilities' low bits with OpenBLAS's threads on, and agreed with
/// `OPENBLAS_NUM_THREADS=1` or with these blocks. A row's padding keys
/// (weight exactly 0) then only add zeros.
pub const MAX_INNER: usize = 128;

/// The `cblas_sgemm` MLX's own products call, found in the process at the
/// first use: the BLAS linked ahead of MLX (OpenBLAS, scripts/mlx-linux) or
/// the one MLX brought. `None` where no such symbol is loaded; attention
/// then keeps its products in MLX.
fn sgemm() -> Option<Sgemm> {
    static SGEMM: std::sync::OnceLock<Option<Sgemm>> = std::sync::OnceLock::new();
    *SGEMM.get_or_init(|| {
        // SAFETY: dlsym with a NUL-terminated name only looks the symbol up.
        let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"cblas_sgemm".as_ptr()) };
        // SAFETY: a loaded `cblas_sgemm` has the CBLAS signature above.
        (!sym.is_null()).then(|| unsafe { std::mem::transmute::<*mut libc::c_void, Sgemm>(sym) })
    })
}

/// `out[i] = a[i] · op(b[i])` for each of `batch` row-major matrices:
/// `a[i]` is `m × k`, `b[i]` is `k × n` (or `n × k` with `b_transposed`),
/// `out[i]` is `m × n`: one `cblas_sgemm` per matrix, called as MLX calls
/// it for the same product, so the bits are MLX's.
#[allow(clippy::too_many_arguments)]
fn batched_product(
    sgemm: Sgemm,
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
    batch: usize,
    (m, k, n): (usize, usize, usize),
    b_transposed: bool,
) {
    assert!(a.len() >= batch * m * k && b.len() >= batch * k * n && out.len() >= batch * m * n);
    let int = |x: usize| i32::try_from(x).expect("a product's side fits in an i32");
    let ldb = if b_transposed { k } else { n };
    for i in 0..batch {
        // SAFETY: the slices hold every element the call reads and writes
        // (asserted above), with the leading dimensions given.
        unsafe {
            sgemm(
                ROW_MAJOR,
                NO_TRANS,
                if b_transposed { TRANS } else { NO_TRANS },
                int(m),
                int(n),
                int(k),
                1.0,
                a.as_ptr().add(i * m * k),
                int(k),
                b.as_ptr().add(i * k * n),
                int(ldb),
                0.0,
                out.as_mut_ptr().add(i * m * n),
                int(n),
            )
        }
    }
}

/// One of attention's products as [`attention`] computes it on float32:
/// `out[i] = a[i] · op(b[i])` for `batch` row-major matrices (`m × k` by
/// `k × n`, or `n × k` with `b_transposed`) through the process's
/// `cblas_sgemm`. `false`, with `out` untouched, where none is loaded. For
/// timing these products alone (`examples/cpu_profile.rs`).
pub fn blas_product(
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
    batch: usize,
    mkn: (usize, usize, usize),
    b_transposed: bool,
) -> bool {
    match sgemm() {
        Some(f) => {
            batched_product(f, a, b, out, batch, mkn, b_transposed);
            true
        }
        None => false,
    }
}

/// Scaled dot-product attention, `softmax(q k^T * scale) v`.
///
/// `q` is `[B, H, L, D]`, `k` and `v` are `[B, KVH, T, D]` with `H` a
/// multiple of `KVH` (grouped-query attention). With `causal`, query `i`
/// sees the keys up to `T - L + i` (the queries are the last `L` positions).
/// The order of operations is MLX's own for this operation on the CPU
/// (scale the queries, multiply, mask, softmax in float32, multiply).
///
/// On float32 inputs the two products are the BLAS's, called here on
/// buffers this thread keeps (MLX calls the same function for them, but
/// allocates the scores anew for each layer and hands them over through its
/// scheduler); the softmax works in place between them, and nothing is
/// copied back into MLX until the output. Other inputs have their products
/// in MLX and the softmax here.
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
    let (l_, causal_from) = (l as usize, t_ - l as usize);
    // Row r of each head group is query r % l, at key position t - l + r % l.
    let softmax_rows = |scores: &mut [f32]| {
        for (r, row) in scores.chunks_exact_mut(t_).enumerate() {
            let valid = if causal { causal_from + r % l_ + 1 } else { t_ };
            softmax_row_in_place(row, valid);
        }
    };
    let all_f32 = [&q, k, v].iter().all(|a| a.dtype() == Dtype::Float32);
    if let (Some(sgemm), true) = (sgemm(), all_f32) {
        // One evaluation for the three (each its own would wait on MLX's
        // scheduler three times a layer).
        let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
        mlx_rs::transforms::eval([&q, &k, &v])?;
        let (q, k, v) = (
            q.as_slice::<f32>(),
            k.as_slice::<f32>(),
            v.as_slice::<f32>(),
        );
        let out = with_buffers(batch * rows * t_, batch * rows * d_, |scores, out| {
            profile::host(Class::AttentionProducts, product, || {
                batched_product(sgemm, q, k, scores, batch, (rows, d_, t_), true)
            });
            profile::host(Class::Softmax, 5.0 * scores.len() as f64, || {
                softmax_rows(scores)
            });
            profile::host(Class::AttentionProducts, product, || {
                batched_product(sgemm, scores, v, out, batch, (rows, t_, d_), false)
            });
            Array::from_slice(out, &[b, h, l, d])
        });
        return Ok(out);
    }
    let scores = profile::op(Class::AttentionProducts, product, || {
        Ok(ops::matmul(&q, &k.transpose_axes(&[0, 1, 3, 2])?)?)
    })?;
    let scores = host_f32(&scores)?;
    let probs = profile::host(Class::Softmax, 5.0 * scores.size() as f64, || {
        with_scratch(scores.size(), scores.shape(), |out| {
            out.copy_from_slice(scores.as_slice::<f32>());
            softmax_rows(out)
        })
        .as_dtype(v.dtype())
    })?;
    let out = profile::op(Class::AttentionProducts, product, || {
        Ok(ops::matmul(&probs, v)?)
    })?;
    Ok(ops::reshape(&out, &[b, h, l, d])?)
}

/// A question pass's attention ([`super::attention::split_attention`]) on
/// float32 through `cblas_sgemm` and the vectorised softmax: each query's
/// scores over the state's keys (`shared`, batch 1: one product per key
/// head for every row's queries at once) and its row's own keys (causal)
/// side by side in one row, one softmax over both, and the two products
/// with the values summed. `None`, with nothing computed, where no
/// `cblas_sgemm` is loaded.
pub fn split_attention(
    q: &Array,
    shared: Option<(&Array, &Array)>,
    own: (&Array, &Array),
    scale: f32,
) -> MlxResult<Option<Array>> {
    let Some(sgemm) = sgemm() else {
        return Ok(None);
    };
    let [b, h, l, d] = [q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]];
    let (kvh, t) = (own.0.shape()[1], own.0.shape()[2]);
    let rep = h / kvh;
    // The queries as [kv head, row, head of its group, position, dim].
    let qs = ops::multiply(q, &Array::from_f32(scale).as_dtype(q.dtype())?)?;
    let qs = ops::reshape(&qs, &[b, kvh, rep, l, d])?.transpose_axes(&[1, 0, 2, 3, 4])?;
    let (qs, ko, vo) = (host_f32(&qs)?, host_f32(own.0)?, host_f32(own.1)?);
    let state = shared
        .map(|(k, v)| Ok::<_, crate::engine::mlx::MlxError>((host_f32(k)?, host_f32(v)?)))
        .transpose()?;
    let n = |x: i32| x as usize;
    let (b_, kvh_, l_, d_, t_) = (n(b), n(kvh), n(l), n(d), n(t));
    let s_ = state.as_ref().map_or(0, |(k, _)| k.shape()[2] as usize);
    let width = s_ + t_;
    let (per_head, block) = (b_ * n(rep) * l_, n(rep) * l_);
    let rows = kvh_ * per_head;
    let (qs, ko, vo) = (
        qs.as_slice::<f32>(),
        ko.as_slice::<f32>(),
        vo.as_slice::<f32>(),
    );
    let state = state
        .as_ref()
        .map(|(k, v)| (k.as_slice::<f32>(), v.as_slice::<f32>()));
    let int = |x: usize| i32::try_from(x).expect("a product's side fits in an i32");
    // C = A op(B) (+ C with `add`), row-major, with leading dimensions.
    #[allow(clippy::too_many_arguments)]
    let product = |a: &[f32],
                   lda: usize,
                   b: &[f32],
                   ldb: usize,
                   trans_b: bool,
                   c: &mut [f32],
                   ldc: usize,
                   (m, nn, k): (usize, usize, usize),
                   add: bool| {
        // SAFETY: every caller passes slices that start at the first
        // element read or written and hold the whole matrices with their
        // leading dimensions.
        unsafe {
            sgemm(
                ROW_MAJOR,
                NO_TRANS,
                if trans_b { TRANS } else { NO_TRANS },
                int(m),
                int(nn),
                int(k),
                1.0,
                a.as_ptr(),
                int(lda),
                b.as_ptr(),
                int(ldb),
                if add { 1.0 } else { 0.0 },
                c.as_mut_ptr(),
                int(ldc),
            )
        }
    };
    // Weights (`m × keys`, leading dimension `ldp`) times values (`keys ×
    // n`), added to `c` with `add`, summed over blocks of MAX_INNER keys.
    let weighted = |p: &[f32],
                    ldp: usize,
                    values: &[f32],
                    c: &mut [f32],
                    (m, nn, keys): (usize, usize, usize),
                    add: bool| {
        for (i, from) in (0..keys).step_by(MAX_INNER).enumerate() {
            let inner = MAX_INNER.min(keys - from);
            product(
                &p[from..],
                ldp,
                &values[from * nn..],
                nn,
                false,
                c,
                nn,
                (m, nn, inner),
                add || i > 0,
            );
        }
    };
    let out = with_buffers(rows * width, rows * d_, |scores, out| {
        for g in 0..kvh_ {
            let first = g * per_head;
            if let Some((ks, _)) = state {
                let (q, c) = (&qs[first * d_..], &mut scores[first * width..]);
                product(
                    q,
                    d_,
                    &ks[g * s_ * d_..],
                    d_,
                    true,
                    c,
                    width,
                    (per_head, s_, d_),
                    false,
                );
            }
            for r in 0..b_ {
                let at = first + r * block;
                let keys = &ko[(r * kvh_ + g) * t_ * d_..];
                let c = &mut scores[at * width + s_..];
                product(
                    &qs[at * d_..],
                    d_,
                    keys,
                    d_,
                    true,
                    c,
                    width,
                    (block, t_, d_),
                    false,
                );
            }
        }
        for (i, row) in scores.chunks_exact_mut(width).enumerate() {
            softmax_row_in_place(row, s_ + t_ - l_ + i % l_ + 1);
        }
        for g in 0..kvh_ {
            let first = g * per_head;
            if let Some((_, vs)) = state {
                let (p, c) = (&scores[first * width..], &mut out[first * d_..]);
                let values = &vs[g * s_ * d_..];
                weighted(p, width, values, c, (per_head, d_, s_), false);
            }
            for r in 0..b_ {
                let at = first + r * block;
                let values = &vo[(r * kvh_ + g) * t_ * d_..];
                let (p, c) = (&scores[at * width + s_..], &mut out[at * d_..]);
                weighted(p, width, values, c, (block, d_, t_), state.is_some());
            }
        }
        Array::from_slice(out, &[kvh, b, rep, l, d])
    });
    let out = out.transpose_axes(&[1, 0, 2, 3, 4])?;
    Ok(Some(ops::reshape(&out, &[b, h, l, d])?))
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
