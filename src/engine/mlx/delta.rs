//! The gated delta rule of linear-attention layers (Qwen3.5's Gated
//! DeltaNet). Per value head, a state `S` `[Dv, Dk]` is decayed by `g_t`,
//! corrected toward `v_t` along `k_t` with strength `beta_t`, and read
//! along `q_t`:
//!
//! ```text
//! S_t = g_t S_{t-1} + beta_t (v_t - g_t S_{t-1} k_t) k_t^T,    y_t = S_t q_t
//! ```
//!
//! Three ways to compute it, all in float32:
//! - [`steps`]: MLX ops, one token at a time (a dozen small ops a token:
//!   decoding, and the reference the others are held to);
//! - [`chunked`]: MLX ops over blocks of up to [`BLOCK`] tokens, matrix
//!   products and a constant number of ops per block whatever its length
//!   (where the host kernels are off: Metal's default);
//! - [`host`]: the CPU's host kernel, the recurrence in plain Rust loops.
//!
//! The chunked form. Within a block of `P` tokens from the state `S0`, with
//! `a_i = g_1 ... g_i` (kept as logarithms, `la_i`), the corrections
//! `d_i = beta_i (v_i - g_i S_{i-1} k_i)` (the rows of `D`) satisfy
//!
//! ```text
//! (I + N) D = diag(beta) (V - diag(a) K S0^T),   N_ij = beta_i (k_i . k_j) a_i / a_j   (j < i)
//! Y   = diag(a) Q S0^T + (Q K^T * A) D,          A_ij = a_i / a_j                     (j <= i)
//! S_P = a_P S0 + D^T diag(a_P / a) K
//! ```
//!
//! `I + N` is unit lower triangular. Its inverse is built without a
//! sequential solve: the diagonal blocks of 8 tokens (`BASE`) are inverted by
//! the finite Neumann product `(I - N)(I + N^2)(I + N^4)` (exact, as
//! `N^8 = 0` there), then neighbouring blocks are joined, doubling the size
//! each level: `[[A, 0], [C, B]]^-1 = [[A^-1, 0], [-B^-1 C A^-1, B^-1]]`,
//! each `C` computed from the keys of its two blocks. A block is padded to
//! `BLOCK` tokens (`beta = 0`, `g = 1`: the padding changes nothing), so
//! every block is the same graph of MLX ops.

use mlx_rs::{ops, Array, Dtype};

use super::MlxResult;

/// Tokens of a block of the chunked form (the engine reads prompts in
/// chunks of 256 tokens: one block each).
pub const BLOCK: i32 = 256;
/// Tokens of the diagonal blocks inverted directly.
const BASE: i32 = 8;

/// The recurrence one token at a time in MLX ops. `q`, `k` `[B, L, H, Dk]`
/// (the key heads repeated to the value heads), `v` `[B, L, H, Dv]`,
/// `decay` and `beta` `[B, L, H]`, `state` `[B, H, Dv, Dk]` float32 →
/// (`y` `[B, L, H, Dv]` in `q`'s dtype, the state).
pub fn steps(
    q: &Array,
    k: &Array,
    v: &Array,
    decay: &Array,
    beta: &Array,
    mut state: Array,
) -> MlxResult<(Array, Array)> {
    let s = q.shape()[1];
    let mut ys = Vec::with_capacity(s as usize);
    for t in 0..s {
        let at = |x: &Array| -> MlxResult<Array> {
            let i = Array::from_slice(&[t], &[1]);
            Ok(ops::indexing::take_axis(x, i, 1)?.squeeze_axes(&[1])?)
        };
        let (qt, kt, vt, gt, bt) = (at(q)?, at(k)?, at(v)?, at(decay)?, at(beta)?);
        state = ops::multiply(&state, &gt.expand_dims_axes(&[-1, -2])?)?;
        let kt4 = kt.expand_dims(-2)?;
        let kv_mem = ops::multiply(&state, &kt4)?.sum_axis(-1, false)?;
        let delta = ops::multiply(&ops::subtract(&vt, &kv_mem)?, &bt.expand_dims(-1)?)?;
        state = ops::add(&state, &ops::multiply(&kt4, &delta.expand_dims(-1)?)?)?;
        let y = ops::multiply(&state, &qt.expand_dims(-2)?)?.sum_axis(-1, false)?;
        ys.push(y.as_dtype(qt.dtype())?);
    }
    let refs: Vec<&Array> = ys.iter().collect();
    Ok((ops::stack(&refs, 1)?, state))
}

