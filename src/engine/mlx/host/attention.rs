//! The host kernels of attention on float32: its two products through the
//! process's `cblas_sgemm` (the BLAS MLX's own products call) on buffers the
//! engine thread keeps, the softmax of [`super`] between them, a tile of
//! scores at a time so that they stay in a core's cache. A new state's
//! causal attention ([`attention`]) and a question pass's split attention
//! over the shared state and each row's own keys ([`split_attention`]).
//!
//! Each product sums over an inner dimension that does not depend on how
//! many rows share the call, so a row's bits do not depend on its tile or
//! its pass.

use mlx_rs::{ops, Array, Dtype};

use super::workers::{on_cores, Tile};
use super::{host_f32, softmax_row_in_place, with_buffers, with_scratch};
use crate::engine::mlx::profile::{self, Class};
use crate::engine::mlx::MlxResult;

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

/// `c = a · op(b)` (`+ c` with `add`) through `sgemm`, row-major, with
/// leading dimensions: `a` is `m × k`, `op(b)` `k × n` (`b` stored `n × k`
/// with `trans_b`), `c` `m × n`; each slice starts at its matrix's first
/// element and holds it whole (checked).
#[allow(clippy::too_many_arguments)]
fn gemm(
    sgemm: Sgemm,
    (a, lda): (&[f32], usize),
    (b, ldb, trans_b): (&[f32], usize, bool),
    (c, ldc): (&mut [f32], usize),
    (m, n, k): (usize, usize, usize),
    add: bool,
) {
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    let b_len = if trans_b {
        (n - 1) * ldb + k
    } else {
        (k - 1) * ldb + n
    };
    assert!(a.len() >= (m - 1) * lda + k && b.len() >= b_len && c.len() >= (m - 1) * ldc + n);
    let int = |x: usize| i32::try_from(x).expect("a product's side fits in an i32");
    // SAFETY: the slices hold every element the call reads and writes
    // (asserted above), with the leading dimensions given.
    unsafe {
        sgemm(
            ROW_MAJOR,
            NO_TRANS,
            if trans_b { TRANS } else { NO_TRANS },
            int(m),
            int(n),
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
}

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
        // SAFETY: a loaded `cblas_sgemm` has the CBLAS signature above.
        super::symbol(c"cblas_sgemm")
            .map(|sym| unsafe { std::mem::transmute::<*mut libc::c_void, Sgemm>(sym) })
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
    let ldb = if b_transposed { k } else { n };
    for i in 0..batch {
        let (a, b) = ((&a[i * m * k..], k), (&b[i * k * n..], ldb, b_transposed));
        gemm(sgemm, a, b, (&mut out[i * m * n..], n), (m, n, k), false);
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
        if causal {
            let tile = causal_tile(t_);
            let out = with_buffers(tile * t_, batch * rows * d_, |scores, out| {
                let shape = (batch, groups as usize, l_, t_, d_);
                causal_tiles(sgemm, (q, k, v), scores, out, shape);
                Array::from_slice(out, &[b, h, l, d])
            });
            return Ok(out);
        }
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

/// The most scores one tile of [`causal_tiles`] holds: 1 MiB, so that a
/// tile's scores stay in a core's cache between their product, their
/// softmax and their product with the values (a 512-token chunk's scores
/// over a 3,000-token state, 55 MB a layer, went out to memory three times).
const TILE_SCORES: usize = 1 << 18;

/// Query positions a tile of [`causal_tiles`] holds over `t` keys: as many
/// as [`TILE_SCORES`] allows, between 16 and 256, in multiples of 16. It
/// depends on the keys alone, so a chunk of a state is cut the same way
/// whenever it is read.
fn causal_tile(t: usize) -> usize {
    (TILE_SCORES / t.max(1)).clamp(16, 256) / 16 * 16
}

/// Causal attention on float32, tile by tile: for each key head, each head
/// of its group and each run of [`causal_tile`] query positions, the
/// scores against the keys up to the run's last position only (the keys
/// after it are masked for every query of the run, so neither product
/// reads them), their softmax, and their product with those values, into
/// `out` (`[batch, groups, l, d]` rows, as [`attention`] lays them out).
/// `q` is scaled, `[batch, groups · l, d]`; `k`, `v` are `[batch, t, d]`;
/// query `i` sits at key position `t - l + i`.
fn causal_tiles(
    sgemm: Sgemm,
    (q, k, v): (&[f32], &[f32], &[f32]),
    scores: &mut [f32],
    out: &mut [f32],
    (batch, groups, l, t, d): (usize, usize, usize, usize, usize),
) {
    let tile = causal_tile(t);
    let before = t - l;
    let mut tiles = Vec::new();
    for bi in 0..batch {
        for g in 0..groups {
            for from in (0..l).step_by(tile) {
                let rows = tile.min(l - from);
                let at = (bi * groups + g) * l + from;
                let width = before + from + rows;
                tiles.push(Tile {
                    at,
                    rows,
                    width,
                    kv: bi,
                    from,
                });
            }
        }
    }
    // Profiled whole: the softmax runs between each tile's products.
    let flops: usize = tiles.iter().map(|x| 4 * x.rows * x.width * d).sum();
    profile::host(Class::AttentionProducts, flops as f64, || {
        on_cores(&tiles, d, scores, out, |x, s, out| {
            let (keys, values) = (&k[x.kv * t * d..], &v[x.kv * t * d..]);
            let (rows, width) = (x.rows, x.width);
            let q = (&q[x.at * d..], d);
            gemm(
                sgemm,
                q,
                (keys, d, true),
                (s, width),
                (rows, width, d),
                false,
            );
            for (i, row) in s.chunks_exact_mut(width).enumerate() {
                softmax_row_in_place(row, before + x.from + i + 1);
            }
            let c = (out, d);
            gemm(
                sgemm,
                (s, width),
                (values, d, false),
                c,
                (rows, d, width),
                false,
            );
        })
    });
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
            let (p, values) = ((&p[from..], ldp), (&values[from * nn..], nn, false));
            gemm(
                sgemm,
                p,
                values,
                (&mut *c, nn),
                (m, nn, inner),
                add || i > 0,
            );
        }
    };
    // Tile by tile: rows of one question's block (its heads of one key
    // head, each over its positions) whose scores over the state's keys
    // and its own fit a core's cache ([`TILE_SCORES`]) through their two
    // products, their softmax and their products with the values. A row's
    // bits do not depend on the tile: each product sums over the same
    // inner dimension whatever its number of rows.
    let tile = (TILE_SCORES / width).clamp(16, block.max(16)).min(block);
    let mut tiles = Vec::new();
    for g in 0..kvh_ {
        for r in 0..b_ {
            for from in (0..block).step_by(tile) {
                let at = g * per_head + r * block + from;
                let rows = tile.min(block - from);
                tiles.push(Tile {
                    at,
                    rows,
                    width,
                    kv: r * kvh_ + g,
                    from,
                });
            }
        }
    }
    // Profiled whole by the caller (`super::attention::attention`).
    let out = with_buffers(tile * width, rows * d_, |scores, out| {
        on_cores(&tiles, d_, scores, out, |x, s, c| {
            let g = x.kv % kvh_;
            let (keys, values) = (&ko[x.kv * t_ * d_..], &vo[x.kv * t_ * d_..]);
            let (m, q) = (x.rows, &qs[x.at * d_..]);
            if let Some((ks, _)) = state {
                let ks = &ks[g * s_ * d_..];
                gemm(
                    sgemm,
                    (q, d_),
                    (ks, d_, true),
                    (s, width),
                    (m, s_, d_),
                    false,
                );
            }
            let own = &mut s[s_..];
            let keys = (keys, d_, true);
            gemm(sgemm, (q, d_), keys, (own, width), (m, t_, d_), false);
            for (i, row) in s.chunks_exact_mut(width).enumerate() {
                softmax_row_in_place(row, s_ + t_ - l_ + (x.from + i) % l_ + 1);
            }
            if let Some((_, vs)) = state {
                let vs = &vs[g * s_ * d_..];
                weighted(s, width, vs, c, (m, d_, s_), false);
            }
            let own = &s[s_..];
            weighted(own, width, values, c, (m, d_, t_), state.is_some());
        });
        Array::from_slice(out, &[kvh, b, rep, l, d])
    });
    let out = out.transpose_axes(&[1, 0, 2, 3, 4])?;
    Ok(Some(ops::reshape(&out, &[b, h, l, d])?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small pseudo-random floats, the same on every run.
    fn floats(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0
            })
            .collect()
    }

    /// Causal attention by its definition, in float64, one query at a time.
    fn oracle(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        (groups, l, t, d): (usize, usize, usize, usize),
    ) -> Vec<f64> {
        let mut out = vec![0.0; groups * l * d];
        for g in 0..groups {
            for i in 0..l {
                let row = &q[(g * l + i) * d..][..d];
                let seen = t - l + i + 1;
                let scores: Vec<f64> = (0..seen)
                    .map(|j| {
                        (0..d)
                            .map(|c| f64::from(row[c]) * f64::from(k[j * d + c]))
                            .sum()
                    })
                    .collect();
                let top = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                let sum: f64 = weights.iter().sum();
                for c in 0..d {
                    let o = (0..seen)
                        .map(|j| weights[j] * f64::from(v[j * d + c]))
                        .sum::<f64>();
                    out[(g * l + i) * d + c] = o / sum;
                }
            }
        }
        out
    }

    #[test]
    fn causal_tiles_are_causal_attention() {
        let sgemm = sgemm().expect("MLX's BLAS is loaded in the test binary");
        // A chunk of 300 queries after 500 positions: runs of 256 and 44
        // positions, the second seeing all 800 keys.
        let (groups, l, t, d) = (3, 300, 800, 64);
        let (q, k, v) = (
            floats(groups * l * d, 1),
            floats(t * d, 2),
            floats(t * d, 3),
        );
        let mut scores = vec![0.0; causal_tile(t) * t];
        let mut out = vec![f32::NAN; groups * l * d];
        causal_tiles(
            sgemm,
            (&q, &k, &v),
            &mut scores,
            &mut out,
            (1, groups, l, t, d),
        );
        let want = oracle(&q, &k, &v, (groups, l, t, d));
        let worst = out
            .iter()
            .zip(&want)
            .map(|(&o, w)| (f64::from(o) - w).abs())
            .fold(0.0, f64::max);
        assert!(
            worst < 1e-5,
            "largest difference from the definition: {worst}"
        );
    }
}
