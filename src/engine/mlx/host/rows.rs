//! Host kernels for the two per-row steps around a layer's products that
//! MLX's CPU build runs as chains of element-wise operations: the RMS norm
//! and the rotary position embedding.
//!
//! On a new ~1,000-token state of the fixture the two took 13% of the read
//! (`examples/cpu_profile.rs`: 164 ms of rope and 103 ms of norms in a
//! 2,053 ms prefill, for 0.27 GFLOP between them); here each is one pass
//! over its rows. Float32 only, as the other host kernels
//! ([`super::super::layers::HostKernels`]).
//!
//! The rope takes its cosines and sines from MLX itself: MLX's own rope of
//! a unit vector (1 in the first element of each rotated pair, 0 in the
//! second) is the table of `cos` and `sin` it would use, so the angles are
//! MLX's to the bit; the rotation is then `x1 c - x2 s`, `x1 s + x2 c`,
//! per element as MLX writes it. A table depends only on the rope's
//! settings, the first position and the rows' length, so the layers of one
//! pass share it (one kept per thread, the last few used).
//!
//! Every row is computed by the same code whatever else is in the call, so
//! a question's bits do not depend on its pass.

use std::cell::RefCell;
use std::rc::Rc;

use mlx_rs::Array;

use super::{host_f32, widest, with_scratch, LANES};
use crate::engine::mlx::MlxResult;

/// `x * (1 / sqrt(mean(x^2) + eps)) * w` over rows of `w.len()` elements.
#[inline(always)]
fn rms_norm_body(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    for (row, o) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let mut acc = [0.0f32; LANES];
        let mut chunks = row.chunks_exact(LANES);
        for c in &mut chunks {
            for (a, &v) in acc.iter_mut().zip(c) {
                *a += v * v;
            }
        }
        let tail: f32 = chunks.remainder().iter().map(|v| v * v).sum();
        let squares = acc.iter().sum::<f32>() + tail;
        let inv = 1.0 / (squares / d as f32 + eps).sqrt();
        for ((o, &v), &w) in o.iter_mut().zip(row).zip(w) {
            *o = v * inv * w;
        }
    }
}

/// Where a rotated pair's two elements sit in a head of `dims` rotated
/// elements: consecutive (`traditional`) or half the dims apart.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Layout {
    dims: usize,
    traditional: bool,
}

impl Layout {
    fn pair(self, p: usize) -> (usize, usize) {
        if self.traditional {
            (2 * p, 2 * p + 1)
        } else {
            (p, p + self.dims / 2)
        }
    }
}

/// One head's row `x` rotated into `out` with the angles' `cos` and `sin`
/// (one per pair); elements past the rotated dims are copied.
#[inline(always)]
fn rotate_body(x: &[f32], cos: &[f32], sin: &[f32], layout: Layout, out: &mut [f32]) {
    let half = layout.dims / 2;
    if layout.traditional {
        for p in 0..half {
            let (a, b) = (x[2 * p], x[2 * p + 1]);
            out[2 * p] = a * cos[p] - b * sin[p];
            out[2 * p + 1] = a * sin[p] + b * cos[p];
        }
    } else {
        let (x1, x2) = x[..layout.dims].split_at(half);
        let (o1, o2) = out[..layout.dims].split_at_mut(half);
        for p in 0..half {
            o1[p] = x1[p] * cos[p] - x2[p] * sin[p];
            o2[p] = x1[p] * sin[p] + x2[p] * cos[p];
        }
    }
    out[layout.dims..].copy_from_slice(&x[layout.dims..]);
}

widest!(fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) => rms_norm_body);
widest!(fn rotate(x: &[f32], cos: &[f32], sin: &[f32], layout: Layout, out: &mut [f32]) => rotate_body);

/// RMS norm of each row of `x` (its last axis) with the learned scale
/// `weight`, in float32.
pub fn rms_norm(x: &Array, weight: &Array, eps: f32) -> MlxResult<Array> {
    let (xs, w) = (host_f32(x)?, host_f32(weight)?);
    let (xs, w) = (xs.as_slice::<f32>(), w.as_slice::<f32>());
    Ok(with_scratch(xs.len(), x.shape(), |out| {
        rms_norm_rows(xs, w, eps, out)
    }))
}

/// A rope's angles for `len` positions: `cos` and `sin` of each pair,
/// `len × pairs` each.
struct Table {
    cos: Vec<f32>,
    sin: Vec<f32>,
}

/// What a table depends on: the rope's settings (as bits), its layout,
/// the head's width, the first position and the number of positions.
type TableKey = (u64, Layout, usize, usize, usize);

/// The tables of the last few (rope, position range) pairs this thread
/// used: the layers of a pass ask for the same one in turn.
const TABLES_KEPT: usize = 4;