/// The chunked form, in blocks of [`BLOCK`] tokens. Shapes as [`steps`],
/// but with the decay's logarithm `log_decay` (finite where the decay
/// itself underflows to 0).
pub fn chunked(
    q: &Array,
    k: &Array,
    v: &Array,
    log_decay: &Array,
    beta: &Array,
    state: Array,
) -> MlxResult<(Array, Array)> {
    let sh = q.shape();
    let (b, l, h, dk) = (sh[0], sh[1], sh[2], sh[3]);
    let dv = v.shape()[3];
    let g = b * h;
    // Head-major float32: `[G, L, D]` and `[G, L]`, G = B * H.
    let rows = |x: &Array, d: i32| -> MlxResult<Array> {
        let x = x.as_dtype(Dtype::Float32)?.transpose_axes(&[0, 2, 1, 3])?;
        Ok(ops::reshape(&x, &[g, l, d])?)
    };
    let per_token = |x: &Array| -> MlxResult<Array> {
        let x = x.as_dtype(Dtype::Float32)?.transpose_axes(&[0, 2, 1])?;
        Ok(ops::reshape(&x, &[g, l])?)
    };
    let (qf, kf, vf) = (rows(q, dk)?, rows(k, dk)?, rows(v, dv)?);
    let (lg, bf) = (per_token(log_decay)?, per_token(beta)?);
    let mut s = ops::reshape(&state.as_dtype(Dtype::Float32)?, &[g, dv, dk])?;
    let mut ys = Vec::new();
    let mut start = 0;
    while start < l {
        let n = BLOCK.min(l - start);
        // The block's tokens, padded with zeros to BLOCK.
        let cut = |x: &Array| -> MlxResult<Array> {
            let idx: Vec<i32> = (start..start + n).collect();
            let part = ops::indexing::take_axis(x, Array::from_slice(&idx, &[n]), 1)?;
            if n == BLOCK {
                return Ok(part);
            }
            let mut pad = part.shape().to_vec();
            pad[1] = BLOCK - n;
            Ok(ops::concatenate(&[&part, &ops::zeros::<f32>(&pad)?], 1)?)
        };
        let (y, next) = block(
            &cut(&qf)?,
            &cut(&kf)?,
            &cut(&vf)?,
            &cut(&lg)?,
            &cut(&bf)?,
            &s,
        )?;
        let keep: Vec<i32> = (0..n).collect();
        ys.push(ops::indexing::take_axis(
            &y,
            Array::from_slice(&keep, &[n]),
            1,
        )?);
        s = next;
        start += n;
    }
    let refs: Vec<&Array> = ys.iter().collect();
    let y = ops::reshape(&ops::concatenate(&refs, 1)?, &[b, h, l, dv])?
        .transpose_axes(&[0, 2, 1, 3])?
        .as_dtype(q.dtype())?;
    Ok((y, ops::reshape(&s, &[b, h, dv, dk])?))
}

/// `exp(min(la_i - la_j, 0))` for `la_rows` `[.., R]` and `la_cols`
/// `[.., C]` → `[.., R, C]`: the decay from token j to token i (1 where
/// i is not after j, masked by the callers).
fn decay_between(la_rows: &Array, la_cols: &Array) -> MlxResult<Array> {
    let diff = ops::subtract(&la_rows.expand_dims(-1)?, &la_cols.expand_dims(-2)?)?;
    Ok(ops::exp(&ops::minimum(&diff, Array::from_f32(0.0))?)?)
}

/// `N` between the tokens `rows` and `cols` (keys `[.., R, Dk]` and
/// `[.., C, Dk]`, log decays, and the rows' betas): `beta_i (k_i . k_j)
/// a_i / a_j`, unmasked.
fn coupling(
    k_rows: &Array,
    k_cols: &Array,
    la_rows: &Array,
    la_cols: &Array,
    beta_rows: &Array,
) -> MlxResult<Array> {
    let kk = ops::matmul(k_rows, &k_cols.swap_axes(-1, -2)?)?;
    let kk = ops::multiply(&kk, &decay_between(la_rows, la_cols)?)?;
    Ok(ops::multiply(&kk, &beta_rows.expand_dims(-1)?)?)
}

