//! Attention, as every architecture computes it: causal (and
//! sliding-window) scaled dot-product attention over a layer's cache
//! ([`attention`]), and, in a question pass, the split attention over a
//! shared state and each row's own positions ([`split_attention`]).

use mlx_rs::fast::{self, ScaledDotProductAttentionMask};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array, Dtype};

use super::cache::Keys;
use super::host;
use super::layers::HostKernels;
use super::profile::{self, Class};
use super::MlxResult;

/// Scaled dot-product attention of queries `q` (`[B, H, L, D]`, the last
/// `L` of the `T` positions of `k` and `v`): each query sees the keys up to
/// its own position and, with `window`, only the last `window` of those (a
/// single query sees every key it is given). The host kernel computes it
/// where [`HostKernels::apply`] says so and there is no window to cut.
///
/// In a question pass ([`Keys::Split`]) the keys come in two parts, the
/// state's (shared by every row) and each row's own, and
/// [`split_attention`] computes it.
pub fn attention(
    q: &Array,
    keys: &Keys,
    scale: f32,
    window: Option<usize>,
    host: HostKernels,
) -> MlxResult<Array> {
    let (k, v) = match keys {
        Keys::Whole(k, v) => (k, v),
        Keys::Split { shared, own } => {
            let flops = 4.0
                * profile::elements(q)
                * (own.0.shape()[2] + shared.as_ref().map_or(0, |s| s.0.shape()[2])) as f64;
            return profile::op(Class::AttentionProducts, flops, || {
                if host.apply(q) && window.is_none() {
                    let shared = shared.as_ref().map(|(k, v)| (k, v));
                    if let Some(out) = host::split_attention(q, shared, (&own.0, &own.1), scale)? {
                        return Ok(out);
                    }
                }
                split_attention(q, shared.as_ref(), own, scale, window)
            });
        }
    };
    let (l, t) = (q.shape()[2] as usize, k.shape()[2] as usize);
    let window = window.filter(|&w| l > 1 && t > w);
    if host.apply(q) && window.is_none() {
        return host::attention(q, k, v, scale, l > 1);
    }
    // MLX's fused attention: its products and softmax, as one.
    let flops = 4.0 * profile::elements(q) * t as f64;
    profile::op(Class::AttentionProducts, flops, || {
        mlx_attention(q, k, v, scale, window)
    })
}

fn mlx_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    window: Option<usize>,
) -> MlxResult<Array> {
    let (l, t) = (q.shape()[2] as usize, k.shape()[2] as usize);
    let sdpa = |mask| -> MlxResult<Array> {
        Ok(fast::scaled_dot_product_attention(
            q, k, v, scale, mask, None,
        )?)
    };
    match window {
        _ if l == 1 => sdpa(None),
        Some(w) => {
            // Query i is at key position t - l + i.
            let rows = ops::add(
                &ops::arange::<_, i32>(0, l as i32, 1)?,
                Array::from_int((t - l) as i32),
            )?;
            let rows = ops::expand_dims(&rows, 1)?;
            let cols = ops::expand_dims(&ops::arange::<_, i32>(0, t as i32, 1)?, 0)?;
            let causal = ops::ge(&rows, &cols)?;
            let near = ops::lt(&rows, &ops::add(&cols, Array::from_int(w as i32))?)?;
            let mask = ops::logical_and(&causal, &near)?;
            sdpa(Some(ScaledDotProductAttentionMask::Array(&mask)))
        }
        None => sdpa(Some(ScaledDotProductAttentionMask::Causal)),
    }
}

/// A masked score: finite, so that a row with every key of a part masked
/// gives that part a weight of exactly 0 rather than NaN.
const MASKED: f32 = -1e30;

/// One part of a split attention, over keys `k`/`v` (`[Bk, KVH, T, D]`)
/// for queries `q` already scaled and grouped (`[Bk, KVH, R, D]`, float32):
/// the row maxima `m` and sums `l` of the exponentiated scores and their
/// unnormalised product with the values, `visible` masking the scores
/// (`[R, T]`, true where a query sees a key).
fn attention_part(
    q: &Array,
    k: &Array,
    v: &Array,
    visible: Option<&Array>,
) -> MlxResult<(Array, Array, Array)> {
    let k = k.as_dtype(Dtype::Float32)?;
    let v = v.as_dtype(Dtype::Float32)?;
    let scores = ops::matmul(q, &k.transpose_axes(&[0, 1, 3, 2])?)?;
    let scores = match visible {
        Some(mask) => ops::select(mask, &scores, Array::from_f32(MASKED))?,
        None => scores,
    };
    let m = ops::max_axis(&scores, -1, true)?;
    let p = ops::exp(&ops::subtract(&scores, &m)?)?;
    let l = ops::sum_axis(&p, -1, true)?;
    Ok((m, l, weighted(&p, &v)?))
}

