//! Intent heads: an L2-regularised multinomial logistic regression on the
//! hidden state at the answer position, and a temperature on top.
//!
//! Features are standardised with the fit split's means and standard
//! deviations. The regularisation is chosen by stratified k-fold
//! cross-validation on the fit split over [`C_GRID`] (least out-of-fold
//! NLL); the temperature is fitted on the out-of-fold logits at the chosen
//! strength (the in-sample logits of the final fit are too sure of
//! themselves to calibrate on); the final head is fitted on the whole fit
//! split. The optimiser is `linfa-logistic` (argmin's L-BFGS on ndarray).
//! Everything is deterministic: the folds and draws come from the seed, the
//! optimiser has no randomness and runs a fixed iteration cap.
//! `docs/design/tasks.md` states every rule.

use linfa::prelude::*;
use linfa_logistic::MultiLogisticRegression;
use ndarray::{Array1, Array2};
use serde::{Deserialize, Serialize};

use super::calibrate::{self, Figures};
use crate::rng::SplitMix;

/// The inverse regularisation strengths tried (`alpha = 1 / C` on the
/// summed log-loss, as scikit-learn's `C`).
pub const C_GRID: [f64; 5] = [1e-3, 1e-2, 1e-1, 1.0, 10.0];

/// Folds of the cross-validation.
pub const FOLDS: usize = 3;

/// L-BFGS iterations per fit, at most.
pub const MAX_ITERATIONS: u64 = 100;

/// A label absent from a fold's training part scores this far below the
/// lowest present label in that fold's held-out logits.
const ABSENT_GAP: f32 = 30.0;

/// A fitted intent head, as served and as the state folder keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Head {
    /// The block whose output is the feature; `None`: the final norm's.
    pub layer: Option<usize>,
    /// Feature width (the model's hidden size).
    pub dim: usize,
    /// Number of labels.
    pub labels: usize,
    /// Standardisation: `x' = (x - mean) / scale`.
    pub mean: Vec<f64>,
    pub scale: Vec<f64>,
    /// Weights, feature-major: `weights[f * labels + j]`.
    pub weights: Vec<f64>,
    pub bias: Vec<f64>,
    /// The temperature the logits are divided by.
    pub temperature: f64,
    /// The chosen inverse regularisation strength.
    pub c: f64,
}

impl Head {
    /// The head's raw logits (before the temperature) for one feature vector.
    pub fn logits(&self, x: &[f32]) -> Vec<f32> {
        let mut z = self.bias.clone();
        for (f, &v) in x.iter().enumerate().take(self.dim) {
            let s = (f64::from(v) - self.mean[f]) / self.scale[f];
            if s == 0.0 {
                continue;
            }
            let row = &self.weights[f * self.labels..(f + 1) * self.labels];
            for (zj, w) in z.iter_mut().zip(row) {
                *zj += s * w;
            }
        }
        z.into_iter().map(|v| v as f32).collect()
    }
}

/// One point of the cross-validation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CvPoint {
    pub c: f64,
    /// Mean out-of-fold NLL at temperature 1.
    pub nll: f64,
}

/// How the served head was fitted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeadReport {
    /// `-1` for the final norm's output, else the block's index.
    pub layer: i64,
    pub dim: usize,
    pub c: f64,
    pub folds: usize,
    pub cross_validation: Vec<CvPoint>,
    /// Seconds of fitting (cross-validation, temperature, final fit).
    pub fit_seconds: f64,
}

/// One draw of `shots` examples per label.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Draw {
    pub seed: u64,
    pub fit_examples: usize,
    pub c: f64,
    pub temperature: f64,
    /// Holdout accuracy and ECE at the draw's fitted temperature.
    pub accuracy: f64,
    pub ece: f64,
}

/// Heads fitted on draws of few examples, evaluated on the one holdout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DrawsReport {
    pub draws: usize,
    pub shots: usize,
    pub accuracy_mean: f64,
    /// Sample standard deviation (n - 1) over draws; 0 for one draw.
    pub accuracy_sd: f64,
    pub ece_mean: f64,
    pub ece_sd: f64,
    pub per_draw: Vec<Draw>,
}