/// One block of [`BLOCK`] tokens: `q`, `k` `[G, P, Dk]`, `v` `[G, P, Dv]`,
/// `lg`, `beta` `[G, P]`, the state `s0` `[G, Dv, Dk]` → (`y` `[G, P, Dv]`,
/// the state after the block).
fn block(
    q: &Array,
    k: &Array,
    v: &Array,
    lg: &Array,
    beta: &Array,
    s0: &Array,
) -> MlxResult<(Array, Array)> {
    let p = BLOCK;
    let la = ops::cumsum(lg, 1, None, None)?;
    let a = ops::exp(&la)?.expand_dims(-1)?;
    let s0t = s0.swap_axes(-1, -2)?;
    // R = diag(beta) (V - diag(a) K S0^T); D = (I + N)^-1 R.
    let ks0 = ops::matmul(k, &s0t)?;
    let r = ops::multiply(
        &ops::subtract(v, &ops::multiply(&a, &ks0)?)?,
        &beta.expand_dims(-1)?,
    )?;
    let d = ops::matmul(&unit_lower_inverse(k, &la, beta)?, &r)?;
    // Y = diag(a) Q S0^T + (Q K^T * A) D, A masked to j <= i.
    let upto = ops::tri::<f32>(p, None, Some(0))?;
    let qk = ops::multiply(
        &ops::multiply(
            &ops::matmul(q, &k.swap_axes(-1, -2)?)?,
            &decay_between(&la, &la)?,
        )?,
        &upto,
    )?;
    let y = ops::add(
        &ops::multiply(&a, &ops::matmul(q, &s0t)?)?,
        &ops::matmul(&qk, &d)?,
    )?;
    // S_P = a_P S0 + D^T diag(a_P / a) K.
    let last = ops::indexing::take_axis(&la, Array::from_slice(&[p - 1], &[1]), 1)?;
    let to_end = ops::exp(&ops::subtract(&last, &la)?)?.expand_dims(-1)?;
    let s = ops::add(
        &ops::multiply(&ops::exp(&last)?.expand_dims(-1)?, s0)?,
        &ops::matmul(&d.swap_axes(-1, -2)?, &ops::multiply(&to_end, k)?)?,
    )?;
    Ok((y, s))
}

/// `(I + N)^-1` `[G, P, P]` for the block's keys `k` `[G, P, Dk]`, log
/// decays `la` and betas `[G, P]` (the module's doc says how).
fn unit_lower_inverse(k: &Array, la: &Array, beta: &Array) -> MlxResult<Array> {
    let (g, p, dk) = (k.shape()[0], k.shape()[1], k.shape()[2]);
    // Tokens in blocks of `size`: `[G, n, size, ..]`.
    let split = |size: i32| -> MlxResult<(Array, Array, Array)> {
        let n = p / size;
        Ok((
            ops::reshape(k, &[g, n, size, dk])?,
            ops::reshape(la, &[g, n, size])?,
            ops::reshape(beta, &[g, n, size])?,
        ))
    };
    // The diagonal blocks, strictly lower: (I - N)(I + N^2)(I + N^4).
    let (kb, lab, bb) = split(BASE)?;
    let strict = ops::tri::<f32>(BASE, None, Some(-1))?;
    let n = ops::multiply(&coupling(&kb, &kb, &lab, &lab, &bb)?, &strict)?;
    let eye = ops::eye::<f32>(BASE, None, None)?;
    let mut inv = ops::subtract(&eye, &n)?;
    let mut power = n;
    let mut reach = 2;
    while reach < BASE {
        power = ops::matmul(&power, &power)?;
        inv = ops::matmul(&inv, &ops::add(&eye, &power)?)?;
        reach *= 2;
    }
    // Join neighbouring blocks until one covers the block.
    let mut size = BASE;
    while size < p {
        let half = p / (2 * size);
        let pair = |x: &Array, i: i32| -> MlxResult<Array> {
            let sh = x.shape();
            let mut to = vec![g, half, 2];
            to.extend_from_slice(&sh[2..]);
            let x = ops::reshape(x, &to)?;
            Ok(
                ops::indexing::take_axis(&x, Array::from_slice(&[i], &[1]), 2)?
                    .squeeze_axes(&[2])?,
            )
        };
        let (kb, lab, bb) = split(size)?;
        let (k_first, k_then) = (pair(&kb, 0)?, pair(&kb, 1)?);
        let (la_first, la_then) = (pair(&lab, 0)?, pair(&lab, 1)?);
        let c = coupling(&k_then, &k_first, &la_then, &la_first, &pair(&bb, 1)?)?;
        let (a_inv, b_inv) = (pair(&inv, 0)?, pair(&inv, 1)?);
        let lower = ops::negative(&ops::matmul(&ops::matmul(&b_inv, &c)?, &a_inv)?)?;
        let zero = ops::zeros::<f32>(&[g, half, size, size])?;
        let top = ops::concatenate(&[&a_inv, &zero], -1)?;
        let bottom = ops::concatenate(&[&lower, &b_inv], -1)?;
        inv = ops::concatenate(&[&top, &bottom], -2)?;
        size *= 2;
    }
    Ok(ops::reshape(&inv, &[g, p, p])?)
}