/// `p · v`, summed over blocks of [`host::MAX_INNER`] keys at fixed key
/// boundaries, so that a row's bits do not depend on how many rows, or how
/// many padding keys, share the product (the constant says why).
fn weighted(p: &Array, v: &Array) -> MlxResult<Array> {
    let keys = v.shape()[2];
    let block = host::MAX_INNER as i32;
    if keys <= block {
        return Ok(ops::matmul(p, v)?);
    }
    let mut sum: Option<Array> = None;
    for from in (0..keys).step_by(host::MAX_INNER) {
        let to = (from + block).min(keys);
        let part = ops::matmul(p.index((.., .., .., from..to)), v.index((.., .., from..to)))?;
        sum = Some(match sum {
            Some(s) => ops::add(&s, &part)?,
            None => part,
        });
    }
    Ok(sum.expect("at least one block"))
}

/// Attention of a question pass's queries (`[B, H, L, D]`, the last `L`
/// of each row's own positions) over the state's keys (`shared`, batch 1,
/// positions before every row's own) and each row's own keys, causal and,
/// with `window`, within the window. The state's part is one product for
/// every row at once (the rows' queries stacked against the one copy of
/// the state's keys); the own part is per row; the two are merged by their
/// row maxima, as a softmax over both would weigh them. Computed in
/// float32.
pub fn split_attention(
    q: &Array,
    shared: Option<&(Array, Array)>,
    own: &(Array, Array),
    scale: f32,
    window: Option<usize>,
) -> MlxResult<Array> {
    let [b, h, l, d] = [q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]];
    let (kvh, t) = (own.0.shape()[1], own.0.shape()[2]);
    let rep = h / kvh;
    let q = ops::multiply(&q.as_dtype(Dtype::Float32)?, Array::from_f32(scale))?;
    // Query i of a row is its own position t - l + i.
    let at = ops::add(&ops::arange::<_, i32>(0, l, 1)?, Array::from_int(t - l))?.expand_dims(1)?;
    // Its own keys: causal, and within the window.
    let cols = ops::arange::<_, i32>(0, t, 1)?.expand_dims(0)?;
    let mut own_visible = ops::ge(&at, &cols)?;
    if let Some(w) = window {
        let near = ops::lt(&ops::subtract(&at, &cols)?, Array::from_int(w as i32))?;
        own_visible = ops::logical_and(&own_visible, &near)?;
    }
    // Rows of a head group: `rep` heads of `l` queries each.
    let tile = |m: &Array, times: i32| -> MlxResult<Array> {
        let cols = m.shape()[1];
        let m = ops::broadcast_to(&m.expand_dims(0)?, &[times, l, cols])?;
        Ok(ops::reshape(&m, &[times * l, cols])?)
    };
    let grouped = ops::reshape(&q, &[b, kvh, rep * l, d])?;
    let (m2, l2, o2) = attention_part(&grouped, &own.0, &own.1, Some(&tile(&own_visible, rep)?))?;
    let Some((sk, sv)) = shared else {
        let out = ops::divide(&o2, &l2)?;
        return Ok(ops::reshape(&out, &[b, h, l, d])?.as_dtype(own.0.dtype())?);
    };
    // The state's keys: every row's queries against the one copy.
    let held = sk.shape()[2];
    let visible = match window {
        Some(w) => {
            // Key c of the state's `held` is `held - c` positions before
            // the rows' first own one.
            let cols = ops::arange::<_, i32>(0, held, 1)?.expand_dims(0)?;
            let gap = ops::subtract(&ops::add(&at, Array::from_int(held))?, &cols)?;
            Some(tile(&ops::lt(&gap, Array::from_int(w as i32))?, b * rep)?)
        }
        None => None,
    };
    let stacked = ops::reshape(&q, &[b, kvh, rep, l, d])?.transpose_axes(&[1, 0, 2, 3, 4])?;
    let stacked = ops::reshape(&stacked, &[1, kvh, b * rep * l, d])?;
    let (m1, l1, o1) = attention_part(&stacked, sk, sv, visible.as_ref())?;
    let per_row = |a: &Array| -> MlxResult<Array> {
        let last = a.shape()[3];
        let a = ops::reshape(a, &[kvh, b, rep * l, last])?.transpose_axes(&[1, 0, 2, 3])?;
        Ok(a)
    };
    let (m1, l1, o1) = (per_row(&m1)?, per_row(&l1)?, per_row(&o1)?);
    let m = ops::maximum(&m1, &m2)?;
    let a1 = ops::exp(&ops::subtract(&m1, &m)?)?;
    let a2 = ops::exp(&ops::subtract(&m2, &m)?)?;
    let num = ops::add(&ops::multiply(&o1, &a1)?, &ops::multiply(&o2, &a2)?)?;
    let den = ops::add(&ops::multiply(&l1, &a1)?, &ops::multiply(&l2, &a2)?)?;
    let out = ops::divide(&num, &den)?;
    Ok(ops::reshape(&out, &[b, h, l, d])?.as_dtype(own.0.dtype())?)
}