/// The angles' table of `rope` for positions `offset..offset + len` on
/// heads of `d` elements, `layout.dims` of them rotated, read from MLX's
/// own rope of a unit vector (`rope(u, offset)` on `[1, 1, len, d]`).
fn table(
    settings: u64,
    layout: Layout,
    d: usize,
    offset: usize,
    len: usize,
    rope: impl FnOnce(&Array, usize) -> MlxResult<Array>,
) -> MlxResult<Rc<Table>> {
    thread_local! {
        static TABLES: RefCell<Vec<(TableKey, Rc<Table>)>> = const { RefCell::new(Vec::new()) };
    }
    let key = (settings, layout, d, offset, len);
    if let Some(t) = TABLES.with(|t| t.borrow().iter().find(|e| e.0 == key).map(|e| e.1.clone())) {
        return Ok(t);
    }
    let pairs = layout.dims / 2;
    let mut unit = vec![0.0f32; len * d];
    for row in unit.chunks_exact_mut(d) {
        for p in 0..pairs {
            row[layout.pair(p).0] = 1.0;
        }
    }
    let rotated = rope(
        &Array::from_slice(&unit, &[1, 1, len as i32, d as i32]),
        offset,
    )?;
    let rotated = host_f32(&rotated)?;
    let r = rotated.as_slice::<f32>();
    let (mut cos, mut sin) = (
        Vec::with_capacity(len * pairs),
        Vec::with_capacity(len * pairs),
    );
    for row in r.chunks_exact(d) {
        for p in 0..pairs {
            let (first, second) = layout.pair(p);
            cos.push(row[first]);
            sin.push(row[second]);
        }
    }
    let t = Rc::new(Table { cos, sin });
    TABLES.with(|tables| {
        let mut tables = tables.borrow_mut();
        if tables.len() == TABLES_KEPT {
            tables.remove(0);
        }
        tables.push((key, t.clone()));
    });
    Ok(t)
}

/// The rotary embedding of `x` (float32), laid out `[B, L, H, D]` as a projection's
/// output splits into heads, for positions `offset..offset + L`; returned
/// as `[B, H, L, D]`, the layout attention reads. `settings` identifies
/// the rope (any two ropes with the same value must rotate alike); `rope`
/// is MLX's rope of a `[1, 1, L, D]` array at a position, for the table.
pub fn rope(
    x: &Array,
    settings: u64,
    (dims, traditional): (usize, bool),
    offset: usize,
    rope: impl FnOnce(&Array, usize) -> MlxResult<Array>,
) -> MlxResult<Array> {
    let s = x.shape();
    let (b, l, h, d) = (s[0] as usize, s[1] as usize, s[2] as usize, s[3] as usize);
    let layout = Layout { dims, traditional };
    let t = table(settings, layout, d, offset, l, rope)?;
    let xs = host_f32(x)?;
    let xs = xs.as_slice::<f32>();
    let pairs = dims / 2;
    let shape = [b as i32, h as i32, l as i32, d as i32];
    let out = with_scratch(xs.len(), &shape, |out| {
        for bi in 0..b {
            for li in 0..l {
                let (cos, sin) = (&t.cos[li * pairs..][..pairs], &t.sin[li * pairs..][..pairs]);
                for hi in 0..h {
                    let from = &xs[((bi * l + li) * h + hi) * d..][..d];
                    let to = &mut out[((bi * h + hi) * l + li) * d..][..d];
                    rotate(from, cos, sin, layout, to);
                }
            }
        }
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::{fast, ops};

    fn close(a: &Array, b: &Array) -> f32 {
        let d = ops::abs(ops::subtract(a, b).unwrap()).unwrap();
        ops::max(&d, None).unwrap().try_item_exact::<f32>().unwrap()
    }

    #[test]
    fn wide_loops_give_the_baseline_bits() {
        let xs: Vec<f32> = (0..960)
            .map(|i| ((i * 7919) % 1000) as f32 / 37.0 - 13.0)
            .collect();
        let (mut wide, mut base) = (vec![0.0; 960], vec![0.0; 960]);
        rms_norm_rows(&xs, &xs[..96], 1e-5, &mut wide);
        rms_norm_body(&xs, &xs[..96], 1e-5, &mut base);
        assert_eq!(wide, base);
        for traditional in [false, true] {
            let layout = Layout {
                dims: 48,
                traditional,
            };
            rotate(
                &xs[..64],
                &xs[100..124],
                &xs[200..224],
                layout,
                &mut wide[..64],
            );
            rotate_body(
                &xs[..64],
                &xs[100..124],
                &xs[200..224],
                layout,
                &mut base[..64],
            );
            assert_eq!(wide, base);
        }
    }

    #[test]
    fn rms_norm_is_mlx_s() {
        let x = mlx_rs::random::normal::<f32>(&[3, 5, 77], None, None, None).unwrap();
        let w = mlx_rs::random::normal::<f32>(&[77], None, None, None).unwrap();
        let want = fast::rms_norm(&x, Some(&w), 1e-5).unwrap();
        assert!(close(&rms_norm(&x, &w, 1e-5).unwrap(), &want) < 1e-5);
    }

    #[test]
    fn rope_is_mlx_s_in_either_layout_and_on_a_part() {
        for (traditional, dims) in [(false, 64), (true, 64), (false, 32), (true, 48)] {
            let x = mlx_rs::random::normal::<f32>(&[2, 7, 3, 64], None, None, None).unwrap();
            let mlx = |a: &Array, offset: usize| -> MlxResult<Array> {
                Ok(fast::rope(
                    a,
                    dims as i32,
                    traditional,
                    10000.0,
                    1.0,
                    offset as i32,
                    None,
                )?)
            };
            let heads = x.transpose_axes(&[0, 2, 1, 3]).unwrap();
            let want = mlx(&heads, 1000).unwrap();
            let settings = 10000f32.to_bits() as u64;
            let got = rope(&x, settings, (dims, traditional), 1000, mlx).unwrap();
            assert_eq!(got.shape(), want.shape());
            assert!(
                close(&got, &want) < 1e-5,
                "traditional {traditional}, dims {dims}"
            );
        }
    }
}