/// The gated delta rule on the host, in float32: per batch and value head,
/// the state `[Dv, Dk]` is decayed, corrected toward `v_t` along `k_t`, and
/// read along `q_t`. Returns `y` `[B, S, Hv, Dv]` (float32) and the state.
pub fn host(
    q: &Array,
    k: &Array,
    v: &Array,
    decay: &Array,
    beta: &Array,
    state: &Array,
) -> MlxResult<(Array, Array)> {
    let (b, s, hk, dk) = (
        q.shape()[0] as usize,
        q.shape()[1] as usize,
        q.shape()[2] as usize,
        q.shape()[3] as usize,
    );
    let (hv, dv) = (v.shape()[2] as usize, v.shape()[3] as usize);
    let f32s = |x: &Array| -> MlxResult<Array> {
        let x = x.as_dtype(Dtype::Float32)?.contiguous()?;
        x.eval()?;
        Ok(x)
    };
    let (q, k, v, g, be, st) = (
        f32s(q)?,
        f32s(k)?,
        f32s(v)?,
        f32s(decay)?,
        f32s(beta)?,
        f32s(state)?,
    );
    let (qs, ks, vs, gs, bs) = (
        q.as_slice::<f32>(),
        k.as_slice::<f32>(),
        v.as_slice::<f32>(),
        g.as_slice::<f32>(),
        be.as_slice::<f32>(),
    );
    let mut states = st.as_slice::<f32>().to_vec();
    let mut y = vec![0f32; b * s * hv * dv];
    let ratio = hv / hk;
    let mut kv_mem = vec![0f32; dv];
    for bi in 0..b {
        for h in 0..hv {
            let kh = h / ratio;
            let sm = &mut states[(bi * hv + h) * dv * dk..][..dv * dk];
            for t in 0..s {
                let row = (bi * s + t) * hv + h;
                let gt = gs[row];
                let bt = bs[row];
                let qk = (bi * s + t) * hk + kh;
                let qt = &qs[qk * dk..][..dk];
                let kt = &ks[qk * dk..][..dk];
                let vt = &vs[row * dv..][..dv];
                for (i, m) in kv_mem.iter_mut().enumerate() {
                    let r = &mut sm[i * dk..][..dk];
                    let mut acc = 0f32;
                    for (x, &kk) in r.iter_mut().zip(kt) {
                        *x *= gt;
                        acc += *x * kk;
                    }
                    *m = acc;
                }
                let yt = &mut y[row * dv..][..dv];
                for (i, out) in yt.iter_mut().enumerate() {
                    let delta = (vt[i] - kv_mem[i]) * bt;
                    let r = &mut sm[i * dk..][..dk];
                    let mut acc = 0f32;
                    for ((x, &kk), &qq) in r.iter_mut().zip(kt).zip(qt) {
                        *x += kk * delta;
                        acc += *x * qq;
                    }
                    *out = acc;
                }
            }
        }
    }
    let shape_y = [b as i32, s as i32, hv as i32, dv as i32];
    let shape_s = [b as i32, hv as i32, dv as i32, dk as i32];
    Ok((
        Array::from_slice(&y, &shape_y),
        Array::from_slice(&states, &shape_s),
    ))
}