/// A split with at least one fit example of every label: per label, a
/// seeded shuffle of its examples, `round(holdout * n_label)` of them held
/// out (at most `n_label - 1`). Each list sorted.
pub fn stratified_split(
    labels: &[usize],
    n_labels: usize,
    holdout: f64,
    seed: u64,
) -> (Vec<usize>, Vec<usize>) {
    let mut rng = SplitMix::new(seed);
    let (mut fit, mut held) = (Vec::new(), Vec::new());
    for l in 0..n_labels {
        let mut idx: Vec<usize> = (0..labels.len()).filter(|&i| labels[i] == l).collect();
        rng.shuffle(&mut idx);
        let k = ((holdout * idx.len() as f64).round() as usize).min(idx.len().saturating_sub(1));
        held.extend_from_slice(&idx[..k]);
        fit.extend_from_slice(&idx[k..]);
    }
    fit.sort_unstable();
    held.sort_unstable();
    (fit, held)
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len().max(1) as f64;
    let mean = v.iter().sum::<f64>() / n;
    let sd = if v.len() > 1 {
        (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
    } else {
        0.0
    };
    (mean, sd)
}

/// Standardisation of `x`'s columns: (means, scales); a constant column
/// gets scale 1.
fn standardisation(x: &[&[f32]], dim: usize) -> (Vec<f64>, Vec<f64>) {
    let n = x.len().max(1) as f64;
    let mut mean = vec![0f64; dim];
    for row in x {
        for (m, &v) in mean.iter_mut().zip(row.iter()) {
            *m += f64::from(v);
        }
    }
    mean.iter_mut().for_each(|m| *m /= n);
    let mut var = vec![0f64; dim];
    for row in x {
        for ((s, &v), m) in var.iter_mut().zip(row.iter()).zip(&mean) {
            *s += (f64::from(v) - m).powi(2);
        }
    }
    let scale = var
        .into_iter()
        .map(|s| {
            let sd = (s / n).sqrt();
            if sd > 1e-12 {
                sd
            } else {
                1.0
            }
        })
        .collect();
    (mean, scale)
}

fn matrix(x: &[&[f32]], mean: &[f64], scale: &[f64]) -> Array2<f64> {
    let dim = mean.len();
    Array2::from_shape_fn((x.len(), dim), |(i, f)| {
        (f64::from(x[i][f]) - mean[f]) / scale[f]
    })
}

/// Fits weights and bias (over all `n_labels`; a label absent from `y`
/// gets zero weights and a bias [`ABSENT_GAP`] below the lowest) at
/// inverse strength `c`.
fn fit_weights(
    x: &Array2<f64>,
    y: &[usize],
    n_labels: usize,
    c: f64,
) -> Result<(Vec<f64>, Vec<f64>), String> {
    let dim = x.ncols();
    let present: std::collections::BTreeSet<usize> = y.iter().copied().collect();
    let mut weights = vec![0f64; dim * n_labels];
    let mut bias = vec![0f64; n_labels];
    if present.len() < 2 {
        // One label only: it wins everywhere.
        for (j, b) in bias.iter_mut().enumerate() {
            *b = if present.contains(&j) {
                0.0
            } else {
                -f64::from(ABSENT_GAP)
            };
        }
        return Ok((weights, bias));
    }
    let dataset = Dataset::new(x.clone(), Array1::from(y.to_vec()));
    let model = MultiLogisticRegression::default()
        .alpha(1.0 / c)
        .max_iterations(MAX_ITERATIONS)
        .fit(&dataset)
        .map_err(|e| format!("the intent head did not fit: {e}"))?;
    let (params, intercept) = (model.params(), model.intercept());
    let classes = model.classes();
    let low = intercept.iter().copied().fold(f64::INFINITY, f64::min);
    bias.fill(low - f64::from(ABSENT_GAP));
    for (col, &j) in classes.iter().enumerate() {
        bias[j] = intercept[col];
        for f in 0..dim {
            weights[f * n_labels + j] = params[[f, col]];
        }
    }
    Ok((weights, bias))
}

fn logits_of(x: &Array2<f64>, weights: &[f64], bias: &[f64]) -> Vec<Vec<f32>> {
    let n_labels = bias.len();
    let w = ndarray::ArrayView2::from_shape((x.ncols(), n_labels), weights).expect("shape");
    let z = x.dot(&w);
    z.outer_iter()
        .map(|row| row.iter().zip(bias).map(|(v, b)| (v + b) as f32).collect())
        .collect()
}

/// Stratified folds of the examples `y`: per label, a seeded shuffle dealt
/// round-robin, each label starting where the previous one stopped.
fn folds(y: &[usize], n_labels: usize, k: usize, seed: u64) -> Vec<usize> {
    let mut rng = SplitMix::new(seed ^ 0x9e37_79b9_7f4a_7c15);
    let mut fold = vec![0usize; y.len()];
    let mut next = 0usize;
    for l in 0..n_labels {
        let mut idx: Vec<usize> = (0..y.len()).filter(|&i| y[i] == l).collect();
        rng.shuffle(&mut idx);
        for i in idx {
            fold[i] = next % k;
            next += 1;
        }
    }
    fold
}

/// What [`fit`] returns: the head and how it was chosen.
pub struct Fitted {
    pub head: Head,
    pub report: HeadReport,
}

/// Fits a head on feature rows `x` with labels `y` (every label in
/// `0..n_labels` should have an example).
pub fn fit(
    x: &[&[f32]],
    y: &[usize],
    n_labels: usize,
    layer: Option<usize>,
    seed: u64,
) -> Result<Fitted, String> {
    let started = std::time::Instant::now();
    let dim = x.first().map_or(0, |r| r.len());
    if dim == 0 || x.iter().any(|r| r.len() != dim) {
        return Err("the examples' hidden states are empty or of different widths".into());
    }
    let (mean, scale) = standardisation(x, dim);
    let xs = matrix(x, &mean, &scale);
    let k = FOLDS.min(y.len()).max(2);
    let fold = folds(y, n_labels, k, seed);
    let mut cv = Vec::with_capacity(C_GRID.len());
    let mut best: Option<(f64, f64, Vec<Vec<f32>>)> = None;
    for &c in &C_GRID {
        let mut oof = vec![Vec::new(); y.len()];
        for f in 0..k {
            let train: Vec<usize> = (0..y.len()).filter(|&i| fold[i] != f).collect();
            let test: Vec<usize> = (0..y.len()).filter(|&i| fold[i] == f).collect();
            if test.is_empty() || train.is_empty() {
                continue;
            }
            let xt = xs.select(ndarray::Axis(0), &train);
            let yt: Vec<usize> = train.iter().map(|&i| y[i]).collect();
            let (w, b) = fit_weights(&xt, &yt, n_labels, c)?;
            let xh = xs.select(ndarray::Axis(0), &test);
            for (i, z) in test.iter().zip(logits_of(&xh, &w, &b)) {
                oof[*i] = z;
            }
        }
        let nll = calibrate::nll(&oof, y, 1.0);
        cv.push(CvPoint { c, nll });
        // Strictly better only: among equals the stronger regularisation.
        if best.as_ref().is_none_or(|b| nll < b.1) {
            best = Some((c, nll, oof));
        }
    }
    let (c, _, oof) = best.ok_or("no regularisation strength to try")?;
    let temperature = calibrate::fit_temperature(&oof, y);
    let (weights, bias) = fit_weights(&xs, y, n_labels, c)?;
    Ok(Fitted {
        head: Head {
            layer,
            dim,
            labels: n_labels,
            mean,
            scale,
            weights,
            bias,
            temperature,
            c,
        },
        report: HeadReport {
            layer: layer.map_or(-1, |l| l as i64),
            dim,
            c,
            folds: k,
            cross_validation: cv,
            fit_seconds: started.elapsed().as_secs_f64(),
        },
    })
}

/// The head's raw logits for many rows.
pub fn logits(head: &Head, x: &[&[f32]]) -> Vec<Vec<f32>> {
    x.iter().map(|r| head.logits(r)).collect()
}

/// Holdout figures of `head` at temperature 1 (before) and at its fitted
/// temperature (after).
pub fn figures(head: &Head, x: &[&[f32]], y: &[usize]) -> (Figures, Figures) {
    let z = logits(head, x);
    (
        calibrate::figures(&z, y, 1.0),
        calibrate::figures(&z, y, head.temperature),
    )
}

/// The seed of draw `d` of a registration seeded `seed`.
pub fn draw_seed(seed: u64, d: usize) -> u64 {
    SplitMix::new(seed.wrapping_add(d as u64 + 1)).next_u64()
}

/// Fits a head per draw on `shots` examples per label sampled (seeded)
/// from the fit split `fit_idx` (all of a label's when it has fewer), and
/// evaluates each on the holdout `held_idx`.
#[allow(clippy::too_many_arguments)]
pub fn draws(
    x: &[&[f32]],
    y: &[usize],
    n_labels: usize,
    fit_idx: &[usize],
    held_idx: &[usize],
    draws: usize,
    shots: usize,
    layer: Option<usize>,
    seed: u64,
) -> Result<DrawsReport, String> {
    let hx: Vec<&[f32]> = held_idx.iter().map(|&i| x[i]).collect();
    let hy: Vec<usize> = held_idx.iter().map(|&i| y[i]).collect();
    let mut per_draw = Vec::with_capacity(draws);
    for d in 0..draws {
        let s = draw_seed(seed, d);
        let mut rng = SplitMix::new(s);
        let mut picked = Vec::new();
        for l in 0..n_labels {
            let mut idx: Vec<usize> = fit_idx.iter().copied().filter(|&i| y[i] == l).collect();
            rng.shuffle(&mut idx);
            idx.truncate(shots);
            picked.extend(idx);
        }
        picked.sort_unstable();
        let fx: Vec<&[f32]> = picked.iter().map(|&i| x[i]).collect();
        let fy: Vec<usize> = picked.iter().map(|&i| y[i]).collect();
        let fitted = fit(&fx, &fy, n_labels, layer, s)?;
        let (_, after) = figures(&fitted.head, &hx, &hy);
        per_draw.push(Draw {
            seed: s,
            fit_examples: picked.len(),
            c: fitted.head.c,
            temperature: fitted.head.temperature,
            accuracy: after.accuracy,
            ece: after.ece,
        });
    }
    let acc: Vec<f64> = per_draw.iter().map(|d| d.accuracy).collect();
    let ece: Vec<f64> = per_draw.iter().map(|d| d.ece).collect();
    let (accuracy_mean, accuracy_sd) = mean_sd(&acc);
    let (ece_mean, ece_sd) = mean_sd(&ece);
    Ok(DrawsReport {
        draws,
        shots,
        accuracy_mean,
        accuracy_sd,
        ece_mean,
        ece_sd,
        per_draw,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gaussian-ish clusters: label `l`'s rows centred on a one-hot-ish mean.
    fn clusters(
        n_per: usize,
        n_labels: usize,
        dim: usize,
        seed: u64,
    ) -> (Vec<Vec<f32>>, Vec<usize>) {
        let mut rng = SplitMix::new(seed);
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for l in 0..n_labels {
            for _ in 0..n_per {
                let row: Vec<f32> = (0..dim)
                    .map(|f| {
                        let centre = if f % n_labels == l { 2.0 } else { 0.0 };
                        centre + (rng.next_f64() as f32 - 0.5) * 3.0
                    })
                    .collect();
                x.push(row);
                y.push(l);
            }
        }
        (x, y)
    }

    #[test]
    fn a_head_learns_separable_clusters_deterministically() {
        let (x, y) = clusters(30, 4, 16, 1);
        let rows: Vec<&[f32]> = x.iter().map(|r| r.as_slice()).collect();
        let (fit_idx, held_idx) = stratified_split(&y, 4, 0.25, 0);
        assert!((0..4).all(|l| fit_idx.iter().any(|&i| y[i] == l)));
        let fx: Vec<&[f32]> = fit_idx.iter().map(|&i| rows[i]).collect();
        let fy: Vec<usize> = fit_idx.iter().map(|&i| y[i]).collect();
        let a = fit(&fx, &fy, 4, None, 0).unwrap();
        let b = fit(&fx, &fy, 4, None, 0).unwrap();
        assert_eq!(a.head, b.head, "deterministic");
        assert_eq!(a.report.cross_validation.len(), C_GRID.len());
        let hx: Vec<&[f32]> = held_idx.iter().map(|&i| rows[i]).collect();
        let hy: Vec<usize> = held_idx.iter().map(|&i| y[i]).collect();
        let (_, after) = figures(&a.head, &hx, &hy);
        assert!(after.accuracy > 0.8, "{}", after.accuracy);
        let d = draws(&rows, &y, 4, &fit_idx, &held_idx, 3, 5, None, 0).unwrap();
        assert_eq!(d.per_draw.len(), 3);
        assert!(d.per_draw.iter().all(|p| p.fit_examples == 20));
        assert!(d.accuracy_mean > 0.5, "{}", d.accuracy_mean);
        assert_ne!(d.per_draw[0].seed, d.per_draw[1].seed);
    }

    #[test]
    fn labels_absent_from_training_never_win() {
        let x =
            Array2::from_shape_vec((4, 2), vec![1.0, 0.0, 1.1, 0.1, 0.0, 1.0, 0.1, 1.2]).unwrap();
        let (w, b) = fit_weights(&x, &[0, 0, 2, 2], 3, 1.0).unwrap();
        let z = logits_of(&x, &w, &b);
        assert!(z.iter().all(|r| r[1] < r[0] && r[1] < r[2]));
    }
}