/// Inputs as a layer makes them, for tests and benchmarks: `q`, `k`
/// `[1, L, H, Dk]`, `v` `[1, L, H, Dv]`, the log decays and betas `[1, L,
/// H]`, a state `[1, H, Dv, Dk]` carried from earlier tokens. Unit keys,
/// queries scaled by `1/sqrt(Dk)`, decays in (0.14, 0.99) and betas in
/// (0.05, 0.95); or, `alike`, every token the same key, decays in (0.999,
/// 0.9999) and betas in (0.95, 0.999): the hardest case for the block
/// inverse.
pub fn sample(l: i32, h: i32, dk: i32, dv: i32, seed: u64, alike: bool) -> MlxResult<[Array; 6]> {
    use mlx_rs::random;
    let mut keys = Vec::new();
    let mut key = random::key(seed)?;
    for _ in 0..6 {
        let (a, b) = random::split(&key, 2)?;
        keys.push(a);
        key = b;
    }
    let normal = |shape: &[i32], i: usize| random::normal::<f32>(shape, None, None, &keys[i]);
    let unit = |x: Array| -> MlxResult<Array> {
        let norm = ops::sqrt(&ops::sum_axis(&ops::square(&x)?, -1, true)?)?;
        Ok(ops::divide(&x, &norm)?)
    };
    let k = if alike {
        ops::broadcast_to(unit(normal(&[1, 1, h, dk], 1)?)?, &[1, l, h, dk])?
    } else {
        unit(normal(&[1, l, h, dk], 1)?)?
    };
    let q = ops::multiply(
        &unit(normal(&[1, l, h, dk], 0)?)?,
        Array::from_f32((dk as f32).powf(-0.5)),
    )?;
    let v = normal(&[1, l, h, dv], 2)?;
    let (lo, hi) = if alike { (-1e-3, -1e-4) } else { (-2.0, -0.01) };
    let lg = random::uniform::<f32, f32>(lo, hi, &[1, l, h], &keys[3])?;
    let (lo, hi) = if alike { (0.95, 0.999) } else { (0.05, 0.95) };
    let beta = random::uniform::<f32, f32>(lo, hi, &[1, l, h], &keys[4])?;
    let state = normal(&[1, h, dv, dk], 5)?;
    Ok([q, k, v, lg, beta, state])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn max_diff(a: &Array, b: &Array) -> f32 {
        let d = ops::abs(ops::subtract(a, b).unwrap())
            .unwrap()
            .max(None)
            .unwrap();
        d.item_exact::<f32>()
    }

    /// The chunked form against the steps: (worst |diff| of y, of the
    /// state).
    fn compare(l: i32, seed: u64, alike: bool) -> (f32, f32) {
        let [q, k, v, lg, beta, state] = sample(l, 3, 16, 8, seed, alike).unwrap();
        let decay = ops::exp(&lg).unwrap();
        let (y1, s1) = steps(&q, &k, &v, &decay, &beta, state.clone()).unwrap();
        let (y2, s2) = chunked(&q, &k, &v, &lg, &beta, state).unwrap();
        (max_diff(&y1, &y2), max_diff(&s1, &s2))
    }

    #[test]
    fn the_chunked_form_is_the_recurrence() {
        for (i, l) in [2, 7, 8, 9, 64, 255, 256, 257, 600].into_iter().enumerate() {
            let (y, s) = compare(l, i as u64, false);
            println!("{l} tokens: max |diff| y {y:.2e}, state {s:.2e}");
            assert!(y <= 1e-4 && s <= 1e-4, "{l} tokens: y {y}, state {s}");
        }
    }

    /// Ops of the graph of `chunked` (or of `steps`) on `l` tokens, the
    /// inputs evaluated first.
    fn ops_for(l: i32, chunk: bool) -> usize {
        let [q, k, v, lg, beta, state] = sample(l, 3, 16, 8, 3, false).unwrap();
        let decay = ops::exp(&lg).unwrap();
        mlx_rs::transforms::eval([&q, &k, &v, &lg, &decay, &beta, &state]).unwrap();
        let (y, s) = if chunk {
            chunked(&q, &k, &v, &lg, &beta, state).unwrap()
        } else {
            steps(&q, &k, &v, &decay, &beta, state).unwrap()
        };
        crate::engine::mlx::graph::op_count(&[&y, &s]).unwrap()
    }

    #[test]
    fn a_block_is_the_same_ops_whatever_its_length() {
        let chunked: Vec<(i32, usize)> = [2, 17, 64, 200, 255, 256]
            .into_iter()
            .map(|l| (l, ops_for(l, true)))
            .collect();
        let steps: Vec<(i32, usize)> = [2, 17, 64]
            .into_iter()
            .map(|l| (l, ops_for(l, false)))
            .collect();
        println!("chunked: {chunked:?}; steps: {steps:?}");
        // Padded blocks (under 256 tokens) are one graph; a full block
        // skips the padding.
        assert!(
            chunked[..5].iter().all(|c| c.1 == chunked[0].1),
            "{chunked:?}"
        );
        assert!(chunked[5].1 <= chunked[0].1, "{chunked:?}");
        // Two blocks, twice the ops.
        assert!(ops_for(300, true) <= 2 * chunked[0].1 + 8);
        // The steps grow with every token.
        assert!(steps[2].1 > 20 * steps[0].1, "{steps:?}");
    }

    #[test]
    fn the_chunked_form_holds_on_alike_keys_and_slow_decay() {
        for l in [256, 300] {
            let (y, s) = compare(l, 7, true);
            println!("alike, {l} tokens: max |diff| y {y:.2e}, state {s:.2e}");
            assert!(y <= 1e-4 && s <= 1e-4, "{l} tokens: y {y}, state {s}");
        }
    }
}
